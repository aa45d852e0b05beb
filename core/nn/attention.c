/* attention.c — causal multi-head self-attention with Q, K, V, O
 * projections. x [B, T, D]; heads are column blocks of width dh = D / H of
 * the [B*T, D] projections, so per-head GEMMs run in place with ld = D.
 *
 * ctx slots: forward keeps x, q, k, v, P (softmax probabilities
 * [B, H, T, T]) and o (concatenated head outputs, the input of Wo).
 * input_grad keeps dy, dq, dk, dv for W and drops q, k, v, P.
 * weight_grad needs x, o, dy, dq, dk, dv. */
#include "nn_internal.h"

#include <math.h>

enum { A_X, A_Q, A_K, A_V, A_P, A_O, A_DY, A_DQ, A_DK, A_DV };

#define WQ(l) ((l)->params[0].value)
#define WK(l) ((l)->params[1].value)
#define WV(l) ((l)->params[2].value)
#define WO(l) ((l)->params[3].value)

/* Per-batch, head-batched GEMM over the [B, T, D] / [B, H, T, T] layouts:
 * `hd` operands are [T, dh] head blocks (ld D, head stride dh, batch stride
 * T*D); `tt` operands are [T, T] (ld T, head stride T*T, batch stride
 * H*T*T). kinds: 0 = hd, 1 = tt. A and B may be packed bf16 tensors
 * (q, k, v at bf16: nn_pack), read as they are. */
static lp_status head_gemm(const lp_tensor_backend *be,
                           lp_tensor_precision prec, int64_t B, int64_t T,
                           int64_t D, int64_t H, int ta, int tb, int64_t m,
                           int64_t n, int64_t k, float alpha, const lp_tensor *a,
                           int a_tt, const lp_tensor *b, int b_tt, float *c,
                           int c_tt) {
  int64_t dh = D / H;
  int ah = lp_tensor_is_bf16(a), bh = lp_tensor_is_bf16(b);
  if (prec == LP_TENSOR_BF16 && !be->gemm_bf16) return LP_ERR_UNSUPPORTED;
  if ((ah || bh) && !be->gemm_bf16h) return LP_ERR_UNSUPPORTED;
  const char *pa = ah ? (const char *)lp_tensor_bf16_data(a) : (const char *)a->data;
  const char *pb = bh ? (const char *)lp_tensor_bf16_data(b) : (const char *)b->data;
  size_t ea = ah ? sizeof(uint16_t) : sizeof(float), eb = bh ? sizeof(uint16_t) : sizeof(float);
  for (int64_t bi = 0; bi < B; bi++) {
    const char *ab = pa + (size_t)(bi * (a_tt ? H * T * T : T * D)) * ea;
    const char *bb = pb + (size_t)(bi * (b_tt ? H * T * T : T * D)) * eb;
    float *cb = c + bi * (c_tt ? H * T * T : T * D);
    if (ah || bh)
      LP_CHECK(be->gemm_bf16h(be, ta, tb, m, n, k, alpha, ab, ah, a_tt ? T : D,
                              a_tt ? T * T : dh, bb, bh, b_tt ? T : D,
                              b_tt ? T * T : dh, 0.0f, cb, c_tt ? T : D,
                              c_tt ? T * T : dh, H));
    else
      LP_CHECK((prec == LP_TENSOR_BF16 ? be->gemm_bf16 : be->gemm)(
          be, ta, tb, m, n, k, alpha, (const float *)ab, a_tt ? T : D,
          a_tt ? T * T : dh, (const float *)bb, b_tt ? T : D, b_tt ? T * T : dh,
          0.0f, cb, c_tt ? T : D, c_tt ? T * T : dh, H));
  }
  return LP_OK;
}

