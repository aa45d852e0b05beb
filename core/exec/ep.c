/* ep.c — the pipeline x expert grid: splitting the job's comm, the MoE
 * layers' all-to-all-v over the EP group (lp_nn_ep over lp_comm_ialltoallv,
 * timed for the summary and traced on the comm track), each EP rank's share
 * of a micro-batch, and the step-end sums: dense grads over the EP group,
 * replicated experts' grads over their holders, expert loads over every
 * rank holding a stage (router bias). It owns the grid (set at
 * construction), e->xc (ex_xchg: the exchanges in flight and the step's
 * all-to-all accounting, in one place) and e->moe (ex_moe: the device
 * contexts, the lp_nn_ep, the expert-load sums). A bf16 model's token
 * rows on the host travel as bf16 bits (a2a_pack): what they carry is
 * bf16 already, or only ever enters a bf16 GEMM (lossless). */
#include "exec_internal.h"
#include "lp_comm_gpu.h"

#include <stdio.h>
#include <string.h>

lp_status ex_grid_new(lp_exec *e) {
  int W = lp_comm_size(e->world), E = e->ep < 1 ? 1 : e->ep, D = e->dp < 1 ? E : e->dp;
  e->rank = lp_comm_rank(e->world);
  e->ep = E;
  e->dp = D;
  if (D % E != 0) {
    lp_errf(e->err, "ep = %d does not divide dp = %d (each EP group is ep of a stage's dp ranks)",
            E, D);
    return LP_ERR_ARG;
  }
  if (D <= 1) {
    e->ep_rank = e->dp_rank = 0;
    e->comm = e->world;
    e->prank = e->rank;
    return LP_OK;
  }
  if (W % D != 0) {
    if (D == E)
      lp_errf(e->err, "ep = %d does not divide the %d rank%s mpirun started (pp x ep ranks are "
              "needed)", E, W, LP_PLURAL(W));
    else
      lp_errf(e->err, "dp = %d does not divide the %d rank%s mpirun started (pp x dp ranks are "
              "needed)", D, W, LP_PLURAL(W));
    return LP_ERR_ARG;
  }
  /* rank = p * dp + d; EP index d % ep, EP group d / ep */
  int p = e->rank / D, d = e->rank % D, G = D / E, g = d / E;
  e->dp_rank = d;
  e->ep_rank = d % E;
  lp_status st = lp_comm_split(e->world, d, p, &e->pp_own);
  if (st == LP_OK && E > 1) st = lp_comm_split(e->world, p * G + g, e->ep_rank, &e->ep_comm);
  /* backward halves exchange over a context of their own, so an
   * overlapped pair can run whichever half's exchange finished first (each
   * context still sees one order of exchanges on every rank: its half's) */
  if (st == LP_OK && E > 1 && lp_comm_any_order(e->ep_comm))
    st = lp_comm_split(e->world, p * G + g, e->ep_rank, &e->ep_comm_b);
  /* the DP group (dense sums); the expert-DP group (experts' sums) */
  if (st == LP_OK && G > 1) st = lp_comm_split(e->world, p, d, &e->dp_own);
  if (st == LP_OK && G > 1 && E > 1)
    st = lp_comm_split(e->world, p * E + e->ep_rank, g, &e->xdp_own);
  if (st != LP_OK) {
    lp_errf(e->err, "rank %d: forming the pp x dp grid: %s", e->rank,
            lp_comm_last_error(e->world));
    return st;
  }
  e->dp_comm = G > 1 ? e->dp_own : e->ep_comm;
  e->xdp_comm = G == 1 ? NULL : E > 1 ? e->xdp_own : e->dp_comm;
  e->comm = e->pp_own;
  e->prank = lp_comm_rank(e->comm);
  return LP_OK;
}

