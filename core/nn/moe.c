/* moe.c — the MoE layer's phased pass (see lp_nn.h): the dispatch and
 * combine exchanges, the routed experts (SwiGLU in this rank's slots) and
 * the shared expert, and the weight-grads. The routing decisions are
 * moe_route.c's (the ctx's moe_route holds them); slots, placement and the
 * layer's constructor are moe_slots.c's.
 *
 * ctx->phase is the lp_nn_phase the next advance runs. Forward on EP rank r
 * (size P, spr slots per rank):
 *   DENSE     route every token, order the (token, expert) pairs by
 *             destination slot ("send order"), gather their rows;
 *             P > 1: start the count exchange (pairs per slot)
 *   DISPATCH  finish it, start the token-row exchange; the shared expert's
 *             first half while the rows travel
 *   EXPERTS   finish it, put the received rows in slot order ("expert
 *             order"), run each local slot's SwiGLU, start the combine
 *             (outputs back in receive order); the shared expert's output
 *   COMBINE   finish it, y = shared + sum of weight * expert output
 * Input-grad: DENSE (weighted dy rows start back to the experts; the
 * router's and the shared expert's backward while they fly), EXPERTS
 * (expert backward, dx rows start back), DISPATCH (dx += the returned
 * rows). With P == 1 there is no exchange and a pass is one advance.
 *
 * On any backend the GEMMs, SwiGLU, gather/scatter run on the backend, and
 * the row exchanges go to the lp_nn_ep where the rows live (host memory,
 * or device memory with lp_nn_xinfo.be naming the backend).
 *
 * Params: [0] router, then shared w1, w3, w2 (when shared > 0), then w1,
 * w3, w2 of each local slot. */
#include "moe_internal.h"

#include <string.h>

/* ctx tensor slots */
enum {
  M_X,      /* x as [N, D] */
  M_SEND,   /* rows sent for dispatch [Pairs, D] */
  M_RECV,   /* rows received [R, D] */
  M_XIN,    /* expert inputs, expert order [R, D] */
  M_A1,     /* x W1^T, expert order [R, H] */
  M_A3,     /* x W3^T */
  M_H,      /* silu(a1) * a3 */
  M_OUTR,   /* expert outputs, receive order [R, D] */
  M_COMB,   /* expert outputs, send order [Pairs, D] */
  M_SHA1,   /* shared expert [N, HS] */
  M_SHA3,   /* */
  M_SHH,    /* */
  M_SHOUT,  /* shared output [N, D] */
  M_DY,     /* dy as [N, D] */
  M_DLOG,   /* d logits [N, E] */
  M_SHDA1,  /* shared da1 [N, HS] */
  M_SHDA3,  /* */
  M_DCOMB,  /* weighted dy rows, send order [Pairs, D] */
  M_DOUTR,  /* the same received, receive order [R, D] */
  M_DOUT,   /* expert order [R, D] */
  M_DA1,    /* expert order [R, H] */
  M_DA3,    /* */
  M_DXR,    /* expert dx, receive order [R, D] */
  M_DXS,    /* expert dx, send order [Pairs, D] */
  M_DX,     /* dx as [N, D] */
  M_NSLOTS
};

_Static_assert(M_NSLOTS <= NN_SLOTS, "moe needs more ctx slots");

/* ---- small helpers ---- */

static lp_status new2(const moe_route *rt, int64_t r, int64_t c,
                      lp_tensor **out) {
  return lp_tensor_empty(rt->be, 2, (int64_t[]){r, c}, out);
}

/* Rows [a, a+n) of t (a new view). */
static lp_status rows_of(const lp_tensor *t, int64_t a, int64_t n,
                         lp_tensor **out) {
  return lp_tensor_rows(t, a, n, out);
}

const char *lp_nn_xkind_text(lp_nn_xkind k) {
  static const char *const t[LP_NN_X__N] = {"dispatch count", "dispatch", "combine",
                                            "combine backward", "dispatch backward"};
  return k >= 0 && k < LP_NN_X__N ? t[k] : "exchange";
}

/* Starts an exchange of ctx; the ctx remembers it until finish. be: NULL
 * for host memory, else the backend the buffers live on. */
