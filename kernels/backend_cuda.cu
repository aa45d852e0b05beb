// backend_cuda.cu — the CUDA tensor backend (lp_tensor_backend_cuda, which
// kernels.c forwards to lpk_backend here, in the module luapipe_cuda.so): a
// caching allocator over cudaMalloc, host<->device copies, cuBLAS GEMM and
// the element-wise and per-row kernels of the lp_tensor_backend table. All
// work is queued on one compute stream per device. Reductions run in a
// fixed order (no atomics), so results are reproducible run to run; they
// match the CPU backend within float rounding, not bitwise.
#include "cuda_internal.cuh"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

// ---- error text -------------------------------------------------------------

static __thread char last_error[512] = "";

void lpk_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
}

lp_status lpk_cuda_fail(const char *where, const char *what, cudaError_t e) {
  lpk_errorf("%s: %s: %s", where, what, cudaGetErrorString(e));
  return e == cudaErrorMemoryAllocation ? LP_ERR_NOMEM : LP_ERR_INTERNAL;
}

extern "C" const char *lpk_last_error(void) { return last_error; }

extern "C" int lpk_device_count(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    // the reason, for "no CUDA device is visible (...)" messages
    lpk_errorf("cudaGetDeviceCount: %s", cudaGetErrorString(e));
    (void)cudaGetLastError(); // clear the sticky "no driver" error
    return 0;
  }
  if (n == 0) lpk_errorf("cudaGetDeviceCount: 0 devices");
  return n;
}

// ---- per-device state ---------------------------------------------------------

namespace {

struct Device {
  lp_tensor_backend be; // first member: the table handed out
  int index;
  char name[16];
  cudaStream_t stream;
  cublasHandle_t blas;
  int sync_each; // LUAPIPE_CUDA_SYNC=1
  // caching allocator: exact rounded sizes -> free blocks; live -> size
  pthread_mutex_t mu;
  std::unordered_multimap<size_t, void *> cache;
  std::unordered_map<void *, size_t> live;
  size_t in_use, cached;
};

constexpr int kMaxDevices = 64;
Device *devices[kMaxDevices];
pthread_mutex_t devices_mu = PTHREAD_MUTEX_INITIALIZER;

Device *dev_of(const lp_tensor_backend *be) {
  return reinterpret_cast<Device *>(be->ud);
}

// Makes be's device current; LP_OK or a failure with text.
lp_status enter(const Device *d, const char *op) {
  cudaError_t e = cudaSetDevice(d->index);
  if (e != cudaSuccess) return lpk_cuda_fail(d->name, op, e);
  return LP_OK;
}

// After a launch: the launch error, and with LUAPIPE_CUDA_SYNC the
// asynchronous one too.
lp_status launched(const Device *d, const char *op) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && d->sync_each) e = cudaStreamSynchronize(d->stream);
  if (e != cudaSuccess) return lpk_cuda_fail(d->name, op, e);
  return LP_OK;
}

const char *blas_text(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  default: return "cuBLAS error";
  }
}

// ---- launch geometry ----

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b > 65535 * 8) b = 65535 * 8; // grid-stride loops cover the rest
  return (unsigned)(b > 0 ? b : 1);
}

#define GRID_STRIDE(i, n)                                                      \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);   \
       i += (int64_t)gridDim.x * blockDim.x)

// Block-wide reductions (blockDim.x == kThreads), fixed order: each thread
// folds its strided share, then a shared-memory tree in index order.
template <typename T> struct SumOp {
  __device__ T operator()(T a, T b) const { return a + b; }
};
template <typename T> struct MaxOp {
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T *sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) sh[threadIdx.x] = op(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
  T r = sh[0];
  __syncthreads();
  return r;
}

// ---- element-wise kernels ----

__global__ void k_fill(int64_t n, float v, float *x) {
  GRID_STRIDE(i, n) x[i] = v;
}
__global__ void k_axpy(int64_t n, float a, const float *x, float *y) {
  GRID_STRIDE(i, n) y[i] += a * x[i];
}
__global__ void k_scale(int64_t n, float a, float *x) {
  GRID_STRIDE(i, n) x[i] *= a;
}
__global__ void k_add(int64_t n, const float *a, const float *b, float *o) {
  GRID_STRIDE(i, n) o[i] = a[i] + b[i];
}
__global__ void k_mul(int64_t n, const float *a, const float *b, float *o) {
  GRID_STRIDE(i, n) o[i] = a[i] * b[i];
}

#define GELU_C 0.7978845608028654f
#define GELU_A 0.044715f

__global__ void k_act(int kind, int64_t n, const float *x, float *y) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    if (kind == LP_TENSOR_ACT_GELU) {
      float u = GELU_C * (v + GELU_A * v * v * v);
      y[i] = v / (1.0f + expf(-2.0f * u));
    } else {
      y[i] = v / (1.0f + expf(-v));
    }
  }
}

__global__ void k_act_backward(int kind, int64_t n, const float *x,
                               const float *dy, float *dx) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    if (kind == LP_TENSOR_ACT_GELU) {
      float u = GELU_C * (v + GELU_A * v * v * v);
      float s = 1.0f / (1.0f + expf(-2.0f * u));
      float du = GELU_C * (1.0f + 3.0f * GELU_A * v * v);
      dx[i] = dy[i] * (s + 2.0f * v * s * (1.0f - s) * du);
    } else {
      float s = 1.0f / (1.0f + expf(-v));
      dx[i] = dy[i] * (s * (1.0f + v * (1.0f - s)));
    }
  }
}

__global__ void k_add_rowvec(int64_t n, int64_t cols, const float *v,
                             float *t) {
  GRID_STRIDE(i, n) t[i] += v[i % cols];
}