lp_status ex_ep_device_new(lp_exec *e) {
  if (e->ep <= 1 || e->be->host_accessible) return LP_OK;
  int own = 0;
  lp_status st = lp_comm_for_backend(e->ep_comm, e->be, &e->moe.dcomm, &own);
  if (st == LP_OK && !own) e->moe.dcomm = NULL; /* (a host backend: not here) */
  if (st == LP_OK && e->ep_comm_b && e->moe.dcomm) {
    if (lp_comm_any_order(e->moe.dcomm)) {
      st = lp_comm_for_backend(e->ep_comm_b, e->be, &e->moe.dcomm_b, &own);
      if (st == LP_OK && !own) e->moe.dcomm_b = NULL;
    } else { /* one order on every rank: the fixed alternation (run_fb_fixed) */
      lp_comm_free(e->ep_comm_b);
      e->ep_comm_b = NULL;
    }
  }
  if (st != LP_OK)
    lp_errf(e->err, "rank %d: the EP group's context for tensors on %s: %s", e->rank, e->be->name,
            lp_comm_last_error(e->ep_comm));
  return st;
}

void ex_grid_free(lp_exec *e) {
  lp_comm_free(e->moe.dcomm_b);
  lp_comm_free(e->moe.dcomm);
  e->moe.dcomm = e->moe.dcomm_b = NULL;
  lp_comm_free(e->ep_comm_b);
  lp_comm_free(e->ep_comm);
  lp_comm_free(e->pp_own);
  lp_comm_free(e->xdp_own);
  lp_comm_free(e->dp_own);
  e->ep_comm = e->pp_own = e->ep_comm_b = NULL;
  e->dp_comm = e->xdp_comm = e->dp_own = e->xdp_own = NULL;
  lp_free(e->moe.counts);
  lp_free(e->moe.off);
  lp_free(e->moe.experts);
  e->moe.counts = NULL;
  e->moe.off = NULL;
  e->moe.experts = NULL;
}

int ex_world(const lp_exec *e, int p) { return p * e->dp + e->dp_rank; }

/* ---- the EP exchange ---- */

static void a2a_free(a2a *h) {
  lp_free(h->displs);
  lp_free(h->wsend);
  lp_free(h->wrecv);
  lp_free(h->counts);
  lp_free(h);
}

/* bf16 rows: packs send (pieces of send_counts[r] floats, in rank order)
 * into h->wsend as bf16 bits, (c + 1) / 2 floats a piece, and makes
 * h->wrecv for the pieces that arrive; *sc / *rc become the packed counts
 * (h->counts holds the caller's counts, then the packed ones). */
static lp_status a2a_pack(lp_exec *e, a2a *h, const float *send, const size_t *send_counts,
                          float *recv, const size_t *recv_counts, const size_t **sc,
                          const size_t **rc) {
  int E = e->ep;
  h->counts = lp_malloc(4 * (size_t)E * sizeof *h->counts);
  if (!h->counts) return LP_ERR_NOMEM;
  size_t sw = 0, rw = 0;
  for (int r = 0; r < E; r++) {
    h->counts[r] = send_counts[r];
    h->counts[E + r] = recv_counts[r];
    h->counts[2 * E + r] = (send_counts[r] + 1) / 2;
    h->counts[3 * E + r] = (recv_counts[r] + 1) / 2;
    sw += h->counts[2 * E + r];
    rw += h->counts[3 * E + r];
  }
  h->wsend = lp_malloc(sw * sizeof(float) + 1);
  h->wrecv = lp_malloc(rw * sizeof(float) + 1);
  if (!h->wsend || !h->wrecv) return LP_ERR_NOMEM;
  size_t so = 0, wo = 0;
  for (int r = 0; r < E; r++) {
    uint16_t *w = (uint16_t *)(void *)(h->wsend + wo);
    lp_tensor_bf16_pack(send + so, send_counts[r], w);
    if (send_counts[r] % 2) w[send_counts[r]] = 0;
    so += send_counts[r];
    wo += h->counts[2 * E + r];
  }
  h->recv = recv;
  *sc = h->counts + 2 * E;
  *rc = h->counts + 3 * E;
  return LP_OK;
}

