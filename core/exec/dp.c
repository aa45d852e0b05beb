/* dp.c — data parallelism: the gradient sums of each local vstage over
 * its data-parallel groups, as DDP's buckets, and ZeRO-1's shards.
 *
 * A vstage has two buckets: its dense parameters (summed over the DP
 * group: the dp ranks of this pipeline rank) and its routed experts'
 * slots (summed over the expert-DP group: the dp / ep ranks with this EP
 * index; replicas inside the EP group are ep.c's). With zero = 0 a
 * bucket's all-reduce starts as soon as the stage's gradients are final
 * (its last B / W / FB of the step has run and no weight-grad of it is
 * queued or carried) and flies under the rank's remaining actions; the
 * step end waits for it and writes the sums back. A replicated stage
 * (DualPipe's two copies) starts its sums at the step end, after the
 * copies' sum (reduce.c). With ZeRO-1 each bucket is reduce-scattered at
 * the step end into this rank's shard (a parameter of the vstage's
 * optimizer, with its master values), the optimizer updates the shard and
 * the shards are all-gathered into the parameters.
 *
 * It owns e->dpr and every local vstage's vs->dp; it is on (e->dpr.on)
 * when dp goes beyond the EP group or ZeRO-1 shards: when dp = ep the
 * dense sums are ep.c's step-end all-reduce, as before. */
#include "exec_internal.h"

#include <stdio.h>
#include <string.h>

static const char *bucket_name[DP_NB] = {"dense", "experts"};

/* A group of children is summed by one all-reduce once it holds this many
 * floats (LUAPIPE_DP_BUCKET, 65536 = 256 KiB; DDP's first bucket is
 * 1 MiB): fewer, larger messages for small layers, an early start for
 * large ones. */
static size_t bucket_floats(void) {
  long n = lp_env_int("LUAPIPE_DP_BUCKET", 65536);
  return n < 1 ? 1 : (size_t)n;
}

static void bucket_free(dp_bucket *b) {
  lp_free(b->idx);
  lp_free(b->off);
  lp_free(b->pack);
  lp_free(b->seg);
  lp_free(b->seg_p);
  lp_free(b->req);
  lp_tensor_free(b->wv);
  lp_tensor_free(b->wg);
  memset(b, 0, sizeof *b);
}

/* The bucket sums over a group of more than one rank. */
static int active(const dp_bucket *b) { return b->comm && b->n > 0; }

/* Groups of vs's children (from the end, each at least bucket_floats()
 * floats but the first children's) and each bucket's segments: its ranges
 * of parameters and floats per group. pstart[c]: the first parameter of
 * child c (pstart[nchild] = the count). */
static lp_status plan_groups(vst *vs, const size_t *pstart, const lp_nn_param *p) {
  int nc = vs->dp.nchild;
  vs->dp.child0 = lp_malloc((size_t)nc * sizeof *vs->dp.child0);
  if (!vs->dp.child0) return LP_ERR_NOMEM;
  int ng = 0;
  size_t acc = 0, want = bucket_floats();
  for (int c = nc - 1; c >= 0; c--) {
    for (size_t i = pstart[c]; i < pstart[c + 1]; i++) acc += (size_t)lp_tensor_numel(p[i].grad);
    if (acc >= want || c == 0) {
      vs->dp.child0[ng++] = c;
      acc = 0;
    }
  }
  vs->dp.ng = ng;
  for (int k = 0; k < DP_NB; k++) {
    dp_bucket *b = &vs->dp.b[k];
    b->seg = lp_malloc((size_t)(ng + 1) * sizeof *b->seg);
    b->seg_p = lp_malloc((size_t)(ng + 1) * sizeof *b->seg_p);
    b->req = lp_calloc((size_t)ng, sizeof *b->req);
    if (!b->seg || !b->seg_p || !b->req) return LP_ERR_NOMEM;
    /* group j holds the bucket's parameters from the first of child
     * child0[j] up to the first of child child0[j - 1] (the end for j = 0) */
    b->seg_p[0] = b->np;
    b->seg[0] = b->n;
    for (int j = 0; j < ng; j++) {
      size_t q = 0;
      while (q < b->np && b->idx[q] < pstart[vs->dp.child0[j]]) q++;
      b->seg_p[j + 1] = q;
      b->seg[j + 1] = q < b->np ? b->off[q] : b->n;
    }
  }
  return LP_OK;
}

