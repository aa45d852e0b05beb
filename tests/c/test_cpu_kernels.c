/* test_cpu_kernels.c — the CPU backend's vectorized kernels: its exp
 * against libm's (in double) over the whole float range, specials
 * included; every element-wise kernel equal to itself one element at a
 * time (the vector body and the scalar tail give the same bits, so a
 * shard of a tensor computes what the whole does); AdamW against the
 * scalar double formula; softmax, its backward, cross-entropy and RMSNorm
 * against double references; the fused causal softmax equal to mask +
 * softmax to the bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_inputs.h"
#include "lp_tensor.h"
#include "tensor_internal.h"

static const lp_tensor_backend *cpu(void) { return lp_tensor_backend_cpu(); }

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* |y - e| in units of the float spacing at e (2^-149 below the normals). */
static double ulps(float y, double e) {
  int ex;
  frexp(e, &ex);
  double u = ldexp(1.0, (ex - 24 < -149 ? -149 : ex - 24));
  return fabs((double)y - e) / u;
}

/* ---- exp ---- */

static void test_expf_accuracy(void **state) {
  (void)state;
  /* every 61st float from -104 up to 89 (37 million): all the reduction's
   * k, and the subnormal results below e^-87.3 */
  enum { CHUNK = 4096, STEP = 61 };
  static float x[CHUNK], y[CHUNK];
  double worst = 0.0;
  float worst_x = 0.0f;
  int64_t count = 0;
  float lo = -104.0f, hi = 89.0f;
  uint32_t blo, bhi;
  memcpy(&blo, &lo, 4);
  memcpy(&bhi, &hi, 4);
  /* negative floats: bit patterns from 0x80000000 (-0) up to -104's */
  for (int side = 0; side < 2; side++) {
    uint32_t from = side ? 0x00000000u : 0x80000000u;
    uint32_t to = side ? bhi : blo;
    int n = 0;
    for (uint64_t b = from; b <= to; b += STEP) {
      uint32_t bb = (uint32_t)b;
      memcpy(&x[n++], &bb, 4);
      if (n == CHUNK || b + STEP > to) {
        lp_tensor_cpu_expf(n, x, y);
        for (int i = 0; i < n; i++) {
          double e = exp((double)x[i]);
          if (e > (double)FLT_MAX) {
            assert_true(isinf(y[i]) || ulps(y[i], e) <= 2.0);
            continue;
          }
          double u = ulps(y[i], e);
          if (u > worst) worst = u, worst_x = x[i];
        }
        count += n;
        n = 0;
      }
    }
  }
  printf("# lp_expf: %lld inputs, worst %.3f ulp at %.9g\n", (long long)count, worst,
         (double)worst_x);
  assert_true(count > 2200000000 / STEP);
  assert_true(worst <= 2.0);
}

static void test_expf_specials(void **state) {
  (void)state;
  float x[] = {0.0f,    -0.0f,   1.0f,    -1.0f,  INFINITY, -INFINITY, NAN,
               88.72f,  88.73f,  89.0f,   100.0f, 1e30f,    -87.33f,   -103.0f,
               -103.9f, -104.0f, -200.0f, -1e30f, 1e-30f,   -1e-30f};
  enum { N = sizeof x / sizeof x[0] };
  float y[N];
  lp_tensor_cpu_expf(N, x, y);
  assert_true(same_bits(y[0], 1.0f));
  assert_true(same_bits(y[1], 1.0f));
  assert_true(ulps(y[2], exp(1.0)) <= 1.0);
  assert_true(ulps(y[3], exp(-1.0)) <= 1.0);
  assert_true(isinf(y[4]) && y[4] > 0);
  assert_true(same_bits(y[5], 0.0f));
  assert_true(isnan(y[6]));
  assert_true(isfinite(y[7]) && ulps(y[7], exp((double)x[7])) <= 2.0);
  for (int i = 8; i < 12; i++) /* past ln(FLT_MAX): inf, as libm */
    assert_true(isinf(y[i]) && y[i] > 0);
  assert_true(y[12] > 0.0f && ulps(y[12], exp((double)x[12])) <= 2.0);
  assert_true(y[13] > 0.0f && ulps(y[13], exp((double)x[13])) <= 1.0);
  for (int i = 14; i < 18; i++) /* below half the least subnormal: +0 */
    assert_true(same_bits(y[i], (float)exp((double)x[i])));
  assert_true(same_bits(y[18], 1.0f));
  assert_true(same_bits(y[19], 1.0f));
}

/* ---- one element at a time: vector body == scalar tail ---- */

