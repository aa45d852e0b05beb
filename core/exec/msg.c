/* msg.c — the executor's message plumbing: tags, receives posted ahead of
 * need, asynchronous sends polled past a backlog, waits under the watchdog.
 * Activations and gradients stay on the model's backend: receives land in
 * tensors made there and sends read the chunk's output in place, over
 * e->msg.pcomm (the pipeline comm for host tensors; for device tensors NCCL
 * or MPI staged through pinned host memory, see lp_comm_gpu.h).
 * A receive is posted at its RECV action or up to recv_lookahead compute
 * actions earlier, never later, and waited for only by the F, B or I that
 * consumes it (ex_finish_recv); a SEND never waits: the non-blocking model
 * lp_schedule_validate proves deadlock-free (LP_SENDS_NONBLOCKING).
 * At a bf16 stage boundary (the chunks' boundary precision) the values
 * that cross are rounded to bf16 where they are made (ex_round_boundary,
 * as a chunk rounds between its layers, so the one-process model gives
 * the same numbers) and host tensors travel as bf16 bits: two bytes a
 * value, packed two to a float of the comm's buffers, lossless.
 * It owns e->msg (ex_msg): that context, the receives posted ahead, the
 * sends in flight, the step's bytes sent; the waits' time goes to
 * timing.c (ex_time_wait). */
#include "exec_internal.h"

#include "lp_comm_gpu.h"

#include <stdio.h>
#include <string.h>

/* pending sends kept before a poll after an action looks at them
 * (ex_poll_sends); the rest complete at the end of the step (wait_sends). Polling after every
 * action measured 3-18% of the char-LM step on 4 oversubscribed CPU ranks
 * (an unsuccessful MPI_Test yields the CPU there) and gained nothing: every
 * wait drives the comm library, and the receiver copies large messages
 * (single-copy shared memory). The limit only bounds the memory held. */
enum { SEND_BACKLOG = 64 };

/* ---- small helpers ---- */

int ex_tag(const lp_exec *e, int kind, int v, int mb) {
  return (kind * e->V + v) * e->M + mb;
}

const char *ex_act_text(const lp_exec *e, int i, char *buf, size_t n) {
  if (i < 0 || i >= e->nacts) {
    snprintf(buf, n, "(end of step)");
  } else {
    lp_action_format(&e->acts[i], buf, n);
  }
  return buf;
}

/* Records the slice of a finished send: from its isend to `end` (when this
 * rank saw it complete), and releases what it kept alive. */
static void send_done(lp_exec *e, pending_send *p, double end) {
  if (e->tm.trace) {
    char name[LP_TRACE_NAME_MAX];
    snprintf(name, sizeof name, "send %d%s%d", p->v, p->fwd ? "F" : "B", p->mb);
    ex_trace_add(e, LP_TRACE_SEND, name, "comm", p->posted, end, p->v, p->mb, p->index,
                 p->peer, p->tag);
  }
  lp_tensor_free(p->t);
  p->t = NULL;
  lp_free(p->wire);
  p->wire = NULL;
}

/* Floats of the comm's buffer that carry n values: n, or n bf16 values
 * two to a float (the last half-float of an odd count unused). */
static size_t wire_floats(const lp_exec *e, size_t n) {
  return e->msg.wire16 ? (n + 1) / 2 : n;
}

lp_status ex_msg_setup(lp_exec *e) {
  int bf16 = -1;
  for (int i = 0; i < e->nloc; i++) {
    if (!e->vs[i].chunk) continue;
    int b = lp_nn_chunk_boundary(e->vs[i].chunk) == LP_TENSOR_BF16;
    if (bf16 >= 0 && b != bf16) {
      lp_errf(e->err, "rank %d: its model stages disagree on the precision between layers "
              "(f32 and bf16): build every stage at one precision", e->rank);
      return LP_ERR_ARG;
    }
    bf16 = b;
  }
  e->msg.bf16 = bf16 == 1;
  e->msg.wire16 = e->msg.bf16 && e->be->host_accessible;
  return LP_OK;
}

lp_tensor_precision lp_exec_wire(const lp_exec *e, int *value_bytes) {
  if (value_bytes) *value_bytes = e->msg.wire16 ? 2 : 4;
  return e->msg.bf16 ? LP_TENSOR_BF16 : LP_TENSOR_F32;
}

