/* lb_internal.h — helpers shared by the lb_<module>.c binding files. Each
 * binding file adds its functions to the module table on the top of the
 * stack through lb_open_<module>. */
#pragma once

#include <lauxlib.h>
#include <lua.h>

#include "lp_base.h"

void lb_open_schedule(lua_State *L);
void lb_open_sim(lua_State *L);
void lb_open_eplb(lua_State *L);
void lb_open_comm(lua_State *L);
void lb_open_nn(lua_State *L);
void lb_open_exec(lua_State *L);
void lb_open_profile(lua_State *L);
void lb_open_search(lua_State *L);
void lb_open_data(lua_State *L);
void lb_open_safetensors(lua_State *L);

/* t[k] = v for the table on top of the stack. */
void lb_set_number(lua_State *L, const char *k, double v);
void lb_set_integer(lua_State *L, const char *k, lua_Integer v);
/* Closed-first boxes (liolib's pattern): a box is a userdata whose FIRST
 * field is the pointer it owns, NULL once closed. lb_box_new pushes a
 * zeroed box of `size` bytes with metatable tname (safe to collect before
 * it owns anything); lb_box_check returns the box at idx, raising the type
 * error or "attempt to use a closed <tname>". */
void *lb_box_new(lua_State *L, size_t size, const char *tname);
void *lb_box_check(lua_State *L, int idx, const char *tname);
/* luaL_checkinteger that also fits an int: a value outside INT_MIN..INT_MAX
 * raises "bad argument #arg to 'f' (<n> is out of range)" instead of being
 * truncated (4294967298 silently becoming 2). */
int lb_check_int(lua_State *L, int arg);
/* Pushes nil, msg and returns 2 (runtime failures). */
int lb_fail(lua_State *L, const char *msg);
/* Registers metatable `tname` with __name, __index = methods (the methods
 * table is also stored in the module table under `field`). Leaves nothing
 * on the stack. Expects the module table at index -1. */
void lb_new_class(lua_State *L, const char *tname, const char *field,
                  const luaL_Reg *methods, const luaL_Reg *metamethods);

#include "lp_schedule.h"
#define LB_SCHEDULE "luapipe.Schedule"
/* The schedule inside the luapipe.Schedule at idx; raises "attempt to use a
 * closed luapipe.Schedule" when closed, a type error when not one. */
lp_schedule *lb_check_schedule(lua_State *L, int idx);
/* Pushes a new luapipe.Schedule box owning s (which must not be NULL). */
void lb_push_schedule(lua_State *L, lp_schedule *s);
/* Pushes {type=, stage=, mb=, [btype=, bstage=, bmb=], text=} for a. */
void lb_push_action(lua_State *L, const lp_action *a);