static void test_elementwise_equal_alone(void **state) {
  (void)state;
  const lp_tensor_backend *be = cpu();
  enum { N = 1003 };
  float *x = vec(N, 1, -30.0f, 30.0f), *dy = vec(N, 2, -1.0f, 1.0f);
  float y[N], one;
  lp_tensor_cpu_expf(N, x, y);
  for (int i = 0; i < N; i++) {
    lp_tensor_cpu_expf(1, &x[i], &one);
    assert_true(same_bits(one, y[i]));
  }
  for (int kind = 0; kind < 2; kind++) {
    lp_tensor_act_kind k = kind ? LP_TENSOR_ACT_SILU : LP_TENSOR_ACT_GELU;
    float dx[N];
    assert_int_equal(be->act(be, k, N, x, y), LP_OK);
    assert_int_equal(be->act_backward(be, k, N, x, dy, dx), LP_OK);
    for (int i = 0; i < N; i++) {
      assert_int_equal(be->act(be, k, 1, &x[i], &one), LP_OK);
      assert_true(same_bits(one, y[i]));
      assert_int_equal(be->act_backward(be, k, 1, &x[i], &dy[i], &one), LP_OK);
      assert_true(same_bits(one, dx[i]));
      /* and against the formulas in double (float rounding of u, v^3) */
      double v = x[i], u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
      double ref = kind ? v / (1.0 + exp(-v)) : 0.5 * v * (1.0 + tanh(u));
      assert_true(fabs(y[i] - ref) <= 1e-5 * fabs(ref) + 1e-6);
    }
  }
  /* at an offset: the same elements through another vector alignment */
  float y2[N];
  assert_int_equal(be->act(be, LP_TENSOR_ACT_GELU, N - 3, x + 3, y2), LP_OK);
  assert_int_equal(be->act(be, LP_TENSOR_ACT_GELU, N, x, y), LP_OK);
  for (int i = 0; i < N - 3; i++)
    assert_true(same_bits(y2[i], y[i + 3]));
  free(x);
  free(dy);
}

/* AdamW as lp_tensor.h states it, per element in double. */
static void adamw_ref(int64_t n, double lr, double b1, double b2, double eps, double decay,
                      double bc1, double bc2, float *p, const float *g, float *m, float *v) {
  for (int64_t j = 0; j < n; j++) {
    double gj = g[j];
    double pj = (double)p[j] * decay;
    m[j] = (float)(b1 * (double)m[j] + (1.0 - b1) * gj);
    v[j] = (float)(b2 * (double)v[j] + (1.0 - b2) * gj * gj);
    double den = sqrt((double)v[j] / bc2) + eps;
    p[j] = (float)(pj - lr * ((double)m[j] / bc1) / den);
  }
}

/* Each step from the same state: the backend's p within one float ulp of
 * the formula's (its double results differ by an ulp of a double: only a
 * float at a rounding boundary may differ), m and v to the bit, and one
 * element at a time (the scalar tail) to the bit of the whole. */
static void test_adamw_matches_double_formula(void **state) {
  (void)state;
  const lp_tensor_backend *be = cpu();
  enum { N = 200003 };
  size_t B = N * sizeof(float);
  float *p = vec(N, 3, -1, 1), *g = vec(N, 4, -0.1f, 0.1f);
  float *m = vec(N, 5, -0.01f, 0.01f), *v = vec(N, 6, 0, 1e-4f);
  float *p2 = malloc(B), *m2 = malloc(B), *v2 = malloc(B);
  float *p3 = malloc(B), *m3 = malloc(B), *v3 = malloc(B);
  long differ = 0;
  for (int step = 1; step <= 3; step++) {
    double bc1 = 1 - pow(0.9, step), bc2 = 1 - pow(0.95, step);
    double decay = 1 - 1e-3 * 0.1;
    memcpy(p2, p, B), memcpy(m2, m, B), memcpy(v2, v, B);
    memcpy(p3, p, B), memcpy(m3, m, B), memcpy(v3, v, B);
    assert_int_equal(be->adamw_step(be, N, 1e-3, 0.9, 0.95, 1e-8, decay, bc1, bc2, p, g, m, v),
                     LP_OK);
    adamw_ref(N, 1e-3, 0.9, 0.95, 1e-8, decay, bc1, bc2, p2, g, m2, v2);
    for (int j = 0; j < N; j++) /* one element at a time: the scalar tail */
      assert_int_equal(be->adamw_step(be, 1, 1e-3, 0.9, 0.95, 1e-8, decay, bc1, bc2, p3 + j, g + j,
                                      m3 + j, v3 + j),
                       LP_OK);
    for (int j = 0; j < N; j++) {
      assert_true(same_bits(p[j], p3[j]) && same_bits(m[j], m3[j]) && same_bits(v[j], v3[j]));
      assert_true(same_bits(m[j], m2[j]) && same_bits(v[j], v2[j]));
      if (!same_bits(p[j], p2[j])) {
        differ++;
        assert_true(fabsf(p[j] - p2[j]) <= nextafterf(fabsf(p2[j]), INFINITY) - fabsf(p2[j]));
      }
    }
  }
  printf("# adamw: %ld of %d parameters one float ulp from the divisions' result\n", differ,
         3 * N);
  assert_true(differ <= 3 * N / 10000);
  free(p), free(g), free(m), free(v);
  free(p2), free(m2), free(v2), free(p3), free(m3), free(v3);
}

