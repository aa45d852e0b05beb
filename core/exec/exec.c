/* exec.c — the per-rank executor of a lowered schedule (see lp_exec.h).
 *
 * State per (local virtual stage, micro-batch) lives in a slot: the nn
 * context, the forward input and backward input once they are available
 * (same-rank handoff, a finished receive, the data source or the loss), the
 * pending receive buffers, and the outputs waiting for their SEND action.
 * Message tags are (kind * V + consumer vstage) * M + mb with kinds F, B and
 * REDUCE, so every message of a step has its own tag per peer pair. */
#include "exec_internal.h"

#include <math.h>

#include <stdio.h>
#include <string.h>

/* ---- compute halves ---- */

lp_status ex_comm_fail(lp_exec *e, lp_comm *c, lp_status st, const char *what) {
  if (!e->fail.st) { /* the first failure's text stays */
    if (st == LP_ERR_TIMEOUT)
      lp_errf(e->fail.text, "%s", lp_comm_last_error(c));
    else
      lp_errf(e->fail.text, "rank %d: %s: %s", e->rank, what, lp_comm_last_error(c));
    e->fail.st = st;
  }
  lp_errf(e->err, "%s", e->fail.text);
  return st;
}

lp_status ex_nnfail(lp_exec *e, slot *sl, const char *what, lp_status st) {
  if (e->fail.st) return st; /* an exchange failed: its text is in e->err */
  char t[LP_ACTION_TEXT_MAX];
  lp_errf(e->err, "rank %d, action %d (%s): %s failed: %s", e->rank, e->cur,
          ex_act_text(e, e->cur, t, sizeof t), what,
          sl && sl->ctx && *lp_nn_ctx_last_error(sl->ctx) ? lp_nn_ctx_last_error(sl->ctx)
                                                          : lp_strerror(st));
  return st;
}

static lp_status get_data(lp_exec *e, int mb, lp_tensor **in, lp_tensor **tg) {
  char derr[LP_ERRLEN] = "";
  lp_status st = e->o.data(e->o.ud, e->step, mb, in, tg, derr);
  if (st == LP_OK && ((in && !*in) || (tg && !*tg))) st = LP_ERR_ARG;
  if (st != LP_OK) {
    char t[LP_ACTION_TEXT_MAX];
    lp_errf(e->err, "rank %d, action %d (%s): data for micro-batch %d of step %lld: %s",
            e->rank, e->cur, ex_act_text(e, e->cur, t, sizeof t), mb, (long long)e->step,
            *derr ? derr : lp_strerror(st));
    if (in) { lp_tensor_free(*in); *in = NULL; }
    if (tg) { lp_tensor_free(*tg); *tg = NULL; }
  }
  return st;
}

/* ---- the halves in phases: begin (inputs), advances (lp_nn_advance: each
 * runs compute up to the next expert-parallel exchange), finish (loss,
 * handoff, weight-grad) ---- */

static void half_clear(half *h) {
  lp_tensor_free(h->in);
  lp_tensor_free(h->tg);
  memset(h, 0, sizeof *h);
}

void ex_halves_clear(lp_exec *e) {
  half_clear(&e->pr.hf[0]);
  half_clear(&e->pr.hf[1]);
}

lp_status ex_f_begin(lp_exec *e, int v, int mb) {
  int li = e->loc[v];
  vst *vs = &e->vs[li];
  int k = e->kpos[li][mb], last = e->rlen[mb] - 1;
  slot *sl = &vs->slots[mb];
  lp_tensor *x = NULL, *tg = NULL;
  lp_status st = LP_OK;
  if (e->pr.hf[0].active) {
    lp_errf(e->err, "rank %d, action %d: a forward half is already running", e->rank, e->cur);
    return LP_ERR_INTERNAL;
  }
  if (k == 0) {
    LP_CHECK(get_data(e, mb, &x, k == last ? &tg : NULL));
    LP_CHECK_GOTO(ex_shard(e, &x, "input", mb), st, fail);
    LP_CHECK_GOTO(ex_to_backend(e, &x), st, fail); /* targets: the loss takes them anywhere */
  } else if (e->vrank[e->route[mb][k - 1]] == e->prank) {
    x = sl->fin;
    sl->fin = NULL;
    if (!x) {
      lp_errf(e->err, "rank %d, action %d: forward input of micro-batch %d on stage %d is missing",
              e->rank, e->cur, mb, v);
      return LP_ERR_INTERNAL;
    }
  } else {
    int pv = e->route[mb][k - 1];
    LP_CHECK(ex_finish_recv(e, 1, v, mb, e->vstage[v], e->vrank[pv], &x));
  }
  if (!sl->ctx) LP_CHECK_GOTO(lp_nn_ctx_new(&sl->ctx), st, fail);
  ex_trace_memory(e, lp_now(), 1, 0); /* the activation is held from the start */
  lp_nn_ctx_set_tag(sl->ctx, &e->pr.hf[0]); /* its exchanges are the forward half's */
  st = lp_nn_forward_begin(vs->chunk, sl->ctx, x);
  if (st != LP_OK) { ex_nnfail(e, sl, "forward", st); goto fail; }
  e->pr.hf[0] = (half){1, LP_ACT_F, v, mb, x, tg, 0};
  double *hx = ex_half_x(e, 0);
  if (hx) hx[EX_X_HALVES] += 1;
  return LP_OK;
fail:
  lp_tensor_free(x);
  lp_tensor_free(tg);
  return st;
}

