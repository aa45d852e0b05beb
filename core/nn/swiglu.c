/* swiglu.c — the SwiGLU feed-forward of DeepSeek's model.py (its MLP):
 * y = w2(silu(w1 x) * w3 x) over the last dim, and the three row helpers
 * (nn_swiglu_fwd / _bwd / _wgrad) that do its math, the MoE experts' too.
 *
 * ctx slots: forward keeps x, a1 = x W1^T, a3 = x W3^T and h = silu(a1) *
 * a3 (the input of W2); input_grad keeps dy, da1, da3 for W and drops a1,
 * a3. weight_grad needs x, h, dy, da1, da3. */
#include "nn_internal.h"

#include <math.h>

enum { S_X, S_A1, S_A3, S_H, S_DY, S_DA1, S_DA3 };

#define W1(l) ((l)->params[0])
#define W2(l) ((l)->params[1])
#define W3(l) ((l)->params[2])

lp_status nn_swiglu_fwd(lp_tensor_precision prec, const lp_tensor *x, const lp_tensor *w1,
                        const lp_tensor *w3, const lp_tensor *w2,
                        lp_tensor *a1, lp_tensor *a3, lp_tensor *h,
                        lp_tensor *out) {
  LP_CHECK(nn_gemm(prec, a1, 1.0f, x, 0, w1, 1, 0.0f));
  LP_CHECK(nn_gemm(prec, a3, 1.0f, x, 0, w3, 1, 0.0f));
  LP_CHECK(lp_tensor_act(h, LP_TENSOR_ACT_SILU, a1));
  LP_CHECK(lp_tensor_mul(h, h, a3));
  return nn_gemm(prec, out, 1.0f, h, 0, w2, 1, 0.0f);
}

lp_status nn_swiglu_bwd(lp_tensor_precision prec, const lp_tensor *dout, const lp_tensor *a1,
                        const lp_tensor *a3, const lp_tensor *w1,
                        const lp_tensor *w3, const lp_tensor *w2,
                        lp_tensor *da1, lp_tensor *da3, lp_tensor *dx,
                        float beta) {
  LP_CHECK(nn_gemm(prec, da1, 1.0f, dout, 0, w2, 0, 0.0f)); /* dh */
  LP_CHECK(lp_tensor_act(da3, LP_TENSOR_ACT_SILU, a1));
  LP_CHECK(lp_tensor_mul(da3, da3, da1));
  LP_CHECK(lp_tensor_mul(da1, da1, a3));
  LP_CHECK(lp_tensor_act_backward(da1, LP_TENSOR_ACT_SILU, a1, da1));
  if (!dx) return LP_OK;
  LP_CHECK(nn_gemm(prec, dx, 1.0f, da1, 0, w1, 0, beta));
  return nn_gemm(prec, dx, 1.0f, da3, 0, w3, 0, 1.0f);
}

lp_status nn_swiglu_wgrad(lp_tensor_precision prec, const lp_tensor *x, const lp_tensor *h,
                          const lp_tensor *dout, const lp_tensor *da1,
                          const lp_tensor *da3, lp_tensor *g1, lp_tensor *g3,
                          lp_tensor *g2) {
  LP_CHECK(nn_gemm(prec, g1, 1.0f, da1, 1, x, 0, 1.0f));
  LP_CHECK(nn_gemm(prec, g3, 1.0f, da3, 1, x, 0, 1.0f));
  return nn_gemm(prec, g2, 1.0f, dout, 1, h, 0, 1.0f);
}

/* ---- the layer ---- */

