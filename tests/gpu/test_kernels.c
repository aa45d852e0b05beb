/* test_kernels.c — the CUDA and NCCL modules: the program maps no CUDA
 * library until it needs one; then luapipe_cuda.so (and luapipe_nccl.so)
 * opens from next to the program, every symbol resolved (RTLD_NOW), and
 * brings cuBLAS (NCCL) with it. This part runs on every machine where
 * luapipe was built with CUDA, device or not (a module that cannot be
 * opened is a failure: the build is broken). With a device: a round trip
 * through the CUDA backend. Exits 77 (skipped) without CUDA built in, and
 * without a device after the module checks. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_comm_gpu.h"
#include "lp_kernels.h"

static int failures;

static void check(int cond, const char *what) {
  printf("%s %s\n", cond ? "ok" : "FAIL", what);
  if (!cond) failures++;
}

/* 1 when a line of /proc/self/maps names a file whose name contains lib. */
static int mapped(const char *lib) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[4608];
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) {
    const char *slash = strrchr(line, '/');
    if (slash && strstr(slash, lib)) found = 1;
  }
  if (f) fclose(f);
  return found;
}

static int ends_with(const char *s, const char *tail) {
  size_t n = s ? strlen(s) : 0, m = strlen(tail);
  return n >= m && !strcmp(s + n - m, tail);
}

int main(void) {
  if (!lp_kernels_built_with_cuda()) {
    printf("skip: built without CUDA\n");
    return 77;
  }
  static const char *const cuda_libs[] = {"libcublas", "libcublasLt", "libcudart",
                                          "libnccl", "luapipe_cuda", "luapipe_nccl"};
  int none = 1;
  for (size_t i = 0; i < sizeof cuda_libs / sizeof *cuda_libs; i++)
    if (mapped(cuda_libs[i])) {
      printf("  %s is mapped before any CUDA call\n", cuda_libs[i]);
      none = 0;
    }
  check(none, "no CUDA library is mapped at start");
  check(lp_kernels_module_path() == NULL, "no module path before loading");
  lp_kernels_host_free(lp_kernels_host_alloc(64));
  check(lp_kernels_cuda_device(NULL) == -1 && lp_kernels_last_error()[0] &&
            !mapped("luapipe_cuda"),
        "calls that need no device load nothing (device of NULL, last error, host memory)");
  int rc = lp_kernels_load();
  if (rc != LP_KERNELS_OK) printf("  %s\n", lp_kernels_last_error());
  check(rc == LP_KERNELS_OK, "the CUDA module loads");
  if (rc != LP_KERNELS_OK) return 1;
  check(ends_with(lp_kernels_module_path(), "/luapipe_cuda.so"),
        "the module is luapipe_cuda.so");
  check(mapped("luapipe_cuda.so") && mapped("libcublas"),
        "loading it maps the module and cuBLAS");
  check(lp_kernels_load() == LP_KERNELS_OK, "loading again is a no-op");
  if (lp_comm_nccl_built()) {
    const char *text = NULL;
    lp_status st = lp_comm_nccl_load(&text);
    if (st != LP_OK) printf("  %s\n", text);
    check(st == LP_OK && ends_with(text, "/luapipe_nccl.so"), "the NCCL module loads");
    check(mapped("libnccl"), "loading it maps NCCL");
  }
  int n = lp_kernels_device_count();
  if (failures) return 1;
  if (n <= 0) {
    printf("skip: no CUDA device visible (%s)\n", lp_kernels_last_error());
    return 77;
  }

  /* a round trip through the backend: y = 0.5 x + y on the device */
  const lp_tensor_backend *be = lp_tensor_backend_cuda(0);
  if (!be) {
    printf("FAIL: cuda:0 did not start: %s\n", lp_kernels_last_error());
    return 1;
  }
  check(lp_kernels_cuda_device(be) == 0 && !be->host_accessible, "cuda:0 is a device backend");
  enum { N = 100003 };
  float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *r = malloc(N * sizeof *r);
  for (int i = 0; i < N; i++) {
    x[i] = (float)((i % 97) - 48) / 16.0f;
    y[i] = (float)(i % 13);
    r[i] = NAN;
  }
  float *dx = be->alloc(be, N * sizeof *dx), *dy = be->alloc(be, N * sizeof *dy);
  lp_status st = dx && dy ? LP_OK : LP_ERR_NOMEM;
  if (st == LP_OK) st = be->from_host(be, dx, x, N * sizeof *x);
  if (st == LP_OK) st = be->from_host(be, dy, y, N * sizeof *y);
  if (st == LP_OK) st = be->axpy(be, N, 0.5f, dx, dy);
  if (st == LP_OK) st = be->to_host(be, r, dy, N * sizeof *r);
  if (st != LP_OK) printf("  %s: %s\n", lp_strerror(st), lp_kernels_last_error());
  int bad = 0;
  for (int i = 0; st == LP_OK && i < N; i++) {
    float want = 0.5f * x[i] + (float)(i % 13);
    if (!(fabsf(r[i] - want) <= 1e-6f * (1 + fabsf(want)))) bad++;
  }
  printf("  axpy: %d wrong of %d\n", bad, N);
  check(st == LP_OK && bad == 0, "axpy on cuda:0 matches the host");
  if (dx) be->free(be, dx);
  if (dy) be->free(be, dy);
  free(x), free(y), free(r);
  return failures ? 1 : 0;
}
