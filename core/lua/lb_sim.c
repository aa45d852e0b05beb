/* lb_sim.c — luapipe.SimResult: the simulator seen from Lua, plus
 * `Schedule:simulate{...}` and core.isatty(fd).
 * A bad cost table raises; an invalid schedule returns nil, message. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "lb_internal.h"
#include "lp_lua.h"
#include "lp_sim.h"
#include "lp_tensor.h"
#include "lp_trace.h"

#define LB_SIMRESULT "luapipe.SimResult"

typedef struct simres_box {
  lp_sim_result *r; /* NULL once closed */
} simres_box;

static lp_sim_result *check_result(lua_State *L, int idx) {
  return ((simres_box *)lb_box_check(L, idx, LB_SIMRESULT))->r;
}

static int lb_simres_close(lua_State *L) {
  simres_box *b = luaL_checkudata(L, 1, LB_SIMRESULT);
  lp_sim_result_free(b->r);
  b->r = NULL;
  return 0;
}

/* __tostring: the Lua-side summary (luapipe.sim) when it loads, else a
 * one-line note. */
static int lb_simres_tostring(lua_State *L) {
  simres_box *b = luaL_checkudata(L, 1, LB_SIMRESULT);
  if (!b->r) {
    lua_pushliteral(L, "luapipe.SimResult (closed)");
    return 1;
  }
  if (lua_getfield(L, 1, "summary") == LUA_TFUNCTION) { /* [res, summary] */
    lua_pushvalue(L, 1);
    if (lp_lua_pcall(L, 1, 1) == LUA_OK && lua_type(L, -1) == LUA_TSTRING)
      return 1;
  }
  lua_pop(L, 1);
  lua_pushfstring(L, "luapipe.SimResult: makespan %f, largest bubble %f",
                  (lua_Number)lp_sim_makespan(b->r),
                  (lua_Number)lp_sim_max_bubble(b->r));
  return 1;
}

/* ---- the cost table ---- */

/* The field of t that holds compute kind k's time (LP_KIND_*). */
static double *time_field(lp_sim_times *t, int k) {
  double *f[LP_NKINDS] = {&t->f, &t->b, &t->i, &t->w, &t->fb};
  return f[k];
}

/* keys[0..n-1] = the names of the first n compute kinds (lp_kind_name: the
 * cost table's time keys), then the NULL-terminated `more`; and the same
 * names joined by ", " in text (len bytes), for check_keys' "expected". */
static void kind_keys(const char **keys, int n, const char *const *more, char *text,
                      size_t len) {
  size_t at = 0;
  int m = 0;
  text[0] = '\0';
  for (int k = 0; k < n; k++) keys[m++] = lp_kind_name(k);
  for (int i = 0; more && more[i]; i++) keys[m++] = more[i];
  keys[m] = NULL;
  for (int i = 0; i < m && at < len; i++)
    at += (size_t)snprintf(text + at, len - at, "%s%s", i ? ", " : "", keys[i]);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Raises "<ctx>: unknown key(s) 'a', 'b' (expected ...)" when the table at
 * idx has a key outside `allowed` (NULL-terminated). Sorted, so the
 * message does not depend on table order. */
static void check_keys(lua_State *L, int idx, const char *const *allowed,
                       const char *ctx, const char *expected) {
  const char *bad[8];
  int nbad = 0, more = 0;
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1); /* [key] */
    int ok = 0;
    if (lua_type(L, -1) == LUA_TSTRING) {
      const char *k = lua_tostring(L, -1);
      for (int i = 0; allowed[i] && !ok; i++)
        ok = strcmp(k, allowed[i]) == 0;
      if (!ok) {
        if (nbad < 8)
          bad[nbad++] = k; /* the key stays alive in the table */
        else
          more = 1;
      }
    } else {
      if (nbad < 8)
        bad[nbad++] = luaL_typename(L, -1);
      else
        more = 1;
    }
  }
  if (nbad == 0) return;
  qsort(bad, (size_t)nbad, sizeof *bad, cmp_str);
  luaL_Buffer buf;
  luaL_buffinit(L, &buf);
  lua_pushfstring(L, "%s: unknown key%s ", ctx, nbad > 1 ? "s" : "");
  luaL_addvalue(&buf);
  for (int i = 0; i < nbad; i++) {
    lua_pushfstring(L, "%s'%s'", i ? ", " : "", bad[i]);
    luaL_addvalue(&buf);
  }
  if (more) luaL_addstring(&buf, ", ...");
  lua_pushfstring(L, " (expected %s)", expected);
  luaL_addvalue(&buf);
  luaL_pushresult(&buf);
  lua_error(L);
}

