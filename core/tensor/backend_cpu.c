/* backend_cpu.c — the CPU compute backend: lp_malloc memory, OpenBLAS sgemm
 * (oneDNN's matmul when LUAPIPE_F32_GEMM asks, lp_tensor_f32_onednn),
 * plain loops for elementwise ops. Fixed loop orders, so results are
 * bitwise reproducible for a fixed OPENBLAS_NUM_THREADS. */
#include "lp_tensor.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <string.h>

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

static lp_status cpu_fill(const lp_tensor_backend *be, int64_t n, float v,
                          float *x) {
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

static lp_status cpu_axpy(const lp_tensor_backend *be, int64_t n, float alpha,
                          const float *x, float *y) {
  (void)be;
  for (int64_t i = 0; i < n; i++)
    y[i] += alpha * x[i];
  return LP_OK;
}

static lp_status cpu_scale(const lp_tensor_backend *be, int64_t n, float alpha,
                           float *x) {
  (void)be;
  for (int64_t i = 0; i < n; i++)
    x[i] *= alpha;
  return LP_OK;
}

static lp_status cpu_add(const lp_tensor_backend *be, int64_t n, const float *a,
                         const float *b, float *out) {
  (void)be;
  for (int64_t i = 0; i < n; i++)
    out[i] = a[i] + b[i];
  return LP_OK;
}

static lp_status cpu_mul(const lp_tensor_backend *be, int64_t n, const float *a,
                         const float *b, float *out) {
  (void)be;
  for (int64_t i = 0; i < n; i++)
    out[i] = a[i] * b[i];
  return LP_OK;
}

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

static lp_status cpu_act(const lp_tensor_backend *be, lp_tensor_act_kind kind,
                         int64_t n, const float *x, float *y) {
  (void)be;
  switch (kind) {
  case LP_TENSOR_ACT_GELU:
    /* 0.5 x (1 + tanh(u)) == x * sigmoid(2u): one expf instead of tanhf */
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      float u = GELU_C * (v + GELU_A * v * v * v);
      y[i] = v / (1.0f + expf(-2.0f * u));
    }
    return LP_OK;
  case LP_TENSOR_ACT_SILU:
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      y[i] = v / (1.0f + expf(-v));
    }
    return LP_OK;
  }
  return LP_ERR_ARG;
}

static lp_status cpu_act_backward(const lp_tensor_backend *be,
                                  lp_tensor_act_kind kind, int64_t n,
                                  const float *x, const float *dy, float *dx) {
  (void)be;
  switch (kind) {
  case LP_TENSOR_ACT_GELU:
    /* with s = sigmoid(2u): d/dx [x s] = s + 2 x s (1 - s) u' */
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      float u = GELU_C * (v + GELU_A * v * v * v);
      float s = 1.0f / (1.0f + expf(-2.0f * u));
      float du = GELU_C * (1.0f + 3.0f * GELU_A * v * v);
      dx[i] = dy[i] * (s + 2.0f * v * s * (1.0f - s) * du);
    }
    return LP_OK;
  case LP_TENSOR_ACT_SILU:
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      float s = 1.0f / (1.0f + expf(-v));
      dx[i] = dy[i] * (s * (1.0f + v * (1.0f - s)));
    }
    return LP_OK;
  }
  return LP_ERR_ARG;
}

static lp_status cpu_softmax_rows(const lp_tensor_backend *be, int64_t rows,
                                  int64_t cols, const float *x, float *y) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    float mx = -INFINITY;
    for (int64_t j = 0; j < cols; j++)
      if (xr[j] > mx) mx = xr[j];
    if (mx == -INFINITY) { /* fully masked row: define as zeros */
      for (int64_t j = 0; j < cols; j++)
        yr[j] = 0.0f;
      continue;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < cols; j++) {
      float e = expf(xr[j] - mx);
      yr[j] = e;
      sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < cols; j++)
      yr[j] *= inv;
  }
  return LP_OK;
}

