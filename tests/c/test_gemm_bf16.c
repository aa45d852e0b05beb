/* test_gemm_bf16.c — the bf16 GEMM: rounding to bf16 (nearest even, NaN,
 * overflow), the CPU backend's gemm_bf16 in every transpose combination,
 * batched and with alpha / beta, on both engines (oneDNN where this build
 * and CPU have it, and the float32 fallback) against a double product of
 * the rounded inputs; the fallback equals sgemm over rounded inputs
 * bitwise; float32 GEMMs on OpenBLAS and oneDNN (lp_tensor_f32_onednn);
 * lp_tensor_gemm_prec on views; a Linear and an attention layer at
 * bf16 (precision set on a chunk reaches its children). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "lp_nn.h"
#include "lp_tensor.h"

#define SH(...) ((int64_t[]){__VA_ARGS__})

static float bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static void test_rounding(void **state) {
  (void)state;
  assert_int_equal(lp_tensor_bf16_from_float(1.0f), 0x3f80);
  assert_int_equal(lp_tensor_bf16_from_float(-2.0f), 0xc000);
  /* ulp of bf16 at 1 is 2^-7: 1 + 2^-8 is a tie, to even (1) */
  assert_true(lp_tensor_bf16_round(1.0f + 0x1p-8f) == 1.0f);
  /* 1 + 3 * 2^-8 is a tie between 1 + 2^-7 (odd) and 1 + 2^-6 (even) */
  assert_true(lp_tensor_bf16_round(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
  /* above a tie rounds up, below rounds down */
  assert_true(lp_tensor_bf16_round(1.0f + 0x1p-8f + 0x1p-20f) ==
              1.0f + 0x1p-7f);
  assert_true(lp_tensor_bf16_round(1.0f + 0x1p-8f - 0x1p-20f) == 1.0f);
  /* the largest float rounds to infinity; infinities and NaN stay */
  assert_true(isinf(lp_tensor_bf16_round(bits(0x7f7fffffu))));
  assert_true(isinf(lp_tensor_bf16_round(INFINITY)));
  assert_true(isnan(lp_tensor_bf16_round(NAN)));
  assert_true(isnan(lp_tensor_bf16_round(bits(0x7f800001u)))); /* sNaN */
  /* every bf16 value is itself */
  for (uint32_t h = 0; h < 0x10000u; h += 7) {
    float x = lp_tensor_bf16_to_float((uint16_t)h);
    if (!isnan(x)) assert_int_equal(lp_tensor_bf16_from_float(x), h);
  }
  lp_tensor_precision p;
  assert_true(lp_tensor_precision_parse("bf16", &p) && p == LP_TENSOR_BF16);
  assert_true(lp_tensor_precision_parse("f32", &p) && p == LP_TENSOR_F32);
  assert_false(lp_tensor_precision_parse("fp8", &p));
  assert_string_equal(lp_tensor_precision_name(LP_TENSOR_BF16), "bf16");
}

static void fill(float *x, int64_t n, uint64_t seed) {
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, seed);
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)lp_tensor_rng_normal(&r);
}

/* Checks C (m x n, ldc) = alpha op(A) op(B) + beta C0 for batch `bi`
 * against doubles of the rounded inputs: within 1e-5 of sum |terms|. */
static void check_batch(int ta, int tb, int64_t m, int64_t n, int64_t k,
                        float alpha, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta,
                        const float *c0, const float *c, int64_t ldc) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; p++) {
        double x = lp_tensor_bf16_round(ta ? a[p * lda + i] : a[i * lda + p]);
        double y = lp_tensor_bf16_round(tb ? b[j * ldb + p] : b[p * ldb + j]);
        s += x * y;
        mag += fabs(x * y);
      }
      double want = alpha * s + beta * (double)c0[i * ldc + j];
      mag = fabs(alpha) * mag + fabs(beta * c0[i * ldc + j]);
      double got = c[i * ldc + j];
      if (fabs(got - want) > 1e-5 * mag + 1e-30)
        fail_msg("ta %d tb %d (%lld,%lld): got %.9g want %.9g", ta, tb,
                 (long long)i, (long long)j, got, want);
    }
}

static void gemm_case(int64_t m, int64_t n, int64_t k);