__global__ void k_embedding(int64_t n, int64_t dim, const float *ids,
                            const float *w, float *y) {
  GRID_STRIDE(i, n * dim) {
    int64_t r = i / dim, c = i % dim;
    y[i] = w[(int64_t)ids[r] * dim + c];
  }
}

__global__ void k_causal_mask(int64_t n, int64_t t, float *s) {
  GRID_STRIDE(i, n) {
    int64_t r = i / t, j = i % t;
    if (j > r % t) s[i] = -INFINITY;
  }
}

__global__ void k_sq_error(int64_t n, const float *p, const float *t,
                           double gs, double *sq, float *dp) {
  GRID_STRIDE(i, n) {
    double d = (double)p[i] - (double)t[i];
    sq[i] = d * d;
    if (dp) dp[i] = (float)(gs * d);
  }
}

__global__ void k_sgd(int64_t n, double lr, double mu, double wd, float *p,
                      const float *g, float *m) {
  GRID_STRIDE(j, n) {
    double gj = (double)g[j] + wd * (double)p[j];
    double b = mu * (double)m[j] + gj;
    m[j] = (float)b;
    p[j] = (float)((double)p[j] - lr * (double)m[j]);
  }
}

__global__ void k_adamw(int64_t n, double lr, double b1, double b2, double eps,
                        double decay, double bc1, double bc2, float *p,
                        const float *g, float *m, float *v) {
  GRID_STRIDE(j, n) {
    double gj = g[j];
    double pj = (double)p[j] * decay;
    float mj = (float)(b1 * (double)m[j] + (1.0 - b1) * gj);
    float vj = (float)(b2 * (double)v[j] + (1.0 - b2) * gj * gj);
    m[j] = mj;
    v[j] = vj;
    double den = sqrt((double)vj / bc2) + eps;
    p[j] = (float)(pj - lr * ((double)mj / bc1) / den);
  }
}

// ---- per-row kernels: one block per row ----

__global__ void k_softmax_rows(int64_t cols, const float *x, float *y) {
  __shared__ double shd[kThreads];
  __shared__ float shf[kThreads];
  const float *xr = x + blockIdx.x * cols;
  float *yr = y + blockIdx.x * cols;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) mx = fmaxf(mx, xr[j]);
  mx = block_reduce(mx, MaxOp<float>(), shf);
  if (mx == -INFINITY) { // fully masked row: zeros
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) yr[j] = 0.0f;
    return;
  }
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    float e = expf(xr[j] - mx);
    yr[j] = e;
    s += e;
  }
  s = block_reduce(s, SumOp<double>(), shd);
  float inv = (float)(1.0 / s);
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) yr[j] *= inv;
}

__global__ void k_softmax_backward(int64_t cols, const float *p, float *ds) {
  __shared__ double shd[kThreads];
  const float *pr = p + blockIdx.x * cols;
  float *dr = ds + blockIdx.x * cols;
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads)
    s += (double)dr[j] * pr[j];
  float sf = (float)block_reduce(s, SumOp<double>(), shd);
  for (int64_t j = threadIdx.x; j < cols; j += kThreads)
    dr[j] = pr[j] * (dr[j] - sf);
}

__global__ void k_rmsnorm(int64_t d, float eps, const float *x, const float *w,
                          float *y, float *rstd) {
  __shared__ double shd[kThreads];
  const float *xr = x + blockIdx.x * d;
  float *yr = y + blockIdx.x * d;
  double ss = 0.0;
  for (int64_t c = threadIdx.x; c < d; c += kThreads) ss += (double)xr[c] * xr[c];
  ss = block_reduce(ss, SumOp<double>(), shd);
  float rs = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
  for (int64_t c = threadIdx.x; c < d; c += kThreads) yr[c] = xr[c] * rs * w[c];
}

__global__ void k_rmsnorm_dx(int64_t d, const float *x, const float *w,
                             const float *rstd, const float *dy, float *dx) {
  __shared__ double shd[kThreads];
  const float *xr = x + blockIdx.x * d, *gr = dy + blockIdx.x * d;
  float *dr = dx + blockIdx.x * d;
  float rs = rstd[blockIdx.x];
  double m = 0.0;
  for (int64_t c = threadIdx.x; c < d; c += kThreads)
    m += (double)(gr[c] * w[c]) * (xr[c] * rs);
  float mf = (float)(block_reduce(m, SumOp<double>(), shd) / (double)d);
  for (int64_t c = threadIdx.x; c < d; c += kThreads)
    dr[c] = rs * (gr[c] * w[c] - xr[c] * rs * mf);
}

__global__ void k_cross_entropy(int64_t v, const float *logits,
                                const float *targets, double gs, double *loss,
                                float *dl) {
  __shared__ double shd[kThreads];
  __shared__ float shf[kThreads];
  const float *lr = logits + blockIdx.x * v;
  int64_t t = (int64_t)targets[blockIdx.x];
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) m = fmaxf(m, lr[j]);
  m = block_reduce(m, MaxOp<float>(), shf);
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) s += exp((double)lr[j] - m);
  s = block_reduce(s, SumOp<double>(), shd);
  if (threadIdx.x == 0) loss[blockIdx.x] = (double)m + log(s) - (double)lr[t];
  if (!dl) return;
  float *g = dl + blockIdx.x * v;
  for (int64_t j = threadIdx.x; j < v; j += kThreads)
    g[j] = (float)(gs * (exp((double)lr[j] - m) / s - (j == t ? 1.0 : 0.0)));
}

// ---- column reductions: 32 columns x 8 row lanes per block; each lane sums
// rows lane, lane+8, ... in order, then lanes are added in order ----

