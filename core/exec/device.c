/* device.c — which device a rank trains on: the rule that maps a device
 * name ("cpu", "cuda", "cuda:N") and this process's place on its node to a
 * backend (lp_exec_opts.backend). The bindings only translate its status
 * and text. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "lp_exec.h"
#include "lp_kernels.h"

lp_status lp_exec_device_parse(const char *name, int *want, char *err) {
  *want = LP_DEVICE_CPU;
  if (!name) {
    lp_errf(err, "device: no name given (cpu, cuda or cuda:N)");
    return LP_ERR_ARG;
  }
  if (!strcmp(name, "cpu")) return LP_OK;
  if (!strcmp(name, "cuda")) {
    *want = LP_DEVICE_LOCAL;
    return LP_OK;
  }
  if (!strncmp(name, "cuda:", 5) && name[5] >= '0' && name[5] <= '9') {
    char *end = NULL;
    long n = strtol(name + 5, &end, 10);
    if (!*end && n >= 0 && n <= LP_DEVICE_MAX) {
      *want = (int)n;
      return LP_OK;
    }
  }
  lp_errf(err, "device '%s' is not cpu, cuda or cuda:N", name);
  return LP_ERR_ARG;
}

lp_status lp_exec_device_pick(const char *name, int want, int local_rank, int visible,
                              int *device, char *err) {
  *device = LP_DEVICE_CPU;
  if (want == LP_DEVICE_CPU) return LP_OK;
  if (visible <= 0) {
    lp_errf(err, "device '%s' requested but no CUDA device is visible", name);
    return LP_ERR_UNSUPPORTED;
  }
  if (want == LP_DEVICE_LOCAL) {
    *device = (local_rank < 0 ? 0 : local_rank) % visible;
    return LP_OK;
  }
  if (want < 0) {
    lp_errf(err, "device '%s': not a device number", name);
    return LP_ERR_ARG;
  }
  *device = want; /* the backend says whether it exists */
  return LP_OK;
}

int lp_exec_local_rank(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                     "SLURM_LOCALID", NULL};
  for (int i = 0; vars[i]; i++) {
    const char *v = getenv(vars[i]);
    char *end = NULL;
    long n = v ? strtol(v, &end, 10) : -1;
    if (v && *v && !*end && n >= 0 && n < 1 << 20) return (int)n;
  }
  return 0;
}

lp_status lp_exec_device_index(const char *name, int *device, char *err) {
  int want = LP_DEVICE_CPU;
  *device = LP_DEVICE_CPU;
  lp_status st = lp_exec_device_parse(name, &want, err);
  if (st != LP_OK || want == LP_DEVICE_CPU) return st;
  int count = lp_kernels_load() == LP_KERNELS_OK ? lp_kernels_device_count() : 0;
  if (count <= 0) { /* the backend names the reason */
    *device = want == LP_DEVICE_LOCAL ? 0 : want;
    return LP_OK;
  }
  return lp_exec_device_pick(name, want, lp_exec_local_rank(), count, device, err);
}

lp_status lp_exec_device(const char *name, const lp_tensor_backend **be, char *err) {
  *be = NULL;
  int want = LP_DEVICE_CPU, dev = LP_DEVICE_CPU;
  lp_status st = lp_exec_device_parse(name, &want, err);
  if (st != LP_OK || want == LP_DEVICE_CPU) return st;
  if (lp_kernels_load() != LP_KERNELS_OK) { /* not built, or its module is missing */
    lp_errf(err, "device '%s' requested but %s", name, lp_kernels_last_error());
    return LP_ERR_UNSUPPORTED;
  }
  int count = lp_kernels_device_count();
  if (count <= 0) {
    lp_errf(err, "device '%s' requested but no CUDA device is visible (%s)", name,
            lp_kernels_last_error());
    return LP_ERR_UNSUPPORTED;
  }
  st = lp_exec_device_pick(name, want, lp_exec_local_rank(), count, &dev, err);
  if (st != LP_OK) return st;
  *be = lp_tensor_backend_cuda(dev);
  if (!*be) {
    lp_errf(err, "device '%s': %s", name, lp_kernels_last_error());
    return LP_ERR_ARG;
  }
  return LP_OK;
}
