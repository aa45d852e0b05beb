/* precision.c — bench_precision: CPU GEMM GFLOP/s by engine on the model
 * shapes, one row per shape (M x N x K, C = A B^T as Linear's forward):
 *   blas_f32   OpenBLAS sgemm
 *   dnnl_f32   oneDNN's float32 matmul
 *   bf16       the backend's gemm_bf16 as training runs it (bf16 rounding
 *              of both operands included; oneDNN or the fallback, see the
 *              header line)
 *   fb_bf16    the float32 fallback (rounding + sgemm), for comparison
 * with the ratios dnnl_f32/blas_f32 and bf16/blas_f32 taken from the same
 * run (the engines alternate, run after run; the figure is the median of
 * --runs runs of at least --min-ms each, in CPU time of the one thread
 * all engines run on, so other jobs on the machine count less), and #wrong: entries of the bf16
 * results (oneDNN and fallback) off the double-precision product of the
 * bf16-rounded inputs by more than 1e-5 of sum |a||b|.
 * Usage: bench_precision [--quick] [--runs N] [--min-ms T].
 * Exit status 1 when an entry is wrong.
 * bench_precision --stash: the bytes one micro-batch keeps for backward
 * (lp_nn_ctx_bytes after forward, and after input-grad: what a W-split
 * schedule keeps until W), f32 against bf16, for the layers of the
 * examples: a char-LM transformer block, an MoE block of train_moe.lua
 * at --dim 128 --hidden 256, DeepSeek-V3 bench's dense layer (MLA +
 * SwiGLU) and MoE layer. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lp_nn.h"
#include "lp_tensor.h"

#include "bench_check.h"

enum { E_BLAS, E_DNNL, E_BF16, E_FB, NE };
static const char *const ename[NE] = {"blas_f32", "dnnl_f32", "bf16",
                                      "fb_bf16"};

typedef struct {
  int64_t m, n, k;
  float *a, *b, *c;
} shape;

static void run(int e, shape *s) {
  const lp_tensor_backend *be = lp_tensor_backend_cpu();
  switch (e) {
  case E_BLAS: /* OpenBLAS whatever lp_tensor_f32_engine says */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)s->m, (int)s->n,
                (int)s->k, 1.0f, s->a, (int)s->k, s->b, (int)s->k, 0.0f, s->c,
                (int)s->n);
    break;
  case E_DNNL:
    CHECK(lp_tensor_cpu_gemm_onednn_f32(0, 1, s->m, s->n, s->k, 1.0f, s->a,
                                        s->k, s->b, s->k, 0.0f, s->c, s->n));
    break;
  case E_BF16:
  case E_FB:
    lp_tensor_bf16_force_fallback(e == E_FB);
    CHECK(be->gemm_bf16(be, 0, 1, s->m, s->n, s->k, 1.0f, s->a, s->k, 0, s->b,
                        s->k, 0, 0.0f, s->c, s->n, 0, 1));
    lp_tensor_bf16_force_fallback(0);
    break;
  }
}

/* CPU seconds of this thread: on a machine shared with other jobs the
 * figure counts the time the GEMM ran, not the time it waited for a core
 * (every engine runs on this one thread). */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds per call: repeats until min_s has passed (at least 2). */
static double timeit(int e, shape *s, double min_s) {
  int n = 0;
  double t0 = cpu_now(), t;
  do {
    run(e, s);
    n++;
    t = cpu_now() - t0;
  } while (n < 2 || t < min_s);
  return t / n;
}

