/* tensor_internal.h — private to core/tensor: the storage layout and the
 * strided index walker shared by tensor.c, ops.c and rng.c. */
#pragma once

#include <stdatomic.h>

#include "lp_tensor.h"

struct lp_tensor_storage {
  const lp_tensor_backend *be;
  float *data;     /* base of the allocation */
  size_t n;        /* floats */
  atomic_int refs; /* live headers */
  int owns;        /* 0 for lp_tensor_wrap: data belongs to the caller */
  /* bf16 (gemm_bf16.c): */
  int bf16;        /* 1: data holds n bf16 values (uint16), not floats
                    * (lp_tensor_new_bf16); only GEMMs and copies out read it */
  int keep_bf16;   /* lp_tensor_keep_bf16: bf16 GEMMs use the rounded copy h */
  atomic_uint ver; /* bumped by every write through this module and by
                    * lp_tensor_touch */
  uint16_t *h;     /* keep_bf16: the rounded copy of data (n values), made
                    * at version h_ver (valid when h_ok) */
  unsigned h_ver;
  int h_ok;
};

/* t's values change (any write through this module marks it): a kept bf16
 * copy of its storage is made again before its next use. */
static inline void tensor_touch(const lp_tensor *t) {
  if (t) atomic_fetch_add_explicit(&t->storage->ver, 1, memory_order_relaxed);
}

/* The bf16 conversions over n values, vectorized (gemm_bf16.c; the same
 * bits as lp_tensor_bf16_from_float / _to_float / _round one by one):
 * floats to bf16 bits, floats to bf16 values held in floats (dst may be
 * src), bf16 bits to floats. */
void tensor_bf16_round_to(int64_t n, const float *src, uint16_t *dst);
void tensor_bf16_round_floats(int64_t n, const float *src, float *dst);
void tensor_bf16_widen(int64_t n, const uint16_t *src, float *dst);

/* 1 when t's storage holds bf16 values (lp_tensor_new_bf16). */
static inline int tensor_bf16(const lp_tensor *t) {
  return t && t->storage->bf16;
}

/* Pads t's shape/stride to 4 dims (leading 1s) for the index walker. */
static inline void tensor_pad4(const lp_tensor *t, int64_t sh[4],
                               int64_t st[4]) {
  int pad = 4 - t->ndim;
  for (int i = 0; i < 4; i++) {
    sh[i] = i < pad ? 1 : t->shape[i - pad];
    st[i] = i < pad ? 0 : t->stride[i - pad];
  }
}

/* Offset (elements) of the linear row-major index `lin` in a padded view. */
static inline int64_t tensor_offset4(const int64_t sh[4], const int64_t st[4],
                                     int64_t lin) {
  int64_t off = 0;
  for (int d = 3; d >= 0; d--) {
    int64_t i = lin % sh[d];
    lin /= sh[d];
    off += i * st[d];
  }
  return off;
}

/* Checks that ops may dereference t on the host. */
static inline int tensor_host(const lp_tensor *t) {
  return t->storage->be->host_accessible;
}

/* y[i] = e^x[i] for i < n with the CPU backend's exp (backend_cpu.c's
 * lp_expf: within 2 ulp, vectorized); for its tests. */
void lp_tensor_cpu_expf(int64_t n, const float *x, float *y);
