/* backend_cpu.c — the CPU compute backend: lp_malloc memory, OpenBLAS sgemm
 * (oneDNN's matmul when LUAPIPE_F32_GEMM asks, lp_tensor_f32_onednn),
 * plain loops for elementwise ops. Fixed loop orders, so results are
 * bitwise reproducible for a fixed OPENBLAS_NUM_THREADS.
 *
 * The elementwise and per-row loops are written so that the compiler
 * vectorizes them, and built three times (LP_VEC: AVX-512, AVX2, the
 * generic x86-64 of the build) with the one the CPU supports chosen once
 * at load. Every one gives the same bits: the C fixes each operation
 * (ISO C mode: no contraction into FMAs; no -ffast-math), a vector lane
 * computes exactly what the scalar tail does, and sums run in LANES
 * fixed partial sums (element j into lane j % LANES, the lanes added as
 * a fixed tree at the end) whatever the vector width. exp is lp_expf below, a
 * polynomial in plain float operations, not libm's per element. */
#include "lp_tensor.h"
#include "tensor_internal.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) &&       \
    !defined(LP_NO_VEC_CLONES)
#define LP_VEC __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LP_VEC
#endif
#define LP_INLINE static inline __attribute__((always_inline))

/* Partial sums of a reduction: element j goes to lane j % LANES. */
#define LANES 16

/* e^x in float: Cody-Waite reduction x = k ln2 + r (|r| <= ln2/2, ln2 in
 * two parts so k * LN2_HI is exact), Cephes' degree-7 polynomial for e^r,
 * then 2^k applied as two halves 2^k1 2^k2 so that one rounding gives
 * overflow to inf and gradual underflow to subnormals and 0. Within 1 ulp
 * of e^x on the 37 million inputs tests/c/test_cpu_kernels.c checks (libm's
 * expf: 0.5), +-inf and NaN as libm's. */
LP_INLINE float lp_expf(float x) {
  x = x < -104.0f ? -104.0f : x; /* e^-104 < half the least subnormal */
  x = x > 89.0f ? 89.0f : x;     /* e^89 > FLT_MAX (NaN passes both) */
  const float shift = 0x1.8p23f; /* adding it rounds to an integer */
  float t = x * 1.44269504088896341f + shift;
  float kf = t - shift;
  uint32_t tb;
  memcpy(&tb, &t, sizeof tb);
  int32_t k = (int32_t)(tb - 0x4B400000u); /* t's low bits hold k */
  float r = x - kf * 0.693145751953125f;   /* LN2_HI: 16 bits, exact */
  r = r - kf * 1.428606765330187e-6f;      /* LN2_LO */
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int32_t k1 = k / 2, k2 = k - k1; /* each in [-75, 64]: normal powers */
  uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, sizeof s1);
  memcpy(&s2, &b2, sizeof s2);
  return p * s1 * s2;
}

LP_VEC void lp_tensor_cpu_expf(int64_t n, const float *x, float *y) {
  for (int64_t i = 0; i < n; i++)
    y[i] = lp_expf(x[i]);
}

/* Reductions keep their LANES partial sums in GCC vector types (the
 * generic x86-64 clone splits them into SSE registers; AVX-512 holds 8
 * doubles a register), so they stay in registers. A chunk is 16 floats
 * (two halves of 8); a row's last, shorter chunk is padded (0 for sums: a
 * lane adds +0, which changes nothing; -inf for maxima). `room` >= n
 * floats may be read (the causal rows' whole vectors): a short chunk with
 * room is loaded whole and blended, else gathered one by one. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef double v8d __attribute__((vector_size(64)));
typedef struct f16 {
  v8f a, b;
} f16; /* floats j..j+7, j+8..j+15 */
typedef struct lanes {
  v8d a, b;
} lanes; /* lanes 0..7, 8..15 */
_Static_assert(LANES == 16, "a chunk is two halves of 8 floats");

