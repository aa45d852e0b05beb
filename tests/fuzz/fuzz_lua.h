/* fuzz_lua.h — a Lua state set up like the luapipe program's (standard
 * libraries, package.path on the source tree's lua/ or $LUAPIPE_LUA_PATH,
 * luapipe.core preloaded), for harnesses whose reader lives in Lua. One
 * state per process, made on first use. */
#pragma once

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "fuzz.h"
#include "lp_lua.h"

static inline int fuzz_lua_check_message(lua_State *L) {
  size_t size = 0, mlen = 0;
  const char *msg = luaL_checklstring(L, 1, &mlen), *in = luaL_checklstring(L, 2, &size);
  fuzz_check_message_n(msg, mlen, (const uint8_t *)in, size);
  return 0;
}

/* The state; its global fuzz_check_message(msg, input) is fuzz.h's. */
static inline lua_State *fuzz_lua(void) {
  static lua_State *L;
  if (L) return L;
  L = luaL_newstate();
  if (!L) abort();
  luaL_openlibs(L);
  const char *dir = getenv("LUAPIPE_LUA_PATH");
  if (!dir || !*dir) dir = LUAPIPE_SOURCE_LUA_DIR;
  lua_getglobal(L, "package");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;", dir, dir);
  lua_getfield(L, -2, "path");
  lua_concat(L, 2);
  lua_setfield(L, -2, "path");
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_luapipe_core);
  lua_setfield(L, -2, "luapipe.core");
  lua_pop(L, 2);
  lua_pushcfunction(L, fuzz_lua_check_message);
  lua_setglobal(L, "fuzz_check_message");
  return L;
}

/* Runs chunk (its source text, compiled once under name) in the fuzz state
 * with the input as its first argument and extra (unless NULL) as its
 * second; the chunk returns nothing or raises. Any raised error is a
 * broken contract: readers return nil, message. */
static inline void fuzz_lua_run(const char *name, const char *chunk, const uint8_t *data,
                                size_t size, const char *extra) {
  lua_State *L = fuzz_lua();
  int top = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, name);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    if (luaL_loadbuffer(L, chunk, strlen(chunk), name) != LUA_OK)
      FUZZ_FAIL("%s", lua_tostring(L, -1));
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, name);
  }
  lua_pushlstring(L, (const char *)data, size);
  if (extra) lua_pushstring(L, extra);
  if (lp_lua_pcall(L, extra ? 2 : 1, 0) != LUA_OK) FUZZ_FAIL("%s", lua_tostring(L, -1));
  lua_settop(L, top);
  lua_gc(L, LUA_GCCOLLECT);
}
