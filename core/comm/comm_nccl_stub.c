/* comm_nccl_stub.c — lp_comm_nccl_new in a build without NCCL. */
#include "comm_internal.h"
#include "lp_comm_gpu.h"

int lp_comm_nccl_built(void) { return 0; }

lp_status lp_comm_nccl_new(lp_comm *boot, int device, lp_comm **out) {
  *out = NULL;
  lp_errf(boot->err,
          "rank %d: NCCL for CUDA device %d: luapipe was built without NCCL "
          "(configure with -DLUAPIPE_NCCL=ON where nccl.h is installed)",
          boot->rank, device);
  return LP_ERR_UNSUPPORTED;
}