/* v: the n (<= LANES) floats at p, then pad. */
LP_INLINE void f16_load(f16 *v, const float *p, int64_t n, int64_t room, float pad) {
  if (n >= LANES || room >= LANES) {
    memcpy(&v->a, p, sizeof v->a);
    memcpy(&v->b, p + 8, sizeof v->b);
    if (n >= LANES) return;
    const v8i lo = {0, 1, 2, 3, 4, 5, 6, 7}, hi = lo + 8;
    v8f pv = {pad, pad, pad, pad, pad, pad, pad, pad};
    v8i ka = lo < (int32_t)n, kb = hi < (int32_t)n;
    v->a = (v8f)(((v8i)v->a & ka) | ((v8i)pv & ~ka));
    v->b = (v8f)(((v8i)v->b & kb) | ((v8i)pv & ~kb));
    return;
  }
  float t[LANES];
  for (int k = 0; k < LANES; k++)
    t[k] = k < n ? p[k] : pad;
  memcpy(&v->a, t, sizeof v->a);
  memcpy(&v->b, t + 8, sizeof v->b);
}

LP_INLINE void lanes_zero(lanes *l) { memset(l, 0, sizeof *l); }

/* l[k] += (double)x[k] */
LP_INLINE void lanes_add(lanes *l, const f16 *x) {
  l->a += __builtin_convertvector(x->a, v8d);
  l->b += __builtin_convertvector(x->b, v8d);
}

/* l[k] += (double)x[k] * (double)y[k] */
LP_INLINE void lanes_add_prod(lanes *l, const f16 *x, const f16 *y) {
  l->a += __builtin_convertvector(x->a, v8d) * __builtin_convertvector(y->a, v8d);
  l->b += __builtin_convertvector(x->b, v8d) * __builtin_convertvector(y->b, v8d);
}

/* sum_j (double)e[j] over j < n into l (element j into lane j % LANES). */
LP_INLINE void lanes_sum(lanes *l, int64_t n, int64_t room, const float *e) {
  f16 x;
  for (int64_t j = 0; j < n; j += LANES) {
    f16_load(&x, e + j, n - j, room - j, 0.0f);
    lanes_add(l, &x);
  }
}

/* sum_j (double)a[j] * (double)b[j] over j < n into l. */
LP_INLINE void lanes_dot(lanes *l, int64_t n, int64_t room, const float *a, const float *b) {
  f16 x, y;
  for (int64_t j = 0; j < n; j += LANES) {
    f16_load(&x, a + j, n - j, room - j, 0.0f);
    f16_load(&y, b + j, n - j, room - j, 0.0f);
    lanes_add_prod(l, &x, &y);
  }
}

/* The lanes' total, added as a fixed tree: lane k + lane k + w for w = 8,
 * 4, 2, 1. */
LP_INLINE double lanes_total(const lanes *l) {
  v8d s = l->a + l->b;
  double t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6], t3 = s[3] + s[7];
  return (t0 + t2) + (t1 + t3);
}

/* m = x where x > m (a NaN x never enters) */
LP_INLINE void max8(v8f *m, const v8f *x) {
  v8i gt = *x > *m;
  *m = (v8f)(((v8i)*x & gt) | ((v8i)*m & ~gt));
}

/* The largest of x[0..n) that is not NaN; -inf when there is none. */
LP_INLINE float lanes_max(int64_t n, int64_t room, const float *x) {
  f16 m, v;
  f16_load(&m, x, 0, 0, -INFINITY);
  for (int64_t j = 0; j < n; j += LANES) {
    f16_load(&v, x + j, n - j, room - j, -INFINITY);
    max8(&m.a, &v.a);
    max8(&m.b, &v.b);
  }
  max8(&m.a, &m.b);
  float t0 = m.a[4] > m.a[0] ? m.a[4] : m.a[0];
  float t1 = m.a[5] > m.a[1] ? m.a[5] : m.a[1];
  float t2 = m.a[6] > m.a[2] ? m.a[6] : m.a[2];
  float t3 = m.a[7] > m.a[3] ? m.a[7] : m.a[3];
  t0 = t2 > t0 ? t2 : t0;
  t1 = t3 > t1 ? t3 : t1;
  return t1 > t0 ? t1 : t0;
}

static void *cpu_alloc(const lp_tensor_backend *be, size_t bytes) {
  (void)be;
  return lp_malloc(bytes);
}

static void cpu_free(const lp_tensor_backend *be, void *p) {
  (void)be;
  lp_free(p);
}

