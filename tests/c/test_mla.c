/* test_mla.c — DeepSeek-V3's dense layers (lp_nn_mla_new, lp_nn_swiglu_new):
 * finite-difference gradient checks of MLA with and without the query
 * LoRA, with and without YaRN, and of SwiGLU; forwards against slow
 * reference loops written here in double (complex rotations, the YaRN
 * ramp and mscale recomputed from model.py's formulas); YaRN frequencies
 * against hand-derived values; the rope op against a rotation done by
 * hand; parameter names and shapes as model.py's; the fake non-host
 * backend giving the CPU's bits; error text; out-of-memory paths.
 *
 * Gradient checks as test_nn.c's: central differences with eps = 1e-2 on
 * L = sum(y * r), analytic a passes against numerical n when
 * |a - n| <= 1e-2 |n| + 1e-3 max(1, max_i |n_i|). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <complex.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_nn.h"
#include "lp_test_fake_backend.h"
#include "lp_test_oom.h"

#define SH(...) ((int64_t[]){__VA_ARGS__})
#include "nn_gradcheck.h"

/* gradcheck (nn_gradcheck.h: input and parameter gradients against central
 * differences, the I/W split, one-call backward and W alone bitwise), then
 * a second micro-batch's weight-grad adds the same again: 2 g. */
static void gradcheck_mla(const char *label, probe *p) {
  gradcheck(label, p, 1);
  lp_nn_layer *l = p->l;
  lp_nn_ctx *ctx = NULL;
  lp_tensor *y = NULL;
  assert_int_equal(lp_nn_ctx_new(&ctx), LP_OK);
  assert_int_equal(lp_nn_zero_grad(l), LP_OK);
  assert_int_equal(lp_nn_forward(l, ctx, p->x, &y), LP_OK);
  assert_int_equal(lp_nn_weight_grad(l, ctx, p->r), LP_OK);
  size_t np;
  const lp_nn_param *ps = lp_nn_params(l, &np);
  lp_tensor **g1 = calloc(np + 1, sizeof *g1);
  for (size_t i = 0; i < np; i++) g1[i] = like(ps[i].grad);
  lp_tensor_free(y);
  assert_int_equal(lp_nn_forward(l, ctx, p->x, &y), LP_OK);
  assert_int_equal(lp_nn_weight_grad(l, ctx, p->r), LP_OK);
  for (size_t i = 0; i < np; i++) {
    const float *a = g1[i]->data, *b = ps[i].grad->data;
    for (int64_t j = 0; j < lp_tensor_numel(g1[i]); j++)
      assert_float_equal(b[j], 2.0f * a[j], 1e-5f * (1.0f + fabsf(a[j])));
  }
  for (size_t i = 0; i < np; i++) lp_tensor_free(g1[i]);
  free(g1);
  lp_tensor_free(y);
  lp_nn_ctx_free(ctx);
}

/* ---- configs ---- */

/* A tiny MLA: 3 heads of 3 nope + 8 rope query/key dims and 5 value dims.
 * YaRN on: theta 1e4, original 4096, beta 32 / 1 give the correction
 * range [1, 3] over the 4 rope pairs (pair 0, 1 kept, 2 half, 3 / factor). */
static lp_nn_mla_opts tiny(int lora, int yarn) {
  lp_nn_mla_opts o = lp_nn_mla_defaults();
  o.dim = 10, o.n_heads = 3, o.q_lora_rank = lora ? 7 : 0;
  o.kv_lora_rank = 6, o.qk_nope_head_dim = 3, o.qk_rope_head_dim = 8;
  o.v_head_dim = 5, o.original_seq_len = 4096;
  o.max_seq_len = yarn ? 8192 : 4096;
  o.rope_factor = 4.0, o.mscale = 0.707;
  return o;
}

static void test_grad_mla(void **state) {
  (void)state;
  static const char *labels[4] = {"mla (wq)", "mla (wq, yarn)",
                                  "mla (q lora)", "mla (q lora, yarn)"};
  for (int v = 0; v < 4; v++) {
    lp_nn_mla_opts o = tiny(v >= 2, v & 1);
    probe p = {0};
    assert_int_equal(lp_nn_mla_new("layers.0.attn", &o, 11 + v, &p.l), LP_OK);
    p.x = randn(3, SH(2, 6, 10), 30 + v);
    gradcheck_mla(labels[v], &p);
    probe_done(&p);
  }
}

static void test_grad_swiglu(void **state) {
  (void)state;
  probe p = {0};
  assert_int_equal(lp_nn_swiglu_new("layers.0.ffn", 6, 9, 3, &p.l), LP_OK);
  p.x = randn(3, SH(2, 3, 6), 40);
  gradcheck_mla("swiglu", &p);
  probe_done(&p);
  probe q = {0}; /* rows without a batch dim */
  assert_int_equal(lp_nn_swiglu_new("ffn", 4, 3, 4, &q.l), LP_OK);
  q.x = randn(2, SH(5, 4), 41);
  gradcheck_mla("swiglu (2-d)", &q);
  probe_done(&q);
}

/* ---- slow references, in double ---- */

