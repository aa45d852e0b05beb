/* lb_profile.c — luapipe.Profile: a profile trace reading seen from Lua.
 * core.profile_read{paths...} -> Profile | nil, message. A bad trace is a
 * runtime failure (nil, message naming the file); misuse raises. */
#include <string.h>

#include "lb_internal.h"
#include "lp_profile.h"

#define LB_PROFILE "luapipe.Profile"

typedef struct profile_box {
  lp_profile *p; /* NULL once closed */
} profile_box;

static const char *const class_names[] = {"compute", "communication", "memory", "wait",
                                          "ignore", NULL};

static lp_profile *check_profile(lua_State *L, int idx) {
  return ((profile_box *)lb_box_check(L, idx, LB_PROFILE))->p;
}

static int lb_profile_close(lua_State *L) {
  profile_box *b = luaL_checkudata(L, 1, LB_PROFILE);
  lp_profile_free(b->p);
  b->p = NULL;
  return 0;
}

static double us(int64_t ns) { return (double)ns / 1000.0; }

/* core.profile_read(paths) -> Profile | nil, message */
static int lb_profile_read(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer n = luaL_len(L, 1);
  if (n < 1) luaL_argerror(L, 1, "no paths");
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, 1, i);
    if (lua_type(L, -1) != LUA_TSTRING) luaL_argerror(L, 1, "paths must be strings");
    lua_pop(L, 1);
  }
  profile_box *b = lb_box_new(L, sizeof *b, LB_PROFILE);
  b->p = lp_profile_new();
  if (!b->p) return luaL_error(L, "out of memory");
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, 1, i);
    const char *path = lua_tostring(L, -1);
    lp_status st = lp_profile_read(b->p, path);
    lua_pop(L, 1);
    if (st != LP_OK) {
      lua_pushnil(L);
      lua_pushstring(L, lp_profile_last_error(b->p));
      lp_profile_free(b->p);
      b->p = NULL;
      return 2;
    }
  }
  return 1;
}

/* p:names() -> {{name=, cat=, ops=, us=}, ...} (index i is name i-1) */
static int lb_profile_names(lua_State *L) {
  lp_profile *p = check_profile(L, 1);
  int n = lp_profile_name_count(p);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    const char *cat;
    int64_t ops, total;
    const char *name = lp_profile_name(p, i, &cat, &ops, &total);
    lua_createtable(L, 0, 4);
    lua_pushstring(L, name);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, cat);
    lua_setfield(L, -2, "cat");
    lb_set_integer(L, "ops", ops);
    lb_set_number(L, "us", us(total));
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* p:set_classes{class of name 1, ...}: "compute", "communication",
 * "memory", "wait" or "ignore" */