/* The packed pieces that arrived, into the caller's receive buffer. */
static void a2a_unpack(const lp_exec *e, a2a *h) {
  int E = e->ep;
  size_t ro = 0, wo = 0;
  for (int r = 0; r < E; r++) {
    lp_tensor_bf16_unpack((const uint16_t *)(const void *)(h->wrecv + wo), h->counts[E + r],
                          h->recv + ro);
    ro += h->counts[E + r];
    wo += h->counts[3 * E + r];
  }
}

static lp_status ep_start(void *ud, const lp_nn_xinfo *xi, const float *send,
                          const size_t *send_counts, float *recv, const size_t *recv_counts,
                          void **handle) {
  lp_exec *e = ud;
  int E = e->ep;
  a2a *h = lp_calloc(1, sizeof *h);
  if (!h) return LP_ERR_NOMEM;
  h->displs = lp_malloc(2 * (size_t)E * sizeof *h->displs);
  if (!h->displs) {
    lp_free(h);
    return LP_ERR_NOMEM;
  }
  /* bf16 token rows on the host: as bf16 bits (not the count exchange) */
  if (e->msg.bf16 && !xi->be && xi->kind != LP_NN_X_DISPATCH_COUNT) {
    lp_status pst = a2a_pack(e, h, send, send_counts, recv, recv_counts, &send_counts,
                             &recv_counts);
    if (pst != LP_OK) {
      a2a_free(h);
      return pst;
    }
    send = h->wsend;
    recv = h->wrecv;
  }
  size_t so = 0, ro = 0, out = 0, in = 0;
  for (int r = 0; r < E; r++) {
    h->displs[r] = so;
    h->displs[E + r] = ro;
    so += send_counts[r];
    ro += recv_counts[r];
    if (r != e->ep_rank) {
      out += send_counts[r];
      in += recv_counts[r];
    }
  }
  /* whose exchange: the tag f_begin / b_begin gave the pass (its half) */
  const half *hf = xi->tag;
  h->half = hf == &e->pr.hf[1];
  h->kind = xi->kind;
  h->layer = xi->layer;
  h->v = hf && hf->active ? hf->v : -1;
  h->mb = hf && hf->active ? hf->mb : -1;
  h->comm = h->half && e->ep_comm_b ? e->ep_comm_b : e->ep_comm;
  if (xi->be && !xi->be->host_accessible) /* device rows: the context for them */
    h->comm = h->half && e->moe.dcomm_b ? e->moe.dcomm_b : e->moe.dcomm;
  h->modelled = lp_link_alltoallv_time(lp_comm_link(h->comm), 4.0 * (double)out,
                                       4.0 * (double)in);
  double *x = ex_half_x(e, h->half);
  if (x) {
    x[EX_X_N] += 1;
    x[EX_X_OUT] += 4.0 * (double)out;
    x[EX_X_IN] += 4.0 * (double)in;
    x[EX_X_MAX] += 4.0 * (double)(out > in ? out : in);
  }
  e->xc.bytes += 4.0 * (double)out;
  h->start = lp_now();
  h->blocked0 = e->xc.blocked + e->tm.wait;
  lp_status st = lp_comm_ialltoallv(h->comm, send, send_counts, h->displs, recv, recv_counts,
                                    h->displs + E, &h->req);
  if (st != LP_OK) {
    lp_errf(e->err, "rank %d: starting an all-to-all-v of the EP group: %s", e->rank,
            lp_comm_last_error(h->comm));
    a2a_free(h);
    return st;
  }
  e->xc.half_x[h->half] = h;
  *handle = h;
  return LP_OK;
}

void ex_xchg_reset(lp_exec *e) {
  e->xc.s = e->xc.blocked = e->xc.hidden = e->xc.link = e->xc.bytes = 0;
  e->xc.n = 0;
}

