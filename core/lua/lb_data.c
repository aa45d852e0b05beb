/* lb_data.c — luapipe.Dataset: a memory-mapped token file seen from Lua.
 * core.data_open(path, opts) -> Dataset | nil, message (a bad file is a
 * runtime failure naming it); misuse (wrong argument types) raises. */
#include <string.h>

#include "lb_internal.h"
#include "lb_nn.h"
#include "lp_data.h"

#define LB_DATASET "luapipe.Dataset"

typedef struct dataset_box {
  lp_data *d; /* NULL once closed */
} dataset_box;

static lp_data *check_dataset(lua_State *L, int idx) {
  return ((dataset_box *)lb_box_check(L, idx, LB_DATASET))->d;
}

static int lb_dataset_close(lua_State *L) {
  dataset_box *b = luaL_checkudata(L, 1, LB_DATASET);
  lp_data_close(b->d);
  b->d = NULL;
  return 0;
}

static lua_Integer opt_int_field(lua_State *L, int idx, const char *k, lua_Integer dflt) {
  lua_getfield(L, idx, k);
  lua_Integer v = dflt;
  if (!lua_isnil(L, -1)) {
    int ok;
    v = lua_tointegerx(L, -1, &ok);
    if (!ok) luaL_error(L, "data: option '%s' must be an integer, got %s", k, luaL_typename(L, -1));
  }
  lua_pop(L, 1);
  return v;
}

/* core.data_open(path, {seq_len =, token_bytes =, vocab =, shuffle =, seed =, check =}) */
static int lb_data_open(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  lp_data_opts o = {0};
  lua_Integer seq = opt_int_field(L, 2, "seq_len", 0);
  lua_Integer tb = opt_int_field(L, 2, "token_bytes", 0);
  if (seq < 1 || seq > (1 << 24)) luaL_error(L, "data: seq_len must be 1 .. 16777216, got %I", seq);
  if (tb != 0 && tb != 2 && tb != 4) luaL_error(L, "data: token_bytes must be 2 or 4, got %I", tb);
  o.seq_len = (int)seq;
  o.token_bytes = (int)tb;
  o.vocab = opt_int_field(L, 2, "vocab", 0);
  o.seed = (uint64_t)opt_int_field(L, 2, "seed", 0);
  lua_getfield(L, 2, "shuffle");
  o.shuffle = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, 2, "check");
  o.check = lua_toboolean(L, -1);
  lua_pop(L, 1);
  dataset_box *b = lb_box_new(L, sizeof *b, LB_DATASET);
  char err[LP_ERRLEN];
  if (lp_data_open(path, &o, &b->d, err) != LP_OK) return lb_fail(L, err);
  return 1;
}

/* ds:info() -> {format =, token_bytes =, seq_len =, tokens =, windows =, data_offset =} */
static int lb_dataset_info(lua_State *L) {
  lp_data_info in;
  lp_data_info_of(check_dataset(L, 1), &in);
  lua_createtable(L, 0, 6);
  lua_pushstring(L, in.format);
  lua_setfield(L, -2, "format");
  lb_set_integer(L, "token_bytes", in.token_bytes);
  lb_set_integer(L, "seq_len", in.seq_len);
  lb_set_integer(L, "tokens", in.tokens);
  lb_set_integer(L, "windows", in.windows);
  lb_set_integer(L, "data_offset", in.data_offset);
  return 1;
}

/* ds:window(g) -> the window (0-based) that sequence g reads */
static int lb_dataset_window(lua_State *L) {
  lp_data *d = check_dataset(L, 1);
  lua_Integer g = luaL_checkinteger(L, 2);
  luaL_argcheck(L, g >= 0, 2, "sequence numbers start at 0");
  lua_pushinteger(L, lp_data_window(d, g));
  return 1;
}

/* A host float32 tensor of exactly n elements, dense. */
static float *check_out(lua_State *L, int idx, int64_t n) {
  lp_tensor *t = lb_check_tensor(L, idx);
  if (!t || !t->data || !lp_tensor_is_contiguous(t) || lp_tensor_numel(t) != n)
    luaL_argerror(L, idx, lua_pushfstring(L, "a dense host tensor of %I elements expected",
                                          (lua_Integer)n));
  return t->data;
}

/* ds:fill(step, mb, microbatches, rows, dp, dp_rank, inputs, targets)
 * fills the two tensors ((rows / dp) * seq_len elements each) with this
 * data-parallel rank's share of micro-batch mb of step `step`
 * -> true | nil, message (a token not below the vocabulary, named) */
static int lb_dataset_fill(lua_State *L) {
  lp_data *d = check_dataset(L, 1);
  lua_Integer step = luaL_checkinteger(L, 2);
  int mb = lb_check_int(L, 3), m = lb_check_int(L, 4), rows = lb_check_int(L, 5);
  int dp = lb_check_int(L, 6), dpr = lb_check_int(L, 7);
  lp_data_info in;
  lp_data_info_of(d, &in);
  int64_t n = dp > 0 ? (int64_t)(rows / dp) * in.seq_len : 0;
  float *x = check_out(L, 8, n), *y = check_out(L, 9, n);
  char err[LP_ERRLEN];
  if (lp_data_batch(d, step, mb, m, rows, dp, dpr, x, y, err) != LP_OK) return lb_fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

void lb_open_data(lua_State *L) {
  static const luaL_Reg methods[] = {{"info", lb_dataset_info},
                                     {"window", lb_dataset_window},
                                     {"fill", lb_dataset_fill},
                                     {"close", lb_dataset_close},
                                     {NULL, NULL}};
  static const luaL_Reg meta[] = {
      {"__gc", lb_dataset_close}, {"__close", lb_dataset_close}, {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"data_open", lb_data_open}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  lb_new_class(L, LB_DATASET, "Dataset", methods, meta);
}