void ex_dp_free(lp_exec *e, vst *vs) {
  for (int k = 0; k < DP_NB; k++) {
    dp_bucket *b = &vs->dp.b[k];
    if (b->req)
      for (int j = 0; j < vs->dp.ng; j++) lp_comm_cancel(b->comm, &b->req[j]);
    bucket_free(b);
  }
  lp_free(vs->dp.child0);
  vs->dp.child0 = NULL;
  vs->dp.ng = 0;
  (void)e;
}

lp_status ex_dp_new(lp_exec *e, vst *vs) {
  if (!e->dpr.on) return LP_OK;
  size_t np;
  const lp_nn_param *p = lp_nn_params(vs->chunk, &np);
  ex_dp_free(e, vs);
  lp_nn_param_role *roles = lp_malloc((np ? np : 1) * sizeof *roles);
  /* the children of the chunk and where their parameters start (a chunk
   * lists its children's parameters in order) */
  size_t nc = lp_nn_layer_children(vs->chunk);
  int chunk = nc > 0 && strcmp(lp_nn_layer_kind(vs->chunk), "chunk") == 0;
  if (!chunk) nc = 1;
  size_t *pstart = lp_malloc((nc + 1) * sizeof *pstart);
  if (!roles || !pstart) {
    lp_free(roles);
    lp_free(pstart);
    return LP_ERR_NOMEM;
  }
  pstart[0] = 0;
  for (size_t c = 0; c < nc; c++) {
    size_t n = np;
    if (chunk) lp_nn_params(lp_nn_layer_child(vs->chunk, c), &n);
    pstart[c + 1] = pstart[c] + n;
  }
  if (pstart[nc] != np) { /* (not a plain list of children: one group) */
    nc = 1;
    pstart[1] = np;
  }
  vs->dp.nchild = (int)nc;
  lp_status st = np ? lp_nn_param_roles(vs->chunk, roles, np) : LP_OK;
  for (int k = 0; k < DP_NB && st == LP_OK; k++) {
    dp_bucket *b = &vs->dp.b[k];
    b->comm = k == DP_DENSE ? e->dp_comm : e->xdp_comm;
    b->idx = lp_malloc((np ? np : 1) * sizeof *b->idx);
    b->off = lp_malloc((np ? np : 1) * sizeof *b->off);
    if (!b->idx || !b->off) { st = LP_ERR_NOMEM; break; }
    for (size_t i = 0; i < np; i++) {
      if ((roles[i].slot >= 0) != (k == DP_EXPERT)) continue;
      b->idx[b->np] = i;
      b->off[b->np++] = b->n;
      b->n += (size_t)lp_tensor_numel(p[i].grad);
    }
    if (!active(b)) continue;
    size_t R = (size_t)lp_comm_size(b->comm);
    b->shard = (b->n + R - 1) / R;
    b->lo = b->shard * (size_t)lp_comm_rank(b->comm);
    b->pack = lp_calloc(b->shard * R, sizeof *b->pack); /* the padding stays 0 */
    if (!b->pack) { st = LP_ERR_NOMEM; break; }
    if (e->o.zero) {
      int64_t sh = (int64_t)b->shard;
      st = lp_tensor_zeros(lp_tensor_backend_cpu(), 1, &sh, &b->wv);
      if (st == LP_OK) st = lp_tensor_zeros(lp_tensor_backend_cpu(), 1, &sh, &b->wg);
    }
  }
  if (st == LP_OK) st = plan_groups(vs, pstart, p);
  lp_free(roles);
  lp_free(pstart);
  return st;
}