/* The number of shares the step's loss is the mean over: its micro-batches
 * times the DP shares of each (every DP rank computes the loss of its
 * rows; dp = ep without data parallelism beyond the EP group).
 * Each share's loss is scaled by 1 / loss_shares, and the step's loss is
 * the sum of all shares over it. */
static int loss_shares(const lp_exec *e) { return e->M * e->dp; }

lp_status lp_exec_grid_check_dp(int P, int ep, int dp, int nprocs, const char *sname,
                                char *err) {
  if (ep < 0) {
    lp_errf(err, "ep must be at least 1, got %d", ep);
    return LP_ERR_ARG;
  }
  if (dp < 0) {
    lp_errf(err, "dp must be at least 1, got %d", dp);
    return LP_ERR_ARG;
  }
  int E = ep > 1 ? ep : 1, D = dp > 0 ? dp : E;
  if (D % E != 0) {
    lp_errf(err, "ep = %d does not divide dp = %d (each EP group is ep of a pipeline stage's dp "
            "ranks)", E, D);
    return LP_ERR_ARG;
  }
  if ((int64_t)P * D == nprocs) return LP_OK;
  char started[48];
  if (nprocs > 1) snprintf(started, sizeof started, "mpirun started %d", nprocs);
  else snprintf(started, sizeof started, "this is one process");
  const char *word = D > E ? "dp" : "ep"; /* the user's words: ep when dp = ep */
  if (!sname)
    lp_errf(err, "pp x %s = %d x %d needs %lld ranks, but %s (run it with mpirun -np %lld)", word,
            P, D, (long long)P * D, started, (long long)P * D);
  else if (D > 1)
    lp_errf(err, "schedule '%s' runs on %d pipeline rank%s; with %s = %d that is %lld ranks, but "
            "%s", sname, P, LP_PLURAL(P), word, D, (long long)P * D, started);
  else
    lp_errf(err, "schedule '%s' needs %d rank%s, but %s (run it with mpirun -np %d)", sname, P,
            LP_PLURAL(P), started, P);
  return LP_ERR_ARG;
}

lp_status lp_exec_grid_check(int P, int ep, int nprocs, const char *sname, char *err) {
  return lp_exec_grid_check_dp(P, ep, 0, nprocs, sname, err);
}

static lp_status f_finish(lp_exec *e, half *h, lp_tensor *y) {
  int v = h->v, mb = h->mb, li = e->loc[v];
  int k = e->kpos[li][mb], last = e->rlen[mb] - 1;
  slot *sl = &e->vs[li].slots[mb];
  lp_tensor *tg = h->tg, *dy = NULL;
  h->tg = NULL;
  lp_status st = LP_OK;
  if (k == last) {
    if (!tg) LP_CHECK_GOTO(get_data(e, mb, NULL, &tg), st, out);
    LP_CHECK_GOTO(ex_shard(e, &tg, "target", mb), st, out);
    double l = 0;
    float scale = 1.0f / (float)loss_shares(e);
    st = lp_nn_loss(e->o.loss, y, tg, scale, &l, &dy);
    if (st != LP_OK) {
      char t[LP_ACTION_TEXT_MAX];
      lp_errf(e->err, "rank %d, action %d (%s): loss of micro-batch %d failed (%s): "
              "check the target's shape against the model output",
              e->rank, e->cur, ex_act_text(e, e->cur, t, sizeof t), mb, lp_strerror(st));
      goto out;
    }
    e->loss_sum += l;
    sl->bin = dy;
  } else {
    LP_CHECK_GOTO(ex_round_boundary(e, &y), st, out);
    int nv = e->route[mb][k + 1];
    if (e->vrank[nv] == e->prank) {
      e->vs[e->loc[nv]].slots[mb].fin = y;
    } else {
      sl->fout = y;
    }
    y = NULL;
  }
out:
  lp_tensor_free(y);
  lp_tensor_free(tg);
  return st;
}

/* Full backward (full = 1) or input-grad only. */
lp_status ex_b_begin(lp_exec *e, int v, int mb, int full) {
  int li = e->loc[v];
  vst *vs = &e->vs[li];
  int k = e->kpos[li][mb], last = e->rlen[mb] - 1;
  slot *sl = &vs->slots[mb];
  lp_tensor *dy = NULL;
  if (e->pr.hf[1].active) {
    lp_errf(e->err, "rank %d, action %d: a backward half is already running", e->rank, e->cur);
    return LP_ERR_INTERNAL;
  }
  if (k == last || e->vrank[e->route[mb][k + 1]] == e->prank) {
    dy = sl->bin;
    sl->bin = NULL;
    if (!dy) {
      lp_errf(e->err,
              "rank %d, action %d: output gradient of micro-batch %d on stage %d is missing",
              e->rank, e->cur, mb, v);
      return LP_ERR_INTERNAL;
    }
  } else {
    int nv = e->route[mb][k + 1];
    LP_CHECK(ex_finish_recv(e, 0, v, mb, e->vstage[nv], e->vrank[nv], &dy));
  }
  lp_nn_ctx_set_tag(sl->ctx, &e->pr.hf[1]); /* its exchanges are the backward half's */
  lp_status st = lp_nn_input_grad_begin(vs->chunk, sl->ctx, dy);
  if (st != LP_OK) {
    lp_tensor_free(dy);
    return ex_nnfail(e, sl, "input-grad", st);
  }
  e->pr.hf[1] = (half){1, full ? LP_ACT_B : LP_ACT_I, v, mb, dy, NULL, 0};
  double *hx = ex_half_x(e, 1);
  if (hx) hx[EX_X_HALVES] += 1;
  return LP_OK;
}