/* ---- rows ---- */

static const int64_t widths[] = {1, 2, 15, 16, 17, 33, 256, 1000, 3072};
enum { NW = sizeof widths / sizeof widths[0] };

static void test_softmax_rows_and_backward(void **state) {
  (void)state;
  const lp_tensor_backend *be = cpu();
  for (int w = 0; w < NW; w++) {
    int64_t c = widths[w], rows = 3;
    float *x = vec(rows * c, 7 + (uint64_t)w, -20, 20);
    float *y = malloc(sizeof(float) * (size_t)(rows * c));
    float *d = vec(rows * c, 8 + (uint64_t)w, -1, 1);
    float *d0 = malloc(sizeof(float) * (size_t)(rows * c));
    memcpy(d0, d, sizeof(float) * (size_t)(rows * c));
    assert_int_equal(be->softmax_rows(be, rows, c, x, y), LP_OK);
    assert_int_equal(be->softmax_backward_rows(be, rows, c, y, d), LP_OK);
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x + r * c;
      double mx = -INFINITY, s = 0.0, dot = 0.0;
      for (int64_t j = 0; j < c; j++)
        mx = fmax(mx, xr[j]);
      for (int64_t j = 0; j < c; j++)
        s += exp(xr[j] - mx);
      for (int64_t j = 0; j < c; j++)
        dot += (double)d0[r * c + j] * (exp(xr[j] - mx) / s);
      for (int64_t j = 0; j < c; j++) {
        double p = exp(xr[j] - mx) / s;
        assert_true(fabs(y[r * c + j] - p) <= 1e-6 * p + 1e-12);
        double g = p * (d0[r * c + j] - dot);
        assert_true(fabs(d[r * c + j] - g) <= 1e-5 * fabs(g) + 1e-7);
      }
    }
    free(x), free(y), free(d), free(d0);
  }
  /* a fully masked row is zeros; NaN spreads */
  float x[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, y[4];
  assert_int_equal(be->softmax_rows(be, 1, 4, x, y), LP_OK);
  for (int j = 0; j < 4; j++)
    assert_true(same_bits(y[j], 0.0f));
  x[2] = NAN, x[0] = 1.0f;
  assert_int_equal(be->softmax_rows(be, 1, 4, x, y), LP_OK);
  assert_true(isnan(y[2]) && isnan(y[0]));
}

static void test_causal_softmax_equals_mask_then_softmax(void **state) {
  (void)state;
  const lp_tensor_backend *be = cpu();
  assert_non_null(be->causal_softmax_rows);
  assert_non_null(be->causal_softmax_backward_rows);
  const int64_t ts[] = {1, 5, 16, 17, 40};
  for (int k = 0; k < 5; k++) {
    int64_t t = ts[k], rows = 2 * t, n = rows * t; /* two [T, T] blocks */
    float *s = vec(n, 20 + (uint64_t)k, -8, 8), *d = vec(n, 30 + (uint64_t)k, -1, 1);
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
    float *da = malloc(sizeof(float) * (size_t)n), *db = malloc(sizeof(float) * (size_t)n);
    memcpy(a, s, sizeof(float) * (size_t)n);
    assert_int_equal(be->causal_mask(be, rows, t, a), LP_OK);
    assert_int_equal(be->softmax_rows(be, rows, t, a, a), LP_OK);
    memcpy(b, s, sizeof(float) * (size_t)n);
    assert_int_equal(be->causal_softmax_rows(be, rows, t, b, b), LP_OK);
    for (int64_t i = 0; i < n; i++)
      assert_true(same_bits(a[i], b[i]));
    memcpy(da, d, sizeof(float) * (size_t)n);
    memcpy(db, d, sizeof(float) * (size_t)n);
    assert_int_equal(be->softmax_backward_rows(be, rows, t, a, da), LP_OK);
    assert_int_equal(be->causal_softmax_backward_rows(be, rows, t, b, db), LP_OK);
    for (int64_t i = 0; i < n; i++) /* equal; above the diagonal +-0 */
      assert_true(da[i] == db[i]);
    free(s), free(d), free(a), free(b), free(da), free(db);
  }
}

