/* test_kernels.c — CUDA kernels against their CPU twins; exits 77 (skipped)
 * when no device is visible or CUDA is not built in. */
#include "lp_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  if (!lp_kernels_built_with_cuda()) {
    printf("skip: built without CUDA\n");
    return 77;
  }
  if (lp_kernels_device_count() <= 0) {
    printf("skip: no CUDA device visible\n");
    return 77;
  }
  enum { N = 100003 };
  float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *g = malloc(N * sizeof *g);
  int bad = 0;
  for (int i = 0; i < N; i++) {
    x[i] = (float)((i % 97) - 48) / 16.0f;
    y[i] = (float)(i % 13);
  }
  if (lp_kernels_saxpy(N, 0.5f, x, y) != LP_KERNELS_OK) {
    printf("saxpy failed: %s\n", lp_kernels_last_error());
    return 1;
  }
  for (int i = 0; i < N; i++) {
    float want = 0.5f * x[i] + (float)(i % 13);
    if (fabsf(y[i] - want) > 1e-6f * (1 + fabsf(want))) bad++;
  }
  if (lp_kernels_gelu(N, x, g) != LP_KERNELS_OK) {
    printf("gelu failed: %s\n", lp_kernels_last_error());
    return 1;
  }
  for (int i = 0; i < N; i++) {
    float v = x[i];
    float want = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    if (fabsf(g[i] - want) > 1e-5f * (1 + fabsf(want))) bad++;
  }
  printf("%d wrong of %d\n", bad, 2 * N);
  free(x), free(y), free(g);
  return bad ? 1 : 0;
}
