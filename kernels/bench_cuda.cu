// bench_cuda.cu — the raw cuBLAS reference the GEMM benchmark compares
// luapipe's Linear against (lpk_bench_sgemm).
#include "cuda_internal.cuh"

#include <algorithm>
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

namespace {

__global__ void k_rand(int64_t n, unsigned seed, float *x) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 16, h *= 0x7feb352du, h ^= h >> 15, h *= 0x846ca68bu, h ^= h >> 16;
    x[i] = (float)(h & 0xffffff) / 16777216.0f - 0.5f;
  }
}

} // namespace

extern "C" int lpk_bench_sgemm(int device, int trans_a, int trans_b,
                                      int64_t m, int64_t n, int64_t k,
                                      float beta, int iters, double *ms) {
  *ms = 0;
  if (lpk_device_count() <= device) return LP_KERNELS_NO_DEVICE;
  int rc = LP_KERNELS_OK;
  float *a = NULL, *b = NULL, *c = NULL, alpha = 1.0f;
  cudaStream_t st = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  cublasHandle_t h = NULL;
  double t[5];
  const char *tf32 = getenv("LUAPIPE_TF32");
  int lda = (int)(trans_a ? m : k), ldb = (int)(trans_b ? k : n), ldc = (int)n;
  cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
#define CK(call)                                                               \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      lpk_cuda_fail("bench", #call, e_);                                       \
      rc = LP_KERNELS_FAILED;                                                  \
      goto done;                                                               \
    }                                                                          \
  } while (0)
#define CB(call)                                                               \
  do {                                                                         \
    if ((call) != CUBLAS_STATUS_SUCCESS) {                                     \
      lpk_errorf("bench: %s failed", #call);                                   \
      rc = LP_KERNELS_FAILED;                                                  \
      goto done;                                                               \
    }                                                                          \
  } while (0)
  CK(cudaSetDevice(device));
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaMalloc((void **)&a, (size_t)(m * k) * sizeof(float)));
  CK(cudaMalloc((void **)&b, (size_t)(k * n) * sizeof(float)));
  CK(cudaMalloc((void **)&c, (size_t)(m * n) * sizeof(float)));
  k_rand<<<1024, 256, 0, st>>>(m * k, 1u, a);
  k_rand<<<1024, 256, 0, st>>>(k * n, 2u, b);
  k_rand<<<1024, 256, 0, st>>>(m * n, 3u, c);
  CK(cudaGetLastError());
  CB(cublasCreate(&h));
  CB(cublasSetStream(h, st));
  CB(cublasSetMathMode(h, tf32 && !strcmp(tf32, "1") ? CUBLAS_TF32_TENSOR_OP_MATH
                                                     : CUBLAS_DEFAULT_MATH));
  for (int rep = -1; rep < 5; rep++) { // rep -1: warm-up
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < iters; i++)
      CB(cublasSgemm(h, ob, oa, (int)n, (int)m, (int)k, &alpha, b, ldb, a, lda,
                     &beta, c, ldc));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float el = 0;
    CK(cudaEventElapsedTime(&el, e0, e1));
    if (rep >= 0) t[rep] = el / iters;
  }
  std::sort(t, t + 5);
  *ms = t[2];
done:
  if (h) cublasDestroy(h);
  cudaFree(a), cudaFree(b), cudaFree(c);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (st) cudaStreamDestroy(st);
  return rc;
}