/* Every transpose combination, batch 2 with padded strides, alpha and
 * beta, on the engine in force; shapes (all > 64^3) with every dim
 * ragged (oneDNN's run-time-dims primitive), only m or only k not a
 * multiple of 16 (split into a 16-multiple primitive and a padded tail),
 * and all multiples of 16. */
static void gemm_cases(void) {
  static const int64_t shapes[][3] = {{67, 45, 129}, {67, 48, 128}, {37, 32, 256},
                                      {64, 48, 131}, {32, 64, 131}, {64, 48, 128}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    gemm_case(shapes[s][0], shapes[s][1], shapes[s][2]);
}

static void gemm_case(int64_t m, int64_t n, int64_t k) {
  const lp_tensor_backend *be = lp_tensor_backend_cpu();
  const int64_t pad = 3, batch = 2;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k,
              bc = tb ? k : n;
      int64_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
      int64_t sa = ar * lda + 5, sb = br * ldb + 7, sc = m * ldc + 11;
      float *a = malloc(sizeof(float) * (size_t)(sa * batch));
      float *b = malloc(sizeof(float) * (size_t)(sb * batch));
      float *c = malloc(sizeof(float) * (size_t)(sc * batch));
      float *c0 = malloc(sizeof(float) * (size_t)(sc * batch));
      fill(a, sa * batch, 1);
      fill(b, sb * batch, 2);
      fill(c0, sc * batch, 3);
      for (int beta_i = 0; beta_i < 3; beta_i++) {
        float alpha = 0.5f, beta = beta_i == 2 ? 0.75f : beta_i ? 1.0f : 0.0f;
        memcpy(c, c0, sizeof(float) * (size_t)(sc * batch));
        assert_int_equal(be->gemm_bf16(be, ta, tb, m, n, k, alpha, a, lda, sa,
                                       b, ldb, sb, beta, c, ldc, sc, batch),
                         LP_OK);
        for (int64_t i = 0; i < batch; i++)
          check_batch(ta, tb, m, n, k, alpha, a + i * sa, lda, b + i * sb,
                      ldb, beta, c0 + i * sc, c + i * sc, ldc);
        /* the padding between rows is untouched */
        for (int64_t r = 0; r < m; r++)
          assert_true(c[r * ldc + n] == c0[r * ldc + n]);
      }
      free(a);
      free(b);
      free(c);
      free(c0);
    }
}

static void test_gemm_engines(void **state) {
  (void)state;
  printf("# bf16 engine: %s\n", lp_tensor_bf16_engine());
  if (!lp_tensor_have_onednn())
    assert_false(lp_tensor_bf16_native());
  gemm_cases(); /* the engine this machine runs */
  /* under 64^3 multiply-adds the fallback runs even where oneDNN could:
   * bitwise sgemm over rounded copies */
  {
    const lp_tensor_backend *be = lp_tensor_backend_cpu();
    float a[8 * 16], b[16 * 8], ra[8 * 16], rb[16 * 8], c1[64], c2[64];
    fill(a, 128, 21);
    fill(b, 128, 22);
    for (int i = 0; i < 128; i++)
      ra[i] = lp_tensor_bf16_round(a[i]), rb[i] = lp_tensor_bf16_round(b[i]);
    assert_int_equal(be->gemm_bf16(be, 0, 0, 8, 8, 16, 1.0f, a, 16, 0, b, 8, 0,
                                   0.0f, c1, 8, 0, 1),
                     LP_OK);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 8, 8, 16, 1.0f, ra,
                16, rb, 8, 0.0f, c2, 8);
    assert_memory_equal(c1, c2, sizeof c1);
  }
  lp_tensor_bf16_force_fallback(1);
  assert_false(lp_tensor_bf16_native());
  assert_non_null(strstr(lp_tensor_bf16_engine(), "float32 fallback"));
  gemm_cases();
  lp_tensor_bf16_force_fallback(0);
}

/* The fallback is sgemm over rounded copies, bitwise; oneDNN (when it
 * runs) agrees with it to float32 rounding of the sums. */