static lp_status attention_forward(lp_nn_layer *l, lp_nn_ctx *ctx,
                                   const lp_tensor *x, lp_tensor **y) {
  int64_t D = l->dim, H = l->heads;
  if (x->ndim != 3 || x->shape[2] != D) {
    char a[64];
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "input must be [batch, seq, %lld], got %s", (long long)D,
                   nn_shape_str(x, a, sizeof a));
  }
  LP_CHECK(nn_check_device(ctx, l, "input", x));
  int64_t B = x->shape[0], T = x->shape[1], dh = D / H;
  const lp_tensor_backend *be = lp_tensor_backend_of(x);
  lp_tensor *xd = NULL, *q = NULL, *k = NULL, *v = NULL, *p = NULL, *o = NULL;
  lp_status st;
  LP_CHECK(nn_dense(x, &xd));
  /* x and o are read by GEMMs only (here and in weight_grad): at bf16 they
   * are kept as the bf16 values those GEMMs read (nn_pack) */
  LP_CHECK_GOTO(nn_pack(l->precision, &xd), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(xd, &q), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(xd, &k), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(xd, &v), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(xd, &o), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty(be, 4, (int64_t[]){B, H, T, T}, &p), st, fail);
  LP_CHECK_GOTO(nn_gemm(l->precision, q, 1.0f, xd, 0, WQ(l), 1, 0.0f), st, fail);
  LP_CHECK_GOTO(nn_gemm(l->precision, k, 1.0f, xd, 0, WK(l), 1, 0.0f), st, fail);
  LP_CHECK_GOTO(nn_gemm(l->precision, v, 1.0f, xd, 0, WV(l), 1, 0.0f), st, fail);
  /* q, k, v: read by the head GEMMs only */
  LP_CHECK_GOTO(nn_pack(l->precision, &q), st, fail);
  LP_CHECK_GOTO(nn_pack(l->precision, &k), st, fail);
  LP_CHECK_GOTO(nn_pack(l->precision, &v), st, fail);
  /* S = Q K^T / sqrt(dh), masked above the diagonal, softmax -> P */
  float scale = (float)(1.0 / sqrt((double)dh));
  LP_CHECK_GOTO(head_gemm(be, l->precision, B, T, D, H, 0, 1, T, T, dh, scale, q, 0,
                          k, 0, p->data, 1),
                st, fail);
  if (be->causal_softmax_rows) { /* fused: skips the masked triangle */
    LP_CHECK_GOTO(be->causal_softmax_rows(be, B * H * T, T, p->data, p->data), st, fail);
  } else {
    LP_CHECK_GOTO(be->causal_mask(be, B * H * T, T, p->data), st, fail);
    LP_CHECK_GOTO(lp_tensor_softmax_rows(p, p), st, fail);
  }
  /* O = P V */
  LP_CHECK_GOTO(head_gemm(be, l->precision, B, T, D, H, 0, 0, T, dh, T, 1.0f, p, 1,
                          v, 0, o->data, 0),
                st, fail);
  LP_CHECK_GOTO(nn_pack(l->precision, &o), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(xd, y), st, fail);
  LP_CHECK_GOTO(nn_gemm(l->precision, *y, 1.0f, o, 0, WO(l), 1, 0.0f), st, fail);
  nn_keep(ctx, A_X, xd);
  nn_keep(ctx, A_Q, q);
  nn_keep(ctx, A_K, k);
  nn_keep(ctx, A_V, v);
  nn_keep(ctx, A_P, p);
  nn_keep(ctx, A_O, o);
  return LP_OK;
fail:
  lp_tensor_free(xd);
  lp_tensor_free(q);
  lp_tensor_free(k);
  lp_tensor_free(v);
  lp_tensor_free(p);
  lp_tensor_free(o);
  return nn_fail(ctx, l, st, "forward: %s", lp_strerror(st));
}