static lp_status cpu_memcpy(const lp_tensor_backend *be, void *dst,
                            const void *src, size_t bytes) {
  (void)be;
  if (bytes) memmove(dst, src, bytes);
  return LP_OK;
}

static lp_status cpu_gemm(const lp_tensor_backend *be, int trans_a, int trans_b,
                          int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, int64_t stride_a,
                          const float *b, int64_t ldb, int64_t stride_b,
                          float beta, float *c, int64_t ldc, int64_t stride_c,
                          int64_t batch) {
  (void)be;
  if (m < 0 || n < 0 || k < 0 || batch < 0) return LP_ERR_ARG;
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX ||
      ldb > INT_MAX || ldc > INT_MAX)
    return LP_ERR_ARG;
  if (m == 0 || n == 0) return LP_OK;
  int dnnl = lp_tensor_f32_onednn();
  for (int64_t i = 0; i < batch; i++) {
    const float *ai = a + i * stride_a, *bi = b + i * stride_b;
    float *ci = c + i * stride_c;
    if (k == 0) { /* C = beta * C; BLAS need not handle k == 0 */
      for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n; j++)
          ci[r * ldc + j] = beta == 0.0f ? 0.0f : beta * ci[r * ldc + j];
      continue;
    }
    if (dnnl) { /* see lp_tensor_f32_onednn */
      lp_status st = lp_tensor_cpu_gemm_onednn_f32(
          trans_a, trans_b, m, n, k, alpha, ai, lda, bi, ldb, beta, ci, ldc);
      if (st == LP_OK) continue;
      if (st != LP_ERR_UNSUPPORTED) return st;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k,
                alpha, ai, (int)lda, bi, (int)ldb, beta, ci, (int)ldc);
  }
  return LP_OK;
}

LP_VEC static lp_status cpu_fill(const lp_tensor_backend *be, int64_t n, float v, float *x) {
  (void)be;
  for (int64_t i = 0; i < n; i++)
    x[i] = v;
  return LP_OK;
}

static lp_status cpu_copy(const lp_tensor_backend *be, int64_t n,
                          const float *x, float *out) {
  (void)be;
  if (n > 0 && x != out) memmove(out, x, (size_t)n * sizeof(float));
  return LP_OK;
}

LP_VEC static lp_status cpu_axpy(const lp_tensor_backend *be, int64_t n, float alpha,
                                 const float *x, float *y) {
  (void)be;
  for (int64_t i = 0; i < n; i++)
    y[i] += alpha * x[i];
  return LP_OK;
}

LP_VEC static lp_status cpu_scale(const lp_tensor_backend *be, int64_t n, float alpha, float *x) {
  (void)be;
  for (int64_t i = 0; i < n; i++)
    x[i] *= alpha;
  return LP_OK;
}

LP_VEC static lp_status cpu_add(const lp_tensor_backend *be, int64_t n, const float *a,
                                const float *b, float *out) {
  (void)be;
  for (int64_t i = 0; i < n; i++)
    out[i] = a[i] + b[i];
  return LP_OK;
}

LP_VEC static lp_status cpu_mul(const lp_tensor_backend *be, int64_t n, const float *a,
                                const float *b, float *out) {
  (void)be;
  for (int64_t i = 0; i < n; i++)
    out[i] = a[i] * b[i];
  return LP_OK;
}

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

LP_VEC static lp_status cpu_act(const lp_tensor_backend *be, lp_tensor_act_kind kind, int64_t n,
                                const float *x, float *y) {
  (void)be;
  switch (kind) {
  case LP_TENSOR_ACT_GELU:
    /* 0.5 x (1 + tanh(u)) == x * sigmoid(2u): one exp instead of tanhf */
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      float u = GELU_C * (v + GELU_A * v * v * v);
      y[i] = v / (1.0f + lp_expf(-2.0f * u));
    }
    return LP_OK;
  case LP_TENSOR_ACT_SILU:
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      y[i] = v / (1.0f + lp_expf(-v));
    }
    return LP_OK;
  }
  return LP_ERR_ARG;
}