lp_status ex_half_ready(lp_exec *e, int which, int waiting, int *ready) {
  a2a *h = e->xc.half_x[which];
  *ready = 1;
  if (!h || h->done_at > 0) return LP_OK;
  int done = 0;
  lp_status st = lp_comm_test(h->comm, &h->req, &done);
  if (st != LP_OK) {
    char what[128];
    snprintf(what, sizeof what, "rank %d (EP rank %d of %d): an MoE exchange of the %s half",
             e->rank, e->ep_rank, e->ep, which ? "backward" : "forward");
    return ex_comm_fail(e, h->comm, st, what);
  }
  *ready = done;
  if (done) {
    h->done_at = lp_now();
    h->found_waiting = waiting;
  }
  return LP_OK;
}

void ex_a2a_blocked(lp_exec *e, double t0, double t1) {
  e->xc.blocked += t1 - t0;
  double *x = ex_action_x(e);
  if (x) x[EX_X_BLOCKED] += t1 - t0;
  ex_trace_add(e, LP_TRACE_SEND, "all-to-all wait: both halves", "a2a", t0, t1, -1, -1, e->cur,
               -1, -1);
}

static lp_status ep_wait(void *ud, void *handle) {
  lp_exec *e = ud;
  a2a *h = handle;
  const char *k = lp_nn_xkind_text(h->kind);
  char w[256];
  snprintf(w, sizeof w, "rank %d (EP rank %d of %d): moe %s %s", e->rank, e->ep_rank, e->ep,
           h->layer ? h->layer : "?", k);
  if (e->xc.half_x[h->half] == h) e->xc.half_x[h->half] = NULL;
  if (e->fail.st) { /* a communication failed before: drop, do not wait */
    lp_comm_cancel(h->comm, &h->req); /* (backends copy the counts and
                                       * displacements at the start) */
    a2a_free(h);
    return e->fail.st;
  }
  double tw = lp_now();
  int ready = 0; /* finished while this rank computed? */
  lp_status st = lp_comm_test(h->comm, &h->req, &ready);
  if (st == LP_OK && !ready) st = lp_comm_wait(h->comm, &h->req, w);
  double t1 = lp_now();
  if (st != LP_OK) {
    ex_comm_fail(e, h->comm, st, w);
    lp_comm_cancel(h->comm, &h->req);
    a2a_free(h);
    return st;
  }
  if (h->wrecv) a2a_unpack(e, h);
  /* found finished by an overlapped pair's poll (ex_half_ready): while the
   * rank waited for both halves, it ended then (that wait is already
   * counted as blocked); after compute, like any exchange found done */
  if (h->done_at > 0) {
    tw = t1 = h->done_at;
    ready = !h->found_waiting;
  }
  /* its time: from the start to its completion, which is the end of the
   * wait when it had to be waited for; when it was already done, some
   * time before, estimated by the link model (capped at the wait's start).
   * Hidden: the part of it before the wait that the rank did not spend
   * blocked on something else (the other half's exchange of an overlapped
   * pair, a message): that time is exposed once, on what it waited for.
   * The blocked part stays in its action's time: what an action costs
   * includes the all-to-all it could not hide (the simulator's costs). */
  double blocked = ready ? 0 : t1 - tw;
  double before = tw - h->start;
  double took = ready ? (h->modelled < before ? h->modelled : before) : t1 - h->start;
  double free = before - (e->xc.blocked + e->tm.wait - h->blocked0);
  double hidden = free < 0 ? 0 : free > took - blocked ? took - blocked : free;
  e->xc.s += took;
  e->xc.blocked += blocked;
  double *x = ex_action_x(e);
  if (x) x[EX_X_BLOCKED] += blocked;
  e->xc.hidden += hidden;
  e->xc.link += h->modelled;
  e->xc.n++;
  /* the slice is the exchange's time as counted above (found done: the
   * link model's estimate), so that a profile of the trace reads the same
   * hidden share (luapipe profile) */
  ex_trace_add(e, LP_TRACE_SEND, "all-to-all", "a2a", h->start, h->start + took, h->v, h->mb,
               e->cur, -1, -1);
  /* the part this rank sat blocked in the wait (the exposed time), named
   * by the exchange's kind ("dispatch count", "combine backward", ...) */
  if (blocked > 0) {
    char name[64];
    snprintf(name, sizeof name, "all-to-all wait: %s", k);
    ex_trace_add(e, LP_TRACE_SEND, name, "a2a", tw, t1, h->v, h->mb, e->cur, -1, -1);
  }
  a2a_free(h);
  return st;
}

