/* lb_exec.c — luapipe.Exec: the per-rank executor seen from Lua, and the
 * trace writer for measured events. Misuse raises; runtime failures (a
 * step that fails, a file that cannot be written) return nil, message. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include <stdio.h>
#include <stdlib.h>

#include "lb_nn.h"
#include "lp_lua.h"

#define LB_EXEC "luapipe.Exec"

typedef struct exec_box {
  lp_exec *e; /* NULL once closed */
  lb_data data;
  int build_ref; /* registry ref of build(stage) during lp_exec_new */
  int fb_ref;    /* registry ref of overlapped_fb(exec, pair), or LUA_NOREF */
  int in_step;   /* 1 while exec:step runs (run_half is allowed) */
  int self_ref;  /* registry ref of this box while exec:step runs (the
                  * overlapped_fb hook's first argument), else LUA_NOREF */
  lua_State *L;
  int nstages;
  int (*ndim);
  int64_t (*shape)[LP_TENSOR_MAXDIM];
} exec_box;

static exec_box *check_exec(lua_State *L, int idx) {
  return lb_box_check(L, idx, LB_EXEC);
}

static void box_close(lua_State *L, exec_box *b) {
  lp_exec_free(b->e);
  b->e = NULL;
  if (b->data.ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, b->data.ref);
  b->data.ref = LUA_NOREF;
  if (b->fb_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, b->fb_ref);
  b->fb_ref = LUA_NOREF;
  if (b->build_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, b->build_ref);
  b->build_ref = LUA_NOREF;
  lp_free(b->ndim);
  lp_free(b->shape);
  b->ndim = NULL;
  b->shape = NULL;
}

static int lb_exec_close(lua_State *L) {
  box_close(L, luaL_checkudata(L, 1, LB_EXEC));
  return 0;
}

static lp_status exec_data(void *ud, int64_t step, int mb, lp_tensor **input,
                           lp_tensor **target, char *err) {
  return lb_data_call(&((exec_box *)ud)->data, step, mb, input, target, err);
}

/* The callbacks below run inside the core (lp_exec_new, lp_exec_step): no
 * Lua error may unwind through its C frames. Each one therefore does all
 * its Lua work in a C function called through the pcall choke point
 * (lp_lua_pcall_line: the error's own one line, no traceback, for the
 * core's message); pushing that function and a light userdata cannot
 * raise. */

typedef struct build_call {
  exec_box *b;
  int stage;
  lp_nn_layer *out;
  const char *got; /* what it returned instead of an open Layer */
} build_call;

/* protected: build(stage) -> a luapipe.Layer that is still open */
static int build_chunk_p(lua_State *L) {
  build_call *c = lua_touserdata(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->b->build_ref);
  lua_pushinteger(L, c->stage);
  lua_call(L, 1, 1);
  lp_nn_layer **p = luaL_testudata(L, -1, LB_LAYER);
  if (!p) c->got = luaL_typename(L, -1); /* a static name */
  else if (!*p) c->got = "a closed luapipe.Layer";
  else c->out = lp_nn_layer_retain(*p);
  return 0;
}

/* lp_exec_chunk_fn over build(stage) -> Layer: LP_ERR_ARG with "the build
 * function raised: <its error>" (one line) or "... must return a
 * luapipe.Layer, got <type>"; the core names the rank and stage. */
static lp_status build_chunk(void *ud, int stage, lp_nn_layer **out, char *err) {
  exec_box *b = ud;
  lua_State *L = b->L;
  build_call c = {b, stage, NULL, NULL};
  int top = lua_gettop(L);
  if (!lua_checkstack(L, 8)) {
    lp_errf(err, "the build function: Lua stack overflow");
    return LP_ERR_NOMEM;
  }
  lua_pushcfunction(L, build_chunk_p);
  lua_pushlightuserdata(L, &c);
  int rc = lp_lua_pcall_line(L, 1, 0);
  lp_status st = LP_OK;
  if (rc == LUA_ERRMEM) {
    lp_errf(err, "the build function ran out of memory");
    st = LP_ERR_NOMEM;
  } else if (rc != LUA_OK) {
    lp_errf(err, "the build function raised: %s", lua_tostring(L, -1));
    st = LP_ERR_ARG;
  } else if (c.got) {
    lp_errf(err, "the build function must return a luapipe.Layer, got %s", c.got);
    st = LP_ERR_ARG;
  } else {
    *out = c.out;
  }
  lua_settop(L, top);
  return st;
}

typedef struct fb_call {
  exec_box *b;
  const lp_action *a;
  const char *text;
} fb_call;

/* protected: overlapped_fb(exec, pair) */
static int lua_fb_p(lua_State *L) {
  fb_call *c = lua_touserdata(L, 1);
  const lp_action *a = c->a;
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->b->fb_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->b->self_ref); /* the exec box (exec:step's self) */
  lua_createtable(L, 0, 6);
  lb_set_integer(L, "f_stage", a->stage);
  lb_set_integer(L, "f_mb", a->mb);
  lua_pushstring(L, a->btype == LP_ACT_I ? "I" : "B");
  lua_setfield(L, -2, "b_type");
  lb_set_integer(L, "b_stage", a->bstage);
  lb_set_integer(L, "b_mb", a->bmb);
  lua_pushstring(L, c->text);
  lua_setfield(L, -2, "text");
  lua_call(L, 2, 0);
  return 0;
}