static const float *param(const lp_nn_layer *l, const char *suffix) {
  size_t n;
  const lp_nn_param *ps = lp_nn_params(l, &n);
  char want[128];
  snprintf(want, sizeof want, "%s.%s", lp_nn_layer_name(l), suffix);
  for (size_t i = 0; i < n; i++)
    if (strcmp(ps[i].name, want) == 0) return ps[i].value->data;
  fail_msg("no parameter %s", want);
  return NULL;
}

/* out[o] = sum_i w[o, i] x[i] */
static void matvec(const float *w, int64_t out, int64_t in, const double *x,
                   double *y) {
  for (int64_t o = 0; o < out; o++) {
    double s = 0;
    for (int64_t i = 0; i < in; i++) s += (double)w[o * in + i] * x[i];
    y[o] = s;
  }
}

static void rmsnorm_ref(double *x, int64_t n, const float *w, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
  double r = 1.0 / sqrt(ss / (double)n + eps);
  for (int64_t i = 0; i < n; i++) x[i] = x[i] * r * w[i];
}

/* The rotary frequency of pair i, from model.py's formulas: theta^(-2i/d);
 * with YaRN the pairs below the correction range keep it, those above
 * divide it by the factor, and those in between blend linearly. */
static double freq_ref(const lp_nn_mla_opts *o, int64_t i) {
  double d = (double)o->qk_rope_head_dim;
  double f = pow(o->rope_theta, -2.0 * (double)i / d);
  if (o->max_seq_len <= o->original_seq_len) return f;
  double L = (double)o->original_seq_len, th = o->rope_theta;
  double lo = floor(d * log(L / (o->beta_fast * 2 * 3.14159265358979323846)) / (2 * log(th)));
  double hi = ceil(d * log(L / (o->beta_slow * 2 * 3.14159265358979323846)) / (2 * log(th)));
  lo = fmax(lo, 0), hi = fmin(hi, d - 1);
  if (lo == hi) hi += 0.001;
  double ramp = fmin(1.0, fmax(0.0, ((double)i - lo) / (hi - lo)));
  return (1.0 - ramp) * f + ramp * f / o->rope_factor;
}

/* y [B, T, D] of the MLA layer l for x, computed token by token. */
static double *mla_ref(const lp_nn_layer *l, const lp_tensor *x) {
  const lp_nn_mla_opts *o = lp_nn_mla_get_opts(l);
  int64_t B = x->shape[0], T = x->shape[1], D = o->dim, H = o->n_heads;
  int64_t dn = o->qk_nope_head_dim, dr = o->qk_rope_head_dim, dq = dn + dr;
  int64_t dv = o->v_head_dim, kvr = o->kv_lora_rank, qr = o->q_lora_rank;
  double scale = 1.0 / sqrt((double)dq);
  if (o->max_seq_len > o->original_seq_len) {
    double ms = 0.1 * o->mscale * log(o->rope_factor) + 1.0;
    scale *= ms * ms;
  }
  double *q = calloc((size_t)(B * T * H * dq), sizeof(double));
  double *k = calloc((size_t)(B * T * H * dq), sizeof(double));
  double *v = calloc((size_t)(B * T * H * dv), sizeof(double));
  double *y = calloc((size_t)(B * T * D), sizeof(double));
  double xin[64], a[64], kva[64], kvb[256], ov[256];
  for (int64_t bt = 0; bt < B * T; bt++) {
    int64_t t = bt % T;
    for (int64_t i = 0; i < D; i++) xin[i] = x->data[bt * D + i];
    double *qt = q + bt * H * dq, *kt = k + bt * H * dq, *vt = v + bt * H * dv;
    if (qr) {
      matvec(param(l, "wq_a.weight"), qr, D, xin, a);
      rmsnorm_ref(a, qr, param(l, "q_norm.weight"), o->eps);
      matvec(param(l, "wq_b.weight"), H * dq, qr, a, qt);
    } else {
      matvec(param(l, "wq.weight"), H * dq, D, xin, qt);
    }
    matvec(param(l, "wkv_a.weight"), kvr + dr, D, xin, kva);
    rmsnorm_ref(kva, kvr, param(l, "kv_norm.weight"), o->eps);
    matvec(param(l, "wkv_b.weight"), H * (dn + dv), kvr, kva, kvb);
    for (int64_t h = 0; h < H; h++) {
      for (int64_t j = 0; j < dn; j++) kt[h * dq + j] = kvb[h * (dn + dv) + j];
      for (int64_t j = 0; j < dv; j++) vt[h * dv + j] = kvb[h * (dn + dv) + dn + j];
      for (int64_t i = 0; i < dr / 2; i++) {
        double complex rot = cexp(I * (double)t * freq_ref(o, i));
        double *qp = qt + h * dq + dn + 2 * i;
        double complex zq = (qp[0] + I * qp[1]) * rot;
        qp[0] = creal(zq), qp[1] = cimag(zq);
        const double *kp = kva + kvr + 2 * i; /* the one shared rope key */
        double complex zk = (kp[0] + I * kp[1]) * rot;
        kt[h * dq + dn + 2 * i] = creal(zk), kt[h * dq + dn + 2 * i + 1] = cimag(zk);
      }
    }
  }
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      for (int64_t h = 0; h < H; h++) {
        double sc[64], mx = -INFINITY, den = 0;
        for (int64_t s = 0; s <= t; s++) {
          double d = 0;
          for (int64_t j = 0; j < dq; j++)
            d += q[((b * T + t) * H + h) * dq + j] * k[((b * T + s) * H + h) * dq + j];
          sc[s] = d * scale;
          mx = fmax(mx, sc[s]);
        }
        for (int64_t s = 0; s <= t; s++) den += (sc[s] = exp(sc[s] - mx));
        for (int64_t j = 0; j < dv; j++) {
          double acc = 0;
          for (int64_t s = 0; s <= t; s++)
            acc += sc[s] / den * v[((b * T + s) * H + h) * dv + j];
          ov[h * dv + j] = acc;
        }
      }
      matvec(param(l, "wo.weight"), D, H * dv, ov, y + (b * T + t) * D);
    }
  free(q), free(k), free(v);
  return y;
}