static lp_status cpu_sum_rows(const lp_tensor_backend *be, int64_t rows,
                              int64_t cols, const float *x, float beta,
                              float *out) {
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

static lp_status cpu_scatter_add_rows(const lp_tensor_backend *be, int64_t n,
                                      int64_t cols, const float *x,
                                      const int64_t *idx, const float *scale,
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

static lp_status cpu_rmsnorm(const lp_tensor_backend *be, int64_t rows,
                             int64_t d, float eps, const float *x,
                             const float *w, float *y, float *rstd) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d;
    float *yr = y + r * d;
    double ss = 0.0;
    for (int64_t c = 0; c < d; c++)
      ss += (double)xr[c] * xr[c];
    float rs = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    rstd[r] = rs;
    for (int64_t c = 0; c < d; c++)
      yr[c] = xr[c] * rs * w[c];
  }
  return LP_OK;
}

static lp_status cpu_rmsnorm_backward(const lp_tensor_backend *be,
                                      int64_t rows, int64_t d, const float *x,
                                      const float *w, const float *rstd,
                                      const float *dy, float *dx, float *gw) {
  (void)be;
  for (int64_t r = 0; dx && r < rows; r++) {
    const float *xr = x + r * d, *gr = dy + r * d;
    float *dr = dx + r * d;
    float rs = rstd[r];
    double m = 0.0; /* mean of (dy * w) * xhat */
    for (int64_t c = 0; c < d; c++)
      m += (double)(gr[c] * w[c]) * (xr[c] * rs);
    float mf = (float)(m / (double)d);
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

static lp_status cpu_softmax_backward_rows(const lp_tensor_backend *be,
                                           int64_t rows, int64_t cols,
                                           const float *p, float *ds) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) {
    const float *pr = p + r * cols;
    float *dr = ds + r * cols;
    double s = 0.0;
    for (int64_t j = 0; j < cols; j++)
      s += (double)dr[j] * pr[j];
    float sf = (float)s;
    for (int64_t j = 0; j < cols; j++)
      dr[j] = pr[j] * (dr[j] - sf);
  }
  return LP_OK;
}

static lp_status cpu_cross_entropy(const lp_tensor_backend *be, int64_t rows,
                                   int64_t v, const float *logits,
                                   const float *targets, double gs,
                                   double *loss, float *dl) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) {
    const float *lr = logits + r * v;
    int64_t t = (int64_t)targets[r];
    float m = lr[0];
    for (int64_t j = 1; j < v; j++)
      if (lr[j] > m) m = lr[j];
    double s = 0.0;
    for (int64_t j = 0; j < v; j++)
      s += exp((double)lr[j] - m);
    loss[r] = (double)m + log(s) - (double)lr[t];
    if (dl) {
      float *g = dl + r * v;
      for (int64_t j = 0; j < v; j++)
        g[j] =
            (float)(gs * (exp((double)lr[j] - m) / s - (j == t ? 1.0 : 0.0)));
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

static lp_status cpu_sgd_step(const lp_tensor_backend *be, int64_t n,
                              double lr, double mu, double wd, float *p,
                              const float *g, float *m) {
  (void)be;
  for (int64_t j = 0; j < n; j++) {
    double gj = (double)g[j] + wd * (double)p[j];
    double b = mu * (double)m[j] + gj;
    m[j] = (float)b;
    p[j] = (float)((double)p[j] - lr * (double)m[j]);
  }
  return LP_OK;
}

static lp_status cpu_adamw_step(const lp_tensor_backend *be, int64_t n,
                                double lr, double b1, double b2, double eps,
                                double decay, double bc1, double bc2, float *p,
                                const float *g, float *m, float *v) {
  (void)be;
  for (int64_t j = 0; j < n; j++) {
    double gj = g[j];
    double pj = (double)p[j] * decay;
    m[j] = (float)(b1 * (double)m[j] + (1.0 - b1) * gj);
    v[j] = (float)(b2 * (double)v[j] + (1.0 - b2) * gj * gj);
    double den = sqrt((double)v[j] / bc2) + eps;
    p[j] = (float)(pj - lr * ((double)m[j] / bc1) / den);
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
    .gemm_bf16 = lp_tensor_cpu_gemm_bf16,
    .gemm_bf16h = lp_tensor_cpu_gemm_bf16h,
};

const lp_tensor_backend *lp_tensor_backend_cpu(void) { return &cpu_backend; }