lp_status ex_dp_optim_params(lp_exec *e, vst *vs, lp_nn_param **params, size_t *n, int *own) {
  size_t np;
  const lp_nn_param *p = lp_nn_params(vs->chunk, &np);
  *own = 0;
  if (!e->dpr.on || !e->o.zero) {
    *params = (lp_nn_param *)p;
    *n = np;
    return LP_OK;
  }
  lp_nn_param *out = lp_malloc((np + DP_NB) * sizeof *out);
  char *sharded = lp_calloc(np ? np : 1, 1);
  if (!out || !sharded) {
    lp_free(out);
    lp_free(sharded);
    return LP_ERR_NOMEM;
  }
  size_t k = 0;
  for (int b = 0; b < DP_NB; b++)
    if (active(&vs->dp.b[b]))
      for (size_t j = 0; j < vs->dp.b[b].np; j++) sharded[vs->dp.b[b].idx[j]] = 1;
  for (size_t i = 0; i < np; i++)
    if (!sharded[i]) out[k++] = p[i];
  for (int b = 0; b < DP_NB; b++) {
    dp_bucket *bk = &vs->dp.b[b];
    if (!active(bk)) continue;
    lp_nn_param sp;
    memset(&sp, 0, sizeof sp);
    sp.name = b == DP_DENSE ? "zero-1 shard (dense)" : "zero-1 shard (experts)";
    sp.value = bk->wv;
    sp.grad = bk->wg;
    out[k++] = sp;
  }
  lp_free(sharded);
  *params = out;
  *n = k;
  *own = 1;
  return LP_OK;
}

void ex_dp_plan(lp_exec *e) {
  for (int li = 0; li < e->nloc; li++) {
    int v = e->vs[li].id;
    e->vs[li].dp.last_grad = -1;
    for (int i = 0; i < e->nacts; i++) {
      const lp_action *a = &e->acts[i];
      int writes = ((a->type == LP_ACT_B || a->type == LP_ACT_W) && a->stage == v) ||
                   (a->type == LP_ACT_FB && a->bstage == v && a->btype == LP_ACT_B);
      if (writes) e->vs[li].dp.last_grad = i;
    }
  }
}

/* Packs bucket b's grads of vs, its parameters [p0, p1), into its pack
 * (any backend: lp_tensor_read). */
static lp_status pack(vst *vs, dp_bucket *b, size_t p0, size_t p1) {
  const lp_nn_param *p = lp_nn_params(vs->chunk, &(size_t){0});
  for (size_t j = p0; j < p1; j++) LP_CHECK(lp_tensor_read(p[b->idx[j]].grad, b->pack + b->off[j]));
  return LP_OK;
}

/* src (flat, as the pack) into the parameters' values / grads. */
static lp_status unpack(vst *vs, dp_bucket *b, const float *src) {
  const lp_nn_param *p = lp_nn_params(vs->chunk, &(size_t){0});
  for (size_t j = 0; j < b->np; j++) LP_CHECK(lp_tensor_write(p[b->idx[j]].value, src + b->off[j]));
  return LP_OK;
}

static lp_status unpack_grads(vst *vs, dp_bucket *b) {
  const lp_nn_param *p = lp_nn_params(vs->chunk, &(size_t){0});
  for (size_t j = 0; j < b->np; j++)
    LP_CHECK(lp_tensor_write(p[b->idx[j]].grad, b->pack + b->off[j]));
  return LP_OK;
}

/* Starts the all-reduces of local vstage li's groups up to (not
 * including) `upto` (zero = 0). */
static lp_status start(lp_exec *e, int li, int upto) {
  vst *vs = &e->vs[li];
  if (vs->dp.started == 0 && upto > 0) {
    vs->dp.t0 = lp_now();
    vs->dp.done_at = 0;
  }
  for (; vs->dp.started < upto; vs->dp.started++) {
    int j = vs->dp.started;
    for (int k = 0; k < DP_NB; k++) {
      dp_bucket *b = &vs->dp.b[k];
      if (!active(b) || b->seg[j + 1] == b->seg[j]) continue;
      LP_CHECK(pack(vs, b, b->seg_p[j + 1], b->seg_p[j]));
      lp_status st = lp_comm_iallreduce_sum_float(b->comm, b->pack + b->seg[j + 1],
                                                  b->seg[j] - b->seg[j + 1], &b->req[j]);
      if (st != LP_OK) {
        char what[160];
        snprintf(what, sizeof what, "rank %d (DP rank %d of %d): starting the %s gradient sum of "
                 "stage %d", e->rank, e->dp_rank, e->dp, bucket_name[k], vs->id);
        return ex_comm_fail(e, b->comm, st, what);
      }
      e->dpr.link += lp_link_allreduce_time(lp_comm_link(b->comm), lp_comm_size(b->comm),
                                            4.0 * (double)(b->seg[j] - b->seg[j + 1]));
    }
  }
  return LP_OK;
}