lp_status ex_round_boundary(lp_exec *e, lp_tensor **t) {
  if (!e->msg.bf16 || !*t) return LP_OK;
  lp_status st = lp_tensor_round_bf16(t);
  if (st != LP_OK)
    lp_errf(e->err, "rank %d: rounding a stage boundary's values to bf16 failed (%s)", e->rank,
            lp_strerror(st));
  return st;
}

/* Waits for *req under the watchdog; a failure is returned (ex_comm_fail). */
lp_status ex_wait_on(lp_exec *e, lp_comm *c, lp_comm_req **req, const char *what) {
  double tw = lp_now();
  lp_status st = lp_comm_wait(c, req, what);
  ex_time_wait(e, lp_now() - tw);
  return st == LP_OK ? LP_OK : ex_comm_fail(e, c, st, what);
}

lp_status ex_wait(lp_exec *e, lp_comm_req **req, const char *what) {
  return ex_wait_on(e, e->comm, req, what);
}

lp_status ex_pcomm_new(lp_exec *e) {
  if (lp_comm_size(e->comm) == 1) { /* no messages between pipeline ranks */
    e->msg.pcomm = e->comm;
    e->msg.pcomm_own = 0;
    return LP_OK;
  }
  lp_status st = lp_comm_for_backend(e->comm, e->be, &e->msg.pcomm, &e->msg.pcomm_own);
  if (st != LP_OK) {
    lp_errf(e->err, "rank %d: a communicator for tensors on %s: %s", e->rank, e->be->name,
            lp_comm_last_error(e->comm));
    e->msg.pcomm = NULL;
    e->msg.pcomm_own = 0;
  }
  return st;
}

void ex_msg_reset(lp_exec *e) {
  e->msg.posted = 0;
  e->msg.bytes = 0;
}

void ex_sends_drop(lp_exec *e) {
  for (int i = 0; i < e->msg.nps; i++) {
    lp_comm_cancel(e->msg.pcomm, &e->msg.ps[i].req);
    lp_tensor_free(e->msg.ps[i].t);
    lp_free(e->msg.ps[i].wire);
  }
  e->msg.nps = 0;
}

void ex_msg_free(lp_exec *e) {
  lp_free(e->msg.ps);
  e->msg.ps = NULL;
  e->msg.cps = 0;
  if (e->msg.pcomm_own) lp_comm_free(e->msg.pcomm);
  e->msg.pcomm = NULL;
  e->msg.pcomm_own = 0;
}

void ex_recv_drop(lp_exec *e, lp_comm_req **req, lp_tensor **buf, uint16_t **wire) {
  if (*req) lp_comm_cancel(e->msg.pcomm, req);
  lp_tensor_free(*buf);
  *buf = NULL;
  lp_free(*wire);
  *wire = NULL;
}

lp_status ex_to_backend(lp_exec *e, lp_tensor **t) {
  if (lp_tensor_backend_of(*t) == e->be) return LP_OK;
  lp_tensor *d = NULL;
  lp_status st = lp_tensor_empty(e->be, (*t)->ndim, (*t)->shape, &d);
  if (st == LP_OK) st = lp_tensor_copy(d, *t);
  if (st != LP_OK) {
    lp_tensor_free(d);
    lp_errf(e->err, "rank %d: copying a micro-batch input from %s to %s failed (%s)", e->rank,
            lp_tensor_backend_of(*t)->name, e->be->name, lp_strerror(st));
    return st;
  }
  lp_tensor_free(*t);
  *t = d;
  return LP_OK;
}

/* Past the backlog, drops finished sends (non-blocking), oldest first,
 * stopping at the first one still in flight: one test that finds nothing
 * done costs a progress call of the comm library (and, under MPI with more
 * ranks than cores, a yield of the CPU), so a poll makes at most one such
 * call; the rest complete at later polls or at the end of the step. */
