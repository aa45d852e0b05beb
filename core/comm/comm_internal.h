/* comm_internal.h — the context and request structs shared by comm.c and
 * the backends (comm_self.c, comm_mpi.c, comm_staged.c, and comm_nccl.c in
 * the NCCL module). Nothing outside core/comm sees them. */
#pragma once

#include "lp_comm.h"

typedef enum comm_op {
  COMM_OP_SEND,
  COMM_OP_RECV,
  COMM_OP_ALLREDUCE,
  COMM_OP_BARRIER,
  COMM_OP_BCAST,
  COMM_OP_ALLTOALLV,
  COMM_OP_ALLGATHER
} comm_op;

struct lp_comm {
  const lp_comm_backend *be;
  int rank, size;
  int tag_ub;
  int is_world;     /* owned by the library: lp_comm_free ignores it */
  double timeout_s; /* watchdog limit; <= 0: none */
  lp_link link;     /* emulated link (LUAPIPE_LINK / lp_comm_set_link) */
  void *impl;       /* backend state */
  char err[LP_ERRLEN];
};

struct lp_comm_req {
  comm_op op;
  lp_comm_dtype dtype;
  int peer, tag; /* -1 for collectives (peer = root for bcast) */
  size_t count;   /* floats sent (all-to-all-v: to other ranks; broadcast
                   * and all-gather: bytes, per rank) */
  size_t count_in; /* all-to-all-v: floats received from other ranks */
  double started; /* lp_now() when started */
  double arrival; /* modelled arrival on the emulated link (0: none) */
  int be_done;    /* the backend finished it; only the link time is left */
  /* backend state: big enough and aligned for an MPI_Request and a status
   * (comm_mpi.c checks with a static assert) */
  union {
    void *p;
    long long i;
    double d;
    unsigned char bytes[64];
  } impl;
};

/* Fills a context for backend `be` (err cleared, timeout from
 * LUAPIPE_TIMEOUT). */
void comm_init(lp_comm *c, const lp_comm_backend *be, int rank, int size,
               int tag_ub, void *impl);

extern const lp_comm_backend comm_self_backend;

/* Set by comm_mpi.c once MPI runs: the world context to hand out. */
void comm_set_world(lp_comm *c);

size_t comm_dtype_size(lp_comm_dtype dt);
const char *comm_dtype_name(lp_comm_dtype dt, size_t count); /* "float(s)" */

/* ---- the NCCL module ------------------------------------------------------
 * comm_nccl.c is built into luapipe_nccl.so (linked with libnccl and the
 * CUDA runtime), which comm_nccl_load.c opens on the first
 * lp_comm_nccl_new (lp_module_open), so that a CPU run maps no NCCL. Its
 * one exported symbol, LP_COMM_NCCL_MODULE_ENTRY, returns this table; the
 * loader refuses one whose sizes differ (a module of another build). */
#define LP_COMM_NCCL_MODULE_ABI 2 /* 2: the backend has iallgather */
#define LP_COMM_NCCL_MODULE_ENTRY "lp_comm_nccl_module_v1"
#define LP_COMM_NCCL_MODULE_FILE "luapipe_nccl.so"
typedef struct comm_nccl_module {
  int abi;                  /* LP_COMM_NCCL_MODULE_ABI */
  size_t comm_size, req_size; /* sizeof(struct lp_comm), sizeof(struct lp_comm_req) */
  /* lp_comm_nccl_new's work (see lp_comm_gpu.h) */
  lp_status (*create)(lp_comm *boot, int device, lp_comm **out);
} comm_nccl_module;