static int cmp_d(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* Entries of s->c off the double product of the rounded inputs. */
static int count_wrong(const shape *s) {
  int wrong = 0;
  for (int64_t i = 0; i < s->m; i += 1 + s->m / 16)
    for (int64_t j = 0; j < s->n; j += 1 + s->n / 16) {
      double ref = 0, mag = 0;
      for (int64_t p = 0; p < s->k; p++) {
        double x = lp_tensor_bf16_round(s->a[i * s->k + p]);
        double y = lp_tensor_bf16_round(s->b[j * s->k + p]);
        ref += x * y;
        mag += fabs(x * y);
      }
      if (fabs(s->c[i * s->n + j] - ref) > 1e-5 * mag + 1e-30) wrong++;
    }
  return wrong;
}

/* Forward and input-grad of l on x at precision p: the stash bytes after
 * each (b[0], b[1]). */
static void stash_of(lp_nn_layer *l, const lp_tensor *x, lp_tensor_precision p,
                     size_t b[2]) {
  lp_nn_ctx *ctx;
  lp_tensor *y = NULL, *dy = NULL, *dx = NULL;
  CHECK(lp_nn_layer_set_precision(l, p));
  CHECK(lp_nn_ctx_new(&ctx));
  CHECK(lp_nn_forward(l, ctx, x, &y));
  b[0] = lp_nn_ctx_bytes(ctx);
  CHECK(lp_tensor_empty_like(y, &dy));
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, 3);
  CHECK(lp_tensor_fill_normal(dy, &r, 0.0f, 1.0f));
  CHECK(lp_nn_input_grad(l, ctx, dy, &dx));
  b[1] = lp_nn_ctx_bytes(ctx);
  lp_nn_ctx_free(ctx);
  lp_tensor_free(y), lp_tensor_free(dy), lp_tensor_free(dx);
}

static void stash_row(const char *what, lp_nn_layer *l, int ndim, const int64_t *dims) {
  lp_tensor *x;
  CHECK(lp_tensor_empty(NULL, ndim, dims, &x));
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, 5);
  CHECK(lp_tensor_fill_normal(x, &r, 0.0f, 1.0f));
  size_t f[2], h[2];
  stash_of(l, x, LP_TENSOR_F32, f);
  stash_of(l, x, LP_TENSOR_BF16, h);
  printf("%-44s %9.1f %9.1f %6.2f %9.1f %9.1f %6.2f\n", what, f[0] / 1024.0, h[0] / 1024.0,
         (double)h[0] / (double)f[0], f[1] / 1024.0, h[1] / 1024.0, (double)h[1] / (double)f[1]);
  lp_tensor_free(x);
  lp_nn_layer_release(l);
}

