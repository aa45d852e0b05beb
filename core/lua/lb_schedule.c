/* lb_schedule.c — luapipe.Schedule: the schedule IR seen from Lua.
 * Misuse (bad ids, unparsable actions) raises; validation and lowering
 * failures return nil, message. */
#include <limits.h>
#include <string.h>

#include "lb_internal.h"

typedef struct sched_box {
  lp_schedule *s; /* NULL once closed */
} sched_box;

lp_schedule *lb_check_schedule(lua_State *L, int idx) {
  return ((sched_box *)lb_box_check(L, idx, LB_SCHEDULE))->s;
}

/* Closed-first: the box exists (and is safe to collect) before it owns s. */
static sched_box *new_box(lua_State *L) {
  return lb_box_new(L, sizeof(sched_box), LB_SCHEDULE);
}

void lb_push_schedule(lua_State *L, lp_schedule *s) { new_box(L)->s = s; }

static int lb_schedule_close(lua_State *L) {
  sched_box *b = luaL_checkudata(L, 1, LB_SCHEDULE);
  lp_schedule_free(b->s);
  b->s = NULL;
  return 0;
}

/* core.schedule_new(ranks, stages, microbatches) -> Schedule; counts out
 * of range raise "ranks must be 1..4096, got 4294967298". */
static int lb_schedule_new(lua_State *L) {
  lua_Integer ranks = luaL_checkinteger(L, 1);
  lua_Integer stages = luaL_checkinteger(L, 2);
  lua_Integer mbs = luaL_checkinteger(L, 3);
  char err[LP_ERRLEN];
  if (lp_schedule_check_counts(ranks, stages, mbs, err) != LP_OK)
    return luaL_error(L, "%s", err);
  sched_box *b = new_box(L);
  if (lp_schedule_new(ranks, stages, mbs, &b->s) != LP_OK)
    return luaL_error(L, "out of memory");
  return 1;
}

/* Raises the schedule's last error unless st is LP_OK. */
static void check(lua_State *L, lp_schedule *s, lp_status st) {
  if (st == LP_ERR_NOMEM) luaL_error(L, "out of memory");
  if (st != LP_OK) luaL_error(L, "%s", lp_schedule_last_error(s));
}

static int lb_schedule_set_name(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  check(L, s, lp_schedule_set_name(s, luaL_checkstring(L, 2)));
  lua_settop(L, 1);
  return 1;
}

static int lb_schedule_info(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  lua_createtable(L, 0, 6);
  lua_pushstring(L, lp_schedule_name(s));
  lua_setfield(L, -2, "name");
  lb_set_integer(L, "ranks", lp_schedule_ranks(s));
  lb_set_integer(L, "stages", lp_schedule_stages(s));
  lb_set_integer(L, "microbatches", lp_schedule_microbatches(s));
  lb_set_integer(L, "vstages", lp_schedule_vstages(s));
  lua_pushboolean(L, lp_schedule_has_comm(s));
  lua_setfield(L, -2, "lowered");
  return 1;
}

static int lb_schedule_add_vstage(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int id;
  check(L, s, lp_schedule_add_vstage(s, lb_check_int(L, 2),
                                     lb_check_int(L, 3), &id));
  lua_pushinteger(L, id);
  return 1;
}

static int lb_schedule_vstage(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int v = lb_check_int(L, 2);
  luaL_argcheck(L, v >= 0 && v < lp_schedule_vstages(s), 2, "no such virtual stage");
  lua_pushinteger(L, lp_schedule_vstage_stage(s, v));
  lua_pushinteger(L, lp_schedule_vstage_rank(s, v));
  return 2;
}

