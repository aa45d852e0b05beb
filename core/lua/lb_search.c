/* lb_search.c — luapipe.Search: the schedule search (lp_search) seen from
 * Lua. core.search_new(spec) takes the problem as the Lua layer
 * (luapipe.search) resolved it; bad specs raise, runtime failures return
 * nil, message. A Lua objective is called through the pcall choke point;
 * its error (a Ctrl-C's "interrupted!" among them) ends the run and comes
 * back as nil, message. */
#include <math.h>
#include <string.h>

#include "lb_internal.h"
#include "lp_lua.h"
#include "lp_search.h"

#define LB_SEARCH "luapipe.Search"

typedef struct search_box {
  lp_search *S; /* NULL once closed */
  lua_State *L; /* the state inside :run (objective calls) */
  int fn_ref;   /* registry ref of the Lua objective, LUA_NOREF */
  char fn_err[LP_ERRLEN];
} search_box;

static search_box *check_box(lua_State *L) {
  search_box *b = lb_box_check(L, 1, LB_SEARCH);
  return b;
}

static int lb_search_close(lua_State *L) {
  search_box *b = luaL_checkudata(L, 1, LB_SEARCH);
  lp_search_free(b->S);
  b->S = NULL;
  if (b->fn_ref != LUA_NOREF && b->fn_ref != 0) luaL_unref(L, LUA_REGISTRYINDEX, b->fn_ref);
  b->fn_ref = LUA_NOREF;
  return 0;
}

/* The eval as a Lua table {makespan=, span=, ranks={{rank=, start=,
 * finish=, busy=, peak_memory=}, ...}}. */
static void push_eval(lua_State *L, const lp_search_eval *e) {
  lua_createtable(L, 0, 3);
  lb_set_number(L, "makespan", e->makespan);
  lb_set_number(L, "span", e->span);
  lua_createtable(L, e->ranks, 0);
  for (int r = 0; r < e->ranks; r++) {
    lua_createtable(L, 0, 5);
    lb_set_integer(L, "rank", r);
    lb_set_number(L, "start", e->rank[r].start);
    lb_set_number(L, "finish", e->rank[r].finish);
    lb_set_number(L, "busy", e->rank[r].busy);
    lb_set_number(L, "peak_memory", e->rank[r].peak_memory);
    lua_rawseti(L, -2, r + 1);
  }
  lua_setfield(L, -2, "ranks");
}

static double call_objective(void *ud, const lp_search_eval *e) {
  search_box *b = ud;
  lua_State *L = b->L;
  if (!L || b->fn_err[0]) return NAN;
  if (!lua_checkstack(L, 8)) return NAN;
  lua_rawgeti(L, LUA_REGISTRYINDEX, b->fn_ref);
  push_eval(L, e);
  if (lp_lua_pcall(L, 1, 1) != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    lp_errf(b->fn_err, "objective: %s", msg ? msg : "(error without a message)");
    lua_pop(L, 1);
    return NAN;
  }
  int isnum;
  double v = lua_tonumberx(L, -1, &isnum);
  lua_pop(L, 1);
  if (!isnum || v != v) {
    lp_errf(b->fn_err, "objective: the function returned %s, not a number",
            isnum ? "NaN" : "a non-number");
    return NAN;
  }
  return v;
}

static int *int_array(lua_State *L, int idx, const char *key, int n, int base) {
  lua_getfield(L, idx, key);
  if (!lua_istable(L, -1)) luaL_error(L, "search spec: %s must be a table", key);
  int *a = lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1) * sizeof *a, 0);
  for (int k = 0; k < n; k++) {
    lua_rawgeti(L, -2, k + 1);
    int ok;
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok) luaL_error(L, "search spec: %s[%d] must be an integer", key, k + 1);
    a[k] = (int)(v - base);
    lua_pop(L, 1);
  }
  lua_replace(L, -2); /* keep the userdata (GC anchor) in place of the table */
  return a;
}

