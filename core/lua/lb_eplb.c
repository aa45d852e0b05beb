/* lb_eplb.c — EPLB seen from Lua: core.eplb_rebalance{...},
 * core.eplb_evaluate{...} and core.eplb_check(...). Wrong argument types
 * raise; bad data (ragged rows, negative loads, inconsistent counts) and
 * every failure of the C core return nil, message. Layers, experts and
 * slots are numbered from 0 in messages and maps, as in the C core. */
#include <stdint.h>
#include <string.h>

#include "lb_internal.h"
#include "lp_eplb.h"

/* A scratch array owned by a userdata left on the stack, so that raising
 * or returning early never leaks it. */
static void *scratch(lua_State *L, size_t n, size_t size) {
  return lua_newuserdatauv(L, n * size > 0 ? n * size : 1, 0);
}

/* Reads field `name` of the options table (at index 1) as a positive
 * integer; raises when missing or wrong. */
static int opt_int(lua_State *L, const char *name, int deflt, int min) {
  int isnum;
  lua_getfield(L, 1, name);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    if (deflt == INT32_MIN) luaL_error(L, "eplb: option '%s' is required", name);
    return deflt;
  }
  lua_Integer v = lua_tointegerx(L, -1, &isnum);
  if (!isnum)
    luaL_error(L, "eplb: option '%s' must be an integer, got %s", name, luaL_typename(L, -1));
  if (v < min || v > INT32_MAX)
    luaL_error(L, "eplb: option '%s' must be from %d to %d (got %I)", name, min, INT32_MAX, v);
  lua_pop(L, 1);
  return (int)v;
}

/* Reads a matrix of numbers (rows of equal length) from the table at idx.
 * want_rows / want_cols < 0: any. On a data error writes msg and returns
 * NULL; the array (a userdata) is pushed on success. Integers when ints. */