static lp_status b_finish(lp_exec *e, half *h, lp_tensor *dx) {
  int v = h->v, mb = h->mb, li = e->loc[v];
  vst *vs = &e->vs[li];
  int k = e->kpos[li][mb];
  slot *sl = &vs->slots[mb];
  lp_status st = LP_OK;
  /* a stage boundary's gradient is bf16 before the weight-grad reads what
   * may share it (as in a chunk, where the next layer's pass comes first) */
  if (k > 0 && dx) LP_CHECK_GOTO(ex_round_boundary(e, &dx), st, out);
  if (h->type == LP_ACT_B && !h->keep_w) {
    st = ex_dp_weight_grad(e, vs, sl->ctx);
    if (st != LP_OK) { ex_nnfail(e, sl, "weight-grad", st); goto out; }
  } else if (h->type != LP_ACT_B) {
    vs->wq[(vs->wq_head + vs->wq_len) % e->M] = mb;
    vs->wq_len++;
  }
  ex_trace_memory(e, lp_now(), -1, h->type == LP_ACT_B ? 0 : 1);
  if (k > 0) {
    if (!dx) {
      lp_errf(e->err, "rank %d: stage %d gives no input gradient (an embedding must be "
              "the first layer of the model)", e->rank, v);
      st = LP_ERR_ARG;
      goto out;
    }
    int pv = e->route[mb][k - 1];
    if (e->vrank[pv] == e->prank) {
      e->vs[e->loc[pv]].slots[mb].bin = dx;
    } else {
      sl->bout = dx;
    }
    dx = NULL;
  }
out:
  lp_tensor_free(dx);
  return st;
}

/* One advance of the running forward (which = 0) or backward (1) half;
 * *done = 1 once its pass ended and the half finished. */
lp_status ex_half_advance(lp_exec *e, int which, int *done) {
  half *h = &e->pr.hf[which];
  *done = 0;
  if (!h->active) {
    lp_errf(e->err, "rank %d, action %d: no %s half is running", e->rank, e->cur,
            which ? "backward" : "forward");
    return LP_ERR_ARG;
  }
  int li = e->loc[h->v];
  slot *sl = &e->vs[li].slots[h->mb];
  int want = which == 0 || e->kpos[li][h->mb] > 0;
  lp_tensor *out = NULL;
  lp_status st = lp_nn_advance(e->vs[li].chunk, sl->ctx, done, want ? &out : NULL);
  if (st != LP_OK) {
    ex_nnfail(e, sl, which ? "input-grad" : "forward", st);
    half_clear(h);
    return st;
  }
  if (!*done) return LP_OK;
  half fin = *h; /* the half ends here, whatever its finish says */
  h->in = h->tg = NULL;
  st = which ? b_finish(e, &fin, out) : f_finish(e, &fin, out);
  half_clear(&fin);
  memset(h, 0, sizeof *h);
  return st;
}

/* The phase of half `which`'s next advance (LP_NN_PHASE_DONE: none runs). */
lp_nn_phase ex_half_phase(const lp_exec *e, int which) {
  const half *h = &e->pr.hf[which];
  if (!h->active) return LP_NN_PHASE_DONE;
  return lp_nn_phase_of(e->vs[e->loc[h->v]].slots[h->mb].ctx);
}

static lp_status run_f(lp_exec *e, int v, int mb) {
  LP_CHECK(ex_f_begin(e, v, mb));
  int done = 0;
  while (!done) {
    LP_CHECK(ex_half_advance(e, 0, &done));
    if (!done) LP_CHECK(ex_fill_with_carry(e, 0));
  }
  return LP_OK;
}

/* A lone backward; a full one runs the weight-grad pieces its input-grad
 * has made ready while its exchanges fly (the experts' while
 * dispatch-backward does, a finished block's while the next block's
 * combine-backward does): bitwise the same gradients (each parameter's
 * updates keep their order), less of the exchanges exposed. */
static lp_status run_b(lp_exec *e, int v, int mb, int full) {
  LP_CHECK(ex_b_begin(e, v, mb, full));
  int done = 0;
  while (!done) {
    LP_CHECK(ex_half_advance(e, 1, &done));
    if (!done && full) LP_CHECK(ex_bw_parts(e, NULL));
    if (!done) LP_CHECK(ex_fill_with_carry(e, 1));
  }
  return LP_OK;
}

lp_status lp_exec_half_begin(lp_exec *e, int type, int v, int mb) {
  if (v < 0 || v >= e->V || e->loc[v] < 0 || mb < 0 || mb >= e->M ||
      e->kpos[e->loc[v]][mb] < 0)
    return LP_ERR_ARG;
  switch (type) {
  case LP_ACT_F: return ex_f_begin(e, v, mb);
  case LP_ACT_B: return ex_b_begin(e, v, mb, 1);
  case LP_ACT_I: return ex_b_begin(e, v, mb, 0);
  default: return LP_ERR_ARG;
  }
}

lp_status lp_exec_half_advance(lp_exec *e, int backward, int *done) {
  return ex_half_advance(e, backward ? 1 : 0, done);
}

const char *lp_exec_half_phase(const lp_exec *e, int backward) {
  return lp_nn_phase_text(ex_half_phase(e, backward ? 1 : 0));
}

lp_status lp_exec_half_weight_grad_part(lp_exec *e, int *did) {
  return ex_bw_parts(e, did);
}

