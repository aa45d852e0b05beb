/* blas_core.c — which OpenBLAS kernel set runs, and a better one when
 * OpenBLAS does not know this CPU. OpenBLAS picks its kernels from the CPU
 * model; a model newer than the library (Debian's 0.3.21 on Sapphire
 * Rapids, say) falls back to the oldest set, Prescott's SSE kernels,
 * which run a float32 GEMM at a fraction of what the CPU's AVX-512 or
 * AVX2 can. OpenBLAS reads OPENBLAS_CORETYPE only when it loads, so the
 * program (core/host) sets it and starts itself again (lp_tensor.h). */
#include "lp_tensor.h"

#include <cblas.h>
#include <strings.h>

const char *lp_tensor_blas_core(void) {
  const char *c = openblas_get_corename();
  return c ? c : "unknown";
}

const char *lp_tensor_blas_better_core(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const char *now = lp_tensor_blas_core();
  /* only the generic fallbacks: a set OpenBLAS chose for this CPU stays */
  if (strcasecmp(now, "prescott") != 0 && strcasecmp(now, "core2") != 0 &&
      strcasecmp(now, "katmai") != 0)
    return NULL;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return NULL;
}