/* max |y - ref| / max |ref| */
static double rel_err(const lp_tensor *y, const double *ref) {
  double mx = 0, d = 0;
  for (int64_t i = 0; i < lp_tensor_numel(y); i++) {
    mx = fmax(mx, fabs(ref[i]));
    d = fmax(d, fabs((double)y->data[i] - ref[i]));
  }
  return d / mx;
}

static void test_mla_forward_reference(void **state) {
  (void)state;
  for (int v = 0; v < 4; v++) {
    lp_nn_mla_opts o = tiny(v >= 2, v & 1);
    lp_nn_layer *l = NULL;
    assert_int_equal(lp_nn_mla_new("attn", &o, 50 + v, &l), LP_OK);
    /* non-trivial norm weights, so a missing norm weight shows */
    size_t np;
    const lp_nn_param *ps = lp_nn_params(l, &np);
    lp_tensor_rng r;
    lp_tensor_rng_seed(&r, 60 + v);
    for (size_t i = 0; i < np; i++)
      if (ps[i].value->ndim == 1)
        assert_int_equal(lp_tensor_fill_uniform(ps[i].value, &r, 0.5f, 1.5f), LP_OK);
    lp_tensor *x = randn(3, SH(2, 9, 10), 70 + v), *y = NULL;
    assert_int_equal(lp_nn_forward(l, NULL, x, &y), LP_OK);
    double *ref = mla_ref(l, x);
    double e = rel_err(y, ref);
    printf("# mla forward %s%s: max|y - ref| / max|ref| = %.2e\n",
           v >= 2 ? "q lora" : "wq", v & 1 ? ", yarn" : "", e);
    assert_true(e < 1e-5);
    /* and YaRN matters: the other setting of it gives another output */
    lp_nn_mla_opts o2 = o;
    o2.max_seq_len = (v & 1) ? 4096 : 8192;
    lp_nn_layer *l2 = NULL;
    assert_int_equal(lp_nn_mla_new("attn", &o2, 50 + v, &l2), LP_OK);
    const lp_nn_param *ps2 = lp_nn_params(l2, &np);
    for (size_t i = 0; i < np; i++)
      assert_int_equal(lp_tensor_copy(ps2[i].value, ps[i].value), LP_OK);
    lp_tensor *y2 = NULL;
    assert_int_equal(lp_nn_forward(l2, NULL, x, &y2), LP_OK);
    assert_true(rel_err(y2, ref) > 1e-3);
    free(ref);
    lp_tensor_free(x), lp_tensor_free(y), lp_tensor_free(y2);
    lp_nn_layer_release(l), lp_nn_layer_release(l2);
  }
}

static void test_swiglu_forward_reference(void **state) {
  (void)state;
  lp_nn_layer *l = NULL;
  assert_int_equal(lp_nn_swiglu_new("ffn", 5, 7, 9, &l), LP_OK);
  lp_tensor *x = randn(3, SH(2, 3, 5), 80), *y = NULL;
  assert_int_equal(lp_nn_forward(l, NULL, x, &y), LP_OK);
  const float *w1 = param(l, "w1.weight"), *w2 = param(l, "w2.weight"),
              *w3 = param(l, "w3.weight");
  double ref[30], xin[5], a1[7], a3[7], h[7];
  for (int r = 0; r < 6; r++) {
    for (int i = 0; i < 5; i++) xin[i] = x->data[r * 5 + i];
    matvec(w1, 7, 5, xin, a1);
    matvec(w3, 7, 5, xin, a3);
    for (int j = 0; j < 7; j++) h[j] = a1[j] / (1.0 + exp(-a1[j])) * a3[j];
    matvec(w2, 5, 7, h, ref + r * 5);
  }
  double e = rel_err(y, ref);
  printf("# swiglu forward: max|y - ref| / max|ref| = %.2e\n", e);
  assert_true(e < 1e-5);
  lp_tensor_free(x), lp_tensor_free(y);
  lp_nn_layer_release(l);
}

/* ---- YaRN, scale, rope op ---- */

