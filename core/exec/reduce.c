/* reduce.c — gradient reduction of replicated stages (DualPipe's two
 * copies of every model stage): packs, exchanges and sums in vstage order.
 * It owns e->rd (ex_reduce) and every local vstage's vs->rd (vst_reduce):
 * its buffers, messages and the order reductions started in. */
#include "exec_internal.h"

#include <stdio.h>
#include <string.h>

/* ---- gradient reduction of ex_replicated stages ---- */

size_t ex_grad_numel(const lp_nn_layer *l) { return (size_t)lp_nn_param_numel(l); }

lp_status ex_reduce_new(lp_exec *e, vst *vs) {
  int v = vs->id;
  if (!ex_replicated(e, v)) return LP_OK;
  size_t n = ex_grad_numel(vs->chunk);
  vs->rd.pack = lp_malloc((n ? n : 1) * sizeof(float));
  vs->rd.peer_pack = lp_calloc((size_t)e->V, sizeof(float *));
  vs->rd.req = lp_calloc((size_t)(2 * e->V), sizeof(lp_comm_req *));
  if (!vs->rd.pack || !vs->rd.peer_pack || !vs->rd.req) return LP_ERR_NOMEM;
  for (int u = 0; u < e->V; u++) {
    if (e->vstage[u] != vs->stage) continue;
    if (u != v && e->vrank[u] == e->prank) continue; /* local copy: its own pack */
    vs->rd.peer_pack[u] = lp_malloc((n ? n : 1) * sizeof(float));
    if (!vs->rd.peer_pack[u]) return LP_ERR_NOMEM;
  }
  return LP_OK;
}

lp_status ex_reduce_resize(lp_exec *e, vst *vs) {
  if (!vs->rd.pack) return LP_OK;
  size_t n = ex_grad_numel(vs->chunk);
  float *np_ = lp_realloc(vs->rd.pack, (n ? n : 1) * sizeof(float));
  if (!np_) return LP_ERR_NOMEM;
  vs->rd.pack = np_;
  for (int u = 0; u < e->V; u++) {
    if (!vs->rd.peer_pack[u]) continue;
    float *pp = lp_realloc(vs->rd.peer_pack[u], (n ? n : 1) * sizeof(float));
    if (!pp) return LP_ERR_NOMEM;
    vs->rd.peer_pack[u] = pp;
  }
  return LP_OK;
}

void ex_reduce_free(lp_exec *e, vst *vs) {
  if (vs->rd.req)
    for (int u = 0; u < 2 * e->V; u++) lp_comm_cancel(e->comm, &vs->rd.req[u]);
  lp_free(vs->rd.req);
  if (vs->rd.peer_pack)
    for (int u = 0; u < e->V; u++) lp_free(vs->rd.peer_pack[u]);
  lp_free(vs->rd.peer_pack);
  lp_free(vs->rd.pack);
  memset(&vs->rd, 0, sizeof vs->rd);
}

void ex_reduce_drop(lp_exec *e, vst *vs) {
  if (vs->rd.req)
    for (int u = 0; u < 2 * e->V; u++) lp_comm_cancel(e->comm, &vs->rd.req[u]);
  vs->rd.started = 0;
}

void ex_reduce_reset(lp_exec *e) { e->rd.nstarted = 0; }

lp_status ex_reduce_start(lp_exec *e, int li) {
  vst *vs = &e->vs[li];
  if (vs->rd.started) return LP_OK;
  vs->rd.started = 1;
  vs->rd.seq = e->rd.nstarted++;
  size_t n = ex_grad_numel(vs->chunk), off = 0, np;
  const lp_nn_param *p = lp_nn_params(vs->chunk, &np);
  for (size_t i = 0; i < np; i++) {
    size_t c = (size_t)lp_tensor_numel(p[i].grad);
    LP_CHECK(lp_tensor_read(p[i].grad, vs->rd.pack + off)); /* any backend */
    off += c;
  }
  for (int u = 0; u < e->V; u++) {
    if (u == vs->id || e->vstage[u] != vs->stage || e->vrank[u] == e->prank) continue;
    LP_CHECK(lp_comm_isend(e->comm, vs->rd.pack, n, e->vrank[u], ex_tag(e, K_RED, vs->id, 0),
                           &vs->rd.req[u]));
    LP_CHECK(lp_comm_irecv(e->comm, vs->rd.peer_pack[u], n, e->vrank[u],
                           ex_tag(e, K_RED, u, 0), &vs->rd.req[e->V + u]));
  }
  return LP_OK;
}

/* Waits for the messages of local vstage li's reduction (WAIT_REDUCE_GRAD;
 * a no-op once they are done or when none was started). */
