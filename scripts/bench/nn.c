/* nn.c — bench_nn: CPU compute-layer figures. One row per size:
 *   GEMM (lp_tensor_gemm -> OpenBLAS sgemm): time and GFLOP/s, with a
 *   #wrong column from 64 sampled entries checked in double;
 *   transformer block (lp_nn_transformer_block_new): forward, input-grad,
 *   weight-grad times per micro-batch and the achieved GFLOP/s.
 * Usage: bench_nn [--quick] [--json]. Thread count follows
 * OPENBLAS_NUM_THREADS. Exit status 1 when any entry is wrong. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_nn.h"
#include "lp_tensor.h"

#include "bench_check.h"

static lp_tensor *randn(int ndim, const int64_t *shape, uint64_t seed) {
  lp_tensor *t;
  lp_tensor_rng r;
  CHECK(lp_tensor_empty(NULL, ndim, shape, &t));
  lp_tensor_rng_seed(&r, seed);
  CHECK(lp_tensor_fill_normal(t, &r, 0.0f, 1.0f));
  return t;
}

/* Repeats fn until at least min_s seconds and 3 runs; mean seconds. */
typedef void (*bench_fn)(void *ud);
static double timeit(bench_fn fn, void *ud, double min_s) {
  fn(ud); /* warm-up */
  int n = 0;
  double t0 = lp_now(), t;
  do {
    fn(ud);
    n++;
    t = lp_now() - t0;
  } while (n < 3 || t < min_s);
  return t / n;
}

typedef struct {
  lp_tensor *a, *b, *c;
} gemm_args;

static void run_gemm(void *ud) {
  gemm_args *g = ud;
  CHECK(lp_tensor_gemm(g->c, 1.0f, g->a, 0, g->b, 0, 0.0f));
}

static int bench_gemm(int64_t m, int64_t n, int64_t k, double min_s, int json,
                      int *first) {
  gemm_args g = {randn(2, (int64_t[]){m, k}, 1), randn(2, (int64_t[]){k, n}, 2),
                 NULL};
  CHECK(lp_tensor_zeros(NULL, 2, (int64_t[]){m, n}, &g.c));
  double s = timeit(run_gemm, &g, min_s);
  double gflops = 2.0 * (double)m * (double)n * (double)k / s * 1e-9;
  int wrong = 0;
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, 3);
  for (int i = 0; i < 64; i++) {
    int64_t row = (int64_t)(lp_tensor_rng_next(&r) % (uint64_t)m);
    int64_t col = (int64_t)(lp_tensor_rng_next(&r) % (uint64_t)n);
    double want = 0, mag = 0;
    for (int64_t p = 0; p < k; p++) {
      double v = (double)g.a->data[row * k + p] * g.b->data[p * n + col];
      want += v, mag += fabs(v);
    }
    if (fabs(g.c->data[row * n + col] - want) > 1e-5 * mag + 1e-6) wrong++;
  }
  if (json)
    printf(
        "%s\n    {\"kind\": \"gemm\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
        "\"ms\": %.4f, \"gflops\": %.2f, \"wrong\": %d}",
        *first ? "" : ",", (long long)m, (long long)n, (long long)k, s * 1e3,
        gflops, wrong);
  else
    printf("  %6lld %6lld %6lld %12.3f %10.2f %7d\n", (long long)m,
           (long long)n, (long long)k, s * 1e3, gflops, wrong);
  *first = 0;
  lp_tensor_free(g.a), lp_tensor_free(g.b), lp_tensor_free(g.c);
  return wrong;
}

typedef struct {
  lp_nn_layer *l;
  lp_nn_ctx *ctx;
  lp_tensor *x, *dy;
  int phase; /* 0 forward, 1 forward + I, 2 forward + I + W */
} block_args;

static void run_block(void *ud) {
  block_args *b = ud;
  lp_tensor *y = NULL, *dx = NULL;
  CHECK(lp_nn_forward(b->l, b->ctx, b->x, &y));
  if (b->phase >= 1) CHECK(lp_nn_input_grad(b->l, b->ctx, b->dy, &dx));
  if (b->phase >= 2) CHECK(lp_nn_weight_grad(b->l, b->ctx, NULL));
  lp_nn_ctx_clear(b->ctx);
  lp_tensor_free(y), lp_tensor_free(dx);
}

