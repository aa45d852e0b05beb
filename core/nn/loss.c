/* loss.c — cross-entropy (from logits and integral class ids) and MSE, each
 * giving the mean loss and, optionally, its scaled gradient. Host loops,
 * double accumulation, fixed order. */
#include "nn_internal.h"

#include <math.h>

static int host_ok(const lp_tensor *t) {
  return lp_tensor_backend_of(t)->host_accessible;
}

lp_status lp_nn_loss_cross_entropy(const lp_tensor *logits,
                                   const lp_tensor *targets, float grad_scale,
                                   double *loss, lp_tensor **dlogits) {
  if (dlogits) *dlogits = NULL;
  if (!logits || !targets || !loss) return LP_ERR_ARG;
  if (!host_ok(logits) || !host_ok(targets)) return LP_ERR_UNSUPPORTED;
  int64_t rows, v;
  lp_tensor_rows_cols(logits, &rows, &v);
  if (lp_tensor_numel(targets) != rows || v < 1) return LP_ERR_ARG;
  lp_tensor *ld = NULL, *td = NULL;
  lp_status st;
  LP_CHECK_GOTO(nn_dense(logits, &ld), st, fail);
  LP_CHECK_GOTO(nn_dense(targets, &td), st, fail);
  for (int64_t r = 0; r < rows; r++) {
    float t = td->data[r];
    if (!(t >= 0.0f && t < (float)v) || t != floorf(t)) {
      st = LP_ERR_ARG;
      lp_log(LP_LOG_DEBUG,
             "cross_entropy: target %g at row %lld not in [0, %lld)", (double)t,
             (long long)r, (long long)v);
      goto fail;
    }
  }
  if (dlogits) LP_CHECK_GOTO(lp_tensor_empty_like(ld, dlogits), st, fail);
  double total = 0.0, gs = rows ? (double)grad_scale / (double)rows : 0.0;
  for (int64_t r = 0; r < rows; r++) {
    const float *lr = ld->data + r * v;
    int64_t t = (int64_t)td->data[r];
    float m = lr[0];
    for (int64_t j = 1; j < v; j++)
      if (lr[j] > m) m = lr[j];
    double s = 0.0;
    for (int64_t j = 0; j < v; j++)
      s += exp((double)lr[j] - m);
    total += (double)m + log(s) - (double)lr[t];
    if (dlogits) {
      float *g = (*dlogits)->data + r * v;
      for (int64_t j = 0; j < v; j++)
        g[j] =
            (float)(gs * (exp((double)lr[j] - m) / s - (j == t ? 1.0 : 0.0)));
    }
  }
  *loss = rows ? total / (double)rows : 0.0;
  lp_tensor_free(ld);
  lp_tensor_free(td);
  return LP_OK;
fail:
  if (dlogits) {
    lp_tensor_free(*dlogits);
    *dlogits = NULL;
  }
  lp_tensor_free(ld);
  lp_tensor_free(td);
  return st;
}

lp_status lp_nn_loss_mse(const lp_tensor *pred, const lp_tensor *target,
                         float grad_scale, double *loss, lp_tensor **dpred) {
  if (dpred) *dpred = NULL;
  if (!pred || !target || !loss || !lp_tensor_same_shape(pred, target))
    return LP_ERR_ARG;
  if (!host_ok(pred) || !host_ok(target)) return LP_ERR_UNSUPPORTED;
  lp_tensor *pd = NULL, *td = NULL;
  lp_status st;
  LP_CHECK_GOTO(nn_dense(pred, &pd), st, fail);
  LP_CHECK_GOTO(nn_dense(target, &td), st, fail);
  if (dpred) LP_CHECK_GOTO(lp_tensor_empty_like(pd, dpred), st, fail);
  int64_t n = lp_tensor_numel(pd);
  double total = 0.0, gs = n ? 2.0 * (double)grad_scale / (double)n : 0.0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)pd->data[i] - (double)td->data[i];
    total += d * d;
    if (dpred) (*dpred)->data[i] = (float)(gs * d);
  }
  *loss = n ? total / (double)n : 0.0;
  lp_tensor_free(pd);
  lp_tensor_free(td);
  return LP_OK;
fail:
  if (dpred) {
    lp_tensor_free(*dpred);
    *dpred = NULL;
  }
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