static double *num_array(lua_State *L, int idx, const char *key, int n) {
  lua_getfield(L, idx, key);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_pushnil(L); /* placeholder keeps the stack shape */
    return NULL;
  }
  double *a = lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1) * sizeof *a, 0);
  if (lua_isnumber(L, -2)) {
    double x = lua_tonumber(L, -2);
    for (int k = 0; k < n; k++) a[k] = x;
  } else if (lua_istable(L, -2)) {
    for (int k = 0; k < n; k++) {
      lua_rawgeti(L, -2, k + 1);
      if (!lua_isnumber(L, -1)) luaL_error(L, "search spec: %s[%d] must be a number", key, k + 1);
      a[k] = lua_tonumber(L, -1);
      lua_pop(L, 1);
    }
  } else {
    luaL_error(L, "search spec: %s must be a number or a table", key);
  }
  lua_replace(L, -2);
  return a;
}

static double opt_num(lua_State *L, int idx, const char *key, double dflt) {
  lua_getfield(L, idx, key);
  double v = lua_isnil(L, -1) ? dflt : luaL_checknumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static void read_times(lua_State *L, int idx, lp_sim_times *t) {
  lp_sim_times_init(t);
  double *f[LP_NKINDS] = {&t->f, &t->b, &t->i, &t->w, &t->fb}; /* LP_KIND_* order */
  for (int k = 0; k < LP_NKINDS; k++) *f[k] = opt_num(L, idx, lp_kind_name(k), LP_SIM_UNSET);
}

/* core.search_new(spec) -> luapipe.Search, or nil, message */
static int lb_search_new(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lp_search_problem p;
  memset(&p, 0, sizeof p);
  lua_getfield(L, 1, "ranks");
  p.ranks = (int)luaL_checkinteger(L, -1);
  lua_getfield(L, 1, "stages");
  p.stages = (int)luaL_checkinteger(L, -1);
  lua_getfield(L, 1, "microbatches");
  p.microbatches = (int)luaL_checkinteger(L, -1);
  lua_getfield(L, 1, "nroutes");
  p.nroutes = (int)luaL_checkinteger(L, -1);
  lua_pop(L, 4);
  lua_getfield(L, 1, "vstage_stage");
  p.nvstages = (int)luaL_len(L, -1);
  lua_pop(L, 1);
  if (p.ranks < 1 || p.stages < 1 || p.microbatches < 1 || p.nroutes < 1 || p.nvstages < 1 ||
      (long long)p.nvstages * p.microbatches > (1LL << 24) ||
      (long long)p.nroutes * p.stages > (1LL << 24) || p.microbatches > (1 << 20))
    return luaL_error(L, "search spec: counts out of range");
  int base = lua_gettop(L);
  p.vstage_stage = int_array(L, 1, "vstage_stage", p.nvstages, 0);
  p.vstage_rank = int_array(L, 1, "vstage_rank", p.nvstages, 0);
  p.routes = int_array(L, 1, "routes", p.nroutes * p.stages, 0);
  p.mb_route = int_array(L, 1, "mb_route", p.microbatches, 0);
  p.act = num_array(L, 1, "act", p.stages);
  p.memory = num_array(L, 1, "memory", p.ranks);
  lp_sim_cost cost;
  lp_sim_cost_init(&cost);
  lua_getfield(L, 1, "times");
  if (lua_istable(L, -1)) read_times(L, lua_gettop(L), &cost.t);
  lua_pop(L, 1);
  lp_sim_times *st = lua_newuserdatauv(L, (size_t)p.stages * sizeof *st, 0);
  for (int s = 0; s < p.stages; s++) lp_sim_times_init(&st[s]);
  lua_getfield(L, 1, "stage_times");
  if (lua_istable(L, -1)) {
    for (int s = 0; s < p.stages; s++) {
      lua_rawgeti(L, -1, s + 1);
      if (lua_istable(L, -1)) read_times(L, lua_gettop(L), &st[s]);
      lua_pop(L, 1);
    }
    cost.stages = st;
    cost.nstages = p.stages;
  }
  lua_pop(L, 1);
  cost.latency = opt_num(L, 1, "latency", 0);
  p.cost = &cost;
  p.w_share = opt_num(L, 1, "w_share", 0);
  p.split = (int)opt_num(L, 1, "split", 0);
  p.pairs = (int)opt_num(L, 1, "pairs", 1);
  p.seed = (uint64_t)opt_num(L, 1, "seed", 1);
  search_box *b = lb_box_new(L, sizeof *b, LB_SEARCH);
  int box = lua_gettop(L);
  b->fn_ref = LUA_NOREF;
  lua_getfield(L, 1, "objective");
  if (lua_isfunction(L, -1)) {
    p.objective = LP_SEARCH_CUSTOM;
    p.fn = call_objective;
    p.ud = b;
    b->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  } else {
    const char *o = luaL_optstring(L, -1, "makespan");
    p.objective = strcmp(o, "span") == 0 ? LP_SEARCH_SPAN : LP_SEARCH_MAKESPAN;
    lua_pop(L, 1);
  }
  char err[LP_ERRLEN];
  lp_search *S = NULL;
  if (lp_search_new(&p, &S, err) != LP_OK) return lb_fail(L, err);
  b->S = S;
  lua_pushvalue(L, box);
  (void)base;
  return 1;
}

static lp_search *check_search(lua_State *L) { return check_box(L)->S; }

static int fail_run(lua_State *L, search_box *b) {
  if (b->fn_err[0]) {
    lua_pushnil(L);
    lua_pushstring(L, b->fn_err);
    b->fn_err[0] = '\0';
    return 2;
  }
  return lb_fail(L, lp_search_last_error(b->S));
}

/* s:seed_rules() -> true, or nil, message */
static int lb_search_seed_rules(lua_State *L) {
  search_box *b = check_box(L);
  b->L = L;
  lp_status st = lp_search_seed_rules(b->S);
  b->L = NULL;
  if (st != LP_OK) return fail_run(L, b);
  lua_pushboolean(L, 1);
  return 1;
}

/* s:add_schedule(schedule, label) -> fits, objective, {peak per rank} */
static int lb_search_add_schedule(lua_State *L) {
  search_box *b = check_box(L);
  lp_schedule *s = lb_check_schedule(L, 2);
  const char *label = luaL_checkstring(L, 3);
  int P = lp_schedule_ranks(s);
  double *peak = lua_newuserdatauv(L, (size_t)P * sizeof *peak, 0);
  int fits;
  double obj;
  b->L = L;
  lp_status st = lp_search_add_schedule(b->S, s, label, &fits, &obj, peak);
  b->L = NULL;
  if (st != LP_OK) return fail_run(L, b);
  lua_pushboolean(L, fits);
  lua_pushnumber(L, obj);
  lua_createtable(L, P, 0);
  for (int r = 0; r < P; r++) {
    lua_pushnumber(L, peak[r]);
    lua_rawseti(L, -2, r + 1);
  }
  return 3;
}

/* s:seed_keys({key per slot}, label) -> true, or nil, message */
static int lb_search_seed_keys(lua_State *L) {
  search_box *b = check_box(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  const char *label = luaL_checkstring(L, 3);
  lua_Integer n = luaL_checkinteger(L, 4);
  if (n < 1 || n > (1 << 26)) return luaL_error(L, "seed_keys: bad slot count");
  double *keys = lua_newuserdatauv(L, (size_t)n * sizeof *keys, 0);
  for (lua_Integer k = 0; k < n; k++) {
    lua_rawgeti(L, 2, k + 1);
    keys[k] = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : 1e15;
    lua_pop(L, 1);
  }
  b->L = L;
  lp_status st = lp_search_seed_keys(b->S, keys, NULL, label);
  b->L = NULL;
  if (st != LP_OK) return fail_run(L, b);
  lua_pushboolean(L, 1);
  return 1;
}

/* s:run(seconds[, max_evals]) -> true, or nil, message */
static int lb_search_run(lua_State *L) {
  search_box *b = check_box(L);
  double secs = luaL_checknumber(L, 2);
  lua_Integer n = luaL_optinteger(L, 3, 0);
  b->L = L;
  lp_status st = lp_search_run(b->S, secs, (long long)n);
  b->L = NULL;
  if (st != LP_OK) return fail_run(L, b);
  lua_pushboolean(L, 1);
  return 1;
}

static int lb_search_stats(lua_State *L) {
  lp_search *S = check_search(L);
  lp_search_stats s;
  lp_search_stats_of(S, &s);
  lua_createtable(L, 0, 10);
  lb_set_integer(L, "evaluations", s.evaluations);
  lb_set_number(L, "seconds", s.seconds);
  lb_set_number(L, "best", s.best);
  lb_set_number(L, "makespan", s.makespan);
  lb_set_number(L, "span", s.span);
  lb_set_number(L, "lower_bound", s.lower_bound);
  lb_set_number(L, "gap", s.gap);
  lb_set_number(L, "zb_greedy", s.zb_greedy);
  lb_set_number(L, "best_at", s.best_at);
  lua_pushboolean(L, s.from_schedule);
  lua_setfield(L, -2, "from_schedule");
  lua_pushstring(L, s.best_label);
  lua_setfield(L, -2, "label");
  return 1;
}

static int lb_search_bounds(lua_State *L) {
  lp_search *S = check_search(L);
  lp_search_bounds x;
  lp_search_bounds_of(S, &x);
  lua_createtable(L, 0, 6);
  lb_set_number(L, "work", x.work);
  lb_set_number(L, "skew", x.skew);
  lb_set_number(L, "path", x.path);
  lb_set_number(L, "memory_time", x.memory_time);
  lb_set_number(L, "warmup", x.warmup);
  lb_set_number(L, "makespan", x.makespan);
  lb_set_number(L, "span", x.span);
  return 1;
}

static int lb_search_peak(lua_State *L) {
  search_box *b = check_box(L);
  int P = (int)luaL_checkinteger(L, 2);
  double *peak = lua_newuserdatauv(L, (size_t)(P > 0 ? P : 1) * sizeof *peak, 0);
  if (lp_search_best_peak(b->S, peak) != LP_OK) return lb_fail(L, "search: no schedule found yet");
  lua_createtable(L, P, 0);
  for (int r = 0; r < P; r++) {
    lua_pushnumber(L, peak[r]);
    lua_rawseti(L, -2, r + 1);
  }
  return 1;
}

static int lb_search_schedule(lua_State *L) {
  search_box *b = check_box(L);
  lp_schedule *s = NULL;
  if (lp_search_best_schedule(b->S, &s) != LP_OK) return lb_fail(L, lp_search_last_error(b->S));
  lb_push_schedule(L, s);
  return 1;
}

/* core.schedule_peak(schedule, act|nil, w_share) -> {peak per rank} */
static int lb_schedule_peak(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int S = lp_schedule_stages(s), P = lp_schedule_ranks(s);
  double *act = NULL;
  if (lua_istable(L, 2)) {
    act = lua_newuserdatauv(L, (size_t)S * sizeof *act, 0);
    for (int k = 0; k < S; k++) {
      lua_rawgeti(L, 2, k + 1);
      act[k] = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : 1;
      lua_pop(L, 1);
    }
  }
  double w = luaL_optnumber(L, 3, 0);
  double *peak = lua_newuserdatauv(L, (size_t)P * sizeof *peak, 0);
  lp_search_schedule_peak(s, act, w, peak);
  lua_createtable(L, P, 0);
  for (int r = 0; r < P; r++) {
    lua_pushnumber(L, peak[r]);
    lua_rawseti(L, -2, r + 1);
  }
  return 1;
}

void lb_open_search(lua_State *L) {
  static const luaL_Reg methods[] = {{"seed_rules", lb_search_seed_rules},
                                     {"add_schedule", lb_search_add_schedule},
                                     {"run", lb_search_run},
                                     {"seed_keys", lb_search_seed_keys},
                                     {"stats", lb_search_stats},
                                     {"bounds", lb_search_bounds},
                                     {"peak", lb_search_peak},
                                     {"schedule", lb_search_schedule},
                                     {"close", lb_search_close},
                                     {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", lb_search_close}, {"__close", lb_search_close},
                                  {NULL, NULL}};
  static const luaL_Reg funcs[] = {
      {"search_new", lb_search_new}, {"schedule_peak", lb_schedule_peak}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  lb_new_class(L, LB_SEARCH, "Search", methods, meta);
}