lp_status ex_ep_attach(lp_exec *e, vst *vs) {
  if (e->ep <= 1 || lp_nn_moe_count(vs->chunk) == 0) return LP_OK;
  e->moe.nnep = (lp_nn_ep){e->ep, e->ep_rank, e, ep_start, ep_wait};
  lp_status st = lp_nn_set_ep(vs->chunk, &e->moe.nnep);
  if (st != LP_OK)
    lp_errf(e->err, "rank %d: giving model stage %d the EP group of %d ranks failed (%s)",
            e->rank, vs->stage, e->ep, lp_strerror(st));
  return st;
}

lp_status ex_shard(lp_exec *e, lp_tensor **t, const char *what, int mb) {
  if (e->dp <= 1) return LP_OK;
  int64_t rows = (*t)->ndim > 0 ? (*t)->shape[0] : 1;
  if ((*t)->ndim < 1 || rows % e->dp != 0) {
    if (e->dp == e->ep)
      lp_errf(e->err, "rank %d: the %s of micro-batch %d has %lld rows (dim 1), which the %d EP "
              "ranks cannot share evenly: make the micro-batch size a multiple of ep",
              e->rank, what, mb, (long long)rows, e->ep);
    else
      lp_errf(e->err, "rank %d: the %s of micro-batch %d has %lld rows (dim 1), which the %d DP "
              "ranks cannot share evenly: make the micro-batch size a multiple of dp",
              e->rank, what, mb, (long long)rows, e->dp);
    return LP_ERR_ARG;
  }
  int64_t n = rows / e->dp;
  lp_tensor *part = NULL;
  lp_status st = lp_tensor_rows(*t, n * e->dp_rank, n, &part);
  if (st != LP_OK) return st;
  lp_tensor_free(*t);
  *t = part;
  return LP_OK;
}

/* ---- step end ---- */

/* roles[i] of chunk's params (lp_nn_param_roles) into *r (grown to n). */
static lp_status roles_of(lp_nn_layer *chunk, size_t n, lp_nn_param_role **r, size_t *cap) {
  if (n > *cap) {
    lp_nn_param_role *nr = lp_realloc(*r, n * sizeof *nr);
    if (!nr) return LP_ERR_NOMEM;
    *r = nr;
    *cap = n;
  }
  return n ? lp_nn_param_roles(chunk, *r, n) : LP_OK;
}

/* Sums the replicas of every logical expert of moe over the EP group: each
 * holder adds its slots into rows by logical expert, one all-reduce, each
 * slot takes its expert's row back. Nothing to do without replicas. */