static void test_yarn_freqs(void **state) {
  (void)state;
  /* model.py's defaults: d 64, theta 1e4, original 4096, beta 32 / 1:
   * correction dims 64 ln(4096 / 64 pi) / 2 ln 1e4 = 10.47 -> low 10 and
   * 64 ln(4096 / 2 pi) / 2 ln 1e4 = 22.51 -> high 23 */
  lp_nn_mla_opts o = lp_nn_mla_defaults();
  float f[32];
  assert_int_equal(lp_nn_mla_rope_freqs(&o, f), LP_OK);
  for (int i = 0; i < 32; i++) {
    double base = pow(10000.0, -(double)(2 * i) / 64.0);
    double ramp = i <= 10 ? 0.0 : i >= 23 ? 1.0 : (i - 10) / 13.0;
    double want = base * (1.0 - ramp) + base / 40.0 * ramp;
    assert_float_equal(f[i], want, 2e-6 * want);
  }
  assert_true(fabs(f[16] - pow(1e4, -0.5) * (1 - 6.0 / 13 + 6.0 / 13 / 40)) < 1e-7);
  /* mscale: 0.1 * 1 * ln 40 + 1 = 1.3689, squared on 192^-0.5 */
  double m = 0.1 * log(40.0) + 1.0;
  assert_float_equal(lp_nn_mla_softmax_scale(&o), m * m / sqrt(192.0), 1e-12);
  /* no YaRN when max_seq_len <= original_seq_len */
  o.max_seq_len = 4096;
  assert_int_equal(lp_nn_mla_rope_freqs(&o, f), LP_OK);
  assert_float_equal(f[31], pow(1e4, -62.0 / 64), 1e-6 * pow(1e4, -62.0 / 64));
  assert_float_equal(lp_nn_mla_softmax_scale(&o), 1 / sqrt(192.0), 1e-12);
  /* V2-Lite's mscale 0.707 */
  o.max_seq_len = 163840, o.mscale = 0.707;
  m = 0.0707 * log(40.0) + 1.0;
  assert_float_equal(lp_nn_mla_softmax_scale(&o), m * m / sqrt(192.0), 1e-12);
}

static void test_rope_op(void **state) {
  (void)state;
  const lp_tensor_backend *be = lp_tensor_backend_cpu();
  /* 2 rows (positions 0, 1 of seq 2), 2 heads of stride 5 at ld 11, d 4 */
  float cs[8] = {1, 0, 1, 0, 0.6f, 0.8f, 0, 1};
  float x[22], x0[22];
  for (int i = 0; i < 22; i++) x[i] = x0[i] = (float)(i + 1);
  assert_int_equal(be->rope(be, 2, 2, 2, 4, 11, 5, cs, 0, x), LP_OK);
  for (int i = 0; i < 11; i++) assert_true(x[i] == x0[i]); /* position 0 */
  /* row 1, head 0 at 11: (12 + 13i)(0.6 + 0.8i) = -3.2 + 17.4i;
   * (14 + 15i) i = -15 + 14i; x[15] is not rotated (d = 4) */
  assert_float_equal(x[11], 12 * 0.6f - 13 * 0.8f, 1e-5);
  assert_float_equal(x[12], 12 * 0.8f + 13 * 0.6f, 1e-5);
  assert_true(x[13] == -15.0f && x[14] == 14.0f && x[15] == 16.0f);
  assert_true(x[18] == -20.0f && x[19] == 19.0f); /* head 1 at 16 */
  /* conj undoes it */
  assert_int_equal(be->rope(be, 2, 2, 2, 4, 11, 5, cs, 1, x), LP_OK);
  for (int i = 0; i < 22; i++) assert_float_equal(x[i], x0[i], 1e-5);
  assert_int_equal(be->rope(be, 2, 2, 2, 3, 11, 5, cs, 0, x), LP_ERR_ARG);
}

/* ---- names, shapes, errors ---- */

static void test_params_named_as_model_py(void **state) {
  (void)state;
  lp_nn_mla_opts o = tiny(1, 0);
  lp_nn_layer *l = NULL;
  assert_int_equal(lp_nn_mla_new("layers.3.attn", &o, 1, &l), LP_OK);
  assert_string_equal(lp_nn_layer_kind(l), "mla");
  static const struct {
    const char *name;
    int ndim;
    int64_t a, b;
  } want[] = {
      {"layers.3.attn.wq_a.weight", 2, 7, 10},
      {"layers.3.attn.q_norm.weight", 1, 7, 0},
      {"layers.3.attn.wq_b.weight", 2, 3 * 11, 7},
      {"layers.3.attn.wkv_a.weight", 2, 6 + 8, 10},
      {"layers.3.attn.kv_norm.weight", 1, 6, 0},
      {"layers.3.attn.wkv_b.weight", 2, 3 * (3 + 5), 6},
      {"layers.3.attn.wo.weight", 2, 10, 3 * 5},
  };
  size_t n;
  const lp_nn_param *ps = lp_nn_params(l, &n);
  assert_int_equal(n, 7);
  for (size_t i = 0; i < n; i++) {
    assert_string_equal(ps[i].name, want[i].name);
    assert_int_equal(ps[i].value->ndim, want[i].ndim);
    assert_int_equal(ps[i].value->shape[0], want[i].a);
    if (want[i].ndim == 2) assert_int_equal(ps[i].value->shape[1], want[i].b);
    else assert_true(ps[i].value->data[0] == 1.0f); /* norms start at 1 */
  }
  lp_nn_layer_release(l);
  o = tiny(0, 0);
  assert_int_equal(lp_nn_mla_new("attn", &o, 1, &l), LP_OK);
  ps = lp_nn_params(l, &n);
  assert_int_equal(n, 5);
  assert_string_equal(ps[0].name, "attn.wq.weight");
  assert_int_equal(ps[0].value->shape[0], 33);
  lp_nn_layer_release(l);
  assert_int_equal(lp_nn_swiglu_new("layers.0.ffn", 4, 6, 1, &l), LP_OK);
  ps = lp_nn_params(l, &n);
  assert_int_equal(n, 3);
  assert_string_equal(ps[0].name, "layers.0.ffn.w1.weight");
  assert_string_equal(ps[1].name, "layers.0.ffn.w2.weight");
  assert_string_equal(ps[2].name, "layers.0.ffn.w3.weight");
  assert_int_equal(ps[1].value->shape[0], 4);
  assert_int_equal(ps[1].value->shape[1], 6);
  assert_string_equal(lp_nn_layer_kind(l), "swiglu");
  assert_null(lp_nn_mla_get_opts(l));
  lp_nn_layer_release(l);
}