static lp_status xstart(lp_nn_layer *l, lp_nn_ctx *ctx, const float *send,
                        const size_t *sc, float *recv, const size_t *rc,
                        lp_nn_xkind kind, const lp_tensor_backend *be) {
  const lp_nn_ep *ep = &moe_of(l)->ep;
  moe_route *rt = ctx->ext;
  void *h = NULL;
  if (!ep->start)
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "placed for EP rank %d of %d but in no EP group (lp_nn_set_ep first)",
                   moe_of(l)->rank, moe_of(l)->size);
  lp_nn_xinfo xi = {kind, l->name, lp_nn_ctx_tag(ctx), be};
  lp_status st = ep->start(ep->ud, &xi, send, sc, recv, rc, &h);
  if (st != LP_OK)
    return nn_fail(ctx, l, st, "starting the %s exchange failed: %s",
                   lp_nn_xkind_text(kind), lp_strerror(st));
  ctx->xchg = h;
  ctx->xchg_ep = ep;
  rt->xkind = kind;
  return LP_OK;
}

/* Starts the exchange of the rows of tensor `send` into tensor `recv` (both
 * dense, on the micro-batch's backend), where they live. */
static lp_status xstart_rows(lp_nn_layer *l, lp_nn_ctx *ctx,
                             const lp_tensor *send, const size_t *sc,
                             lp_tensor *recv, const size_t *rc,
                             lp_nn_xkind kind) {
  const moe_route *rt = ctx->ext;
  return xstart(l, ctx, send->data, sc, recv->data, rc, kind,
                rt->be->host_accessible ? NULL : rt->be);
}

/* Finishes the exchange in flight (none: nothing). */
static lp_status xfinish(lp_nn_layer *l, lp_nn_ctx *ctx) {
  if (!ctx->xchg) return LP_OK;
  void *h = ctx->xchg;
  const moe_route *rt = ctx->ext;
  const nn_moe *m = moe_of(l);
  ctx->xchg = NULL;
  ctx->xchg_ep = NULL;
  lp_status st = m->ep.wait(m->ep.ud, h);
  if (st != LP_OK)
    return nn_fail(ctx, l, st, "the %s exchange failed: %s",
                   lp_nn_xkind_text(rt->xkind), lp_strerror(st));
  return LP_OK;
}

/* The experts' SwiGLU math is nn_swiglu_fwd / _bwd / _wgrad (swiglu.c). */

/* ---- forward ---- */

/* The shared expert in two pieces, each computed while an exchange of the
 * layer flies (it depends on x only): its first half (a1 = x W1^T, a3 =
 * x W3^T, h = silu(a1) * a3) after the dispatch has started, its output
 * (h W2^T) after the combine has started. The same operations on the same
 * tensors as nn_swiglu_fwd at once: bitwise the same output. */
static lp_status shared_fwd_in(lp_nn_layer *l, lp_nn_ctx *ctx) {
  nn_moe *m = moe_of(l);
  moe_route *rt = ctx->ext;
  if (m->o.shared <= 0) return LP_OK;
  lp_tensor *sa1, *sa3, *sh;
  LP_CHECK(new2(rt, rt->n, m->hs, &sa1));
  nn_keep(ctx, M_SHA1, sa1);
  LP_CHECK(new2(rt, rt->n, m->hs, &sa3));
  nn_keep(ctx, M_SHA3, sa3);
  LP_CHECK(new2(rt, rt->n, m->hs, &sh));
  nn_keep(ctx, M_SHH, sh);
  LP_CHECK(nn_gemm(l->precision, sa1, 1.0f, ctx->saved[M_X], 0, P_SH(l, 0).value, 1, 0.0f));
  LP_CHECK(nn_gemm(l->precision, sa3, 1.0f, ctx->saved[M_X], 0, P_SH(l, 1).value, 1, 0.0f));
  LP_CHECK(lp_tensor_act(sh, LP_TENSOR_ACT_SILU, sa1));
  LP_CHECK(lp_tensor_mul(sh, sh, sa3));
  /* h: read by GEMMs only (the output, W2's gradient) */
  return nn_pack_slot(ctx, l->precision, M_SHH);
}

static lp_status shared_fwd_out(lp_nn_layer *l, lp_nn_ctx *ctx) {
  nn_moe *m = moe_of(l);
  moe_route *rt = ctx->ext;
  if (m->o.shared <= 0) return LP_OK;
  lp_tensor *so;
  LP_CHECK(new2(rt, rt->n, m->o.dim, &so));
  nn_keep(ctx, M_SHOUT, so);
  return nn_gemm(l->precision, so, 1.0f, ctx->saved[M_SHH], 0, P_SH(l, 2).value, 1, 0.0f);
}

