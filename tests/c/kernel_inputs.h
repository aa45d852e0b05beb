/* kernel_inputs.h — the inputs the CPU-kernel tests share
 * (test_cpu_kernels.c, test_cpu_kernels_isa.c): floats uniform in
 * [lo, hi) from a fixed LCG, so every run and both files see the same
 * numbers. Include after cmocka.h. */
#pragma once

#include <stdint.h>
#include <stdlib.h>

/* Uniform in [lo, hi) from a fixed LCG (the same numbers on every run). */
static inline float urand(uint64_t *s, float lo, float hi) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return lo + (hi - lo) * (float)((*s >> 40) * (1.0 / 16777216.0));
}

/* n such floats from the seed (a malloc'd array, at least one element). */
static inline float *vec(int64_t n, uint64_t seed, float lo, float hi) {
  float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
  assert_non_null(x);
  for (int64_t i = 0; i < n; i++)
    x[i] = urand(&seed, lo, hi);
  return x;
}