constexpr int kColW = 32, kRowLanes = 8;

// out[c] = beta * out[c] + sum_r x[r, c]
__global__ void k_sum_rows(int64_t rows, int64_t cols, const float *x,
                           float beta, float *out) {
  __shared__ float sh[kRowLanes][kColW];
  int64_t c = blockIdx.x * (int64_t)kColW + threadIdx.x;
  float s = 0.0f;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) s += x[r * cols + c];
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.0f;
    for (int k = 0; k < kRowLanes; k++) t += sh[k][threadIdx.x];
    out[c] = (beta == 0.0f ? 0.0f : beta * out[c]) + t;
  }
}

// gw[c] += sum_r dy[r, c] * x[r, c] * rstd[r]
__global__ void k_rmsnorm_gw(int64_t rows, int64_t d, const float *x,
                             const float *rstd, const float *dy, float *gw) {
  __shared__ float sh[kRowLanes][kColW];
  int64_t c = blockIdx.x * (int64_t)kColW + threadIdx.x;
  float s = 0.0f;
  if (c < d)
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes)
      s += dy[r * d + c] * (x[r * d + c] * rstd[r]);
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    float t = 0.0f;
    for (int k = 0; k < kRowLanes; k++) t += sh[k][threadIdx.x];
    gw[c] += t;
  }
}

// gw[v, c] += sum over r with ids[r] == v of dy[r, c], rows in order: one
// block per (vocabulary row, 32 columns); ids are scanned through shared
// memory in tiles, so no atomics and a fixed order.
constexpr int kIdTile = 1024;

__global__ void k_embedding_backward(int64_t v0, int64_t n, int64_t dim,
                                     const float *ids, const float *dy,
                                     float *gw) {
  __shared__ float tile[kIdTile];
  int64_t vrow = v0 + blockIdx.y;
  int64_t c = blockIdx.x * (int64_t)kColW + threadIdx.x;
  int tid = threadIdx.y * kColW + threadIdx.x;
  float acc = 0.0f;
  int hit = 0;
  for (int64_t base = 0; base < n; base += kIdTile) {
    int64_t len = n - base < kIdTile ? n - base : kIdTile;
    __syncthreads();
    for (int64_t k = tid; k < len; k += kColW * kRowLanes) tile[k] = ids[base + k];
    __syncthreads();
    if (threadIdx.y == 0 && c < dim)
      for (int64_t k = 0; k < len; k++)
        if ((int64_t)tile[k] == vrow) {
          acc += dy[(base + k) * dim + c];
          hit = 1;
        }
  }
  if (threadIdx.y == 0 && c < dim && hit) gw[vrow * dim + c] += acc;
}

// ---- the table's functions ----

#define ENTER(op) LP_CHECK(enter(d, op))

void *cu_alloc(const lp_tensor_backend *be, size_t bytes) {
  Device *d = dev_of(be);
  size_t sz = (bytes + 511) & ~(size_t)511;
  if (!sz) sz = 512;
  void *p = NULL;
  pthread_mutex_lock(&d->mu);
  auto it = d->cache.find(sz);
  if (it != d->cache.end()) {
    p = it->second;
    d->cache.erase(it);
    d->cached -= sz;
  }
  pthread_mutex_unlock(&d->mu);
  if (!p) {
    if (enter(d, "cudaMalloc") != LP_OK) return NULL;
    cudaError_t e = cudaMalloc(&p, sz);
    if (e == cudaErrorMemoryAllocation) { // give the cache back, try again
      (void)cudaGetLastError();
      lpk_cuda_empty_cache(be);
      e = cudaMalloc(&p, sz);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      lpk_cuda_fail(d->name, "cudaMalloc", e);
      return NULL;
    }
  }
  pthread_mutex_lock(&d->mu);
  d->live[p] = sz;
  d->in_use += sz;
  pthread_mutex_unlock(&d->mu);
  return p;
}

// Freed blocks go to the cache: the next user is queued on the same stream
// after every op that used the block, so reuse needs no wait.
void cu_free(const lp_tensor_backend *be, void *p) {
  if (!p) return;
  Device *d = dev_of(be);
  pthread_mutex_lock(&d->mu);
  auto it = d->live.find(p);
  if (it != d->live.end()) {
    size_t sz = it->second;
    d->live.erase(it);
    d->in_use -= sz;
    d->cache.emplace(sz, p);
    d->cached += sz;
  }
  pthread_mutex_unlock(&d->mu);
}

// Host <-> device copies wait for the stream: to_host so the caller can
// read, from_host so the caller may reuse its buffer at once.
lp_status copy_sync(const lp_tensor_backend *be, void *dst, const void *src,
                    size_t bytes, cudaMemcpyKind kind, const char *what) {
  Device *d = dev_of(be);
  if (!bytes) return LP_OK;
  ENTER(what);
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, d->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(d->stream);
  if (e != cudaSuccess) return lpk_cuda_fail(d->name, what, e);
  return LP_OK;
}

lp_status cu_to_host(const lp_tensor_backend *be, void *dst, const void *src,
                     size_t bytes) {
  return copy_sync(be, dst, src, bytes, cudaMemcpyDeviceToHost, "copy to host");
}

lp_status cu_from_host(const lp_tensor_backend *be, void *dst, const void *src,
                       size_t bytes) {
  return copy_sync(be, dst, src, bytes, cudaMemcpyHostToDevice, "copy from host");
}

