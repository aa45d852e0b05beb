/* lp_comm_gpu.h — communication of device buffers: the "nccl" backend
 * (comm_nccl.c, built when NCCL is found into the module luapipe_nccl.so,
 * which comm_nccl_load.c opens on first use) and
 * the "mpi-staged" wrapper that carries device buffers through pinned host
 * memory over any host context (several ranks on one GPU, which NCCL
 * refuses). Contexts made here take DEVICE pointers in every call (send and
 * receive buffers, all-reduce and broadcast buffers, all-to-all-v). */
#pragma once

#include "lp_comm.h"
#include "lp_tensor.h"

/* 1 when luapipe was built with NCCL (does not load the module). */
int lp_comm_nccl_built(void);
/* Opens the NCCL module once (luapipe_nccl.so, found like the CUDA module:
 * next to the program or in <program dir>/../lib/luapipe; it maps libnccl
 * and the CUDA runtime). LP_OK with its path in *text; LP_ERR_UNSUPPORTED
 * without NCCL, LP_ERR_COMM when the module is missing or cannot be
 * loaded, with the reason in *text ("NCCL backend: cannot load <path>:
 * libnccl.so.2: cannot open shared object file: ..."). text may be NULL.
 * lp_comm_nccl_new calls it. */
lp_status lp_comm_nccl_load(const char **text);

/* A new NCCL context over the ranks of `boot` (a host context, usually the
 * MPI world): rank 0 makes the NCCL unique id and broadcasts it over boot;
 * every rank then joins on CUDA device `device`. Work runs on a
 * communication stream of that device, after the work queued so far on the
 * CUDA tensor backend's compute stream; completion is seen through CUDA
 * events. Point-to-point operations are queued and started together as one
 * NCCL group (ncclGroupStart/End) by the first test or wait, so a rank may
 * post its sends and receives in any order. Tags are not matched: between
 * two ranks, messages are received in the order they were sent. A receive
 * of a different length is not detected. The watchdog polls
 * ncclCommGetAsyncError; a failed or cancelled operation aborts the NCCL
 * communicator (ncclCommAbort) and the text names rank, operation and peer.
 * LP_ERR_UNSUPPORTED without NCCL or when its module cannot be loaded
 * (the text then says why and that LUAPIPE_COMM=mpi stages through MPI
 * instead); LP_ERR_COMM when NCCL cannot start
 * (e.g. two ranks on one GPU), with text in boot's last error. Free with
 * lp_comm_free. */
lp_status lp_comm_nccl_new(lp_comm *boot, int device, lp_comm **out);

/* A context over `inner` (a host context) for buffers in the memory of
 * tensor backend `be`: sends copy the device buffer into pinned host
 * memory first, receives copy it to the device when they finish;
 * all-reduce and broadcast run blocking on the host copy (under inner's
 * watchdog). Split makes a staged context over inner's split. Free with
 * lp_comm_free (inner is not freed; it must outlive this context). */
lp_status lp_comm_staged_new(lp_comm *inner, const lp_tensor_backend *be,
                             lp_comm **out);

/* The context for a rank whose tensors live on `be`, by LUAPIPE_COMM:
 *   host backend (or be == NULL): `world` itself (*owned = 0);
 *   LUAPIPE_COMM=nccl: NCCL on be's device, an error if it cannot start;
 *   LUAPIPE_COMM=mpi:  staged over world;
 *   unset: NCCL when built in and every rank has a GPU of its own (checked
 *   over world), else staged over world (one line at info level says so).
 * *owned = 1 when the caller must lp_comm_free *out. Any other value of
 * LUAPIPE_COMM is LP_ERR_ARG with text naming it. Collective over world. */
lp_status lp_comm_for_backend(lp_comm *world, const lp_tensor_backend *be,
                              lp_comm **out, int *owned);
