/* exec.c — the per-rank executor of a lowered schedule (see lp_exec.h).
 *
 * State per (local virtual stage, micro-batch) lives in a slot: the nn
 * context, the forward input and backward input once they are available
 * (same-rank handoff, a finished receive, the data source or the loss), the
 * pending receive buffers, and the outputs waiting for their SEND action.
 * Message tags are (kind * V + consumer vstage) * M + mb with kinds F, B and
 * REDUCE, so every message of a step has its own tag per peer pair. */
#define _POSIX_C_SOURCE 200809L
#include "lp_exec.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { K_F = 0, K_B = 1, K_RED = 2, K__N = 3 };

/* pending sends kept before the step loop polls them (poll_sends); the
 * rest complete at the end of the step (wait_sends). Polling after every
 * action measured 3-18% of the char-LM step on 4 oversubscribed CPU ranks
 * (an unsuccessful MPI_Test yields the CPU there) and gained nothing: every
 * wait drives the comm library, and the receiver copies large messages
 * (single-copy shared memory). The limit only bounds the memory held. */
enum { SEND_BACKLOG = 64 };

typedef struct slot {
  lp_nn_ctx *ctx;
  lp_tensor *fin, *bin;   /* forward input / output-grad, ready */
  float *rbuf_f, *rbuf_b; /* receive buffers while a receive is pending */
  lp_comm_req *rreq_f, *rreq_b;
  lp_tensor *fout, *bout; /* outputs waiting for SEND_F / SEND_B */
} slot;

typedef struct vst {
  int id, stage;
  lp_nn_layer *chunk;
  lp_nn_optim *optim;
  slot *slots; /* [M] */
  int *wq;     /* FIFO of micro-batches waiting for W */
  int wq_head, wq_len;
  /* gradient reduction of a replicated stage */
  float *pack;           /* this copy's grads, flat */
  float **peer_pack;     /* [V]: received packs of remote copies */
  lp_comm_req **red_req; /* [2V]: sends then receives */
  int reduced;           /* reduction started this step */
} vst;

typedef struct pending_send {
  lp_comm_req *req;
  lp_tensor *t;  /* kept alive until the send completes */
  double posted; /* lp_now() of the isend */
  int v, mb, fwd, index; /* what it carries, for its trace slice */
} pending_send;

struct lp_exec {
  lp_schedule *s;
  lp_comm *comm;
  lp_exec_opts o;
  int rank, P, S, V, M;
  int nloc;
  vst *vs;      /* [nloc] */
  int *loc;     /* [V] -> local index or -1 */
  int *vrank;   /* [V] rank of each vstage */
  int *vstage;  /* [V] model stage of each vstage */
  int **kpos;   /* [nloc][M]: position of vstage in mb's route, -1 */
  const int **route;
  int *rlen;
  int64_t (*shape)[LP_TENSOR_MAXDIM]; /* [S] activation shape entering s */
  int *ndim;
  size_t *numel; /* [S] */
  const lp_action *acts;
  int nacts;
  int *compute_idx; /* indices of compute actions */
  int ncompute;
  int has_reduce;
  int posted; /* RECV actions with index < posted are posted */
  pending_send *ps;
  int nps, cps;
  int64_t step;
  int cur; /* index of the action running */
  double loss_sum;
  double t0, wall, busy;
  double waited; /* seconds the running action spent waiting for receives */
  lp_trace *trace;
  /* always-on timing: this step's parts, the last step, the totals, and
   * per (kind, model stage) action times [2][LP_EXEC_NKINDS][S] (0: this
   * step, 1: since the reset) */
  double t_wait, t_post, t_comp, t_optim;
  lp_exec_timing tlast, ttotal;
  double *act_s;
  int64_t *act_n;
  char err[LP_ERRLEN];
};

/* ---- small helpers ---- */

static int tag_of(const lp_exec *e, int kind, int v, int mb) {
  return (kind * e->V + v) * e->M + mb;
}

static const char *act_text(const lp_exec *e, int i, char *buf, size_t n) {
  if (i < 0 || i >= e->nacts) {
    snprintf(buf, n, "(end of step)");
  } else {
    lp_action_format(&e->acts[i], buf, n);
  }
  return buf;
}

static int trace_add(lp_exec *e, int kind, const char *name, const char *cat,
                     double start, double end, int v, int mb, int index) {
  if (!e->trace) return -1;
  lp_trace_event ev;
  lp_trace_event_init(&ev);
  ev.rank = e->rank;
  ev.kind = kind;
  snprintf(ev.name, sizeof ev.name, "%s", name);
  snprintf(ev.cat, sizeof ev.cat, "%s", cat);
  ev.start_us = (start - e->t0) * 1e6;
  ev.dur_us = (end - start) * 1e6;
  ev.stage = v;
  ev.mb = mb;
  ev.index = index;
  if (index >= 0 && index < e->nacts)
    lp_action_format(&e->acts[index], ev.action, sizeof ev.action);
  int idx = -1;
  if (lp_trace_add_event(e->trace, &ev, &idx) != LP_OK) return -1;
  return idx;
}

/* Records the slice of a finished send: from its isend to `end` (when this
 * rank saw it complete), and releases what it kept alive. */