LP_VEC static lp_status cpu_act_backward(const lp_tensor_backend *be, lp_tensor_act_kind kind,
                                         int64_t n, const float *x, const float *dy, float *dx) {
  (void)be;
  switch (kind) {
  case LP_TENSOR_ACT_GELU:
    /* with s = sigmoid(2u): d/dx [x s] = s + 2 x s (1 - s) u' */
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      float u = GELU_C * (v + GELU_A * v * v * v);
      float s = 1.0f / (1.0f + lp_expf(-2.0f * u));
      float du = GELU_C * (1.0f + 3.0f * GELU_A * v * v);
      dx[i] = dy[i] * (s + 2.0f * v * s * (1.0f - s) * du);
    }
    return LP_OK;
  case LP_TENSOR_ACT_SILU:
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      float s = 1.0f / (1.0f + lp_expf(-v));
      dx[i] = dy[i] * (s * (1.0f + v * (1.0f - s)));
    }
    return LP_OK;
  }
  return LP_ERR_ARG;
}

/* Softmax of one row of n floats (y may alias x); the sum of the
 * exponentials in double lanes. A fully masked row (all -inf) gives
 * zeros. Entries at -inf add exact zeros to the lanes, so a row with
 * -inf after its first i entries equals the softmax of those i. */
/* m >= n: the exponentials are taken over m entries (a whole number of
 * vectors where the row has room: no scalar tail), only the first n
 * count; y[n..m) is left to the caller. */
LP_INLINE void softmax_row(int64_t n, int64_t m, const float *x, float *y) {
  float mx = lanes_max(n, m, x);
  if (mx == -INFINITY) {
    for (int64_t j = 0; j < n; j++)
      y[j] = 0.0f;
    return;
  }
  for (int64_t j = 0; j < m; j++)
    y[j] = lp_expf(x[j] - mx);
  lanes acc;
  lanes_zero(&acc);
  lanes_sum(&acc, n, m, y);
  float inv = (float)(1.0 / lanes_total(&acc));
  for (int64_t j = 0; j < n; j++)
    y[j] *= inv;
}

LP_VEC static lp_status cpu_softmax_rows(const lp_tensor_backend *be, int64_t rows, int64_t cols,
                                         const float *x, float *y) {
  (void)be;
  for (int64_t r = 0; r < rows; r++)
    softmax_row(cols, cols, x + r * cols, y + r * cols);
  return LP_OK;
}

/* Causal softmax: row r (position i = r % t of its block) is the softmax
 * of its first i + 1 entries, zeros after; the same bits as causal_mask
 * then softmax_rows, without the masked triangle's work. The exponentials
 * run up to a multiple of LANES inside the row (entries that are then
 * zeroed: x's values there do not matter). */
LP_VEC static lp_status cpu_causal_softmax_rows(const lp_tensor_backend *be, int64_t rows,
                                                int64_t t, const float *x, float *y) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) {
    int64_t n = r % t + 1, m = (n + LANES - 1) / LANES * LANES;
    float *yr = y + r * t;
    softmax_row(n, m < t ? m : t, x + r * t, yr);
    for (int64_t j = n; j < t; j++)
      yr[j] = 0.0f;
  }
  return LP_OK;
}

LP_VEC static lp_status cpu_sum_rows(const lp_tensor_backend *be, int64_t rows, int64_t cols,
                                     const float *x, float beta, float *out) {
  (void)be;
  for (int64_t j = 0; j < cols; j++)
    out[j] = beta == 0.0f ? 0.0f : beta * out[j];
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    for (int64_t j = 0; j < cols; j++)
      out[j] += xr[j];
  }
  return LP_OK;
}

static lp_status cpu_gather_rows(const lp_tensor_backend *be, int64_t n,
                                 int64_t cols, const float *x,
                                 const int64_t *idx, const float *scale,
                                 float *out) {
  (void)be;
  for (int64_t i = 0; i < n; i++) {
    const float *src = x + idx[i] * cols;
    float *dst = out + i * cols, a = scale ? scale[i] : 1.0f;
    if (scale)
      for (int64_t j = 0; j < cols; j++)
        dst[j] = a * src[j];
    else if (cols > 0)
      memcpy(dst, src, (size_t)cols * sizeof(float));
  }
  return LP_OK;
}