/* lp_exec_fb_fn over the Lua hook overlapped_fb(exec, pair): pair = {f_stage=,
 * f_mb=, b_type = "B" | "I", b_stage=, b_mb=, text=}; the hook runs both
 * halves with exec:run_half. Called inside exec:step, which keeps a
 * registry reference to its exec box for the hook (self_ref). */
static lp_status lua_fb(void *ud, lp_exec *e, const lp_action *a) {
  exec_box *b = ud;
  lua_State *L = b->L;
  char t[LP_ACTION_TEXT_MAX];
  lp_action_format(a, t, sizeof t);
  fb_call c = {b, a, t};
  int top = lua_gettop(L);
  char msg[LP_ERRLEN];
  if (!lua_checkstack(L, 8)) {
    lp_errf(msg, "overlapped_fb hook on %s: Lua stack overflow", t);
    lp_exec_set_error(e, msg);
    return LP_ERR_NOMEM;
  }
  lua_pushcfunction(L, lua_fb_p);
  lua_pushlightuserdata(L, &c);
  lp_status st = LP_OK;
  if (lp_lua_pcall_line(L, 1, 0) != LUA_OK) {
    lp_errf(msg, "overlapped_fb hook failed on %s: %s", t, lua_tostring(L, -1));
    lp_exec_set_error(e, msg);
    st = LP_ERR_ARG;
  }
  lua_settop(L, top);
  return st;
}

/* exec:run_half(type, stage, mb) -> true | nil, err: one half of an FB pair,
 * only inside an overlapped_fb hook. type "F", "B", "I" or "W". */
static int lb_exec_run_half(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  static const char *const types[] = {"F", "B", "I", "W", NULL};
  static const int codes[] = {LP_ACT_F, LP_ACT_B, LP_ACT_I, LP_ACT_W};
  int ty = codes[luaL_checkoption(L, 2, NULL, types)];
  int v = (int)luaL_checkinteger(L, 3), mb = (int)luaL_checkinteger(L, 4);
  if (!b->in_step)
    return luaL_error(L, "exec:run_half is only allowed inside an overlapped_fb hook");
  lp_status st = lp_exec_run_half(b->e, ty, v, mb);
  if (st == LP_ERR_ARG && !*lp_exec_last_error(b->e))
    return luaL_error(L, "run_half: virtual stage %d / micro-batch %d is not on this rank", v, mb);
  if (st != LP_OK) return lb_fail(L, lp_exec_last_error(b->e));
  lua_pushboolean(L, 1);
  return 1;
}

/* exec:begin_half(type, stage, mb) -> true | nil, err: takes the inputs of
 * a half ("F", "B" or "I") for exec:advance; only inside an overlapped_fb
 * hook. */
static int lb_exec_begin_half(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  static const char *const types[] = {"F", "B", "I", NULL};
  static const int codes[] = {LP_ACT_F, LP_ACT_B, LP_ACT_I};
  int ty = codes[luaL_checkoption(L, 2, NULL, types)];
  int v = (int)luaL_checkinteger(L, 3), mb = (int)luaL_checkinteger(L, 4);
  if (!b->in_step)
    return luaL_error(L, "exec:begin_half is only allowed inside an overlapped_fb hook");
  lp_status st = lp_exec_half_begin(b->e, ty, v, mb);
  if (st == LP_ERR_ARG && !*lp_exec_last_error(b->e))
    return luaL_error(L, "begin_half: virtual stage %d / micro-batch %d is not on this rank", v,
                      mb);
  if (st != LP_OK) return lb_fail(L, lp_exec_last_error(b->e));
  lua_pushboolean(L, 1);
  return 1;
}

/* exec:advance(which) -> done, next_phase | nil, err: one phase of the
 * forward ("F") or backward ("B") half begun by begin_half. */
static int lb_exec_advance(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  static const char *const which[] = {"F", "B", NULL};
  int bw = luaL_checkoption(L, 2, NULL, which);
  if (!b->in_step)
    return luaL_error(L, "exec:advance is only allowed inside an overlapped_fb hook");
  int done = 0;
  if (lp_exec_half_advance(b->e, bw, &done) != LP_OK) return lb_fail(L, lp_exec_last_error(b->e));
  lua_pushboolean(L, done);
  lua_pushstring(L, lp_exec_half_phase(b->e, bw));
  return 2;
}

/* exec:weight_grad_part() -> true when it ran the weight-grad of a block
 * the running full-backward half has finished, false when none is ready |
 * nil, err. */
static int lb_exec_weight_grad_part(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  if (!b->in_step)
    return luaL_error(L, "exec:weight_grad_part is only allowed inside an overlapped_fb hook");
  int did = 0;
  if (lp_exec_half_weight_grad_part(b->e, &did) != LP_OK)
    return lb_fail(L, lp_exec_last_error(b->e));
  lua_pushboolean(L, did);
  return 1;
}

/* exec:phase(which) -> name of what the next advance of the "F" / "B" half
 * runs ("attn/dense", "dispatch", "experts", "combine"; "done"). */