static void send_done(lp_exec *e, pending_send *p, double end) {
  if (e->trace) {
    char name[LP_TRACE_NAME_MAX];
    snprintf(name, sizeof name, "send %d%s%d", p->v, p->fwd ? "F" : "B", p->mb);
    trace_add(e, LP_TRACE_SEND, name, "comm", p->posted, end, p->v, p->mb, p->index);
  }
  lp_tensor_free(p->t);
  p->t = NULL;
}

/* Waits for *req under the watchdog; a timeout takes the job down. */
static lp_status wait_req(lp_exec *e, lp_comm_req **req, const char *what) {
  double tw = lp_now();
  lp_status st = lp_comm_wait(e->comm, req, what);
  e->t_wait += lp_now() - tw;
  if (st == LP_ERR_TIMEOUT) lp_comm_fatal(e->comm, lp_comm_last_error(e->comm));
  if (st != LP_OK)
    lp_errf(e->err, "rank %d: %s: %s", e->rank, what, lp_comm_last_error(e->comm));
  return st;
}

/* Drops finished sends (non-blocking), oldest first, stopping at the first
 * one still in flight: one test that finds nothing done costs a progress
 * call of the comm library (and, under MPI with more ranks than cores, a
 * yield of the CPU), so a poll makes at most one such call; the rest
 * complete at later polls or at the end of the step. */
static lp_status poll_sends(lp_exec *e) {
  int i = 0;
  for (; i < e->nps; i++) {
    pending_send *p = &e->ps[i];
    int done = 0;
    lp_status st = lp_comm_test(e->comm, &p->req, &done);
    if (st != LP_OK) {
      lp_errf(e->err, "rank %d: a send failed: %s", e->rank,
              lp_comm_last_error(e->comm));
      return st;
    }
    if (!done) break;
    send_done(e, p, lp_now());
  }
  if (i > 0) {
    memmove(e->ps, e->ps + i, (size_t)(e->nps - i) * sizeof *e->ps);
    e->nps -= i;
  }
  return LP_OK;
}

static lp_status push_send(lp_exec *e, const pending_send *ps) {
  if (e->nps == e->cps) {
    int nc = e->cps ? 2 * e->cps : 16;
    pending_send *np = lp_realloc(e->ps, (size_t)nc * sizeof *np);
    if (!np) return LP_ERR_NOMEM;
    e->ps = np;
    e->cps = nc;
  }
  e->ps[e->nps++] = *ps;
  return LP_OK;
}

static lp_status wait_sends(lp_exec *e) {
  for (int i = 0; i < e->nps; i++) {
    pending_send *p = &e->ps[i];
    char what[160];
    snprintf(what, sizeof what,
             "rank %d at the end of step %lld waits for its sends to complete",
             e->rank, (long long)e->step);
    LP_CHECK(wait_req(e, &p->req, what));
    send_done(e, p, lp_now());
  }
  e->nps = 0;
  return LP_OK;
}

/* ---- receives ---- */

static lp_status post_recv(lp_exec *e, const lp_action *a) {
  int v = a->stage, mb = a->mb, li = e->loc[v];
  if (li < 0) return LP_ERR_INTERNAL;
  int k = e->kpos[li][mb];
  if (k < 0) return LP_ERR_INTERNAL;
  slot *sl = &e->vs[li].slots[mb];
  int fwd = a->type == LP_ACT_RECV_F;
  int peer_v = e->route[mb][fwd ? k - 1 : k + 1];
  int st_in = fwd ? e->vstage[v] : e->vstage[peer_v]; /* shape index */
  size_t n = e->numel[st_in];
  float **buf = fwd ? &sl->rbuf_f : &sl->rbuf_b;
  lp_comm_req **req = fwd ? &sl->rreq_f : &sl->rreq_b;
  if (*req || *buf) {
    lp_errf(e->err, "rank %d: receive for %s of micro-batch %d on stage %d posted twice",
            e->rank, fwd ? "forward" : "backward", mb, v);
    return LP_ERR_INTERNAL;
  }
  *buf = lp_malloc((n ? n : 1) * sizeof(float));
  if (!*buf) return LP_ERR_NOMEM;
  lp_status st = lp_comm_irecv(e->comm, *buf, n, e->vrank[peer_v],
                               tag_of(e, fwd ? K_F : K_B, v, mb), req);
  if (st != LP_OK) {
    lp_errf(e->err, "rank %d: posting a receive: %s", e->rank,
            lp_comm_last_error(e->comm));
    lp_free(*buf);
    *buf = NULL;
  }
  return st;
}

/* Posts every RECV action before index `limit`. */
static lp_status post_upto(lp_exec *e, int limit) {
  if (limit > e->nacts) limit = e->nacts;
  for (; e->posted < limit; e->posted++) {
    const lp_action *a = &e->acts[e->posted];
    if (a->type == LP_ACT_RECV_F || a->type == LP_ACT_RECV_B)
      LP_CHECK(post_recv(e, a));
  }
  return LP_OK;
}

/* Completes the receive into *buf and turns it into a tensor of stage
 * `stin`'s activation shape. */