static void *read_matrix(lua_State *L, int idx, const char *what, int want_rows,
                         int want_cols, int ints, int *rows, int *cols, char *msg) {
  idx = lua_absindex(L, idx);
  if (lua_type(L, idx) == LUA_TSTRING && ints) {
    /* compact form: native int32, rows x cols given by the caller */
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    if (want_rows > 0 && want_cols < 0 && len % ((size_t)want_rows * sizeof(int32_t)) == 0)
      want_cols = (int)(len / ((size_t)want_rows * sizeof(int32_t)));
    if (want_rows < 0 || want_cols < 0 ||
        len != (size_t)want_rows * (size_t)want_cols * sizeof(int32_t)) {
      lp_errf(msg, "%s: compact string has %zu bytes, expected %d x %d int32", what, len,
              want_rows, want_cols);
      return NULL;
    }
    int *out = scratch(L, (size_t)want_rows * want_cols, sizeof(int));
    for (size_t i = 0; i < (size_t)want_rows * want_cols; i++) {
      int32_t v;
      memcpy(&v, s + i * sizeof v, sizeof v);
      out[i] = v;
    }
    *rows = want_rows;
    *cols = want_cols;
    return out;
  }
  if (lua_type(L, idx) != LUA_TTABLE) {
    lp_errf(msg, "%s must be a table of layers, got %s", what, luaL_typename(L, idx));
    return NULL;
  }
  int n = (int)luaL_len(L, idx);
  if (want_rows >= 0 && n != want_rows) {
    lp_errf(msg, "%s has %d layer%s, expected %d", what, n, LP_PLURAL(n), want_rows);
    return NULL;
  }
  if (n == 0) {
    lp_errf(msg, "%s has no layers", what);
    return NULL;
  }
  lua_geti(L, idx, 1);
  int m = lua_type(L, -1) == LUA_TTABLE ? (int)luaL_len(L, -1) : -1;
  lua_pop(L, 1);
  if (m < 0) {
    lp_errf(msg, "%s: layer 0 is not a table of numbers", what);
    return NULL;
  }
  if (want_cols >= 0 && m != want_cols) {
    lp_errf(msg, "%s: layer 0 has %d entries, expected %d", what, m, want_cols);
    return NULL;
  }
  void *out = scratch(L, (size_t)n * (m > 0 ? m : 1), ints ? sizeof(int) : sizeof(double));
  for (int r = 0; r < n; r++) {
    lua_geti(L, idx, r + 1);
    if (lua_type(L, -1) != LUA_TTABLE) {
      lp_errf(msg, "%s: layer %d is a %s, not a table of numbers", what, r, luaL_typename(L, -1));
      lua_pop(L, 2);
      return NULL;
    }
    int len = (int)luaL_len(L, -1);
    if (len != m) {
      lp_errf(msg, "%s: layer %d has %d entries, layer 0 has %d (ragged rows)", what, r, len, m);
      lua_pop(L, 2);
      return NULL;
    }
    for (int c = 0; c < m; c++) {
      int t = lua_geti(L, -1, c + 1), ok;
      if (ints) {
        lua_Integer v = lua_tointegerx(L, -1, &ok);
        if (!ok || v < INT32_MIN || v > INT32_MAX) {
          lp_errf(msg, "%s: layer %d, entry %d is %s, not an integer", what, r, c,
                  t == LUA_TNUMBER ? "a fraction" : lua_typename(L, t));
          lua_pop(L, 3);
          return NULL;
        }
        ((int *)out)[(size_t)r * m + c] = (int)v;
      } else {
        lua_Number v = lua_tonumberx(L, -1, &ok);
        if (!ok || t != LUA_TNUMBER) {
          lp_errf(msg, "%s: layer %d, expert %d is a %s, not a number", what, r, c,
                  lua_typename(L, t));
          lua_pop(L, 3);
          return NULL;
        }
        ((double *)out)[(size_t)r * m + c] = (double)v;
      }
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  *rows = n;
  *cols = m;
  return out;
}

/* Pushes rows x cols ints as a table of tables, or as a native int32
 * string when compact. */
static void push_ints(lua_State *L, const int *a, int rows, int cols, int compact) {
  if (compact) {
    luaL_Buffer b;
    size_t n = (size_t)rows * cols;
    int32_t *p = (int32_t *)luaL_buffinitsize(L, &b, n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) p[i] = (int32_t)a[i];
    luaL_pushresultsize(&b, n * sizeof(int32_t));
    return;
  }
  lua_createtable(L, rows, 0);
  for (int r = 0; r < rows; r++) {
    lua_createtable(L, cols, 0);
    for (int c = 0; c < cols; c++) {
      lua_pushinteger(L, a[(size_t)r * cols + c]);
      lua_rawseti(L, -2, c + 1);
    }
    lua_rawseti(L, -2, r + 1);
  }
}

/* Appends the decimal text of v to b. */
static void add_int(luaL_Buffer *b, int v) {
  char tmp[16];
  int n = 0;
  unsigned u = v < 0 ? 0u - (unsigned)v : (unsigned)v;
  do {
    tmp[n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0) tmp[n++] = '-';
  char *p = luaL_prepbuffsize(b, (size_t)n);
  for (int i = 0; i < n; i++) p[i] = tmp[n - 1 - i];
  luaL_addsize(b, (size_t)n);
}

/* Pushes a JSON array of n ints (stride apart) as text: "[1,2,3]". */
static void add_json_ints(luaL_Buffer *b, const int *a, int n) {
  luaL_addchar(b, '[');
  for (int i = 0; i < n; i++) {
    if (i) luaL_addchar(b, ',');
    add_int(b, a[i]);
  }
  luaL_addchar(b, ']');
}

/* Pushes the three maps as tables of JSON text, one string per layer
 * ({physical_to_logical = {...}, logical_to_physical = {...},
 * logical_count = {...}}); logical_to_physical lists each expert's slots
 * without padding (size and time proportional to the plan), or, padded,
 * every expert's row of the plan's width with -1 after its slots. */
static void push_json_rows(lua_State *L, const lp_eplb_plan *p, int padded) {
  int Ln = lp_eplb_plan_layers(p), E = lp_eplb_plan_experts(p);
  int R = lp_eplb_plan_replicas(p), X = lp_eplb_plan_width(p);
  const int *p2l = lp_eplb_plan_phy2log(p), *l2p = lp_eplb_plan_log2phy(p);
  const int *cnt = lp_eplb_plan_logcnt(p);
  lua_createtable(L, 0, 3);
  for (int which = 0; which < 3; which++) {
    lua_createtable(L, Ln, 0);
    for (int l = 0; l < Ln; l++) {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      if (which == 0) {
        add_json_ints(&b, p2l + (size_t)l * R, R);
      } else if (which == 1) {
        luaL_addchar(&b, '[');
        for (int e = 0; e < E; e++) {
          if (e) luaL_addchar(&b, ',');
          add_json_ints(&b, l2p + ((size_t)l * E + e) * X, padded ? X : cnt[(size_t)l * E + e]);
        }
        luaL_addchar(&b, ']');
      } else {
        add_json_ints(&b, cnt + (size_t)l * E, E);
      }
      luaL_pushresult(&b);
      lua_rawseti(L, -2, l + 1);
    }
    lua_setfield(L, -2, which == 0 ? "physical_to_logical"
                        : which == 1 ? "logical_to_physical" : "logical_count");
  }
}

/* Sets the three maps on the table on top: tables (ragged: each expert's
 * slots in logical_to_physical without -1 padding, size proportional to
 * the plan) or native int32 strings (compact). */
static void push_maps(lua_State *L, const lp_eplb_plan *p, int compact, int ragged) {
  int Ln = lp_eplb_plan_layers(p), E = lp_eplb_plan_experts(p);
  int R = lp_eplb_plan_replicas(p), X = lp_eplb_plan_width(p);
  push_ints(L, lp_eplb_plan_phy2log(p), Ln, R, compact);
  lua_setfield(L, -2, "physical_to_logical");
  const int *l2p = lp_eplb_plan_log2phy(p);
  const int *cnt = lp_eplb_plan_logcnt(p);
  if (ragged && !compact) {
    lua_createtable(L, Ln, 0);
    for (int l = 0; l < Ln; l++) {
      lua_createtable(L, E, 0);
      for (int e = 0; e < E; e++) {
        int n = cnt[(size_t)l * E + e];
        const int *slots = l2p + ((size_t)l * E + e) * X;
        lua_createtable(L, n, 0);
        for (int x = 0; x < n; x++) {
          lua_pushinteger(L, slots[x]);
          lua_rawseti(L, -2, x + 1);
        }
        lua_rawseti(L, -2, e + 1);
      }
      lua_rawseti(L, -2, l + 1);
    }
  } else if (compact) {
    push_ints(L, l2p, Ln, E * X, 1);
  } else {
    lua_createtable(L, Ln, 0);
    for (int l = 0; l < Ln; l++) {
      push_ints(L, l2p + (size_t)l * E * X, E, X, 0);
      lua_rawseti(L, -2, l + 1);
    }
  }
  lua_setfield(L, -2, "logical_to_physical");
  push_ints(L, cnt, Ln, E, compact);
  lua_setfield(L, -2, "logical_count");
}

/* Pushes the result table of a plan (see luapipe.eplb for its fields).
 * json: the maps come as json_rows (push_json_rows) instead; 2: with
 * logical_to_physical padded (rebalance's json with fixed_x). */
static void push_plan(lua_State *L, const lp_eplb_plan *p, int compact, int ragged, int json) {
  int Ln = lp_eplb_plan_layers(p), E = lp_eplb_plan_experts(p);
  int R = lp_eplb_plan_replicas(p), G = lp_eplb_plan_gpus(p), X = lp_eplb_plan_width(p);
  lua_createtable(L, 0, 16);
  if (json) {
    push_json_rows(L, p, json == 2);
    lua_setfield(L, -2, "json_rows");
  } else {
    push_maps(L, p, compact, ragged);
  }
  const double *gl = lp_eplb_plan_gpu_load(p);
  lua_createtable(L, Ln, 0);
  for (int l = 0; l < Ln; l++) {
    lua_createtable(L, G, 0);
    for (int g = 0; g < G; g++) {
      lua_pushnumber(L, gl[(size_t)l * G + g]);
      lua_rawseti(L, -2, g + 1);
    }
    lua_rawseti(L, -2, l + 1);
  }
  lua_setfield(L, -2, "gpu_load");
  const int *gc = lp_eplb_plan_gpu_copies(p);
  if (gc) {
    push_ints(L, gc, Ln, G, 0);
    lua_setfield(L, -2, "gpu_copies");
  }

  lp_eplb_stats st;
  lp_eplb_plan_stats(p, &st);
  const lp_eplb_layer_stats *ls = lp_eplb_plan_layer_stats(p);
  lua_createtable(L, 0, 11);
  lb_set_number(L, "balancedness", st.balancedness);
  lb_set_number(L, "gpu_max_over_mean", st.gpu_max_over_mean);
  lb_set_number(L, "node_max_over_mean", st.node_max_over_mean);
  lb_set_number(L, "off_node_load", st.off_node_load);
  if (st.copies >= 0) lb_set_integer(L, "copies", st.copies);
  lb_set_integer(L, "duplicates", st.duplicates);
  lb_set_number(L, "solve_ms", st.solve_ms);
  lb_set_integer(L, "refine_steps", st.refine_steps);
  lb_set_integer(L, "refine_work", st.refine_work);
  lb_set_integer(L, "refine_cut", st.refine_cut);
  lua_createtable(L, Ln, 0);
  for (int l = 0; l < Ln; l++) {
    lua_createtable(L, 0, 8);
    lb_set_number(L, "max_load", ls[l].max_load);
    lb_set_number(L, "mean_load", ls[l].mean_load);
    lb_set_number(L, "gpu_max_over_mean", ls[l].gpu_max_over_mean);
    lb_set_number(L, "node_max_over_mean", ls[l].node_max_over_mean);
    lb_set_number(L, "balancedness", ls[l].balancedness);
    lb_set_number(L, "off_node_load", ls[l].off_node_load);
    if (ls[l].copies >= 0) lb_set_integer(L, "copies", ls[l].copies);
    lb_set_integer(L, "duplicates", ls[l].duplicates);
    lua_rawseti(L, -2, l + 1);
  }
  lua_setfield(L, -2, "per_layer");
  lua_setfield(L, -2, "stats");

  lb_set_integer(L, "layers", Ln);
  lb_set_integer(L, "experts", E);
  lb_set_integer(L, "replicas", R);
  lb_set_integer(L, "gpus", G);
  lb_set_integer(L, "nodes", lp_eplb_plan_nodes(p));
  lb_set_integer(L, "width", X);
  lua_pushstring(L, lp_eplb_plan_hierarchical(p) ? "hierarchical" : "global");
  lua_setfield(L, -2, "policy");
  lua_pushstring(L, lp_eplb_mode_name(lp_eplb_plan_mode(p)));
  lua_setfield(L, -2, "mode");
  lua_pushboolean(L, compact);
  lua_setfield(L, -2, "compact");
  lua_pushboolean(L, ragged && !compact);
  lua_setfield(L, -2, "ragged");
  lua_pushboolean(L, json);
  lua_setfield(L, -2, "json");
}

/* Runs the core call with the plan held by a closed-first box. */
typedef struct plan_box {
  lp_eplb_plan *p;
} plan_box;

static int plan_box_gc(lua_State *L) {
  plan_box *b = lua_touserdata(L, 1);
  lp_eplb_plan_free(b->p);
  b->p = NULL;
  return 0;
}

static plan_box *new_plan_box(lua_State *L) {
  plan_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->p = NULL;
  if (luaL_newmetatable(L, "luapipe.EplbPlan")) {
    lua_pushcfunction(L, plan_box_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  return b;
}

static int finish(lua_State *L, plan_box *b, lp_status st, const char *err, int compact,
                  int ragged, int json) {
  if (st == LP_ERR_NOMEM) return luaL_error(L, "out of memory");
  if (st != LP_OK) return lb_fail(L, err);
  push_plan(L, b->p, compact, ragged, json);
  lp_eplb_plan_free(b->p);
  b->p = NULL;
  return 1;
}

/* core.eplb_rebalance{load=, replicas=, groups=, nodes=, gpus=, mode=,
 * spill=, previous=, max_moves=, fixed_x=, compact=, ragged=,
 * json=} -> result | nil, err */
static int lb_eplb_rebalance(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  int replicas = opt_int(L, "replicas", INT32_MIN, 1);
  int gpus = opt_int(L, "gpus", INT32_MIN, 1);
  int groups = opt_int(L, "groups", 1, 1);
  int nodes = opt_int(L, "nodes", 1, 1);
  int max_moves = opt_int(L, "max_moves", -1, 0);
  int fixed_x = opt_int(L, "fixed_x", 0, 0);
  lp_eplb_options o;
  lp_eplb_options_init(&o);
  lua_getfield(L, 1, "mode");
  if (!lua_isnil(L, -1)) {
    const char *m = lua_tostring(L, -1);
    int mode = lp_eplb_mode_parse(m);
    if (mode < 0)
      return luaL_error(L, "eplb: unknown mode '%s' (expected reference or balanced)", m ? m : "?");
    o.mode = (lp_eplb_mode)mode;
  }
  lua_getfield(L, 1, "spill");
  o.spill = lua_toboolean(L, -1);
  lua_getfield(L, 1, "compact");
  int compact = lua_toboolean(L, -1);
  lua_getfield(L, 1, "ragged");
  int ragged = lua_toboolean(L, -1);
  lua_getfield(L, 1, "json");
  int json = lua_toboolean(L, -1);
  lua_settop(L, 1);
  o.max_moves = max_moves;
  o.fixed_x = fixed_x;

  char err[LP_ERRLEN];
  int layers, experts;
  lua_getfield(L, 1, "load"); /* [opts, load] */
  if (lua_isnil(L, -1)) return luaL_error(L, "eplb: option 'load' is required");
  const double *load = read_matrix(L, 2, "load", -1, -1, 0, &layers, &experts, err);
  if (!load) return lb_fail(L, err); /* [opts, load, loadbuf] */
  lua_getfield(L, 1, "previous"); /* [opts, load, loadbuf, previous] */
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) == LUA_TTABLE) { /* a whole earlier result works too */
      lua_getfield(L, -1, "physical_to_logical");
      if (!lua_isnil(L, -1)) lua_replace(L, -2);
      else lua_pop(L, 1);
    }
    int pr, pc;
    const int *prev = read_matrix(L, 4, "previous", layers, replicas, 1, &pr, &pc, err);
    if (!prev) return lb_fail(L, err);
    o.previous = prev;
  }
  plan_box *b = new_plan_box(L);
  lp_status st = lp_eplb_rebalance(load, layers, experts, replicas, groups, nodes, gpus, &o,
                                   &b->p, err);
  return finish(L, b, st, err, compact, ragged, json && fixed_x > 0 ? 2 : json);
}

/* core.eplb_evaluate{load=, physical_to_logical=, nodes=, gpus=, previous=}
 * -> result | nil, err */
static int lb_eplb_evaluate(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  int gpus = opt_int(L, "gpus", INT32_MIN, 1);
  int nodes = opt_int(L, "nodes", 1, 1);
  lua_getfield(L, 1, "compact");
  int compact = lua_toboolean(L, -1);
  lua_getfield(L, 1, "ragged");
  int ragged = lua_toboolean(L, -1);
  lua_getfield(L, 1, "json");
  int json = lua_toboolean(L, -1);
  lua_settop(L, 1);
  char err[LP_ERRLEN];
  int layers, experts, rows, replicas;
  lua_getfield(L, 1, "load");
  if (lua_isnil(L, -1)) return luaL_error(L, "eplb: option 'load' is required");
  const double *load = read_matrix(L, 2, "load", -1, -1, 0, &layers, &experts, err);
  if (!load) return lb_fail(L, err); /* [opts, load, loadbuf] */
  lua_getfield(L, 1, "physical_to_logical");
  if (lua_isnil(L, -1)) return luaL_error(L, "eplb: option 'physical_to_logical' is required");
  const int *map = read_matrix(L, 4, "physical_to_logical", layers, -1, 1, &rows, &replicas, err);
  if (!map) return lb_fail(L, err);
  const int *prev = NULL;
  lua_getfield(L, 1, "previous");
  if (!lua_isnil(L, -1)) {
    int pr, pc;
    prev = read_matrix(L, -1, "previous", layers, replicas, 1, &pr, &pc, err);
    if (!prev) return lb_fail(L, err);
  }
  plan_box *b = new_plan_box(L);
  lp_status st = lp_eplb_evaluate(load, layers, experts, map, replicas, nodes, gpus, prev,
                                  &b->p, err);
  return finish(L, b, st, err, compact, ragged, json);
}

/* core.eplb_check(experts, replicas, groups, nodes, gpus [, layers = 1])
 * -> true | nil, err */
static int lb_eplb_check(lua_State *L) {
  static const char *const names[6] = {"experts", "replicas", "groups", "nodes", "gpus",
                                       "layers"};
  int v[6];
  for (int i = 0; i < 6; i++) {
    lua_Integer x = i == 5 ? luaL_optinteger(L, i + 1, 1) : luaL_checkinteger(L, i + 1);
    if (x < INT32_MIN || x > INT32_MAX) {
      lua_pushnil(L);
      lua_pushfstring(L, "%s (%I) is out of range (at most %d)", names[i], x, (int)INT32_MAX);
      return 2;
    }
    v[i] = (int)x;
  }
  char err[LP_ERRLEN];
  if (lp_eplb_check_shape(v[5], v[0], v[1], v[2], v[3], v[4], err) != LP_OK)
    return lb_fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

void lb_open_eplb(lua_State *L) {
  static const luaL_Reg funcs[] = {{"eplb_rebalance", lb_eplb_rebalance},
                                   {"eplb_evaluate", lb_eplb_evaluate},
                                   {"eplb_check", lb_eplb_check},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  /* the size limits of lp_eplb.h, for the CLI's option ranges and docs */
  lua_pushinteger(L, LP_EPLB_MAX_REPLICAS);
  lua_setfield(L, -2, "EPLB_MAX_REPLICAS");
  lua_pushinteger(L, LP_EPLB_MAX_SLOTS);
  lua_setfield(L, -2, "EPLB_MAX_SLOTS");
  lua_pushinteger(L, LP_EPLB_MAX_RELABEL_GPUS);
  lua_setfield(L, -2, "EPLB_MAX_RELABEL_GPUS");
}