static void test_cross_entropy_against_double(void **state) {
  (void)state;
  const lp_tensor_backend *be = cpu();
  for (int w = 0; w < NW; w++) {
    int64_t v = widths[w], rows = 4;
    float *l = vec(rows * v, 40 + (uint64_t)w, -15, 15);
    float tg[4];
    for (int r = 0; r < 4; r++)
      tg[r] = (float)((r * 7 + 3) % v);
    double loss[4], loss2[4];
    float *dl = malloc(sizeof(float) * (size_t)(rows * v));
    assert_int_equal(be->cross_entropy(be, rows, v, l, tg, 0.5, loss, dl), LP_OK);
    assert_int_equal(be->cross_entropy(be, rows, v, l, tg, 0.5, loss2, NULL), LP_OK);
    for (int64_t r = 0; r < rows; r++) {
      const float *lr = l + r * v;
      assert_true(loss[r] == loss2[r]); /* with or without the gradient */
      double m = -INFINITY, s = 0.0;
      for (int64_t j = 0; j < v; j++)
        m = fmax(m, lr[j]);
      for (int64_t j = 0; j < v; j++)
        s += exp(lr[j] - m);
      int64_t t = (int64_t)tg[r];
      double ref = m + log(s) - lr[t];
      assert_true(fabs(loss[r] - ref) <= 1e-6 * fabs(ref) + 1e-9);
      for (int64_t j = 0; j < v; j++) {
        double g = 0.5 * (exp(lr[j] - m) / s - (j == t ? 1.0 : 0.0));
        assert_true(fabs(dl[r * v + j] - g) <= 1e-6 * fabs(g) + 1e-12);
      }
    }
    free(l), free(dl);
  }
}

static void test_rmsnorm_against_double(void **state) {
  (void)state;
  const lp_tensor_backend *be = cpu();
  for (int w = 0; w < NW; w++) {
    int64_t d = widths[w], rows = 3;
    float *x = vec(rows * d, 50 + (uint64_t)w, -3, 3), *wt = vec(d, 51, 0.5f, 1.5f);
    float *dy = vec(rows * d, 52 + (uint64_t)w, -1, 1);
    float *y = malloc(sizeof(float) * (size_t)(rows * d));
    float *dx = malloc(sizeof(float) * (size_t)(rows * d));
    float *gw = calloc((size_t)d, sizeof(float)), rstd[3];
    assert_int_equal(be->rmsnorm(be, rows, d, 1e-6f, x, wt, y, rstd), LP_OK);
    assert_int_equal(be->rmsnorm_backward(be, rows, d, x, wt, rstd, dy, dx, gw), LP_OK);
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x + r * d, *gr = dy + r * d;
      double ss = 0.0, mm = 0.0;
      for (int64_t c = 0; c < d; c++)
        ss += (double)xr[c] * xr[c];
      double rs = 1.0 / sqrt(ss / (double)d + 1e-6);
      assert_true(fabs(rstd[r] - rs) <= 1e-6 * rs);
      for (int64_t c = 0; c < d; c++)
        mm += (double)gr[c] * wt[c] * xr[c] * rs;
      mm /= (double)d;
      for (int64_t c = 0; c < d; c++) {
        double yr = xr[c] * rs * wt[c];
        assert_true(fabs(y[r * d + c] - yr) <= 1e-6 * fabs(yr) + 1e-7);
        double g = rs * ((double)gr[c] * wt[c] - xr[c] * rs * mm);
        assert_true(fabs(dx[r * d + c] - g) <= 1e-5 * fabs(g) + 1e-5);
      }
    }
    free(x), free(wt), free(dy), free(y), free(dx), free(gw);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_expf_accuracy),
      cmocka_unit_test(test_expf_specials),
      cmocka_unit_test(test_elementwise_equal_alone),
      cmocka_unit_test(test_adamw_matches_double_formula),
      cmocka_unit_test(test_softmax_rows_and_backward),
      cmocka_unit_test(test_causal_softmax_equals_mask_then_softmax),
      cmocka_unit_test(test_cross_entropy_against_double),
      cmocka_unit_test(test_rmsnorm_against_double),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