static lp_status fwd_dense(lp_nn_layer *l, lp_nn_ctx *ctx, int *waiting) {
  nn_moe *m = moe_of(l);
  const lp_tensor *x = ctx->in;
  int64_t D = m->o.dim;
  int E = m->o.experts;
  *waiting = 0;
  if (x->shape[x->ndim - 1] != D || (x->ndim != 2 && x->ndim != 3)) {
    char a[64];
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "input must be [tokens, %lld] or [batch, seq, %lld], got %s",
                   (long long)D, (long long)D, nn_shape_str(x, a, sizeof a));
  }
  moe_route *rt = lp_calloc(1, sizeof *rt);
  if (!rt) return LP_ERR_NOMEM;
  ctx->ext = rt;
  ctx->ext_free = moe_route_free;
  rt->be = lp_tensor_backend_of(x);
  rt->xndim = x->ndim;
  for (int i = 0; i < x->ndim; i++)
    rt->xshape[i] = x->shape[i];
  lp_tensor_rows_cols(x, &rt->n, NULL);
  rt->pairs = rt->n * m->o.topk;
  rt->seqs = x->ndim == 3 ? x->shape[0] : 1;
  rt->seqlen = x->ndim == 3 ? x->shape[1] : rt->n;

  lp_tensor *xd = NULL, *x2 = NULL, *send = NULL;
  LP_CHECK(nn_dense(x, &xd));
  lp_status st = lp_tensor_reshape(xd, 2, (int64_t[]){rt->n, D}, &x2);
  lp_tensor_free(xd);
  LP_CHECK(st);
  nn_keep(ctx, M_X, x2);
  rt->s = lp_malloc(moe_at_least1(rt->n * E) * sizeof *rt->s);
  if (!rt->s) return LP_ERR_NOMEM;
  LP_CHECK(moe_scores(l, x2, rt->n, rt->s));
  LP_CHECK(moe_make_route(m, rt));
  LP_CHECK(moe_balance_forward(m, rt));
  if (m->size == 1) {
    memcpy(rt->cnt_recv, rt->cnt_send, (size_t)m->spr * sizeof(float));
  } else { /* the counts fly while the rows are gathered */
    *waiting = 1;
    LP_CHECK(xstart(l, ctx, rt->cnt_send, rt->cs, rt->cnt_recv, rt->cs,
                    LP_NN_X_DISPATCH_COUNT, NULL));
  }
  LP_CHECK(new2(rt, rt->pairs, D, &send));
  nn_keep(ctx, M_SEND, send);
  return lp_tensor_gather_rows(send, x2, rt->tok, NULL);
}

static lp_status fwd_dispatch(lp_nn_layer *l, lp_nn_ctx *ctx, int *waiting) {
  nn_moe *m = moe_of(l);
  moe_route *rt = ctx->ext;
  *waiting = 0;
  LP_CHECK(xfinish(l, ctx));
  LP_CHECK(moe_make_expert_order(m, rt));
  if (m->size == 1) {
    LP_CHECK(lp_tensor_view(ctx->saved[M_SEND], &ctx->saved[M_RECV]));
    return shared_fwd_in(l, ctx);
  }
  lp_tensor *recv;
  LP_CHECK(new2(rt, rt->r, m->o.dim, &recv));
  nn_keep(ctx, M_RECV, recv);
  *waiting = 1;
  LP_CHECK(xstart_rows(l, ctx, ctx->saved[M_SEND], rt->sc, recv, rt->rc,
                       LP_NN_X_DISPATCH));
  return shared_fwd_in(l, ctx); /* while the rows travel */
}

