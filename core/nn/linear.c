/* linear.c — Linear (y = x W^T + b) and Embedding (row lookup).
 * ctx slots: 0 = x (or ids), 1 = dy (from input_grad, for W). */
#include "nn_internal.h"

#include <math.h>

enum { S_X = 0, S_DY = 1 };

/* Checks dy against the shape forward produced: x's shape with the last
 * dim replaced by `last` (or extended by it when `extend`). */
static lp_status check_dy(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *x,
                          const lp_tensor *dy, int64_t last, int extend) {
  int ok = dy->ndim == x->ndim + extend;
  for (int i = 0; ok && i < x->ndim - !extend; i++)
    ok = dy->shape[i] == x->shape[i];
  if (ok) ok = dy->shape[dy->ndim - 1] == last;
  if (ok) return LP_OK;
  char a[64], b[64];
  return nn_fail(ctx, l, LP_ERR_ARG,
                 "dy has shape %s, forward output had %s%s%lld]",
                 nn_shape_str(dy, a, sizeof a), nn_shape_str(x, b, sizeof b),
                 extend ? " + [" : " with last dim [", (long long)last);
}

/* ---- Linear ---- */

static lp_status linear_forward(lp_nn_layer *l, lp_nn_ctx *ctx,
                                const lp_tensor *x, lp_tensor **y) {
  if (x->shape[x->ndim - 1] != l->in) {
    char a[64];
    return nn_fail(ctx, l, LP_ERR_ARG, "input %s must have %lld features",
                   nn_shape_str(x, a, sizeof a), (long long)l->in);
  }
  LP_CHECK(nn_check_device(ctx, l, "input", x));
  lp_tensor *xd = NULL;
  int64_t sh[LP_TENSOR_MAXDIM];
  lp_status st;
  LP_CHECK(nn_dense(x, &xd));
  /* x is kept for dW = dy^T x only: at bf16, as the bf16 values both GEMMs
   * read */
  LP_CHECK_GOTO(nn_pack(l->precision, &xd), st, fail);
  nn_shape_last(x, l->out, sh);
  LP_CHECK_GOTO(lp_tensor_empty(lp_tensor_backend_of(x), x->ndim, sh, y), st,
                fail);
  LP_CHECK_GOTO(nn_gemm(l->precision, *y, 1.0f, xd, 0, l->params[0].value, 1, 0.0f),
                st, fail);
  if (l->nparams > 1)
    LP_CHECK_GOTO(lp_tensor_add_rowvec(*y, l->params[1].value), st, fail);
  nn_keep(ctx, S_X, xd);
  return LP_OK;
fail:
  lp_tensor_free(xd);
  return nn_fail(ctx, l, st, "forward: %s", lp_strerror(st));
}

static lp_status linear_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                                   const lp_tensor *dy, lp_tensor **dx) {
  const lp_tensor *x = ctx->saved[S_X];
  LP_CHECK(check_dy(l, ctx, x, dy, l->out, 0));
  LP_CHECK(nn_check_device(ctx, l, "dy", dy));
  lp_tensor *dyd;
  LP_CHECK(nn_dense(dy, &dyd));
  /* without a bias (whose gradient sums dy in float32), dy is read by the
   * two GEMMs only */
  lp_status st = l->nparams > 1 ? LP_OK : nn_pack(l->precision, &dyd);
  if (st != LP_OK) {
    lp_tensor_free(dyd);
    return st;
  }
  nn_keep(ctx, S_DY, dyd);
  if (!dx) return LP_OK;
  LP_CHECK(lp_tensor_empty_like(x, dx));
  return nn_gemm(l->precision, *dx, 1.0f, dyd, 0, l->params[0].value, 0, 0.0f);
}

static lp_status linear_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  const lp_tensor *x = ctx->saved[S_X], *dy = ctx->saved[S_DY];
  LP_CHECK(nn_gemm(l->precision, l->params[0].grad, 1.0f, dy, 1, x, 0, 1.0f));
  if (l->nparams > 1) LP_CHECK(lp_tensor_sum_rows(l->params[1].grad, dy, 1.0f));
  return LP_OK;
}

static const nn_ops linear_ops = {"linear", linear_forward, linear_input_grad,
                                  linear_weight_grad};