lp_status cu_gemm(const lp_tensor_backend *be, int trans_a, int trans_b,
                  int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                  int64_t stride_b, float beta, float *c, int64_t ldc,
                  int64_t stride_c, int64_t batch) {
  Device *d = dev_of(be);
  if (m < 0 || n < 0 || k < 0 || batch < 0) return LP_ERR_ARG;
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX ||
      ldb > INT32_MAX || ldc > INT32_MAX || batch > INT32_MAX)
    return LP_ERR_ARG;
  if (m == 0 || n == 0 || batch == 0) return LP_OK;
  ENTER("gemm");
  if (k == 0) { // C = beta * C (cuBLAS need not handle k == 0)
    for (int64_t i = 0; i < batch; i++)
      for (int64_t r = 0; r < m; r++) {
        float *row = c + i * stride_c + r * ldc;
        if (beta == 0.0f)
          k_fill<<<blocks_for(n), kThreads, 0, d->stream>>>(n, 0.0f, row);
        else
          k_scale<<<blocks_for(n), kThreads, 0, d->stream>>>(n, beta, row);
      }
    return launched(d, "gemm (k = 0)");
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap
  // the operands and the m/n roles.
  cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t s;
  if (batch == 1)
    s = cublasSgemm(d->blas, ob, oa, (int)n, (int)m, (int)k, &alpha, b, (int)ldb,
                    a, (int)lda, &beta, c, (int)ldc);
  else
    s = cublasSgemmStridedBatched(d->blas, ob, oa, (int)n, (int)m, (int)k,
                                  &alpha, b, (int)ldb, stride_b, a, (int)lda,
                                  stride_a, &beta, c, (int)ldc, stride_c,
                                  (int)batch);
  if (s != CUBLAS_STATUS_SUCCESS) {
    lpk_errorf("%s: cublasSgemm%s (m %lld, n %lld, k %lld, batch %lld): %s",
               d->name, batch == 1 ? "" : "StridedBatched", (long long)m,
               (long long)n, (long long)k, (long long)batch, blas_text(s));
    return s == CUBLAS_STATUS_ALLOC_FAILED ? LP_ERR_NOMEM : LP_ERR_INTERNAL;
  }
  return launched(d, "gemm");
}

// Rounds `batch` stored rows x cols matrices (row stride ld, batch stride
// stride) to dense bf16 copies (nearest even, as the CPU's gemm_bf16).
__global__ void k_to_bf16(int64_t batch, int64_t rows, int64_t cols,
                          const float *src, int64_t ld, int64_t stride,
                          __nv_bfloat16 *dst) {
  GRID_STRIDE(i, batch * rows * cols) {
    int64_t b = i / (rows * cols), r = (i / cols) % rows, c = i % cols;
    dst[i] = __float2bfloat16_rn(src[b * stride + r * ld + c]);
  }
}

// bf16 GEMM: both operands rounded to dense bf16 copies in scratch memory
// (freed to the stream-ordered cache after the call), then cuBLAS with
// float32 accumulation and a float32 C (CUBLAS_COMPUTE_32F).
lp_status cu_gemm_bf16(const lp_tensor_backend *be, int trans_a, int trans_b,
                       int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, int64_t stride_a,
                       const float *b, int64_t ldb, int64_t stride_b,
                       float beta, float *c, int64_t ldc, int64_t stride_c,
                       int64_t batch) {
  Device *d = dev_of(be);
  if (m < 0 || n < 0 || k < 0 || batch < 0) return LP_ERR_ARG;
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX ||
      ldb > INT32_MAX || ldc > INT32_MAX || batch > INT32_MAX)
    return LP_ERR_ARG;
  if (m == 0 || n == 0 || batch == 0 || k == 0) // nothing to round
    return cu_gemm(be, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b,
                   ldb, stride_b, beta, c, ldc, stride_c, batch);
  ENTER("gemm_bf16");
  int64_t ar = trans_a ? k : m, ac = trans_a ? m : k;
  int64_t br = trans_b ? n : k, bc = trans_b ? k : n;
  int64_t na = batch * ar * ac, nb = batch * br * bc;
  __nv_bfloat16 *ha = (__nv_bfloat16 *)cu_alloc(be, (size_t)(na + nb) * 2);
  if (!ha) return LP_ERR_NOMEM;
  __nv_bfloat16 *hb = ha + na;
  k_to_bf16<<<blocks_for(na), kThreads, 0, d->stream>>>(batch, ar, ac, a, lda,
                                                        stride_a, ha);
  k_to_bf16<<<blocks_for(nb), kThreads, 0, d->stream>>>(batch, br, bc, b, ldb,
                                                        stride_b, hb);
  // row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T
  cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t s = cublasGemmStridedBatchedEx(
      d->blas, ob, oa, (int)n, (int)m, (int)k, &alpha, hb, CUDA_R_16BF,
      (int)bc, br * bc, ha, CUDA_R_16BF, (int)ac, ar * ac, &beta, c,
      CUDA_R_32F, (int)ldc, batch == 1 ? m * ldc : stride_c, (int)batch,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  cu_free(be, ha);
  if (s != CUBLAS_STATUS_SUCCESS) {
    lpk_errorf("%s: cublasGemmStridedBatchedEx bf16 (m %lld, n %lld, k %lld, "
               "batch %lld): %s",
               d->name, (long long)m, (long long)n, (long long)k,
               (long long)batch, blas_text(s));
    return s == CUBLAS_STATUS_ALLOC_FAILED ? LP_ERR_NOMEM : LP_ERR_INTERNAL;
  }
  return launched(d, "gemm_bf16");
}

#define EW(op, launch)                                                         \
  do {                                                                         \
    Device *d = dev_of(be);                                                    \
    if (n <= 0) return LP_OK;                                                  \
    ENTER(op);                                                                 \
    launch;                                                                    \
    return launched(d, op);                                                    \
  } while (0)
#define GRID(n) blocks_for(n), kThreads, 0, d->stream

