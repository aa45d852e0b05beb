/* act_norm.c — elementwise activations (GELU tanh, SiLU) and RMSNorm.
 * ctx slots: act: 0 = x.  rmsnorm: 0 = x, 1 = rstd [rows], 2 = dy. */
#include "nn_internal.h"

/* ---- activations ---- */

static lp_status act_forward(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *x,
                             lp_tensor **y) {
  lp_tensor *xd;
  LP_CHECK(nn_dense(x, &xd));
  lp_status st = lp_tensor_empty_like(xd, y);
  if (st == LP_OK) st = lp_tensor_act(*y, l->act, xd);
  if (st != LP_OK) {
    lp_tensor_free(xd);
    return nn_fail(ctx, l, st, "forward: %s", lp_strerror(st));
  }
  nn_keep(ctx, 0, xd);
  return LP_OK;
}

static lp_status act_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                                const lp_tensor *dy, lp_tensor **dx) {
  const lp_tensor *x = ctx->saved[0];
  LP_CHECK(nn_check_dy_shape(l, ctx, x, dy));
  if (dx) {
    LP_CHECK(lp_tensor_empty_like(x, dx));
    LP_CHECK(lp_tensor_act_backward(*dx, l->act, x, dy));
  }
  nn_drop(ctx, 0); /* W needs nothing */
  return LP_OK;
}

static const nn_ops gelu_ops = {"gelu", act_forward, act_input_grad, NULL};
static const nn_ops silu_ops = {"silu", act_forward, act_input_grad, NULL};

lp_status lp_nn_act_new(const char *name, lp_tensor_act_kind kind,
                        lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  const nn_ops *ops;
  switch (kind) {
  case LP_TENSOR_ACT_GELU:
    ops = &gelu_ops;
    break;
  case LP_TENSOR_ACT_SILU:
    ops = &silu_ops;
    break;
  default:
    return LP_ERR_ARG;
  }
  LP_CHECK(nn_layer_alloc(ops, name, layer));
  (*layer)->act = kind;
  return LP_OK;
}

/* ---- RMSNorm ---- */

enum { R_X = 0, R_RSTD = 1, R_DY = 2 };

static lp_status rmsnorm_forward(lp_nn_layer *l, lp_nn_ctx *ctx,
                                 const lp_tensor *x, lp_tensor **y) {
  if (x->shape[x->ndim - 1] != l->dim) {
    char a[64];
    return nn_fail(ctx, l, LP_ERR_ARG, "input %s must have %lld features",
                   nn_shape_str(x, a, sizeof a), (long long)l->dim);
  }
  LP_CHECK(nn_check_device(ctx, l, "input", x));
  lp_tensor *xd = NULL, *rstd = NULL;
  int64_t rows, d = l->dim;
  lp_status st;
  LP_CHECK(nn_dense(x, &xd));
  lp_tensor_rows_cols(xd, &rows, NULL);
  LP_CHECK_GOTO(
      lp_tensor_empty(lp_tensor_backend_of(x), 1, (int64_t[]){rows}, &rstd), st,
      fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(xd, y), st, fail);
  const lp_tensor_backend *be = lp_tensor_backend_of(xd);
  LP_CHECK_GOTO(be->rmsnorm(be, rows, d, l->eps, xd->data,
                            l->params[0].value->data, (*y)->data, rstd->data),
                st, fail);
  nn_keep(ctx, R_X, xd);
  nn_keep(ctx, R_RSTD, rstd);
  return LP_OK;
fail:
  lp_tensor_free(xd);
  lp_tensor_free(rstd);
  return nn_fail(ctx, l, st, "forward: %s", lp_strerror(st));
}

static lp_status rmsnorm_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                                    const lp_tensor *dy, lp_tensor **dx) {
  const lp_tensor *x = ctx->saved[R_X], *rstd = ctx->saved[R_RSTD];
  LP_CHECK(nn_check_dy_shape(l, ctx, x, dy));
  LP_CHECK(nn_check_device(ctx, l, "dy", dy));
  lp_tensor *dyd;
  LP_CHECK(nn_dense(dy, &dyd));
  nn_keep(ctx, R_DY, dyd);
  if (!dx) return LP_OK;
  LP_CHECK(lp_tensor_empty_like(x, dx));
  int64_t rows;
  lp_tensor_rows_cols(x, &rows, NULL);
  const lp_tensor_backend *be = lp_tensor_backend_of(x);
  return be->rmsnorm_backward(be, rows, l->dim, x->data,
                              l->params[0].value->data, rstd->data, dyd->data,
                              (*dx)->data, NULL);
}

static lp_status rmsnorm_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  const lp_tensor *x = ctx->saved[R_X], *rstd = ctx->saved[R_RSTD],
                  *dy = ctx->saved[R_DY];
  int64_t rows;
  lp_tensor_rows_cols(x, &rows, NULL);
  const lp_tensor_backend *be = lp_tensor_backend_of(x);
  return be->rmsnorm_backward(be, rows, l->dim, x->data,
                              l->params[0].value->data, rstd->data, dy->data,
                              NULL, l->params[0].grad->data);
}

static const nn_ops rmsnorm_ops = {"rmsnorm", rmsnorm_forward,
                                   rmsnorm_input_grad, rmsnorm_weight_grad};

lp_status lp_nn_rmsnorm_new(const char *name, int64_t dim, float eps,
                            lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  if (dim < 1 || !(eps >= 0.0f)) return LP_ERR_ARG;
  lp_nn_layer *l;
  LP_CHECK(nn_layer_alloc(&rmsnorm_ops, name, &l));
  l->dim = dim;
  l->eps = eps;
  lp_status st =
      nn_add_param(l, "weight", 1, (int64_t[]){dim}, LP_NN_INIT_ONES, 0.0f, 0);
  if (st != LP_OK) {
    lp_nn_layer_release(l);
    return st;
  }
  *layer = l;
  return LP_OK;
}
