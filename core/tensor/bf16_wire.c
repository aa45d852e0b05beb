/* bf16_wire.c — bf16 where values cross a boundary: a tensor rounded to
 * bf16 values in place (a layer boundary at precision bf16), and dense
 * float <-> bf16-bit conversions for the buffers that carry such values
 * between ranks (two bytes a value instead of four, lossless for values
 * already rounded). The rounding is lp_tensor_bf16_from_float's (nearest
 * even, NaN kept quiet). */
#include "tensor_internal.h"

void lp_tensor_bf16_pack(const float *src, size_t n, uint16_t *dst) {
  tensor_bf16_round_to((int64_t)n, src, dst);
}

void lp_tensor_bf16_unpack(const uint16_t *src, size_t n, float *dst) {
  tensor_bf16_widen((int64_t)n, src, dst);
}

void lp_tensor_bf16_round_buf(float *x, size_t n) {
  tensor_bf16_round_floats((int64_t)n, x, x);
}

lp_status lp_tensor_round_bf16(lp_tensor **tp) {
  if (!tp || !*tp) return LP_ERR_ARG;
  if (tensor_bf16(*tp)) return LP_OK; /* packed: bf16 values already */
  if (!lp_tensor_is_contiguous(*tp)) {
    lp_tensor *d = NULL;
    LP_CHECK(lp_tensor_clone(*tp, &d));
    lp_tensor_free(*tp);
    *tp = d;
  }
  lp_tensor *t = *tp;
  tensor_touch(t); /* its values change: kept bf16 copies are stale */
  size_t n = (size_t)lp_tensor_numel(t);
  if (n == 0) return LP_OK;
  if (lp_tensor_backend_of(t)->host_accessible) {
    lp_tensor_bf16_round_buf(t->data, n);
    return LP_OK;
  }
  /* device memory: through a host copy (correct, not fast) */
  float *h = lp_malloc(n * sizeof *h);
  if (!h) return LP_ERR_NOMEM;
  lp_status st = lp_tensor_read(t, h);
  if (st == LP_OK) {
    lp_tensor_bf16_round_buf(h, n);
    st = lp_tensor_write(t, h);
  }
  lp_free(h);
  return st;
}
