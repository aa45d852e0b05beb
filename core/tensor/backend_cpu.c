/* backend_cpu.c — the CPU compute backend: lp_malloc memory, OpenBLAS sgemm,
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
  for (int64_t i = 0; i < batch; i++) {
    const float *ai = a + i * stride_a, *bi = b + i * stride_b;
    float *ci = c + i * stride_c;
    if (k == 0) { /* C = beta * C; BLAS need not handle k == 0 */
      for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n; j++)
          ci[r * ldc + j] = beta == 0.0f ? 0.0f : beta * ci[r * ldc + j];
      continue;
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
};

const lp_tensor_backend *lp_tensor_backend_cpu(void) { return &cpu_backend; }
