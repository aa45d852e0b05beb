// elementwise.cu — self-contained smoke kernels (host arrays in and out)
// behind lp_kernels.h; the tensor backend is backend_cuda.cu.
#include "cuda_internal.cuh"

#include <math.h>

static int fail(const char *what, cudaError_t e) {
  (void)lpk_cuda_fail("smoke", what, e);
  return LP_KERNELS_FAILED;
}

#define CU(call)                                                               \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      rc = fail(#call, e_);                                                    \
      goto done;                                                               \
    }                                                                          \
  } while (0)


__global__ static void saxpy_kernel(size_t n, float a, const float *x, float *y) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ static void gelu_kernel(size_t n, const float *x, float *y) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) {
    float v = x[i];
    float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    y[i] = 0.5f * v * (1.0f + tanhf(u));
  }
}

extern "C" int lp_kernels_saxpy(size_t n, float alpha, const float *x, float *y) {
  if (lp_kernels_device_count() <= 0) return LP_KERNELS_NO_DEVICE;
  int rc = LP_KERNELS_OK;
  float *dx = NULL, *dy = NULL;
  unsigned blocks = (unsigned)((n + 255) / 256);
  CU(cudaMalloc((void **)&dx, n * sizeof(float)));
  CU(cudaMalloc((void **)&dy, n * sizeof(float)));
  CU(cudaMemcpy(dx, x, n * sizeof(float), cudaMemcpyHostToDevice));
  CU(cudaMemcpy(dy, y, n * sizeof(float), cudaMemcpyHostToDevice));
  if (n) saxpy_kernel<<<blocks, 256>>>(n, alpha, dx, dy);
  CU(cudaGetLastError());
  CU(cudaMemcpy(y, dy, n * sizeof(float), cudaMemcpyDeviceToHost));
done:
  cudaFree(dx);
  cudaFree(dy);
  return rc;
}

extern "C" int lp_kernels_gelu(size_t n, const float *x, float *y) {
  if (lp_kernels_device_count() <= 0) return LP_KERNELS_NO_DEVICE;
  int rc = LP_KERNELS_OK;
  float *dx = NULL, *dy = NULL;
  unsigned blocks = (unsigned)((n + 255) / 256);
  CU(cudaMalloc((void **)&dx, n * sizeof(float)));
  CU(cudaMalloc((void **)&dy, n * sizeof(float)));
  CU(cudaMemcpy(dx, x, n * sizeof(float), cudaMemcpyHostToDevice));
  if (n) gelu_kernel<<<blocks, 256>>>(n, dx, dy);
  CU(cudaGetLastError());
  CU(cudaMemcpy(y, dy, n * sizeof(float), cudaMemcpyDeviceToHost));
done:
  cudaFree(dx);
  cudaFree(dy);
  return rc;
}