static int stash_main(void) {
  printf("# bytes kept for backward per micro-batch (KiB): after forward f32, bf16, "
         "bf16/f32; after input-grad f32, bf16, bf16/f32\n");
  lp_nn_layer *l;
  CHECK(lp_nn_transformer_block_new("blk", 64, 4, 256, LP_TENSOR_ACT_GELU, 1, &l));
  stash_row("char-LM block (dim 64, x 4x64)", l, 3, (int64_t[]){4, 64, 64});
  lp_nn_moe_opts o;
  memset(&o, 0, sizeof o);
  o.dim = 128, o.hidden = 256, o.experts = 8, o.topk = 2, o.shared = 1;
  CHECK(lp_nn_moe_block_new("moe", 2, &o, 1, &l));
  stash_row("train_moe block (dim 128, hidden 256, x 2x64)", l, 3, (int64_t[]){2, 64, 128});
  lp_nn_mla_opts m = lp_nn_mla_defaults();
  m.dim = 256, m.n_heads = 8, m.q_lora_rank = 0, m.kv_lora_rank = 128;
  m.qk_nope_head_dim = 32, m.qk_rope_head_dim = 16, m.v_head_dim = 32, m.max_seq_len = 256;
  lp_nn_layer *k[2];
  CHECK(lp_nn_mla_new("attn", &m, 1, &k[0]));
  CHECK(lp_nn_swiglu_new("ffn", 256, 1024, 1, &k[1]));
  CHECK(lp_nn_chunk_new("dense", k, 2, &l));
  lp_nn_layer_release(k[0]), lp_nn_layer_release(k[1]);
  stash_row("V3 bench dense layer (MLA + SwiGLU, x 4x256)", l, 3, (int64_t[]){4, 256, 256});
  memset(&o, 0, sizeof o);
  o.dim = 256, o.hidden = 128, o.experts = 16, o.topk = 4, o.shared = 1;
  o.router = LP_NN_ROUTER_SOFTMAX;
  CHECK(lp_nn_moe_new("moe", &o, 1, &l));
  stash_row("V3 bench MoE (16 experts top 4 + 1 shared)", l, 2, (int64_t[]){1024, 256});
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--stash")) return stash_main();
  int runs = 5, quick = 0;
  double min_ms = 60;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick"))
      quick = 1;
    else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
      runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--min-ms") && i + 1 < argc)
      min_ms = atof(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_precision [--quick] [--runs N] [--min-ms T]\n");
      return 2;
    }
  }
  if (runs < 1 || runs > 99) runs = 5;
  int have_dnnl = lp_tensor_have_onednn();
  printf("# bf16 engine: %s; OpenBLAS core: %s\n", lp_tensor_bf16_engine(),
         openblas_get_corename());
  printf("# training's float32 GEMMs: %s\n", lp_tensor_f32_engine());
  printf("# GFLOP/s, median of %d runs (engines alternate within a run)%s\n",
         runs, have_dnnl ? "" : "; no oneDNN in this build: dnnl_f32 is -");
  printf("%6s %6s %6s %9s %9s %9s %9s %9s %9s %6s\n", "M", "N", "K",
         ename[0], ename[1], ename[2], ename[3], "dnnl/bl", "bf16/bl",
         "#wrong");
  static const int64_t ms[] = {256, 1024, 4096}, nk[] = {64, 256, 1024};
  int nm = quick ? 2 : 3, nn = quick ? 2 : 3;
  int total_wrong = 0;
  for (int im = 0; im < nm; im++)
    for (int in = 0; in < nn; in++)
      for (int ik = 0; ik < nn; ik++) {
        shape s = {ms[im], nk[in], nk[ik], NULL, NULL, NULL};
        s.a = lp_malloc((size_t)(s.m * s.k) * sizeof(float));
        s.b = lp_malloc((size_t)(s.n * s.k) * sizeof(float));
        s.c = lp_malloc((size_t)(s.m * s.n) * sizeof(float));
        if (!s.a || !s.b || !s.c) return 2;
        lp_tensor_rng r;
        lp_tensor_rng_seed(&r, 7);
        for (int64_t i = 0; i < s.m * s.k; i++)
          s.a[i] = (float)lp_tensor_rng_normal(&r);
        for (int64_t i = 0; i < s.n * s.k; i++)
          s.b[i] = (float)lp_tensor_rng_normal(&r);
        int wrong = 0;
        run(E_BF16, &s);
        wrong += count_wrong(&s);
        run(E_FB, &s);
        wrong += count_wrong(&s);
        total_wrong += wrong;
        double t[NE][99];
        for (int e = 0; e < NE; e++)
          if (e != E_DNNL || have_dnnl) run(e, &s); /* warm-up */
        for (int rr = 0; rr < runs; rr++)
          for (int e = 0; e < NE; e++)
            t[e][rr] = e == E_DNNL && !have_dnnl
                           ? 0
                           : timeit(e, &s, min_ms / 1000.0);
        double flop = 2.0 * (double)s.m * (double)s.n * (double)s.k, g[NE];
        for (int e = 0; e < NE; e++) {
          qsort(t[e], (size_t)runs, sizeof(double), cmp_d);
          double med = t[e][runs / 2];
          g[e] = med > 0 ? flop / med / 1e9 : 0;
        }
        char dn[16] = "-", rd[16] = "-";
        if (have_dnnl) {
          snprintf(dn, sizeof dn, "%.1f", g[E_DNNL]);
          snprintf(rd, sizeof rd, "%.2f", g[E_DNNL] / g[E_BLAS]);
        }
        printf("%6lld %6lld %6lld %9.1f %9s %9.1f %9.1f %9s %9.2f %6d\n",
               (long long)s.m, (long long)s.n, (long long)s.k, g[E_BLAS], dn,
               g[E_BF16], g[E_FB], rd, g[E_BF16] / g[E_BLAS], wrong);
        fflush(stdout);
        lp_free(s.a);
        lp_free(s.b);
        lp_free(s.c);
      }
  printf("# %d wrong\n", total_wrong);
  return total_wrong ? 1 : 0;
}