static void bench_block(int64_t B, int64_t T, int64_t D, int64_t H, int64_t F,
                        double min_s, int json, int *first) {
  block_args b = {NULL, NULL, randn(3, (int64_t[]){B, T, D}, 4),
                  randn(3, (int64_t[]){B, T, D}, 5), 0};
  CHECK(lp_nn_transformer_block_new("blocks.0", D, H, F, LP_TENSOR_ACT_GELU, 1,
                                    &b.l));
  CHECK(lp_nn_ctx_new(&b.ctx));
  double t[3];
  for (b.phase = 0; b.phase < 3; b.phase++)
    t[b.phase] = timeit(run_block, &b, min_s);
  /* stash of one micro-batch after forward */
  lp_tensor *y;
  CHECK(lp_nn_forward(b.l, b.ctx, b.x, &y));
  double stash_mb = (double)lp_nn_ctx_bytes(b.ctx) / (1 << 20);
  lp_nn_ctx_clear(b.ctx);
  lp_tensor_free(y);
  double f = t[0], i = t[1] - t[0], w = t[2] - t[1];
  /* matmul FLOPs: projections 4D^2 + MLP 2DF per token, attention 2 T D
   * per token for QK^T and PV each (full square, mask applied after);
   * backward = 2x forward */
  double fwd_flop = 2.0 * (double)(B * T) * (4.0 * D * D + 2.0 * D * F) +
                    4.0 * (double)(B * T) * (double)T * (double)D;
  double gflops = 3.0 * fwd_flop / t[2] * 1e-9;
  if (json)
    printf(
        "%s\n    {\"kind\": \"block\", \"batch\": %lld, \"seq\": %lld, "
        "\"d_model\": %lld, \"heads\": %lld, \"d_hidden\": %lld, "
        "\"fwd_ms\": %.3f, \"input_grad_ms\": %.3f, \"weight_grad_ms\": %.3f, "
        "\"gflops\": %.2f, \"stash_mib\": %.2f}",
        *first ? "" : ",", (long long)B, (long long)T, (long long)D,
        (long long)H, (long long)F, f * 1e3, i * 1e3, w * 1e3, gflops,
        stash_mb);
  else
    printf(
        "  %4lld %5lld %6lld %3lld %6lld %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n",
        (long long)B, (long long)T, (long long)D, (long long)H, (long long)F,
        f * 1e3, i * 1e3, w * 1e3, t[2] * 1e3, gflops, stash_mb);
  *first = 0;
  lp_nn_ctx_free(b.ctx);
  lp_nn_layer_release(b.l);
  lp_tensor_free(b.x), lp_tensor_free(b.dy);
}

int main(int argc, char **argv) {
  int quick = 0, json = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick"))
      quick = 1;
    else if (!strcmp(argv[i], "--json"))
      json = 1;
    else {
      fprintf(stderr, "usage: bench_nn [--quick] [--json]\n");
      return 2;
    }
  }
  const char *thr = getenv("OPENBLAS_NUM_THREADS");
  double min_s = quick ? 0.05 : 0.5;
  int wrong = 0, first = 1;
  static const int64_t gemms[][3] = {{256, 256, 256},
                                     {512, 512, 512},
                                     {1024, 1024, 1024},
                                     {2048, 2048, 2048},
                                     {4096, 1024, 4096}};
  static const int64_t blocks[][5] = {
      {4, 128, 256, 4, 1024}, {4, 256, 512, 8, 2048}, {2, 512, 1024, 16, 4096}};
  size_t ng = quick ? 3 : sizeof gemms / sizeof gemms[0];
  size_t nb = quick ? 2 : sizeof blocks / sizeof blocks[0];
  if (json) {
    printf("{\"bench\": \"nn\", \"backend\": \"%s\", \"openblas_threads\": "
           "\"%s\", "
           "\"rows\": [",
           lp_tensor_backend_cpu()->name, thr ? thr : "default");
  } else {
    printf("# bench_nn  backend %s  OPENBLAS_NUM_THREADS=%s\n#\n",
           lp_tensor_backend_cpu()->name, thr ? thr : "(default)");
    printf("# GEMM  C[m,n] = A[m,k] B[k,n]\n");
    printf("#      m      n      k    time(ms)    GFLOP/s  #wrong\n");
  }
  for (size_t i = 0; i < ng; i++)
    wrong +=
        bench_gemm(gemms[i][0], gemms[i][1], gemms[i][2], min_s, json, &first);
  if (!json) {
    printf("#\n# transformer block (pre-norm attention + GELU MLP), per "
           "micro-batch\n");
    printf("#    B     T      D   H      F    fwd(ms)    I(ms)     W(ms)  "
           "F+I+W(ms)  GFLOP/s  stash(MiB)\n");
  }
  for (size_t i = 0; i < nb; i++)
    bench_block(blocks[i][0], blocks[i][1], blocks[i][2], blocks[i][3],
                blocks[i][4], min_s, json, &first);
  if (json)
    printf("\n  ], \"wrong\": %d}\n", wrong);
  else
    printf("#\n# #wrong total: %d\n", wrong);
  return wrong ? 1 : 0;
}