static void test_fallback_exact(void **state) {
  (void)state;
  const lp_tensor_backend *be = lp_tensor_backend_cpu();
  const int64_t m = 64, n = 48, k = 96;
  float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * n * k);
  float *ra = malloc(sizeof(float) * m * k), *rb = malloc(sizeof(float) * n * k);
  float *c1 = malloc(sizeof(float) * m * n), *c2 = malloc(sizeof(float) * m * n);
  float *c3 = malloc(sizeof(float) * m * n);
  fill(a, m * k, 4);
  fill(b, n * k, 5);
  for (int64_t i = 0; i < m * k; i++) ra[i] = lp_tensor_bf16_round(a[i]);
  for (int64_t i = 0; i < n * k; i++) rb[i] = lp_tensor_bf16_round(b[i]);
  lp_tensor_bf16_force_fallback(1);
  assert_int_equal(be->gemm_bf16(be, 0, 1, m, n, k, 1.0f, a, k, 0, b, k, 0,
                                 0.0f, c1, n, 0, 1),
                   LP_OK);
  lp_tensor_bf16_force_fallback(0);
  assert_int_equal(be->gemm(be, 0, 1, m, n, k, 1.0f, ra, k, 0, rb, k, 0, 0.0f,
                            c2, n, 0, 1),
                   LP_OK);
  assert_memory_equal(c1, c2, sizeof(float) * m * n);
  /* and the f32 GEMM on the unrounded inputs is another result */
  assert_int_equal(be->gemm(be, 0, 1, m, n, k, 1.0f, a, k, 0, b, k, 0, 0.0f,
                            c3, n, 0, 1),
                   LP_OK);
  assert_true(memcmp(c1, c3, sizeof(float) * m * n) != 0);
  assert_int_equal(be->gemm_bf16(be, 0, 1, m, n, k, 1.0f, a, k, 0, b, k, 0,
                                 0.0f, c3, n, 0, 1),
                   LP_OK);
  for (int64_t i = 0; i < m * n; i++)
    assert_true(fabsf(c3[i] - c1[i]) <= 1e-5f * (1.0f + fabsf(c1[i])) * 16);
  free(a), free(b), free(ra), free(rb), free(c1), free(c2), free(c3);
}

/* Float32 GEMMs on both engines (OpenBLAS, and oneDNN where this machine
 * chooses it) against doubles: every transpose, batched, alpha, beta. */
static void f32_cases(int dnnl) {
  const lp_tensor_backend *be = lp_tensor_backend_cpu();
  const int64_t m = 33, n = 48, k = 64, batch = 2;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int64_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n + 1;
      int64_t sa = m * k, sb = k * n, sc = m * ldc;
      float *a = malloc(sizeof(float) * (size_t)(sa * batch));
      float *b = malloc(sizeof(float) * (size_t)(sb * batch));
      float *c = malloc(sizeof(float) * (size_t)(sc * batch));
      float *c0 = malloc(sizeof(float) * (size_t)(sc * batch));
      fill(a, sa * batch, 11);
      fill(b, sb * batch, 12);
      fill(c0, sc * batch, 13);
      memcpy(c, c0, sizeof(float) * (size_t)(sc * batch));
      if (dnnl) /* oneDNN's float32 matmul directly, one matrix at a time */
        for (int64_t bi = 0; bi < batch; bi++)
          assert_int_equal(lp_tensor_cpu_gemm_onednn_f32(
                               ta, tb, m, n, k, 0.5f, a + bi * sa, lda,
                               b + bi * sb, ldb, 1.0f, c + bi * sc, ldc),
                           LP_OK);
      else
        assert_int_equal(be->gemm(be, ta, tb, m, n, k, 0.5f, a, lda, sa, b,
                                  ldb, sb, 1.0f, c, ldc, sc, batch),
                         LP_OK);
      for (int64_t bi = 0; bi < batch; bi++)
        for (int64_t i = 0; i < m; i++)
          for (int64_t j = 0; j < n; j++) {
            double s = 0, mag = 0;
            for (int64_t p = 0; p < k; p++) {
              double x = ta ? a[bi * sa + p * lda + i] : a[bi * sa + i * lda + p];
              double y = tb ? b[bi * sb + j * ldb + p] : b[bi * sb + p * ldb + j];
              s += x * y;
              mag += fabs(x * y);
            }
            double want = 0.5 * s + c0[bi * sc + i * ldc + j];
            assert_true(fabs(c[bi * sc + i * ldc + j] - want) <=
                        1e-5 * (0.5 * mag + fabs(c0[bi * sc + i * ldc + j])));
          }
      free(a), free(b), free(c), free(c0);
    }
}