static lp_status fwd_experts(lp_nn_layer *l, lp_nn_ctx *ctx, int *waiting) {
  nn_moe *m = moe_of(l);
  moe_route *rt = ctx->ext;
  int64_t D = m->o.dim, H = m->o.hidden, R = rt->r;
  *waiting = 0;
  LP_CHECK(xfinish(l, ctx));
  nn_drop(ctx, M_SEND);
  lp_tensor *xin, *a1, *a3, *h, *oute = NULL, *outr;
  LP_CHECK(new2(rt, R, D, &xin));
  nn_keep(ctx, M_XIN, xin);
  LP_CHECK(lp_tensor_gather_rows(xin, ctx->saved[M_RECV], rt->emap, NULL));
  nn_drop(ctx, M_RECV);
  /* the experts' x and h are read by GEMMs only: at bf16 kept as the bf16
   * values those read (nn_pack; h once every slot has made its rows) */
  LP_CHECK(nn_pack_slot(ctx, l->precision, M_XIN));
  xin = ctx->saved[M_XIN];
  LP_CHECK(new2(rt, R, H, &a1));
  nn_keep(ctx, M_A1, a1);
  LP_CHECK(new2(rt, R, H, &a3));
  nn_keep(ctx, M_A3, a3);
  LP_CHECK(new2(rt, R, H, &h));
  nn_keep(ctx, M_H, h);
  LP_CHECK(new2(rt, R, D, &outr));
  nn_keep(ctx, M_OUTR, outr);
  lp_status st = new2(rt, R, D, &oute);
  for (int j = 0; j < m->spr && st == LP_OK; j++) {
    int64_t a = rt->soff[j], n = rt->soff[j + 1] - a;
    if (n == 0) continue;
    lp_tensor *v[5] = {NULL};
    st = rows_of(xin, a, n, &v[0]);
    if (st == LP_OK) st = rows_of(a1, a, n, &v[1]);
    if (st == LP_OK) st = rows_of(a3, a, n, &v[2]);
    if (st == LP_OK) st = rows_of(h, a, n, &v[3]);
    if (st == LP_OK) st = rows_of(oute, a, n, &v[4]);
    if (st == LP_OK)
      st = nn_swiglu_fwd(l->precision, v[0], P_SLOT(l, j, 0).value, P_SLOT(l, j, 1).value,
                      P_SLOT(l, j, 2).value, v[1], v[2], v[3], v[4]);
    for (int i = 0; i < 5; i++)
      lp_tensor_free(v[i]);
  }
  if (st == LP_OK) st = lp_tensor_gather_rows(outr, oute, rt->rmap, NULL);
  /* bf16: the experts' outputs are bf16 values, with EP or without (the
   * combine then carries them as bf16 bits, lossless) */
  if (st == LP_OK && l->precision == LP_TENSOR_BF16) st = lp_tensor_round_bf16(&outr);
  lp_tensor_free(oute);
  LP_CHECK(st);
  LP_CHECK(nn_pack_slot(ctx, l->precision, M_H));
  if (m->size == 1) {
    LP_CHECK(lp_tensor_view(outr, &ctx->saved[M_COMB]));
  } else {
    lp_tensor *comb;
    LP_CHECK(new2(rt, rt->pairs, D, &comb));
    nn_keep(ctx, M_COMB, comb);
    *waiting = 1;
    LP_CHECK(xstart_rows(l, ctx, outr, rt->rc, comb, rt->sc, LP_NN_X_COMBINE));
  }
  return shared_fwd_out(l, ctx); /* while the outputs travel back */
}

static lp_status fwd_combine(lp_nn_layer *l, lp_nn_ctx *ctx, lp_tensor **y) {
  nn_moe *m = moe_of(l);
  moe_route *rt = ctx->ext;
  LP_CHECK(xfinish(l, ctx));
  nn_drop(ctx, M_OUTR);
  lp_tensor *y2 = NULL;
  if (m->o.shared > 0) {
    y2 = ctx->saved[M_SHOUT];
    ctx->saved[M_SHOUT] = NULL;
  } else {
    LP_CHECK(lp_tensor_zeros(rt->be, 2, (int64_t[]){rt->n, m->o.dim}, &y2));
  }
  lp_status st =
      lp_tensor_index_add_rows(y2, ctx->saved[M_COMB], rt->tok, rt->wsend);
  if (st == LP_OK) st = lp_tensor_reshape(y2, rt->xndim, rt->xshape, y);
  lp_tensor_free(y2);
  return st;
}

/* ---- input-grad ---- */