lp_status ex_poll_sends(lp_exec *e) {
  if (e->msg.nps < SEND_BACKLOG) return LP_OK;
  int i = 0;
  for (; i < e->msg.nps; i++) {
    pending_send *p = &e->msg.ps[i];
    int done = 0;
    lp_status st = lp_comm_test(e->msg.pcomm, &p->req, &done);
    if (st != LP_OK) {
      lp_errf(e->err, "rank %d: a send failed: %s", e->rank,
              lp_comm_last_error(e->msg.pcomm));
      return st;
    }
    if (!done) break;
    send_done(e, p, lp_now());
  }
  if (i > 0) {
    memmove(e->msg.ps, e->msg.ps + i, (size_t)(e->msg.nps - i) * sizeof *e->msg.ps);
    e->msg.nps -= i;
  }
  return LP_OK;
}

static lp_status push_send(lp_exec *e, const pending_send *ps) {
  if (e->msg.nps == e->msg.cps) {
    int nc = e->msg.cps ? 2 * e->msg.cps : 16;
    pending_send *np = lp_realloc(e->msg.ps, (size_t)nc * sizeof *np);
    if (!np) return LP_ERR_NOMEM;
    e->msg.ps = np;
    e->msg.cps = nc;
  }
  e->msg.ps[e->msg.nps++] = *ps;
  return LP_OK;
}

lp_status ex_wait_sends(lp_exec *e) {
  for (int i = 0; i < e->msg.nps; i++) {
    pending_send *p = &e->msg.ps[i];
    char what[160];
    snprintf(what, sizeof what,
             "rank %d at the end of step %lld waits for its sends to complete",
             e->rank, (long long)e->step);
    LP_CHECK(ex_wait_on(e, e->msg.pcomm, &p->req, what));
    send_done(e, p, lp_now());
  }
  e->msg.nps = 0;
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
  lp_tensor **buf = fwd ? &sl->rbuf_f : &sl->rbuf_b;
  lp_comm_req **req = fwd ? &sl->rreq_f : &sl->rreq_b;
  uint16_t **wire = fwd ? &sl->rwire_f : &sl->rwire_b;
  if (*req || *buf) {
    lp_errf(e->err, "rank %d: receive for %s of micro-batch %d on stage %d posted twice",
            e->rank, fwd ? "forward" : "backward", mb, v);
    return LP_ERR_INTERNAL;
  }
  /* the message lands in a tensor of the model's backend (no copy after) */
  LP_CHECK(lp_tensor_empty(e->be, e->ndim[st_in], e->shape[st_in], buf));
  float *land = (*buf)->data;
  if (e->msg.wire16) { /* bf16 bits land here, unpacked by ex_finish_recv */
    *wire = lp_malloc(wire_floats(e, n) * sizeof(float) + 1);
    if (!*wire) {
      lp_tensor_free(*buf);
      *buf = NULL;
      return LP_ERR_NOMEM;
    }
    land = (float *)(void *)*wire;
  }
  lp_status st = lp_comm_irecv(e->msg.pcomm, land, wire_floats(e, n), e->vrank[peer_v],
                               ex_tag(e, fwd ? K_F : K_B, v, mb), req);
  if (st != LP_OK) {
    lp_errf(e->err, "rank %d: posting a receive: %s", e->rank,
            lp_comm_last_error(e->msg.pcomm));
    lp_tensor_free(*buf);
    *buf = NULL;
    lp_free(*wire);
    *wire = NULL;
  }
  return st;
}

/* Posts every RECV action before index `limit`. */
lp_status ex_post_upto(lp_exec *e, int limit) {
  if (limit > e->nacts) limit = e->nacts;
  for (; e->msg.posted < limit; e->msg.posted++) {
    const lp_action *a = &e->acts[e->msg.posted];
    if (a->type == LP_ACT_RECV_F || a->type == LP_ACT_RECV_B)
      LP_CHECK(post_recv(e, a));
  }
  return LP_OK;
}

/* Completes the receive into *buf, a tensor of stage `stin`'s activation
 * shape, and hands it over. */
