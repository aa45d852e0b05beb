/* lb_nn.c — luapipe.Tensor, luapipe.Layer and luapipe.Optim: build layers
 * and chunks from Lua, read and write parameters as Lua tables (for tests),
 * the no-pipeline reference step and per-layer cost measurement. Misuse
 * raises; runtime failures return nil, message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lb_nn.h"
#include "lp_exec.h"
#include "lp_kernels.h"
#include "lp_lua.h"

/* ---- luapipe.Tensor ---- */

typedef struct tensor_box {
  lp_tensor *t; /* NULL once closed */
} tensor_box;

lp_tensor *lb_check_tensor(lua_State *L, int idx) {
  return ((tensor_box *)lb_box_check(L, idx, LB_TENSOR))->t;
}

static tensor_box *new_tensor_box(lua_State *L) {
  return lb_box_new(L, sizeof(tensor_box), LB_TENSOR);
}


static int lb_tensor_close(lua_State *L) {
  tensor_box *b = luaL_checkudata(L, 1, LB_TENSOR);
  lp_tensor_free(b->t);
  b->t = NULL;
  return 0;
}

/* The one shape rule (core.tensor and, through core.check_shape, the Lua
 * model code): reads the shape table at idx into shape and *nd; returns
 * NULL, or what is wrong with it. */
static const char *read_shape(lua_State *L, int idx, int64_t *shape, int *nd) {
  if (!lua_istable(L, idx)) return "shape must be a list of 1 to 4 non-negative integers";
  lua_Integer n = luaL_len(L, idx);
  if (n < 1 || n > LP_TENSOR_MAXDIM) return "shape must have 1 to 4 dims";
  for (int i = 0; i < (int)n; i++) {
    lua_geti(L, idx, i + 1);
    int ok;
    lua_Integer d = lua_tointegerx(L, -1, &ok);
    lua_pop(L, 1);
    if (!ok || d < 0) return "shape entries must be non-negative integers";
    shape[i] = d;
  }
  *nd = (int)n;
  return NULL;
}

/* Reads a shape argument at idx into shape (raising naming the argument);
 * returns ndim. */
static int check_shape(lua_State *L, int idx, int64_t *shape) {
  int nd = 0;
  const char *why = read_shape(L, idx, shape, &nd);
  if (why) luaL_argerror(L, idx, why);
  return nd;
}

/* core.check_shape(shape) -> true | nil, reason (the rule of read_shape,
 * for the Lua layer to raise in its caller's words) */
static int lb_check_shape_fn(lua_State *L) {
  int64_t shape[LP_TENSOR_MAXDIM];
  int nd;
  const char *why = read_shape(L, 1, shape, &nd);
  if (!why) {
    lua_pushboolean(L, 1);
    return 1;
  }
  if (lua_istable(L, 1)) return lb_fail(L, why);
  return lb_fail(L, lua_pushfstring(L, "%s, got %s", why, luaL_typename(L, 1)));
}

/* core.tensor(shape [, values]) -> Tensor (values: flat list, row-major;
 * nil: zeros) */
static int lb_tensor_new(lua_State *L) {
  lua_settop(L, 2); /* [shape, values]: the box goes to index 3 */
  int64_t shape[LP_TENSOR_MAXDIM];
  int nd = check_shape(L, 1, shape);
  double count = 1; /* for messages: exact up to 2^53, never overflows */
  for (int i = 0; i < nd; i++) count *= (double)shape[i];
  tensor_box *b = new_tensor_box(L);
  lp_status st = lp_tensor_zeros(NULL, nd, shape, &b->t);
  if (st != LP_OK) {
    char msg[128];
    if (st == LP_ERR_ARG && count == 0) /* empty, but dims whose strides overflow */
      snprintf(msg, sizeof msg, "tensor dims are too large (their product, zeros left out, "
               "overflows)");
    else if (st == LP_ERR_ARG)
      snprintf(msg, sizeof msg, "tensor of %.0f elements is too large", count);
    else snprintf(msg, sizeof msg, "out of memory for a tensor of %.0f elements", count);
    return luaL_error(L, "%s", msg);
  }
  int64_t n = lp_tensor_numel(b->t);
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    if ((int64_t)luaL_len(L, 2) != n)
      return luaL_error(L, "tensor: %I values given for a shape of %I elements",
                        (lua_Integer)luaL_len(L, 2), (lua_Integer)n);
    for (int64_t i = 0; i < n; i++) {
      lua_geti(L, 2, i + 1);
      int ok;
      lua_Number v = lua_tonumberx(L, -1, &ok);
      if (!ok) return luaL_error(L, "tensor: value %I is not a number", (lua_Integer)(i + 1));
      b->t->data[i] = (float)v;
      lua_pop(L, 1);
    }
  }
  return 1;
}