static lp_status bwd_dense(lp_nn_layer *l, lp_nn_ctx *ctx, int *waiting) {
  nn_moe *m = moe_of(l);
  moe_route *rt = ctx->ext;
  int64_t D = m->o.dim, n = rt->n;
  const lp_tensor *dy = ctx->in;
  *waiting = 0;
  int ok = dy->ndim == rt->xndim;
  for (int i = 0; ok && i < dy->ndim; i++)
    ok = dy->shape[i] == rt->xshape[i];
  if (!ok) {
    char a[64];
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "dy has shape %s, forward output had %lld tokens of %lld",
                   nn_shape_str(dy, a, sizeof a), (long long)n, (long long)D);
  }
  lp_tensor *dyd = NULL, *dy2 = NULL, *dlog, *dx, *dcomb;
  LP_CHECK(nn_dense(dy, &dyd));
  lp_status st = lp_tensor_reshape(dyd, 2, (int64_t[]){n, D}, &dy2);
  lp_tensor_free(dyd);
  LP_CHECK(st);
  nn_keep(ctx, M_DY, dy2);
  /* the weighted dy rows go back to the experts first: the router's and
   * the shared expert's backward (they need dy only) run while they fly */
  LP_CHECK(new2(rt, rt->pairs, D, &dcomb));
  nn_keep(ctx, M_DCOMB, dcomb);
  LP_CHECK(lp_tensor_gather_rows(dcomb, dy2, rt->tok, rt->wsend));
  if (m->size == 1) {
    LP_CHECK(lp_tensor_view(dcomb, &ctx->saved[M_DOUTR]));
  } else {
    lp_tensor *doutr;
    LP_CHECK(new2(rt, rt->r, D, &doutr));
    nn_keep(ctx, M_DOUTR, doutr);
    *waiting = 1;
    LP_CHECK(xstart_rows(l, ctx, dcomb, rt->sc, doutr, rt->rc,
                         LP_NN_X_COMBINE_BACKWARD));
  }

  /* the router's backward (moe_route.c), then dx = dlog Wr and the
   * shared expert's dx added */
  LP_CHECK(moe_router_backward(l, rt, dy2, ctx->saved[M_COMB], &dlog));
  nn_keep(ctx, M_DLOG, dlog);
  LP_CHECK(new2(rt, n, D, &dx));
  nn_keep(ctx, M_DX, dx);
  LP_CHECK(lp_tensor_gemm(dx, 1.0f, dlog, 0, P_ROUTER(l), 0, 0.0f));

  if (m->o.shared > 0) {
    lp_tensor *da1, *da3;
    LP_CHECK(new2(rt, n, m->hs, &da1));
    nn_keep(ctx, M_SHDA1, da1);
    LP_CHECK(new2(rt, n, m->hs, &da3));
    nn_keep(ctx, M_SHDA3, da3);
    LP_CHECK(nn_swiglu_bwd(l->precision, dy2, ctx->saved[M_SHA1], ctx->saved[M_SHA3],
                        P_SH(l, 0).value, P_SH(l, 1).value, P_SH(l, 2).value,
                        da1, da3, dx, 1.0f));
    LP_CHECK(nn_pack_slot(ctx, l->precision, M_SHDA1));
    LP_CHECK(nn_pack_slot(ctx, l->precision, M_SHDA3));
    nn_drop(ctx, M_SHA1);
    nn_drop(ctx, M_SHA3);
  }
  nn_drop(ctx, M_COMB);
  return LP_OK;
}