lp_status ex_finish_recv(lp_exec *e, int fwd, int v, int mb, int stin,
                             int peer, lp_tensor **out) {
  peer = ex_world(e, peer); /* messages and traces name world ranks */
  slot *sl = &e->vs[e->loc[v]].slots[mb];
  lp_tensor **buf = fwd ? &sl->rbuf_f : &sl->rbuf_b;
  lp_comm_req **req = fwd ? &sl->rreq_f : &sl->rreq_b;
  char t[LP_ACTION_TEXT_MAX], what[256];
  if (!*buf) {
    lp_errf(e->err, "rank %d, action %d (%s): no receive was posted for its %s input",
            e->rank, e->cur, ex_act_text(e, e->cur, t, sizeof t),
            fwd ? "forward" : "backward");
    return LP_ERR_INTERNAL;
  }
  snprintf(what, sizeof what, "rank %d, action %d (%s) waits for %s of micro-batch %d from rank %d",
           e->rank, e->cur, ex_act_text(e, e->cur, t, sizeof t),
           fwd ? "RECV_F (activation)" : "RECV_B (gradient)", mb, peer);
  double t0 = lp_now();
  LP_CHECK(ex_wait_on(e, e->msg.pcomm, req, what));
  double t1 = lp_now();
  ex_time_recv_wait(e, t1 - t0);
  char name[LP_TRACE_NAME_MAX];
  snprintf(name, sizeof name, "recv %d%s%d", v, fwd ? "F" : "B", mb);
  ex_trace_add(e, LP_TRACE_RECV, name, "comm", t0, t1, v, mb, e->cur, peer,
               ex_tag(e, fwd ? K_F : K_B, v, mb));
  (void)stin; /* the shape was set when the receive was posted */
  uint16_t **wire = fwd ? &sl->rwire_f : &sl->rwire_b;
  if (*wire) {
    lp_tensor_bf16_unpack(*wire, (size_t)lp_tensor_numel(*buf), (*buf)->data);
    lp_free(*wire);
    *wire = NULL;
  }
  *out = *buf;
  *buf = NULL;
  return LP_OK;
}

lp_status ex_send(lp_exec *e, const lp_action *a) {
  int v = a->stage, mb = a->mb, li = e->loc[v];
  int k = e->kpos[li][mb];
  slot *sl = &e->vs[li].slots[mb];
  int fwd = a->type == LP_ACT_SEND_F;
  lp_tensor **t = fwd ? &sl->fout : &sl->bout;
  char tx[LP_ACTION_TEXT_MAX];
  if (!*t) {
    lp_errf(e->err, "rank %d, action %d (%s): nothing to send", e->rank, e->cur,
            ex_act_text(e, e->cur, tx, sizeof tx));
    return LP_ERR_INTERNAL;
  }
  int u = e->route[mb][fwd ? k + 1 : k - 1];
  lp_comm_req *req = NULL;
  if (!lp_tensor_is_contiguous(*t)) { /* sends read dense memory */
    lp_tensor *d = NULL;
    LP_CHECK(lp_tensor_clone(*t, &d));
    lp_tensor_free(*t);
    *t = d;
  }
  size_t n = (size_t)lp_tensor_numel(*t);
  const float *from = (*t)->data;
  uint16_t *wire = NULL;
  if (e->msg.wire16) { /* bf16 values already (ex_round_boundary): their bits */
    wire = lp_calloc(wire_floats(e, n) * 2 + 1, sizeof *wire);
    if (!wire) return LP_ERR_NOMEM;
    lp_tensor_bf16_pack((*t)->data, n, wire);
    from = (const float *)(const void *)wire;
  }
  size_t nf = wire_floats(e, n);
  lp_status st = lp_comm_isend(e->msg.pcomm, from, nf, e->vrank[u],
                               ex_tag(e, fwd ? K_F : K_B, u, mb), &req);
  if (st != LP_OK) {
    lp_errf(e->err, "rank %d, action %d (%s): %s", e->rank, e->cur,
            ex_act_text(e, e->cur, tx, sizeof tx), lp_comm_last_error(e->msg.pcomm));
    lp_free(wire);
    return st;
  }
  e->msg.bytes += 4.0 * (double)nf;
  if (wire) { /* the bits travel from wire: the tensor is done with */
    lp_tensor_free(*t);
    *t = NULL;
  }
  pending_send ps = {req, *t, wire, lp_now(), v, mb, fwd, e->cur, ex_world(e, e->vrank[u]),
                     ex_tag(e, fwd ? K_F : K_B, u, mb)};
  st = push_send(e, &ps);
  if (st != LP_OK) {
    lp_comm_cancel(e->msg.pcomm, &req);
    lp_free(wire);
    return st;
  }
  *t = NULL;
  return LP_OK;
}

