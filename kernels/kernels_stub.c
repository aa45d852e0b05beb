/* kernels_stub.c — what lp_kernels.h answers in a build without CUDA. */
#include "lp_kernels.h"

int lp_kernels_device_count(void) { return 0; }
int lp_kernels_built_with_cuda(void) { return 0; }
const char *lp_kernels_last_error(void) { return "luapipe was built without CUDA (no nvcc)"; }

int lp_kernels_saxpy(size_t n, float alpha, const float *x, float *y) {
  (void)n, (void)alpha, (void)x, (void)y;
  return LP_KERNELS_UNSUPPORTED;
}

int lp_kernels_gelu(size_t n, const float *x, float *y) {
  (void)n, (void)x, (void)y;
  return LP_KERNELS_UNSUPPORTED;
}