/* The stage's gradients are final after action e->cur's weight-grad. */
static int last_writer(const lp_exec *e, const vst *vs) {
  return e->dpr.on && !e->o.zero && vs->dp.last_grad == e->cur && vs->wq_len == 0 &&
         e->pr.carry_v != vs->id && !ex_replicated(e, vs->id);
}

lp_status ex_dp_weight_grad(lp_exec *e, vst *vs, lp_nn_ctx *ctx) {
  if (!last_writer(e, vs) || vs->dp.started > 0) return lp_nn_weight_grad(vs->chunk, ctx, NULL);
  /* child by child from the end: after i pieces at least the last i
   * children are done (pieces an overlapped pair ran before count as
   * undone here: their groups start a little later) */
  int li = e->loc[vs->id], i = 0, g = 0;
  for (;;) {
    int did = 0;
    LP_CHECK(lp_nn_weight_grad_part(vs->chunk, ctx, &did));
    if (!did) break;
    i++;
    while (g < vs->dp.ng && vs->dp.child0[g] >= vs->dp.nchild - i) g++;
    if (g > vs->dp.started) LP_CHECK(start(e, li, g));
  }
  LP_CHECK(lp_nn_weight_grad(vs->chunk, ctx, NULL));
  return start(e, li, vs->dp.ng);
}

/* Polls local vstage li's sums in flight (a nonblocking collective
 * progresses inside the comm's calls: MPI's do), noting when they have
 * all finished. */
static lp_status poll(lp_exec *e, int li) {
  vst *vs = &e->vs[li];
  if (!vs->dp.started || vs->dp.done_at > 0) return LP_OK;
  int all = vs->dp.started == vs->dp.ng;
  for (int k = 0; k < DP_NB; k++) {
    dp_bucket *b = &vs->dp.b[k];
    if (!active(b)) continue;
    for (int j = 0; j < vs->dp.started; j++) {
      int done = 1;
      lp_status st = lp_comm_test(b->comm, &b->req[j], &done);
      if (st != LP_OK) {
        char what[160];
        snprintf(what, sizeof what, "rank %d (DP rank %d of %d): the %s gradient sum of stage %d",
                 e->rank, e->dp_rank, e->dp, bucket_name[k], vs->id);
        return ex_comm_fail(e, b->comm, st, what);
      }
      all &= done;
    }
  }
  if (all) vs->dp.done_at = lp_now();
  return LP_OK;
}

lp_status ex_dp_early(lp_exec *e) {
  if (!e->dpr.on || e->o.zero) return LP_OK;
  for (int li = 0; li < e->nloc; li++) {
    vst *vs = &e->vs[li];
    LP_CHECK(poll(e, li));
    if (vs->dp.started == vs->dp.ng || vs->dp.last_grad < 0 || vs->dp.last_grad > e->cur ||
        vs->wq_len || e->pr.carry_v == vs->id || ex_replicated(e, vs->id))
      continue;
    LP_CHECK(start(e, li, vs->dp.ng));
  }
  return LP_OK;
}