static lp_status reduce_replicas(lp_exec *e, lp_nn_layer *moe) {
  const lp_nn_moe_opts *o = lp_nn_moe_get_opts(moe);
  int spr = lp_nn_moe_slots_per_rank(moe), E = o->experts, nslots = spr * e->ep;
  int *p2l = lp_malloc((size_t)nslots * sizeof *p2l);
  int *reps = lp_calloc((size_t)E, sizeof *reps);
  float *rows = NULL, *g = NULL;
  lp_status st = LP_OK;
  if (!p2l || !reps) { st = LP_ERR_NOMEM; goto done; }
  LP_CHECK_GOTO(lp_nn_moe_placement(moe, p2l), st, done);
  int any = 0;
  for (int s = 0; s < nslots; s++)
    if (++reps[p2l[s]] > 1) any = 1;
  if (!any) goto done;
  const lp_nn_param *sp;
  int np;
  LP_CHECK_GOTO(lp_nn_moe_slot_params(moe, e->ep_rank * spr, &sp, &np), st, done);
  size_t q = 0;
  for (int j = 0; j < np; j++) q += (size_t)lp_tensor_numel(sp[j].grad);
  /* the grads come to the host with lp_tensor_read (they may live on a
   * device), are summed there, and go back with lp_tensor_write */
  rows = lp_calloc((size_t)E * q, sizeof *rows);
  g = lp_malloc((q ? q : 1) * sizeof *g);
  if (!rows || !g) { st = LP_ERR_NOMEM; goto done; }
  for (int s = e->ep_rank * spr; s < (e->ep_rank + 1) * spr; s++) {
    LP_CHECK_GOTO(lp_nn_moe_slot_params(moe, s, &sp, &np), st, done);
    float *row = rows + (size_t)p2l[s] * q;
    for (int j = 0; j < np; j++) {
      size_t c = (size_t)lp_tensor_numel(sp[j].grad);
      LP_CHECK_GOTO(lp_tensor_read(sp[j].grad, g), st, done);
      for (size_t i = 0; i < c; i++) row[i] += g[i];
      row += c;
    }
  }
  if (e->ep > 1) {
    char what[128];
    snprintf(what, sizeof what, "rank %d (EP rank %d of %d): summing replicated experts' gradients",
             e->rank, e->ep_rank, e->ep);
    st = lp_comm_allreduce_sum_float(e->ep_comm, rows, (size_t)E * q, what);
    if (st != LP_OK) {
      ex_comm_fail(e, e->ep_comm, st, what);
      goto done;
    }
  }
  for (int s = e->ep_rank * spr; s < (e->ep_rank + 1) * spr; s++) {
    LP_CHECK_GOTO(lp_nn_moe_slot_params(moe, s, &sp, &np), st, done);
    const float *row = rows + (size_t)p2l[s] * q;
    for (int j = 0; j < np; j++) {
      LP_CHECK_GOTO(lp_tensor_write(sp[j].grad, row), st, done);
      row += (size_t)lp_tensor_numel(sp[j].grad);
    }
  }
done:
  lp_free(p2l);
  lp_free(reps);
  lp_free(rows);
  lp_free(g);
  return st;
}

/* Dense grads (everything but routed experts' slots) summed over the EP
 * group (none without EP) when the EP group is the DP group (dp = ep,
 * without ZeRO-1): one all-reduce at the step's end, as before data
 * parallelism; otherwise dp.c's buckets sum them. */
static lp_status reduce_dense(lp_exec *e) {
  if (e->ep <= 1 || e->dpr.on) return LP_OK; /* dp.c sums them over the DP group */
  lp_nn_param_role *roles = NULL;
  size_t cap = 0, n = 0;
  float *buf = NULL;
  lp_status st = LP_OK;
  for (int pass = 0; pass < 3 && st == LP_OK; pass++) { /* 0: size, 1: pack, 2: unpack */
    if (pass == 1) {
      buf = lp_malloc((n ? n : 1) * sizeof *buf);
      if (!buf) { st = LP_ERR_NOMEM; break; }
    }
    if (pass == 2) {
      double tw = lp_now();
      char what[128];
      snprintf(what, sizeof what, "rank %d (EP rank %d of %d): summing dense gradients over the EP "
               "group", e->rank, e->ep_rank, e->ep);
      st = lp_comm_allreduce_sum_float(e->ep_comm, buf, n, what);
      ex_time_wait(e, lp_now() - tw);
      if (st != LP_OK) {
        ex_comm_fail(e, e->ep_comm, st, what);
        break;
      }
    }
    size_t off = 0;
    for (int li = 0; li < e->nloc && st == LP_OK; li++) {
      size_t np;
      const lp_nn_param *p = lp_nn_params(e->vs[li].chunk, &np);
      if ((st = roles_of(e->vs[li].chunk, np, &roles, &cap)) != LP_OK) break;
      for (size_t i = 0; i < np; i++) {
        if (roles[i].slot >= 0) continue;
        size_t c = (size_t)lp_tensor_numel(p[i].grad);
        if (pass == 1 && (st = lp_tensor_read(p[i].grad, buf + off)) != LP_OK) break;
        if (pass == 2 && (st = lp_tensor_write(p[i].grad, buf + off)) != LP_OK) break;
        off += c;
      }
    }
    if (pass == 0) n = off;
  }
  lp_free(buf);
  lp_free(roles);
  return st;
}

