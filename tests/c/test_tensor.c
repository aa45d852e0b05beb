/* test_tensor.c — lp_tensor: creation, views and strides, ops against naive
 * loops, GEMM in every transpose combination, the backend table, RNG
 * determinism, and out-of-memory paths through the allocation hook. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_tensor.h"
#include "lp_test_oom.h"

#define PI 3.14159265358979323846

#define SH(...) ((int64_t[]){__VA_ARGS__})

static lp_tensor *randn(int ndim, const int64_t *shape, uint64_t seed) {
  lp_tensor *t = NULL;
  assert_int_equal(lp_tensor_empty(NULL, ndim, shape, &t), LP_OK);
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, seed);
  assert_int_equal(lp_tensor_fill_normal(t, &r, 0.0f, 1.0f), LP_OK);
  return t;
}

/* ---- creation and views ---- */

static void test_create(void **state) {
  (void)state;
  lp_tensor *t = NULL;
  assert_int_equal(lp_tensor_zeros(NULL, 3, SH(2, 3, 4), &t), LP_OK);
  assert_int_equal(lp_tensor_numel(t), 24);
  assert_true(lp_tensor_is_contiguous(t));
  assert_int_equal(t->stride[0], 12);
  assert_int_equal(t->stride[1], 4);
  assert_int_equal(t->stride[2], 1);
  for (int i = 0; i < 24; i++)
    assert_true(t->data[i] == 0.0f);
  assert_string_equal(lp_tensor_backend_of(t)->name, "cpu");
  int64_t r, c;
  lp_tensor_rows_cols(t, &r, &c);
  assert_int_equal(r, 6);
  assert_int_equal(c, 4);
  lp_tensor_free(t);

  float src[6] = {1, 2, 3, 4, 5, 6};
  assert_int_equal(lp_tensor_from_data(NULL, 2, SH(2, 3), src, &t), LP_OK);
  assert_true(*lp_tensor_at(t, 1, 2, 0, 0) == 6.0f);
  lp_tensor_free(t);

  /* bad shapes */
  assert_int_equal(lp_tensor_empty(NULL, 0, SH(1), &t), LP_ERR_ARG);
  assert_null(t);
  assert_int_equal(lp_tensor_empty(NULL, 5, SH(1, 1, 1, 1, 1), &t), LP_ERR_ARG);
  assert_int_equal(lp_tensor_empty(NULL, 2, SH(3, -1), &t), LP_ERR_ARG);
  assert_int_equal(lp_tensor_empty(NULL, 2, SH(INT64_MAX / 2, 8), &t),
                   LP_ERR_ARG);
  /* empty, but its dense strides would overflow: refused too */
  assert_int_equal(lp_tensor_empty(NULL, 3, SH(0, INT64_C(1) << 62, INT64_C(1) << 62), &t),
                   LP_ERR_ARG);
  assert_int_equal(lp_tensor_empty(NULL, 3, SH(0, 1 << 20, 1 << 20), &t), LP_OK);
  assert_int_equal(lp_tensor_numel(t), 0);
  lp_tensor_free(t);
  /* zero-size is fine */
  assert_int_equal(lp_tensor_zeros(NULL, 2, SH(0, 5), &t), LP_OK);
  assert_int_equal(lp_tensor_numel(t), 0);
  lp_tensor_free(t);
  lp_tensor_free(NULL);
}

static void test_wrap(void **state) {
  (void)state;
  float buf[6] = {1, 2, 3, 4, 5, 6};
  lp_tensor *t = NULL, *v = NULL;
  assert_int_equal(lp_tensor_wrap(buf, 2, SH(3, 2), &t), LP_OK);
  assert_ptr_equal(t->data, buf);
  assert_int_equal(lp_tensor_rows(t, 1, 2, &v), LP_OK);
  lp_tensor_free(t);
  assert_true(*lp_tensor_at(v, 0, 1, 0, 0) == 4.0f);
  lp_tensor_free(v); /* must not free buf (stack memory) */
  assert_true(buf[5] == 6.0f);
}