static void push_shape(lua_State *L, const lp_tensor *t) {
  lua_createtable(L, t->ndim, 0);
  for (int i = 0; i < t->ndim; i++) {
    lua_pushinteger(L, t->shape[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

static void push_values(lua_State *L, const lp_tensor *t) {
  lp_tensor *c = NULL;
  const lp_tensor *src = t;
  if (!lp_tensor_is_contiguous(t) || !lp_tensor_backend_of(t)->host_accessible) {
    /* a dense host copy (device tensors are read back) */
    if (lp_tensor_to_host(t, &c) != LP_OK)
      luaL_error(L, "reading a tensor from %s failed: %s", lp_tensor_backend_of(t)->name,
                 lp_kernels_last_error());
    src = c;
  }
  int64_t n = lp_tensor_numel(src);
  lua_createtable(L, (int)n, 0);
  for (int64_t i = 0; i < n; i++) {
    lua_pushnumber(L, src->data[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lp_tensor_free(c);
}

static int lb_tensor_shape(lua_State *L) {
  push_shape(L, lb_check_tensor(L, 1));
  return 1;
}

static int lb_tensor_totable(lua_State *L) {
  push_values(L, lb_check_tensor(L, 1));
  return 1;
}

static int lb_tensor_numel(lua_State *L) {
  lua_pushinteger(L, lp_tensor_numel(lb_check_tensor(L, 1)));
  return 1;
}

static int lb_tensor_tostring(lua_State *L) {
  tensor_box *b = luaL_checkudata(L, 1, LB_TENSOR);
  if (!b->t) {
    lua_pushstring(L, LB_TENSOR " (closed)");
    return 1;
  }
  luaL_Buffer buf;
  luaL_buffinit(L, &buf);
  luaL_addstring(&buf, LB_TENSOR " [");
  for (int i = 0; i < b->t->ndim; i++) {
    lua_pushfstring(L, i ? ", %I" : "%I", (lua_Integer)b->t->shape[i]);
    luaL_addvalue(&buf);
  }
  luaL_addstring(&buf, "]");
  luaL_pushresult(&buf);
  return 1;
}

/* ---- luapipe.Layer ---- */

typedef struct layer_box {
  lp_nn_layer *l; /* one reference; NULL once closed */
} layer_box;

lp_nn_layer *lb_check_layer(lua_State *L, int idx) {
  return ((layer_box *)lb_box_check(L, idx, LB_LAYER))->l;
}

static layer_box *new_layer_box(lua_State *L) {
  return lb_box_new(L, sizeof(layer_box), LB_LAYER);
}

void lb_push_layer(lua_State *L, lp_nn_layer *l) { new_layer_box(L)->l = l; }

static int lb_layer_close(lua_State *L) {
  layer_box *b = luaL_checkudata(L, 1, LB_LAYER);
  lp_nn_layer_release(b->l);
  b->l = NULL;
  return 0;
}

static lua_Integer field_int(lua_State *L, int idx, const char *k, lua_Integer deflt,
                             int required, const char *kind) {
  lua_getfield(L, idx, k);
  int ok;
  lua_Integer v = lua_tointegerx(L, -1, &ok);
  int isnil = lua_isnil(L, -1);
  lua_pop(L, 1);
  if (isnil && !required) return deflt;
  if (!ok || v < 1)
    luaL_error(L, "layer '%s': field '%s' must be a positive integer", kind, k);
  return v;
}

static lp_tensor_act_kind field_act(lua_State *L, int idx, const char *kind) {
  lua_getfield(L, idx, "act");
  const char *a = lua_tostring(L, -1);
  lp_tensor_act_kind k = LP_TENSOR_ACT_GELU;
  if (a && strcmp(a, "silu") == 0) k = LP_TENSOR_ACT_SILU;
  else if (a && strcmp(a, "gelu") != 0)
    luaL_error(L, "layer '%s': act must be \"gelu\" or \"silu\", got \"%s\"", kind, a);
  lua_pop(L, 1);
  return k;
}

static float field_num(lua_State *L, int idx, const char *k, float deflt, const char *kind) {
  lua_getfield(L, idx, k);
  int ok;
  lua_Number v = lua_tonumberx(L, -1, &ok);
  int isnil = lua_isnil(L, -1);
  lua_pop(L, 1);
  if (isnil) return deflt;
  if (!ok || v < 0) luaL_error(L, "layer '%s': field '%s' must be a non-negative number", kind, k);
  return (float)v;
}

static int field_bool(lua_State *L, int idx, const char *k, int deflt, const char *kind) {
  lua_getfield(L, idx, k);
  int t = lua_type(L, -1), v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (t == LUA_TNIL) return deflt;
  if (t != LUA_TBOOLEAN) luaL_error(L, "layer '%s': field '%s' must be true or false", kind, k);
  return v;
}

/* The MoE options of an nn.moe / nn.moe_block spec at idx. */
static lp_nn_moe_opts moe_opts(lua_State *L, int idx, const char *kind) {
  lp_nn_moe_opts o = {0};
  o.dim = field_int(L, idx, "dim", 0, 1, kind);
  o.hidden = field_int(L, idx, "hidden", 0, 1, kind);
  o.experts = (int)field_int(L, idx, "experts", 0, 1, kind);
  o.topk = (int)field_int(L, idx, "topk", 1, 0, kind);
  o.groups = (int)field_int(L, idx, "groups", 1, 0, kind);
  o.topk_groups = (int)field_int(L, idx, "topk_groups", o.groups, 0, kind);
  lua_getfield(L, idx, "shared");
  int has_shared = !lua_isnil(L, -1);
  lua_pop(L, 1);
  o.shared = has_shared ? (int)field_num(L, idx, "shared", 0, kind) : 0;
  o.route_scale = field_num(L, idx, "route_scale", 1.0f, kind);
  o.bias_speed = field_num(L, idx, "bias_speed", 0.0f, kind);
  o.balance_alpha = field_num(L, idx, "balance_alpha", 0.0f, kind);
  lua_getfield(L, idx, "router");
  const char *r = lua_tostring(L, -1);
  if (r && strcmp(r, "softmax") == 0) o.router = LP_NN_ROUTER_SOFTMAX;
  else if (r && strcmp(r, "sigmoid") != 0)
    luaL_error(L, "layer '%s': router must be \"sigmoid\" or \"softmax\", got \"%s\"", kind, r);
  lua_pop(L, 1);
  /* DeepSeek's Gate without a correction bias, or with raw weights */
  o.no_bias = !field_bool(L, idx, "correction_bias", 1, kind);
  o.no_norm_topk = !field_bool(L, idx, "norm_topk", 1, kind);
  if (o.no_bias && o.bias_speed > 0.0f)
    luaL_error(L, "layer '%s': bias_speed = %g moves a correction bias the layer does not have "
               "(correction_bias = false)", kind, (double)o.bias_speed);
  if (o.topk > o.experts)
    luaL_error(L, "layer '%s': topk (%d) is more than experts (%d)", kind, o.topk, o.experts);
  if (o.experts % o.groups)
    luaL_error(L, "layer '%s': %d experts do not split into %d groups", kind, o.experts,
               o.groups);
  if (o.topk_groups > o.groups || (int64_t)o.topk_groups * (o.experts / o.groups) < o.topk)
    luaL_error(L, "layer '%s': topk_groups = %d of %d groups (%d experts each) cannot give "
               "topk = %d experts", kind, o.topk_groups, o.groups, o.experts / o.groups, o.topk);
  return o;
}

/* ---- DeepSeek-V3's MLA (nn.mla) ----
 * The options of an mla spec at idx: model.py's ModelArgs keys, each
 * absent one at lp_nn_mla_defaults(). Raises for a field of the wrong
 * type; returns the rule the options break (lp_nn_mla_check), or NULL. */
static const char *mla_opts(lua_State *L, int idx, lp_nn_mla_opts *o) {
  *o = lp_nn_mla_defaults();
  static const struct {
    const char *k;
    size_t off;
  } ints[] = {{"dim", offsetof(lp_nn_mla_opts, dim)},
              {"n_heads", offsetof(lp_nn_mla_opts, n_heads)},
              {"q_lora_rank", offsetof(lp_nn_mla_opts, q_lora_rank)},
              {"kv_lora_rank", offsetof(lp_nn_mla_opts, kv_lora_rank)},
              {"qk_nope_head_dim", offsetof(lp_nn_mla_opts, qk_nope_head_dim)},
              {"qk_rope_head_dim", offsetof(lp_nn_mla_opts, qk_rope_head_dim)},
              {"v_head_dim", offsetof(lp_nn_mla_opts, v_head_dim)},
              {"max_seq_len", offsetof(lp_nn_mla_opts, max_seq_len)},
              {"original_seq_len", offsetof(lp_nn_mla_opts, original_seq_len)}},
    dbls[] = {{"rope_theta", offsetof(lp_nn_mla_opts, rope_theta)},
              {"rope_factor", offsetof(lp_nn_mla_opts, rope_factor)},
              {"beta_fast", offsetof(lp_nn_mla_opts, beta_fast)},
              {"beta_slow", offsetof(lp_nn_mla_opts, beta_slow)},
              {"mscale", offsetof(lp_nn_mla_opts, mscale)}};
  idx = lua_absindex(L, idx);
  for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
    lua_getfield(L, idx, ints[i].k);
    int ok = 1;
    if (!lua_isnil(L, -1))
      *(int64_t *)((char *)o + ints[i].off) = (int64_t)lua_tointegerx(L, -1, &ok);
    lua_pop(L, 1);
    if (!ok) luaL_error(L, "layer 'mla': field '%s' must be an integer", ints[i].k);
  }
  for (size_t i = 0; i < sizeof dbls / sizeof *dbls; i++) {
    lua_getfield(L, idx, dbls[i].k);
    int ok = 1;
    if (!lua_isnil(L, -1))
      *(double *)((char *)o + dbls[i].off) = (double)lua_tonumberx(L, -1, &ok);
    lua_pop(L, 1);
    if (!ok) luaL_error(L, "layer 'mla': field '%s' must be a number", dbls[i].k);
  }
  lua_getfield(L, idx, "eps");
  int ok = 1;
  if (!lua_isnil(L, -1)) o->eps = (float)lua_tonumberx(L, -1, &ok);
  lua_pop(L, 1);
  if (!ok) luaL_error(L, "layer 'mla': field 'eps' must be a number");
  const char *why = NULL;
  lp_nn_mla_check(o, &why);
  return why;
}

/* core.nn_mla_check(spec) -> nil, or the rule the options break */
static int lb_nn_mla_check(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lp_nn_mla_opts o;
  const char *why = mla_opts(L, 1, &o);
  if (why) lua_pushstring(L, why);
  else lua_pushnil(L);
  return 1;
}

static lp_status build_mla(lua_State *L, int idx, const char *name, uint64_t seed,
                           lp_nn_layer **out) {
  lp_nn_mla_opts o;
  const char *why = mla_opts(L, idx, &o);
  if (why) luaL_error(L, "layer 'mla': %s", why);
  return lp_nn_mla_new(name, &o, seed, out);
}

/* ep[0] ranks in the EP group, this one ep[1]: MoE layers are built
 * placed for it (lp_nn_moe_new_placed); {1, 0} builds every expert. */
static lp_status build_layer(lua_State *L, int idx, const char *name, uint64_t seed,
                             const int *ep, lp_nn_layer **out);

/* model.py's Block: {kind = "mla_block", attn = <mla spec>, ffn = <spec>};
 * the ffn is built as "<name>.ffn". */
static lp_status build_mla_block(lua_State *L, int idx, const char *name, uint64_t seed,
                                 const int *ep, lp_nn_layer **out) {
  idx = lua_absindex(L, idx);
  lp_nn_mla_opts o;
  lua_getfield(L, idx, "attn");
  if (!lua_istable(L, -1)) luaL_error(L, "layer 'mla_block': field 'attn' must be an nn.mla spec");
  const char *why = mla_opts(L, -1, &o);
  if (why) luaL_error(L, "layer 'mla_block': attn: %s", why);
  lua_pop(L, 1);
  lua_getfield(L, idx, "ffn");
  if (!lua_istable(L, -1)) luaL_error(L, "layer 'mla_block': field 'ffn' must be a layer spec");
  char sub[256];
  snprintf(sub, sizeof sub, "%s.ffn", name);
  lp_nn_layer *ffn = NULL;
  lp_status st = build_layer(L, -1, sub, seed, ep, &ffn);
  lua_pop(L, 1);
  if (st != LP_OK) return st;
  st = lp_nn_mla_block_new(name, &o, ffn, seed, out);
  lp_nn_layer_release(ffn);
  return st;
}

/* Builds the layer described by the spec table at idx. */
static lp_status build_layer(lua_State *L, int idx, const char *name, uint64_t seed,
                             const int *ep, lp_nn_layer **out) {
  idx = lua_absindex(L, idx);
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_getfield(L, idx, "kind");
  const char *kind = lua_tostring(L, -1);
  if (!kind) luaL_error(L, "layer spec needs a 'kind' string");
  lua_pop(L, 1); /* kind stays valid: the spec table holds the string */
  if (strcmp(kind, "linear") == 0) {
    lua_getfield(L, idx, "bias");
    int bias = lua_isnil(L, -1) ? 1 : lua_toboolean(L, -1);
    lua_pop(L, 1);
    return lp_nn_linear_new(name, field_int(L, idx, "din", 0, 1, kind),
                            field_int(L, idx, "dout", 0, 1, kind), bias, seed, out);
  }
  if (strcmp(kind, "embedding") == 0)
    return lp_nn_embedding_new(name, field_int(L, idx, "vocab", 0, 1, kind),
                               field_int(L, idx, "dim", 0, 1, kind), seed, out);
  if (strcmp(kind, "gelu") == 0) return lp_nn_act_new(name, LP_TENSOR_ACT_GELU, out);
  if (strcmp(kind, "silu") == 0) return lp_nn_act_new(name, LP_TENSOR_ACT_SILU, out);
  if (strcmp(kind, "rmsnorm") == 0) {
    lua_getfield(L, idx, "eps");
    float eps = lua_isnil(L, -1) ? 1e-5f : (float)lua_tonumber(L, -1);
    lua_pop(L, 1);
    return lp_nn_rmsnorm_new(name, field_int(L, idx, "dim", 0, 1, kind), eps, out);
  }
  if (strcmp(kind, "attention") == 0)
    return lp_nn_attention_new(name, field_int(L, idx, "d_model", 0, 1, kind),
                               field_int(L, idx, "heads", 1, 0, kind), seed, out);
  if (strcmp(kind, "mlp_block") == 0)
    return lp_nn_mlp_block_new(name, field_int(L, idx, "d_model", 0, 1, kind),
                               field_int(L, idx, "d_hidden", 0, 1, kind),
                               field_act(L, idx, kind), seed, out);
  if (strcmp(kind, "transformer_block") == 0)
    return lp_nn_transformer_block_new(
        name, field_int(L, idx, "d_model", 0, 1, kind), field_int(L, idx, "heads", 1, 0, kind),
        field_int(L, idx, "d_hidden", 0, 1, kind), field_act(L, idx, kind), seed, out);
  if (strcmp(kind, "moe") == 0) {
    lp_nn_moe_opts o = moe_opts(L, idx, kind);
    return lp_nn_moe_new_placed(name, &o, seed, ep[0], ep[1], out);
  }
  if (strcmp(kind, "moe_block") == 0) {
    lp_nn_moe_opts o = moe_opts(L, idx, kind);
    return lp_nn_moe_block_new(name, field_int(L, idx, "heads", 1, 0, kind), &o, seed, out);
  }
  if (strcmp(kind, "mla") == 0) return build_mla(L, idx, name, seed, out);
  if (strcmp(kind, "mla_block") == 0) return build_mla_block(L, idx, name, seed, ep, out);
  if (strcmp(kind, "swiglu") == 0)
    return lp_nn_swiglu_new(name, field_int(L, idx, "dim", 0, 1, kind),
                            field_int(L, idx, "inter_dim", 0, 1, kind), seed, out);
  if (strcmp(kind, "residual") == 0) {
    lua_getfield(L, idx, "inner");
    char sub[256];
    snprintf(sub, sizeof sub, "%s.inner", name);
    lp_nn_layer *inner = NULL;
    lp_status st = build_layer(L, -1, sub, seed, ep, &inner);
    lua_pop(L, 1);
    if (st != LP_OK) return st;
    st = lp_nn_residual_new(name, inner, out);
    lp_nn_layer_release(inner);
    return st;
  }
  luaL_error(L,
             "unknown layer kind '%s' (linear, embedding, gelu, silu, rmsnorm, attention, "
             "mlp_block, transformer_block, moe, moe_block, mla, swiglu, mla_block, residual)",
             kind);
  return LP_ERR_ARG;
}

/* core.nn_layer(spec, name, seed [, ep_size, ep_rank]) -> Layer; with
 * ep_size > 1 its MoE layers are built placed for EP rank ep_rank (only
 * that rank's expert slots; lp_nn_moe_new_placed) */
static int lb_nn_layer(lua_State *L) {
  const char *name = luaL_checkstring(L, 2);
  uint64_t seed = (uint64_t)luaL_optinteger(L, 3, 0);
  lua_Integer es = luaL_optinteger(L, 4, 1), er = luaL_optinteger(L, 5, 0);
  luaL_argcheck(L, es >= 1 && es <= 65536, 4, "EP size must be 1..65536");
  luaL_argcheck(L, er >= 0 && er < es, 5, "EP rank must be in 0..size-1");
  int ep[2] = {(int)es, (int)er};
  layer_box *b = new_layer_box(L); /* closed-first */
  lp_status st = build_layer(L, 1, name, seed, ep, &b->l);
  if (st == LP_ERR_NOMEM) return luaL_error(L, "out of memory");
  if (st != LP_OK)
    return luaL_error(L, "layer '%s': bad sizes (%s)", name, lp_strerror(st));
  return 1;
}

/* core.nn_chunk(name, {Layer, ...} [, boundary "f32" | "bf16"]) -> Layer
 * (boundary: lp_nn_chunk_set_boundary) */
static int lb_nn_chunk(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  const char *bd = luaL_optstring(L, 3, "f32");
  lp_tensor_precision bprec;
  if (!lp_tensor_precision_parse(bd, &bprec))
    return luaL_argerror(
        L, 3, lua_pushfstring(L, "boundary must be \"f32\" or \"bf16\", got \"%s\"", bd));
  int n = (int)luaL_len(L, 2);
  luaL_argcheck(L, n >= 1, 2, "a chunk needs at least one layer");
  lp_nn_layer **ls = lua_newuserdatauv(L, (size_t)n * sizeof *ls, 0); /* scratch */
  for (int i = 0; i < n; i++) {
    lua_geti(L, 2, i + 1);
    ls[i] = lb_check_layer(L, -1);
    lua_pop(L, 1);
  }
  layer_box *b = new_layer_box(L);
  if (lp_nn_chunk_new(name, ls, (size_t)n, &b->l) != LP_OK) return luaL_error(L, "out of memory");
  lp_nn_chunk_set_boundary(b->l, bprec); /* a chunk, a known precision: cannot fail */
  return 1;
}

static int lb_layer_name(lua_State *L) {
  lua_pushstring(L, lp_nn_layer_name(lb_check_layer(L, 1)));
  return 1;
}

static int lb_layer_kind(lua_State *L) {
  lua_pushstring(L, lp_nn_layer_kind(lb_check_layer(L, 1)));
  return 1;
}

static int lb_layer_numel(lua_State *L) {
  lua_pushinteger(L, lp_nn_param_numel(lb_check_layer(L, 1)));
  return 1;
}

/* layer:params([grads]) -> {{name=, shape=, value={...}}, ...} (grads:
 * value is the gradient) */
static int lb_layer_params(lua_State *L) {
  lp_nn_layer *l = lb_check_layer(L, 1);
  int grads = lua_toboolean(L, 2);
  size_t n;
  const lp_nn_param *p = lp_nn_params(l, &n);
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_createtable(L, 0, 3);
    lua_pushstring(L, p[i].name);
    lua_setfield(L, -2, "name");
    push_shape(L, p[i].value);
    lua_setfield(L, -2, "shape");
    push_values(L, grads ? p[i].grad : p[i].value);
    lua_setfield(L, -2, "value");
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}

/* layer:set_params{[name] = {values...} | Tensor} -> layer. Unknown names
 * raise; a Tensor must have the parameter's shape. */
static int lb_layer_set_params(lua_State *L) {
  lp_nn_layer *l = lb_check_layer(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  size_t n;
  const lp_nn_param *p = lp_nn_params(l, &n);
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    /* never lua_tostring the key: it would turn a number key into a string
     * under lua_next */
    const char *name = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    if (!name)
      return luaL_error(L, "set_params: keys must be parameter names, got a %s key",
                        luaL_typename(L, -2));
    size_t i = 0;
    while (i < n && strcmp(p[i].name, name) != 0) i++;
    if (i == n) return luaL_error(L, "set_params: no parameter '%s'", name);
    int64_t c = lp_tensor_numel(p[i].value);
    tensor_box *tb = luaL_testudata(L, -1, LB_TENSOR);
    if (tb) { /* a Tensor of the parameter's shape: copied as it is */
      if (!tb->t) return luaL_error(L, "set_params: '%s' is a closed tensor", name);
      int same = tb->t->ndim == p[i].value->ndim;
      for (int d = 0; same && d < tb->t->ndim; d++)
        same = tb->t->shape[d] == p[i].value->shape[d];
      if (!same)
        return luaL_error(L, "set_params: '%s' has %I elements in another shape than the tensor "
                          "given (%I elements)", name, (lua_Integer)c,
                          (lua_Integer)lp_tensor_numel(tb->t));
      lp_status st = lp_tensor_copy(p[i].value, tb->t);
      if (st != LP_OK) return luaL_error(L, "set_params: '%s': %s", name, lp_strerror(st));
      lua_pop(L, 1);
      continue;
    }
    if (!lua_istable(L, -1))
      return luaL_error(L, "set_params: '%s' must be a list of %I numbers, got a %s", name,
                        (lua_Integer)c, luaL_typename(L, -1));
    if ((int64_t)luaL_len(L, -1) != c)
      return luaL_error(L, "set_params: '%s' has %I elements, got %I", name, (lua_Integer)c,
                        (lua_Integer)luaL_len(L, -1));
    lp_tensor *h = NULL; /* values go through a host copy (the param may be on a device) */
    if (lp_tensor_empty(NULL, p[i].value->ndim, p[i].value->shape, &h) != LP_OK)
      return luaL_error(L, "out of memory");
    for (int64_t j = 0; j < c; j++) {
      lua_geti(L, -1, j + 1);
      int ok;
      lua_Number x = lua_tonumberx(L, -1, &ok);
      if (!ok) {
        lp_tensor_free(h);
        return luaL_error(L, "set_params: '%s' value %I is not a number", name,
                          (lua_Integer)(j + 1));
      }
      h->data[j] = (float)x;
      lua_pop(L, 1);
    }
    lp_status st = lp_tensor_copy(p[i].value, h);
    lp_tensor_free(h);
    if (st != LP_OK) return luaL_error(L, "set_params: '%s': %s", name, lp_strerror(st));
    lua_pop(L, 1);
  }
  lua_settop(L, 1);
  return 1;
}

/* The backend holding l's parameters (the CPU for a layer without any). */
static const lp_tensor_backend *layer_backend(const lp_nn_layer *l) {
  size_t n;
  const lp_nn_param *p = lp_nn_params(l, &n);
  return n ? lp_tensor_backend_of(p[0].value) : lp_tensor_backend_cpu();
}

/* layer:forward(x) -> Tensor (inference, nothing stashed). A host x is
 * copied to the layer's device first. */
static int lb_layer_forward(lua_State *L) {
  lp_nn_layer *l = lb_check_layer(L, 1);
  lp_tensor *x = lb_check_tensor(L, 2), *xd = NULL;
  const lp_tensor_backend *be = layer_backend(l);
  tensor_box *b = new_tensor_box(L);
  lp_status st = LP_OK;
  if (lp_tensor_backend_of(x) != be && lp_tensor_backend_of(x)->host_accessible) {
    st = lp_tensor_empty(be, x->ndim, x->shape, &xd);
    if (st == LP_OK) st = lp_tensor_copy(xd, x);
  }
  if (st == LP_OK) st = lp_nn_forward(l, NULL, xd ? xd : x, &b->t);
  lp_tensor_free(xd);
  if (st != LP_OK) return lb_fail(L, lp_strerror(st));
  return 1;
}

/* The i-th (1-based) MoE layer inside the layer at 1 (raises when none). */
static lp_nn_layer *check_moe(lua_State *L, lp_nn_layer *l, int idx) {
  lua_Integer i = luaL_checkinteger(L, idx);
  lp_nn_layer *m = lp_nn_moe_find(l, (int)i - 1);
  if (!m)
    luaL_error(L, "layer '%s' has no MoE layer %d (it has %d)", lp_nn_layer_name(l), (int)i,
               lp_nn_moe_count(l));
  return m;
}

/* layer:moe_count() -> number of MoE layers inside */
static int lb_layer_moe_count(lua_State *L) {
  lua_pushinteger(L, lp_nn_moe_count(lb_check_layer(L, 1)));
  return 1;
}

/* layer:expert_load(i [, reset]) -> {tokens per logical expert} of the
 * i-th MoE layer since the last reset; reset = true starts a new count. */
static int lb_layer_expert_load(lua_State *L) {
  lp_nn_layer *m = check_moe(L, lb_check_layer(L, 1), 2);
  int E = lp_nn_moe_get_opts(m)->experts;
  int64_t *c = lua_newuserdatauv(L, (size_t)E * sizeof *c, 0); /* scratch */
  lp_nn_moe_expert_load(m, c);
  if (lua_toboolean(L, 3)) lp_nn_moe_load_reset(m);
  lua_createtable(L, E, 0);
  for (int e = 0; e < E; e++) {
    lua_pushinteger(L, c[e]);
    lua_rawseti(L, -2, e + 1);
  }
  return 1;
}

/* layer:update_bias(i, counts) -> layer: the i-th MoE layer's balancing
 * step with the (group-summed) loads; layer:moe_bias(i) -> {bias...} */
static int lb_layer_update_bias(lua_State *L) {
  lp_nn_layer *m = check_moe(L, lb_check_layer(L, 1), 2);
  int E = lp_nn_moe_get_opts(m)->experts;
  luaL_checktype(L, 3, LUA_TTABLE);
  luaL_argcheck(L, luaL_len(L, 3) == E, 3, "one count per expert");
  int64_t *c = lua_newuserdatauv(L, (size_t)E * sizeof *c, 0);
  for (int e = 0; e < E; e++) {
    lua_geti(L, 3, e + 1);
    c[e] = (int64_t)luaL_checkinteger(L, -1);
    lua_pop(L, 1);
  }
  lp_nn_moe_update_bias(m, c);
  lua_settop(L, 1);
  return 1;
}

/* layer:to(device) -> layer | nil, message. device: "cpu", "cuda" or
 * "cuda:N", meaning what they mean to training (lp_exec_device_index: "cuda"
 * is the local rank's device). Moves every parameter and grad (build
 * optimizers after). */
static int lb_layer_to(lua_State *L) {
  lp_nn_layer *l = lb_check_layer(L, 1);
  const char *dev = luaL_checkstring(L, 2);
  char err[LP_ERRLEN];
  int n = LP_DEVICE_CPU;
  if (lp_exec_device_index(dev, &n, err) != LP_OK) return luaL_error(L, "to: %s", err);
  const lp_tensor_backend *be =
      n == LP_DEVICE_CPU ? lp_tensor_backend_cpu() : lp_tensor_backend_cuda(n);
  if (!be) return lb_fail(L, lp_kernels_last_error());
  lp_status st = lp_nn_layer_to(l, be);
  if (st != LP_OK) {
    char msg[LP_ERRLEN];
    snprintf(msg, sizeof msg, "moving layer %s to %s: %s%s%s", lp_nn_layer_name(l), dev,
             lp_strerror(st), be->host_accessible ? "" : ": ",
             be->host_accessible ? "" : lp_kernels_last_error());
    return lb_fail(L, msg);
  }
  lua_settop(L, 1);
  return 1;
}

static int lb_layer_moe_bias(lua_State *L) {
  lp_nn_layer *m = check_moe(L, lb_check_layer(L, 1), 2);
  int E = lp_nn_moe_get_opts(m)->experts;
  float *b = lua_newuserdatauv(L, (size_t)E * sizeof *b, 0);
  lp_nn_moe_get_bias(m, b);
  lua_createtable(L, E, 0);
  for (int e = 0; e < E; e++) {
    lua_pushnumber(L, b[e]);
    lua_rawseti(L, -2, e + 1);
  }
  return 1;
}

/* layer:set_moe_bias(i, {bias...}) -> layer: the i-th MoE layer's
 * selection bias, one number per logical expert (as moe_bias returns). */
static int lb_layer_set_moe_bias(lua_State *L) {
  lp_nn_layer *l = lb_check_layer(L, 1);
  lp_nn_layer *m = check_moe(L, l, 2);
  int E = lp_nn_moe_get_opts(m)->experts;
  if (!lua_istable(L, 3))
    return luaL_error(L, "set_moe_bias: the bias must be a list of %d numbers (one per expert), "
                         "got a %s", E, luaL_typename(L, 3));
  lua_Integer n = luaL_len(L, 3);
  if (n != E)
    return luaL_error(L, "set_moe_bias: MoE layer %d of '%s' has %d experts, but the bias has "
                         "%I entries", (int)lua_tointeger(L, 2), lp_nn_layer_name(l), E, n);
  float *b = lua_newuserdatauv(L, (size_t)E * sizeof *b, 0); /* scratch */
  for (int e = 0; e < E; e++) {
    lua_geti(L, 3, e + 1);
    int ok;
    lua_Number x = lua_tonumberx(L, -1, &ok);
    if (!ok || !isfinite(x))
      return luaL_error(L, "set_moe_bias: bias[%d] (expert %d) must be a finite number, got %s",
                        e + 1, e, ok ? lua_tostring(L, -1) : luaL_typename(L, -1));
    b[e] = (float)x;
    if (b[e] != 0.0f && lp_nn_moe_get_opts(m)->no_bias)
      return luaL_error(L,
                        "set_moe_bias: MoE layer %d of '%s' has no correction bias "
                        "(correction_bias = false), but bias[%d] is %s",
                        (int)lua_tointeger(L, 2), lp_nn_layer_name(l), e + 1, lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  lp_nn_moe_set_bias(m, b);
  lua_settop(L, 1);
  return 1;
}

/* layer:route(i, x) -> {{experts = {...}, weights = {...}, scores = {...}},
 * ...}: what the i-th MoE layer's router decides for each token of x
 * ([tokens, dim] or [batch, seq, dim]), without running the experts or
 * counting loads. experts: the selected logical expert ids (0-based, in
 * selection order), weights: their combine weights, scores: the affinity of
 * every expert (scores[e + 1] is expert e's). */
static int lb_layer_route(lua_State *L) {
  lp_nn_layer *l = lb_check_layer(L, 1);
  lp_nn_layer *m = check_moe(L, l, 2);
  lp_tensor *x = lb_check_tensor(L, 3), *xd = NULL;
  const lp_nn_moe_opts *o = lp_nn_moe_get_opts(m);
  int E = o->experts, K = o->topk;
  if ((x->ndim != 2 && x->ndim != 3) || x->shape[x->ndim - 1] != o->dim) {
    char a[64];
    int k = 0;
    for (int d = 0; d < x->ndim && k < (int)sizeof a - 24; d++)
      k += snprintf(a + k, sizeof a - (size_t)k, "%s%lld", d ? ", " : "", (long long)x->shape[d]);
    if (x->ndim == 0) a[0] = 0;
    return luaL_error(L, "route: MoE layer %d of '%s' takes x as [tokens, %I] or [batch, seq, "
                         "%I], got [%s]", (int)lua_tointeger(L, 2), lp_nn_layer_name(l),
                      (lua_Integer)o->dim, (lua_Integer)o->dim, a);
  }
  int64_t n;
  lp_tensor_rows_cols(x, &n, NULL);
  const lp_tensor_backend *be = layer_backend(m);
  lp_status st = LP_OK;
  if (lp_tensor_backend_of(x) != be) { /* the router weight's backend */
    st = lp_tensor_empty(be, x->ndim, x->shape, &xd);
    if (st == LP_OK) st = lp_tensor_copy(xd, x);
  }
  size_t nk = (size_t)(n > 0 ? n : 1) * (size_t)K, ne = (size_t)(n > 0 ? n : 1) * (size_t)E;
  int *sel = lua_newuserdatauv(L, nk * sizeof *sel, 0); /* scratch */
  float *w = lua_newuserdatauv(L, nk * sizeof *w, 0);
  float *sc = lua_newuserdatauv(L, ne * sizeof *sc, 0);
  if (st == LP_OK) st = lp_nn_moe_route(m, xd ? xd : x, sel, w, sc);
  lp_tensor_free(xd);
  if (st != LP_OK) return lb_fail(L, lp_strerror(st));
  lua_createtable(L, (int)n, 0);
  for (int64_t t = 0; t < n; t++) {
    lua_createtable(L, 0, 3);
    lua_createtable(L, K, 0);
    for (int k = 0; k < K; k++) {
      lua_pushinteger(L, sel[t * K + k]);
      lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, -2, "experts");
    lua_createtable(L, K, 0);
    for (int k = 0; k < K; k++) {
      lua_pushnumber(L, w[t * K + k]);
      lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, -2, "weights");
    lua_createtable(L, E, 0);
    for (int e = 0; e < E; e++) {
      lua_pushnumber(L, sc[t * E + e]);
      lua_rawseti(L, -2, e + 1);
    }
    lua_setfield(L, -2, "scores");
    lua_rawseti(L, -2, t + 1);
  }
  return 1;
}

/* layer:device() -> "cpu" | "cuda:N" (where the parameters are) */
static int lb_layer_device(lua_State *L) {
  lua_pushstring(L, layer_backend(lb_check_layer(L, 1))->name);
  return 1;
}

/* layer:set_precision("f32" | "bf16") -> layer: the GEMMs of the layer and
 * everything inside it (lp_nn_layer_set_precision). */
static int lb_layer_set_precision(lua_State *L) {
  lp_nn_layer *l = lb_check_layer(L, 1);
  const char *p = luaL_checkstring(L, 2);
  lp_tensor_precision prec;
  if (!lp_tensor_precision_parse(p, &prec))
    return luaL_argerror(
        L, 2, lua_pushfstring(L, "precision must be \"f32\" or \"bf16\", got \"%s\"", p));
  if (lp_nn_layer_set_precision(l, prec) != LP_OK) return luaL_error(L, "set_precision failed");
  lua_settop(L, 1);
  return 1;
}

/* layer:precision() -> "f32" | "bf16" */
static int lb_layer_precision(lua_State *L) {
  lua_pushstring(L, lp_tensor_precision_name(lp_nn_layer_precision(lb_check_layer(L, 1))));
  return 1;
}

/* core.bf16_engine() -> text, native, f32 text: which engine runs the
 * CPU's bf16 GEMMs (lp_tensor_bf16_engine), whether it is oneDNN, and
 * which runs its float32 GEMMs (lp_tensor_f32_engine). */
static int lb_bf16_engine(lua_State *L) {
  lua_pushstring(L, lp_tensor_bf16_engine());
  lua_pushboolean(L, lp_tensor_bf16_native());
  lua_pushstring(L, lp_tensor_f32_engine());
  return 3;
}

/* ---- luapipe.Optim ---- */

typedef struct optim_box {
  lp_nn_optim *o;
  lp_nn_layer *l; /* a reference: the params must outlive the optimizer */
} optim_box;

static lp_nn_optim *check_optim(lua_State *L, int idx) {
  return ((optim_box *)lb_box_check(L, idx, LB_OPTIM))->o;
}

/* optim:set_lr(lr): from the next step on */
static int lb_optim_set_lr(lua_State *L) {
  lp_nn_optim *o = check_optim(L, 1);
  lua_Number lr = luaL_checknumber(L, 2);
  luaL_argcheck(L, lr >= 0 && lr < HUGE_VAL, 2, "a learning rate >= 0");
  lp_nn_optim_set_lr(o, (float)lr);
  return 0;
}

static int lb_optim_close(lua_State *L) {
  optim_box *b = luaL_checkudata(L, 1, LB_OPTIM);
  lp_nn_optim_free(b->o);
  lp_nn_layer_release(b->l);
  b->o = NULL;
  b->l = NULL;
  return 0;
}

/* Field k of the optimizer options at idx, deflt when nil; a non-number
 * raises naming the option (never "bad argument #-1"). */
static float opt_num(lua_State *L, int idx, const char *k, float deflt) {
  lua_getfield(L, idx, k);
  int isnum = 1;
  float v = lua_isnil(L, -1) ? deflt : (float)lua_tonumberx(L, -1, &isnum);
  if (!isnum)
    luaL_error(L, "optimizer: option '%s' must be a number, got %s", k, luaL_typename(L, -1));
  lua_pop(L, 1);
  return v;
}

void lb_optim_opts(lua_State *L, int idx, lp_nn_optim_type *kind, lp_nn_sgd_opts *sgd,
                   lp_nn_adamw_opts *adamw) {
  *kind = LP_NN_OPTIM_SGD;
  *sgd = (lp_nn_sgd_opts){0.01f, 0.0f, 0.0f};
  *adamw = (lp_nn_adamw_opts){1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  if (lua_isnoneornil(L, idx)) return;
  idx = lua_absindex(L, idx);
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_getfield(L, idx, "kind");
  const char *k = lua_tostring(L, -1);
  if (k && strcmp(k, "adamw") == 0) *kind = LP_NN_OPTIM_ADAMW;
  else if (k && strcmp(k, "sgd") != 0)
    luaL_error(L, "optimizer kind must be \"sgd\" or \"adamw\", got \"%s\"", k);
  lua_pop(L, 1);
  if (*kind == LP_NN_OPTIM_SGD) {
    sgd->lr = opt_num(L, idx, "lr", sgd->lr);
    sgd->momentum = opt_num(L, idx, "momentum", 0);
    sgd->weight_decay = opt_num(L, idx, "weight_decay", 0);
  } else {
    adamw->lr = opt_num(L, idx, "lr", adamw->lr);
    adamw->beta1 = opt_num(L, idx, "beta1", adamw->beta1);
    adamw->beta2 = opt_num(L, idx, "beta2", adamw->beta2);
    adamw->eps = opt_num(L, idx, "eps", adamw->eps);
    adamw->weight_decay = opt_num(L, idx, "weight_decay", adamw->weight_decay);
  }
}

/* core.nn_optim(layer, opts) -> Optim */
static int lb_nn_optim(lua_State *L) {
  lp_nn_layer *l = lb_check_layer(L, 1);
  lp_nn_optim_type kind;
  lp_nn_sgd_opts sgd;
  lp_nn_adamw_opts adamw;
  lb_optim_opts(L, 2, &kind, &sgd, &adamw);
  optim_box *b = lb_box_new(L, sizeof *b, LB_OPTIM);
  size_t n;
  const lp_nn_param *p = lp_nn_params(l, &n);
  lp_status st = kind == LP_NN_OPTIM_ADAMW ? lp_nn_optim_adamw_new(p, n, &adamw, &b->o)
                                             : lp_nn_optim_sgd_new(p, n, &sgd, &b->o);
  if (st != LP_OK) return luaL_error(L, "optimizer: %s", lp_strerror(st));
  b->l = lp_nn_layer_retain(l);
  return 1;
}

static int lb_optim_step(lua_State *L) {
  lp_status st = lp_nn_optim_step(check_optim(L, 1));
  if (st != LP_OK) return lb_fail(L, lp_strerror(st));
  lua_pushboolean(L, 1);
  return 1;
}

static int lb_optim_zero_grad(lua_State *L) {
  lp_status st = lp_nn_optim_zero_grad(check_optim(L, 1));
  if (st != LP_OK) return lb_fail(L, lp_strerror(st));
  lua_pushboolean(L, 1);
  return 1;
}

/* ---- the data adapter ---- */

lp_status lb_data_call(void *ud, int64_t step, int mb, lp_tensor **input, lp_tensor **target,
                       char *err) {
  lb_data *d = ud;
  lua_State *L = d->L;
  int top = lua_gettop(L);
  lp_status st = LP_OK;
  if (input) *input = NULL;
  if (target) *target = NULL;
  if (!lua_checkstack(L, 8)) {
    lp_errf(err, "Lua stack overflow");
    return LP_ERR_NOMEM;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, d->ref);
  lua_pushinteger(L, step);
  lua_pushinteger(L, mb);
  if (lp_lua_pcall(L, 2, 2) != LUA_OK) {
    lp_errf(err, "the data function failed: %s", lua_tostring(L, -1));
    st = LP_ERR_ARG;
    goto done;
  }
  for (int i = 0; i < 2; i++) {
    lp_tensor **out = i == 0 ? input : target;
    if (!out) continue;
    tensor_box *b = luaL_testudata(L, top + 1 + i, LB_TENSOR);
    if (!b || !b->t) {
      lp_errf(err, "the data function must return two luapipe.Tensor values (input, target); "
              "%s %d is a %s", i == 0 ? "input" : "target", mb,
              luaL_typename(L, top + 1 + i));
      st = LP_ERR_ARG;
      goto done;
    }
    st = lp_tensor_view(b->t, out);
    if (st != LP_OK) goto done;
  }
done:
  if (st != LP_OK) {
    if (input && *input) { lp_tensor_free(*input); *input = NULL; }
    if (target && *target) { lp_tensor_free(*target); *target = NULL; }
  }
  lua_settop(L, top);
  return st;
}

lp_nn_loss_kind lb_loss_kind(lua_State *L, int idx, const char *what) {
  const char *name = luaL_optstring(L, idx, lp_nn_loss_names[LP_NN_LOSS_MSE]);
  for (int k = 0; k < LP_NN_LOSS__N; k++)
    if (strcmp(name, lp_nn_loss_names[k]) == 0) return (lp_nn_loss_kind)k;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int k = 0; k < LP_NN_LOSS__N; k++) {
    lua_pushfstring(L, "%s\"%s\"", k == 0 ? "" : k == LP_NN_LOSS__N - 1 ? " or " : ", ",
                    lp_nn_loss_names[k]);
    luaL_addvalue(&b);
  }
  luaL_pushresult(&b);
  return (lp_nn_loss_kind)luaL_error(L, "%s must be %s, got \"%s\"", what, lua_tostring(L, -1),
                                     name);
}

/* core.nn_loss_names() -> {"mse", "cross_entropy"} (the loss kinds) */
static int lb_nn_loss_names(lua_State *L) {
  lua_createtable(L, LP_NN_LOSS__N, 0);
  for (int k = 0; k < LP_NN_LOSS__N; k++) {
    lua_pushstring(L, lp_nn_loss_names[k]);
    lua_rawseti(L, -2, k + 1);
  }
  return 1;
}

/* core.nn_reference_step(layer, optim, loss, M, data, step [, clip])
 * -> loss, gnorm (-1 without clipping) | nil, err */
static int lb_nn_reference_step(lua_State *L) {
  lp_nn_layer *l = lb_check_layer(L, 1);
  lp_nn_optim *o = check_optim(L, 2);
  lp_nn_loss_kind lk = lb_loss_kind(L, 3, "loss");
  int M = (int)luaL_checkinteger(L, 4);
  luaL_argcheck(L, M >= 1, 4, "at least one micro-batch");
  luaL_checktype(L, 5, LUA_TFUNCTION);
  int64_t step = luaL_checkinteger(L, 6);
  float clip = (float)luaL_optnumber(L, 7, 0);
  lua_pushvalue(L, 5);
  lb_data d = {L, luaL_ref(L, LUA_REGISTRYINDEX)};
  char err[LP_ERRLEN] = "";
  double loss = 0, gnorm = -1;
  lp_status st = lp_exec_reference_step_clip(l, o, lk, M, lb_data_call, &d, step, clip, &loss,
                                             &gnorm, err);
  luaL_unref(L, LUA_REGISTRYINDEX, d.ref);
  if (st != LP_OK) return lb_fail(L, *err ? err : lp_strerror(st));
  lua_pushnumber(L, loss);
  lua_pushnumber(L, gnorm);
  return 2;
}

/* core.nn_time_layer(layer, input, reps [, input_grad]) -> seconds, output |
 * nil, err: forward + backward time of one layer on `input`, the best of
 * `reps` runs, and its forward output (the next layer's input: a model is
 * measured one layer at a time, so only one layer need exist at once).
 * One untimed run goes first (first-touch pages, allocator and BLAS
 * set-up would otherwise count against the first layers measured). The
 * backward starts from a constant output gradient and computes the input
 * gradient when input_grad is true (every layer but the first). */
static int lb_nn_time_layer(lua_State *L) {
  lp_nn_layer *l = lb_check_layer(L, 1);
  lp_tensor *input = lb_check_tensor(L, 2);
  int reps = (int)luaL_optinteger(L, 3, 3);
  luaL_argcheck(L, reps >= 1, 3, "at least one run");
  int input_grad = lua_toboolean(L, 4);
  tensor_box *out = new_tensor_box(L); /* owned by Lua (freed by the GC if something raises) */
  double best = 1e30;
  lp_status st = LP_OK;
  for (int r = -1; r < reps && st == LP_OK; r++) { /* r = -1: the warm-up */
    lp_nn_ctx *ctx = NULL;
    lp_tensor *x = NULL, *y = NULL, *dy = NULL, *dx = NULL;
    st = lp_tensor_view(input, &x);
    if (st == LP_OK) st = lp_nn_ctx_new(&ctx);
    double t0 = lp_now(), tf = 0;
    if (st == LP_OK) st = lp_nn_forward(l, ctx, x, &y);
    tf = lp_now() - t0;
    if (st == LP_OK) st = lp_tensor_empty_like(y, &dy);
    if (st == LP_OK) st = lp_tensor_fill(dy, 1.0f / (float)lp_tensor_numel(y));
    if (st == LP_OK) {
      t0 = lp_now();
      st = lp_nn_backward(l, ctx, dy, input_grad ? &dx : NULL);
      double t = tf + lp_now() - t0;
      if (st == LP_OK && r >= 0 && t < best) best = t;
    }
    lp_tensor_free(dx);
    lp_tensor_free(dy);
    lp_tensor_free(x);
    lp_nn_ctx_free(ctx);
    if (st == LP_OK && r == reps - 1) {
      out->t = y;
    } else {
      lp_tensor_free(y);
    }
  }
  if (st != LP_OK) return lb_fail(L, lp_strerror(st));
  lua_pushnumber(L, best);
  lua_insert(L, -2); /* seconds, output */
  return 2;
}

void lb_open_nn(lua_State *L) {
  static const luaL_Reg tensor_methods[] = {{"shape", lb_tensor_shape},
                                            {"totable", lb_tensor_totable},
                                            {"numel", lb_tensor_numel},
                                            {"close", lb_tensor_close},
                                            {NULL, NULL}};
  static const luaL_Reg tensor_meta[] = {{"__gc", lb_tensor_close},
                                         {"__close", lb_tensor_close},
                                         {"__tostring", lb_tensor_tostring},
                                         {NULL, NULL}};
  static const luaL_Reg layer_methods[] = {{"name", lb_layer_name},
                                           {"kind", lb_layer_kind},
                                           {"numel", lb_layer_numel},
                                           {"params", lb_layer_params},
                                           {"set_params", lb_layer_set_params},
                                           {"forward", lb_layer_forward},
                                           {"moe_count", lb_layer_moe_count},
                                           {"expert_load", lb_layer_expert_load},
                                           {"update_bias", lb_layer_update_bias},
                                           {"moe_bias", lb_layer_moe_bias},
                                           {"set_moe_bias", lb_layer_set_moe_bias},
                                           {"route", lb_layer_route},
                                           {"to", lb_layer_to},
                                           {"device", lb_layer_device},
                                           {"set_precision", lb_layer_set_precision},
                                           {"precision", lb_layer_precision},
                                           {"close", lb_layer_close},
                                           {NULL, NULL}};
  static const luaL_Reg layer_meta[] = {{"__gc", lb_layer_close}, {"__close", lb_layer_close},
                                        {NULL, NULL}};
  static const luaL_Reg optim_methods[] = {{"step", lb_optim_step},
                                           {"zero_grad", lb_optim_zero_grad},
                                           {"set_lr", lb_optim_set_lr},
                                           {"close", lb_optim_close},
                                           {NULL, NULL}};
  static const luaL_Reg optim_meta[] = {{"__gc", lb_optim_close}, {"__close", lb_optim_close},
                                        {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"tensor", lb_tensor_new},
                                   {"check_shape", lb_check_shape_fn},
                                   {"nn_layer", lb_nn_layer},
                                   {"nn_mla_check", lb_nn_mla_check},
                                   {"nn_chunk", lb_nn_chunk},
                                   {"bf16_engine", lb_bf16_engine},
                                   {"nn_optim", lb_nn_optim},
                                   {"nn_reference_step", lb_nn_reference_step},
                                   {"nn_loss_names", lb_nn_loss_names},
                                   {"nn_time_layer", lb_nn_time_layer},
                                   {NULL, NULL}};
  lb_new_class(L, LB_TENSOR, "Tensor", tensor_methods, tensor_meta);
  lb_new_class(L, LB_LAYER, "Layer", layer_methods, layer_meta);
  lb_new_class(L, LB_OPTIM, "Optim", optim_methods, optim_meta);
  luaL_setfuncs(L, funcs, 0);
}
