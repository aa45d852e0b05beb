/* mla.c — bench_mla: CPU time of DeepSeek-V3's MLA layer (lp_nn_mla_new)
 * per micro-batch, forward / input-grad / weight-grad, beside the plain
 * attention layer (lp_nn_attention_new) of the same dim and heads and the
 * SwiGLU MLP. Default shape: batch 4, seq 256, dim 256, 8 heads; MLA head
 * dims 32 nope + 16 rope, 32 value, kv_lora_rank 128, without and with a
 * q LoRA of rank 128; YaRN on (model.py's default max_seq_len). Usage:
 * bench_mla [batch seq dim heads]. Thread count follows
 * OPENBLAS_NUM_THREADS. Times are this thread's CPU time (so that other
 * processes on a shared machine do not count; with OPENBLAS_NUM_THREADS=1
 * all the work runs on this thread), plus the wall time of F+I+W. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "lp_nn.h"
#include "lp_tensor.h"

#include "bench_check.h"

static lp_tensor *randn(const int64_t *shape, uint64_t seed) {
  lp_tensor *t;
  lp_tensor_rng r;
  CHECK(lp_tensor_empty(NULL, 3, shape, &t));
  lp_tensor_rng_seed(&r, seed);
  CHECK(lp_tensor_fill_normal(t, &r, 0.0f, 1.0f));
  return t;
}

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Mean seconds of forward, input-grad, weight-grad over >= 5 runs and
 * >= 1 s, after one warm-up run. */
static void bench(const char *what, lp_nn_layer *l, const lp_tensor *x,
                  const lp_tensor *dy) {
  double t[3] = {0, 0, 0}, wall = 0;
  int n = 0;
  lp_nn_ctx *c;
  CHECK(lp_nn_ctx_new(&c));
  for (int it = -1; it < 5 || t[0] + t[1] + t[2] < 1.0; it++) {
    lp_tensor *y = NULL, *dx = NULL;
    double w0 = lp_now(), t0 = cpu_now();
    CHECK(lp_nn_forward(l, c, x, &y));
    double t1 = cpu_now();
    CHECK(lp_nn_input_grad(l, c, dy, &dx));
    double t2 = cpu_now();
    CHECK(lp_nn_weight_grad(l, c, NULL));
    double t3 = cpu_now();
    if (it >= 0)
      t[0] += t1 - t0, t[1] += t2 - t1, t[2] += t3 - t2, wall += lp_now() - w0, n++;
    lp_tensor_free(y), lp_tensor_free(dx);
  }
  lp_nn_ctx_free(c);
  printf("%-28s %9.2f %9.2f %9.2f %9.2f %9.2f %10lld\n", what, 1e3 * t[0] / n,
         1e3 * t[1] / n, 1e3 * t[2] / n, 1e3 * (t[0] + t[1] + t[2]) / n,
         1e3 * wall / n, (long long)lp_nn_param_numel(l));
}

int main(int argc, char **argv) {
  int64_t B = 4, T = 256, D = 256, H = 8;
  if (argc == 5) B = atoll(argv[1]), T = atoll(argv[2]), D = atoll(argv[3]), H = atoll(argv[4]);
  int64_t shape[3] = {B, T, D};
  lp_tensor *x = randn(shape, 1), *dy = randn(shape, 2);
  printf("# batch %lld, seq %lld, dim %lld, heads %lld\n",
         (long long)B, (long long)T, (long long)D, (long long)H);
  printf("# CPU ms per micro-batch (wall: F+I+W in wall-clock ms)\n");
  printf("%-28s %9s %9s %9s %9s %9s %10s\n", "layer", "forward", "input", "weight",
         "F+I+W", "wall", "params");
  for (int lora = 0; lora < 2; lora++) {
    lp_nn_mla_opts o = lp_nn_mla_defaults();
    o.dim = D, o.n_heads = H, o.q_lora_rank = lora ? 128 : 0;
    o.kv_lora_rank = 128, o.qk_nope_head_dim = 32, o.qk_rope_head_dim = 16;
    o.v_head_dim = 32;
    lp_nn_layer *l;
    CHECK(lp_nn_mla_new("attn", &o, 1, &l));
    bench(lora ? "mla (q lora 128)" : "mla (wq)", l, x, dy);
    lp_nn_layer_release(l);
  }
  lp_nn_layer *a;
  CHECK(lp_nn_attention_new("attn", D, H, 1, &a));
  bench("attention (same dim, heads)", a, x, dy);
  lp_nn_layer_release(a);
  CHECK(lp_nn_swiglu_new("ffn", D, 4 * D, 1, &a));
  bench("swiglu (inter 4 dim)", a, x, dy);
  lp_nn_layer_release(a);
  lp_tensor_free(x), lp_tensor_free(dy);
  return 0;
}