lp_status cu_fill(const lp_tensor_backend *be, int64_t n, float v, float *x) {
  EW("fill", (k_fill<<<GRID(n)>>>(n, v, x)));
}

lp_status cu_copy(const lp_tensor_backend *be, int64_t n, const float *x,
                  float *out) {
  Device *d = dev_of(be);
  if (n <= 0 || x == out) return LP_OK;
  ENTER("copy");
  cudaError_t e = cudaMemcpyAsync(out, x, (size_t)n * sizeof(float),
                                  cudaMemcpyDeviceToDevice, d->stream);
  if (e != cudaSuccess) return lpk_cuda_fail(d->name, "copy", e);
  return launched(d, "copy");
}

lp_status cu_axpy(const lp_tensor_backend *be, int64_t n, float alpha,
                  const float *x, float *y) {
  EW("axpy", (k_axpy<<<GRID(n)>>>(n, alpha, x, y)));
}

lp_status cu_scale(const lp_tensor_backend *be, int64_t n, float alpha,
                   float *x) {
  EW("scale", (k_scale<<<GRID(n)>>>(n, alpha, x)));
}

lp_status cu_add(const lp_tensor_backend *be, int64_t n, const float *a,
                 const float *b, float *out) {
  EW("add", (k_add<<<GRID(n)>>>(n, a, b, out)));
}

lp_status cu_mul(const lp_tensor_backend *be, int64_t n, const float *a,
                 const float *b, float *out) {
  EW("mul", (k_mul<<<GRID(n)>>>(n, a, b, out)));
}

lp_status cu_act(const lp_tensor_backend *be, lp_tensor_act_kind kind,
                 int64_t n, const float *x, float *y) {
  if (kind != LP_TENSOR_ACT_GELU && kind != LP_TENSOR_ACT_SILU) return LP_ERR_ARG;
  EW("activation", (k_act<<<GRID(n)>>>((int)kind, n, x, y)));
}

lp_status cu_act_backward(const lp_tensor_backend *be, lp_tensor_act_kind kind,
                          int64_t n, const float *x, const float *dy,
                          float *dx) {
  if (kind != LP_TENSOR_ACT_GELU && kind != LP_TENSOR_ACT_SILU) return LP_ERR_ARG;
  EW("activation backward", (k_act_backward<<<GRID(n)>>>((int)kind, n, x, dy, dx)));
}

// Per-row launches: rows blocks (rows <= 2^31 - 1 in grid.x).
#define ROWS(op, rows, launch)                                                 \
  do {                                                                         \
    Device *d = dev_of(be);                                                    \
    if ((rows) <= 0) return LP_OK;                                             \
    if ((rows) > INT32_MAX) return LP_ERR_ARG;                                 \
    ENTER(op);                                                                 \
    launch;                                                                    \
    return launched(d, op);                                                    \
  } while (0)
#define ROWGRID(rows) (unsigned)(rows), kThreads, 0, d->stream

lp_status cu_softmax_rows(const lp_tensor_backend *be, int64_t rows,
                          int64_t cols, const float *x, float *y) {
  if (cols <= 0) return LP_OK;
  ROWS("softmax", rows, (k_softmax_rows<<<ROWGRID(rows)>>>(cols, x, y)));
}

dim3 colgrid(int64_t cols, int64_t ys) {
  return dim3((unsigned)((cols + kColW - 1) / kColW), (unsigned)ys);
}

lp_status cu_sum_rows(const lp_tensor_backend *be, int64_t rows, int64_t cols,
                      const float *x, float beta, float *out) {
  Device *d = dev_of(be);
  if (cols <= 0) return LP_OK;
  ENTER("sum_rows");
  k_sum_rows<<<colgrid(cols, 1), dim3(kColW, kRowLanes), 0, d->stream>>>(
      rows, cols, x, beta, out);
  return launched(d, "sum_rows");
}

lp_status cu_add_rowvec(const lp_tensor_backend *be, int64_t rows,
                        int64_t cols, const float *v, float *t) {
  int64_t n = rows * cols;
  EW("add_rowvec", (k_add_rowvec<<<GRID(n)>>>(n, cols, v, t)));
}

lp_status cu_rmsnorm(const lp_tensor_backend *be, int64_t rows, int64_t dd,
                     float eps, const float *x, const float *w, float *y,
                     float *rstd) {
  ROWS("rmsnorm", rows, (k_rmsnorm<<<ROWGRID(rows)>>>(dd, eps, x, w, y, rstd)));
}

lp_status cu_rmsnorm_backward(const lp_tensor_backend *be, int64_t rows,
                              int64_t dd, const float *x, const float *w,
                              const float *rstd, const float *dy, float *dx,
                              float *gw) {
  Device *d = dev_of(be);
  if (rows <= 0) return LP_OK;
  if (rows > INT32_MAX) return LP_ERR_ARG;
  ENTER("rmsnorm backward");
  if (dx) k_rmsnorm_dx<<<ROWGRID(rows)>>>(dd, x, w, rstd, dy, dx);
  if (gw)
    k_rmsnorm_gw<<<colgrid(dd, 1), dim3(kColW, kRowLanes), 0, d->stream>>>(
        rows, dd, x, rstd, dy, gw);
  return launched(d, "rmsnorm backward");
}

lp_status cu_embedding(const lp_tensor_backend *be, int64_t n, int64_t dim,
                       const float *ids, const float *w, float *y) {
  int64_t total = n * dim;
  Device *d = dev_of(be);
  if (total <= 0) return LP_OK;
  ENTER("embedding");
  k_embedding<<<GRID(total)>>>(n, dim, ids, w, y);
  return launched(d, "embedding");
}