static int lb_schedule_set_route(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int mb = lb_check_int(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_Integer len = luaL_len(L, 3);
  int stages = lp_schedule_stages(s);
  if (len != stages) /* the core reports it without reading an entry */
    check(L, s, lp_schedule_set_route(s, mb, NULL, len > INT_MAX ? INT_MAX : (int)len));
  int n = stages, small[64];
  int *buf = n <= 64 ? small : lua_newuserdatauv(L, (size_t)n * sizeof(int), 0);
  for (int i = 0; i < n; i++) {
    lua_geti(L, 3, i + 1);
    int ok;
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok || v < 0 || v > INT_MAX)
      return luaL_error(L, "route of micro-batch %d: entry %d is not a virtual stage id", mb,
                        i + 1);
    buf[i] = (int)v;
    lua_pop(L, 1);
  }
  check(L, s, lp_schedule_set_route(s, mb, buf, n));
  lua_settop(L, 1);
  return 1;
}

static int lb_schedule_route(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int n;
  const int *r = lp_schedule_route(s, lb_check_int(L, 2), &n);
  if (!r) return 0;
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushinteger(L, r[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* s:microbatches_of(v) -> the micro-batches whose route passes virtual
 * stage v, in increasing order (O(microbatches)). */
static int lb_schedule_microbatches_of(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int v = lb_check_int(L, 2);
  luaL_argcheck(L, v >= 0 && v < lp_schedule_vstages(s), 2, "no such virtual stage");
  int k = lp_schedule_vstage_stage(s, v), M = lp_schedule_microbatches(s), n = 0;
  lua_createtable(L, 0, 0);
  for (int mb = 0; mb < M; mb++) {
    int len;
    const int *r = lp_schedule_route(s, mb, &len);
    if (r && k < len && r[k] == v) {
      lua_pushinteger(L, mb);
      lua_rawseti(L, -2, ++n);
    }
  }
  return 1;
}

static void check_rank(lua_State *L, lp_schedule *s, int arg, int rank) {
  if (rank < 0 || rank >= lp_schedule_ranks(s))
    luaL_argerror(L, arg, lua_pushfstring(L, "rank %d is out of range 0..%d", rank,
                                          lp_schedule_ranks(s) - 1));
}

/* s:push(rank, "0F3" | {"0F3", "0I3", ...}): appends to rank's list; returns
 * nothing (so the REPL echoes nothing after each push). All or nothing: a
 * list with a bad entry raises and leaves the rank's list as it was. */
static int lb_schedule_push(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int rank = lb_check_int(L, 2);
  check_rank(L, s, 2, rank);
  if (lua_type(L, 3) != LUA_TTABLE) {
    check(L, s, lp_schedule_push_text(s, rank, luaL_checkstring(L, 3)));
    return 0;
  }
  lua_Integer n = luaL_len(L, 3);
  for (lua_Integer i = 1; i <= n; i++) { /* every entry a string before any is pushed */
    lua_geti(L, 3, i);
    if (!lua_isstring(L, -1))
      return luaL_error(L, "rank %d: entry %d of the list is a %s, not an action string "
                        "such as \"0F3\"", rank, (int)i, luaL_typename(L, -1));
    lua_pop(L, 1);
  }
  int before;
  lp_schedule_actions(s, rank, &before);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, 3, i);
    lp_status st = lp_schedule_push_text(s, rank, lua_tostring(L, -1));
    lua_pop(L, 1);
    if (st != LP_OK) { /* undo this call's pushes first, then raise */
      lp_schedule_truncate_rank(s, rank, before);
      check(L, s, st);
    }
  }
  return 0;
}

/* s:pop(rank[, n]) -> {"0B1", ...}: removes the last n actions (default 1)
 * of rank's list and returns them in list order; n more than the list
 * holds raises and removes nothing. */
static int lb_schedule_pop(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int rank = lb_check_int(L, 2);
  check_rank(L, s, 2, rank);
  lua_Integer k = luaL_optinteger(L, 3, 1);
  int n;
  const lp_action *a = lp_schedule_actions(s, rank, &n);
  if (k < 0 || k > n)
    return luaL_error(L, "rank %d has %d action%s: cannot pop %I", rank, n, n == 1 ? "" : "s", k);
  lua_createtable(L, (int)k, 0);
  for (int i = n - (int)k; i < n; i++) {
    char t[LP_ACTION_TEXT_MAX];
    lp_action_format(&a[i], t, sizeof t);
    lua_pushstring(L, t);
    lua_rawseti(L, -2, i - (n - (int)k) + 1);
  }
  lp_schedule_truncate_rank(s, rank, n - (int)k);
  return 1;
}

/* Action type named `name` ("F", ..., "FB" or "OVERLAP_F_B"); -1 if none. */
static int type_of(const char *name) {
  if (strcmp(name, "FB") == 0) return LP_ACT_FB;
  for (int t = 0; t < LP_ACT__COUNT; t++)
    if (strcmp(name, lp_action_type_name(t)) == 0) return t;
  return -1;
}

/* s:push_op(rank, type, v[, mb[, btype, bv, bmb]]) -> s: one action from
 * its fields, without text (what the builders use: no format, no parse).
 * type "F", "B", ..., "REDUCE_GRAD"; "FB" takes the backward half too. */
static int lb_schedule_push_op(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int rank = lb_check_int(L, 2);
  check_rank(L, s, 2, rank);
  lp_action a = {type_of(luaL_checkstring(L, 3)), 0, -1, -1, -1, -1};
  luaL_argcheck(L, a.type >= 0, 3, "unknown action type");
  a.stage = lb_check_int(L, 4);
  if (lp_action_has_mb(a.type)) a.mb = lb_check_int(L, 5);
  if (a.type == LP_ACT_FB) {
    a.btype = type_of(luaL_checkstring(L, 6));
    luaL_argcheck(L, a.btype == LP_ACT_B || a.btype == LP_ACT_I, 6, "expected \"B\" or \"I\"");
    a.bstage = lb_check_int(L, 7);
    a.bmb = lb_check_int(L, 8);
  }
  check(L, s, lp_schedule_push(s, rank, &a));
  lua_settop(L, 1);
  return 1;
}

/* s:push_ops(rank, ops[, n]) -> s: appends the actions of the flat integer
 * list ops[1..n] (default #ops): (type, v, mb) triples, six entries
 * (FB, v, mb, btype, bv, bmb) for a pair; types are core.action_codes.
 * One call per rank's list: what luapipe.schedules.program flushes. */
static int lb_schedule_push_ops(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int rank = lb_check_int(L, 2);
  check_rank(L, s, 2, rank);
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_Integer n = luaL_opt(L, luaL_checkinteger, 4, luaL_len(L, 3));
  lua_Integer i = 1;
  while (i <= n) {
    int f[6] = {-1, -1, -1, -1, -1, -1};
    int need = 3;
    for (int k = 0; k < need; k++) {
      if (i + k > n) return luaL_error(L, "push_ops: entry %I: the list ends inside an action", i);
      lua_rawgeti(L, 3, i + k);
      int ok;
      lua_Integer x = lua_tointegerx(L, -1, &ok);
      lua_pop(L, 1);
      if (!ok || x < INT_MIN || x > INT_MAX)
        return luaL_error(L, "push_ops: entry %I is not an integer", i + k);
      f[k] = (int)x;
      if (k == 0 && f[0] == LP_ACT_FB) need = 6;
    }
    lp_action a = {f[0], f[1], f[2], f[3], f[4], f[5]};
    check(L, s, lp_schedule_push(s, rank, &a));
    i += need;
  }
  lua_settop(L, 1);
  return 1;
}

static int lb_schedule_clear_rank(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int rank = lb_check_int(L, 2);
  check_rank(L, s, 2, rank);
  lp_schedule_clear_rank(s, rank);
  lua_settop(L, 1);
  return 1;
}

/* s:actions(rank) -> {"0F0", "0F1", ...} */
static int lb_schedule_actions(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int rank = lb_check_int(L, 2);
  check_rank(L, s, 2, rank);
  int n;
  const lp_action *a = lp_schedule_actions(s, rank, &n);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    char t[LP_ACTION_TEXT_MAX];
    lp_action_format(&a[i], t, sizeof t);
    lua_pushstring(L, t);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

void lb_push_action(lua_State *L, const lp_action *a) {
  char t[LP_ACTION_TEXT_MAX];
  lua_createtable(L, 0, 7);
  lua_pushstring(L, a->type == LP_ACT_FB ? "FB" : lp_action_type_name(a->type));
  lua_setfield(L, -2, "type");
  lb_set_integer(L, "stage", a->stage);
  if (a->mb >= 0) {
    lb_set_integer(L, "mb", a->mb);
  }
  if (a->type == LP_ACT_FB) {
    lua_pushstring(L, lp_action_type_name(a->btype));
    lua_setfield(L, -2, "btype");
    lb_set_integer(L, "bstage", a->bstage);
    lb_set_integer(L, "bmb", a->bmb);
  }
  lp_action_format(a, t, sizeof t);
  lua_pushstring(L, t);
  lua_setfield(L, -2, "text");
}

/* s:action(rank, i) -> decoded table of action i, or nil outside 0..count-1.
 * i is 0-based, as ranks, stages and micro-batches are and as every message
 * numbers actions ("rank 2, action 14 (5B3)"); s:actions(rank) is a Lua
 * list, so action i is its entry i + 1. */
static int lb_schedule_action(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int rank = lb_check_int(L, 2);
  check_rank(L, s, 2, rank);
  int n, i = lb_check_int(L, 3);
  const lp_action *a = lp_schedule_actions(s, rank, &n);
  if (i < 0 || i >= n) return 0;
  lb_push_action(L, &a[i]);
  return 1;
}

static int lb_schedule_count(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int rank = lb_check_int(L, 2);
  check_rank(L, s, 2, rank);
  int n;
  lp_schedule_actions(s, rank, &n);
  lua_pushinteger(L, n);
  return 1;
}

/* s:validate([{sends = "nonblocking" | "buffered" | "rendezvous"}]) -> true | nil, err */
static int lb_schedule_validate(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  /* in lp_send_model order */
  static const char *const models[] = {"buffered", "rendezvous", "nonblocking", NULL};
  lp_send_model sends = LP_SENDS_NONBLOCKING;
  if (!lua_isnoneornil(L, 2)) {
    luaL_argexpected(L, lua_istable(L, 2), 2, "table of options {sends = ...}");
    if (lua_getfield(L, 2, "sends") != LUA_TNIL) {
      const char *m = lua_tostring(L, -1);
      int i = 0;
      while (m && models[i] && strcmp(models[i], m) != 0) i++;
      if (!m || !models[i])
        return luaL_error(L, "validate: option 'sends' must be \"nonblocking\", "
                             "\"buffered\" or \"rendezvous\", got %s",
                          m ? m : luaL_typename(L, -1));
      sends = (lp_send_model)i;
    }
    lua_pop(L, 1);
  }
  lp_status st = lp_schedule_validate_sends(s, sends);
  if (st == LP_ERR_NOMEM) return luaL_error(L, "out of memory");
  if (st != LP_OK) return lb_fail(L, lp_schedule_last_error(s));
  lua_pushboolean(L, 1);
  return 1;
}

static int lb_schedule_lower(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  sched_box *b = new_box(L);
  lp_status st = lp_schedule_lower(s, &b->s);
  if (st == LP_ERR_NOMEM) return luaL_error(L, "out of memory");
  if (st != LP_OK) return lb_fail(L, lp_schedule_last_error(s));
  return 1;
}

static int lb_schedule_clone(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  sched_box *b = new_box(L);
  b->s = lp_schedule_clone(s);
  if (!b->s) return luaL_error(L, "out of memory");
  return 1;
}

static int push_owned_string(lua_State *L, char *text) {
  if (!text) return luaL_error(L, "out of memory");
  lua_pushstring(L, text);
  lp_free(text);
  return 1;
}

static int lb_schedule_to_csv(lua_State *L) {
  return push_owned_string(L, lp_schedule_to_csv(lb_check_schedule(L, 1)));
}

static int lb_schedule_to_json(lua_State *L) {
  return push_owned_string(L, lp_schedule_to_json(lb_check_schedule(L, 1)));
}

/* core.schedule_from_csv(text, origin) -> Schedule | nil, err */
static int lb_schedule_from_csv(lua_State *L) {
  const char *text = luaL_checkstring(L, 1);
  const char *origin = luaL_optstring(L, 2, "csv");
  char err[LP_ERRLEN];
  sched_box *b = new_box(L);
  lp_status st = lp_schedule_from_csv(text, origin, &b->s, err);
  if (st == LP_ERR_NOMEM) return luaL_error(L, "out of memory");
  if (st != LP_OK) return lb_fail(L, err);
  return 1;
}

/* core.schedule_limits() -> {ranks=, stages=, microbatches=, cells=,
 * vstages=, actions=}: the limits of lp_schedule.h (the one home). */
static int lb_schedule_limits(lua_State *L) {
  lua_createtable(L, 0, 6);
  lb_set_integer(L, "ranks", LP_SCHEDULE_MAX_RANKS);
  lb_set_integer(L, "stages", LP_SCHEDULE_MAX_STAGES);
  lb_set_integer(L, "microbatches", LP_SCHEDULE_MAX_MICROBATCHES);
  lb_set_integer(L, "cells", LP_SCHEDULE_MAX_CELLS);
  lb_set_integer(L, "vstages", LP_SCHEDULE_MAX_VSTAGES);
  lb_set_integer(L, "actions", LP_SCHEDULE_MAX_ACTIONS);
  return 1;
}

/* core.parse_action(text) -> decoded table | nil, err */
static int lb_parse_action(lua_State *L) {
  lp_action a;
  char err[LP_ERRLEN];
  if (lp_action_parse(luaL_checkstring(L, 1), &a, err) != LP_OK) return lb_fail(L, err);
  lb_push_action(L, &a);
  return 1;
}

static int lb_schedule_memory(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  int rank = lb_check_int(L, 2);
  check_rank(L, s, 2, rank);
  lp_schedule_memory m;
  check(L, s, lp_schedule_memory_of(s, rank, &m));
  lua_createtable(L, 0, 4);
  lb_set_integer(L, "peak_live", m.peak_live);
  lb_set_integer(L, "peak_pending_w", m.peak_pending_w);
  lb_set_integer(L, "peak_total", m.peak_total);
  lb_set_integer(L, "param_stages", m.param_stages);
  return 1;
}

void lb_open_schedule(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"set_name", lb_schedule_set_name}, {"info", lb_schedule_info},
      {"add_vstage", lb_schedule_add_vstage}, {"vstage", lb_schedule_vstage},
      {"set_route", lb_schedule_set_route}, {"route", lb_schedule_route},
      {"microbatches_of", lb_schedule_microbatches_of},
      {"push", lb_schedule_push}, {"push_op", lb_schedule_push_op},
      {"push_ops", lb_schedule_push_ops},
      {"clear_rank", lb_schedule_clear_rank}, {"pop", lb_schedule_pop},
      {"actions", lb_schedule_actions}, {"action", lb_schedule_action},
      {"count", lb_schedule_count}, {"validate", lb_schedule_validate},
      {"lower", lb_schedule_lower}, {"clone", lb_schedule_clone},
      {"to_csv", lb_schedule_to_csv}, {"to_json", lb_schedule_to_json},
      {"memory", lb_schedule_memory}, {"close", lb_schedule_close},
      {NULL, NULL}};
  static const luaL_Reg meta[] = {
      {"__gc", lb_schedule_close}, {"__close", lb_schedule_close}, {NULL, NULL}};
  static const luaL_Reg funcs[] = {
      {"schedule_new", lb_schedule_new},
      {"schedule_from_csv", lb_schedule_from_csv},
      {"parse_action", lb_parse_action},
      {"schedule_limits", lb_schedule_limits},
      {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  lua_createtable(L, 0, LP_ACT__COUNT); /* core.action_codes = {F = 0, ...} */
  for (int t = 0; t < LP_ACT__COUNT; t++) {
    lua_pushinteger(L, t);
    lua_setfield(L, -2, t == LP_ACT_FB ? "FB" : lp_action_type_name(t));
  }
  lua_setfield(L, -2, "action_codes");
  lb_new_class(L, LB_SCHEDULE, "Schedule", methods, meta);
}
