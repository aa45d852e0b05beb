/* test_cpu_kernels_isa.c — the CPU backend gives the same bits whichever
 * instruction set runs it. The library's backend_cpu.c is built as clones
 * (AVX-512, AVX2, generic x86-64) of which this CPU's best runs; this file
 * compiles the same source once more without clones (the generic x86-64
 * build: SSE2) and compares every vectorized kernel of the two, bit for
 * bit, on lengths with and without vector tails. Ranks on one machine run
 * one clone; this is what lets a run on another CPU reproduce them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the second copy: generic x86-64, its two public names renamed */
#define LP_NO_VEC_CLONES 1
#define lp_tensor_backend_cpu generic_backend_cpu
#define lp_tensor_cpu_expf generic_cpu_expf
#include "../../core/tensor/backend_cpu.c"
#undef lp_tensor_backend_cpu
#undef lp_tensor_cpu_expf
const lp_tensor_backend *lp_tensor_backend_cpu(void);
void lp_tensor_cpu_expf(int64_t n, const float *x, float *y);

#include "kernel_inputs.h"

static float *dup(const float *x, int64_t n) {
  float *y = malloc(sizeof(float) * (size_t)(n ? n : 1));
  assert_non_null(y);
  memcpy(y, x, sizeof(float) * (size_t)n);
  return y;
}

static void same(const void *a, const void *b, size_t bytes) { assert_memory_equal(a, b, bytes); }

static const int64_t lens[] = {1, 7, 16, 17, 31, 64, 100, 1000, 3072};
enum { NL = sizeof lens / sizeof lens[0] };

static void test_exp_and_activations(void **state) {
  (void)state;
  const lp_tensor_backend *v = lp_tensor_backend_cpu(), *g = generic_backend_cpu();
  enum { N = 200003 };
  float *x = vec(N, 1, -110.0f, 95.0f), *dy = vec(N, 2, -1, 1);
  x[5] = INFINITY, x[6] = -INFINITY, x[7] = NAN, x[8] = 0.0f, x[9] = -0.0f;
  float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
  lp_tensor_cpu_expf(N, x, a);
  generic_cpu_expf(N, x, b);
  same(a, b, N * sizeof(float));
  for (int k = 0; k < 2; k++) {
    lp_tensor_act_kind kind = k ? LP_TENSOR_ACT_SILU : LP_TENSOR_ACT_GELU;
    assert_int_equal(v->act(v, kind, N, x, a), LP_OK);
    assert_int_equal(g->act(g, kind, N, x, b), LP_OK);
    same(a, b, N * sizeof(float));
    assert_int_equal(v->act_backward(v, kind, N, x, dy, a), LP_OK);
    assert_int_equal(g->act_backward(g, kind, N, x, dy, b), LP_OK);
    same(a, b, N * sizeof(float));
  }
  free(x), free(dy), free(a), free(b);
}

static void test_rows(void **state) {
  (void)state;
  const lp_tensor_backend *v = lp_tensor_backend_cpu(), *g = generic_backend_cpu();
  for (int l = 0; l < NL; l++) {
    int64_t c = lens[l], rows = 5, n = rows * c;
    float *x = vec(n, 10 + (uint64_t)l, -20, 20), *d = vec(n, 11 + (uint64_t)l, -1, 1);
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
    assert_int_equal(v->softmax_rows(v, rows, c, x, a), LP_OK);
    assert_int_equal(g->softmax_rows(g, rows, c, x, b), LP_OK);
    same(a, b, sizeof(float) * (size_t)n);
    float *da = dup(d, n), *db = dup(d, n);
    assert_int_equal(v->softmax_backward_rows(v, rows, c, a, da), LP_OK);
    assert_int_equal(g->softmax_backward_rows(g, rows, c, b, db), LP_OK);
    same(da, db, sizeof(float) * (size_t)n);
    /* cross-entropy: loss and gradient */
    float tg[5];
    for (int r = 0; r < 5; r++)
      tg[r] = (float)((r * 13 + 1) % c);
    double la[5], lb[5];
    assert_int_equal(v->cross_entropy(v, rows, c, x, tg, 0.25, la, da), LP_OK);
    assert_int_equal(g->cross_entropy(g, rows, c, x, tg, 0.25, lb, db), LP_OK);
    same(la, lb, sizeof la);
    same(da, db, sizeof(float) * (size_t)n);
    /* RMSNorm forward and backward */
    float *w = vec(c, 12, 0.5f, 1.5f), ra[5], rb[5];
    float *ga = calloc((size_t)c, sizeof(float)), *gb = calloc((size_t)c, sizeof(float));
    assert_int_equal(v->rmsnorm(v, rows, c, 1e-6f, x, w, a, ra), LP_OK);
    assert_int_equal(g->rmsnorm(g, rows, c, 1e-6f, x, w, b, rb), LP_OK);
    same(a, b, sizeof(float) * (size_t)n);
    same(ra, rb, sizeof ra);
    assert_int_equal(v->rmsnorm_backward(v, rows, c, x, w, ra, d, da, ga), LP_OK);
    assert_int_equal(g->rmsnorm_backward(g, rows, c, x, w, rb, d, db, gb), LP_OK);
    same(da, db, sizeof(float) * (size_t)n);
    same(ga, gb, sizeof(float) * (size_t)c);
    free(x), free(d), free(a), free(b), free(da), free(db), free(w);
    free(ga), free(gb);
  }
}

