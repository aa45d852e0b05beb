/* comm_nccl_load.c — lp_comm_nccl_new in the program. With NCCL built
 * (LP_COMM_WITH_NCCL) the first call opens the NCCL module luapipe_nccl.so
 * (comm_nccl.c, linked with libnccl) and hands the work to it; a CPU run
 * never calls it, so it maps no NCCL. Without NCCL it says so. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "comm_internal.h"
#include "lp_comm_gpu.h"
#include "lp_kernels.h"

#ifdef LP_COMM_WITH_NCCL

static const comm_nccl_module *mod;
static char mod_path[4200];
static char load_error[LP_ERRLEN];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load(void) {
  char err[LP_ERRLEN];
  void *h = lp_module_open(LP_COMM_NCCL_MODULE_FILE, mod_path, sizeof mod_path, err);
  if (!h) {
    lp_errf(load_error, "NCCL backend: %s", err);
    return;
  }
  const comm_nccl_module *(*entry)(void) = NULL;
  void *sym = lp_module_symbol(h, LP_COMM_NCCL_MODULE_ENTRY);
  memcpy(&entry, &sym, sizeof entry); /* object -> function pointer */
  const comm_nccl_module *m = entry ? entry() : NULL;
  if (!m || m->abi != LP_COMM_NCCL_MODULE_ABI || m->comm_size != sizeof(struct lp_comm) ||
      m->req_size != sizeof(struct lp_comm_req)) {
    lp_errf(load_error,
             "NCCL backend: %s is not the NCCL module of this luapipe (no %s of "
             "version %d: rebuild luapipe)",
             mod_path, LP_COMM_NCCL_MODULE_ENTRY, LP_COMM_NCCL_MODULE_ABI);
    return;
  }
  mod = m;
}

/* The program's functions the NCCL module calls (nm -D --undefined-only
 * luapipe_nccl.so), referenced here so that every program that can open
 * the module links them from the static libraries, and exports them
 * (core/base/module_exports.list). gpu_test_kernels, which links little
 * else, opens the module with every symbol resolved: it checks this list. */
typedef void (*program_fn)(void);
__attribute__((used)) static const program_fn program_api[] = {
    (program_fn)comm_dtype_name, (program_fn)lp_calloc,
    (program_fn)lp_comm_abort,   (program_fn)lp_comm_bcast,
    (program_fn)lp_comm_new,     (program_fn)lp_comm_rank,
    (program_fn)lp_comm_size,    (program_fn)lp_errf,
    (program_fn)lp_free,         (program_fn)lp_log,
    (program_fn)lp_realloc,      (program_fn)lp_kernels_cuda_stream,
    (program_fn)lp_kernels_last_error, (program_fn)lp_tensor_backend_cuda,
};

int lp_comm_nccl_built(void) { return 1; }

lp_status lp_comm_nccl_load(const char **text) {
  pthread_once(&load_once, load);
  if (text) *text = mod ? mod_path : load_error;
  return mod ? LP_OK : LP_ERR_COMM;
}

lp_status lp_comm_nccl_new(lp_comm *boot, int device, lp_comm **out) {
  *out = NULL;
  const char *why = NULL;
  if (lp_comm_nccl_load(&why) != LP_OK) {
    lp_errf(boot->err,
            "rank %d: NCCL for CUDA device %d: %s (LUAPIPE_COMM=mpi stages device "
            "buffers through MPI instead)",
            boot->rank, device, why);
    return LP_ERR_UNSUPPORTED;
  }
  return mod->create(boot, device, out);
}

#else /* built without NCCL */

int lp_comm_nccl_built(void) { return 0; }

static const char no_nccl[] =
    "luapipe was built without NCCL (configure with -DLUAPIPE_NCCL=ON where "
    "nccl.h is installed)";

lp_status lp_comm_nccl_load(const char **text) {
  if (text) *text = no_nccl;
  return LP_ERR_UNSUPPORTED;
}

lp_status lp_comm_nccl_new(lp_comm *boot, int device, lp_comm **out) {
  *out = NULL;
  lp_errf(boot->err, "rank %d: NCCL for CUDA device %d: %s", boot->rank, device, no_nccl);
  return LP_ERR_UNSUPPORTED;
}

#endif