static void test_errors(void **state) {
  (void)state;
  lp_nn_layer *l = NULL;
  const char *why = NULL;
  lp_nn_mla_opts o = tiny(0, 1);
  o.qk_rope_head_dim = 7;
  assert_int_equal(lp_nn_mla_check(&o, &why), LP_ERR_ARG);
  assert_string_equal(why, "qk_rope_head_dim must be even and >= 2");
  assert_int_equal(lp_nn_mla_new("attn", &o, 1, &l), LP_ERR_ARG);
  assert_null(l);
  o = tiny(0, 1);
  o.rope_factor = 0;
  assert_int_equal(lp_nn_mla_check(&o, &why), LP_ERR_ARG);
  assert_string_equal(why, "rope_factor must be > 0 (YaRN applies: max_seq_len > "
                           "original_seq_len)");
  o.max_seq_len = 16; /* no YaRN: the factor is not used */
  assert_int_equal(lp_nn_mla_check(&o, &why), LP_OK);
  assert_null(why);
  assert_int_equal(lp_nn_mla_new("layers.1.attn", &o, 1, &l), LP_OK);
  lp_nn_ctx *c = NULL;
  lp_tensor *y = NULL;
  assert_int_equal(lp_nn_ctx_new(&c), LP_OK);
  lp_tensor *x = randn(3, SH(1, 17, 10), 1);
  assert_int_equal(lp_nn_forward(l, c, x, &y), LP_ERR_ARG);
  assert_null(y);
  assert_string_equal(lp_nn_ctx_last_error(c), "layer layers.1.attn (mla): sequence "
                                               "length 17 is more than max_seq_len 16");
  lp_tensor *x2 = randn(2, SH(4, 10), 1);
  assert_int_equal(lp_nn_forward(l, c, x2, &y), LP_ERR_ARG);
  assert_string_equal(lp_nn_ctx_last_error(c), "layer layers.1.attn (mla): input "
                                               "must be [batch, seq, 10], got [4, 10]");
  lp_tensor *x3 = randn(3, SH(1, 16, 10), 1), *bad = randn(3, SH(1, 15, 10), 1);
  assert_int_equal(lp_nn_forward(l, c, x3, &y), LP_OK);
  assert_int_equal(lp_nn_input_grad(l, c, bad, NULL), LP_ERR_ARG);
  assert_string_equal(lp_nn_ctx_last_error(c), "layer layers.1.attn (mla): dy has "
                                               "shape [1, 15, 10], forward output "
                                               "had [1, 16, 10]");
  assert_int_equal(lp_nn_ctx_stage_of(c), LP_NN_CTX_EMPTY);
  lp_tensor_free(x), lp_tensor_free(x2), lp_tensor_free(x3), lp_tensor_free(bad);
  lp_tensor_free(y);
  lp_nn_layer_release(l);
  assert_int_equal(lp_nn_swiglu_new("ffn", 4, 0, 1, &l), LP_ERR_ARG);
  assert_int_equal(lp_nn_swiglu_new("ffn", 4, 3, 1, &l), LP_OK);
  lp_tensor *x4 = randn(2, SH(2, 5), 1);
  assert_int_equal(lp_nn_forward(l, c, x4, &y), LP_ERR_ARG);
  assert_string_equal(lp_nn_ctx_last_error(c),
                      "layer ffn (swiglu): input [2, 5] must have 4 features");
  lp_tensor_free(x4);
  lp_nn_layer_release(l);
  lp_nn_ctx_free(c);
}

/* ---- model.py's Block around the MLA ---- */

static lp_tensor *fwd(lp_nn_layer *l, const lp_tensor *x) {
  lp_tensor *y = NULL;
  assert_int_equal(lp_nn_forward(l, NULL, x, &y), LP_OK);
  return y;
}