static lp_status finish_recv(lp_exec *e, int fwd, int v, int mb, int stin,
                             int peer, lp_tensor **out) {
  slot *sl = &e->vs[e->loc[v]].slots[mb];
  float **buf = fwd ? &sl->rbuf_f : &sl->rbuf_b;
  lp_comm_req **req = fwd ? &sl->rreq_f : &sl->rreq_b;
  char t[LP_ACTION_TEXT_MAX], what[256];
  if (!*buf) {
    lp_errf(e->err, "rank %d, action %d (%s): no receive was posted for its %s input",
            e->rank, e->cur, act_text(e, e->cur, t, sizeof t),
            fwd ? "forward" : "backward");
    return LP_ERR_INTERNAL;
  }
  snprintf(what, sizeof what, "rank %d, action %d (%s) waits for %s of micro-batch %d from rank %d",
           e->rank, e->cur, act_text(e, e->cur, t, sizeof t),
           fwd ? "RECV_F (activation)" : "RECV_B (gradient)", mb, peer);
  double t0 = lp_now();
  LP_CHECK(wait_req(e, req, what));
  double t1 = lp_now();
  e->waited += t1 - t0;
  char name[LP_TRACE_NAME_MAX];
  snprintf(name, sizeof name, "recv %d%s%d", v, fwd ? "F" : "B", mb);
  trace_add(e, LP_TRACE_RECV, name, "comm", t0, t1, v, mb, e->cur);
  lp_status st = lp_tensor_from_data(NULL, e->ndim[stin], e->shape[stin], *buf, out);
  lp_free(*buf);
  *buf = NULL;
  return st;
}

static lp_status do_send(lp_exec *e, const lp_action *a) {
  int v = a->stage, mb = a->mb, li = e->loc[v];
  int k = e->kpos[li][mb];
  slot *sl = &e->vs[li].slots[mb];
  int fwd = a->type == LP_ACT_SEND_F;
  lp_tensor **t = fwd ? &sl->fout : &sl->bout;
  char tx[LP_ACTION_TEXT_MAX];
  if (!*t) {
    lp_errf(e->err, "rank %d, action %d (%s): nothing to send", e->rank, e->cur,
            act_text(e, e->cur, tx, sizeof tx));
    return LP_ERR_INTERNAL;
  }
  int u = e->route[mb][fwd ? k + 1 : k - 1];
  lp_comm_req *req = NULL;
  lp_status st = lp_comm_isend(e->comm, (*t)->data, (size_t)lp_tensor_numel(*t),
                               e->vrank[u], tag_of(e, fwd ? K_F : K_B, u, mb), &req);
  if (st != LP_OK) {
    lp_errf(e->err, "rank %d, action %d (%s): %s", e->rank, e->cur,
            act_text(e, e->cur, tx, sizeof tx), lp_comm_last_error(e->comm));
    return st;
  }
  pending_send ps = {req, *t, lp_now(), v, mb, fwd, e->cur};
  st = push_send(e, &ps);
  if (st != LP_OK) {
    lp_comm_cancel(e->comm, &req);
    return st;
  }
  *t = NULL;
  return LP_OK;
}

/* ---- compute halves ---- */

static lp_status nnfail(lp_exec *e, slot *sl, const char *what, lp_status st) {
  char t[LP_ACTION_TEXT_MAX];
  lp_errf(e->err, "rank %d, action %d (%s): %s failed: %s", e->rank, e->cur,
          act_text(e, e->cur, t, sizeof t), what,
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
            e->rank, e->cur, act_text(e, e->cur, t, sizeof t), mb, (long long)e->step,
            *derr ? derr : lp_strerror(st));
    if (in) { lp_tensor_free(*in); *in = NULL; }
    if (tg) { lp_tensor_free(*tg); *tg = NULL; }
  }
  return st;
}

static lp_status run_f(lp_exec *e, int v, int mb) {
  int li = e->loc[v];
  vst *vs = &e->vs[li];
  int k = e->kpos[li][mb], last = e->rlen[mb] - 1;
  slot *sl = &vs->slots[mb];
  lp_tensor *x = NULL, *y = NULL, *tg = NULL, *dy = NULL;
  lp_status st = LP_OK;
  if (k == 0) {
    LP_CHECK(get_data(e, mb, &x, k == last ? &tg : NULL));
  } else if (e->vrank[e->route[mb][k - 1]] == e->rank) {
    x = sl->fin;
    sl->fin = NULL;
    if (!x) {
      lp_errf(e->err, "rank %d, action %d: forward input of micro-batch %d on stage %d is missing",
              e->rank, e->cur, mb, v);
      return LP_ERR_INTERNAL;
    }
  } else {
    int pv = e->route[mb][k - 1];
    LP_CHECK(finish_recv(e, 1, v, mb, e->vstage[v], e->vrank[pv], &x));
  }
  if (!sl->ctx) LP_CHECK_GOTO(lp_nn_ctx_new(&sl->ctx), st, out);
  st = lp_nn_forward(vs->chunk, sl->ctx, x, &y);
  if (st != LP_OK) { nnfail(e, sl, "forward", st); goto out; }
  if (k == last) {
    if (!tg) LP_CHECK_GOTO(get_data(e, mb, NULL, &tg), st, out);
    double l = 0;
    float scale = 1.0f / (float)e->M;
    st = e->o.loss == LP_EXEC_LOSS_CROSS_ENTROPY
             ? lp_nn_loss_cross_entropy(y, tg, scale, &l, &dy)
             : lp_nn_loss_mse(y, tg, scale, &l, &dy);
    if (st != LP_OK) {
      char t[LP_ACTION_TEXT_MAX];
      lp_errf(e->err, "rank %d, action %d (%s): loss of micro-batch %d failed (%s): "
              "check the target's shape against the model output",
              e->rank, e->cur, act_text(e, e->cur, t, sizeof t), mb, lp_strerror(st));
      goto out;
    }
    e->loss_sum += l;
    sl->bin = dy;
    dy = NULL;
  } else {
    int nv = e->route[mb][k + 1];
    if (e->vrank[nv] == e->rank) {
      e->vs[e->loc[nv]].slots[mb].fin = y;
    } else {
      sl->fout = y;
    }
    y = NULL;
  }
out:
  lp_tensor_free(x);
  lp_tensor_free(y);
  lp_tensor_free(tg);
  lp_tensor_free(dy);
  return st;
}