static void test_f32_engines(void **state) {
  (void)state;
  printf("# f32 engine: %s\n", lp_tensor_f32_engine());
  if (!lp_tensor_have_onednn()) {
    assert_false(lp_tensor_f32_onednn());
    assert_int_equal(lp_tensor_cpu_gemm_onednn_f32(0, 0, 1, 1, 1, 1.0f, NULL,
                                                   1, NULL, 1, 0.0f, NULL, 1),
                     LP_ERR_UNSUPPORTED);
  }
  f32_cases(0); /* the backend's, whichever engine LUAPIPE_F32_GEMM chose */
  lp_tensor_f32_force_openblas(1);
  assert_false(lp_tensor_f32_onednn());
  assert_non_null(strstr(lp_tensor_f32_engine(), "OpenBLAS sgemm"));
  f32_cases(0);
  lp_tensor_f32_force_openblas(0);
  if (lp_tensor_have_onednn()) f32_cases(1);
}

/* lp_tensor_gemm_prec on a transpose view equals the backend call. */
static void test_tensor_gemm_prec(void **state) {
  (void)state;
  lp_tensor *a, *b, *bt, *c1, *c2;
  assert_int_equal(lp_tensor_empty(NULL, 2, SH(8, 12), &a), LP_OK);
  assert_int_equal(lp_tensor_empty(NULL, 2, SH(12, 5), &b), LP_OK);
  fill(a->data, 96, 6);
  fill(b->data, 60, 7);
  assert_int_equal(lp_tensor_transpose(b, 0, 1, &bt), LP_OK); /* 5 x 12 */
  assert_int_equal(lp_tensor_zeros(NULL, 2, SH(8, 5), &c1), LP_OK);
  assert_int_equal(lp_tensor_zeros(NULL, 2, SH(8, 5), &c2), LP_OK);
  assert_int_equal(
      lp_tensor_gemm_prec(c1, 1.0f, a, 0, bt, 1, 0.0f, LP_TENSOR_BF16), LP_OK);
  const lp_tensor_backend *be = lp_tensor_backend_cpu();
  assert_int_equal(be->gemm_bf16(be, 0, 0, 8, 5, 12, 1.0f, a->data, 12, 0,
                                 b->data, 5, 0, 0.0f, c2->data, 5, 0, 1),
                   LP_OK);
  assert_true(lp_tensor_equal(c1, c2));
  check_batch(0, 0, 8, 5, 12, 1.0f, a->data, 12, b->data, 5, 0.0f, c2->data,
              c1->data, 5);
  assert_int_equal(
      lp_tensor_gemm_prec(c1, 1.0f, a, 0, b, 0, 0.0f, LP_TENSOR_BF16), LP_OK);
  assert_true(lp_tensor_equal(c1, c2));
  lp_tensor_free(a), lp_tensor_free(b), lp_tensor_free(bt);
  lp_tensor_free(c1), lp_tensor_free(c2);
}

/* A chunk of Linear + attention at bf16: the precision reaches both
 * children; Linear's output is the bf16 GEMM of x and W; the chunk's
 * output differs from float32's and is close to it. */
static void test_layers(void **state) {
  (void)state;
  lp_nn_layer *lin, *att, *chunk;
  assert_int_equal(lp_nn_linear_new("lin", 16, 16, 0, 1, &lin), LP_OK);
  assert_int_equal(lp_nn_attention_new("att", 16, 2, 2, &att), LP_OK);
  lp_nn_layer *kids[2] = {lin, att};
  assert_int_equal(lp_nn_chunk_new("c", kids, 2, &chunk), LP_OK);
  lp_tensor *x, *y32, *ybf, *yl, *ref;
  assert_int_equal(lp_tensor_empty(NULL, 3, SH(2, 8, 16), &x), LP_OK);
  fill(x->data, 256, 8);
  lp_nn_ctx *ctx;
  assert_int_equal(lp_nn_ctx_new(&ctx), LP_OK);
  assert_int_equal(lp_nn_forward(chunk, ctx, x, &y32), LP_OK);
  lp_nn_ctx_clear(ctx);
  assert_int_equal(lp_nn_layer_set_precision(chunk, LP_TENSOR_BF16), LP_OK);
  assert_int_equal(lp_nn_layer_precision(lin), LP_TENSOR_BF16);
  assert_int_equal(lp_nn_layer_precision(att), LP_TENSOR_BF16);
  assert_int_equal(lp_nn_layer_set_precision(chunk, (lp_tensor_precision)7),
                   LP_ERR_ARG);
  assert_int_equal(lp_nn_forward(chunk, ctx, x, &ybf), LP_OK);
  lp_nn_ctx_clear(ctx);
  assert_false(lp_tensor_equal(y32, ybf));
  double d;
  assert_int_equal(lp_tensor_max_abs_diff(y32, ybf, &d), LP_OK);
  assert_true(d < 0.05);
  /* Linear alone */
  assert_int_equal(lp_nn_forward(lin, ctx, x, &yl), LP_OK);
  lp_nn_ctx_clear(ctx);
  size_t np;
  const lp_nn_param *p = lp_nn_params(lin, &np);
  assert_int_equal(lp_tensor_zeros(NULL, 3, SH(2, 8, 16), &ref), LP_OK);
  check_batch(0, 1, 16, 16, 16, 1.0f, x->data, 16, p[0].value->data, 16, 0.0f,
              ref->data, yl->data, 16);
  lp_nn_ctx_free(ctx);
  lp_tensor_free(x), lp_tensor_free(y32), lp_tensor_free(ybf);
  lp_tensor_free(yl), lp_tensor_free(ref);
  lp_nn_layer_release(lin), lp_nn_layer_release(att);
  lp_nn_layer_release(chunk);
}