static lp_status run_w(lp_exec *e, int v, int mb) {
  vst *vs = &e->vs[e->loc[v]];
  if (vs->wq_len == 0) {
    lp_errf(e->err, "rank %d, action %d: no pending weight-grad on stage %d", e->rank,
            e->cur, v);
    return LP_ERR_INTERNAL;
  }
  if (mb < 0) mb = vs->wq[vs->wq_head];
  /* remove mb from the queue (usually the oldest) */
  int found = -1;
  for (int i = 0; i < vs->wq_len; i++)
    if (vs->wq[(vs->wq_head + i) % e->M] == mb) { found = i; break; }
  if (found < 0) {
    lp_errf(e->err, "rank %d, action %d: weight-grad of micro-batch %d on stage %d has no "
            "input-grad before it", e->rank, e->cur, mb, v);
    return LP_ERR_INTERNAL;
  }
  for (int i = found; i > 0; i--)
    vs->wq[(vs->wq_head + i) % e->M] = vs->wq[(vs->wq_head + i - 1) % e->M];
  vs->wq_head = (vs->wq_head + 1) % e->M;
  vs->wq_len--;
  slot *sl = &vs->slots[mb];
  lp_status st = ex_dp_weight_grad(e, vs, sl->ctx);
  if (st != LP_OK) return ex_nnfail(e, sl, "weight-grad", st);
  ex_trace_memory(e, lp_now(), 0, -1);
  return LP_OK;
}

lp_status lp_exec_run_half(lp_exec *e, int type, int v, int mb) {
  if (v < 0 || v >= e->V || e->loc[v] < 0 || mb < -1 || mb >= e->M) return LP_ERR_ARG;
  if (mb < 0 && type != LP_ACT_W) return LP_ERR_ARG;
  if (mb >= 0 && e->kpos[e->loc[v]][mb] < 0) return LP_ERR_ARG;
  switch (type) {
  case LP_ACT_F: return run_f(e, v, mb);
  case LP_ACT_B: return run_b(e, v, mb, 1);
  case LP_ACT_I: return run_b(e, v, mb, 0);
  case LP_ACT_W: return run_w(e, v, mb);
  default: return LP_ERR_ARG;
  }
}

/* ---- construction ---- */

/* vs's optimizer: over its parameters, or with ZeRO-1 over the unsharded
 * ones and its shards (ex_dp_optim_params). */
static lp_status setup_optim(lp_exec *e, vst *vs) {
  size_t np;
  lp_nn_param *p;
  int own = 0;
  LP_CHECK(ex_dp_optim_params(e, vs, &p, &np, &own));
  lp_status st = e->o.optim == LP_NN_OPTIM_ADAMW
                     ? lp_nn_optim_adamw_new(p, np, &e->o.adamw, &vs->optim)
                     : lp_nn_optim_sgd_new(p, np, &e->o.sgd, &vs->optim);
  if (own) lp_free(p);
  return st;
}

/* Moves a freshly built chunk to opts.backend (before its optimizer is
 * made); without one the chunk stays where build put it. */
static lp_status chunk_to_backend(lp_exec *e, vst *vs) {
  if (!e->o.backend) return LP_OK;
  lp_status st = lp_nn_layer_to(vs->chunk, e->be);
  if (st != LP_OK)
    lp_errf(e->err, "rank %d: moving model stage %d to %s failed (%s)", e->rank, vs->stage,
            e->be->name, lp_strerror(st));
  return st;
}