/* Full backward (full = 1) or input-grad only. */
static lp_status run_b(lp_exec *e, int v, int mb, int full) {
  int li = e->loc[v];
  vst *vs = &e->vs[li];
  int k = e->kpos[li][mb], last = e->rlen[mb] - 1;
  slot *sl = &vs->slots[mb];
  lp_tensor *dy = NULL, *dx = NULL;
  lp_status st = LP_OK;
  if (k == last || e->vrank[e->route[mb][k + 1]] == e->rank) {
    dy = sl->bin;
    sl->bin = NULL;
    if (!dy) {
      lp_errf(e->err, "rank %d, action %d: output gradient of micro-batch %d on stage %d is missing",
              e->rank, e->cur, mb, v);
      return LP_ERR_INTERNAL;
    }
  } else {
    int nv = e->route[mb][k + 1];
    LP_CHECK(finish_recv(e, 0, v, mb, e->vstage[nv], e->vrank[nv], &dy));
  }
  st = lp_nn_input_grad(vs->chunk, sl->ctx, dy, k > 0 ? &dx : NULL);
  if (st != LP_OK) { nnfail(e, sl, "input-grad", st); goto out; }
  if (full) {
    st = lp_nn_weight_grad(vs->chunk, sl->ctx, NULL);
    if (st != LP_OK) { nnfail(e, sl, "weight-grad", st); goto out; }
  } else {
    vs->wq[(vs->wq_head + vs->wq_len) % e->M] = mb;
    vs->wq_len++;
  }
  if (k > 0) {
    if (!dx) {
      lp_errf(e->err, "rank %d: stage %d gives no input gradient (an embedding must be "
              "the first layer of the model)", e->rank, v);
      st = LP_ERR_ARG;
      goto out;
    }
    int pv = e->route[mb][k - 1];
    if (e->vrank[pv] == e->rank) {
      e->vs[e->loc[pv]].slots[mb].bin = dx;
    } else {
      sl->bout = dx;
    }
    dx = NULL;
  }
out:
  lp_tensor_free(dy);
  lp_tensor_free(dx);
  return st;
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
  lp_status st = lp_nn_weight_grad(vs->chunk, sl->ctx, NULL);
  if (st != LP_OK) return nnfail(e, sl, "weight-grad", st);
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

/* ---- gradient reduction of replicated stages ---- */

static size_t grad_numel(const lp_nn_layer *l) { return (size_t)lp_nn_param_numel(l); }

static lp_status reduce_start(lp_exec *e, int li) {
  vst *vs = &e->vs[li];
  if (vs->reduced) return LP_OK;
  vs->reduced = 1;
  size_t n = grad_numel(vs->chunk), off = 0, np;
  const lp_nn_param *p = lp_nn_params(vs->chunk, &np);
  for (size_t i = 0; i < np; i++) {
    size_t c = (size_t)lp_tensor_numel(p[i].grad);
    memcpy(vs->pack + off, p[i].grad->data, c * sizeof(float));
    off += c;
  }
  for (int u = 0; u < e->V; u++) {
    if (u == vs->id || e->vstage[u] != vs->stage || e->vrank[u] == e->rank) continue;
    LP_CHECK(lp_comm_isend(e->comm, vs->pack, n, e->vrank[u], tag_of(e, K_RED, vs->id, 0),
                           &vs->red_req[u]));
    LP_CHECK(lp_comm_irecv(e->comm, vs->peer_pack[u], n, e->vrank[u],
                           tag_of(e, K_RED, u, 0), &vs->red_req[e->V + u]));
  }
  return LP_OK;
}

/* Waits for the messages of local vstage li's reduction (WAIT_REDUCE_GRAD;
 * a no-op once they are done or when none was started). */
static lp_status reduce_wait(lp_exec *e, int li) {
  vst *vs = &e->vs[li];
  for (int u = 0; u < 2 * e->V; u++) {
    if (!vs->red_req[u]) continue;
    char what[200];
    snprintf(what, sizeof what,
             "rank %d, REDUCE_GRAD of stage %d (model stage %d) waits for rank %d",
             e->rank, vs->id, vs->stage, e->vrank[u % e->V]);
    LP_CHECK(wait_req(e, &vs->red_req[u], what));
  }
  return LP_OK;
}

/* Waits for every reduction and writes sum-of-copies (in vstage id order,
 * so every copy gets bitwise the same numbers) into the grads. */
static lp_status reduce_finish(lp_exec *e) {
  for (int li = 0; li < e->nloc; li++)
    if (e->vs[li].reduced) LP_CHECK(reduce_wait(e, li));
  for (int li = 0; li < e->nloc; li++) {
    vst *vs = &e->vs[li];
    if (!vs->reduced) continue;
    size_t n = grad_numel(vs->chunk), np, off = 0;
    float *sum = NULL;
    int first = 1;
    for (int u = 0; u < e->V; u++) {
      if (e->vstage[u] != vs->stage) continue;
      const float *src;
      if (u == vs->id) src = vs->pack;
      else if (e->vrank[u] == e->rank) src = e->vs[e->loc[u]].pack;
      else src = vs->peer_pack[u];
      if (first) {
        sum = vs->peer_pack[vs->id]; /* scratch: never a peer's slot */
        memcpy(sum, src, n * sizeof(float));
        first = 0;
      } else {
        for (size_t i = 0; i < n; i++) sum[i] += src[i];
      }
    }
    const lp_nn_param *p = lp_nn_params(vs->chunk, &np);
    for (size_t i = 0; i < np; i++) {
      size_t c = (size_t)lp_tensor_numel(p[i].grad);
      memcpy(p[i].grad->data, sum + off, c * sizeof(float));
      off += c;
    }
  }
  for (int li = 0; li < e->nloc; li++) e->vs[li].reduced = 0;
  return LP_OK;
}

static int replicated(const lp_exec *e, int v) {
  for (int u = 0; u < e->V; u++)
    if (u != v && e->vstage[u] == e->vstage[v]) return 1;
  return 0;
}

/* ---- construction ---- */

static lp_status setup_optim(lp_exec *e, vst *vs) {
  size_t np;
  const lp_nn_param *p = lp_nn_params(vs->chunk, &np);
  if (e->o.optim == LP_EXEC_OPTIM_ADAMW)
    return lp_nn_optim_adamw_new(p, np, &e->o.adamw, &vs->optim);
  return lp_nn_optim_sgd_new(p, np, &e->o.sgd, &vs->optim);
}

lp_status lp_exec_new(const lp_schedule *s, const lp_exec_opts *opts, lp_exec **out,
                      char *err) {
  *out = NULL;
  lp_status st = LP_OK;
  if (!s || !opts || !opts->chunk || !opts->data) {
    lp_errf(err, "lp_exec_new: schedule, chunk and data are required");
    return LP_ERR_ARG;
  }
  lp_exec *e = lp_calloc(1, sizeof *e);
  if (!e) return LP_ERR_NOMEM;
  e->o = *opts;
  e->comm = opts->comm ? opts->comm : lp_comm_world();
  e->rank = lp_comm_rank(e->comm);
  e->s = lp_schedule_clone(s);
  if (!e->s) { st = LP_ERR_NOMEM; goto fail; }
  e->P = lp_schedule_ranks(s);
  e->S = lp_schedule_stages(s);
  e->V = lp_schedule_vstages(s);
  e->M = lp_schedule_microbatches(s);
  const char *sname = *lp_schedule_name(s) ? lp_schedule_name(s) : "(unnamed)";
  if (lp_comm_size(e->comm) != e->P) {
    lp_errf(e->err, "schedule '%s' needs %d ranks, but this job has %d (run it with "
            "mpirun -np %d)", sname, e->P, lp_comm_size(e->comm), e->P);
    st = LP_ERR_ARG;
    goto fail;
  }
  if (e->P > 1 && !lp_schedule_has_comm(s)) {
    lp_errf(e->err, "schedule '%s' is not lowered: call lp_schedule_lower first", sname);
    st = LP_ERR_ARG;
    goto fail;
  }
  if (lp_schedule_validate(e->s) != LP_OK) {
    lp_errf(e->err, "schedule '%s' is invalid: %s", sname, lp_schedule_last_error(e->s));
    st = LP_ERR_INVALID;
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
    e->loc[v] = e->vrank[v] == e->rank ? e->nloc++ : -1;
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
    if (replicated(e, v)) {
      size_t n = grad_numel(vs->chunk);
      vs->pack = lp_malloc((n ? n : 1) * sizeof(float));
      vs->peer_pack = lp_calloc((size_t)e->V, sizeof(float *));
      vs->red_req = lp_calloc((size_t)(2 * e->V), sizeof(lp_comm_req *));
      if (!vs->pack || !vs->peer_pack || !vs->red_req) { st = LP_ERR_NOMEM; goto fail; }
      for (int u = 0; u < e->V; u++) {
        if (e->vstage[u] != vs->stage) continue;
        if (u != v && e->vrank[u] == e->rank) continue; /* local copy: its own pack */
        vs->peer_pack[u] = lp_malloc((n ? n : 1) * sizeof(float));
        if (!vs->peer_pack[u]) { st = LP_ERR_NOMEM; goto fail; }
      }
    }
  }
  e->acts = lp_schedule_actions(e->s, e->rank, &e->nacts);
  e->compute_idx = lp_malloc((size_t)(e->nacts + 1) * sizeof(int));
  if (!e->compute_idx) { st = LP_ERR_NOMEM; goto fail; }
  for (int i = 0; i < e->nacts; i++) {
    if (lp_action_is_compute(e->acts[i].type)) e->compute_idx[e->ncompute++] = i;
    if (e->acts[i].type == LP_ACT_REDUCE_GRAD) e->has_reduce = 1;
  }
  e->act_s = lp_calloc((size_t)(2 * LP_EXEC_NKINDS * e->S), sizeof(double));
  e->act_n = lp_calloc((size_t)(2 * LP_EXEC_NKINDS * e->S), sizeof(int64_t));
  if (!e->act_s || !e->act_n) { st = LP_ERR_NOMEM; goto fail; }
  if (opts->trace) {
    e->trace = lp_trace_new();
    if (!e->trace) { st = LP_ERR_NOMEM; goto fail; }
  }
  /* the common trace clock: rank 0's start time. Ranks on rank 0's host
   * share its monotonic clock and take the time itself; others take the
   * moment the broadcast arrives (off by its latency). */
  struct {
    double t0;
    char host[64];
  } clk;
  memset(&clk, 0, sizeof clk);
  char host[64] = "";
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  if (lp_comm_barrier(e->comm, "lp_exec_new: aligning the trace clocks") != LP_OK) {
    lp_errf(e->err, "%s", lp_comm_last_error(e->comm));
    st = LP_ERR_COMM;
    goto fail;
  }
  clk.t0 = lp_now();
  memcpy(clk.host, host, sizeof clk.host);
  if (lp_comm_bcast(e->comm, &clk, sizeof clk, 0, "lp_exec_new: the trace clock") != LP_OK) {
    lp_errf(e->err, "%s", lp_comm_last_error(e->comm));
    st = LP_ERR_COMM;
    goto fail;
  }
  e->t0 = host[0] && strncmp(clk.host, host, sizeof host) == 0 ? clk.t0 : lp_now();
  *out = e;
  return LP_OK;
fail:
  if (err) lp_errf(err, "%s", *e->err ? e->err : lp_strerror(st));
  lp_exec_free(e);
  return st;
}

static void clear_slot(lp_exec *e, slot *sl) {
  lp_comm_cancel(e->comm, &sl->rreq_f);
  lp_comm_cancel(e->comm, &sl->rreq_b);
  lp_free(sl->rbuf_f);
  lp_free(sl->rbuf_b);
  sl->rbuf_f = sl->rbuf_b = NULL;
  lp_tensor_free(sl->fin);
  lp_tensor_free(sl->bin);
  lp_tensor_free(sl->fout);
  lp_tensor_free(sl->bout);
  sl->fin = sl->bin = sl->fout = sl->bout = NULL;
  if (sl->ctx) lp_nn_ctx_clear(sl->ctx);
}

void lp_exec_free(lp_exec *e) {
  if (!e) return;
  for (int i = 0; i < e->nps; i++) {
    lp_comm_cancel(e->comm, &e->ps[i].req);
    lp_tensor_free(e->ps[i].t);
  }
  lp_free(e->ps);
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
      if (vs->red_req)
        for (int u = 0; u < 2 * e->V; u++) lp_comm_cancel(e->comm, &vs->red_req[u]);
      lp_free(vs->red_req);
      if (vs->peer_pack)
        for (int u = 0; u < e->V; u++) lp_free(vs->peer_pack[u]);
      lp_free(vs->peer_pack);
      lp_free(vs->pack);
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
  lp_free(e->act_s);
  lp_free(e->act_n);
  lp_trace_free(e->trace);
  lp_schedule_free(e->s);
  lp_free(e);
}

const char *lp_exec_last_error(const lp_exec *e) { return e ? e->err : ""; }

void lp_exec_set_error(lp_exec *e, const char *msg) {
  lp_errf(e->err, "%s", msg ? msg : "");
}

/* ---- the step ---- */

static const char *cat_of(const lp_action *a) {
  switch (a->type) {
  case LP_ACT_F: return "F";
  case LP_ACT_B: return "B";
  case LP_ACT_I: return "I";
  case LP_ACT_W: return "W";
  case LP_ACT_FB: return "FB";
  default: return "comm";
  }
}

static lp_status run_action(lp_exec *e, const lp_action *a) {
  switch (a->type) {
  case LP_ACT_F: return run_f(e, a->stage, a->mb);
  case LP_ACT_B: return run_b(e, a->stage, a->mb, 1);
  case LP_ACT_I: return run_b(e, a->stage, a->mb, 0);
  case LP_ACT_W: return run_w(e, a->stage, a->mb);
  case LP_ACT_FB:
    if (e->o.overlapped_fb) return e->o.overlapped_fb(e->o.ud, e, a);
    LP_CHECK(run_f(e, a->stage, a->mb));
    return run_b(e, a->bstage, a->bmb, a->btype == LP_ACT_B);
  case LP_ACT_SEND_F:
  case LP_ACT_SEND_B: return do_send(e, a);
  case LP_ACT_RECV_F:
  case LP_ACT_RECV_B: return LP_OK; /* posted ahead (post_upto) */
  case LP_ACT_REDUCE_GRAD:
    if (e->loc[a->stage] < 0 || !replicated(e, a->stage)) return LP_OK;
    return reduce_start(e, e->loc[a->stage]);
  case LP_ACT_WAIT_REDUCE_GRAD:
    if (e->loc[a->stage] < 0) return LP_OK;
    return reduce_wait(e, e->loc[a->stage]);
  case LP_ACT_UNSHARD:
  case LP_ACT_RESHARD: return LP_OK; /* stages are never sharded here */
  default: return LP_ERR_INTERNAL;
  }
}

static void reset_step(lp_exec *e) {
  for (int i = 0; i < e->nps; i++) {
    lp_comm_cancel(e->comm, &e->ps[i].req);
    lp_tensor_free(e->ps[i].t);
  }
  e->nps = 0;
  for (int li = 0; li < e->nloc; li++) {
    vst *vs = &e->vs[li];
    for (int mb = 0; mb < e->M; mb++) clear_slot(e, &vs->slots[mb]);
    vs->wq_head = vs->wq_len = 0;
    if (vs->red_req)
      for (int u = 0; u < 2 * e->V; u++) lp_comm_cancel(e->comm, &vs->red_req[u]);
    vs->reduced = 0;
  }
}

static int kind_of(int type) {
  switch (type) {
  case LP_ACT_F: return LP_EXEC_K_F;
  case LP_ACT_B: return LP_EXEC_K_B;
  case LP_ACT_I: return LP_EXEC_K_I;
  case LP_ACT_W: return LP_EXEC_K_W;
  case LP_ACT_FB: return LP_EXEC_K_FB;
  default: return -1;
  }
}

/* The finished step's timing becomes the last step's and joins the totals. */
static void timing_commit(lp_exec *e) {
  lp_exec_timing *l = &e->tlast, *t = &e->ttotal;
  l->steps = 1;
  l->wall = e->wall;
  l->optim = e->t_optim;
  l->compute = e->t_comp + e->t_optim;
  l->wait = e->t_wait;
  l->post = e->t_post;
  l->overhead = l->wall - l->compute - l->wait;
  t->steps++;
  t->wall += l->wall;
  t->optim += l->optim;
  t->compute += l->compute;
  t->wait += l->wait;
  t->post += l->post;
  t->overhead += l->overhead;
  size_t nk = (size_t)LP_EXEC_NKINDS * e->S;
  for (size_t i = 0; i < nk; i++) {
    e->act_s[nk + i] += e->act_s[i];
    e->act_n[nk + i] += e->act_n[i];
  }
}

lp_status lp_exec_step(lp_exec *e, int64_t step, double *loss) {
  lp_status st = LP_OK;
  e->err[0] = '\0';
  e->step = step;
  e->loss_sum = 0;
  e->busy = 0;
  e->posted = 0;
  e->t_wait = e->t_post = e->t_comp = e->t_optim = 0;
  memset(e->act_s, 0, (size_t)LP_EXEC_NKINDS * e->S * sizeof *e->act_s);
  memset(e->act_n, 0, (size_t)LP_EXEC_NKINDS * e->S * sizeof *e->act_n);
  double start = lp_now();
  for (int li = 0; li < e->nloc; li++) LP_CHECK_GOTO(lp_nn_optim_zero_grad(e->vs[li].optim), st, fail);
  e->t_optim += lp_now() - start;
  int L = e->o.recv_lookahead == 0 ? 4 : e->o.recv_lookahead;
  int ci = 0; /* compute actions before e->cur */
  for (e->cur = 0; e->cur < e->nacts; e->cur++) {
    const lp_action *a = &e->acts[e->cur];
    int limit = L < 0 || ci + L >= e->ncompute ? e->nacts : e->compute_idx[ci + L];
    if (limit <= e->cur) limit = e->cur + 1;
    double tp = lp_now();
    LP_CHECK_GOTO(post_upto(e, limit), st, fail);
    int comp = lp_action_is_compute(a->type);
    e->waited = 0;
    double t0 = lp_now();
    e->t_post += t0 - tp;
    st = run_action(e, a);
    if (st != LP_OK) {
      if (!*e->err) {
        char t[LP_ACTION_TEXT_MAX];
        lp_errf(e->err, "rank %d, action %d (%s): %s", e->rank, e->cur,
                act_text(e, e->cur, t, sizeof t), lp_strerror(st));
      }
      goto fail;
    }
    double t1 = lp_now();
    if (comp) {
      /* busy time excludes waits for receives; the slice starts after them
       * (an FB pair's second wait is folded into its start as well) */
      double c = t1 - t0 - e->waited;
      e->busy += c;
      e->t_comp += c;
      int k = kind_of(a->type), ms = e->vstage[a->stage];
      if (k >= 0 && ms >= 0 && ms < e->S) {
        e->act_s[k * e->S + ms] += c;
        e->act_n[k * e->S + ms]++;
      }
      ci++;
      char name[LP_ACTION_TEXT_MAX];
      lp_action_format(a, name, sizeof name);
      trace_add(e, LP_TRACE_COMPUTE, name, cat_of(a), t0 + e->waited, t1, a->stage, a->mb,
                e->cur);
    } else {
      e->t_post += t1 - t0 - e->waited; /* SEND_*, RECV_* (posted ahead), REDUCE_GRAD */
    }
    /* only a backlog of sends is polled (see SEND_BACKLOG) */
    if (e->nps >= SEND_BACKLOG) LP_CHECK_GOTO(poll_sends(e), st, fail);
    e->t_post += lp_now() - t1; /* polling, trace recording */
  }
  e->cur = e->nacts;
  double te = lp_now();
  /* replicated stages without REDUCE_GRAD actions: reduce now */
  for (int li = 0; li < e->nloc; li++)
    if (replicated(e, e->vs[li].id) && !e->vs[li].reduced) {
      if (e->has_reduce) {
        lp_errf(e->err, "rank %d: virtual stage %d is replicated but has no REDUCE_GRAD action",
                e->rank, e->vs[li].id);
        st = LP_ERR_INVALID;
        goto fail;
      }
      LP_CHECK_GOTO(reduce_start(e, li), st, fail);
    }
  double tr = lp_now();
  e->t_post += tr - te;
  double wait_before = e->t_wait;
  LP_CHECK_GOTO(reduce_finish(e), st, fail);
  LP_CHECK_GOTO(wait_sends(e), st, fail);
  double to = lp_now();
  e->t_comp += (to - tr) - (e->t_wait - wait_before); /* summing reduced grads */
  if (to - tr > 1e-6)
    trace_add(e, LP_TRACE_RECV, "reduce grads / finish sends", "comm", tr, to, -1, -1, -1);
  for (int li = 0; li < e->nloc; li++) {
    vst *vs = &e->vs[li];
    if (vs->wq_len) {
      lp_errf(e->err, "rank %d: %d weight-grads of stage %d never ran", e->rank, vs->wq_len, vs->id);
      st = LP_ERR_INVALID;
      goto fail;
    }
    LP_CHECK_GOTO(lp_nn_optim_step(vs->optim), st, fail);
  }
  double t_opt = lp_now();
  e->busy += t_opt - to;
  e->t_optim += t_opt - to;
  trace_add(e, LP_TRACE_COMPUTE, "optimizer", "optim", to, t_opt, -1, -1, -1);
  double sum = e->loss_sum;
  if (lp_comm_allreduce_sum_double(e->comm, &sum, 1, "the loss all-reduce at the end of a step") != LP_OK) {
    const char *m = lp_comm_last_error(e->comm);
    lp_comm_fatal(e->comm, m);
  }
  if (loss) *loss = sum / e->M;
  e->wall = t_opt - start;
  timing_commit(e);
  return LP_OK;
fail:
  if (!*e->err) lp_errf(e->err, "rank %d: step %lld failed: %s", e->rank, (long long)step, lp_strerror(st));
  reset_step(e);
  return st;
}

void lp_exec_last_timing(const lp_exec *e, double *wall_s, double *busy_s) {
  if (wall_s) *wall_s = e->wall;
  if (busy_s) *busy_s = e->busy;
}

void lp_exec_timing_of(const lp_exec *e, int total, lp_exec_timing *out) {
  *out = total ? e->ttotal : e->tlast;
}

lp_status lp_exec_action_time(const lp_exec *e, int total, int kind, int stage,
                              double *sum_s, int64_t *count) {
  if (kind < 0 || kind >= LP_EXEC_NKINDS || stage < 0 || stage >= e->S) return LP_ERR_ARG;
  size_t i = (total ? (size_t)LP_EXEC_NKINDS * e->S : 0) + (size_t)kind * e->S + stage;
  if (sum_s) *sum_s = e->act_s[i];
  if (count) *count = e->act_n[i];
  return LP_OK;
}

void lp_exec_timing_reset(lp_exec *e) {
  memset(&e->ttotal, 0, sizeof e->ttotal);
  size_t nk = (size_t)LP_EXEC_NKINDS * e->S;
  memset(e->act_s + nk, 0, nk * sizeof *e->act_s);
  memset(e->act_n + nk, 0, nk * sizeof *e->act_n);
}

int lp_exec_vstages(const lp_exec *e) { return e->nloc; }
int lp_exec_vstage_id(const lp_exec *e, int i) { return i >= 0 && i < e->nloc ? e->vs[i].id : -1; }
int lp_exec_vstage_stage(const lp_exec *e, int i) {
  return i >= 0 && i < e->nloc ? e->vs[i].stage : -1;
}
lp_nn_layer *lp_exec_vstage_chunk(const lp_exec *e, int i) {
  return i >= 0 && i < e->nloc ? e->vs[i].chunk : NULL;
}
lp_trace *lp_exec_trace(lp_exec *e) { return e->trace; }

lp_status lp_exec_trace_clear(lp_exec *e) {
  if (!e->trace) return LP_OK;
  lp_trace *t = lp_trace_new();
  if (!t) return LP_ERR_NOMEM;
  lp_trace_free(e->trace);
  e->trace = t;
  return LP_OK;
}
lp_nn_optim *lp_exec_vstage_optim(const lp_exec *e, int i) {
  return i >= 0 && i < e->nloc ? e->vs[i].optim : NULL;
}
const lp_schedule *lp_exec_schedule(const lp_exec *e) { return e->s; }
lp_comm *lp_exec_comm(const lp_exec *e) { return e->comm; }