LP_VEC static lp_status cpu_scatter_add_rows(const lp_tensor_backend *be, int64_t n, int64_t cols,
                                             const float *x, const int64_t *idx, const float *scale,
                                             float *out) {
  (void)be;
  for (int64_t i = 0; i < n; i++) {
    const float *src = x + i * cols;
    float *dst = out + idx[i] * cols, a = scale ? scale[i] : 1.0f;
    for (int64_t j = 0; j < cols; j++)
      dst[j] += a * src[j];
  }
  return LP_OK;
}

static lp_status cpu_dot_rows(const lp_tensor_backend *be, int64_t n,
                              int64_t cols, const float *a, const int64_t *idx,
                              const float *b, float *out) {
  (void)be;
  for (int64_t i = 0; i < n; i++) {
    const float *ar = a + (idx ? idx[i] : i) * cols, *br = b + i * cols;
    double d = 0.0;
    for (int64_t c = 0; c < cols; c++)
      d += (double)ar[c] * br[c];
    out[i] = (float)d;
  }
  return LP_OK;
}

/* ---- nn kernels (the reference loops; see lp_tensor.h) ---- */

static lp_status cpu_add_rowvec(const lp_tensor_backend *be, int64_t rows,
                                int64_t cols, const float *v, float *t) {
  for (int64_t r = 0; r < rows; r++)
    LP_CHECK(cpu_axpy(be, cols, 1.0f, v, t + r * cols));
  return LP_OK;
}

LP_VEC static lp_status cpu_rmsnorm(const lp_tensor_backend *be, int64_t rows, int64_t d, float eps,
                                    const float *x, const float *w, float *y, float *rstd) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d;
    float *yr = y + r * d;
    lanes acc;
    lanes_zero(&acc);
    lanes_dot(&acc, d, d, xr, xr);
    double ss = lanes_total(&acc);
    float rs = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    rstd[r] = rs;
    for (int64_t c = 0; c < d; c++)
      yr[c] = xr[c] * rs * w[c];
  }
  return LP_OK;
}

LP_VEC static lp_status cpu_rmsnorm_backward(const lp_tensor_backend *be, int64_t rows, int64_t d,
                                             const float *x, const float *w, const float *rstd,
                                             const float *dy, float *dx, float *gw) {
  (void)be;
  for (int64_t r = 0; dx && r < rows; r++) {
    const float *xr = x + r * d, *gr = dy + r * d;
    float *dr = dx + r * d;
    float rs = rstd[r];
    lanes acc; /* mean of (dy * w) * xhat */
    lanes_zero(&acc);
    f16 gv, wv, xv;
    for (int64_t c = 0; c < d; c += LANES) {
      f16_load(&gv, gr + c, d - c, d - c, 0.0f);
      f16_load(&wv, w + c, d - c, d - c, 0.0f);
      f16_load(&xv, xr + c, d - c, d - c, 0.0f);
      gv.a *= wv.a, gv.b *= wv.b; /* float products, as dx's below */
      xv.a *= rs, xv.b *= rs;
      lanes_add_prod(&acc, &gv, &xv);
    }
    float mf = (float)(lanes_total(&acc) / (double)d);
    for (int64_t c = 0; c < d; c++)
      dr[c] = rs * (gr[c] * w[c] - xr[c] * rs * mf);
  }
  for (int64_t r = 0; gw && r < rows; r++) {
    const float *xr = x + r * d, *gr = dy + r * d;
    float rs = rstd[r];
    for (int64_t c = 0; c < d; c++)
      gw[c] += gr[c] * (xr[c] * rs);
  }
  return LP_OK;
}

static lp_status cpu_embedding(const lp_tensor_backend *be, int64_t n,
                               int64_t dim, const float *ids, const float *w,
                               float *y) {
  for (int64_t r = 0; r < n; r++)
    LP_CHECK(cpu_copy(be, dim, w + (int64_t)ids[r] * dim, y + r * dim));
  return LP_OK;
}

static lp_status cpu_embedding_backward(const lp_tensor_backend *be, int64_t n,
                                        int64_t dim, int64_t vocab,
                                        const float *ids, const float *dy,
                                        float *gw) {
  (void)vocab;
  for (int64_t r = 0; r < n; r++)
    LP_CHECK(cpu_axpy(be, dim, 1.0f, dy + r * dim, gw + (int64_t)ids[r] * dim));
  return LP_OK;
}

