/* gpu_gemm.c — bench_gpu_gemm: Linear forward + backward (y = x W^T, then
 * dx = dy W and dW += dy^T x, no bias) through luapipe's nn layer on
 * cuda:0 against the same three SGEMMs called on raw cuBLAS, for a few
 * shapes. Prints one line per shape: ms per forward+backward, TFLOP/s of
 * each, and the ratio (luapipe time / cuBLAS time). Exits 77 without a
 * device. Full float32 unless LUAPIPE_TF32=1 (then both use TF32). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "lp_kernels.h"
#include "lp_nn.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* median over 5 batches of the mean ms per forward+backward */
static int time_linear(const lp_tensor_backend *G, int64_t tok, int64_t in,
                       int64_t out, int iters, double *ms) {
  lp_nn_layer *lin = NULL;
  lp_nn_ctx *ctx = NULL;
  lp_tensor *x = NULL, *dy = NULL;
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, 1);
  if (lp_nn_linear_new("fc", in, out, 0, 1, &lin) != LP_OK ||
      lp_nn_layer_to(lin, G) != LP_OK || lp_nn_ctx_new(&ctx) != LP_OK ||
      lp_tensor_empty(G, 2, (int64_t[]){tok, in}, &x) != LP_OK ||
      lp_tensor_empty(G, 2, (int64_t[]){tok, out}, &dy) != LP_OK ||
      lp_tensor_fill_uniform(x, &r, -1, 1) != LP_OK ||
      lp_tensor_fill_uniform(dy, &r, -1, 1) != LP_OK)
    return 1;
  double t[5];
  for (int rep = -1; rep < 5; rep++) {
    double t0 = lp_now();
    for (int i = 0; i < iters; i++) {
      lp_tensor *y = NULL, *dx = NULL;
      if (lp_nn_forward(lin, ctx, x, &y) != LP_OK ||
          lp_nn_backward(lin, ctx, dy, &dx) != LP_OK) {
        fprintf(stderr, "bench_gpu_gemm: %s (%s)\n", lp_nn_ctx_last_error(ctx),
                lp_kernels_last_error());
        return 1;
      }
      lp_tensor_free(y), lp_tensor_free(dx);
    }
    if (lp_kernels_cuda_sync(G) != LP_OK) return 1;
    if (rep >= 0) t[rep] = (lp_now() - t0) * 1e3 / iters;
  }
  qsort(t, 5, sizeof t[0], cmp);
  *ms = t[2];
  lp_tensor_free(x), lp_tensor_free(dy);
  lp_nn_ctx_free(ctx);
  lp_nn_layer_release(lin);
  return 0;
}

int main(void) {
  if (!lp_kernels_built_with_cuda() || lp_kernels_device_count() <= 0) {
    printf("bench_gpu_gemm: no device\n");
    return 77;
  }
  const lp_tensor_backend *G = lp_tensor_backend_cuda(0);
  if (!G) {
    fprintf(stderr, "bench_gpu_gemm: %s\n", lp_kernels_last_error());
    return 1;
  }
  static const int64_t shapes[][3] = {/* tokens, in, out */
                                      {2048, 256, 1024},
                                      {4096, 1024, 4096},
                                      {4096, 4096, 1024},
                                      {8192, 4096, 4096}};
  printf("%-20s %10s %10s %10s %10s %8s\n", "tokens x in x out", "luapipe ms",
         "cuBLAS ms", "lp TF/s", "cuBLAS TF/s", "ratio");
  int bad = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    int64_t tok = shapes[i][0], in = shapes[i][1], out = shapes[i][2];
    double flops = 3.0 * 2.0 * (double)tok * (double)in * (double)out;
    int iters = flops > 1e11 ? 5 : 40;
    double lin = 0, f = 0, b1 = 0, b2 = 0;
    if (time_linear(G, tok, in, out, iters, &lin)) return 1;
    if (lp_kernels_bench_sgemm(0, 0, 1, tok, out, in, 0.0f, iters, &f) ||
        lp_kernels_bench_sgemm(0, 0, 0, tok, in, out, 0.0f, iters, &b1) ||
        lp_kernels_bench_sgemm(0, 1, 0, out, in, tok, 1.0f, iters, &b2)) {
      fprintf(stderr, "bench_gpu_gemm: %s\n", lp_kernels_last_error());
      return 1;
    }
    double raw = f + b1 + b2;
    char shape[32];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)tok,
             (long long)in, (long long)out);
    printf("%-20s %10.3f %10.3f %10.1f %10.1f %8.3f\n", shape, lin, raw,
           flops / lin / 1e9, flops / raw / 1e9, lin / raw);
    if (!(lin > 0 && raw > 0)) bad = 1;
  }
  return bad;
}