lp_status ex_dp_finish(lp_exec *e) {
  if (!e->dpr.on) return LP_OK;
  if (e->o.zero) {
    /* reduce-scatter: this rank's shard of every bucket's sums */
    for (int li = 0; li < e->nloc; li++) {
      vst *vs = &e->vs[li];
      for (int k = 0; k < DP_NB; k++) {
        dp_bucket *b = &vs->dp.b[k];
        if (!active(b)) continue;
        LP_CHECK(pack(vs, b, 0, b->np));
        char what[160];
        snprintf(what, sizeof what, "rank %d (DP rank %d of %d): reduce-scatter of the %s "
                 "gradients of stage %d (ZeRO-1)", e->rank, e->dp_rank, e->dp, bucket_name[k],
                 vs->id);
        double t0 = lp_now();
        lp_status st = lp_comm_reduce_scatter_sum_float(b->comm, b->pack, b->wg->data, b->shard,
                                                        what);
        double t1 = lp_now();
        ex_time_wait(e, t1 - t0);
        if (st != LP_OK) return ex_comm_fail(e, b->comm, st, what);
        e->dpr.s += t1 - t0;
        e->dpr.n++;
        e->dpr.link += lp_link_allreduce_time(lp_comm_link(b->comm), lp_comm_size(b->comm),
                                              4.0 * (double)b->n) / 2;
        /* the master values: this rank's slice of the parameters (equal
         * to the shard after every all-gather; a loaded checkpoint's) */
        const lp_nn_param *p = lp_nn_params(vs->chunk, &(size_t){0});
        for (size_t j = 0; j < b->np; j++)
          LP_CHECK(lp_tensor_read(p[b->idx[j]].value, b->pack + b->off[j]));
        memcpy(b->wv->data, b->pack + b->lo, b->shard * sizeof(float));
      }
    }
    return LP_OK;
  }
  for (int li = 0; li < e->nloc; li++) LP_CHECK(start(e, li, e->vs[li].dp.ng));
  for (int li = 0; li < e->nloc; li++) {
    vst *vs = &e->vs[li];
    double tw = lp_now();
    for (int k = 0; k < DP_NB; k++) {
      dp_bucket *b = &vs->dp.b[k];
      if (!active(b)) continue;
      char what[160];
      snprintf(what, sizeof what, "rank %d (DP rank %d of %d): the %s gradient sum of stage %d",
               e->rank, e->dp_rank, e->dp, bucket_name[k], vs->id);
      lp_status st = lp_comm_waitall(b->comm, b->req, vs->dp.ng, what);
      if (st != LP_OK) return ex_comm_fail(e, b->comm, st, what);
    }
    double t1 = lp_now();
    ex_time_wait(e, t1 - tw);
    /* its time: start to the end of its wait, or to the poll that found
     * it finished (then all of it hidden); hidden: the part before the
     * wait, while the rank went on with its actions */
    double end = vs->dp.done_at > 0 ? vs->dp.done_at : t1;
    e->dpr.s += end - vs->dp.t0;
    e->dpr.hidden += (end < tw ? end : tw) - vs->dp.t0;
    e->dpr.n++;
    for (int k = 0; k < DP_NB; k++)
      if (active(&vs->dp.b[k])) LP_CHECK(unpack_grads(vs, &vs->dp.b[k]));
    vs->dp.started = 0;
  }
  return LP_OK;
}

lp_status ex_dp_gather(lp_exec *e) {
  if (!e->dpr.on || !e->o.zero) return LP_OK;
  for (int li = 0; li < e->nloc; li++) {
    vst *vs = &e->vs[li];
    for (int k = 0; k < DP_NB; k++) {
      dp_bucket *b = &vs->dp.b[k];
      if (!active(b)) continue;
      char what[160];
      snprintf(what, sizeof what, "rank %d (DP rank %d of %d): all-gather of the %s parameters "
               "of stage %d (ZeRO-1)", e->rank, e->dp_rank, e->dp, bucket_name[k], vs->id);
      double t0 = lp_now();
      lp_status st = lp_comm_allgather_float(b->comm, b->wv->data, b->pack, b->shard, what);
      double t1 = lp_now();
      ex_time_wait(e, t1 - t0);
      if (st != LP_OK) return ex_comm_fail(e, b->comm, st, what);
      e->dpr.s += t1 - t0;
      e->dpr.link += lp_link_allreduce_time(lp_comm_link(b->comm), lp_comm_size(b->comm),
                                            4.0 * (double)b->n) / 2;
      LP_CHECK(unpack(vs, b, b->pack));
    }
  }
  return LP_OK;
}