lp_status lp_exec_new(const lp_schedule *s, const lp_exec_opts *opts, lp_exec **out,
                      char *err) {
  *out = NULL;
  lp_status st = LP_OK;
  if (!s || !opts || !opts->chunk || !opts->data) {
    lp_errf(err, "lp_exec_new: schedule, chunk and data are required");
    return LP_ERR_ARG;
  }
  if (!(opts->clip >= 0) || isinf(opts->clip)) {
    lp_errf(err, "gradient clipping at %g: it takes a positive finite norm (0: off)",
            (double)opts->clip);
    return LP_ERR_ARG;
  }
  ex_keep_memory();
  lp_exec *e = lp_calloc(1, sizeof *e);
  if (!e) {
    lp_errf(err, "lp_exec_new: %s", lp_strerror(LP_ERR_NOMEM));
    return LP_ERR_NOMEM;
  }
  e->o = *opts;
  e->world = opts->comm ? opts->comm : lp_comm_world();
  e->ep = opts->ep;
  e->dp = opts->dp;
  e->pr.carry_v = -1;
  e->s = lp_schedule_clone(s);
  if (!e->s) { st = LP_ERR_NOMEM; goto fail; }
  e->P = lp_schedule_ranks(s);
  e->S = lp_schedule_stages(s);
  e->V = lp_schedule_vstages(s);
  e->M = lp_schedule_microbatches(s);
  const char *sname = *lp_schedule_name(s) ? lp_schedule_name(s) : "(unnamed)";
  if ((st = lp_exec_grid_check_dp(e->P, opts->ep, opts->dp, lp_comm_size(e->world), sname,
                                  e->err)) != LP_OK)
    goto fail;
  if (opts->zero != 0 && opts->zero != 1) {
    lp_errf(e->err, "zero = %d: ZeRO stage 0 (off) or 1 (optimizer state sharded over dp)",
            opts->zero);
    st = LP_ERR_ARG;
    goto fail;
  }
  LP_CHECK_GOTO(ex_grid_new(e), st, fail);
  /* dp.c's buckets: DP beyond the EP group, or ZeRO-1's shards */
  e->dpr.on = e->dp > 1 && (e->dp > e->ep || e->o.zero);
  e->be = opts->backend ? opts->backend : lp_tensor_backend_cpu();
  LP_CHECK_GOTO(ex_ep_device_new(e), st, fail);
  if (e->P > 1 && !lp_schedule_has_comm(s)) {
    lp_errf(e->err, "schedule '%s' is not lowered: call lp_schedule_lower first", sname);
    st = LP_ERR_ARG;
    goto fail;
  }
  if ((st = lp_schedule_validate(e->s)) != LP_OK) {
    lp_errf(e->err, "schedule '%s' is invalid: %s", sname, lp_schedule_last_error(e->s));
    if (st != LP_ERR_NOMEM) st = LP_ERR_INVALID;
    goto fail;
  }
  if ((int64_t)K__N * e->V * e->M - 1 > lp_comm_tag_ub(e->comm)) {
    lp_errf(e->err, "schedule '%s': %d virtual stages x %d micro-batches need message tags "
            "up to %lld, beyond this communicator's limit %d", sname, e->V, e->M,
            (long long)K__N * e->V * e->M - 1, lp_comm_tag_ub(e->comm));
    st = LP_ERR_ARG;
    goto fail;
  }
  e->loc = lp_malloc((size_t)e->V * sizeof(int));
  e->vrank = lp_malloc((size_t)e->V * sizeof(int));
  e->vstage = lp_malloc((size_t)e->V * sizeof(int));
  e->route = lp_calloc((size_t)e->M, sizeof *e->route);
  e->rlen = lp_calloc((size_t)e->M, sizeof(int));
  e->shape = lp_calloc((size_t)e->S, sizeof *e->shape);
  e->ndim = lp_calloc((size_t)e->S, sizeof(int));
  e->numel = lp_calloc((size_t)e->S, sizeof(size_t));
  if (!e->loc || !e->vrank || !e->vstage || !e->route || !e->rlen || !e->shape ||
      !e->ndim || !e->numel) { st = LP_ERR_NOMEM; goto fail; }
  for (int v = 0; v < e->V; v++) {
    e->vrank[v] = lp_schedule_vstage_rank(s, v);
    e->vstage[v] = lp_schedule_vstage_stage(s, v);
    e->loc[v] = e->vrank[v] == e->prank ? e->nloc++ : -1;
  }
  for (int mb = 0; mb < e->M; mb++) e->route[mb] = lp_schedule_route(e->s, mb, &e->rlen[mb]);
  for (int st_ = 1; st_ < e->S; st_++) {
    if (!opts->act_ndim || !opts->act_shape || opts->act_ndim[st_] < 1 ||
        opts->act_ndim[st_] > LP_TENSOR_MAXDIM) {
      lp_errf(e->err, "lp_exec_new: no activation shape for the input of model stage %d", st_);
      st = LP_ERR_ARG;
      goto fail;
    }
    e->ndim[st_] = opts->act_ndim[st_];
    size_t n = 1;
    for (int d = 0; d < e->ndim[st_]; d++) {
      e->shape[st_][d] = opts->act_shape[st_][d];
      n *= (size_t)opts->act_shape[st_][d];
    }
    e->numel[st_] = n;
  }
  e->vs = lp_calloc((size_t)(e->nloc ? e->nloc : 1), sizeof *e->vs);
  e->kpos = lp_calloc((size_t)(e->nloc ? e->nloc : 1), sizeof *e->kpos);
  if (!e->vs || !e->kpos) { st = LP_ERR_NOMEM; goto fail; }
  for (int v = 0; v < e->V; v++) {
    int li = e->loc[v];
    if (li < 0) continue;
    vst *vs = &e->vs[li];
    vs->id = v;
    vs->stage = e->vstage[v];
    char cerr[LP_ERRLEN] = "";
    st = opts->chunk(opts->ud, vs->stage, &vs->chunk, cerr);
    if (st != LP_OK || !vs->chunk) {
      lp_errf(e->err, "rank %d: building model stage %d: %s", e->rank, vs->stage,
              *cerr ? cerr : lp_strerror(st));
      if (st == LP_OK) st = LP_ERR_INTERNAL;
      goto fail;
    }
    LP_CHECK_GOTO(chunk_to_backend(e, vs), st, fail);
    LP_CHECK_GOTO(ex_ep_attach(e, vs), st, fail);
    /* what the loss takes (loss_shares): MoE balance losses become means
     * over the step's sequences too */
    LP_CHECK_GOTO(lp_nn_set_loss_scale(vs->chunk, 1.0f / (float)loss_shares(e)), st, fail);
    LP_CHECK_GOTO(ex_dp_new(e, vs), st, fail);
    LP_CHECK_GOTO(setup_optim(e, vs), st, fail);
    vs->slots = lp_calloc((size_t)e->M, sizeof(slot));
    vs->wq = lp_calloc((size_t)e->M, sizeof(int));
    e->kpos[li] = lp_malloc((size_t)e->M * sizeof(int));
    if (!vs->slots || !vs->wq || !e->kpos[li]) { st = LP_ERR_NOMEM; goto fail; }
    for (int mb = 0; mb < e->M; mb++) {
      e->kpos[li][mb] = -1;
      for (int k = 0; k < e->rlen[mb]; k++)
        if (e->route[mb][k] == v) e->kpos[li][mb] = k;
    }
    LP_CHECK_GOTO(ex_reduce_new(e, vs), st, fail);
  }
  LP_CHECK_GOTO(ex_moe_loads_new(e), st, fail);
  LP_CHECK_GOTO(ex_pcomm_new(e), st, fail);
  LP_CHECK_GOTO(ex_msg_setup(e), st, fail);
  e->acts = lp_schedule_actions(e->s, e->prank, &e->nacts);
  e->compute_idx = lp_malloc((size_t)(e->nacts + 1) * sizeof(int));
  if (!e->compute_idx) { st = LP_ERR_NOMEM; goto fail; }
  for (int i = 0; i < e->nacts; i++)
    if (lp_action_is_compute(e->acts[i].type)) e->compute_idx[e->ncompute++] = i;
  ex_reduce_plan(e);
  ex_dp_plan(e);
  LP_CHECK_GOTO(ex_timing_new(e), st, fail);
  LP_CHECK_GOTO(ex_host_share_new(e), st, fail);
  *out = e;
  return LP_OK;
fail:
  if (err) lp_errf(err, "%s", *e->err ? e->err : lp_strerror(st));
  lp_exec_free(e);
  return st;
}

