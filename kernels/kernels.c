/* kernels.c — lp_kernels.h in the program: plain C, no CUDA. In a build
 * with CUDA (LP_KERNELS_WITH_CUDA) the first call that needs the device
 * opens the CUDA module luapipe_cuda.so (the .cu files of kernels/, linked with cuBLAS
 * and the CUDA runtime) and every call goes through its table; until then,
 * and in a CPU run for ever, no CUDA library is mapped. Without CUDA every
 * call answers "built without CUDA". */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "lp_kernels_module.h"

#ifdef LP_KERNELS_WITH_CUDA

static const lp_kernels_module *mod;  /* the table, once loaded */
static char mod_path[4200];           /* where it was found */
static char load_error[LP_ERRLEN];    /* why it could not be loaded */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load(void) {
  char err[LP_ERRLEN];
  void *h = lp_module_open(LP_KERNELS_MODULE_FILE, mod_path, sizeof mod_path, err);
  if (!h) {
    lp_errf(load_error, "CUDA backend: %s", err);
    return;
  }
  const lp_kernels_module *(*entry)(void) = NULL;
  void *sym = lp_module_symbol(h, LP_KERNELS_MODULE_ENTRY);
  memcpy(&entry, &sym, sizeof entry); /* object -> function pointer */
  const lp_kernels_module *m = entry ? entry() : NULL;
  if (!m || m->abi != LP_KERNELS_MODULE_ABI || m->size != sizeof *m ||
      m->backend_size != sizeof(lp_tensor_backend)) {
    lp_errf(load_error,
             "CUDA backend: %s is not the CUDA module of this luapipe (no %s of "
             "version %d: rebuild luapipe)",
             mod_path, LP_KERNELS_MODULE_ENTRY, LP_KERNELS_MODULE_ABI);
    return;
  }
  mod = m;
}

/* The program's functions the CUDA module calls (nm -D --undefined-only
 * luapipe_cuda.so), referenced here so that every program that can open
 * the module links and exports them (core/base/module_exports.list);
 * gpu_test_kernels opens the module with every symbol resolved. */
typedef void (*program_fn)(void);
__attribute__((used)) static const program_fn program_api[] = {
    (program_fn)lp_malloc, (program_fn)lp_free, (program_fn)lp_log,
};

int lp_kernels_load(void) {
  pthread_once(&load_once, load);
  return mod ? LP_KERNELS_OK : LP_KERNELS_FAILED;
}

const char *lp_kernels_module_path(void) { return mod ? mod_path : NULL; }

int lp_kernels_built_with_cuda(void) { return 1; }

/* Does not load the module: before any call that does, there is no CUDA
 * failure to tell. */
const char *lp_kernels_last_error(void) {
  if (mod) return mod->last_error();
  return load_error[0] ? load_error : "the CUDA module is not loaded yet";
}

#define LOADED (lp_kernels_load() == LP_KERNELS_OK)

#else /* built without CUDA */

static const lp_kernels_module *const mod = NULL;
#define LOADED 0

int lp_kernels_load(void) { return LP_KERNELS_UNSUPPORTED; }
const char *lp_kernels_module_path(void) { return NULL; }
int lp_kernels_built_with_cuda(void) { return 0; }
const char *lp_kernels_last_error(void) {
  return "luapipe was built without CUDA (no nvcc)";
}

#endif

int lp_kernels_device_count(void) { return LOADED ? mod->device_count() : 0; }

const lp_tensor_backend *lp_tensor_backend_cuda(int device) {
  return LOADED ? mod->backend(device) : NULL;
}

/* The calls that take a backend: only a CUDA backend, which exists only
 * once the module is loaded, is theirs; nothing here loads the module. */
int lp_kernels_cuda_device(const lp_tensor_backend *be) {
  return mod ? mod->cuda_device(be) : -1;
}
lp_status lp_kernels_cuda_sync(const lp_tensor_backend *be) {
  return mod ? mod->cuda_sync(be) : LP_ERR_UNSUPPORTED;
}
void lp_kernels_cuda_memory(const lp_tensor_backend *be, size_t *in_use, size_t *cached) {
  if (mod) {
    mod->cuda_memory(be, in_use, cached);
    return;
  }
  if (in_use) *in_use = 0;
  if (cached) *cached = 0;
}
void lp_kernels_cuda_empty_cache(const lp_tensor_backend *be) {
  if (mod) mod->cuda_empty_cache(be);
}
void *lp_kernels_cuda_stream(const lp_tensor_backend *be) {
  return mod ? mod->cuda_stream(be) : NULL;
}
lp_status lp_kernels_cuda_gather_rows(const lp_tensor_backend *be, int64_t n,
                                      int64_t cols, const float *x,
                                      const int64_t *idx, const float *scale,
                                      float *out) {
  return mod ? mod->cuda_gather_rows(be, n, cols, x, idx, scale, out) : LP_ERR_UNSUPPORTED;
}
lp_status lp_kernels_cuda_scatter_add_rows(const lp_tensor_backend *be,
                                           int64_t n, int64_t cols,
                                           const float *x, const int64_t *idx,
                                           const float *scale, float *out) {
  return mod ? mod->cuda_scatter_add_rows(be, n, cols, x, idx, scale, out)
             : LP_ERR_UNSUPPORTED;
}
lp_status lp_kernels_cuda_dot_rows(const lp_tensor_backend *be, int64_t n,
                                   int64_t cols, const float *a,
                                   const int64_t *idx, const float *b,
                                   float *out) {
  return mod ? mod->cuda_dot_rows(be, n, cols, a, idx, b, out) : LP_ERR_UNSUPPORTED;
}

/* Host staging memory: the module's (page-locked when a device is
 * visible) when it is loaded by the first allocation, plain memory
 * otherwise; decided once, so every free goes where its block came from.
 * A staged context for device tensors is made after their backend, so by
 * then the module is loaded. */
static int host_mode = -1; /* -1 undecided, 0 plain, 1 the module's */
static pthread_mutex_t host_mu = PTHREAD_MUTEX_INITIALIZER;

static int host_via_module(void) {
  pthread_mutex_lock(&host_mu);
  if (host_mode < 0) host_mode = mod != NULL;
  int m = host_mode;
  pthread_mutex_unlock(&host_mu);
  return m;
}

void *lp_kernels_host_alloc(size_t bytes) {
  if (host_via_module()) return mod->host_alloc(bytes);
  return lp_malloc(bytes ? bytes : 1);
}

void lp_kernels_host_free(void *p) {
  if (!p) return;
  if (host_via_module()) mod->host_free(p);
  else lp_free(p);
}

int lp_kernels_bench_sgemm(int device, int trans_a, int trans_b, int64_t m,
                           int64_t n, int64_t k, float beta, int iters,
                           double *ms) {
  if (ms) *ms = 0;
  if (!LOADED) return lp_kernels_built_with_cuda() ? LP_KERNELS_FAILED : LP_KERNELS_UNSUPPORTED;
  return mod->bench_sgemm(device, trans_a, trans_b, m, n, k, beta, iters, ms);
}