lp_status ex_dp_zero_grad(lp_exec *e, vst *vs) {
  if (!e->dpr.on || !e->o.zero) return LP_OK;
  const lp_nn_param *p = lp_nn_params(vs->chunk, &(size_t){0});
  for (int k = 0; k < DP_NB; k++) {
    dp_bucket *b = &vs->dp.b[k];
    if (!active(b)) continue;
    for (size_t j = 0; j < b->np; j++) LP_CHECK(lp_tensor_fill(p[b->idx[j]].grad, 0.0f));
  }
  return LP_OK;
}

lp_status ex_dp_shard_sumsq(lp_exec *e, vst *vs, char *counts, double *out) {
  *out = 0;
  if (!e->dpr.on || !e->o.zero) return LP_OK;
  double sum = 0;
  for (int k = 0; k < DP_NB; k++) {
    dp_bucket *b = &vs->dp.b[k];
    if (!active(b)) continue;
    const float *g = b->wg->data;
    size_t hi = b->lo + b->shard;
    for (size_t j = 0; j < b->np; j++) {
      size_t i = b->idx[j], a = b->off[j];
      size_t z = j + 1 < b->np ? b->off[j + 1] : b->n;
      int c = counts[i];
      counts[i] = 2;
      if (!c) continue;
      /* its floats [a, z) inside this rank's shard [lo, hi) */
      for (size_t x = a > b->lo ? a : b->lo; x < z && x < hi; x++)
        sum += (double)g[x - b->lo] * (double)g[x - b->lo];
    }
  }
  *out = sum;
  return LP_OK;
}

lp_status ex_dp_shard_scale(lp_exec *e, vst *vs, float coef) {
  if (!e->dpr.on || !e->o.zero) return LP_OK;
  for (int k = 0; k < DP_NB; k++)
    if (active(&vs->dp.b[k])) LP_CHECK(lp_tensor_scale(vs->dp.b[k].wg, coef));
  return LP_OK;
}

void ex_dp_drop(lp_exec *e) {
  for (int li = 0; li < e->nloc; li++) {
    vst *vs = &e->vs[li];
    for (int k = 0; k < DP_NB; k++)
      if (vs->dp.b[k].req)
        for (int j = 0; j < vs->dp.ng; j++) lp_comm_cancel(vs->dp.b[k].comm, &vs->dp.b[k].req[j]);
    vs->dp.started = 0;
  }
}

void ex_dp_reset(lp_exec *e) {
  for (int li = 0; li < e->nloc; li++) e->vs[li].dp.started = 0;
}

int lp_exec_dp(const lp_exec *e, int *dp_rank) {
  if (dp_rank) *dp_rank = e->dp_rank;
  return e->dp;
}

size_t lp_exec_optim_bytes(const lp_exec *e) {
  size_t n = 0;
  for (int li = 0; li < e->nloc; li++) n += lp_nn_optim_state_numel(e->vs[li].optim);
  return n * sizeof(float);
}

void lp_exec_dp_timing_of(const lp_exec *e, lp_exec_dp_timing *out) {
  *out = (lp_exec_dp_timing){e->dpr.n, e->dpr.s, e->dpr.hidden, e->dpr.link};
}

lp_status lp_exec_dp_stats_of(lp_exec *e, lp_exec_dp_stats *out) {
  double v[5] = {(double)lp_exec_optim_bytes(e), (double)e->dpr.n, e->dpr.s, e->dpr.hidden,
                 e->dpr.link};
  lp_status st = lp_comm_allreduce_sum_double(e->world, v, 5, "the data-parallel summary");
  if (st != LP_OK) {
    lp_errf(e->err, "%s", lp_comm_last_error(e->world));
    return st;
  }
  int W = lp_comm_size(e->world);
  *out = (lp_exec_dp_stats){e->dp, e->ep, e->o.zero, v[0] / W,
                            {(int64_t)(v[1] / W + 0.5), v[2] / W, v[3] / W, v[4] / W}};
  return LP_OK;
}