static lp_status cpu_causal_mask(const lp_tensor_backend *be, int64_t rows,
                                 int64_t t, float *s) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) {
    float *row = s + r * t;
    for (int64_t j = r % t + 1; j < t; j++)
      row[j] = -INFINITY;
  }
  return LP_OK;
}

/* ds = p * (ds - sum_j ds[j] p[j]) over one row of n (sum in double
 * lanes). Entries with p = 0 add exact zeros to the sum. */
/* (the product runs over m >= n entries; those past n are the caller's) */
LP_INLINE void softmax_backward_row(int64_t n, int64_t m, const float *pr, float *dr) {
  lanes acc;
  lanes_zero(&acc);
  lanes_dot(&acc, n, m, dr, pr);
  float sf = (float)lanes_total(&acc);
  for (int64_t j = 0; j < m; j++)
    dr[j] = pr[j] * (dr[j] - sf);
}

LP_VEC static lp_status cpu_softmax_backward_rows(const lp_tensor_backend *be, int64_t rows,
                                                  int64_t cols, const float *p, float *ds) {
  (void)be;
  for (int64_t r = 0; r < rows; r++)
    softmax_backward_row(cols, cols, p + r * cols, ds + r * cols);
  return LP_OK;
}

/* The backward of causal_softmax_rows: row r's first r % t + 1 entries as
 * softmax_backward_rows gives them, zeros after (where p is 0). */
LP_VEC static lp_status cpu_causal_softmax_backward_rows(const lp_tensor_backend *be, int64_t rows,
                                                         int64_t t, const float *p, float *ds) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) {
    int64_t n = r % t + 1, m = (n + LANES - 1) / LANES * LANES;
    float *dr = ds + r * t;
    softmax_backward_row(n, m < t ? m : t, p + r * t, dr);
    for (int64_t j = n; j < t; j++)
      dr[j] = 0.0f;
  }
  return LP_OK;
}

/* Per row: m = max, e_j = lp_expf(l_j - m) (float), s = sum e_j in
 * double lanes; loss = m + log s - l_t; dl_j = gs (e_j / s - [j == t]).
 * Without dl the exponentials go through a stack block of CE_BLOCK (a
 * multiple of LANES, so the lanes and the loss are the same bits). */
#define CE_BLOCK 512
LP_VEC static lp_status cpu_cross_entropy(const lp_tensor_backend *be, int64_t rows, int64_t v,
                                          const float *logits, const float *targets, double gs,
                                          double *loss, float *dl) {
  (void)be;
  float eb[CE_BLOCK];
  for (int64_t r = 0; r < rows; r++) {
    const float *lr = logits + r * v;
    int64_t t = (int64_t)targets[r];
    float m = lanes_max(v, v, lr);
    lanes acc;
    lanes_zero(&acc);
    float *g = dl ? dl + r * v : NULL;
    for (int64_t j0 = 0; j0 < v; j0 += CE_BLOCK) {
      int64_t n = v - j0 < CE_BLOCK ? v - j0 : CE_BLOCK;
      float *e = g ? g + j0 : eb;
      for (int64_t j = 0; j < n; j++)
        e[j] = lp_expf(lr[j0 + j] - m);
      lanes_sum(&acc, n, n, e);
    }
    double s = lanes_total(&acc);
    loss[r] = (double)m + log(s) - (double)lr[t];
    if (g) {
      double et = g[t];
      for (int64_t j = 0; j < v; j++)
        g[j] = (float)(gs * ((double)g[j] / s));
      g[t] = (float)(gs * (et / s - 1.0));
    }
  }
  return LP_OK;
}

static lp_status cpu_sq_error(const lp_tensor_backend *be, int64_t n,
                              const float *p, const float *t, double gs,
                              double *sq, float *dp) {
  (void)be;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)p[i] - (double)t[i];
    sq[i] = d * d;
    if (dp) dp[i] = (float)(gs * d);
  }
  return LP_OK;
}

