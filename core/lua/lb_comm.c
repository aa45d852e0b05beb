/* lb_comm.c — the process's communicator seen from Lua (core.comm_*): rank
 * and size, barrier, all-reduce, blocking send / receive of number lists,
 * abort. Misuse (a bad peer or tag, non-numbers) raises; runtime failures
 * (a timeout, a peer that sent the wrong length) return nil, message. */
#include "lb_internal.h"
#include "lp_comm.h"

#define LB_COMM_MAX_COUNT (1 << 26) /* floats in one message from Lua */

/* Raises the context's error for misuse, else pushes nil, message. */
static int comm_fail(lua_State *L, lp_comm *c, lp_status st) {
  if (st == LP_ERR_NOMEM) return luaL_error(L, "out of memory");
  if (st == LP_ERR_ARG) return luaL_error(L, "%s", lp_comm_last_error(c));
  return lb_fail(L, lp_comm_last_error(c));
}

/* core.comm() -> {rank=, size=, backend=, timeout=, tag_ub=} */
static int lb_comm_info(lua_State *L) {
  lp_comm *c = lp_comm_world();
  lua_createtable(L, 0, 5);
  lb_set_integer(L, "rank", lp_comm_rank(c));
  lb_set_integer(L, "size", lp_comm_size(c));
  lua_pushstring(L, lp_comm_backend_name(c));
  lua_setfield(L, -2, "backend");
  lb_set_number(L, "timeout", lp_comm_timeout(c));
  lb_set_integer(L, "tag_ub", lp_comm_tag_ub(c));
  return 1;
}

/* core.comm_barrier([what]) -> true | nil, err */
static int lb_comm_barrier(lua_State *L) {
  lp_comm *c = lp_comm_world();
  lp_status st = lp_comm_barrier(c, luaL_optstring(L, 1, "comm.barrier"));
  if (st != LP_OK) return comm_fail(L, c, st);
  lua_pushboolean(L, 1);
  return 1;
}

/* Copies the numbers of the list at idx into a new userdata of floats (or
 * doubles) and returns it; the userdata stays on the stack so the GC owns
 * it even when a later error is raised. *n gets the length. */
static void *check_numbers(lua_State *L, int idx, int as_double, size_t *n) {
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_Integer len = luaL_len(L, idx);
  luaL_argcheck(L, len <= LB_COMM_MAX_COUNT, idx, "list too long");
  size_t elem = as_double ? sizeof(double) : sizeof(float);
  void *buf = lua_newuserdatauv(L, (size_t)len * elem + 1, 0); /* [.., buf] */
  for (lua_Integer i = 1; i <= len; i++) {
    int ok;
    lua_geti(L, idx, i);
    lua_Number v = lua_tonumberx(L, -1, &ok);
    if (!ok)
      luaL_error(L, "entry %d of the list is a %s, not a number", (int)i,
                 luaL_typename(L, -1));
    lua_pop(L, 1);
    if (as_double) ((double *)buf)[i - 1] = (double)v;
    else ((float *)buf)[i - 1] = (float)v;
  }
  *n = (size_t)len;
  return buf;
}

/* core.comm_allreduce_sum(list [, what]) -> list of sums | nil, err
 * (in double precision). */
static int lb_comm_allreduce_sum(lua_State *L) {
  lp_comm *c = lp_comm_world();
  size_t n;
  const char *what = luaL_optstring(L, 2, "comm.allreduce");
  double *buf = check_numbers(L, 1, 1, &n);
  lp_status st = lp_comm_allreduce_sum_double(c, buf, n, what);
  if (st != LP_OK) return comm_fail(L, c, st);
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushnumber(L, buf[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}

static int check_tag(lua_State *L, int arg, lp_comm *c) {
  lua_Integer tag = luaL_optinteger(L, arg, 0);
  if (tag < 0 || tag > lp_comm_tag_ub(c))
    luaL_argerror(L, arg, lua_pushfstring(L, "tag %d is out of range 0..%d",
                                          (int)tag, lp_comm_tag_ub(c)));
  return (int)tag;
}

static int check_peer(lua_State *L, int arg, lp_comm *c) {
  lua_Integer p = luaL_checkinteger(L, arg);
  if (p < 0 || p >= lp_comm_size(c))
    luaL_argerror(L, arg, lua_pushfstring(L, "rank %d is out of range 0..%d",
                                          (int)p, lp_comm_size(c) - 1));
  return (int)p;
}

/* core.comm_send(peer, list [, tag [, what]]) -> true | nil, err
 * (the numbers travel as floats). */
static int lb_comm_send(lua_State *L) {
  lp_comm *c = lp_comm_world();
  int peer = check_peer(L, 1, c);
  int tag = check_tag(L, 3, c);
  const char *what = luaL_optstring(L, 4, "comm.send");
  size_t n;
  const float *buf = check_numbers(L, 2, 0, &n);
  lp_status st = lp_comm_send(c, buf, n, peer, tag, what);
  if (st != LP_OK) return comm_fail(L, c, st);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.comm_recv(peer, n [, tag [, what]]) -> list of n numbers | nil, err */
static int lb_comm_recv(lua_State *L) {
  lp_comm *c = lp_comm_world();
  int peer = check_peer(L, 1, c);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_argcheck(L, n >= 0 && n <= LB_COMM_MAX_COUNT, 2, "count out of range");
  int tag = check_tag(L, 3, c);
  const char *what = luaL_optstring(L, 4, "comm.recv");
  float *buf = lua_newuserdatauv(L, (size_t)n * sizeof(float) + 1, 0);
  lp_status st = lp_comm_recv(c, buf, (size_t)n, peer, tag, what);
  if (st != LP_OK) return comm_fail(L, c, st);
  lua_createtable(L, (int)n, 0);
  for (lua_Integer i = 0; i < n; i++) {
    lua_pushnumber(L, (lua_Number)buf[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* core.comm_abort([msg]): prints "luapipe: rank R: msg" and takes every
 * rank down with exit code 1. Does not return. */
static int lb_comm_abort(lua_State *L) {
  const char *msg = luaL_optstring(L, 1, "aborted by the script");
  lp_comm_fatal(lp_comm_world(), msg);
  return 0;
}

void lb_open_comm(lua_State *L) {
  static const luaL_Reg funcs[] = {{"comm", lb_comm_info},
                                   {"comm_barrier", lb_comm_barrier},
                                   {"comm_allreduce_sum", lb_comm_allreduce_sum},
                                   {"comm_send", lb_comm_send},
                                   {"comm_recv", lb_comm_recv},
                                   {"comm_abort", lb_comm_abort},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0); /* [mod] */
}