static lp_status swiglu_forward(lp_nn_layer *l, lp_nn_ctx *ctx,
                                const lp_tensor *x, lp_tensor **y) {
  if (x->shape[x->ndim - 1] != l->in) {
    char a[64];
    return nn_fail(ctx, l, LP_ERR_ARG, "input %s must have %lld features",
                   nn_shape_str(x, a, sizeof a), (long long)l->in);
  }
  LP_CHECK(nn_check_device(ctx, l, "input", x));
  lp_tensor *xd = NULL, *a1 = NULL, *a3 = NULL, *h = NULL;
  int64_t hs[LP_TENSOR_MAXDIM];
  lp_status st;
  LP_CHECK(nn_dense(x, &xd));
  /* x, h (and in input_grad dy, da1, da3) are kept for GEMMs only: at bf16
   * as the bf16 values they read (nn_pack) */
  LP_CHECK_GOTO(nn_pack(l->precision, &xd), st, fail);
  nn_shape_last(xd, l->out, hs);
  const lp_tensor_backend *be = lp_tensor_backend_of(xd);
  LP_CHECK_GOTO(lp_tensor_empty(be, xd->ndim, hs, &a1), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty(be, xd->ndim, hs, &a3), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty(be, xd->ndim, hs, &h), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(xd, y), st, fail);
  LP_CHECK_GOTO(nn_swiglu_fwd(l->precision, xd, W1(l).value, W3(l).value, W2(l).value, a1,
                              a3, h, *y),
                st, fail);
  nn_keep(ctx, S_X, xd);
  nn_keep(ctx, S_A1, a1);
  nn_keep(ctx, S_A3, a3);
  nn_keep(ctx, S_H, h);
  return nn_pack_slot(ctx, l->precision, S_H);
fail:
  lp_tensor_free(*y);
  *y = NULL;
  lp_tensor_free(xd), lp_tensor_free(a1), lp_tensor_free(a3), lp_tensor_free(h);
  return nn_fail(ctx, l, st, "forward: %s", lp_strerror(st));
}

static lp_status swiglu_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                                   const lp_tensor *dy, lp_tensor **dx) {
  const lp_tensor *x = ctx->saved[S_X];
  LP_CHECK(nn_check_dy_shape(l, ctx, x, dy));
  LP_CHECK(nn_check_device(ctx, l, "dy", dy));
  lp_tensor *dyd = NULL, *da1 = NULL, *da3 = NULL;
  lp_status st;
  LP_CHECK(nn_dense(dy, &dyd));
  LP_CHECK_GOTO(nn_pack(l->precision, &dyd), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(ctx->saved[S_A1], &da1), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(ctx->saved[S_A1], &da3), st, fail);
  if (dx) LP_CHECK_GOTO(lp_tensor_empty_like(x, dx), st, fail);
  LP_CHECK_GOTO(nn_swiglu_bwd(l->precision, dyd, ctx->saved[S_A1], ctx->saved[S_A3],
                              W1(l).value, W3(l).value, W2(l).value, da1, da3,
                              dx ? *dx : NULL, 0.0f),
                st, fail);
  nn_drop(ctx, S_A1);
  nn_drop(ctx, S_A3);
  nn_keep(ctx, S_DY, dyd);
  nn_keep(ctx, S_DA1, da1);
  nn_keep(ctx, S_DA3, da3);
  LP_CHECK(nn_pack_slot(ctx, l->precision, S_DA1));
  return nn_pack_slot(ctx, l->precision, S_DA3);
fail:
  if (dx) {
    lp_tensor_free(*dx);
    *dx = NULL;
  }
  lp_tensor_free(dyd), lp_tensor_free(da1), lp_tensor_free(da3);
  return nn_fail(ctx, l, st, "input_grad: %s", lp_strerror(st));
}

static lp_status swiglu_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  return nn_swiglu_wgrad(l->precision, ctx->saved[S_X], ctx->saved[S_H], ctx->saved[S_DY],
                         ctx->saved[S_DA1], ctx->saved[S_DA3], W1(l).grad,
                         W3(l).grad, W2(l).grad);
}

static const nn_ops swiglu_ops = {"swiglu", swiglu_forward, swiglu_input_grad,
                                  swiglu_weight_grad};

lp_status lp_nn_swiglu_new(const char *name, int64_t dim, int64_t inter_dim,
                           uint64_t seed, lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  if (dim < 1 || inter_dim < 1) return LP_ERR_ARG;
  lp_nn_layer *l;
  LP_CHECK(nn_layer_alloc(&swiglu_ops, name, &l));
  l->in = dim;
  l->out = inter_dim;
  float s_in = (float)(1.0 / sqrt((double)dim));
  float s_hid = (float)(1.0 / sqrt((double)inter_dim));
  lp_status st = nn_add_param(l, "w1.weight", 2, (int64_t[]){inter_dim, dim},
                              LP_NN_INIT_NORMAL, s_in, seed);
  if (st == LP_OK)
    st = nn_add_param(l, "w2.weight", 2, (int64_t[]){dim, inter_dim},
                      LP_NN_INIT_NORMAL, s_hid, seed);
  if (st == LP_OK)
    st = nn_add_param(l, "w3.weight", 2, (int64_t[]){inter_dim, dim},
                      LP_NN_INIT_NORMAL, s_in, seed);
  if (st != LP_OK) {
    lp_nn_layer_release(l);
    return st;
  }
  *layer = l;
  return LP_OK;
}
