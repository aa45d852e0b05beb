/* lp_kernels.h — plain-C interface to luapipe's CUDA code: the CUDA tensor
 * backend (device memory through a caching allocator, cuBLAS GEMM, the
 * element-wise and per-row kernels of lp_tensor_backend) and the stream and
 * pinned-memory helpers the comm backends use. Built from the .cu files of
 * kernels/ when nvcc exists; otherwise kernels_stub.c answers "built without
 * CUDA". Callers never see CUDA types or headers: streams and events are
 * opaque pointers. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define LP_KERNELS_OK 0
#define LP_KERNELS_UNSUPPORTED (-1) /* built without CUDA */
#define LP_KERNELS_NO_DEVICE (-2)   /* CUDA built in, no device visible */
#define LP_KERNELS_FAILED (-3)      /* a CUDA call failed; see lp_kernels_last_error */

#ifdef __cplusplus
extern "C" {
#endif

#include "lp_tensor.h" /* C declarations (lp_base, the backend vtable) */

/* Number of visible CUDA devices; 0 without a device, when the driver
 * fails, or without CUDA (lp_kernels_last_error then says why:
 * "cudaGetDeviceCount: <CUDA's text>"). */
int lp_kernels_device_count(void);
/* 1 when the kernels were compiled with CUDA. */
int lp_kernels_built_with_cuda(void);
/* Text of the last failure of this thread ("cuda:0: cublasSgemm: ..."). */
const char *lp_kernels_last_error(void);

/* The CUDA tensor backend of device `device` (its name is "cuda:<device>"),
 * created on first use and kept for the life of the process: one compute
 * stream, one cuBLAS handle, one caching allocator (cudaMalloc only; freed
 * blocks are kept for reuse on the same stream and given back to the
 * driver when an allocation fails). Every op is asynchronous on the
 * compute stream; to_host waits for it. NULL when CUDA is not built in, no
 * device is visible or the device does not exist (lp_kernels_last_error
 * says which). FP32 GEMMs use full float32 (no TF32) unless LUAPIPE_TF32=1.
 * LUAPIPE_CUDA_SYNC=1 waits after every op (for debugging: an error then
 * names the op that caused it). */
const lp_tensor_backend *lp_tensor_backend_cuda(int device);
/* The device index of a CUDA backend; -1 for any other backend. */
int lp_kernels_cuda_device(const lp_tensor_backend *be);
/* Waits for every op queued on be's compute stream. LP_OK, or the
 * asynchronous error a kernel raised (text in lp_kernels_last_error). */
lp_status lp_kernels_cuda_sync(const lp_tensor_backend *be);
/* Bytes the allocator holds: in use by tensors, and cached for reuse. */
void lp_kernels_cuda_memory(const lp_tensor_backend *be, size_t *in_use,
                            size_t *cached);
/* Gives every cached block back to the driver. */
void lp_kernels_cuda_empty_cache(const lp_tensor_backend *be);
/* The compute stream (a cudaStream_t) of a CUDA backend, for comm
 * backends that order their work after it; NULL for other backends. */
void *lp_kernels_cuda_stream(const lp_tensor_backend *be);

/* MoE row gather / scatter-add on a CUDA backend: the table entries
 * gather_rows / scatter_add_rows of lp_tensor_backend_cuda. idx and scale
 * are HOST arrays of n entries (scale NULL: 1); x and out are be's memory.
 *   gather:      out[i] = scale[i] * x[idx[i]]
 *   scatter-add: out[idx[i]] += scale[i] * x[i], rows with the same idx
 *                added in order of i (no atomics: reproducible). */
lp_status lp_kernels_cuda_gather_rows(const lp_tensor_backend *be, int64_t n,
                                      int64_t cols, const float *x,
                                      const int64_t *idx, const float *scale,
                                      float *out);
lp_status lp_kernels_cuda_scatter_add_rows(const lp_tensor_backend *be,
                                           int64_t n, int64_t cols,
                                           const float *x, const int64_t *idx,
                                           const float *scale, float *out);
/* The table entry dot_rows (the MoE combine weights' gradient): out[i] =
 * a[idx[i]] . b[i], one thread per row summing in double in column order
 * (the CPU's sums); idx a HOST array (NULL: row i). */
lp_status lp_kernels_cuda_dot_rows(const lp_tensor_backend *be, int64_t n,
                                   int64_t cols, const float *a,
                                   const int64_t *idx, const float *b,
                                   float *out);

/* Page-locked host memory (for staging device buffers through MPI); NULL
 * on failure. lp_kernels_host_free(NULL) is a no-op. */
void *lp_kernels_host_alloc(size_t bytes);
void lp_kernels_host_free(void *p);

/* Raw cuBLAS reference for benchmarks: times `iters` row-major SGEMMs
 * C = op(A) op(B) + beta C (m x n x k, the same mapping as the backend's
 * gemm) on device `device` with its own handle, stream and random operands;
 * *ms = the median over 5 batches of the mean time per GEMM (CUDA events,
 * after a warm-up). LP_KERNELS_OK or a failure code. */
int lp_kernels_bench_sgemm(int device, int trans_a, int trans_b, int64_t m,
                           int64_t n, int64_t k, float beta, int iters,
                           double *ms);

/* y[i] = alpha * x[i] + y[i] for i < n, on the device; x and y are host
 * arrays (copied in and out). A self-contained smoke test of the toolchain. */
int lp_kernels_saxpy(size_t n, float alpha, const float *x, float *y);

/* GELU forward (tanh approximation) of n floats, host arrays in and out. */
int lp_kernels_gelu(size_t n, const float *x, float *y);

#ifdef __cplusplus
}
#endif