static void test_block(void **state) {
  (void)state;
  lp_nn_mla_opts o = tiny(1, 1);
  lp_nn_layer *ffn = NULL, *blk = NULL;
  assert_int_equal(lp_nn_swiglu_new("layers.2.ffn", 10, 12, 7, &ffn), LP_OK);
  assert_int_equal(lp_nn_mla_block_new("layers.2", &o, ffn, 7, &blk), LP_OK);
  static const char *want[] = {
      "layers.2.attn_norm.weight", "layers.2.attn.wq_a.weight",
      "layers.2.attn.q_norm.weight", "layers.2.attn.wq_b.weight",
      "layers.2.attn.wkv_a.weight", "layers.2.attn.kv_norm.weight",
      "layers.2.attn.wkv_b.weight", "layers.2.attn.wo.weight",
      "layers.2.ffn_norm.weight", "layers.2.ffn.w1.weight",
      "layers.2.ffn.w2.weight", "layers.2.ffn.w3.weight"};
  size_t n;
  const lp_nn_param *ps = lp_nn_params(blk, &n);
  assert_int_equal(n, 12);
  for (size_t i = 0; i < n; i++) assert_string_equal(ps[i].name, want[i]);
  /* = the layers composed by hand: h = x + attn(norm(x)); y = h + ffn(norm(h)) */
  lp_nn_layer *n1 = NULL, *attn = NULL, *n2 = NULL;
  assert_int_equal(lp_nn_rmsnorm_new("n1", 10, 1e-6f, &n1), LP_OK);
  assert_int_equal(lp_nn_rmsnorm_new("n2", 10, 1e-6f, &n2), LP_OK);
  assert_int_equal(lp_nn_mla_new("layers.2.attn", &o, 7, &attn), LP_OK);
  lp_tensor *x = randn(3, SH(2, 5, 10), 5);
  lp_tensor *a = fwd(n1, x), *b = fwd(attn, a), *h = like(x);
  assert_int_equal(lp_tensor_add(h, x, b), LP_OK);
  lp_tensor *c = fwd(n2, h), *d = fwd(ffn, c), *y = like(h);
  assert_int_equal(lp_tensor_add(y, h, d), LP_OK);
  lp_tensor *yb = fwd(blk, x);
  double diff;
  assert_int_equal(lp_tensor_max_abs_diff(yb, y, &diff), LP_OK);
  assert_true(diff == 0.0);
  lp_tensor_free(a), lp_tensor_free(b), lp_tensor_free(h), lp_tensor_free(c);
  lp_tensor_free(d), lp_tensor_free(y), lp_tensor_free(yb);
  lp_nn_layer_release(n1), lp_nn_layer_release(n2), lp_nn_layer_release(attn);
  /* and its gradients */
  probe p = {.l = blk, .x = x};
  gradcheck_mla("mla block (swiglu)", &p);
  probe_done(&p);
  lp_nn_layer_release(ffn);
  assert_int_equal(lp_nn_mla_block_new("layers.2", &o, NULL, 7, &blk), LP_ERR_ARG);
  assert_null(blk);
}

/* An MoE as the block's feed-forward: its phases and EP come along. */
static void test_block_moe(void **state) {
  (void)state;
  lp_nn_mla_opts o = tiny(0, 0);
  lp_nn_moe_opts mo = {0};
  mo.dim = 10, mo.hidden = 6, mo.experts = 4, mo.topk = 2, mo.shared = 1;
  lp_nn_layer *moe = NULL, *blk = NULL;
  assert_int_equal(lp_nn_moe_new("layers.3.ffn", &mo, 3, &moe), LP_OK);
  assert_int_equal(lp_nn_mla_block_new("layers.3", &o, moe, 3, &blk), LP_OK);
  lp_nn_layer_release(moe);
  assert_int_equal(lp_nn_moe_count(blk), 1);
  size_t n;
  const lp_nn_param *ps = lp_nn_params(blk, &n);
  assert_string_equal(ps[5].name, "layers.3.attn.wo.weight");
  assert_string_equal(ps[6].name, "layers.3.ffn_norm.weight");
  lp_tensor *x = randn(3, SH(2, 4, 10), 6), *y = NULL, *dx = NULL;
  lp_nn_ctx *c = NULL;
  assert_int_equal(lp_nn_ctx_new(&c), LP_OK);
  assert_int_equal(lp_nn_forward(blk, c, x, &y), LP_OK);
  assert_int_equal(lp_nn_backward(blk, c, y, &dx), LP_OK);
  assert_true(lp_tensor_same_shape(dx, x));
  lp_tensor_free(x), lp_tensor_free(y), lp_tensor_free(dx);
  lp_nn_ctx_free(c);
  lp_nn_layer_release(blk);
}

/* The Block's phase stops: a phased pass stops before the attention (both
 * passes) and before the MoE's input-grad, reporting DeepSeek's phase
 * names, and gives the bits of the unphased pass. */
