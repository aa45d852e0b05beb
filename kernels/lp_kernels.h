/* lp_kernels.h — plain-C interface to luapipe's CUDA code: the CUDA tensor
 * backend (device memory through a caching allocator, cuBLAS GEMM, the
 * element-wise and per-row kernels of lp_tensor_backend) and the stream and
 * pinned-memory helpers the comm backends use. The .cu files of kernels/
 * are built, when nvcc exists, into the module luapipe_cuda.so, which
 * kernels.c (in the program) opens on first use: the first call that needs
 * the device (lp_kernels_load, lp_kernels_device_count,
 * lp_tensor_backend_cuda, lp_kernels_bench_sgemm); the others never load
 * it (those taking a backend only act on one the module made). So a CPU run maps no CUDA library.
 * Without nvcc every call answers "built without CUDA". Callers never see CUDA types or headers:
 * streams and events are opaque pointers. */
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

/* Opens the CUDA module once (luapipe_cuda.so, found by lp_module_open:
 * next to the program or in <program dir>/../lib/luapipe), which maps
 * cuBLAS, cuBLASLt and the CUDA runtime. LP_KERNELS_OK;
 * LP_KERNELS_UNSUPPORTED without CUDA; LP_KERNELS_FAILED when the module
 * is missing or cannot be loaded (lp_kernels_last_error: "CUDA backend:
 * cannot load <path>: libcublas.so.13: cannot open shared object file: No
 * such file or directory", "CUDA backend: module luapipe_cuda.so not found
 * (looked in ...)"); a failure is final for the process. */
int lp_kernels_load(void);
/* The path of the loaded CUDA module; NULL before it is loaded or when it
 * cannot be. */
const char *lp_kernels_module_path(void);
/* Number of visible CUDA devices (loads the module); 0 without a device,
 * when the driver fails, when the module cannot be loaded, or without CUDA
 * (lp_kernels_last_error then says why: "cudaGetDeviceCount: <CUDA's
 * text>"). */
int lp_kernels_device_count(void);
/* 1 when the kernels were compiled with CUDA (the module was built; does
 * not load it). */
int lp_kernels_built_with_cuda(void);
/* Text of the last failure of this thread ("cuda:0: cublasSgemm: ..."),
 * or why the module cannot be loaded (does not load it). */
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

/* Host memory for staging device buffers through MPI; NULL on failure.
 * Page-locked when the CUDA module is loaded by the first call (a staged
 * context is made after its device backend) and a device is visible;
 * plain memory otherwise (decided by the first call, for the process).
 * Never loads the module. lp_kernels_host_free(NULL) is a no-op. */
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

#ifdef __cplusplus
}
#endif