static void clear_slot(lp_exec *e, slot *sl) {
  ex_recv_drop(e, &sl->rreq_f, &sl->rbuf_f, &sl->rwire_f);
  ex_recv_drop(e, &sl->rreq_b, &sl->rbuf_b, &sl->rwire_b);
  lp_tensor_free(sl->fin);
  lp_tensor_free(sl->bin);
  lp_tensor_free(sl->fout);
  lp_tensor_free(sl->bout);
  sl->fin = sl->bin = sl->fout = sl->bout = NULL;
  if (sl->ctx) lp_nn_ctx_clear(sl->ctx);
}

void lp_exec_free(lp_exec *e) {
  if (!e) return;
  ex_halves_clear(e);
  ex_sends_drop(e);
  if (e->vs) {
    for (int li = 0; li < e->nloc; li++) {
      vst *vs = &e->vs[li];
      if (vs->slots) {
        for (int mb = 0; mb < e->M; mb++) {
          clear_slot(e, &vs->slots[mb]);
          lp_nn_ctx_free(vs->slots[mb].ctx);
        }
      }
      lp_free(vs->slots);
      lp_free(vs->wq);
      ex_reduce_free(e, vs);
      ex_dp_free(e, vs);
      lp_nn_optim_free(vs->optim);
      lp_nn_layer_release(vs->chunk);
    }
  }
  if (e->kpos)
    for (int li = 0; li < e->nloc; li++) lp_free(e->kpos[li]);
  lp_free(e->kpos);
  lp_free(e->vs);
  lp_free(e->loc);
  lp_free(e->vrank);
  lp_free(e->vstage);
  lp_free(e->route);
  lp_free(e->rlen);
  lp_free(e->shape);
  lp_free(e->ndim);
  lp_free(e->numel);
  lp_free(e->compute_idx);
  ex_timing_free(e);
  ex_msg_free(e);
  ex_grid_free(e);
  lp_schedule_free(e->s);
  lp_free(e);
}

const char *lp_exec_last_error(const lp_exec *e) { return e ? e->err : ""; }

void lp_exec_set_error(lp_exec *e, const char *msg) {
  lp_errf(e->err, "%s", msg ? msg : "");
}

/* ---- the step ---- */

/* The trace category of action a: its compute kind's name, else "comm". */
static const char *cat_of(const lp_action *a) {
  int k = lp_kind_of(a->type);
  return k >= 0 ? lp_kind_name(k) : "comm";
}

static lp_status run_action(lp_exec *e, const lp_action *a) {
  /* a weight-grad carried over from an overlapped pair ends before any
   * other action but messages, the executor's own pairs and lone
   * forwards, input-grads and backwards of other stages (those fill
   * their exchanges' waits with its pieces: they touch no gradient of
   * its stage; a REDUCE_GRAD must find the gradients complete) */
  int keeps = lp_action_is_p2p(a->type) || (a->type == LP_ACT_FB && !e->o.overlapped_fb) ||
              a->type == LP_ACT_F ||
              ((a->type == LP_ACT_B || a->type == LP_ACT_I) && a->stage != e->pr.carry_v);
  if (!keeps) LP_CHECK(ex_carry_w(e, NULL));
  switch (a->type) {
  case LP_ACT_F: return run_f(e, a->stage, a->mb);
  case LP_ACT_B: return run_b(e, a->stage, a->mb, 1);
  case LP_ACT_I: return run_b(e, a->stage, a->mb, 0);
  case LP_ACT_W: return run_w(e, a->stage, a->mb);
  case LP_ACT_FB:
    if (e->o.overlapped_fb) {
      LP_CHECK(e->o.overlapped_fb(e->o.ud, e, a));
      if (e->pr.hf[0].active || e->pr.hf[1].active) {
        lp_errf(e->err, "rank %d, action %d: the overlapped_fb hook left a half unfinished",
                e->rank, e->cur);
        return LP_ERR_ARG;
      }
      return LP_OK;
    }
    return ex_run_fb(e, a);
  case LP_ACT_SEND_F:
  case LP_ACT_SEND_B: return ex_send(e, a);
  case LP_ACT_RECV_F:
  case LP_ACT_RECV_B: return LP_OK; /* posted ahead (ex_post_upto) */
  case LP_ACT_REDUCE_GRAD:
    if (e->loc[a->stage] < 0 || !ex_replicated(e, a->stage)) return LP_OK;
    return ex_reduce_start(e, e->loc[a->stage]);
  case LP_ACT_WAIT_REDUCE_GRAD:
    if (e->loc[a->stage] < 0) return LP_OK;
    return ex_reduce_wait(e, e->loc[a->stage]);
  case LP_ACT_UNSHARD:
  case LP_ACT_RESHARD: return LP_OK; /* stages are never sharded here */
  default: return LP_ERR_INTERNAL;
  }
}