static void test_block_phase_stops(void **state) {
  (void)state;
  lp_nn_mla_opts o = tiny(1, 0);
  lp_nn_moe_opts mo = {0};
  mo.dim = 10, mo.hidden = 6, mo.experts = 4, mo.topk = 2, mo.shared = 1;
  lp_nn_layer *moe = NULL, *blk = NULL;
  assert_int_equal(lp_nn_moe_new("layers.3.ffn", &mo, 3, &moe), LP_OK);
  assert_int_equal(lp_nn_mla_block_new("layers.3", &o, moe, 3, &blk), LP_OK);
  lp_nn_layer_release(moe);
  assert_true(lp_nn_has_phase_stops(blk));
  lp_tensor *x = randn(3, SH(2, 4, 10), 6), *y = NULL, *y2 = NULL, *dx = NULL, *dx2 = NULL;
  lp_nn_ctx *c = NULL;
  assert_int_equal(lp_nn_ctx_new(&c), LP_OK);
  assert_int_equal(lp_nn_forward(blk, c, x, &y), LP_OK);
  assert_int_equal(lp_nn_input_grad(blk, c, y, &dx), LP_OK);
  lp_nn_ctx_clear(c);
  /* phased: forward dense (the norm), attn; backward dense, combine (the
   * MoE's backward), attn */
  const lp_nn_phase fw[] = {LP_NN_PHASE_DENSE, LP_NN_PHASE_ATTN};
  const lp_nn_phase bw[] = {LP_NN_PHASE_DENSE, LP_NN_PHASE_COMBINE, LP_NN_PHASE_ATTN};
  int done = 0, k = 0;
  assert_int_equal(lp_nn_forward_begin(blk, c, x), LP_OK);
  for (; !done; k++) {
    assert_true(k < 2);
    assert_int_equal(lp_nn_phase_of(c), fw[k]);
    assert_int_equal(lp_nn_advance(blk, c, &done, &y2), LP_OK);
  }
  assert_int_equal(k, 2);
  assert_true(lp_tensor_equal(y2, y));
  assert_int_equal(lp_nn_input_grad_begin(blk, c, y), LP_OK);
  for (done = 0, k = 0; !done; k++) {
    assert_true(k < 3);
    assert_int_equal(lp_nn_phase_of(c), bw[k]);
    assert_int_equal(lp_nn_advance(blk, c, &done, &dx2), LP_OK);
  }
  assert_int_equal(k, 3);
  assert_true(lp_tensor_equal(dx2, dx));
  assert_string_equal(lp_nn_phase_text(LP_NN_PHASE_ATTN), "attn");
  lp_tensor_free(x), lp_tensor_free(y), lp_tensor_free(y2);
  lp_tensor_free(dx), lp_tensor_free(dx2);
  lp_nn_ctx_free(c);
  lp_nn_layer_release(blk);
}

/* An MoE built placed for EP rank 1 of 2 holds only that rank's slots
 * (experts 2 and 3 of 4), with the values of a full build, and refuses a
 * pass before it has an EP group. */
static void test_moe_new_placed(void **state) {
  (void)state;
  lp_nn_moe_opts mo = {0};
  mo.dim = 10, mo.hidden = 6, mo.experts = 4, mo.topk = 2, mo.shared = 1;
  lp_nn_layer *full = NULL, *mine = NULL;
  assert_int_equal(lp_nn_moe_new("ffn", &mo, 3, &full), LP_OK);
  assert_int_equal(lp_nn_moe_new_placed("ffn", &mo, 3, 2, 1, &mine), LP_OK);
  assert_int_equal(lp_nn_param_numel(mine), lp_nn_param_numel(full) - 2 * 3 * 10 * 6);
  size_t nf, nm;
  const lp_nn_param *pf = lp_nn_params(full, &nf), *pm = lp_nn_params(mine, &nm);
  assert_int_equal(nm, nf - 6);
  for (size_t i = 0; i < nm; i++) {
    const lp_nn_param *w = NULL;
    for (size_t j = 0; j < nf && !w; j++)
      if (strcmp(pf[j].name, pm[i].name) == 0) w = &pf[j];
    assert_non_null(w);
    assert_null(strstr(pm[i].name, "experts.0.")), assert_null(strstr(pm[i].name, "experts.1."));
    assert_true(lp_tensor_equal(pm[i].value, w->value));
  }
  lp_tensor *x = randn(2, SH(4, 10), 8), *y = NULL;
  lp_nn_ctx *c = NULL;
  assert_int_equal(lp_nn_ctx_new(&c), LP_OK);
  assert_int_equal(lp_nn_forward(mine, c, x, &y), LP_ERR_ARG);
  assert_non_null(strstr(lp_nn_ctx_last_error(c), "placed for EP rank 1 of 2 but in no EP group"));
  lp_nn_layer_release(mine);
  assert_int_equal(lp_nn_moe_new_placed("ffn", &mo, 3, 2, 2, &mine), LP_ERR_ARG);
  assert_null(mine);
  lp_tensor_free(x);
  lp_nn_ctx_free(c);
  lp_nn_layer_release(full);
}

/* ---- the fake non-host backend gives the CPU's bits ---- */

static void assert_same(const lp_tensor *got, const lp_tensor *want) {
  lp_tensor *h = NULL;
  assert_int_equal(lp_tensor_to_host(got, &h), LP_OK);
  assert_true(lp_tensor_equal(h, want));
  lp_tensor_free(h);
}

static void run_fbw(lp_nn_layer *l, const lp_tensor *x, const lp_tensor *dy,
                    lp_tensor **y, lp_tensor **dx) {
  lp_nn_ctx *c = NULL;
  assert_int_equal(lp_nn_ctx_new(&c), LP_OK);
  assert_int_equal(lp_nn_forward(l, c, x, y), LP_OK);
  assert_int_equal(lp_nn_input_grad(l, c, dy, dx), LP_OK);
  assert_int_equal(lp_nn_weight_grad(l, c, NULL), LP_OK);
  lp_nn_ctx_free(c);
}