static lp_status bwd_experts(lp_nn_layer *l, lp_nn_ctx *ctx, int *waiting) {
  nn_moe *m = moe_of(l);
  moe_route *rt = ctx->ext;
  int64_t D = m->o.dim, H = m->o.hidden, R = rt->r;
  *waiting = 0;
  LP_CHECK(xfinish(l, ctx));
  nn_drop(ctx, M_DCOMB);
  lp_tensor *dout, *da1, *da3, *dxe = NULL, *dxr;
  LP_CHECK(new2(rt, R, D, &dout));
  nn_keep(ctx, M_DOUT, dout);
  LP_CHECK(lp_tensor_gather_rows(dout, ctx->saved[M_DOUTR], rt->emap, NULL));
  nn_drop(ctx, M_DOUTR);
  /* dout, da1, da3: read by GEMMs only from here (da1, da3 packed once
   * every slot has used them) */
  LP_CHECK(nn_pack_slot(ctx, l->precision, M_DOUT));
  dout = ctx->saved[M_DOUT];
  LP_CHECK(new2(rt, R, H, &da1));
  nn_keep(ctx, M_DA1, da1);
  LP_CHECK(new2(rt, R, H, &da3));
  nn_keep(ctx, M_DA3, da3);
  LP_CHECK(new2(rt, R, D, &dxr));
  nn_keep(ctx, M_DXR, dxr);
  lp_status st = new2(rt, R, D, &dxe);
  for (int j = 0; j < m->spr && st == LP_OK; j++) {
    int64_t a = rt->soff[j], n = rt->soff[j + 1] - a;
    if (n == 0) continue;
    lp_tensor *v[6] = {NULL};
    st = rows_of(dout, a, n, &v[0]);
    if (st == LP_OK) st = rows_of(ctx->saved[M_A1], a, n, &v[1]);
    if (st == LP_OK) st = rows_of(ctx->saved[M_A3], a, n, &v[2]);
    if (st == LP_OK) st = rows_of(da1, a, n, &v[3]);
    if (st == LP_OK) st = rows_of(da3, a, n, &v[4]);
    if (st == LP_OK) st = rows_of(dxe, a, n, &v[5]);
    if (st == LP_OK)
      st = nn_swiglu_bwd(l->precision, v[0], v[1], v[2], P_SLOT(l, j, 0).value,
                      P_SLOT(l, j, 1).value, P_SLOT(l, j, 2).value, v[3], v[4],
                      v[5], 0.0f);
    for (int i = 0; i < 6; i++)
      lp_tensor_free(v[i]);
  }
  if (st == LP_OK) st = lp_tensor_gather_rows(dxr, dxe, rt->rmap, NULL);
  /* bf16: so are their input-grads (the dispatch backward's rows) */
  if (st == LP_OK && l->precision == LP_TENSOR_BF16) st = lp_tensor_round_bf16(&dxr);
  lp_tensor_free(dxe);
  LP_CHECK(st);
  nn_drop(ctx, M_A1);
  nn_drop(ctx, M_A3);
  LP_CHECK(nn_pack_slot(ctx, l->precision, M_DA1));
  LP_CHECK(nn_pack_slot(ctx, l->precision, M_DA3));
  if (m->size == 1) return lp_tensor_view(dxr, &ctx->saved[M_DXS]);
  lp_tensor *dxs;
  LP_CHECK(new2(rt, rt->pairs, D, &dxs));
  nn_keep(ctx, M_DXS, dxs);
  *waiting = 1;
  return xstart_rows(l, ctx, dxr, rt->rc, dxs, rt->sc, LP_NN_X_DISPATCH_BACKWARD);
}

static lp_status bwd_dispatch(lp_nn_layer *l, lp_nn_ctx *ctx, lp_tensor **dx) {
  moe_route *rt = ctx->ext;
  LP_CHECK(xfinish(l, ctx));
  nn_drop(ctx, M_DXR);
  lp_tensor *d2 = ctx->saved[M_DX];
  LP_CHECK(lp_tensor_index_add_rows(d2, ctx->saved[M_DXS], rt->tok, NULL));
  nn_drop(ctx, M_DXS);
  if (ctx->want_dx) LP_CHECK(lp_tensor_reshape(d2, rt->xndim, rt->xshape, dx));
  nn_drop(ctx, M_DX);
  return LP_OK;
}

/* ---- the phased pass ---- */

static lp_status moe_advance(lp_nn_layer *l, lp_nn_ctx *ctx, int *done,
                             lp_tensor **out) {
  int wait = 0;
  if (ctx->pass == NN_PASS_FORWARD) {
    switch (ctx->phase) {
    case LP_NN_PHASE_DENSE:
      LP_CHECK(fwd_dense(l, ctx, &wait));
      ctx->phase = LP_NN_PHASE_DISPATCH;
      if (wait) return LP_OK;
      /* fall through */
    case LP_NN_PHASE_DISPATCH:
      LP_CHECK(fwd_dispatch(l, ctx, &wait));
      ctx->phase = LP_NN_PHASE_EXPERTS;
      if (wait) return LP_OK;
      /* fall through */
    case LP_NN_PHASE_EXPERTS:
      LP_CHECK(fwd_experts(l, ctx, &wait));
      ctx->phase = LP_NN_PHASE_COMBINE;
      if (wait) return LP_OK;
      /* fall through */
    default:
      LP_CHECK(fwd_combine(l, ctx, out));
      *done = 1;
      return LP_OK;
    }
  }
  switch (ctx->phase) {
  case LP_NN_PHASE_DENSE:
    LP_CHECK(bwd_dense(l, ctx, &wait));
    ctx->phase = LP_NN_PHASE_EXPERTS;
    if (wait) return LP_OK;
    /* fall through */
  case LP_NN_PHASE_EXPERTS:
    LP_CHECK(bwd_experts(l, ctx, &wait));
    ctx->phase = LP_NN_PHASE_DISPATCH;
    if (wait) return LP_OK;
    /* fall through */
  default:
    LP_CHECK(bwd_dispatch(l, ctx, out));
    *done = 1;
    return LP_OK;
  }
}