static void reset_step(lp_exec *e) {
  ex_halves_clear(e);
  ex_reduce_reset(e);
  ex_dp_drop(e);
  ex_sends_drop(e);
  for (int li = 0; li < e->nloc; li++) {
    vst *vs = &e->vs[li];
    for (int mb = 0; mb < e->M; mb++) clear_slot(e, &vs->slots[mb]);
    vs->wq_head = vs->wq_len = 0;
    ex_reduce_drop(e, vs);
  }
}

lp_status lp_exec_step(lp_exec *e, int64_t step, double *loss) {
  lp_status st = LP_OK;
  if (e->fail.st) {
    lp_errf(e->err, "rank %d: step %lld: the executor cannot go on after a failed "
            "communication (%s)", e->rank, (long long)step, e->fail.text);
    return e->fail.st;
  }
  e->err[0] = '\0';
  e->step = step;
  e->pr.carry_v = -1; /* (a failed step may have left one) */
  e->loss_sum = 0;
  ex_msg_reset(e);
  ex_xchg_reset(e);
  double start = ex_time_step_begin(e);
  for (int li = 0; li < e->nloc; li++) {
    LP_CHECK_GOTO(lp_nn_optim_zero_grad(e->vs[li].optim), st, fail);
    LP_CHECK_GOTO(ex_dp_zero_grad(e, &e->vs[li]), st, fail);
  }
  ex_time_zero_grad(e, lp_now() - start);
  int L = e->o.recv_lookahead == 0 ? 4 : e->o.recv_lookahead;
  int ci = 0; /* compute actions before e->cur */
  for (e->cur = 0; e->cur < e->nacts; e->cur++) {
    const lp_action *a = &e->acts[e->cur];
    int limit = L < 0 || ci + L >= e->ncompute ? e->nacts : e->compute_idx[ci + L];
    if (limit <= e->cur) limit = e->cur + 1;
    double tp = lp_now();
    LP_CHECK_GOTO(ex_post_upto(e, limit), st, fail);
    int comp = lp_action_is_compute(a->type);
    ex_time_action_begin(e);
    double t0 = lp_now();
    ex_time_post(e, t0 - tp);
    st = run_action(e, a);
    if (st != LP_OK) {
      if (!*e->err) {
        char t[LP_ACTION_TEXT_MAX];
        lp_errf(e->err, "rank %d, action %d (%s): %s", e->rank, e->cur,
                ex_act_text(e, e->cur, t, sizeof t), lp_strerror(st));
      }
      goto fail;
    }
    double t1 = lp_now();
    if (comp) {
      /* busy time excludes waits for receives; the slice starts after them
       * (an FB pair's second wait is folded into its start as well) */
      ex_time_compute(e, e->cur, t1 - t0 - e->tm.waited);
      ci++;
      char name[LP_ACTION_TEXT_MAX];
      lp_action_format(a, name, sizeof name);
      ex_trace_add(e, LP_TRACE_COMPUTE, name, cat_of(a), t0 + e->tm.waited, t1, a->stage, a->mb,
                   e->cur, -1, -1);
    } else {
      ex_time_post(e, t1 - t0 - e->tm.waited); /* SEND_*, RECV_* (posted ahead), REDUCE_GRAD */
    }
    /* only a backlog of sends is polled (see SEND_BACKLOG in msg.c) */
    LP_CHECK_GOTO(ex_poll_sends(e), st, fail);
    /* a replicated stage whose gradients are final: its sums fly now */
    LP_CHECK_GOTO(ex_reduce_early(e), st, fail);
    /* a stage whose gradients are final: its sums over dp fly now */
    LP_CHECK_GOTO(ex_dp_early(e), st, fail);
    ex_time_post(e, lp_now() - t1); /* polling, trace recording */
  }
  e->cur = e->nacts;
  LP_CHECK_GOTO(ex_carry_w(e, NULL), st, fail);
  double te = lp_now();
  /* replicated stages without REDUCE_GRAD actions: reduce now */
  for (int li = 0; li < e->nloc; li++)
    if (ex_replicated(e, e->vs[li].id) && !e->vs[li].rd.started) {
      if (e->rd.has_actions) {
        lp_errf(e->err, "rank %d: virtual stage %d is a copy of model stage %d (replicated) but "
                "has no REDUCE_GRAD action, while other stages have one: give every copy its "
                "REDUCE_GRAD", e->rank, e->vs[li].id, e->vs[li].stage);
        st = LP_ERR_INVALID;
        goto fail;
      }
      LP_CHECK_GOTO(ex_reduce_start(e, li), st, fail);
    }
  double tr = lp_now();
  ex_time_post(e, tr - te);
  for (int li = 0; li < e->nloc; li++) {
    vst *vs = &e->vs[li];
    if (vs->wq_len) {
      lp_errf(e->err, "rank %d: %d weight-grads of stage %d never ran", e->rank, vs->wq_len,
              vs->id);
      st = LP_ERR_INVALID;
      goto fail;
    }
  }
  double wait_before = e->tm.wait, to, t_opt, t_step = 0;
  if (e->ep > 1 || e->moe.layers > 0 || e->o.clip > 0 || e->dpr.on) {
    /* sums over the EP group (and of expert replicas) take every stage's
     * reduced gradients at once; so does the global norm of clipping.
     * The DP sums (started early, or now for replicated stages) come
     * after the copies' sums; ZeRO-1 reduce-scatters the sums of the
     * replicas, the other DP sums were packed before them */
    LP_CHECK_GOTO(ex_reduce_finish(e), st, fail);
    LP_CHECK_GOTO(ex_wait_sends(e), st, fail);
    if (!e->o.zero) LP_CHECK_GOTO(ex_dp_finish(e), st, fail);
    if (e->ep > 1 || e->moe.layers > 0) LP_CHECK_GOTO(ex_ep_reduce(e), st, fail);
    if (e->o.zero) LP_CHECK_GOTO(ex_dp_finish(e), st, fail);
    LP_CHECK_GOTO(ex_clip(e), st, fail);
    /* the loads first: an expert no rank routed a token to has no
     * gradient, and its optimizer step leaves it alone (nograd.c) */
    LP_CHECK_GOTO(ex_moe_loads_sum(e), st, fail);
    to = lp_now();
    for (int li = 0; li < e->nloc; li++) LP_CHECK_GOTO(ex_optim_step(e, li), st, fail);
    t_opt = lp_now();
    t_step = t_opt - to;
    LP_CHECK_GOTO(ex_dp_gather(e), st, fail);
    t_opt = lp_now();
  } else {
    /* stage by stage, those without a reduction in flight first, then in
     * the order their reductions started: the optimizer of one runs while
     * the gradient sums of the next still fly (same numbers: each stage's
     * step needs only its own sums) */
    LP_CHECK_GOTO(ex_wait_sends(e), st, fail);
    to = lp_now();
    for (int k = -1; k < e->rd.nstarted; k++)
      for (int li = 0; li < e->nloc; li++) {
        vst *vs = &e->vs[li];
        if ((k < 0 && vs->rd.started) || (k >= 0 && (!vs->rd.started || vs->rd.seq != k)))
          continue;
        LP_CHECK_GOTO(ex_reduce_finish_one(e, li), st, fail);
        double t = lp_now();
        LP_CHECK_GOTO(lp_nn_optim_step(vs->optim), st, fail);
        t_step += lp_now() - t;
      }
    t_opt = lp_now();
  }
  /* (without MoE layers here: no loads, no masks) */
  ex_reduce_reset(e);
  ex_dp_reset(e);
  /* summing reduced grads */
  ex_time_reduce(e, (t_opt - tr) - t_step - (e->tm.wait - wait_before));
  if (to - tr > 1e-6)
    ex_trace_add(e, LP_TRACE_RECV, "reduce grads / finish sends", "comm", tr, to, -1, -1, -1,
                 -1, -1);
  ex_time_optim(e, t_step);
  ex_trace_add(e, LP_TRACE_COMPUTE, "optimizer", "optim", to, t_opt, -1, -1, -1, -1, -1);
  LP_CHECK_GOTO(ex_moe_bias_update(e), st, fail);
  double sum = e->loss_sum;
  {
    char what[96];
    snprintf(what, sizeof what, "rank %d: the loss all-reduce at the end of step %lld", e->rank,
             (long long)step);
    st = lp_comm_allreduce_sum_double(e->world, &sum, 1, what);
    if (st != LP_OK) {
      ex_comm_fail(e, e->world, st, what);
      goto fail;
    }
  }
  if (loss) *loss = sum / loss_shares(e);
  ex_timing_commit(e, t_opt - start);
  return LP_OK;
fail:
  if (!*e->err)
    lp_errf(e->err, "rank %d: step %lld failed: %s", e->rank, (long long)step, lp_strerror(st));
  reset_step(e);
  return st;
}