/* MLA (DeepSeek's attention) and SwiGLU at bf16: the output differs from
 * float32's and is close to it; both sides' GEMMs go through the layer's
 * precision (MLA's own head GEMMs included). */
static void test_mla_swiglu(void **state) {
  (void)state;
  lp_nn_mla_opts o = lp_nn_mla_defaults();
  o.dim = 32, o.n_heads = 2, o.q_lora_rank = 0, o.kv_lora_rank = 16;
  o.qk_nope_head_dim = 8, o.qk_rope_head_dim = 4, o.v_head_dim = 8;
  lp_nn_layer *mla, *ffn;
  assert_int_equal(lp_nn_mla_new("mla", &o, 3, &mla), LP_OK);
  assert_int_equal(lp_nn_swiglu_new("ffn", 32, 48, 4, &ffn), LP_OK);
  lp_nn_layer *kids[2] = {mla, ffn}, *chunk;
  assert_int_equal(lp_nn_chunk_new("c", kids, 2, &chunk), LP_OK);
  lp_tensor *x, *y32, *ybf;
  assert_int_equal(lp_tensor_empty(NULL, 3, SH(2, 8, 32), &x), LP_OK);
  fill(x->data, 512, 9);
  lp_nn_ctx *ctx;
  assert_int_equal(lp_nn_ctx_new(&ctx), LP_OK);
  assert_int_equal(lp_nn_forward(chunk, ctx, x, &y32), LP_OK);
  lp_nn_ctx_clear(ctx);
  assert_int_equal(lp_nn_layer_set_precision(chunk, LP_TENSOR_BF16), LP_OK);
  assert_int_equal(lp_nn_forward(chunk, ctx, x, &ybf), LP_OK);
  lp_nn_ctx_clear(ctx);
  assert_false(lp_tensor_equal(y32, ybf));
  double d;
  assert_int_equal(lp_tensor_max_abs_diff(y32, ybf, &d), LP_OK);
  assert_true(d > 0 && d < 0.05);
  /* MLA alone at bf16, SwiGLU at f32: still differs (MLA's GEMMs moved) */
  lp_tensor *ym;
  assert_int_equal(lp_nn_layer_set_precision(ffn, LP_TENSOR_F32), LP_OK);
  assert_int_equal(lp_nn_forward(chunk, ctx, x, &ym), LP_OK);
  lp_nn_ctx_clear(ctx);
  assert_false(lp_tensor_equal(y32, ym));
  assert_false(lp_tensor_equal(ybf, ym));
  lp_nn_ctx_free(ctx);
  lp_tensor_free(x), lp_tensor_free(y32), lp_tensor_free(ybf);
  lp_tensor_free(ym);
  lp_nn_layer_release(mla), lp_nn_layer_release(ffn);
  lp_nn_layer_release(chunk);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rounding),
      cmocka_unit_test(test_gemm_engines),
      cmocka_unit_test(test_fallback_exact),
      cmocka_unit_test(test_f32_engines),
      cmocka_unit_test(test_tensor_gemm_prec),
      cmocka_unit_test(test_layers),
      cmocka_unit_test(test_mla_swiglu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