static void test_views(void **state) {
  (void)state;
  float src[12];
  for (int i = 0; i < 12; i++)
    src[i] = (float)i;
  lp_tensor *t = NULL, *rows = NULL, *re = NULL, *tr = NULL, *v = NULL;
  assert_int_equal(lp_tensor_from_data(NULL, 2, SH(4, 3), src, &t), LP_OK);
  assert_int_equal(lp_tensor_storage_refs(t), 1);

  assert_int_equal(lp_tensor_rows(t, 1, 2, &rows), LP_OK);
  assert_int_equal(lp_tensor_storage_refs(t), 2);
  assert_true(lp_tensor_is_contiguous(rows));
  assert_true(rows->data[0] == 3.0f);
  assert_int_equal(lp_tensor_rows(t, 3, 2, &v), LP_ERR_ARG);
  assert_null(v);

  assert_int_equal(lp_tensor_reshape(t, 3, SH(2, -1, 3), &re), LP_OK);
  assert_int_equal(re->shape[1], 2);
  assert_true(*lp_tensor_at(re, 1, 1, 2, 0) == 11.0f);
  assert_int_equal(lp_tensor_reshape(t, 2, SH(5, -1), &v), LP_ERR_ARG);

  assert_int_equal(lp_tensor_transpose(t, 0, 1, &tr), LP_OK);
  assert_int_equal(tr->shape[0], 3);
  assert_int_equal(tr->shape[1], 4);
  assert_false(lp_tensor_is_contiguous(tr));
  assert_true(*lp_tensor_at(tr, 2, 1, 0, 0) == 5.0f); /* t[1][2] */
  assert_int_equal(lp_tensor_reshape(tr, 1, SH(12), &v), LP_ERR_ARG);

  /* a clone of the transpose is dense and holds transposed values */
  lp_tensor *c = NULL;
  assert_int_equal(lp_tensor_clone(tr, &c), LP_OK);
  assert_true(lp_tensor_is_contiguous(c));
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++)
      assert_true(c->data[i * 4 + j] == src[j * 3 + i]);
  assert_int_equal(lp_tensor_storage_refs(c), 1);

  /* writes through a view are visible in the base; views outlive it */
  rows->data[0] = 100.0f;
  assert_true(t->data[3] == 100.0f);
  assert_int_equal(lp_tensor_storage_refs(t), 4);
  lp_tensor_free(t);
  assert_int_equal(lp_tensor_storage_refs(rows), 3);
  assert_true(*lp_tensor_at(tr, 0, 1, 0, 0) == 100.0f);
  lp_tensor_free(rows);
  lp_tensor_free(re);
  assert_int_equal(lp_tensor_storage_refs(tr), 1);
  assert_int_equal(lp_tensor_storage_bytes(tr), 12 * sizeof(float));
  lp_tensor_free(tr);
  lp_tensor_free(c);
}

/* ---- elementwise ops vs naive loops ---- */