lp_status cu_embedding_backward(const lp_tensor_backend *be, int64_t n,
                                int64_t dim, int64_t vocab, const float *ids,
                                const float *dy, float *gw) {
  Device *d = dev_of(be);
  if (n <= 0 || dim <= 0 || vocab <= 0) return LP_OK;
  ENTER("embedding backward");
  for (int64_t v0 = 0; v0 < vocab; v0 += 65535) { // grid.y limit
    int64_t nv = vocab - v0 < 65535 ? vocab - v0 : 65535;
    k_embedding_backward<<<colgrid(dim, nv), dim3(kColW, kRowLanes), 0,
                           d->stream>>>(v0, n, dim, ids, dy, gw);
  }
  return launched(d, "embedding backward");
}

lp_status cu_causal_mask(const lp_tensor_backend *be, int64_t rows, int64_t t,
                         float *s) {
  int64_t n = rows * t;
  EW("causal mask", (k_causal_mask<<<GRID(n)>>>(n, t, s)));
}

lp_status cu_softmax_backward_rows(const lp_tensor_backend *be, int64_t rows,
                                   int64_t cols, const float *p, float *ds) {
  if (cols <= 0) return LP_OK;
  ROWS("softmax backward", rows,
       (k_softmax_backward<<<ROWGRID(rows)>>>(cols, p, ds)));
}

lp_status cu_cross_entropy(const lp_tensor_backend *be, int64_t rows,
                           int64_t cols, const float *logits,
                           const float *targets, double gs, double *loss,
                           float *dl) {
  if (cols <= 0) return LP_ERR_ARG;
  ROWS("cross-entropy", rows,
       (k_cross_entropy<<<ROWGRID(rows)>>>(cols, logits, targets, gs, loss, dl)));
}

lp_status cu_sq_error(const lp_tensor_backend *be, int64_t n, const float *p,
                      const float *t, double gs, double *sq, float *dp) {
  EW("squared error", (k_sq_error<<<GRID(n)>>>(n, p, t, gs, sq, dp)));
}

lp_status cu_sgd_step(const lp_tensor_backend *be, int64_t n, double lr,
                      double mu, double wd, float *p, const float *g,
                      float *m) {
  EW("sgd step", (k_sgd<<<GRID(n)>>>(n, lr, mu, wd, p, g, m)));
}

lp_status cu_adamw_step(const lp_tensor_backend *be, int64_t n, double lr,
                        double b1, double b2, double eps, double decay,
                        double bc1, double bc2, float *p, const float *g,
                        float *m, float *v) {
  EW("adamw step",
     (k_adamw<<<GRID(n)>>>(n, lr, b1, b2, eps, decay, bc1, bc2, p, g, m, v)));
}

// One thread per (row, head, pair): the CPU loop's arithmetic, in float.
__global__ void k_rope(int64_t n, int64_t seq, int64_t heads, int64_t half,
                       int64_t ld, int64_t hs, const float *cs, int conj,
                       float *x) {
  GRID_STRIDE(e, n) {
    int64_t i = e % half, h = (e / half) % heads, r = e / (half * heads);
    const float *cr = cs + (r % seq) * 2 * half + 2 * i;
    float c = cr[0], s = conj ? -cr[1] : cr[1];
    float *z = x + r * ld + h * hs + 2 * i;
    float x0 = z[0], x1 = z[1];
    z[0] = x0 * c - x1 * s;
    z[1] = x0 * s + x1 * c;
  }
}

lp_status cu_rope(const lp_tensor_backend *be, int64_t rows, int64_t seq,
                  int64_t heads, int64_t dd, int64_t ld, int64_t hs,
                  const float *cs, int conj, float *x) {
  if (rows < 0 || seq < 1 || heads < 0 || dd < 0 || dd % 2) return LP_ERR_ARG;
  int64_t n = rows * heads * (dd / 2);
  EW("rope", (k_rope<<<GRID(n)>>>(n, seq, heads, dd / 2, ld, hs, cs, conj, x)));
}

// Creates device `index`'s state (devices_mu held).
Device *device_new(int index) {
  Device *d = new (std::nothrow) Device();
  if (!d) {
    lpk_errorf("cuda:%d: out of host memory", index);
    return NULL;
  }
  d->index = index;
  snprintf(d->name, sizeof d->name, "cuda:%d", index);
  pthread_mutex_init(&d->mu, NULL);
  cudaError_t e = cudaSetDevice(index);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    lpk_cuda_fail(d->name, "starting the device", e);
    delete d;
    return NULL;
  }
  cublasStatus_t s = cublasCreate(&d->blas);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(d->blas, d->stream);
  if (s == CUBLAS_STATUS_SUCCESS) {
    const char *tf32 = getenv("LUAPIPE_TF32");
    s = cublasSetMathMode(d->blas, tf32 && !strcmp(tf32, "1")
                                       ? CUBLAS_TF32_TENSOR_OP_MATH
                                       : CUBLAS_DEFAULT_MATH);
  }
  if (s != CUBLAS_STATUS_SUCCESS) {
    lpk_errorf("%s: cublasCreate: %s", d->name, blas_text(s));
    cudaStreamDestroy(d->stream);
    delete d;
    return NULL;
  }
  const char *sync = getenv("LUAPIPE_CUDA_SYNC");
  d->sync_each = sync && !strcmp(sync, "1");
  lp_tensor_backend *be = &d->be;
  be->name = d->name;
  be->host_accessible = 0;
  be->ud = d;
  be->alloc = cu_alloc;
  be->free = cu_free;
  be->to_host = cu_to_host;
  be->from_host = cu_from_host;
  be->gemm = cu_gemm;
  be->gemm_bf16 = cu_gemm_bf16;
  be->fill = cu_fill;
  be->copy = cu_copy;
  be->axpy = cu_axpy;
  be->scale = cu_scale;
  be->add = cu_add;
  be->mul = cu_mul;
  be->act = cu_act;
  be->act_backward = cu_act_backward;
  be->softmax_rows = cu_softmax_rows;
  be->sum_rows = cu_sum_rows;
  be->gather_rows = lpk_cuda_gather_rows;
  be->scatter_add_rows = lpk_cuda_scatter_add_rows;
  be->add_rowvec = cu_add_rowvec;
  be->rmsnorm = cu_rmsnorm;
  be->rmsnorm_backward = cu_rmsnorm_backward;
  be->embedding = cu_embedding;
  be->embedding_backward = cu_embedding_backward;
  be->causal_mask = cu_causal_mask;
  be->softmax_backward_rows = cu_softmax_backward_rows;
  be->cross_entropy = cu_cross_entropy;
  be->sq_error = cu_sq_error;
  be->sgd_step = cu_sgd_step;
  be->adamw_step = cu_adamw_step;
  be->dot_rows = lpk_cuda_dot_rows;
  be->rope = cu_rope;
  return d;
}