static int lb_exec_phase(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  static const char *const which[] = {"F", "B", NULL};
  lua_pushstring(L, lp_exec_half_phase(b->e, luaL_checkoption(L, 2, NULL, which)));
  return 1;
}

/* core.exec_device(device) -> name ("cpu", "cuda:N") | nil, message: what
 * exec_new's device option resolves to on this rank. */
static int lb_exec_device(lua_State *L) {
  const lp_tensor_backend *be = NULL;
  char err[LP_ERRLEN];
  if (lp_exec_device(luaL_checkstring(L, 1), &be, err) != LP_OK) return lb_fail(L, err);
  lua_pushstring(L, be ? be->name : "cpu");
  return 1;
}

/* core.exec_grid_check(P, ep, nprocs[, schedule name[, dp]]) -> true |
 * nil, message: the job-shape rule (lp_exec_grid_check_dp) luapipe.train
 * asks before it builds anything. */
static int lb_exec_grid_check(lua_State *L) {
  char err[LP_ERRLEN];
  if (lp_exec_grid_check_dp(lb_check_int(L, 1), lb_check_int(L, 2), (int)luaL_optinteger(L, 5, 0),
                            lb_check_int(L, 3), luaL_optstring(L, 4, NULL), err) != LP_OK)
    return lb_fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.exec_new(schedule, {build=, data=, loss=, act_shapes=, optimizer=,
 * trace=, lookahead=, overlapped_fb=, ep=, device=}) -> Exec | nil, err.
 * device: "cpu" (default), "cuda" (this rank's GPU) or "cuda:N": the
 * whole model runs there (lp_exec_opts.backend; the rule is lp_exec_device). */
static int lb_exec_new(lua_State *L) {
  lp_schedule *s = lb_check_schedule(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  exec_box *b = lb_box_new(L, sizeof *b, LB_EXEC); /* closed-first */
  b->data.ref = LUA_NOREF;
  b->build_ref = LUA_NOREF;
  b->fb_ref = LUA_NOREF;
  b->self_ref = LUA_NOREF;
  int S = lp_schedule_stages(s);
  b->nstages = S;
  b->ndim = lp_calloc((size_t)S, sizeof(int));
  b->shape = lp_calloc((size_t)S, sizeof *b->shape);
  if (!b->ndim || !b->shape) return luaL_error(L, "out of memory");

  lp_exec_opts o;
  memset(&o, 0, sizeof o);
  lua_getfield(L, 2, "build");
  luaL_argcheck(L, lua_isfunction(L, -1), 2, "'build' must be a function(stage) -> Layer");
  b->build_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_getfield(L, 2, "data");
  luaL_argcheck(L, lua_isfunction(L, -1), 2,
                "'data' must be a function(step, mb) -> input, target");
  b->data.ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_getfield(L, 2, "loss");
  o.loss = lb_loss_kind(L, -1, "loss");
  lua_pop(L, 1);
  lua_getfield(L, 2, "act_shapes");
  if (S > 1) luaL_argcheck(L, lua_istable(L, -1), 2, "'act_shapes' {[stage] = shape} needed");
  for (int st = 1; st < S; st++) {
    lua_geti(L, -1, st);
    if (!lua_istable(L, -1))
      return luaL_error(L, "act_shapes[%d] (input shape of stage %d) is missing", st, st);
    int n = (int)luaL_len(L, -1);
    if (n < 1 || n > LP_TENSOR_MAXDIM)
      return luaL_error(L, "act_shapes[%d] must have 1 to 4 dims", st);
    b->ndim[st] = n;
    for (int d = 0; d < n; d++) {
      lua_geti(L, -1, d + 1);
      b->shape[st][d] = lua_tointeger(L, -1);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  lua_getfield(L, 2, "optimizer");
  lb_optim_opts(L, -1, &o.optim, &o.sgd, &o.adamw);
  lua_pop(L, 1);
  lua_getfield(L, 2, "trace");
  o.trace = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, 2, "ep");
  o.ep = (int)luaL_optinteger(L, -1, 1);
  luaL_argcheck(L, o.ep >= 1, 2, "'ep' must be a positive integer");
  lua_pop(L, 1);
  lua_getfield(L, 2, "dp");
  o.dp = (int)luaL_optinteger(L, -1, 0);
  luaL_argcheck(L, o.dp >= 0, 2, "'dp' must be a positive integer (0: ep)");
  lua_pop(L, 1);
  lua_getfield(L, 2, "zero");
  o.zero = (int)luaL_optinteger(L, -1, 0);
  luaL_argcheck(L, o.zero == 0 || o.zero == 1, 2, "'zero' must be 0 or 1");
  lua_pop(L, 1);
  lua_getfield(L, 2, "lookahead");
  o.recv_lookahead = (int)luaL_optinteger(L, -1, 0);
  lua_pop(L, 1);
  lua_getfield(L, 2, "clip");
  o.clip = (float)luaL_optnumber(L, -1, 0);
  luaL_argcheck(L, o.clip >= 0, 2, "'clip' must be a positive number (0: off)");
  lua_pop(L, 1);
  lua_getfield(L, 2, "device");
  if (!lua_isnil(L, -1)) {
    luaL_argcheck(L, lua_type(L, -1) == LUA_TSTRING, 2,
                  "'device' must be \"cpu\", \"cuda\" or \"cuda:N\"");
    char derr[LP_ERRLEN];
    if (lp_exec_device(lua_tostring(L, -1), &o.backend, derr) != LP_OK) {
      box_close(L, b);
      return lb_fail(L, derr);
    }
  }
  lua_pop(L, 1);
  lua_getfield(L, 2, "overlapped_fb");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
  } else {
    luaL_argcheck(L, lua_isfunction(L, -1), 2, "'overlapped_fb' must be a function(exec, pair)");
    b->fb_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    o.overlapped_fb = lua_fb;
  }
  o.chunk = build_chunk;
  o.data = exec_data;
  o.ud = b;
  o.act_ndim = b->ndim;
  o.act_shape = (const int64_t(*)[LP_TENSOR_MAXDIM])b->shape;
  b->L = L;
  b->data.L = L;
  char err[LP_ERRLEN] = "";
  lp_status st = lp_exec_new(s, &o, &b->e, err);
  luaL_unref(L, LUA_REGISTRYINDEX, b->build_ref); /* needed only while building */
  b->build_ref = LUA_NOREF;
  if (st != LP_OK) {
    box_close(L, b);
    return lb_fail(L, *err ? err : lp_strerror(st));
  }
  return 1;
}

/* exec:step(k) -> loss | nil, err */
static int lb_exec_step(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  int64_t k = luaL_checkinteger(L, 2);
  b->L = L;
  b->data.L = L;
  double loss = 0;
  lua_pushvalue(L, 1);
  b->self_ref = luaL_ref(L, LUA_REGISTRYINDEX); /* for the hook; dropped after the step */
  b->in_step = 1;
  lp_status st = lp_exec_step(b->e, k, &loss);
  b->in_step = 0;
  luaL_unref(L, LUA_REGISTRYINDEX, b->self_ref);
  b->self_ref = LUA_NOREF;
  /* the job's policy: a timeout ends every rank with the executor's text */
  if (st != LP_OK) lp_comm_on_failure(lp_comm_world(), st, lp_exec_last_error(b->e));
  if (st != LP_OK) return lb_fail(L, lp_exec_last_error(b->e));
  lua_pushnumber(L, loss);
  return 1;
}

static void push_timing(lua_State *L, const lp_exec_timing *t) {
  lua_createtable(L, 0, 7);
  lb_set_integer(L, "steps", t->steps);
  lb_set_number(L, "wall", t->wall);
  lb_set_number(L, "compute", t->compute);
  lb_set_number(L, "wait", t->wait);
  lb_set_number(L, "post", t->post);
  lb_set_number(L, "optim", t->optim);
  lb_set_number(L, "overhead", t->overhead);
  lb_set_integer(L, "a2a_count", t->a2a_count);
  lb_set_number(L, "a2a", t->a2a);
  lb_set_number(L, "a2a_blocked", t->a2a_blocked);
  lb_set_number(L, "a2a_hidden", t->a2a_hidden);
  lb_set_number(L, "a2a_link", t->a2a_link);
  lb_set_number(L, "reduce", t->reduce);
  lb_set_number(L, "msg_bytes", t->msg_bytes);
  lb_set_number(L, "a2a_bytes", t->a2a_bytes);
}

/* exec:timing() -> wall_s, busy_s, {steps=1, wall=, compute=, wait=, post=,
 * optim=, overhead=} of the last step (seconds) */
static int lb_exec_timing(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  double w, busy;
  lp_exec_last_timing(b->e, &w, &busy);
  lua_pushnumber(L, w);
  lua_pushnumber(L, busy);
  lp_exec_timing t;
  lp_exec_timing_of(b->e, 0, &t);
  push_timing(L, &t);
  return 3;
}

/* One (kind, model stage)'s figures: {sum=, n=, x_n=, x_out=, x_in=,
 * x_max=, x_blocked=, x_halves=} (seconds, bytes). */
static void push_kind(lua_State *L, double sum, int64_t n, const lp_exec_exchanges *x) {
  lua_createtable(L, 0, 8);
  lb_set_number(L, "sum", sum);
  lb_set_integer(L, "n", n);
  lb_set_integer(L, "x_n", x->n);
  lb_set_number(L, "x_out", x->bytes_out);
  lb_set_number(L, "x_in", x->bytes_in);
  lb_set_number(L, "x_max", x->bytes_max);
  lb_set_number(L, "x_blocked", x->blocked);
  lb_set_integer(L, "x_halves", x->halves);
}

/* exec:timing_stats([which]) -> {steps=, wall=, compute=, wait=, post=,
 * optim=, overhead=, actions = {F = {[stage] = {sum=, n=, x_n=, x_out=,
 * x_in=, x_max=, x_blocked=, x_halves=}}, B=, I=, W=, FB=}} (x_*: their MoE
 * exchanges, bytes out / in / of the larger direction, seconds blocked on
 * them: lp_exec_action_exchanges):
 * sums (seconds) over the steps since exec:timing_reset() (which "total",
 * the default) or of the last step ("last"). */
static int lb_exec_timing_stats(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  static const char *const which[] = {"total", "last", NULL};
  int total = luaL_checkoption(L, 2, "total", which) == 0;
  lp_exec_timing t;
  lp_exec_timing_of(b->e, total, &t);
  push_timing(L, &t);
  lua_createtable(L, 0, LP_EXEC_NKINDS);
  for (int k = 0; k < LP_EXEC_NKINDS; k++) {
    lua_newtable(L);
    for (int st = 0; st < b->nstages; st++) {
      double sum = 0;
      int64_t n = 0;
      lp_exec_exchanges x = {0, 0, 0, 0, 0, 0};
      if (lp_exec_action_time(b->e, total, k, st, &sum, &n) != LP_OK ||
          lp_exec_action_exchanges(b->e, total, k, st, &x) != LP_OK || (n == 0 && x.halves == 0))
        continue; /* (a B that only runs in FB pairs still has its exchanges) */
      push_kind(L, sum, n, &x);
      lua_rawseti(L, -2, st);
    }
    lua_setfield(L, -2, lp_kind_name(k));
  }
  lua_setfield(L, -2, "actions");
  return 1;
}

/* exec:step_times() -> {{wall =, after =, actions = {[i] = seconds}}, ...}:
 * the kept steps, oldest first (lp_exec_step_times; compute actions only,
 * 0-based action indices) */
static int lb_exec_step_times(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  int K = lp_exec_step_times_count(b->e);
  lua_createtable(L, K, 0);
  for (int k = 0; k < K; k++) {
    double wall = 0, after = 0;
    const double *t = NULL;
    int n = 0;
    if (lp_exec_step_times(b->e, k, &wall, &after, &t, &n) != LP_OK) break;
    lua_createtable(L, 0, 3);
    lb_set_number(L, "wall", wall);
    lb_set_number(L, "after", after);
    lua_createtable(L, 0, n);
    for (int i = 0; i < n; i++)
      if (t[i] > 0) {
        lua_pushnumber(L, t[i]);
        lua_rawseti(L, -2, i);
      }
    lua_setfield(L, -2, "actions");
    lua_rawseti(L, -2, k + 1);
  }
  return 1;
}

/* The rows of one rank's kept steps: {{wall =, after =, actions = {[i] =
 * seconds}}, ...} (as exec:step_times: compute actions only, 0-based). */
static void push_kept(lua_State *L, const lp_exec_rank_times *r, int K) {
  lua_createtable(L, K, 0);
  for (int k = 0; k < K; k++) {
    const double *row = r->kept + (size_t)k * ((size_t)r->nacts + 2);
    lua_createtable(L, 0, 3);
    lb_set_number(L, "wall", row[0]);
    lb_set_number(L, "after", row[1]);
    lua_createtable(L, 0, r->nacts);
    for (int i = 0; i < r->nacts; i++)
      if (row[2 + i] > 0) {
        lua_pushnumber(L, row[2 + i]);
        lua_rawseti(L, -2, i);
      }
    lua_setfield(L, -2, "actions");
    lua_rawseti(L, -2, k + 1);
  }
}

/* protected: the table of exec:job_timing from the gathered t */
static int push_job_p(lua_State *L) {
  const lp_exec_job_times *t = lua_touserdata(L, 1);
  lua_createtable(L, 0, 8);
  lb_set_integer(L, "ranks", t->ranks);
  lb_set_integer(L, "ep", t->ep);
  lb_set_integer(L, "kept", t->kept);
  lb_set_number(L, "latency_ms", t->latency_ms);
  lb_set_integer(L, "latency_messages", t->latency_messages);
  push_timing(L, &t->sum);
  lua_setfield(L, -2, "sum");
  lua_createtable(L, 0, t->ranks);
  for (int r = 0; r < t->ranks; r++) {
    const lp_exec_rank_times *rt = &t->rank[r];
    push_timing(L, &rt->total); /* its totals, and: */
    lb_set_integer(L, "host_ranks", rt->host_ranks);
    lb_set_integer(L, "host_cores", rt->host_cores);
    lb_set_integer(L, "grad_floats", rt->grad_floats);
    lb_set_integer(L, "nkept", rt->nkept);
    push_kept(L, rt, t->kept);
    lua_setfield(L, -2, "kept");
    lua_createtable(L, rt->nslices, 0);
    for (int i = 0; i < rt->nslices; i++) {
      lua_createtable(L, 0, 3);
      lb_set_integer(L, "index", rt->slices[i].index);
      lb_set_number(L, "start_us", rt->slices[i].start_us);
      lb_set_number(L, "dur_us", rt->slices[i].dur_us);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "slices");
    lua_rawseti(L, -2, r);
  }
  lua_setfield(L, -2, "rank");
  lua_createtable(L, 0, LP_EXEC_NKINDS);
  for (int k = 0; k < LP_EXEC_NKINDS; k++) {
    lua_newtable(L);
    for (int st = 0; st < t->stages; st++) {
      const lp_exec_kind_times *a = &t->kinds[k * t->stages + st];
      if (a->n == 0 && a->x.halves == 0) continue; /* as timing_stats */
      push_kind(L, a->sum, a->n, &a->x);
      lua_rawseti(L, -2, st);
    }
    lua_setfield(L, -2, lp_kind_name(k));
  }
  lua_setfield(L, -2, "actions");
  return 1;
}

/* exec:job_timing() -> the job's timing gathered from every rank
 * (lp_exec_job_timing), the same table on every rank | nil, err:
 *   {ranks =, ep =, kept =, latency_ms =, latency_messages =,
 *    sum = {steps =, wall =, ...: every rank's exec:timing_stats() figures
 *           summed},
 *    rank = {[w] = {steps =, wall =, ... (its totals), host_ranks =,
 *           host_cores =, grad_floats =, nkept =, kept = {its last `kept`
 *           kept steps, as exec:step_times}, slices = {{index =, start_us =,
 *           dur_us =}, ...} (its last traced step's compute slices)}}
 *           (w: the 0-based world rank),
 *    actions = {F = {[stage] = {sum =, n =, x_n =, ...}}, ...} (summed
 *           over the ranks; as exec:timing_stats)}
 * Collective: every rank calls it between steps. */
static int lb_exec_job_timing(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  lp_exec_job_times *t = NULL;
  if (lp_exec_job_timing(b->e, &t) != LP_OK) return lb_fail(L, lp_exec_last_error(b->e));
  lua_pushcfunction(L, push_job_p); /* free first, raise last */
  lua_pushlightuserdata(L, t);
  int rc = lp_lua_pcall(L, 1, 1);
  lp_exec_job_times_free(t);
  if (rc != LUA_OK) return lua_error(L);
  return 1;
}

/* exec:trace_clear(): drops the measured events recorded so far */
static int lb_exec_trace_clear(lua_State *L) {
  if (lp_exec_trace_clear(check_exec(L, 1)->e) != LP_OK) return luaL_error(L, "out of memory");
  return 0;
}

/* exec:timing_reset(): clears the totals of exec:timing_stats() */
static int lb_exec_timing_reset(lua_State *L) {
  lp_exec_timing_reset(check_exec(L, 1)->e);
  return 0;
}

/* exec:expert_loads() -> {{n_e0, n_e1, ...}, ...}: tokens per logical
 * expert of every MoE layer of the model in the last step, summed over all
 * ranks (empty without MoE or before a step). */
static int lb_exec_expert_loads(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  int nl = 0;
  const int *ex = NULL;
  const double *c = NULL;
  lp_exec_expert_loads(b->e, &nl, &ex, &c);
  lua_createtable(L, c ? nl : 0, 0);
  for (int l = 0; c && l < nl; l++) {
    lua_createtable(L, ex[l], 0);
    for (int x = 0; x < ex[l]; x++) {
      lua_pushinteger(L, (lua_Integer)(c[x] + 0.5));
      lua_rawseti(L, -2, x + 1);
    }
    c += ex[l];
    lua_rawseti(L, -2, l + 1);
  }
  return 1;
}

/* exec:set_placement(layer, slots_per_rank, phys_to_log) -> bytes sent |
 * nil, err: a new placement of MoE layer `layer` (0-based); phys_to_log a
 * list of 0-based expert ids, ep x slots_per_rank of them. Collective. */
static int lb_exec_set_placement(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  int layer = (int)luaL_checkinteger(L, 2), spr = (int)luaL_checkinteger(L, 3);
  luaL_checktype(L, 4, LUA_TTABLE);
  int ep = lp_exec_ep(b->e, NULL);
  luaL_argcheck(L, spr >= 1, 3, "slots per rank must be at least 1");
  lua_Integer n = luaL_len(L, 4);
  if (n != (lua_Integer)spr * ep)
    return luaL_error(L, "set_placement: phys_to_log has %d entries, %d x %d expected", (int)n, ep,
                      spr);
  int *p2l = lua_newuserdatauv(L, (size_t)n * sizeof(int) + 1, 0);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, 4, i);
    if (!lua_isinteger(L, -1))
      return luaL_error(L, "set_placement: phys_to_log[%d] is not an integer", (int)i);
    p2l[i - 1] = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  int64_t bytes = 0;
  lp_status st = lp_exec_set_placement(b->e, layer, spr, p2l, &bytes);
  if (st != LP_OK) {
    lp_comm_on_failure(lp_comm_world(), st, lp_exec_last_error(b->e));
    return lb_fail(L, lp_exec_last_error(b->e));
  }
  lua_pushinteger(L, bytes);
  return 1;
}

/* exec:ep() -> EP group size, this rank's index in it */
static int lb_exec_ep(lua_State *L) {
  int r = 0;
  lua_pushinteger(L, lp_exec_ep(check_exec(L, 1)->e, &r));
  lua_pushinteger(L, r);
  return 2;
}

/* exec:host_share() -> ranks, cores: the job's ranks on this rank's host
 * and the cores they may run on */
static int lb_exec_host_share(lua_State *L) {
  int cores = 0;
  lua_pushinteger(L, lp_exec_host_share(check_exec(L, 1)->e, &cores));
  lua_pushinteger(L, cores);
  return 2;
}

/* exec:message_floats(stage) -> act, grad: floats of the activation message
 * into model stage `stage` (0-based; 0 for stage 0) and of its gradient-sum
 * message on this rank (0 unless it holds a copy of a replicated stage) */
static int lb_exec_message_floats(lua_State *L) {
  size_t act = 0, grad = 0;
  if (lp_exec_message_floats(check_exec(L, 1)->e, (int)luaL_checkinteger(L, 2), &act, &grad) !=
      LP_OK)
    return luaL_argerror(L, 2, "no such model stage");
  lua_pushinteger(L, (lua_Integer)act);
  lua_pushinteger(L, (lua_Integer)grad);
  return 2;
}

/* exec:wire() -> "f32" | "bf16", bytes a value takes in a message
 * (lp_exec_wire) */
static int lb_exec_wire(lua_State *L) {
  int vb = 4;
  lua_pushstring(L, lp_tensor_precision_name(lp_exec_wire(check_exec(L, 1)->e, &vb)));
  lua_pushinteger(L, vb);
  return 2;
}

/* exec:vstages() -> {{id=, stage=, layer=Layer}, ...} (layers shared) */
static int lb_exec_vstages(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  int n = lp_exec_vstages(b->e);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_createtable(L, 0, 3);
    lb_set_integer(L, "id", lp_exec_vstage_id(b->e, i));
    lb_set_integer(L, "stage", lp_exec_vstage_stage(b->e, i));
    lb_push_layer(L, lp_nn_layer_retain(lp_exec_vstage_chunk(b->e, i)));
    lua_setfield(L, -2, "layer");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* exec:save_checkpoint(dir, step) -> true | nil, err: this rank's stages
 * and optimizer state to <dir>/rank<R>.ckpt (atomically; dir must exist). */
static int lb_exec_save_checkpoint(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  const char *dir = luaL_checkstring(L, 2);
  int64_t step = luaL_checkinteger(L, 3);
  if (lp_exec_checkpoint_save(b->e, dir, step) != LP_OK)
    return lb_fail(L, lp_exec_last_error(b->e));
  lua_pushboolean(L, 1);
  return 1;
}

/* exec:load_checkpoint(dir) -> step | nil, err: replaces this rank's
 * parameters and optimizer state with <dir>/rank<R>.ckpt (nothing changes
 * when it is missing, corrupt or written for another run). */
static int lb_exec_load_checkpoint(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  const char *dir = luaL_checkstring(L, 2);
  int64_t step = 0;
  if (lp_exec_checkpoint_load(b->e, dir, &step) != LP_OK)
    return lb_fail(L, lp_exec_last_error(b->e));
  lua_pushinteger(L, step);
  return 1;
}

/* core.mkdir_p(path) -> true | nil, err: creates path and its parents
 * (mode 0777 & umask); an existing directory is fine. */
static int lb_mkdir_p(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  char buf[4096];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) return luaL_argerror(L, 1, "empty or too long path");
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    char c = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
      lua_pushnil(L);
      lua_pushfstring(L, "cannot create directory %s: %s", buf, strerror(errno));
      return 2;
    }
    buf[i] = c;
  }
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    lua_pushnil(L);
    lua_pushfstring(L, "cannot create directory %s: a file of that name exists", path);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static const char *const kind_names[] = {"compute", "send", "recv", NULL};

static void push_event(lua_State *L, const lp_trace_event *ev) {
  lua_createtable(L, 0, 10);
  lb_set_integer(L, "rank", ev->rank);
  lua_pushstring(L, kind_names[ev->kind]);
  lua_setfield(L, -2, "kind");
  lua_pushstring(L, ev->name);
  lua_setfield(L, -2, "name");
  lua_pushstring(L, ev->cat);
  lua_setfield(L, -2, "cat");
  lb_set_number(L, "start_us", ev->start_us);
  lb_set_number(L, "dur_us", ev->dur_us);
  lb_set_integer(L, "stage", ev->stage);
  lb_set_integer(L, "mb", ev->mb);
  lb_set_integer(L, "index", ev->index);
  lua_pushstring(L, ev->action);
  lua_setfield(L, -2, "action");
  lb_set_integer(L, "peer", ev->peer);
  lb_set_integer(L, "tag", ev->tag);
  lb_set_integer(L, "step", ev->step);
}

/* exec:trace_write(path) -> true | nil, err: gathers the measured events
 * of every rank on rank 0 over the comm and writes one Chrome trace there
 * (times from 0, a marker per step, counters, message flows). Collective. */
static int lb_exec_trace_write(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  const char *path = luaL_checkstring(L, 2);
  if (lp_exec_trace_write(b->e, path) != LP_OK) return lb_fail(L, lp_exec_last_error(b->e));
  lua_pushboolean(L, 1);
  return 1;
}

/* exec:trace_events() -> list of event tables (empty without trace=true) */
static int lb_exec_trace_events(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  lp_trace *t = lp_exec_trace(b->e);
  int n = 0;
  const lp_trace_event *ev = t ? lp_trace_events(t, &n) : NULL;
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    push_event(L, &ev[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* exec:grad_norm() -> the last step's gradient norm before clipping (the
 * same on every rank), or nil when clipping is off */
static int lb_exec_grad_norm(lua_State *L) {
  double n = lp_exec_grad_norm(check_exec(L, 1)->e);
  if (n < 0) lua_pushnil(L);
  else lua_pushnumber(L, n);
  return 1;
}

/* exec:set_lr(lr): every optimizer of this rank, from the next step on */
/* exec:dp() -> DP group size, this rank's index in it */
static int lb_exec_dp(lua_State *L) {
  int r = 0;
  lua_pushinteger(L, lp_exec_dp(check_exec(L, 1)->e, &r));
  lua_pushinteger(L, r);
  return 2;
}

/* exec:optim_bytes() -> bytes of optimizer state on this rank */
static int lb_exec_optim_bytes(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)lp_exec_optim_bytes(check_exec(L, 1)->e));
  return 1;
}

/* exec:dp_timing() -> {n =, s =, hidden =, link =}: the DP gradient sums
 * since the start (seconds) */
static int lb_exec_dp_timing(lua_State *L) {
  lp_exec_dp_timing t;
  lp_exec_dp_timing_of(check_exec(L, 1)->e, &t);
  lua_createtable(L, 0, 4);
  lb_set_integer(L, "n", t.n);
  lb_set_number(L, "s", t.s);
  lb_set_number(L, "hidden", t.hidden);
  lb_set_number(L, "link", t.link);
  return 1;
}

/* exec:dp_stats() -> {dp =, ep =, zero =, optim_bytes =, n =, s =,
 * hidden =, link =} (collective: the DP sums since the start and the
 * optimizer bytes, per rank: the mean over ranks), or nil, message */
static int lb_exec_dp_stats(lua_State *L) {
  exec_box *b = check_exec(L, 1);
  lp_exec_dp_stats t;
  if (lp_exec_dp_stats_of(b->e, &t) != LP_OK) return lb_fail(L, lp_exec_last_error(b->e));
  lua_createtable(L, 0, 8);
  lb_set_integer(L, "dp", t.dp);
  lb_set_integer(L, "ep", t.ep);
  lb_set_integer(L, "zero", t.zero);
  lb_set_number(L, "optim_bytes", t.optim_bytes);
  lb_set_integer(L, "n", t.sums.n);
  lb_set_number(L, "s", t.sums.s);
  lb_set_number(L, "hidden", t.sums.hidden);
  lb_set_number(L, "link", t.sums.link);
  return 1;
}

static int lb_exec_set_lr(lua_State *L) {
  lp_exec *e = check_exec(L, 1)->e;
  lua_Number lr = luaL_checknumber(L, 2);
  luaL_argcheck(L, lr >= 0 && lr < HUGE_VAL, 2, "a learning rate >= 0");
  lp_exec_set_lr(e, (float)lr);
  return 0;
}

void lb_open_exec(lua_State *L) {
  static const luaL_Reg methods[] = {{"step", lb_exec_step},
                                     {"grad_norm", lb_exec_grad_norm},
                                     {"set_lr", lb_exec_set_lr},
                                     {"timing", lb_exec_timing},
                                     {"timing_stats", lb_exec_timing_stats},
                                     {"step_times", lb_exec_step_times},
                                     {"job_timing", lb_exec_job_timing},
                                     {"timing_reset", lb_exec_timing_reset},
                                     {"trace_clear", lb_exec_trace_clear},
                                     {"vstages", lb_exec_vstages},
                                     {"ep", lb_exec_ep},
                                     {"dp", lb_exec_dp},
                                     {"optim_bytes", lb_exec_optim_bytes},
                                     {"dp_timing", lb_exec_dp_timing},
                                     {"dp_stats", lb_exec_dp_stats},
                                     {"host_share", lb_exec_host_share},
                                     {"message_floats", lb_exec_message_floats},
                                     {"wire", lb_exec_wire},
                                     {"expert_loads", lb_exec_expert_loads},
                                     {"set_placement", lb_exec_set_placement},
                                     {"run_half", lb_exec_run_half},
                                     {"begin_half", lb_exec_begin_half},
                                     {"advance", lb_exec_advance},
                                     {"phase", lb_exec_phase},
                                     {"weight_grad_part", lb_exec_weight_grad_part},
                                     {"trace_events", lb_exec_trace_events},
                                     {"trace_write", lb_exec_trace_write},
                                     {"save_checkpoint", lb_exec_save_checkpoint},
                                     {"load_checkpoint", lb_exec_load_checkpoint},
                                     {"close", lb_exec_close},
                                     {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", lb_exec_close}, {"__close", lb_exec_close},
                                  {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"exec_new", lb_exec_new},
                                   {"exec_device", lb_exec_device},
                                   {"exec_grid_check", lb_exec_grid_check},
                                   {"mkdir_p", lb_mkdir_p},
                                   {NULL, NULL}};
  lb_new_class(L, LB_EXEC, "Exec", methods, meta);
  luaL_setfuncs(L, funcs, 0);
  /* core.compute_kinds = {"F", "B", "I", "W", "FB"}: the compute kinds in
   * LP_KIND_* order, from their one name table (lp_kind_name) */
  lua_createtable(L, LP_NKINDS, 0);
  for (int k = 0; k < LP_NKINDS; k++) {
    lua_pushstring(L, lp_kind_name(k));
    lua_rawseti(L, -2, k + 1);
  }
  lua_setfield(L, -2, "compute_kinds");
}