static void test_elementwise(void **state) {
  (void)state;
  lp_tensor *a = randn(3, SH(2, 3, 5), 1), *b = randn(3, SH(2, 3, 5), 2);
  lp_tensor *o = NULL;
  assert_int_equal(lp_tensor_empty_like(a, &o), LP_OK);
  int n = 30;

  assert_int_equal(lp_tensor_add(o, a, b), LP_OK);
  for (int i = 0; i < n; i++)
    assert_true(o->data[i] == a->data[i] + b->data[i]);
  assert_int_equal(lp_tensor_mul(o, a, b), LP_OK);
  for (int i = 0; i < n; i++)
    assert_true(o->data[i] == a->data[i] * b->data[i]);
  assert_int_equal(lp_tensor_copy(o, a), LP_OK);
  assert_int_equal(lp_tensor_axpy(o, 0.5f, b), LP_OK);
  for (int i = 0; i < n; i++)
    assert_true(o->data[i] == a->data[i] + 0.5f * b->data[i]);
  assert_int_equal(lp_tensor_copy(o, a), LP_OK);
  assert_int_equal(lp_tensor_scale(o, -3.0f), LP_OK);
  for (int i = 0; i < n; i++)
    assert_true(o->data[i] == -3.0f * a->data[i]);
  assert_int_equal(lp_tensor_fill(o, 2.5f), LP_OK);
  for (int i = 0; i < n; i++)
    assert_true(o->data[i] == 2.5f);

  /* activations against double formulas; backward against the derivative */
  assert_int_equal(lp_tensor_act(o, LP_TENSOR_ACT_GELU, a), LP_OK);
  for (int i = 0; i < n; i++) {
    double x = a->data[i];
    double want =
        0.5 * x * (1 + tanh(sqrt(2 / PI) * (x + 0.044715 * x * x * x)));
    assert_true(fabs(o->data[i] - want) < 1e-6 * (1 + fabs(want)));
  }
  assert_int_equal(lp_tensor_act(o, LP_TENSOR_ACT_SILU, a), LP_OK);
  for (int i = 0; i < n; i++) {
    double x = a->data[i], want = x / (1 + exp(-x));
    assert_true(fabs(o->data[i] - want) < 1e-6 * (1 + fabs(want)));
  }
  for (int kind = 0; kind < 2; kind++) {
    assert_int_equal(lp_tensor_act_backward(o, (lp_tensor_act_kind)kind, a, b),
                     LP_OK);
    for (int i = 0; i < n; i++) {
      double x = a->data[i], h = 1e-4, fp, fm;
      if (kind == 0) {
        fp = 0.5 * (x + h) *
             (1 + tanh(sqrt(2 / PI) * ((x + h) + 0.044715 * pow(x + h, 3))));
        fm = 0.5 * (x - h) *
             (1 + tanh(sqrt(2 / PI) * ((x - h) + 0.044715 * pow(x - h, 3))));
      } else {
        fp = (x + h) / (1 + exp(-(x + h)));
        fm = (x - h) / (1 + exp(-(x - h)));
      }
      double want = b->data[i] * (fp - fm) / (2 * h);
      assert_true(fabs(o->data[i] - want) < 1e-5 * (1 + fabs(want)));
    }
  }

  /* shape mismatch */
  lp_tensor *c = randn(2, SH(6, 5), 3);
  assert_int_equal(lp_tensor_add(o, a, c), LP_ERR_ARG);
  lp_tensor_free(c);
  lp_tensor_free(a);
  lp_tensor_free(b);
  lp_tensor_free(o);
}