static lp_nn_phase moe_phase(const lp_nn_layer *l, const lp_nn_ctx *ctx) {
  (void)l;
  return ctx->phase;
}

/* The routed experts' weight-grads (this rank's slots, on the rows they
 * received), then what only they needed is released. */
static lp_status experts_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  nn_moe *m = moe_of(l);
  moe_route *rt = ctx->ext;
  for (int j = 0; j < m->spr; j++) {
    int64_t a = rt->soff[j], n = rt->soff[j + 1] - a;
    if (n == 0) continue;
    lp_tensor *v[5] = {NULL};
    const int src[5] = {M_XIN, M_H, M_DOUT, M_DA1, M_DA3};
    lp_status st = LP_OK;
    for (int i = 0; i < 5 && st == LP_OK; i++)
      st = rows_of(ctx->saved[src[i]], a, n, &v[i]);
    if (st == LP_OK)
      st = nn_swiglu_wgrad(l->precision, v[0], v[1], v[2], v[3], v[4], P_SLOT(l, j, 0).grad,
                        P_SLOT(l, j, 1).grad, P_SLOT(l, j, 2).grad);
    for (int i = 0; i < 5; i++)
      lp_tensor_free(v[i]);
    LP_CHECK(st);
  }
  rt->experts_w_done = 1;
  nn_drop(ctx, M_XIN), nn_drop(ctx, M_H), nn_drop(ctx, M_DOUT);
  nn_drop(ctx, M_DA1), nn_drop(ctx, M_DA3);
  return LP_OK;
}

static lp_status moe_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  nn_moe *m = moe_of(l);
  moe_route *rt = ctx->ext;
  const lp_tensor *x = ctx->saved[M_X];
  LP_CHECK(lp_tensor_gemm(l->params[0].grad, 1.0f, ctx->saved[M_DLOG], 1, x, 0,
                          1.0f));
  if (m->o.shared > 0)
    LP_CHECK(nn_swiglu_wgrad(l->precision, x, ctx->saved[M_SHH], ctx->saved[M_DY],
                          ctx->saved[M_SHDA1], ctx->saved[M_SHDA3],
                          P_SH(l, 0).grad, P_SH(l, 1).grad, P_SH(l, 2).grad));
  return rt->experts_w_done ? LP_OK : experts_weight_grad(l, ctx);
}

/* The experts' weight-grads ahead of the rest, once the input-grad pass
 * has run their backward (while dispatch-backward is in flight: DeepSeek's
 * MLP(W) right after MLP(B)). Different parameters from the router's and
 * shared expert's: the gradients are bitwise those of weight_grad alone. */
static lp_status moe_weight_grad_part(lp_nn_layer *l, lp_nn_ctx *ctx, int *did) {
  moe_route *rt = ctx->ext;
  int ready = ctx->pass == NN_PASS_INPUT_GRAD ? ctx->phase == LP_NN_PHASE_DISPATCH
              : ctx->pass == NN_PASS_NONE && ctx->stage == LP_NN_CTX_INPUT_GRAD;
  if (!rt || rt->experts_w_done || !ready) return LP_OK;
  lp_status st = experts_weight_grad(l, ctx);
  if (st != LP_OK) return nn_fail(ctx, l, st, "weight_grad: %s", lp_strerror(st));
  *did = 1;
  return LP_OK;
}

const nn_ops nn_moe_ops = {"moe", nn_no_call, nn_no_call, moe_weight_grad};
const nn_phased nn_moe_phased = {moe_advance, moe_phase, moe_weight_grad_part};