static void test_causal_softmax(void **state) {
  (void)state;
  const lp_tensor_backend *v = lp_tensor_backend_cpu(), *g = generic_backend_cpu();
  const int64_t ts[] = {1, 3, 16, 17, 33, 64, 100};
  for (int k = 0; k < 7; k++) {
    int64_t t = ts[k], rows = 3 * t, n = rows * t;
    float *x = vec(n, 20 + (uint64_t)k, -8, 8), *d = vec(n, 21 + (uint64_t)k, -1, 1);
    float *a = dup(x, n), *b = dup(x, n), *da = dup(d, n), *db = dup(d, n);
    assert_int_equal(v->causal_softmax_rows(v, rows, t, a, a), LP_OK);
    assert_int_equal(g->causal_softmax_rows(g, rows, t, b, b), LP_OK);
    same(a, b, sizeof(float) * (size_t)n);
    assert_int_equal(v->causal_softmax_backward_rows(v, rows, t, a, da), LP_OK);
    assert_int_equal(g->causal_softmax_backward_rows(g, rows, t, b, db), LP_OK);
    same(da, db, sizeof(float) * (size_t)n);
    free(x), free(d), free(a), free(b), free(da), free(db);
  }
}

static void test_optimizers_and_elementwise(void **state) {
  (void)state;
  const lp_tensor_backend *v = lp_tensor_backend_cpu(), *g = generic_backend_cpu();
  for (int l = 0; l < NL; l++) {
    int64_t n = lens[l] * 3 + 1;
    float *p = vec(n, 30, -1, 1), *gr = vec(n, 31, -0.1f, 0.1f);
    float *m = vec(n, 32, -0.01f, 0.01f), *s = vec(n, 33, 0, 1e-4f);
    float *p2 = dup(p, n), *m2 = dup(m, n), *s2 = dup(s, n);
    assert_int_equal(v->adamw_step(v, n, 1e-3, 0.9, 0.95, 1e-8, 0.9999, 0.1, 0.05, p, gr, m, s),
                     LP_OK);
    assert_int_equal(g->adamw_step(g, n, 1e-3, 0.9, 0.95, 1e-8, 0.9999, 0.1, 0.05, p2, gr, m2, s2),
                     LP_OK);
    same(p, p2, sizeof(float) * (size_t)n);
    same(m, m2, sizeof(float) * (size_t)n);
    same(s, s2, sizeof(float) * (size_t)n);
    assert_int_equal(v->sgd_step(v, n, 1e-2, 0.9, 1e-4, p, gr, m), LP_OK);
    assert_int_equal(g->sgd_step(g, n, 1e-2, 0.9, 1e-4, p2, gr, m2), LP_OK);
    same(p, p2, sizeof(float) * (size_t)n);
    same(m, m2, sizeof(float) * (size_t)n);
    assert_int_equal(v->axpy(v, n, 0.3f, gr, p), LP_OK);
    assert_int_equal(g->axpy(g, n, 0.3f, gr, p2), LP_OK);
    same(p, p2, sizeof(float) * (size_t)n);
    assert_int_equal(v->mul(v, n, p, gr, m), LP_OK);
    assert_int_equal(g->mul(g, n, p2, gr, m2), LP_OK);
    same(m, m2, sizeof(float) * (size_t)n);
    assert_int_equal(v->add(v, n, p, m, s), LP_OK);
    assert_int_equal(g->add(g, n, p2, m2, s2), LP_OK);
    same(s, s2, sizeof(float) * (size_t)n);
    assert_int_equal(v->scale(v, n, 1.7f, s), LP_OK);
    assert_int_equal(g->scale(g, n, 1.7f, s2), LP_OK);
    same(s, s2, sizeof(float) * (size_t)n);
    assert_int_equal(v->sum_rows(v, 3, lens[l], p, 0.5f, m), LP_OK);
    assert_int_equal(g->sum_rows(g, 3, lens[l], p2, 0.5f, m2), LP_OK);
    same(m, m2, sizeof(float) * (size_t)lens[l]);
    free(p), free(gr), free(m), free(s), free(p2), free(m2), free(s2);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exp_and_activations),
      cmocka_unit_test(test_rows),
      cmocka_unit_test(test_causal_softmax),
      cmocka_unit_test(test_optimizers_and_elementwise),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