static void test_strided_ops(void **state) {
  (void)state;
  /* a^T + b^T into a transposed output: everything strided */
  lp_tensor *a = randn(2, SH(4, 3), 4), *b = randn(2, SH(4, 3), 5), *o = NULL;
  lp_tensor *at = NULL, *bt = NULL, *ot = NULL;
  assert_int_equal(lp_tensor_zeros(NULL, 2, SH(4, 3), &o), LP_OK);
  assert_int_equal(lp_tensor_transpose(a, 0, 1, &at), LP_OK);
  assert_int_equal(lp_tensor_transpose(b, 0, 1, &bt), LP_OK);
  assert_int_equal(lp_tensor_transpose(o, 0, 1, &ot), LP_OK);
  assert_int_equal(lp_tensor_add(ot, at, bt), LP_OK);
  for (int i = 0; i < 12; i++)
    assert_true(o->data[i] == a->data[i] + b->data[i]);
  assert_int_equal(lp_tensor_axpy(ot, 2.0f, at), LP_OK);
  for (int i = 0; i < 12; i++)
    assert_true(o->data[i] == (a->data[i] + b->data[i]) + 2.0f * a->data[i]);
  assert_int_equal(lp_tensor_scale(ot, 0.5f), LP_OK);
  assert_int_equal(lp_tensor_fill(ot, 1.0f), LP_OK);
  for (int i = 0; i < 12; i++)
    assert_true(o->data[i] == 1.0f);
  /* in place with an aliased strided operand */
  assert_int_equal(lp_tensor_copy(o, a), LP_OK);
  assert_int_equal(lp_tensor_mul(ot, ot, bt), LP_OK);
  for (int i = 0; i < 12; i++)
    assert_true(o->data[i] == a->data[i] * b->data[i]);

  double s, d, m;
  assert_int_equal(lp_tensor_sum(at, &s), LP_OK);
  assert_int_equal(lp_tensor_dot(at, bt, &d), LP_OK);
  double ws = 0, wd = 0;
  for (int i = 0; i < 12; i++)
    ws += a->data[i], wd += (double)a->data[i] * b->data[i];
  assert_true(fabs(s - ws) < 1e-9 && fabs(d - wd) < 1e-9);
  assert_int_equal(lp_tensor_max_abs_diff(at, at, &m), LP_OK);
  assert_true(m == 0.0);
  assert_true(lp_tensor_equal(at, at));
  assert_false(lp_tensor_equal(at, bt));
  lp_tensor_free(a), lp_tensor_free(b), lp_tensor_free(o);
  lp_tensor_free(at), lp_tensor_free(bt), lp_tensor_free(ot);
}

/* Row gather (with and without per-row scale) and index-add (repeated
 * indices accumulate in order); bad indices and widths are LP_ERR_ARG. */
static void test_gather_index_add(void **state) {
  (void)state;
  lp_tensor *x = randn(2, SH(4, 3), 8), *g = NULL, *acc = NULL;
  const int64_t idx[5] = {2, 0, 2, 3, 1};
  const float sc[5] = {1.0f, -2.0f, 0.5f, 3.0f, 0.0f};
  assert_int_equal(lp_tensor_empty(NULL, 2, SH(5, 3), &g), LP_OK);
  assert_int_equal(lp_tensor_gather_rows(g, x, idx, NULL), LP_OK);
  for (int i = 0; i < 5; i++)
    assert_memory_equal(g->data + i * 3, x->data + idx[i] * 3, 3 * sizeof(float));
  assert_int_equal(lp_tensor_gather_rows(g, x, idx, sc), LP_OK);
  for (int i = 0; i < 15; i++)
    assert_true(g->data[i] == sc[i / 3] * x->data[idx[i / 3] * 3 + i % 3]);
  assert_int_equal(lp_tensor_zeros(NULL, 2, SH(4, 3), &acc), LP_OK);
  assert_int_equal(lp_tensor_index_add_rows(acc, g, idx, sc), LP_OK);
  for (int c = 0; c < 3; c++) {
    float want = 0.0f; /* row 2 gets rows 0 and 2 of g, in that order */
    want += sc[0] * g->data[0 * 3 + c];
    want += sc[2] * g->data[2 * 3 + c];
    assert_true(acc->data[2 * 3 + c] == want);
    assert_true(acc->data[1 * 3 + c] == 0.0f); /* scale 0 */
  }
  const int64_t bad[5] = {0, 1, 4, 0, 0};
  assert_int_equal(lp_tensor_gather_rows(g, x, bad, NULL), LP_ERR_ARG);
  assert_int_equal(lp_tensor_index_add_rows(acc, g, bad, NULL), LP_ERR_ARG);
  lp_tensor *w = NULL;
  assert_int_equal(lp_tensor_empty(NULL, 2, SH(5, 2), &w), LP_OK);
  assert_int_equal(lp_tensor_gather_rows(w, x, idx, NULL), LP_ERR_ARG);
  lp_tensor_free(x), lp_tensor_free(g), lp_tensor_free(acc), lp_tensor_free(w);
}

