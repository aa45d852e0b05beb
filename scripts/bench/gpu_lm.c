/* gpu_lm.c — bench_gpu_lm: the char-LM of examples/train_char_lm.lua
 * (embedding, pre-norm transformer blocks with GELU MLPs of 4*dim, RMSNorm,
 * a biased head; AdamW lr 5e-3, weight decay 0.01) trained in one process
 * on the CPU and on cuda:0 from the same initialisation and the same
 * windows of a text. Prints each step's two losses, then key=value lines:
 *   max_rel_loss_diff   max over steps of |gpu - cpu| / cpu
 *   gpu_step_ms / cpu_step_ms   median step time (forward, loss, backward,
 *                       AdamW; the loss read back each step) from step 5 on
 * Usage: bench_gpu_lm [--steps N] [--blocks L] [--dim D] [--heads H]
 *          [--context T] [--batch B] [--text FILE] [--device both|cuda|cpu]
 * Exits 77 without a device unless --device cpu. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_kernels.h"
#include "lp_nn.h"

typedef struct cfg {
  int steps, blocks, dim, heads, context, batch;
  const char *text, *device;
} cfg;

static unsigned char *text;
static size_t ntext;
static int vocab, id_of[256];

static int load_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "bench_gpu_lm: cannot read %s\n", path);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  text = malloc((size_t)n + 1);
  ntext = fread(text, 1, (size_t)n, f);
  fclose(f);
  int seen[256] = {0};
  for (size_t i = 0; i < ntext; i++) seen[text[i]] = 1;
  for (int c = 0; c < 256; c++) id_of[c] = seen[c] ? vocab++ : -1;
  return 0;
}

/* the example's window offsets */
static size_t offset(int step, int mb, int b, int T) {
  uint64_t x = 1;
  int v[3] = {step, mb, b};
  for (int i = 0; i < 3; i++) {
    x = (x * 6364136223846793005ull + (uint64_t)v[i] * 1442695040888963407ull + 1) &
        0x7fffffffffffffffull;
    x ^= x >> 31;
  }
  return (size_t)(x % (ntext - (size_t)T - 1));
}