/* Reads number field `key` of the table at idx into *dst when present. */
static void get_time(lua_State *L, int idx, const char *key, double *dst,
                     const char *ctx) {
  int t = lua_getfield(L, idx, key);
  if (t != LUA_TNIL) {
    int isnum;
    lua_Number v = lua_tonumberx(L, -1, &isnum);
    char err[LP_ERRLEN];
    if (!isnum)
      luaL_error(L, "%s: %s must be a number >= 0, got %s", ctx, key, luaL_typename(L, -1));
    if (lp_sim_time_check(key, (double)v, err) != LP_OK) luaL_error(L, "%s: %s", ctx, err);
    *dst = (double)v;
  }
  lua_pop(L, 1);
}

static void read_times(lua_State *L, int idx, lp_sim_times *t,
                       const char *ctx) {
  for (int k = 0; k < LP_NKINDS; k++)
    get_time(L, idx, lp_kind_name(k), time_field(t, k), ctx);
}

/* The emulated link: cost.link = "lat=50us,bw=2GB/s" (lp_link_parse) and
 * cost.bytes = bytes of one cross-rank message. */
static void read_link(lua_State *L, int idx, lp_sim_cost *c) {
  if (lua_getfield(L, idx, "link") != LUA_TNIL) {
    char err[LP_ERRLEN];
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_error(L, "simulate: link must be a string such as 'lat=50us,bw=2GB/s'");
    if (lp_link_parse(lua_tostring(L, -1), &c->link, err) != LP_OK)
      luaL_error(L, "simulate: %s", err);
  }
  lua_pop(L, 1);
  get_time(L, idx, "bytes", &c->message_bytes, "simulate");
  /* the activation's size by dtype: values = values in one activation,
   * precision = "f32" (4 bytes a value) or "bf16" (2) */
  get_time(L, idx, "values", &c->act_values, "simulate");
  if (lua_getfield(L, idx, "precision") != LUA_TNIL) {
    const char *p = lua_tostring(L, -1);
    lp_tensor_precision prec;
    if (lua_type(L, -1) != LUA_TSTRING || !lp_tensor_precision_parse(p, &prec))
      luaL_error(L, "simulate: precision must be \"f32\" or \"bf16\", got %s",
                 luaL_tolstring(L, -1, NULL));
    c->value_bytes = prec == LP_TENSOR_BF16 ? 2 : 4;
  }
  lua_pop(L, 1);
}

/* The key of the [key, value] pair on top of the stack as a model stage of
 * cost.<what> (0..S-1) whose value is a table shaped `shape`, or raises. */
static int stage_entry(lua_State *L, int S, const char *what, const char *shape) {
  int isint;
  lua_Integer k = lua_tointegerx(L, -2, &isint);
  if (!isint || lua_type(L, -2) != LUA_TNUMBER || k < 0 || k >= S)
    luaL_error(L, "simulate: %s key %s is not a model stage 0..%d", what,
               luaL_tolstring(L, -2, NULL), S - 1);
  if (!lua_istable(L, -1))
    luaL_error(L, "simulate: %s[%d] must be a table %s", what, (int)k, shape);
  return (int)k;
}

/* MoE exchanges: cost.exchanges = {[stage] = {F = {n=, bytes_out=,
 * bytes_in=}, B = ..., I = ...}} (lp_sim_exchanges) in a userdata left on
 * the stack; cost.link_unit = cost units per second of link time. */