bool is_cuda(const lp_tensor_backend *be) {
  return be && be->alloc == cu_alloc;
}

// ---- MoE row gather / scatter-add ----

__global__ void k_gather_rows(int64_t n, int64_t cols, const float *x,
                              const int64_t *idx, const float *scale,
                              float *out) {
  GRID_STRIDE(e, n * cols) {
    int64_t i = e / cols, c = e % cols;
    float v = x[idx[i] * cols + c];
    out[e] = scale ? scale[i] * v : v;
  }
}

// One block per target row: its sources (perm[start[g]..start[g+1]), in
// order of i) added one after the other.
__global__ void k_scatter_rows(int64_t cols, const float *x, const int64_t *perm,
                               const int64_t *start, const int64_t *target,
                               const float *scale, float *out) {
  int64_t g = blockIdx.x;
  float *dst = out + target[g] * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    float acc = dst[c];
    for (int64_t k = start[g]; k < start[g + 1]; k++) {
      int64_t i = perm[k];
      acc += (scale ? scale[i] : 1.0f) * x[i * cols + c];
    }
    dst[c] = acc;
  }
}

// One thread per row, the columns in order in double: the CPU's sums.
__global__ void k_dot_rows(int64_t n, int64_t cols, const float *a,
                           const int64_t *idx, const float *b, float *out) {
  GRID_STRIDE(i, n) {
    const float *ar = a + (idx ? idx[i] : i) * cols, *br = b + i * cols;
    double d = 0.0;
    for (int64_t c = 0; c < cols; c++) d += (double)ar[c] * br[c];
    out[i] = (float)d;
  }
}

// Uploads `bytes` of host data into a block of be's memory (NULL for none).
lp_status upload(const lp_tensor_backend *be, const void *host, size_t bytes,
                 void **dev) {
  *dev = NULL;
  if (!host) return LP_OK;
  if (!(*dev = cu_alloc(be, bytes ? bytes : 1))) return LP_ERR_NOMEM;
  return cu_from_host(be, *dev, host, bytes);
}

} // namespace

extern "C" lp_status lpk_cuda_gather_rows(const lp_tensor_backend *be,
                                                 int64_t n, int64_t cols,
                                                 const float *x,
                                                 const int64_t *idx,
                                                 const float *scale,
                                                 float *out) {
  if (!is_cuda(be) || n < 0 || cols < 0) return LP_ERR_ARG;
  if (n == 0 || cols == 0) return LP_OK;
  Device *d = dev_of(be);
  void *di = NULL, *ds = NULL;
  lp_status st = upload(be, idx, (size_t)n * sizeof *idx, &di);
  if (st == LP_OK) st = upload(be, scale, (size_t)n * sizeof *scale, &ds);
  if (st == LP_OK) st = enter(d, "gather rows");
  if (st == LP_OK) {
    k_gather_rows<<<blocks_for(n * cols), kThreads, 0, d->stream>>>(
        n, cols, x, (const int64_t *)di, (const float *)ds, out);
    st = launched(d, "gather rows");
  }
  cu_free(be, di); // stream-ordered: reused only by later work
  cu_free(be, ds);
  return st;
}

extern "C" lp_status lpk_cuda_dot_rows(const lp_tensor_backend *be,
                                              int64_t n, int64_t cols,
                                              const float *a,
                                              const int64_t *idx,
                                              const float *b, float *out) {
  if (!is_cuda(be) || n < 0 || cols < 0) return LP_ERR_ARG;
  if (n == 0) return LP_OK;
  Device *d = dev_of(be);
  void *di = NULL;
  lp_status st = upload(be, idx, (size_t)n * sizeof *idx, &di);
  if (st == LP_OK) st = enter(d, "dot rows");
  if (st == LP_OK) {
    k_dot_rows<<<blocks_for(n), kThreads, 0, d->stream>>>(
        n, cols, a, (const int64_t *)di, b, out);
    st = launched(d, "dot rows");
  }
  cu_free(be, di); // stream-ordered: reused only by later work
  return st;
}

