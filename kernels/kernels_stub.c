/* kernels_stub.c — what lp_kernels.h answers in a build without CUDA. */
#include "lp_kernels.h"

static const char *const no_cuda = "luapipe was built without CUDA (no nvcc)";

int lp_kernels_device_count(void) { return 0; }
int lp_kernels_built_with_cuda(void) { return 0; }
const char *lp_kernels_last_error(void) { return no_cuda; }

const lp_tensor_backend *lp_tensor_backend_cuda(int device) {
  (void)device;
  return NULL;
}
int lp_kernels_cuda_device(const lp_tensor_backend *be) {
  (void)be;
  return -1;
}
lp_status lp_kernels_cuda_sync(const lp_tensor_backend *be) {
  (void)be;
  return LP_ERR_UNSUPPORTED;
}
void lp_kernels_cuda_memory(const lp_tensor_backend *be, size_t *in_use,
                            size_t *cached) {
  (void)be;
  if (in_use) *in_use = 0;
  if (cached) *cached = 0;
}
void lp_kernels_cuda_empty_cache(const lp_tensor_backend *be) { (void)be; }
void *lp_kernels_cuda_stream(const lp_tensor_backend *be) {
  (void)be;
  return NULL;
}
lp_status lp_kernels_cuda_gather_rows(const lp_tensor_backend *be, int64_t n,
                                      int64_t cols, const float *x,
                                      const int64_t *idx, const float *scale,
                                      float *out) {
  (void)be, (void)n, (void)cols, (void)x, (void)idx, (void)scale, (void)out;
  return LP_ERR_UNSUPPORTED;
}
lp_status lp_kernels_cuda_scatter_add_rows(const lp_tensor_backend *be,
                                           int64_t n, int64_t cols,
                                           const float *x, const int64_t *idx,
                                           const float *scale, float *out) {
  (void)be, (void)n, (void)cols, (void)x, (void)idx, (void)scale, (void)out;
  return LP_ERR_UNSUPPORTED;
}
lp_status lp_kernels_cuda_dot_rows(const lp_tensor_backend *be, int64_t n,
                                   int64_t cols, const float *a,
                                   const int64_t *idx, const float *b,
                                   float *out) {
  (void)be, (void)n, (void)cols, (void)a, (void)idx, (void)b, (void)out;
  return LP_ERR_UNSUPPORTED;
}
void *lp_kernels_host_alloc(size_t bytes) { return lp_malloc(bytes ? bytes : 1); }
void lp_kernels_host_free(void *p) { lp_free(p); }

int lp_kernels_bench_sgemm(int device, int trans_a, int trans_b, int64_t m,
                           int64_t n, int64_t k, float beta, int iters,
                           double *ms) {
  (void)device, (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k;
  (void)beta, (void)iters;
  if (ms) *ms = 0;
  return LP_KERNELS_UNSUPPORTED;
}

int lp_kernels_saxpy(size_t n, float alpha, const float *x, float *y) {
  (void)n, (void)alpha, (void)x, (void)y;
  return LP_KERNELS_UNSUPPORTED;
}

int lp_kernels_gelu(size_t n, const float *x, float *y) {
  (void)n, (void)x, (void)y;
  return LP_KERNELS_UNSUPPORTED;
}