static void on_fake(lp_nn_layer *a, lp_nn_layer *b, const int64_t *shape) {
  lp_tensor *x = randn(3, shape, 90), *dy = randn(3, shape, 91);
  lp_tensor *xf = NULL, *dyf = NULL;
  assert_int_equal(lp_tensor_empty(&fake, 3, shape, &xf), LP_OK);
  assert_int_equal(lp_tensor_empty(&fake, 3, shape, &dyf), LP_OK);
  assert_int_equal(lp_tensor_copy(xf, x), LP_OK);
  assert_int_equal(lp_tensor_copy(dyf, dy), LP_OK);
  assert_int_equal(lp_nn_layer_to(b, &fake), LP_OK);
  lp_tensor *ya = NULL, *yb = NULL, *dxa = NULL, *dxb = NULL;
  run_fbw(a, x, dy, &ya, &dxa);
  run_fbw(b, xf, dyf, &yb, &dxb);
  assert_ptr_equal(lp_tensor_backend_of(yb), &fake);
  assert_same(yb, ya);
  assert_same(dxb, dxa);
  size_t na, nb;
  const lp_nn_param *pa = lp_nn_params(a, &na), *pb = lp_nn_params(b, &nb);
  assert_int_equal(na, nb);
  for (size_t i = 0; i < na; i++) assert_same(pb[i].grad, pa[i].grad);
  lp_tensor_free(x), lp_tensor_free(dy), lp_tensor_free(xf), lp_tensor_free(dyf);
  lp_tensor_free(ya), lp_tensor_free(yb), lp_tensor_free(dxa), lp_tensor_free(dxb);
}

static void test_on_fake_backend(void **state) {
  (void)state;
  for (int v = 0; v < 4; v++) {
    lp_nn_mla_opts o = tiny(v >= 2, v & 1);
    lp_nn_layer *a = NULL, *b = NULL;
    assert_int_equal(lp_nn_mla_new("attn", &o, 5, &a), LP_OK);
    assert_int_equal(lp_nn_mla_new("attn", &o, 5, &b), LP_OK);
    on_fake(a, b, SH(2, 5, 10));
    lp_nn_layer_release(a), lp_nn_layer_release(b);
  }
  lp_nn_layer *a = NULL, *b = NULL;
  assert_int_equal(lp_nn_swiglu_new("ffn", 6, 8, 5, &a), LP_OK);
  assert_int_equal(lp_nn_swiglu_new("ffn", 6, 8, 5, &b), LP_OK);
  on_fake(a, b, SH(2, 3, 6));
  lp_nn_layer_release(a), lp_nn_layer_release(b);
  /* the Block around them */
  lp_nn_mla_opts o = tiny(1, 1);
  lp_nn_layer *f[2] = {NULL, NULL}, *blk[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(lp_nn_swiglu_new("b.ffn", 10, 8, 5, &f[k]), LP_OK);
    assert_int_equal(lp_nn_mla_block_new("b", &o, f[k], 5, &blk[k]), LP_OK);
    lp_nn_layer_release(f[k]);
  }
  on_fake(blk[0], blk[1], SH(2, 4, 10));
  lp_nn_layer_release(blk[0]), lp_nn_layer_release(blk[1]);
}

/* ---- out of memory: every allocation failure is LP_ERR_NOMEM, no leak ---- */

static lp_status oom_scenario(void) {
  lp_nn_mla_opts o = tiny(1, 1);
  lp_nn_layer *l = NULL, *f = NULL;
  lp_nn_ctx *c = NULL;
  lp_tensor *x = NULL, *y = NULL, *dx = NULL, *y2 = NULL, *dx2 = NULL;
  lp_status st;
  LP_CHECK_GOTO(lp_nn_mla_new("attn", &o, 1, &l), st, out);
  LP_CHECK_GOTO(lp_nn_swiglu_new("ffn", 10, 6, 1, &f), st, out);
  LP_CHECK_GOTO(lp_nn_ctx_new(&c), st, out);
  LP_CHECK_GOTO(lp_tensor_zeros(NULL, 3, SH(1, 3, 10), &x), st, out);
  LP_CHECK_GOTO(lp_nn_forward(l, c, x, &y), st, out);
  LP_CHECK_GOTO(lp_nn_input_grad(l, c, y, &dx), st, out);
  LP_CHECK_GOTO(lp_nn_weight_grad(l, c, NULL), st, out);
  LP_CHECK_GOTO(lp_nn_forward(f, c, x, &y2), st, out);
  LP_CHECK_GOTO(lp_nn_backward(f, c, y2, &dx2), st, out);
out:
  lp_tensor_free(x), lp_tensor_free(y), lp_tensor_free(dx);
  lp_tensor_free(y2), lp_tensor_free(dx2);
  lp_nn_ctx_free(c);
  lp_nn_layer_release(l), lp_nn_layer_release(f);
  return st;
}

static void test_oom(void **state) {
  (void)state;
  int failures = lp_test_oom_points(oom_scenario, 100000);
  printf("# mla/swiglu oom: %d failure points, all LP_ERR_NOMEM, no leaks\n",
         failures);
  assert_true(failures > 30);
}

int main(void) {
  fake_backend_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rope_op),
      cmocka_unit_test(test_yarn_freqs),
      cmocka_unit_test(test_params_named_as_model_py),
      cmocka_unit_test(test_mla_forward_reference),
      cmocka_unit_test(test_swiglu_forward_reference),
      cmocka_unit_test(test_grad_mla),
      cmocka_unit_test(test_grad_swiglu),
      cmocka_unit_test(test_block),
      cmocka_unit_test(test_block_moe),
      cmocka_unit_test(test_block_phase_stops),
      cmocka_unit_test(test_moe_new_placed),
      cmocka_unit_test(test_on_fake_backend),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_oom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