static lp_status attention_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                                      const lp_tensor *dy, lp_tensor **dx) {
  const lp_tensor *x = ctx->saved[A_X];
  LP_CHECK(nn_check_dy_shape(l, ctx, x, dy));
  LP_CHECK(nn_check_device(ctx, l, "dy", dy));
  int64_t B = x->shape[0], T = x->shape[1], D = l->dim, H = l->heads;
  int64_t dh = D / H;
  const lp_tensor_backend *be = lp_tensor_backend_of(x);
  const lp_tensor *q = ctx->saved[A_Q], *k = ctx->saved[A_K],
                  *v = ctx->saved[A_V], *p = ctx->saved[A_P];
  lp_tensor *dyd = NULL, *dout = NULL, *ds = NULL, *dq = NULL, *dk = NULL,
            *dv = NULL;
  lp_status st;
  LP_CHECK(nn_dense(dy, &dyd));
  /* dy, dq, dk, dv: read by GEMMs only (dx here, the weights' gradients in
   * weight_grad) */
  LP_CHECK_GOTO(nn_pack(l->precision, &dyd), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(x, &dout), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(p, &ds), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(x, &dq), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(x, &dk), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(x, &dv), st, fail);
  /* dO = dY Wo;  dP = dO V^T;  dV = P^T dO */
  LP_CHECK_GOTO(nn_gemm(l->precision, dout, 1.0f, dyd, 0, WO(l), 0, 0.0f), st, fail);
  LP_CHECK_GOTO(head_gemm(be, l->precision, B, T, D, H, 0, 1, T, T, dh, 1.0f, dout, 0,
                          v, 0, ds->data, 1),
                st, fail);
  LP_CHECK_GOTO(head_gemm(be, l->precision, B, T, D, H, 1, 0, T, dh, T, 1.0f, p, 1,
                          dout, 0, dv->data, 0),
                st, fail);
  /* dS = P * (dP - rowsum(dP * P)), in place; masked entries have P = 0 */
  LP_CHECK_GOTO((be->causal_softmax_backward_rows
                     ? be->causal_softmax_backward_rows
                     : be->softmax_backward_rows)(be, B * H * T, T, p->data, ds->data),
                st, fail);
  /* dS feeds two GEMMs: rounded once */
  LP_CHECK_GOTO(nn_pack(l->precision, &ds), st, fail);
  /* dQ = dS K / sqrt(dh);  dK = dS^T Q / sqrt(dh) */
  float scale = (float)(1.0 / sqrt((double)dh));
  LP_CHECK_GOTO(head_gemm(be, l->precision, B, T, D, H, 0, 0, T, dh, T, scale, ds, 1,
                          k, 0, dq->data, 0),
                st, fail);
  LP_CHECK_GOTO(head_gemm(be, l->precision, B, T, D, H, 1, 0, T, dh, T, scale, ds, 1,
                          q, 0, dk->data, 0),
                st, fail);
  LP_CHECK_GOTO(nn_pack(l->precision, &dq), st, fail);
  LP_CHECK_GOTO(nn_pack(l->precision, &dk), st, fail);
  LP_CHECK_GOTO(nn_pack(l->precision, &dv), st, fail);
  if (dx) {
    LP_CHECK_GOTO(lp_tensor_empty_like(x, dx), st, fail);
    LP_CHECK_GOTO(nn_gemm(l->precision, *dx, 1.0f, dq, 0, WQ(l), 0, 0.0f), st, fail);
    LP_CHECK_GOTO(nn_gemm(l->precision, *dx, 1.0f, dk, 0, WK(l), 0, 1.0f), st, fail);
    LP_CHECK_GOTO(nn_gemm(l->precision, *dx, 1.0f, dv, 0, WV(l), 0, 1.0f), st, fail);
  }
  lp_tensor_free(dout);
  lp_tensor_free(ds);
  nn_drop(ctx, A_Q);
  nn_drop(ctx, A_K);
  nn_drop(ctx, A_V);
  nn_drop(ctx, A_P);
  nn_keep(ctx, A_DY, dyd);
  nn_keep(ctx, A_DQ, dq);
  nn_keep(ctx, A_DK, dk);
  nn_keep(ctx, A_DV, dv);
  return LP_OK;
fail:
  lp_tensor_free(dyd);
  lp_tensor_free(dout);
  lp_tensor_free(ds);
  lp_tensor_free(dq);
  lp_tensor_free(dk);
  lp_tensor_free(dv);
  return nn_fail(ctx, l, st, "input_grad: %s", lp_strerror(st));
}

static lp_status attention_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  const lp_tensor *x = ctx->saved[A_X], *o = ctx->saved[A_O];
  LP_CHECK(
      nn_gemm(l->precision, l->params[0].grad, 1.0f, ctx->saved[A_DQ], 1, x, 0, 1.0f));
  LP_CHECK(
      nn_gemm(l->precision, l->params[1].grad, 1.0f, ctx->saved[A_DK], 1, x, 0, 1.0f));
  LP_CHECK(
      nn_gemm(l->precision, l->params[2].grad, 1.0f, ctx->saved[A_DV], 1, x, 0, 1.0f));
  LP_CHECK(
      nn_gemm(l->precision, l->params[3].grad, 1.0f, ctx->saved[A_DY], 1, o, 0, 1.0f));
  return LP_OK;
}

static const nn_ops attention_ops = {"attention", attention_forward,
                                     attention_input_grad,
                                     attention_weight_grad};

lp_status lp_nn_attention_new(const char *name, int64_t d_model,
                              int64_t n_heads, uint64_t seed,
                              lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  if (d_model < 1 || n_heads < 1 || d_model % n_heads) return LP_ERR_ARG;
  lp_nn_layer *l;
  LP_CHECK(nn_layer_alloc(&attention_ops, name, &l));
  l->dim = d_model;
  l->heads = n_heads;
  static const char *const names[4] = {"wq", "wk", "wv", "wo"};
  float std = (float)(1.0 / sqrt((double)d_model));
  lp_status st = LP_OK;
  for (int i = 0; i < 4 && st == LP_OK; i++)
    st = nn_add_param(l, names[i], 2, (int64_t[]){d_model, d_model},
                      LP_NN_INIT_NORMAL, std, seed);
  if (st != LP_OK) {
    lp_nn_layer_release(l);
    return st;
  }
  *layer = l;
  return LP_OK;
}