/* Row dots: out[i] = x[idx[i]] . y[i] in double, rounded once; without
 * idx, row i of x; bad shapes and indices are LP_ERR_ARG. */
static void test_dot_rows(void **state) {
  (void)state;
  lp_tensor *x = randn(2, SH(4, 3), 8), *y = randn(2, SH(5, 3), 9), *o = NULL;
  const int64_t idx[5] = {2, 0, 2, 3, 1};
  assert_int_equal(lp_tensor_empty(NULL, 1, SH(5), &o), LP_OK);
  assert_int_equal(lp_tensor_dot_rows(o, x, idx, y), LP_OK);
  for (int i = 0; i < 5; i++) {
    double d = 0.0;
    for (int c = 0; c < 3; c++) d += (double)x->data[idx[i] * 3 + c] * y->data[i * 3 + c];
    assert_true(o->data[i] == (float)d);
  }
  assert_int_equal(lp_tensor_dot_rows(o, y, NULL, y), LP_OK);
  double d0 = 0.0;
  for (int c = 0; c < 3; c++) d0 += (double)y->data[c] * y->data[c];
  assert_true(o->data[0] == (float)d0);
  assert_int_equal(lp_tensor_dot_rows(o, x, NULL, y), LP_ERR_ARG); /* 4 vs 5 rows */
  const int64_t bad[5] = {0, 1, 4, 0, 0};
  assert_int_equal(lp_tensor_dot_rows(o, x, bad, y), LP_ERR_ARG);
  lp_tensor *o4 = NULL;
  assert_int_equal(lp_tensor_empty(NULL, 1, SH(4), &o4), LP_OK);
  assert_int_equal(lp_tensor_dot_rows(o4, x, idx, y), LP_ERR_ARG);
  lp_tensor_free(x), lp_tensor_free(y), lp_tensor_free(o), lp_tensor_free(o4);
}

static void test_rows_ops(void **state) {
  (void)state;
  lp_tensor *x = randn(3, SH(2, 3, 7), 6), *v = randn(1, SH(7), 7), *o = NULL;
  assert_int_equal(lp_tensor_zeros(NULL, 1, SH(7), &o), LP_OK);
  assert_int_equal(lp_tensor_fill(o, 1.0f), LP_OK);
  assert_int_equal(lp_tensor_sum_rows(o, x, 2.0f), LP_OK);
  for (int c = 0; c < 7; c++) {
    float want = 2.0f;
    for (int r = 0; r < 6; r++)
      want += x->data[r * 7 + c];
    assert_true(o->data[c] == want); /* same order, bitwise */
  }
  lp_tensor *y = NULL;
  assert_int_equal(lp_tensor_clone(x, &y), LP_OK);
  assert_int_equal(lp_tensor_add_rowvec(y, v), LP_OK);
  for (int i = 0; i < 42; i++)
    assert_true(y->data[i] == x->data[i] + v->data[i % 7]);

  assert_int_equal(lp_tensor_softmax_rows(y, x), LP_OK);
  for (int r = 0; r < 6; r++) {
    double mx = -1e30, s = 0;
    for (int c = 0; c < 7; c++)
      mx = fmax(mx, x->data[r * 7 + c]);
    for (int c = 0; c < 7; c++)
      s += exp(x->data[r * 7 + c] - mx);
    for (int c = 0; c < 7; c++) {
      double want = exp(x->data[r * 7 + c] - mx) / s;
      assert_true(fabs(y->data[r * 7 + c] - want) < 1e-6);
    }
  }
  assert_int_equal(lp_tensor_sum_rows(v, y, 0.0f), LP_OK);
  lp_tensor *bad = randn(1, SH(6), 8);
  assert_int_equal(lp_tensor_sum_rows(bad, y, 0.0f), LP_ERR_ARG);
  lp_tensor_free(bad);
  lp_tensor_free(x), lp_tensor_free(v), lp_tensor_free(o), lp_tensor_free(y);
}

/* ---- GEMM ---- */

