/* loss.c — cross-entropy (from logits and integral class ids) and MSE, each
 * giving the mean loss and, optionally, its scaled gradient. Per-element
 * terms in double on the logits' backend, summed on the host in order. */
#include "nn_internal.h"

#include <math.h>

/* Sums n per-element doubles from backend memory on the host, in order. */
static lp_status sum_doubles(const lp_tensor_backend *be, const double *d,
                             int64_t n, double *out) {
  double *h = lp_malloc((size_t)(n ? n : 1) * sizeof *h);
  if (!h) return LP_ERR_NOMEM;
  lp_status st = be->to_host(be, h, d, (size_t)n * sizeof *h);
  double total = 0.0;
  for (int64_t i = 0; st == LP_OK && i < n; i++)
    total += h[i];
  lp_free(h);
  *out = total;
  return st;
}

/* Backend memory for n doubles (freed with be->free). */
static double *alloc_doubles(const lp_tensor_backend *be, int64_t n) {
  return be->alloc(be, (size_t)(n ? n : 1) * sizeof(double));
}

lp_status lp_nn_loss_cross_entropy(const lp_tensor *logits,
                                   const lp_tensor *targets, float grad_scale,
                                   double *loss, lp_tensor **dlogits) {
  if (dlogits) *dlogits = NULL;
  if (!logits || !targets || !loss) return LP_ERR_ARG;
  int64_t rows, v;
  lp_tensor_rows_cols(logits, &rows, &v);
  if (lp_tensor_numel(targets) != rows || v < 1) return LP_ERR_ARG;
  /* targets may be on the host while the logits are on a device */
  const lp_tensor_backend *be = lp_tensor_backend_of(logits);
  lp_tensor *ld = NULL, *td = NULL, *th = NULL;
  double *per_row = NULL;
  lp_status st;
  LP_CHECK_GOTO(nn_dense(logits, &ld), st, fail);
  LP_CHECK_GOTO(nn_on(targets, be, &td), st, fail);
  LP_CHECK_GOTO(nn_host(targets, &th), st, fail);
  for (int64_t r = 0; r < rows; r++) {
    float t = th->data[r];
    if (!(t >= 0.0f && t < (float)v) || t != floorf(t)) {
      st = LP_ERR_ARG;
      lp_log(LP_LOG_DEBUG,
             "cross_entropy: target %g at row %lld not in [0, %lld)", (double)t,
             (long long)r, (long long)v);
      goto fail;
    }
  }
  if (dlogits) LP_CHECK_GOTO(lp_tensor_empty_like(ld, dlogits), st, fail);
  per_row = alloc_doubles(be, rows);
  if (!per_row) {
    st = LP_ERR_NOMEM;
    goto fail;
  }
  double total, gs = rows ? (double)grad_scale / (double)rows : 0.0;
  LP_CHECK_GOTO(be->cross_entropy(be, rows, v, ld->data, td->data, gs, per_row,
                                  dlogits ? (*dlogits)->data : NULL),
                st, fail);
  LP_CHECK_GOTO(sum_doubles(be, per_row, rows, &total), st, fail);
  *loss = rows ? total / (double)rows : 0.0;
  be->free(be, per_row);
  lp_tensor_free(ld);
  lp_tensor_free(td);
  lp_tensor_free(th);
  return LP_OK;
fail:
  if (dlogits) {
    lp_tensor_free(*dlogits);
    *dlogits = NULL;
  }
  be->free(be, per_row);
  lp_tensor_free(ld);
  lp_tensor_free(td);
  lp_tensor_free(th);
  return st;
}

lp_status lp_nn_loss_mse(const lp_tensor *pred, const lp_tensor *target,
                         float grad_scale, double *loss, lp_tensor **dpred) {
  if (dpred) *dpred = NULL;
  if (!pred || !target || !loss || !lp_tensor_same_shape(pred, target))
    return LP_ERR_ARG;
  const lp_tensor_backend *be = lp_tensor_backend_of(pred);
  lp_tensor *pd = NULL, *td = NULL;
  double *sq = NULL;
  lp_status st;
  LP_CHECK_GOTO(nn_dense(pred, &pd), st, fail);
  LP_CHECK_GOTO(nn_on(target, be, &td), st, fail);
  if (dpred) LP_CHECK_GOTO(lp_tensor_empty_like(pd, dpred), st, fail);
  int64_t n = lp_tensor_numel(pd);
  double total, gs = n ? 2.0 * (double)grad_scale / (double)n : 0.0;
  sq = alloc_doubles(be, n);
  if (!sq) {
    st = LP_ERR_NOMEM;
    goto fail;
  }
  LP_CHECK_GOTO(be->sq_error(be, n, pd->data, td->data, gs, sq,
                             dpred ? (*dpred)->data : NULL),
                st, fail);
  LP_CHECK_GOTO(sum_doubles(be, sq, n, &total), st, fail);
  *loss = n ? total / (double)n : 0.0;
  be->free(be, sq);
  lp_tensor_free(pd);
  lp_tensor_free(td);
  return LP_OK;
fail:
  if (dpred) {
    lp_tensor_free(*dpred);
    *dpred = NULL;
  }
  be->free(be, sq);
  lp_tensor_free(pd);
  lp_tensor_free(td);
  return st;
}

const char *const lp_nn_loss_names[LP_NN_LOSS__N + 1] = {"mse", "cross_entropy", NULL};

lp_status lp_nn_loss(lp_nn_loss_kind kind, const lp_tensor *y, const lp_tensor *target,
                     float grad_scale, double *loss, lp_tensor **dy) {
  switch (kind) {
  case LP_NN_LOSS_MSE: return lp_nn_loss_mse(y, target, grad_scale, loss, dy);
  case LP_NN_LOSS_CROSS_ENTROPY:
    return lp_nn_loss_cross_entropy(y, target, grad_scale, loss, dy);
  default: return LP_ERR_ARG;
  }
}
