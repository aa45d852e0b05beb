// cuda_internal.cuh — private to kernels/ (the CUDA module luapipe_cuda.so):
// error text, the checks every CUDA call and launch goes through, and the
// module's implementations of lp_kernels.h (lpk_<name> is the
// lp_kernels_<name> that kernels.c forwards to through the table of
// lp_kernels_module.h). The module is compiled with hidden visibility: only
// its entry, lp_kernels_module_v1, is exported.
#pragma once

#include <cuda_runtime.h>

#include "lp_kernels_module.h"

// Formats the thread's last error text (lpk_last_error).
void lpk_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Records "<where>: <what>: <cuda error text>" and maps the error to a
// status (LP_ERR_NOMEM for out-of-memory, LP_ERR_INTERNAL otherwise).
lp_status lpk_cuda_fail(const char *where, const char *what, cudaError_t e);

// The module's side of lp_kernels.h (same meanings; backend_cuda.cu, bench_cuda.cu).
extern "C" {
const char *lpk_last_error(void);
int lpk_device_count(void);
const lp_tensor_backend *lpk_backend(int device);
int lpk_cuda_device(const lp_tensor_backend *be);
lp_status lpk_cuda_sync(const lp_tensor_backend *be);
void lpk_cuda_memory(const lp_tensor_backend *be, size_t *in_use, size_t *cached);
void lpk_cuda_empty_cache(const lp_tensor_backend *be);
void *lpk_cuda_stream(const lp_tensor_backend *be);
lp_status lpk_cuda_gather_rows(const lp_tensor_backend *be, int64_t n, int64_t cols,
                               const float *x, const int64_t *idx, const float *scale,
                               float *out);
lp_status lpk_cuda_scatter_add_rows(const lp_tensor_backend *be, int64_t n, int64_t cols,
                                    const float *x, const int64_t *idx,
                                    const float *scale, float *out);
lp_status lpk_cuda_dot_rows(const lp_tensor_backend *be, int64_t n, int64_t cols,
                            const float *a, const int64_t *idx, const float *b,
                            float *out);
void *lpk_host_alloc(size_t bytes);
void lpk_host_free(void *p);
int lpk_bench_sgemm(int device, int trans_a, int trans_b, int64_t m, int64_t n,
                    int64_t k, float beta, int iters, double *ms);
}