/* C[i][j] = alpha * sum_k op(A)[i][k] op(B)[k][j] + beta * C0[i][j] */
static void naive_gemm(int ta, int tb, int m, int n, int k, float alpha,
                       const float *a, const float *b, float beta,
                       const float *c0, double *c) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double s = 0;
      for (int p = 0; p < k; p++) {
        double av = ta ? a[p * m + i] : a[i * k + p];
        double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      c[i * n + j] = alpha * s + beta * c0[i * n + j];
    }
}

static void test_gemm(void **state) {
  (void)state;
  int sizes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 29}, {4, 64, 1}, {16, 1, 9}};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    int m = sizes[si][0], n = sizes[si][1], k = sizes[si][2];
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        lp_tensor *a = randn(2, ta ? SH(k, m) : SH(m, k), 10 + si);
        lp_tensor *b = randn(2, tb ? SH(n, k) : SH(k, n), 20 + si);
        lp_tensor *c = randn(2, SH(m, n), 30 + si), *c0 = NULL;
        assert_int_equal(lp_tensor_clone(c, &c0), LP_OK);
        double *want = malloc(sizeof(double) * (size_t)(m * n));
        naive_gemm(ta, tb, m, n, k, 0.75f, a->data, b->data, 0.5f, c0->data,
                   want);
        assert_int_equal(lp_tensor_gemm(c, 0.75f, a, ta, b, tb, 0.5f), LP_OK);
        for (int i = 0; i < m * n; i++)
          assert_true(fabs(c->data[i] - want[i]) < 1e-4 * (1 + fabs(want[i])));

        /* same product through transpose views with the flags flipped */
        lp_tensor *av = NULL, *bv = NULL;
        assert_int_equal(lp_tensor_transpose(a, 0, 1, &av), LP_OK);
        assert_int_equal(lp_tensor_transpose(b, 0, 1, &bv), LP_OK);
        assert_int_equal(lp_tensor_copy(c, c0), LP_OK);
        assert_int_equal(lp_tensor_gemm(c, 0.75f, av, !ta, bv, !tb, 0.5f),
                         LP_OK);
        for (int i = 0; i < m * n; i++)
          assert_true(fabs(c->data[i] - want[i]) < 1e-4 * (1 + fabs(want[i])));
        free(want);
        lp_tensor_free(a), lp_tensor_free(b), lp_tensor_free(c);
        lp_tensor_free(c0), lp_tensor_free(av), lp_tensor_free(bv);
      }
  }
}

static void test_gemm_views_and_errors(void **state) {
  (void)state;
  /* A is a column slice (ld > cols) of a wider matrix: take columns 2..5
   * of a [6, 9] by transposing, row-slicing and transposing back */
  lp_tensor *w = randn(2, SH(6, 9), 40), *wt = NULL, *wts = NULL, *a = NULL;
  assert_int_equal(lp_tensor_transpose(w, 0, 1, &wt), LP_OK);
  assert_int_equal(lp_tensor_rows(wt, 2, 4, &wts), LP_OK);
  assert_int_equal(lp_tensor_transpose(wts, 0, 1, &a),
                   LP_OK); /* [6, 4], ld 9 */
  lp_tensor *b = randn(2, SH(4, 3), 41), *c = NULL;
  assert_int_equal(lp_tensor_zeros(NULL, 2, SH(6, 3), &c), LP_OK);
  assert_int_equal(lp_tensor_gemm(c, 1.0f, a, 0, b, 0, 0.0f), LP_OK);
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 3; j++) {
      double s = 0;
      for (int p = 0; p < 4; p++)
        s += (double)w->data[i * 9 + 2 + p] * b->data[p * 3 + j];
      assert_true(fabs(c->data[i * 3 + j] - s) < 1e-5);
    }
  /* dense N-D operands flatten to rows x cols */
  lp_tensor *x3 = randn(3, SH(2, 3, 4), 42), *y3 = NULL;
  assert_int_equal(lp_tensor_zeros(NULL, 3, SH(2, 3, 3), &y3), LP_OK);
  assert_int_equal(lp_tensor_gemm(y3, 1.0f, x3, 0, b, 0, 0.0f), LP_OK);
  /* shape mismatches */
  assert_int_equal(lp_tensor_gemm(c, 1.0f, a, 1, b, 0, 0.0f), LP_ERR_ARG);
  assert_int_equal(lp_tensor_gemm(y3, 1.0f, b, 0, x3, 0, 0.0f), LP_ERR_ARG);
  /* a transposed C is refused */
  lp_tensor *ct = NULL;
  assert_int_equal(lp_tensor_transpose(c, 0, 1, &ct), LP_OK);
  assert_int_equal(lp_tensor_gemm(ct, 1.0f, b, 1, a, 1, 0.0f), LP_ERR_ARG);
  lp_tensor_free(w), lp_tensor_free(wt), lp_tensor_free(wts), lp_tensor_free(a);
  lp_tensor_free(b), lp_tensor_free(c), lp_tensor_free(x3), lp_tensor_free(y3);
  lp_tensor_free(ct);
}