lp_status lp_nn_linear_new(const char *name, int64_t in, int64_t out, int bias,
                           uint64_t seed, lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  if (in < 1 || out < 1) return LP_ERR_ARG;
  lp_nn_layer *l;
  LP_CHECK(nn_layer_alloc(&linear_ops, name, &l));
  l->in = in, l->out = out;
  lp_status st =
      nn_add_param(l, "weight", 2, (int64_t[]){out, in}, LP_NN_INIT_NORMAL,
                   (float)(1.0 / sqrt((double)in)), seed);
  if (st == LP_OK && bias)
    st = nn_add_param(l, "bias", 1, (int64_t[]){out}, LP_NN_INIT_ZEROS, 0.0f,
                      seed);
  if (st != LP_OK) {
    lp_nn_layer_release(l);
    return st;
  }
  *layer = l;
  return LP_OK;
}

/* ---- Embedding ---- */

static lp_status embedding_forward(lp_nn_layer *l, lp_nn_ctx *ctx,
                                   const lp_tensor *ids, lp_tensor **y) {
  if (ids->ndim >= LP_TENSOR_MAXDIM) {
    char a[64];
    return nn_fail(ctx, l, LP_ERR_ARG, "ids %s may have at most %d dims",
                   nn_shape_str(ids, a, sizeof a), LP_TENSOR_MAXDIM - 1);
  }
  /* ids may live on the host while the table is on a device: they are
   * checked on the host and copied to the table's backend */
  const lp_tensor_backend *be = lp_tensor_backend_of(l->params[0].value);
  lp_tensor *idd = NULL, *idh = NULL;
  lp_status st;
  LP_CHECK(nn_on(ids, be, &idd));
  int64_t n = lp_tensor_numel(idd), sh[LP_TENSOR_MAXDIM];
  LP_CHECK_GOTO(nn_host(ids, &idh), st, fail);
  for (int64_t r = 0; r < n; r++) {
    float v = idh->data[r];
    if (!(v >= 0.0f && v < (float)l->in) || v != floorf(v)) {
      lp_tensor_free(idh);
      lp_tensor_free(idd);
      return nn_fail(
          ctx, l, LP_ERR_ARG,
          "token id %g at position %lld is not an integer in [0, %lld)",
          (double)v, (long long)r, (long long)l->in);
    }
  }
  lp_tensor_free(idh);
  idh = NULL;
  for (int i = 0; i < ids->ndim; i++)
    sh[i] = ids->shape[i];
  sh[ids->ndim] = l->out;
  LP_CHECK_GOTO(lp_tensor_empty(be, ids->ndim + 1, sh, y), st, fail);
  LP_CHECK_GOTO(be->embedding(be, n, l->out, idd->data,
                              l->params[0].value->data, (*y)->data),
                st, fail);
  nn_keep(ctx, S_X, idd);
  return LP_OK;
fail:
  lp_tensor_free(idd);
  return nn_fail(ctx, l, st, "forward: %s", lp_strerror(st));
}

static lp_status embedding_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                                      const lp_tensor *dy, lp_tensor **dx) {
  LP_CHECK(check_dy(l, ctx, ctx->saved[S_X], dy, l->out, 1));
  LP_CHECK(nn_check_device(ctx, l, "dy", dy));
  lp_tensor *dyd;
  LP_CHECK(nn_dense(dy, &dyd));
  nn_keep(ctx, S_DY, dyd);
  if (dx) *dx = NULL; /* ids have no gradient */
  return LP_OK;
}

static lp_status embedding_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  const lp_tensor *ids = ctx->saved[S_X], *dy = ctx->saved[S_DY];
  lp_tensor *g = l->params[0].grad;
  const lp_tensor_backend *be = lp_tensor_backend_of(g);
  return be->embedding_backward(be, lp_tensor_numel(ids), l->out, l->in,
                                ids->data, dy->data, g->data);
}

static const nn_ops embedding_ops = {"embedding", embedding_forward,
                                     embedding_input_grad,
                                     embedding_weight_grad};

lp_status lp_nn_embedding_new(const char *name, int64_t vocab, int64_t dim,
                              uint64_t seed, lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  if (vocab < 1 || dim < 1 || vocab > (1 << 24)) return LP_ERR_ARG;
  lp_nn_layer *l;
  LP_CHECK(nn_layer_alloc(&embedding_ops, name, &l));
  l->in = vocab, l->out = dim;
  lp_status st = nn_add_param(l, "weight", 2, (int64_t[]){vocab, dim},
                              LP_NN_INIT_NORMAL, 1.0f, seed);
  if (st != LP_OK) {
    lp_nn_layer_release(l);
    return st;
  }
  *layer = l;
  return LP_OK;
}
