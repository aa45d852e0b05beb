/* lp_kernels.h — plain-C interface to luapipe's CUDA kernels. Built from
 * the .cu files of kernels/ when nvcc exists; otherwise kernels_stub.c answers
 * LP_KERNELS_UNSUPPORTED. Callers never see CUDA types or headers. */
#pragma once

#include <stddef.h>

#define LP_KERNELS_OK 0
#define LP_KERNELS_UNSUPPORTED (-1) /* built without CUDA */
#define LP_KERNELS_NO_DEVICE (-2)   /* CUDA built in, no device visible */
#define LP_KERNELS_FAILED (-3)      /* a CUDA call failed; see lp_kernels_last_error */

#ifdef __cplusplus
extern "C" {
#endif

/* Number of visible CUDA devices; 0 without a device or without CUDA. */
int lp_kernels_device_count(void);
/* 1 when the kernels were compiled with CUDA. */
int lp_kernels_built_with_cuda(void);
/* Text of the last failure (static storage). */
const char *lp_kernels_last_error(void);

/* y[i] = alpha * x[i] + y[i] for i < n, on the device; x and y are host
 * arrays (copied in and out). */
int lp_kernels_saxpy(size_t n, float alpha, const float *x, float *y);

/* GELU forward (tanh approximation) of n floats, host arrays in and out. */
int lp_kernels_gelu(size_t n, const float *x, float *y);

#ifdef __cplusplus
}
#endif