static void read_exchanges(lua_State *L, int idx, lp_schedule *s, lp_sim_cost *c) {
  const char *halves[LP_KIND_I + 2]; /* the kinds that exchange: F, B, I */
  char hnames[32];
  kind_keys(halves, LP_KIND_I + 1, NULL, hnames, sizeof hnames);
  static const char *const fields[] = {"n", "bytes_out", "bytes_in", NULL};
  get_time(L, idx, "link_unit", &c->link_unit, "simulate");
  if (lua_getfield(L, idx, "exchanges") == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  if (!lua_istable(L, -1))
    luaL_error(L, "simulate: exchanges must be a table {[stage] = {F = {n=, bytes_out=, "
               "bytes_in=}, ...}}");
  int S = lp_schedule_stages(s);
  size_t sz = (size_t)(S > 0 ? S : 1) * 3 * sizeof(lp_sim_exchanges);
  lp_sim_exchanges *x = lua_newuserdatauv(L, sz, 0);
  memset(x, 0, sz);
  lua_pushnil(L);
  while (lua_next(L, -3)) { /* [exchanges, x, key, value] */
    int k = stage_entry(L, S, "exchanges", "{F = {n=, ...}, B =, I =}");
    char ctx[64];
    snprintf(ctx, sizeof ctx, "simulate: exchanges[%d]", k);
    check_keys(L, -1, halves, ctx, hnames);
    for (int h = 0; halves[h]; h++) {
      if (lua_getfield(L, -1, halves[h]) != LUA_TNIL) {
        snprintf(ctx, sizeof ctx, "simulate: exchanges[%d].%s", k, halves[h]);
        if (!lua_istable(L, -1))
          luaL_error(L, "%s must be a table {n=, bytes_out=, bytes_in=}", ctx);
        check_keys(L, -1, fields, ctx, "n, bytes_out, bytes_in");
        int t = lua_absindex(L, -1);
        lp_sim_exchanges *e = &x[3 * (size_t)k + h];
        get_time(L, t, "n", &e->n, ctx);
        get_time(L, t, "bytes_out", &e->bytes_out, ctx);
        get_time(L, t, "bytes_in", &e->bytes_in, ctx);
      }
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_remove(L, -2); /* [x] stays on the stack */
  c->exchanges = x;
  c->nexchange_stages = S;
}

/* Data parallelism: cost.dp = ranks of a DP group, cost.dp_bytes =
 * {[stage] = bytes of its gradients} (lp_sim_cost.dp_ranks / dp_bytes)
 * into a userdata left on the stack. */
static void read_dp(lua_State *L, int idx, lp_schedule *s, lp_sim_cost *c) {
  double dp = 0;
  get_time(L, idx, "dp", &dp, "simulate");
  if (dp != (int)dp) luaL_error(L, "simulate: dp must be a whole number of ranks, got %g", dp);
  c->dp_ranks = (int)dp;
  if (lua_getfield(L, idx, "dp_bytes") == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  if (!lua_istable(L, -1)) luaL_error(L, "simulate: dp_bytes must be a table {[stage] = bytes}");
  int S = lp_schedule_stages(s);
  double *b = lua_newuserdatauv(L, (size_t)(S > 0 ? S : 1) * sizeof *b, 0);
  for (int k = 0; k < S; k++) b[k] = 0;
  lua_pushnil(L);
  while (lua_next(L, -3)) { /* [dp_bytes, b, key, value] */
    int isint, isnum;
    lua_Integer k = lua_tointegerx(L, -2, &isint);
    lua_Number v = lua_tonumberx(L, -1, &isnum);
    if (!isint || k < 0 || k >= S)
      luaL_error(L, "simulate: dp_bytes key %s is not a model stage 0..%d",
                 luaL_tolstring(L, -2, NULL), S - 1);
    if (!isnum || !(v >= 0) || v > LP_SIM_MAX_TIME)
      luaL_error(L, "simulate: dp_bytes[%d] must be a number of bytes >= 0", (int)k);
    b[k] = (double)v;
    lua_pop(L, 1);
  }
  lua_remove(L, -2); /* [b]: kept on the stack with the cost */
  c->dp_bytes = b;
  c->ndp_stages = S;
}

/* Per-action times: cost.actions = {[rank] = {[index] = time, ...}} (ranks
 * and action indices 0-based, as messages and s:action print them; only
 * compute actions) into a userdata left on the stack: [P] row pointers,
 * then each rank's row, LP_SIM_UNSET where none is given. */
static void read_actions(lua_State *L, int idx, lp_schedule *s, lp_sim_cost *c) {
  if (lua_getfield(L, idx, "actions") == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  if (!lua_istable(L, -1))
    luaL_error(L, "simulate: actions must be a table {[rank] = {[action index] = time, ...}}");
  int P = lp_schedule_ranks(s);
  size_t total = 0;
  for (int r = 0; r < P; r++) {
    int n = 0;
    lp_schedule_actions(s, r, &n);
    total += (size_t)n;
  }
  size_t head = (size_t)(P > 0 ? P : 1) * sizeof(double *);
  void *ud = lua_newuserdatauv(L, head + (total ? total : 1) * sizeof(double), 0);
  double **rows = ud;
  double *cell = (double *)((char *)ud + head);
  for (int r = 0; r < P; r++) {
    int n = 0;
    lp_schedule_actions(s, r, &n);
    rows[r] = cell;
    for (int i = 0; i < n; i++) cell[i] = LP_SIM_UNSET;
    cell += n;
  }
  lua_pushnil(L);
  while (lua_next(L, -3)) { /* [actions, ud, rank, row] */
    int isint;
    lua_Integer r = lua_tointegerx(L, -2, &isint);
    if (!isint || lua_type(L, -2) != LUA_TNUMBER || r < 0 || r >= P)
      luaL_error(L, "simulate: actions key %s is not a rank 0..%d", luaL_tolstring(L, -2, NULL),
                 P - 1);
    if (!lua_istable(L, -1))
      luaL_error(L, "simulate: actions[%d] must be a table {[action index] = time, ...}", (int)r);
    int n = 0;
    const lp_action *acts = lp_schedule_actions(s, (int)r, &n);
    lua_pushnil(L);
    while (lua_next(L, -2)) { /* [..., row, index, time] */
      lua_Integer i = lua_tointegerx(L, -2, &isint);
      if (!isint || lua_type(L, -2) != LUA_TNUMBER || i < 0 || i >= n)
        luaL_error(L, "simulate: actions[%d] key %s is not an action of rank %d (0..%d)", (int)r,
                   luaL_tolstring(L, -2, NULL), (int)r, n - 1);
      char text[LP_ACTION_TEXT_MAX], ctx[LP_ACTION_TEXT_MAX + 64];
      lp_action_format(&acts[i], text, sizeof text);
      snprintf(ctx, sizeof ctx, "simulate: actions[%d][%d] (%s)", (int)r, (int)i, text);
      if (!lp_action_is_compute(acts[i].type))
        luaL_error(L, "%s: only compute actions (F, B, I, W, FB) take time", ctx);
      int isnum;
      lua_Number v = lua_tonumberx(L, -1, &isnum);
      char err[LP_ERRLEN];
      if (!isnum) luaL_error(L, "%s must be a number >= 0, got %s", ctx, luaL_typename(L, -1));
      if (lp_sim_time_check("its time", (double)v, err) != LP_OK) luaL_error(L, "%s: %s", ctx, err);
      rows[r][i] = (double)v;
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_remove(L, -2); /* [ud] stays on the stack */
  c->durations = (const double *const *)rows;
  c->nduration_ranks = P;
}

/* Fills c from the cost table at idx (absent or nil: defaults). Stage
 * overrides live in a userdata left on the stack (collected with it). */
static void read_cost(lua_State *L, int idx, lp_schedule *s, lp_sim_cost *c) {
  static const char *const others[] = {"latency", "stages", "link", "bytes", "exchanges",
                                       "link_unit", "actions", "dp", "dp_bytes", "values",
                                       "precision", NULL};
  const char *top_keys[LP_NKINDS + 12];
  char expected[160];
  kind_keys(top_keys, LP_NKINDS, others, expected, sizeof expected);
  lp_sim_cost_init(c);
  if (lua_isnoneornil(L, idx)) return;
  luaL_checktype(L, idx, LUA_TTABLE);
  idx = lua_absindex(L, idx);
  check_keys(L, idx, top_keys, "simulate", expected);
  read_times(L, idx, &c->t, "simulate");
  get_time(L, idx, "latency", &c->latency, "simulate");
  read_link(L, idx, c);
  read_exchanges(L, idx, s, c);
  read_actions(L, idx, s, c);
  read_dp(L, idx, s, c);
  if (lua_getfield(L, idx, "stages") == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  if (!lua_istable(L, -1))
    luaL_error(L, "simulate: stages must be a table {[stage] = {F = ...}}");
  int S = lp_schedule_stages(s);
  const char *time_keys[LP_NKINDS + 1];
  char tnames[32];
  kind_keys(time_keys, LP_NKINDS, NULL, tnames, sizeof tnames);
  lp_sim_times *ov =
      lua_newuserdatauv(L, (size_t)S * sizeof *ov, 0); /* [stages, ov] */
  for (int k = 0; k < S; k++)
    lp_sim_times_init(&ov[k]);
  lua_pushnil(L);
  while (lua_next(L, -3)) { /* [stages, ov, key, value] */
    int k = stage_entry(L, S, "stages", "{F = ...}");
    char ctx[64];
    snprintf(ctx, sizeof ctx, "simulate: stages[%d]", k);
    check_keys(L, -1, time_keys, ctx, tnames);
    read_times(L, lua_absindex(L, -1), &ov[k], ctx);
    lua_pop(L, 1);
  }
  lua_remove(L, -2); /* [ov] stays on the stack */
  c->stages = ov;
  c->nstages = S;
}

/* s:simulate([cost]) -> SimResult | nil, message */
static int lb_schedule_simulate(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  lp_sim_cost cost;
  read_cost(L, 2, s, &cost);
  simres_box *b = lb_box_new(L, sizeof *b, LB_SIMRESULT); /* closed first */
  char err[LP_ERRLEN];
  lp_status st = lp_sim_run(s, &cost, &b->r, err);
  if (st == LP_ERR_NOMEM) return luaL_error(L, "out of memory");
  if (st == LP_ERR_ARG) return luaL_error(L, "simulate: %s", err);
  if (st != LP_OK) return lb_fail(L, err);
  return 1;
}

/* ---- SimResult methods ---- */

static int lb_simres_makespan(lua_State *L) {
  lua_pushnumber(L, lp_sim_makespan(check_result(L, 1)));
  return 1;
}

static int lb_simres_max_bubble(lua_State *L) {
  lua_pushnumber(L, lp_sim_max_bubble(check_result(L, 1)));
  return 1;
}

/* r:info() -> {name=, ranks=, stages=, microbatches=, latency=} */
static int lb_simres_info(lua_State *L) {
  lp_sim_result *r = check_result(L, 1);
  lua_createtable(L, 0, 5);
  lua_pushstring(L, lp_sim_name(r));
  lua_setfield(L, -2, "name");
  lb_set_integer(L, "ranks", lp_sim_ranks(r));
  lb_set_integer(L, "stages", lp_sim_stages(r));
  lb_set_integer(L, "microbatches", lp_sim_microbatches(r));
  lb_set_number(L, "latency", lp_sim_latency(r));
  return 1;
}

/* r:ranks() -> {{rank=, busy=, bubble=, bubble_ratio=, finish=,
 *                peak_live=, peak_pending_w=, a2a=, a2a_hidden=, dp=, dp_hidden=}, ...}
 * for ranks 0..P-1 (a2a: modelled MoE exchange time, a2a_hidden: its part
 * hidden in overlapped pairs) */
static int lb_simres_ranks(lua_State *L) {
  lp_sim_result *r = check_result(L, 1);
  int P = lp_sim_ranks(r);
  lua_createtable(L, P, 0);
  for (int k = 0; k < P; k++) {
    lp_sim_rank_stats st;
    lp_sim_rank_stats_of(r, k, &st);
    lua_createtable(L, 0, 9);
    lb_set_integer(L, "rank", k);
    lb_set_number(L, "busy", st.busy);
    lb_set_number(L, "bubble", st.bubble);
    lb_set_number(L, "bubble_ratio", st.bubble_ratio);
    lb_set_number(L, "finish", st.finish);
    lb_set_integer(L, "peak_live", st.peak_live);
    lb_set_integer(L, "peak_pending_w", st.peak_pending_w);
    lb_set_number(L, "a2a", st.a2a);
    lb_set_number(L, "a2a_hidden", st.a2a_hidden);
    lb_set_number(L, "dp", st.dp);
    lb_set_number(L, "dp_hidden", st.dp_hidden);
    lb_set_number(L, "peak_act_bytes", st.peak_act_bytes);
    lua_rawseti(L, -2, k + 1);
  }
  return 1;
}

/* r:events([rank]) -> {{rank=, index=, text=, type=, stage=, mb=, start=,
 *                        finish=, [btype=, bstage=, bmb=]}, ...} */
static int lb_simres_events(lua_State *L) {
  lp_sim_result *r = check_result(L, 1);
  int n;
  const lp_sim_event *ev;
  if (lua_isnoneornil(L, 2)) {
    ev = lp_sim_events(r, &n);
  } else {
    int rank = lb_check_int(L, 2);
    luaL_argcheck(L, rank >= 0 && rank < lp_sim_ranks(r), 2, "no such rank");
    ev = lp_sim_rank_events(r, rank, &n);
  }
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lb_push_action(L, &ev[i].action);
    lb_set_integer(L, "rank", ev[i].rank);
    lb_set_integer(L, "index", ev[i].index);
    lb_set_number(L, "start", ev[i].start);
    lb_set_number(L, "finish", ev[i].end);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* r:messages() -> {{from=, to=, sent=, arrived=, text=}, ...} */
static int lb_simres_messages(lua_State *L) {
  lp_sim_result *r = check_result(L, 1);
  int n;
  const lp_sim_message *m = lp_sim_messages(r, &n);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_createtable(L, 0, 7);
    lb_set_integer(L, "from", m[i].from);
    lb_set_integer(L, "to", m[i].to);
    lb_set_number(L, "sent", m[i].sent);
    lb_set_number(L, "arrived", m[i].arrived);
    lua_pushstring(L, m[i].text);
    lua_setfield(L, -2, "text");
    lb_set_integer(L, "from_index", m[i].from_index);
    lb_set_integer(L, "to_index", m[i].to_index);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* r:memory(rank) -> {{time=, live=, pending_w=}, ...} (counter series) */
static int lb_simres_memory(lua_State *L) {
  lp_sim_result *r = check_result(L, 1);
  int rank = lb_check_int(L, 2);
  luaL_argcheck(L, rank >= 0 && rank < lp_sim_ranks(r), 2, "no such rank");
  int n;
  const lp_sim_sample *s = lp_sim_memory(r, rank, &n);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_createtable(L, 0, 3);
    lb_set_number(L, "time", s[i].t);
    lb_set_integer(L, "live", s[i].live);
    lb_set_integer(L, "pending_w", s[i].pending_w);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* r:trace_json() -> Chrome/Perfetto JSON text */
static int lb_simres_trace_json(lua_State *L) {
  lp_sim_result *r = check_result(L, 1);
  lp_trace *t;
  if (lp_trace_from_sim(r, &t) != LP_OK) return luaL_error(L, "out of memory");
  char *json = lp_trace_to_json(t);
  lp_trace_free(t);
  if (!json) return luaL_error(L, "out of memory");
  lua_pushstring(L, json);
  lp_free(json);
  return 1;
}

/* r:write_trace(path) -> true | nil, message (written atomically) */
static int lb_simres_write_trace(lua_State *L) {
  lp_sim_result *r = check_result(L, 1);
  const char *path = luaL_checkstring(L, 2);
  lp_trace *t;
  if (lp_trace_from_sim(r, &t) != LP_OK) return luaL_error(L, "out of memory");
  char err[LP_ERRLEN];
  lp_status st = lp_trace_write_json(t, path, err);
  lp_trace_free(t);
  if (st != LP_OK) return lb_fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.sim_check_time(key, v) -> true | nil, "<key> = <v> must be ..."
 * (lp_sim_time_check, for the Lua layers' own parsers) */
static int lb_sim_check_time(lua_State *L) {
  char err[LP_ERRLEN];
  if (lp_sim_time_check(luaL_checkstring(L, 1), (double)luaL_checknumber(L, 2), err) != LP_OK)
    return lb_fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.sim_resolve_cost{F=, B=, I=, W=, FB=} -> {F, B, I, W[, FB]} as the
 * simulator fills in what is not given (lp_sim_cost_resolve: B = I + W,
 * only B: I = W = B/2, ...), or nil, message (e.g. B less than W) */
static int lb_sim_resolve_cost(lua_State *L) {
  char err[LP_ERRLEN];
  luaL_checktype(L, 1, LUA_TTABLE);
  lp_sim_cost c;
  lp_sim_cost_init(&c);
  read_times(L, 1, &c.t, "sim.resolve_cost");
  lp_sim_times t;
  if (lp_sim_cost_resolve(&c, -1, &t, err) != LP_OK) return lb_fail(L, err);
  lua_createtable(L, 0, LP_NKINDS);
  for (int k = 0; k < LP_NKINDS; k++)
    if (k != LP_KIND_FB || t.fb != LP_SIM_UNSET)
      lb_set_number(L, lp_kind_name(k), *time_field(&t, k));
  return 1;
}

/* core.isatty(fd) -> boolean */
static int lb_isatty(lua_State *L) {
  lua_pushboolean(L, isatty(lb_check_int(L, 1)) == 1);
  return 1;
}

/* core.terminal_columns(fd) -> columns of the terminal fd ends at, or nil
 * when it is no terminal (or the terminal does not say); help text wraps
 * to it */
static int lb_terminal_columns(lua_State *L) {
  struct winsize ws;
  int fd = lb_check_int(L, 1);
  if (isatty(fd) == 1 && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    lua_pushinteger(L, ws.ws_col);
  } else {
    lua_pushnil(L);
  }
  return 1;
}

void lb_open_sim(lua_State *L) {
  static const luaL_Reg methods[] = {{"makespan", lb_simres_makespan},
                                     {"max_bubble", lb_simres_max_bubble},
                                     {"info", lb_simres_info},
                                     {"ranks", lb_simres_ranks},
                                     {"events", lb_simres_events},
                                     {"messages", lb_simres_messages},
                                     {"memory", lb_simres_memory},
                                     {"trace_json", lb_simres_trace_json},
                                     {"write_trace", lb_simres_write_trace},
                                     {"close", lb_simres_close},
                                     {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", lb_simres_close},
                                  {"__close", lb_simres_close},
                                  {"__tostring", lb_simres_tostring},
                                  {NULL, NULL}};
  static const luaL_Reg funcs[] = {
      {"isatty", lb_isatty}, {"terminal_columns", lb_terminal_columns},
      {"sim_check_time", lb_sim_check_time}, {"sim_resolve_cost", lb_sim_resolve_cost},
      {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  /* The Lua layer (luapipe.sim, luapipe.show) adds its methods to these
   * tables when it loads; the binding never requires it. */
  lb_new_class(L, LB_SIMRESULT, "SimResult", methods, meta);
  lua_getfield(L, -1, "Schedule"); /* [mod, Schedule methods] */
  lua_pushcfunction(L, lb_schedule_simulate);
  lua_setfield(L, -2, "simulate");
  lua_pop(L, 1);
}