static int lb_profile_set_classes(lua_State *L) {
  lp_profile *p = check_profile(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  int n = lp_profile_name_count(p);
  for (int i = 0; i < n; i++) {
    lua_geti(L, 2, i + 1);
    if (!lua_isnil(L, -1)) {
      int c = luaL_checkoption(L, -1, NULL, class_names);
      lp_profile_set_class(p, i, (lp_profile_class)c);
    }
    lua_pop(L, 1);
  }
  return 0;
}

static void push_busy(lua_State *L, const int64_t *b) {
  lua_createtable(L, 0, 3);
  lb_set_number(L, "compute", us(b[LP_PROFILE_COMPUTE]));
  lb_set_number(L, "communication", us(b[LP_PROFILE_COMM]));
  lb_set_number(L, "memory", us(b[LP_PROFILE_MEMORY]));
}

/* p:analyze() -> {rank tables} | nil, message. Times in microseconds. */
static int lb_profile_analyze(lua_State *L) {
  lp_profile *p = check_profile(L, 1);
  if (lp_profile_analyze(p) != LP_OK) return lb_fail(L, lp_profile_last_error(p));
  int nr = lp_profile_rank_count(p);
  lua_createtable(L, nr, 0);
  for (int i = 0; i < nr; i++) {
    const lp_profile_rank *r = lp_profile_rank_at(p, i);
    lua_createtable(L, 0, 16);
    lb_set_integer(L, "rank", r->rank);
    lua_pushstring(L, r->file);
    lua_setfield(L, -2, "file");
    lb_set_number(L, "t0_us", us(r->t0_ns));
    lb_set_number(L, "span_us", us(r->span_ns));
    lb_set_number(L, "idle_us", us(r->idle_ns));
    push_busy(L, r->busy_ns);
    lua_setfield(L, -2, "busy_us");
    lb_set_number(L, "comm_overlap_us", us(r->overlap_ns));
    lb_set_number(L, "comm_exposed_us", us(r->exposed_ns));
    lb_set_number(L, "comm_ops_us", us(r->comm_ops_ns));
    lb_set_number(L, "comm_ops_overlap_us", us(r->comm_ops_overlap_ns));
    lb_set_integer(L, "ops", r->ops);
    lb_set_integer(L, "unattributed_ops", r->unattributed_ops);
    lua_createtable(L, r->nstreams, 0);
    for (int s = 0; s < r->nstreams; s++) {
      const lp_profile_stream *st = &r->streams[s];
      lua_createtable(L, 0, 4);
      lb_set_integer(L, "stream", st->stream);
      lb_set_integer(L, "device", st->device);
      lb_set_integer(L, "ops", st->ops);
      push_busy(L, st->busy_ns);
      lua_setfield(L, -2, "busy_us");
      lua_rawseti(L, -2, s + 1);
    }
    lua_setfield(L, -2, "streams");
    lua_createtable(L, r->nphases, 0);
    for (int k = 0; k < r->nphases; k++) {
      const lp_profile_phase *ph = &r->phases[k];
      lua_createtable(L, 0, 9);
      lua_pushstring(L, lp_profile_annotation_name(p, ph->name));
      lua_setfield(L, -2, "name");
      lb_set_number(L, "cpu_us", us(ph->cpu_dur_ns));
      lb_set_number(L, "cpu_start_us", us(ph->cpu_start_ns));
      lb_set_number(L, "gpu_us", us(ph->gpu_ns));
      lb_set_integer(L, "ops", ph->ops);
      if (ph->ops) {
        lb_set_number(L, "gpu_first_us", us(ph->gpu_first_ns));
        lb_set_number(L, "gpu_last_us", us(ph->gpu_last_ns));
      }
      push_busy(L, ph->class_ns);
      lua_setfield(L, -2, "class_us");
      lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, -2, "phases");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* p:ops(i) -> {start=, finish=, stream= (1-based), class=, phase= (1-based
 * or nil), name= (1-based)} for rank table i (1-based), in start order;
 * after analyze. */
static int lb_profile_ops(lua_State *L) {
  lp_profile *p = check_profile(L, 1);
  int i = lb_check_int(L, 2) - 1;
  if (i < 0 || i >= lp_profile_rank_count(p)) luaL_argerror(L, 2, "no such rank (analyze first)");
  int64_t n = lp_profile_rank_ops(p, i, 0, NULL);
  lua_createtable(L, (int)(n < 1 << 30 ? n : 0), 0);
  for (int64_t j = 0; j < n; j++) {
    lp_profile_op_view v;
    lp_profile_rank_ops(p, i, j, &v);
    lua_createtable(L, 0, 6);
    lb_set_number(L, "start", us(v.start_ns));
    lb_set_number(L, "finish", us(v.end_ns));
    lb_set_integer(L, "stream", v.stream + 1);
    lua_pushstring(L, class_names[v.cls]);
    lua_setfield(L, -2, "class");
    if (v.phase >= 0) lb_set_integer(L, "phase", v.phase + 1);
    lb_set_integer(L, "name", v.name + 1);
    lua_rawseti(L, -2, j + 1);
  }
  return 1;
}

/* p:name_stats(i) -> {[name index (1-based)] = {ops=, us=}} for the names
 * of rank table i's operations (one C pass; no table per operation). */
static int lb_profile_name_stats(lua_State *L) {
  lp_profile *p = check_profile(L, 1);
  int i = lb_check_int(L, 2) - 1;
  if (i < 0 || i >= lp_profile_rank_count(p)) luaL_argerror(L, 2, "no such rank (analyze first)");
  int nn = lp_profile_name_count(p);
  int64_t *cnt = lua_newuserdatauv(L, (size_t)(nn ? nn : 1) * 2 * sizeof(int64_t), 0);
  memset(cnt, 0, (size_t)(nn ? nn : 1) * 2 * sizeof(int64_t));
  int64_t n = lp_profile_rank_ops(p, i, 0, NULL);
  for (int64_t j = 0; j < n; j++) {
    lp_profile_op_view v;
    lp_profile_rank_ops(p, i, j, &v);
    cnt[2 * v.name]++;
    cnt[2 * v.name + 1] += v.end_ns - v.start_ns;
  }
  lua_newtable(L);
  for (int k = 0; k < nn; k++) {
    if (!cnt[2 * k]) continue;
    lua_createtable(L, 0, 2);
    lb_set_integer(L, "ops", cnt[2 * k]);
    lb_set_number(L, "us", us(cnt[2 * k + 1]));
    lua_rawseti(L, -2, k + 1);
  }
  return 1;
}

/* p:runs(i, gap_us) -> {{start=, finish=, stream=, class=, phase=, ops=}}:
 * rank table i's operations merged per stream into runs of the same class
 * and phase whose gaps are under gap_us (a drawing's pixel), in order of
 * their first operation. */
static int lb_profile_runs(lua_State *L) {
  lp_profile *p = check_profile(L, 1);
  int i = lb_check_int(L, 2) - 1;
  double gap = luaL_checknumber(L, 3);
  if (i < 0 || i >= lp_profile_rank_count(p)) luaL_argerror(L, 2, "no such rank (analyze first)");
  const lp_profile_rank *r = lp_profile_rank_at(p, i);
  int ns = r->nstreams;
  typedef struct run {
    int64_t s, e, n;
    int cls, phase, live;
  } run;
  run *cur = lua_newuserdatauv(L, (size_t)(ns ? ns : 1) * sizeof *cur, 0); /* [.., cur] */
  memset(cur, 0, (size_t)(ns ? ns : 1) * sizeof *cur);
  lua_newtable(L); /* [.., cur, out] */
  lua_Integer k = 0;
  int64_t gap_ns = (int64_t)(gap * 1000.0);
  int64_t n = lp_profile_rank_ops(p, i, 0, NULL);
  for (int64_t j = 0; j <= n; j++) {
    lp_profile_op_view v;
    if (j < n) {
      lp_profile_rank_ops(p, i, j, &v);
      if (v.cls == LP_PROFILE_IGNORE) continue;
      run *u = &cur[v.stream];
      if (u->live && u->cls == v.cls && u->phase == v.phase && v.start_ns - u->e < gap_ns) {
        if (v.end_ns > u->e) u->e = v.end_ns;
        u->n++;
        continue;
      }
    }
    for (int s = 0; s < ns; s++) { /* flush the stream's run (all of them at the end) */
      if (j < n && s != v.stream) continue;
      run *u = &cur[s];
      if (u->live) {
        lua_createtable(L, 0, 6);
        lb_set_number(L, "start", us(u->s));
        lb_set_number(L, "finish", us(u->e));
        lb_set_integer(L, "stream", s + 1);
        lua_pushstring(L, class_names[u->cls]);
        lua_setfield(L, -2, "class");
        if (u->phase >= 0) lb_set_integer(L, "phase", u->phase + 1);
        lb_set_integer(L, "ops", u->n);
        lua_rawseti(L, -2, ++k);
      }
      u->live = 0;
      if (j < n) {
        u->live = 1;
        u->s = v.start_ns;
        u->e = v.end_ns;
        u->n = 1;
        u->cls = v.cls;
        u->phase = v.phase;
      }
    }
  }
  return 1;
}

/* p:stats() -> bytes of JSON read, events seen */
static int lb_profile_stats(lua_State *L) {
  lp_profile *p = check_profile(L, 1);
  int64_t bytes, events;
  lp_profile_stats(p, &bytes, &events);
  lua_pushinteger(L, bytes);
  lua_pushinteger(L, events);
  return 2;
}

void lb_open_profile(lua_State *L) {
  static const luaL_Reg methods[] = {{"names", lb_profile_names},
                                     {"set_classes", lb_profile_set_classes},
                                     {"analyze", lb_profile_analyze},
                                     {"ops", lb_profile_ops},
                                     {"name_stats", lb_profile_name_stats},
                                     {"runs", lb_profile_runs},
                                     {"stats", lb_profile_stats},
                                     {"close", lb_profile_close},
                                     {NULL, NULL}};
  static const luaL_Reg meta[] = {
      {"__gc", lb_profile_close}, {"__close", lb_profile_close}, {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"profile_read", lb_profile_read}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  lb_new_class(L, LB_PROFILE, "Profile", methods, meta);
}