static void test_backend_batched_gemm(void **state) {
  (void)state;
  const lp_tensor_backend *be = lp_tensor_backend_cpu();
  assert_string_equal(be->name, "cpu");
  assert_true(be->host_accessible);
  /* 3 batches of [4x5]·[5x2], operands packed with strides */
  lp_tensor *a = randn(1, SH(60), 50), *b = randn(1, SH(30), 51), *c = NULL;
  assert_int_equal(lp_tensor_zeros(NULL, 1, SH(24), &c), LP_OK);
  assert_int_equal(be->gemm(be, 0, 0, 4, 2, 5, 1.0f, a->data, 5, 20, b->data, 2,
                            10, 0.0f, c->data, 2, 8, 3),
                   LP_OK);
  for (int bi = 0; bi < 3; bi++) {
    double want[8];
    float zero[8] = {0};
    naive_gemm(0, 0, 4, 2, 5, 1.0f, a->data + bi * 20, b->data + bi * 10, 0.0f,
               zero, want);
    for (int i = 0; i < 8; i++)
      assert_true(fabs(c->data[bi * 8 + i] - want[i]) < 1e-5);
  }
  lp_tensor_free(a), lp_tensor_free(b), lp_tensor_free(c);
}

/* ---- RNG ---- */

static void test_rng(void **state) {
  (void)state;
  lp_tensor_rng r1, r2;
  lp_tensor_rng_seed(&r1, 1234);
  lp_tensor_rng_seed(&r2, 1234);
  for (int i = 0; i < 1000; i++)
    assert_true(lp_tensor_rng_next(&r1) == lp_tensor_rng_next(&r2));
  /* the stream is fixed forever (checkpoints and split models rely on it) */
  lp_tensor_rng_seed(&r1, 0);
  assert_true(lp_tensor_rng_next(&r1) == 0x99ec5f36cb75f2b4ULL);
  assert_true(lp_tensor_hash_name("a") == 0xaf63dc4c8601ec8cULL);

  /* named streams: same (seed, name) equal; different names differ */
  lp_tensor_rng_seed_name(&r1, 7, "blocks.0.attn.wq");
  lp_tensor_rng_seed_name(&r2, 7, "blocks.0.attn.wq");
  assert_true(lp_tensor_rng_next(&r1) == lp_tensor_rng_next(&r2));
  lp_tensor_rng_seed_name(&r2, 7, "blocks.0.attn.wk");
  assert_true(lp_tensor_rng_next(&r1) != lp_tensor_rng_next(&r2));

  /* moments of the normal and uniform draws */
  lp_tensor_rng_seed(&r1, 99);
  double s = 0, s2 = 0, u = 0;
  int n = 200000;
  for (int i = 0; i < n; i++) {
    double z = lp_tensor_rng_normal(&r1);
    s += z, s2 += z * z;
    double x = lp_tensor_rng_uniform(&r1);
    assert_true(x >= 0.0 && x < 1.0);
    u += x;
  }
  printf("# rng: normal mean %.4f var %.4f, uniform mean %.4f\n", s / n,
         s2 / n - (s / n) * (s / n), u / n);
  assert_true(fabs(s / n) < 0.01);
  assert_true(fabs(s2 / n - 1.0) < 0.02);
  assert_true(fabs(u / n - 0.5) < 0.005);

  /* tensor fills are reproducible bitwise */
  lp_tensor *a = randn(3, SH(3, 4, 5), 77), *b = randn(3, SH(3, 4, 5), 77);
  assert_true(lp_tensor_equal(a, b));
  lp_tensor_rng_seed(&r1, 5);
  assert_int_equal(lp_tensor_fill_uniform(b, &r1, -2.0f, 2.0f), LP_OK);
  for (int i = 0; i < 60; i++)
    assert_true(b->data[i] >= -2.0f && b->data[i] < 2.0f);
  lp_tensor_free(a), lp_tensor_free(b);
}