LP_VEC static lp_status cpu_sgd_step(const lp_tensor_backend *be, int64_t n, double lr, double mu,
                                     double wd, float *p, const float *g, float *m) {
  (void)be;
  for (int64_t j = 0; j < n; j++) {
    double gj = (double)g[j] + wd * (double)p[j];
    double b = mu * (double)m[j] + gj;
    m[j] = (float)b;
    p[j] = (float)((double)p[j] - lr * (double)m[j]);
  }
  return LP_OK;
}

/* The formula of lp_tensor.h in double, with the two bias corrections as
 * multiplications by their reciprocals (one division and a sqrt per
 * element instead of three and a sqrt: the loop was bound by them). The
 * double results differ from the divisions' by an ulp of a double, so the
 * float results are the same but for the rare one at a rounding boundary
 * (tests/c/test_cpu_kernels.c counts them). p, g, m, v are separate
 * buffers (restrict: no alias checks); sqrt vectorizes because this file
 * is built with -fno-math-errno (it never sets errno here: v >= 0). */
LP_VEC static lp_status cpu_adamw_step(const lp_tensor_backend *be, int64_t n, double lr, double b1,
                                       double b2, double eps, double decay, double bc1, double bc2,
                                       float *restrict p, const float *restrict g,
                                       float *restrict m, float *restrict v) {
  (void)be;
  double ibc1 = 1.0 / bc1, ibc2 = 1.0 / bc2;
  for (int64_t j = 0; j < n; j++) {
    double gj = g[j];
    double pj = (double)p[j] * decay;
    float mj = (float)(b1 * (double)m[j] + (1.0 - b1) * gj);
    float vj = (float)(b2 * (double)v[j] + (1.0 - b2) * gj * gj);
    m[j] = mj;
    v[j] = vj;
    double den = sqrt((double)vj * ibc2) + eps;
    p[j] = (float)(pj - lr * ((double)mj * ibc1) / den);
  }
  return LP_OK;
}

static lp_status cpu_rope(const lp_tensor_backend *be, int64_t rows,
                          int64_t seq, int64_t heads, int64_t d, int64_t ld,
                          int64_t hs, const float *cs, int conj, float *x) {
  (void)be;
  if (rows < 0 || seq < 1 || heads < 0 || d < 0 || d % 2) return LP_ERR_ARG;
  for (int64_t r = 0; r < rows; r++) {
    const float *cr = cs + (r % seq) * d;
    for (int64_t h = 0; h < heads; h++) {
      float *z = x + r * ld + h * hs;
      for (int64_t i = 0; i < d; i += 2) {
        float c = cr[i], s = conj ? -cr[i + 1] : cr[i + 1];
        float x0 = z[i], x1 = z[i + 1];
        z[i] = x0 * c - x1 * s;
        z[i + 1] = x0 * s + x1 * c;
      }
    }
  }
  return LP_OK;
}

static const lp_tensor_backend cpu_backend = {
    .name = "cpu",
    .host_accessible = 1,
    .ud = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_memcpy,
    .from_host = cpu_memcpy,
    .gemm = cpu_gemm,
    .fill = cpu_fill,
    .copy = cpu_copy,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .add = cpu_add,
    .mul = cpu_mul,
    .act = cpu_act,
    .act_backward = cpu_act_backward,
    .softmax_rows = cpu_softmax_rows,
    .sum_rows = cpu_sum_rows,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .add_rowvec = cpu_add_rowvec,
    .rmsnorm = cpu_rmsnorm,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .embedding = cpu_embedding,
    .embedding_backward = cpu_embedding_backward,
    .causal_mask = cpu_causal_mask,
    .softmax_backward_rows = cpu_softmax_backward_rows,
    .cross_entropy = cpu_cross_entropy,
    .sq_error = cpu_sq_error,
    .sgd_step = cpu_sgd_step,
    .adamw_step = cpu_adamw_step,
    .dot_rows = cpu_dot_rows,
    .rope = cpu_rope,
    .causal_softmax_rows = cpu_causal_softmax_rows,
    .causal_softmax_backward_rows = cpu_causal_softmax_backward_rows,
    .gemm_bf16 = lp_tensor_cpu_gemm_bf16,
    .gemm_bf16h = lp_tensor_cpu_gemm_bf16h,
};

const lp_tensor_backend *lp_tensor_backend_cpu(void) { return &cpu_backend; }
