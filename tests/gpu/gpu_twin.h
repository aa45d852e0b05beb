/* gpu_twin.h — shared by the GPU twin tests: the skip rule (exit 77 without
 * CUDA or a device), random host data, poisoned device buffers and the
 * relative-error comparison (NaN never passes). */
#pragma once

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_kernels.h"
#include "lp_tensor.h"

static int twin_failures;

/* Exits 77 when there is nothing to test on; returns device 0's backend. */
static inline const lp_tensor_backend *twin_device_or_skip(void) {
  if (!lp_kernels_built_with_cuda()) {
    printf("skip: built without CUDA\n");
    exit(77);
  }
  if (lp_kernels_load() != LP_KERNELS_OK) { /* a broken build, not a skip */
    printf("FAIL: %s\n", lp_kernels_last_error());
    exit(1);
  }
  if (lp_kernels_device_count() <= 0) {
    printf("skip: no CUDA device visible (cudaGetDeviceCount is 0 or fails)\n");
    exit(77);
  }
  const lp_tensor_backend *be = lp_tensor_backend_cuda(0);
  if (!be) {
    printf("FAIL: a device is visible but cuda:0 did not start: %s\n",
           lp_kernels_last_error());
    exit(1);
  }
  return be;
}

static lp_tensor_rng twin_rng;

/* n floats uniform in [lo, hi) (host, lp_malloc). */
static inline float *twin_rand(size_t n, float lo, float hi) {
  float *p = lp_malloc((n ? n : 1) * sizeof *p);
  for (size_t i = 0; i < n; i++)
    p[i] = lo + (hi - lo) * (float)lp_tensor_rng_uniform(&twin_rng);
  return p;
}

static inline float *twin_copy(const float *src, size_t n) {
  float *p = lp_malloc((n ? n : 1) * sizeof *p);
  if (n) memcpy(p, src, n * sizeof *p);
  return p;
}

/* Device buffer with a copy of host floats (bytes: n * sizeof(float)). */
static inline void *twin_up(const lp_tensor_backend *be, const void *host,
                     size_t bytes) {
  void *d = be->alloc(be, bytes ? bytes : 1);
  if (!d || be->from_host(be, d, host, bytes) != LP_OK) {
    printf("FAIL: device upload of %zu bytes: %s\n", bytes,
           lp_kernels_last_error());
    exit(1);
  }
  return d;
}

/* Device buffer of n floats filled with NaN (unwritten outputs show up). */
static inline float *twin_poison(const lp_tensor_backend *be, size_t n) {
  float *h = lp_malloc((n ? n : 1) * sizeof *h);
  for (size_t i = 0; i < n; i++)
    h[i] = NAN;
  float *d = twin_up(be, h, n * sizeof *h);
  lp_free(h);
  return d;
}

static inline void *twin_down(const lp_tensor_backend *be, const void *dev,
                       size_t bytes) {
  void *h = lp_malloc(bytes ? bytes : 1);
  if (be->to_host(be, h, dev, bytes) != LP_OK) {
    printf("FAIL: device download: %s\n", lp_kernels_last_error());
    exit(1);
  }
  return h;
}

/* ||got - want|| / ||want|| <= tol over the finite elements; a NaN on
 * either side fails, and an infinity must be matched exactly. Prints one
 * line per check. */
static inline void twin_check(const char *what, const float *got, const float *want,
                       size_t n, double tol) {
  double num = 0.0, den = 0.0;
  size_t bad = n;
  for (size_t i = 0; i < n; i++) {
    if (isnan(got[i]) || isnan(want[i])) {
      bad = i;
      break;
    }
    if (isinf(got[i]) || isinf(want[i])) {
      if (got[i] != want[i]) {
        bad = i;
        break;
      }
      continue;
    }
    double d = (double)got[i] - (double)want[i];
    num += d * d;
    den += (double)want[i] * want[i];
  }
  double rel = sqrt(num) / (den > 0 ? sqrt(den) : 1e-30);
  if (den == 0 && num == 0) rel = 0;
  int ok = bad == n && rel <= tol;
  printf("%-4s %-34s n=%-8zu rel=%.3g (tol %.1g)", ok ? "ok" : "FAIL", what, n,
         rel, tol);
  if (bad != n)
    printf(" element %zu: got %g want %g", bad, (double)got[bad],
           (double)want[bad]);
  printf("\n");
  if (!ok) twin_failures++;
}

static inline void twin_check_d(const char *what, const double *got,
                         const double *want, size_t n, double tol) {
  float *g = lp_malloc((n ? n : 1) * sizeof *g), *w = lp_malloc((n ? n : 1) * sizeof *w);
  for (size_t i = 0; i < n; i++)
    g[i] = (float)got[i], w[i] = (float)want[i];
  twin_check(what, g, w, n, tol);
  lp_free(g);
  lp_free(w);
}

static inline void twin_status(const char *what, lp_status st) {
  if (st == LP_OK) return;
  printf("FAIL %s: %s (%s)\n", what, lp_strerror(st), lp_kernels_last_error());
  twin_failures++;
}