int lp_exec_vstages(const lp_exec *e) { return e->nloc; }
lp_status lp_exec_message_floats(const lp_exec *e, int stage, size_t *act, size_t *grad) {
  if (stage < 0 || stage >= e->S) return LP_ERR_ARG;
  *act = stage > 0 ? e->numel[stage] : 0;
  *grad = 0;
  for (int li = 0; li < e->nloc; li++)
    if (e->vs[li].stage == stage && ex_replicated(e, e->vs[li].id))
      *grad = ex_grad_numel(e->vs[li].chunk);
  return LP_OK;
}

int lp_exec_ep(const lp_exec *e, int *ep_rank) {
  if (ep_rank) *ep_rank = e->ep_rank;
  return e->ep;
}
int lp_exec_vstage_id(const lp_exec *e, int i) { return i >= 0 && i < e->nloc ? e->vs[i].id : -1; }
int lp_exec_vstage_stage(const lp_exec *e, int i) {
  return i >= 0 && i < e->nloc ? e->vs[i].stage : -1;
}
lp_nn_layer *lp_exec_vstage_chunk(const lp_exec *e, int i) {
  return i >= 0 && i < e->nloc ? e->vs[i].chunk : NULL;
}
lp_nn_optim *lp_exec_vstage_optim(const lp_exec *e, int i) {
  return i >= 0 && i < e->nloc ? e->vs[i].optim : NULL;
}
const lp_schedule *lp_exec_schedule(const lp_exec *e) { return e->s; }
lp_comm *lp_exec_comm(const lp_exec *e) { return e->world; }
