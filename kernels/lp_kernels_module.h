/* lp_kernels_module.h — the contract between the program and the CUDA
 * module (luapipe_cuda.so, built from the .cu files of kernels/). The program never
 * links CUDA: kernels.c (plain C, in the program) implements lp_kernels.h
 * by opening the module on first use (lp_module_open) and calling through
 * the table the module's one exported function returns. Private to
 * kernels/: callers use lp_kernels.h. */
#pragma once

#include "lp_kernels.h"

/* Bumped whenever the table changes: a module from another build is
 * refused with a message instead of being called through a wrong table. */
#define LP_KERNELS_MODULE_ABI 1
/* The module's one exported symbol: const lp_kernels_module *(void). */
#define LP_KERNELS_MODULE_ENTRY "lp_kernels_module_v1"
#define LP_KERNELS_MODULE_FILE "luapipe_cuda.so"

/* Every entry has the meaning of the lp_kernels.h function of the same
 * name (lp_kernels_<name>, backend = lp_tensor_backend_cuda). */
typedef struct lp_kernels_module {
  int abi;             /* LP_KERNELS_MODULE_ABI */
  size_t size;         /* sizeof(lp_kernels_module) */
  size_t backend_size; /* sizeof(lp_tensor_backend) where it was built */
  int (*device_count)(void);
  const char *(*last_error)(void);
  const lp_tensor_backend *(*backend)(int device);
  int (*cuda_device)(const lp_tensor_backend *be);
  lp_status (*cuda_sync)(const lp_tensor_backend *be);
  void (*cuda_memory)(const lp_tensor_backend *be, size_t *in_use, size_t *cached);
  void (*cuda_empty_cache)(const lp_tensor_backend *be);
  void *(*cuda_stream)(const lp_tensor_backend *be);
  lp_status (*cuda_gather_rows)(const lp_tensor_backend *be, int64_t n, int64_t cols,
                                const float *x, const int64_t *idx, const float *scale,
                                float *out);
  lp_status (*cuda_scatter_add_rows)(const lp_tensor_backend *be, int64_t n,
                                     int64_t cols, const float *x, const int64_t *idx,
                                     const float *scale, float *out);
  lp_status (*cuda_dot_rows)(const lp_tensor_backend *be, int64_t n, int64_t cols,
                             const float *a, const int64_t *idx, const float *b,
                             float *out);
  /* page-locked host memory (NULL on failure; free(NULL) is a no-op) */
  void *(*host_alloc)(size_t bytes);
  void (*host_free)(void *p);
  int (*bench_sgemm)(int device, int trans_a, int trans_b, int64_t m, int64_t n,
                     int64_t k, float beta, int iters, double *ms);
} lp_kernels_module;