lp_status ex_ep_reduce(lp_exec *e) {
  LP_CHECK(reduce_dense(e));
  /* replicas (also two slots of one expert on this rank, even without EP) */
  for (int li = 0; li < e->nloc; li++) {
    int nm = lp_nn_moe_count(e->vs[li].chunk);
    for (int i = 0; i < nm; i++) LP_CHECK(reduce_replicas(e, lp_nn_moe_find(e->vs[li].chunk, i)));
  }
  return LP_OK;
}

/* Floats of model stage s's expert loads (its MoE layers' expert counts)
 * times the copies of s this rank holds (0 when none): every copy counts
 * once in the caller's division by copies x EP ranks. */
static size_t stage_loads(const lp_exec *e, int s) {
  size_t n = 0;
  for (int li = 0; li < e->nloc; li++) {
    if (e->vs[li].stage != s) continue;
    int nm = lp_nn_moe_count(e->vs[li].chunk);
    for (int i = 0; i < nm; i++)
      n += (size_t)lp_nn_moe_get_opts(lp_nn_moe_find(e->vs[li].chunk, i))->experts;
  }
  return n;
}

/* Experts per MoE layer of stage s (all equal; 0: none) times the copies
 * of s this rank holds. */
static int stage_experts(const lp_exec *e, int s) {
  int n = 0;
  for (int li = 0; li < e->nloc; li++)
    if (e->vs[li].stage == s && lp_nn_moe_count(e->vs[li].chunk) > 0)
      n += lp_nn_moe_get_opts(lp_nn_moe_find(e->vs[li].chunk, 0))->experts;
  return n;
}

lp_status ex_moe_loads_new(lp_exec *e) {
  /* every rank learns every stage's size and experts per layer: holders
   * write theirs, the sum is divided by the holder count (copies x DP
   * ranks) */
  double *sz = lp_calloc(2 * (size_t)e->S, sizeof *sz);
  e->moe.off = lp_calloc((size_t)e->S + 1, sizeof *e->moe.off);
  if (!sz || !e->moe.off) {
    lp_free(sz);
    return LP_ERR_NOMEM;
  }
  for (int s = 0; s < e->S; s++) {
    sz[s] = (double)stage_loads(e, s);
    sz[e->S + s] = stage_experts(e, s);
  }
  lp_status st = lp_comm_allreduce_sum_double(e->world, sz, 2 * (size_t)e->S,
                                              "lp_exec_new: sizing the expert-load sums");
  if (st != LP_OK) {
    lp_free(sz);
    lp_errf(e->err, "%s", lp_comm_last_error(e->world));
    return st;
  }
  size_t tot = 0;
  e->moe.layers = 0;
  for (int s = 0; s < e->S; s++) {
    int copies = 0;
    for (int v = 0; v < e->V; v++) copies += e->vstage[v] == s;
    e->moe.off[s] = tot;
    size_t n = (size_t)(sz[s] / (copies * e->dp) + 0.5);
    int ex = (int)(sz[e->S + s] / (copies * e->dp) + 0.5);
    tot += n;
    if (ex > 0) e->moe.layers += (int)(n / (size_t)ex);
  }
  e->moe.off[e->S] = tot;
  e->moe.experts = lp_calloc((size_t)(e->moe.layers ? e->moe.layers : 1), sizeof(int));
  if (!e->moe.experts) {
    lp_free(sz);
    return LP_ERR_NOMEM;
  }
  for (int s = 0, l = 0; s < e->S; s++) {
    int copies = 0;
    for (int v = 0; v < e->V; v++) copies += e->vstage[v] == s;
    int ex = (int)(sz[e->S + s] / (copies * e->dp) + 0.5);
    if (ex <= 0) continue;
    for (size_t k = 0; k < (e->moe.off[s + 1] - e->moe.off[s]) / (size_t)ex; k++)
      e->moe.experts[l++] = ex;
  }
  lp_free(sz);
  e->moe.total = tot;
  if (tot) {
    e->moe.counts = lp_calloc(tot, sizeof *e->moe.counts);
    if (!e->moe.counts) return LP_ERR_NOMEM;
  }
  return LP_OK;
}