lp_status ex_reduce_wait(lp_exec *e, int li) {
  vst *vs = &e->vs[li];
  if (!vs->rd.req) return LP_OK;
  for (int u = 0; u < 2 * e->V; u++) {
    if (!vs->rd.req[u]) continue;
    char what[200];
    snprintf(what, sizeof what,
             "rank %d, REDUCE_GRAD of stage %d (model stage %d) waits for rank %d",
             e->rank, vs->id, vs->stage, ex_world(e, e->vrank[u % e->V]));
    LP_CHECK(ex_wait(e, &vs->rd.req[u], what));
  }
  return LP_OK;
}

/* Waits for every reduction and writes sum-of-copies (in vstage id order,
 * so every copy gets bitwise the same numbers) into the grads. */
lp_status ex_reduce_finish(lp_exec *e) {
  for (int li = 0; li < e->nloc; li++)
    if (e->vs[li].rd.started) LP_CHECK(ex_reduce_wait(e, li));
  for (int li = 0; li < e->nloc; li++) LP_CHECK(ex_reduce_finish_one(e, li));
  return LP_OK;
}

lp_status ex_reduce_finish_one(lp_exec *e, int li) {
  {
    vst *vs = &e->vs[li];
    if (!vs->rd.started) return LP_OK;
    LP_CHECK(ex_reduce_wait(e, li));
    size_t n = ex_grad_numel(vs->chunk), np, off = 0;
    float *sum = NULL;
    int first = 1;
    for (int u = 0; u < e->V; u++) {
      if (e->vstage[u] != vs->stage) continue;
      const float *src;
      if (u == vs->id) src = vs->rd.pack;
      else if (e->vrank[u] == e->prank) src = e->vs[e->loc[u]].rd.pack;
      else src = vs->rd.peer_pack[u];
      if (first) {
        sum = vs->rd.peer_pack[vs->id]; /* scratch: never a peer's slot */
        memcpy(sum, src, n * sizeof(float));
        first = 0;
      } else {
        for (size_t i = 0; i < n; i++) sum[i] += src[i];
      }
    }
    const lp_nn_param *p = lp_nn_params(vs->chunk, &np);
    for (size_t i = 0; i < np; i++) {
      size_t c = (size_t)lp_tensor_numel(p[i].grad);
      LP_CHECK(lp_tensor_write(p[i].grad, sum + off));
      off += c;
    }
    vs->rd.started = 0;
  }
  return LP_OK;
}

void ex_reduce_plan(lp_exec *e) {
  for (int i = 0; i < e->nacts; i++)
    if (e->acts[i].type == LP_ACT_REDUCE_GRAD) e->rd.has_actions = 1;
  /* and not before this rank's last send: a gradient-sum message shares
   * the links of the activations and gradients still to go (on a link of
   * limited bandwidth, as the emulated one, it would hold them up: measured
   * 6-7% slower DualPipe MoE steps at lat=100us,bw=64MB/s) */
  int last_send = -1;
  for (int i = 0; i < e->nacts; i++)
    if (e->acts[i].type == LP_ACT_SEND_F || e->acts[i].type == LP_ACT_SEND_B) last_send = i;
  for (int li = 0; li < e->nloc; li++) {
    int v = e->vs[li].id;
    e->vs[li].rd.last_grad = -1;
    for (int i = 0; i < e->nacts; i++) {
      const lp_action *a = &e->acts[i];
      int writes = ((a->type == LP_ACT_B || a->type == LP_ACT_W) && a->stage == v) ||
                   (a->type == LP_ACT_FB && a->bstage == v && a->btype == LP_ACT_B);
      if (writes) e->vs[li].rd.last_grad = i;
    }
    if (e->vs[li].rd.last_grad >= 0 && e->vs[li].rd.last_grad < last_send)
      e->vs[li].rd.last_grad = last_send;
  }
}

lp_status ex_reduce_early(lp_exec *e) {
  if (e->rd.has_actions) return LP_OK;
  for (int li = 0; li < e->nloc; li++) {
    vst *vs = &e->vs[li];
    if (vs->rd.started || !vs->rd.req || vs->rd.last_grad < 0 || vs->rd.last_grad > e->cur ||
        e->pr.carry_v == vs->id)
      continue;
    /* its queued weight-grads (split backward) must have run too */
    if (vs->wq_len) continue;
    LP_CHECK(ex_reduce_start(e, li));
  }
  return LP_OK;
}

int ex_replicated(const lp_exec *e, int v) {
  for (int u = 0; u < e->V; u++)
    if (u != v && e->vstage[u] == e->vstage[v]) return 1;
  return 0;
}