/* ---- out of memory ---- */

/* Creates, views, clones and computes (strided paths that need dense
 * temporaries included); frees everything on any path. */
static lp_status tensor_scenario(void) {
  lp_tensor *a = NULL, *v = NULL, *t = NULL, *c = NULL, *o = NULL, *ot = NULL,
            *g = NULL;
  lp_status st;
  LP_CHECK_GOTO(lp_tensor_zeros(NULL, 2, SH(4, 6), &a), st, done);
  LP_CHECK_GOTO(lp_tensor_fill(a, 1.0f), st, done);
  LP_CHECK_GOTO(lp_tensor_rows(a, 1, 2, &v), st, done);
  LP_CHECK_GOTO(lp_tensor_transpose(a, 0, 1, &t), st, done); /* [6, 4] */
  LP_CHECK_GOTO(lp_tensor_clone(t, &c), st, done);
  LP_CHECK_GOTO(lp_tensor_zeros(NULL, 2, SH(6, 4), &o), st, done);
  LP_CHECK_GOTO(lp_tensor_transpose(o, 0, 1, &ot), st, done); /* [4, 6] */
  LP_CHECK_GOTO(lp_tensor_add(ot, a, a), st, done); /* strided output */
  LP_CHECK_GOTO(lp_tensor_add(c, t, t), st, done);  /* strided inputs */
  LP_CHECK_GOTO(lp_tensor_act(ot, LP_TENSOR_ACT_GELU, ot), st, done);
  LP_CHECK_GOTO(lp_tensor_zeros(NULL, 2, SH(6, 6), &g), st, done);
  LP_CHECK_GOTO(lp_tensor_gemm(g, 1.0f, t, 0, a, 0, 0.0f), st, done);
done:
  lp_tensor_free(a), lp_tensor_free(v), lp_tensor_free(t), lp_tensor_free(c);
  lp_tensor_free(o), lp_tensor_free(ot), lp_tensor_free(g);
  return st;
}

static void test_oom(void **state) {
  (void)state;
  int failures = lp_test_oom_points(tensor_scenario, 1000);
  printf("# tensor oom: %d failure points, all LP_ERR_NOMEM, no leaks\n",
         failures);
  assert_true(failures > 5);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create),
      cmocka_unit_test(test_wrap),
      cmocka_unit_test(test_views),
      cmocka_unit_test(test_elementwise),
      cmocka_unit_test(test_strided_ops),
      cmocka_unit_test(test_rows_ops),
      cmocka_unit_test(test_gather_index_add),
      cmocka_unit_test(test_dot_rows),
      cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_gemm_views_and_errors),
      cmocka_unit_test(test_backend_batched_gemm),
      cmocka_unit_test(test_rng),
      cmocka_unit_test(test_oom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