/* Calls fn on every MoE layer of this rank's stages in order, with the
 * layer's E expert counts in e->moe.counts and a scratch of E int64s. */
typedef lp_status (*moe_layer_fn)(lp_nn_layer *m, size_t E, double *counts, int64_t *scratch);

static lp_status moe_each(lp_exec *e, moe_layer_fn fn) {
  int64_t *c = NULL;
  size_t cap = 0;
  lp_status st = LP_OK;
  for (int li = 0; li < e->nloc; li++) {
    vst *vs = &e->vs[li];
    size_t off = e->moe.off[vs->stage];
    int nm = lp_nn_moe_count(vs->chunk);
    for (int i = 0; i < nm; i++) {
      lp_nn_layer *m = lp_nn_moe_find(vs->chunk, i);
      size_t E = (size_t)lp_nn_moe_get_opts(m)->experts;
      if (E > cap) {
        int64_t *nc = lp_realloc(c, E * sizeof *c);
        if (!nc) { st = LP_ERR_NOMEM; goto done; }
        c = nc;
        cap = E;
      }
      LP_CHECK_GOTO(fn(m, E, e->moe.counts + off, c), st, done);
      off += E;
    }
  }
done:
  lp_free(c);
  return st;
}

static lp_status add_load(lp_nn_layer *m, size_t E, double *counts, int64_t *c) {
  LP_CHECK(lp_nn_moe_expert_load(m, c));
  for (size_t x = 0; x < E; x++) counts[x] += (double)c[x];
  return LP_OK;
}

lp_status ex_moe_loads_sum(lp_exec *e) {
  if (!e->moe.total) return LP_OK;
  memset(e->moe.counts, 0, e->moe.total * sizeof *e->moe.counts);
  LP_CHECK(moe_each(e, add_load));
  char what[96];
  snprintf(what, sizeof what, "rank %d: summing expert loads at the end of a step", e->rank);
  lp_status st = lp_comm_allreduce_sum_double(e->world, e->moe.counts, e->moe.total, what);
  if (st != LP_OK) ex_comm_fail(e, e->world, st, what);
  return st;
}

static lp_status update_bias(lp_nn_layer *m, size_t E, double *counts, int64_t *c) {
  for (size_t x = 0; x < E; x++) c[x] = (int64_t)(counts[x] + 0.5);
  LP_CHECK(lp_nn_moe_update_bias(m, c));
  lp_nn_moe_load_reset(m);
  return LP_OK;
}

lp_status ex_moe_bias_update(lp_exec *e) {
  if (!e->moe.total) return LP_OK;
  return moe_each(e, update_bias);
}

lp_status lp_exec_expert_loads(const lp_exec *e, int *layers, const int **experts,
                               const double **counts) {
  *layers = e->moe.layers;
  *experts = e->moe.experts;
  *counts = e->moe.total ? e->moe.counts : NULL;
  return LP_OK;
}