extern "C" lp_status lpk_cuda_scatter_add_rows(
    const lp_tensor_backend *be, int64_t n, int64_t cols, const float *x,
    const int64_t *idx, const float *scale, float *out) {
  if (!is_cuda(be) || n < 0 || cols < 0) return LP_ERR_ARG;
  if (n == 0 || cols == 0) return LP_OK;
  Device *d = dev_of(be);
  // group the sources by target row, keeping the order of i inside a group
  std::vector<int64_t> perm((size_t)n), start, target;
  for (int64_t i = 0; i < n; i++) perm[(size_t)i] = i;
  std::stable_sort(perm.begin(), perm.end(),
                   [idx](int64_t a, int64_t b) { return idx[a] < idx[b]; });
  for (int64_t k = 0; k < n; k++)
    if (k == 0 || idx[perm[(size_t)k]] != idx[perm[(size_t)k - 1]]) {
      start.push_back(k);
      target.push_back(idx[perm[(size_t)k]]);
    }
  start.push_back(n);
  int64_t groups = (int64_t)target.size();
  if (groups > INT32_MAX) return LP_ERR_ARG;
  void *dp = NULL, *dst = NULL, *dt = NULL, *ds = NULL;
  lp_status st = upload(be, perm.data(), perm.size() * sizeof(int64_t), &dp);
  if (st == LP_OK) st = upload(be, start.data(), start.size() * sizeof(int64_t), &dst);
  if (st == LP_OK) st = upload(be, target.data(), target.size() * sizeof(int64_t), &dt);
  if (st == LP_OK) st = upload(be, scale, (size_t)n * sizeof *scale, &ds);
  if (st == LP_OK) st = enter(d, "scatter-add rows");
  if (st == LP_OK) {
    k_scatter_rows<<<(unsigned)groups, kThreads, 0, d->stream>>>(
        cols, x, (const int64_t *)dp, (const int64_t *)dst, (const int64_t *)dt,
        (const float *)ds, out);
    st = launched(d, "scatter-add rows");
  }
  cu_free(be, dp), cu_free(be, dst), cu_free(be, dt), cu_free(be, ds);
  return st;
}

extern "C" const lp_tensor_backend *lpk_backend(int device) {
  int n = lpk_device_count();
  if (n <= 0) {
    lpk_errorf("cuda:%d: no CUDA device is visible", device);
    return NULL;
  }
  if (device < 0 || device >= n || device >= kMaxDevices) {
    lpk_errorf("cuda:%d: no such device (%d visible: cuda:0..cuda:%d)", device,
               n, n - 1);
    return NULL;
  }
  pthread_mutex_lock(&devices_mu);
  if (!devices[device]) devices[device] = device_new(device);
  Device *d = devices[device];
  pthread_mutex_unlock(&devices_mu);
  return d ? &d->be : NULL;
}

extern "C" int lpk_cuda_device(const lp_tensor_backend *be) {
  return is_cuda(be) ? dev_of(be)->index : -1;
}

extern "C" lp_status lpk_cuda_sync(const lp_tensor_backend *be) {
  if (!is_cuda(be)) return LP_ERR_ARG;
  Device *d = dev_of(be);
  ENTER("synchronize");
  cudaError_t e = cudaStreamSynchronize(d->stream);
  if (e != cudaSuccess) return lpk_cuda_fail(d->name, "synchronize", e);
  return LP_OK;
}

extern "C" void lpk_cuda_memory(const lp_tensor_backend *be,
                                       size_t *in_use, size_t *cached) {
  size_t u = 0, c = 0;
  if (is_cuda(be)) {
    Device *d = dev_of(be);
    pthread_mutex_lock(&d->mu);
    u = d->in_use, c = d->cached;
    pthread_mutex_unlock(&d->mu);
  }
  if (in_use) *in_use = u;
  if (cached) *cached = c;
}

extern "C" void lpk_cuda_empty_cache(const lp_tensor_backend *be) {
  if (!is_cuda(be)) return;
  Device *d = dev_of(be);
  std::vector<void *> blocks;
  pthread_mutex_lock(&d->mu);
  for (auto &kv : d->cache) blocks.push_back(kv.second);
  d->cache.clear();
  d->cached = 0;
  pthread_mutex_unlock(&d->mu);
  if (blocks.empty() || enter(d, "empty cache") != LP_OK) return;
  // queued users of these blocks finish first (cudaFree waits for the device)
  for (void *p : blocks) cudaFree(p);
}

extern "C" void *lpk_cuda_stream(const lp_tensor_backend *be) {
  return is_cuda(be) ? (void *)dev_of(be)->stream : NULL;
}

// Pinned memory when a device is visible; plain memory otherwise (so the
// staged comm path also runs, unpinned, on machines without a GPU).
static int pinned_mode(void) {
  static int mode = -1;
  if (mode < 0) mode = lpk_device_count() > 0;
  return mode;
}

extern "C" void *lpk_host_alloc(size_t bytes) {
  if (!pinned_mode()) return lp_malloc(bytes ? bytes : 1);
  void *p = NULL;
  cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    lpk_cuda_fail("host", "cudaMallocHost", e);
    return NULL;
  }
  return p;
}

extern "C" void lpk_host_free(void *p) {
  if (!p) return;
  if (!pinned_mode()) lp_free(p);
  else cudaFreeHost(p);
}

// ---- the module's entry ------------------------------------------------------

static const lp_kernels_module module_table = {
    LP_KERNELS_MODULE_ABI,
    sizeof(lp_kernels_module),
    sizeof(lp_tensor_backend),
    lpk_device_count,
    lpk_last_error,
    lpk_backend,
    lpk_cuda_device,
    lpk_cuda_sync,
    lpk_cuda_memory,
    lpk_cuda_empty_cache,
    lpk_cuda_stream,
    lpk_cuda_gather_rows,
    lpk_cuda_scatter_add_rows,
    lpk_cuda_dot_rows,
    lpk_host_alloc,
    lpk_host_free,
    lpk_bench_sgemm,
};

// The one exported symbol of luapipe_cuda.so (LP_KERNELS_MODULE_ENTRY).
extern "C" __attribute__((visibility("default"))) const lp_kernels_module *
lp_kernels_module_v1(void) {
  return &module_table;
}