static lp_nn_layer *build(const cfg *c) {
  int n = c->blocks + 3;
  lp_nn_layer **l = calloc((size_t)n, sizeof *l), *chunk = NULL;
  char name[32];
  lp_nn_embedding_new("embed", vocab, c->dim, 1, &l[0]);
  for (int i = 0; i < c->blocks; i++) {
    snprintf(name, sizeof name, "blocks.%d", i);
    lp_nn_transformer_block_new(name, c->dim, c->heads, 4 * c->dim,
                                LP_TENSOR_ACT_GELU, 1, &l[1 + i]);
  }
  lp_nn_rmsnorm_new("norm", c->dim, 1e-5f, &l[c->blocks + 1]);
  lp_nn_linear_new("head", c->dim, vocab, 1, 1, &l[c->blocks + 2]);
  for (int i = 0; i < n; i++)
    if (!l[i]) return NULL;
  lp_nn_chunk_new("lm", l, (size_t)n, &chunk);
  for (int i = 0; i < n; i++) lp_nn_layer_release(l[i]);
  free(l);
  return chunk;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Trains on backend be; losses[steps]; *median_ms. */
static int run(const cfg *c, const lp_tensor_backend *be, double *losses,
               double *median_ms) {
  lp_nn_layer *m = build(c);
  if (!m || lp_nn_layer_to(m, be) != LP_OK) {
    fprintf(stderr, "bench_gpu_lm: model on %s: %s\n", be->name, lp_kernels_last_error());
    return 1;
  }
  size_t np;
  const lp_nn_param *p = lp_nn_params(m, &np);
  lp_nn_optim *o = NULL;
  lp_nn_adamw_opts a = {5e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  if (lp_nn_optim_adamw_new(p, np, &a, &o) != LP_OK) return 1;
  int B = c->batch, T = c->context;
  float *xs = malloc((size_t)(B * T) * sizeof *xs), *ys = malloc((size_t)(B * T) * sizeof *ys);
  double *times = calloc((size_t)c->steps, sizeof *times);
  lp_nn_ctx *ctx = NULL;
  lp_nn_ctx_new(&ctx);
  int nt = 0;
  for (int s = 0; s < c->steps; s++) {
    for (int b = 0; b < B; b++) {
      size_t off = offset(s, 0, b, T);
      for (int t = 0; t < T; t++) {
        xs[b * T + t] = (float)id_of[text[off + (size_t)t]];
        ys[b * T + t] = (float)id_of[text[off + (size_t)t + 1]];
      }
    }
    double t0 = lp_now();
    lp_tensor *x = NULL, *y = NULL, *logits = NULL, *dl = NULL, *dx = NULL;
    lp_status st = lp_tensor_from_data(NULL, 2, (int64_t[]){B, T}, xs, &x);
    if (st == LP_OK) st = lp_tensor_from_data(NULL, 1, (int64_t[]){B * T}, ys, &y);
    if (st == LP_OK) st = lp_nn_optim_zero_grad(o);
    if (st == LP_OK) st = lp_nn_forward(m, ctx, x, &logits);
    if (st == LP_OK) st = lp_nn_loss_cross_entropy(logits, y, 1.0f, &losses[s], &dl);
    if (st == LP_OK) st = lp_nn_backward(m, ctx, dl, &dx);
    if (st == LP_OK) st = lp_nn_optim_step(o);
    if (st == LP_OK && !be->host_accessible) st = lp_kernels_cuda_sync(be);
    if (st != LP_OK) {
      fprintf(stderr, "bench_gpu_lm: step %d on %s: %s %s %s\n", s, be->name,
              lp_strerror(st), lp_nn_ctx_last_error(ctx), lp_kernels_last_error());
      return 1;
    }
    if (s >= 5) times[nt++] = (lp_now() - t0) * 1e3;
    lp_tensor_free(x), lp_tensor_free(y), lp_tensor_free(logits);
    lp_tensor_free(dl), lp_tensor_free(dx);
  }
  qsort(times, (size_t)nt, sizeof *times, cmpd);
  *median_ms = nt ? times[nt / 2] : 0;
  lp_nn_ctx_free(ctx);
  lp_nn_optim_free(o);
  lp_nn_layer_release(m);
  free(xs), free(ys), free(times);
  return 0;
}

int main(int argc, char **argv) {
  cfg c = {50, 4, 256, 8, 128, 16, "/usr/share/common-licenses/GPL-3", "both"};
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *k = argv[i], *v = argv[i + 1];
    if (!strcmp(k, "--steps")) c.steps = atoi(v);
    else if (!strcmp(k, "--blocks")) c.blocks = atoi(v);
    else if (!strcmp(k, "--dim")) c.dim = atoi(v);
    else if (!strcmp(k, "--heads")) c.heads = atoi(v);
    else if (!strcmp(k, "--context")) c.context = atoi(v);
    else if (!strcmp(k, "--batch")) c.batch = atoi(v);
    else if (!strcmp(k, "--text")) c.text = v;
    else if (!strcmp(k, "--device")) c.device = v;
    else {
      fprintf(stderr, "bench_gpu_lm: unknown option %s\n", k);
      return 2;
    }
  }
  int want_cpu = strcmp(c.device, "cuda") != 0, want_gpu = strcmp(c.device, "cpu") != 0;
  if (c.steps < 1 || c.blocks < 1 || c.dim < 1 || c.heads < 1 || c.dim % c.heads ||
      c.context < 1 || c.batch < 1 || (!want_cpu && !want_gpu)) {
    fprintf(stderr, "bench_gpu_lm: bad sizes or --device (both|cuda|cpu)\n");
    return 2;
  }
  const lp_tensor_backend *G = NULL;
  if (want_gpu) {
    if (lp_kernels_device_count() <= 0) {
      printf("bench_gpu_lm: no device\n");
      return 77;
    }
    if (!(G = lp_tensor_backend_cuda(0))) {
      fprintf(stderr, "bench_gpu_lm: %s\n", lp_kernels_last_error());
      return 1;
    }
  }
  if (load_text(c.text)) return 1;
  if (ntext < (size_t)c.context + 2) {
    fprintf(stderr, "bench_gpu_lm: %s is shorter than the context\n", c.text);
    return 1;
  }
  double *lc = calloc((size_t)c.steps, sizeof *lc), *lg = calloc((size_t)c.steps, sizeof *lg);
  double mc = 0, mg = 0;
  printf("char-LM: vocab %d, %d blocks, dim %d, %d heads, batch %d x %d chars, %d steps\n",
         vocab, c.blocks, c.dim, c.heads, c.batch, c.context, c.steps);
  if (want_cpu && run(&c, lp_tensor_backend_cpu(), lc, &mc)) return 1;
  if (want_gpu && run(&c, G, lg, &mg)) return 1;
  double worst = 0;
  for (int s = 0; s < c.steps; s++) {
    double rel = want_cpu && want_gpu ? fabs(lg[s] - lc[s]) / fabs(lc[s]) : 0;
    if (rel > worst || rel != rel) worst = rel;
    printf("step %d cpu %.6f cuda %.6f\n", s + 1, lc[s], lg[s]);
  }
  if (want_cpu && want_gpu) printf("max_rel_loss_diff=%.3g\n", worst);
  if (want_gpu) printf("gpu_step_ms=%.3f\n", mg);
  if (want_cpu) printf("cpu_step_ms=%.3f\n", mc);
  printf("final_loss=%.6f\n", want_gpu ? lg[c.steps - 1] : lc[c.steps - 1]);
  free(lc), free(lg);
  return 0;
}
