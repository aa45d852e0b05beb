// cuda_internal.cuh — private to kernels/: error text and the checks every
// CUDA call and launch goes through.
#pragma once

#include <cuda_runtime.h>

#include "lp_kernels.h"

// Formats the thread's last error text (lp_kernels_last_error).
void lpk_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Records "<where>: <what>: <cuda error text>" and maps the error to a
// status (LP_ERR_NOMEM for out-of-memory, LP_ERR_INTERNAL otherwise).
lp_status lpk_cuda_fail(const char *where, const char *what, cudaError_t e);
