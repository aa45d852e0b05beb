/* lp_lua.c — luaopen_luapipe_core and the pcall choke point. */
#include "lp_lua.h"

#include <limits.h>
#include <string.h>

#include "lb_internal.h"
#include "lp_comm_gpu.h"
#include "lp_kernels.h"

int lp_lua_traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* The error value as one line: a string, its __tostring, or its type. */
static int line_handler(lua_State *L) {
  if (lua_type(L, 1) == LUA_TSTRING) return 1;
  if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
  lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  return 1;
}

static int is_error_object(lua_State *L, int idx) {
  if (lua_type(L, idx) != LUA_TTABLE) return 0;
  int t = luaL_getmetafield(L, idx, "__name");
  int yes = t == LUA_TSTRING && strcmp(lua_tostring(L, -1), "luapipe.Error") == 0;
  if (t != LUA_TNIL) lua_pop(L, 1);
  return yes;
}

static int keep_handler(lua_State *L) {
  if (is_error_object(L, 1)) {
    lua_settop(L, 1);
    return 1;
  }
  return lp_lua_traceback(L);
}

/* The choke point: every call into Lua goes through here. */
static int pcall_with(lua_State *L, int nargs, int nresults, lua_CFunction handler) {
  int base = lua_gettop(L) - nargs; /* function index */
  lua_pushcfunction(L, handler);
  lua_insert(L, base);
  int st = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  return st;
}

int lp_lua_pcall(lua_State *L, int nargs, int nresults) {
  return pcall_with(L, nargs, nresults, lp_lua_traceback);
}

int lp_lua_pcall_line(lua_State *L, int nargs, int nresults) {
  return pcall_with(L, nargs, nresults, line_handler);
}

int lp_lua_pcall_keep(lua_State *L, int nargs, int nresults) {
  return pcall_with(L, nargs, nresults, keep_handler);
}

void *lb_box_new(lua_State *L, size_t size, const char *tname) {
  void *b = lua_newuserdatauv(L, size, 0);
  memset(b, 0, size);
  luaL_setmetatable(L, tname);
  return b;
}

void *lb_box_check(lua_State *L, int idx, const char *tname) {
  void **b = luaL_checkudata(L, idx, tname);
  if (!*b) luaL_error(L, "attempt to use a closed %s", tname);
  return b;
}

void lb_set_number(lua_State *L, const char *k, double v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

void lb_set_integer(lua_State *L, const char *k, lua_Integer v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

int lb_check_int(lua_State *L, int arg) {
  lua_Integer v = luaL_checkinteger(L, arg);
  if (v < INT_MIN || v > INT_MAX)
    luaL_argerror(L, arg, lua_pushfstring(L, "%I is out of range", v));
  return (int)v;
}

int lb_fail(lua_State *L, const char *msg) {
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

void lb_new_class(lua_State *L, const char *tname, const char *field,
                  const luaL_Reg *methods, const luaL_Reg *metamethods) {
  luaL_newmetatable(L, tname); /* [mod, mt] */
  if (metamethods) luaL_setfuncs(L, metamethods, 0);
  lua_newtable(L);             /* [mod, mt, methods] */
  luaL_setfuncs(L, methods, 0);
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "__index");
  lua_setfield(L, -3, field);  /* mod[field] = methods; [mod, mt] */
  lua_pop(L, 1);
}

static int lb_version(lua_State *L) {
  lua_pushstring(L, LP_VERSION);
  return 1;
}

static int lb_env_knobs(lua_State *L) {
  int n;
  const lp_env_knob *k = lp_env_knobs(&n);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_createtable(L, 0, 3);
    lua_pushstring(L, k[i].name);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, k[i].deflt);
    lua_setfield(L, -2, "default");
    lua_pushstring(L, k[i].summary);
    lua_setfield(L, -2, "summary");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* core.kernels() -> {cuda = built with CUDA?, devices = visible devices,
 * module = path of the CUDA module | nil, error = why it cannot be loaded
 * | nil, nccl = built with NCCL?, nccl_module = path | nil, nccl_error =
 * text | nil}. Opens both modules (when built): the -v listing. */
static int lb_kernels(lua_State *L) {
  lua_createtable(L, 0, 7);
  int cuda = lp_kernels_built_with_cuda();
  lua_pushboolean(L, cuda);
  lua_setfield(L, -2, "cuda");
  lua_pushinteger(L, lp_kernels_device_count());
  lua_setfield(L, -2, "devices");
  if (cuda) {
    const char *path = lp_kernels_module_path();
    lua_pushstring(L, path ? path : lp_kernels_last_error());
    lua_setfield(L, -2, path ? "module" : "error");
  }
  int nccl = lp_comm_nccl_built();
  lua_pushboolean(L, nccl);
  lua_setfield(L, -2, "nccl");
  if (nccl) {
    const char *text = NULL;
    lp_status st = lp_comm_nccl_load(&text);
    lua_pushstring(L, text);
    lua_setfield(L, -2, st == LP_OK ? "nccl_module" : "nccl_error");
  }
  return 1;
}

/* core.write_file(path, text) -> true | nil, message. Atomic: path.tmp,
 * fsync, rename over path; a failure leaves path as it was. */
static int lb_write_file(lua_State *L) {
  size_t n;
  const char *path = luaL_checkstring(L, 1);
  const char *text = luaL_checklstring(L, 2, &n);
  char err[LP_ERRLEN];
  if (lp_write_file_atomic(path, text, n, err) != LP_OK) return lb_fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

static int lb_now(lua_State *L) {
  lua_pushnumber(L, lp_now());
  return 1;
}

int luaopen_luapipe_core(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"version", lb_version}, {"env_knobs", lb_env_knobs}, {"now", lb_now},
      {"kernels", lb_kernels}, {"write_file", lb_write_file}, {NULL, NULL}};
  luaL_newlib(L, funcs);
  lb_open_schedule(L);
  lb_open_sim(L);
  lb_open_eplb(L);
  lb_open_comm(L);
  lb_open_nn(L);
  lb_open_exec(L);
  lb_open_profile(L);
  lb_open_search(L);
  lb_open_data(L);
  lb_open_safetensors(L);
  return 1;
}
