/* comm_nccl.c — the "nccl" backend (see lp_comm_gpu.h): device buffers,
 * NCCL on a communication stream, completion through CUDA events, point-to-
 * point batched into one NCCL group per flush, the watchdog through
 * ncclCommGetAsyncError + ncclCommAbort. The only file that includes
 * nccl.h; compiled when CMake finds NCCL into the module luapipe_nccl.so
 * (hidden visibility: only lp_comm_nccl_module_v1 is exported), which
 * comm_nccl_load.c opens on first use. */
#define _POSIX_C_SOURCE 200809L
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "lp_comm_gpu.h"
#include "lp_kernels.h"

/* One queued point-to-point operation (not yet handed to NCCL). */
typedef struct pending_op {
  lp_comm_req *req;
  int send;
  void *buf;
  size_t count;
  lp_comm_dtype dt;
  int peer;
} pending_op;

typedef struct nccl_state {
  ncclComm_t comm;
  lp_comm *boot; /* host context used to start (and to abort the job) */
  int device;
  cudaStream_t stream;  /* communication stream */
  cudaStream_t compute; /* the tensor backend's stream: comm work follows it */
  cudaEvent_t ready;    /* compute -> comm ordering */
  float *scratch;       /* one float for barriers */
  int aborted;
  pending_op *pending;
  size_t npending, cap;
} nccl_state;

/* Per-request backend state: the completion event, or NULL while queued. */
static cudaEvent_t *req_event(lp_comm_req *r) {
  return (cudaEvent_t *)(void *)&r->impl;
}
_Static_assert(sizeof(cudaEvent_t) <= sizeof(((lp_comm_req *)0)->impl),
               "lp_comm_req.impl too small for a cudaEvent_t");

static nccl_state *S(lp_comm *c) { return (nccl_state *)c->impl; }

static ncclDataType_t ntype(lp_comm_dtype dt) {
  return dt == LP_COMM_DOUBLE ? ncclDouble : ncclFloat;
}

static const char *op_name(comm_op op) {
  switch (op) {
  case COMM_OP_SEND: return "send";
  case COMM_OP_RECV: return "receive";
  case COMM_OP_ALLREDUCE: return "all-reduce";
  case COMM_OP_BARRIER: return "barrier";
  case COMM_OP_BCAST: return "broadcast";
  case COMM_OP_ALLTOALLV: return "all-to-all-v";
  case COMM_OP_ALLGATHER: return "all-gather";
  }
  return "operation";
}

/* "<op> with rank P" / "<op> from rank P" in the user's words. */
static void describe(const lp_comm_req *r, char *buf, size_t n) {
  switch (r->op) {
  case COMM_OP_SEND:
    snprintf(buf, n, "send of %zu %s to rank %d (tag %d)", r->count,
             comm_dtype_name(r->dtype, r->count), r->peer, r->tag);
    break;
  case COMM_OP_RECV:
    snprintf(buf, n, "receive of %zu %s from rank %d (tag %d)", r->count,
             comm_dtype_name(r->dtype, r->count), r->peer, r->tag);
    break;
  case COMM_OP_BCAST:
    snprintf(buf, n, "broadcast of %zu bytes from rank %d", r->count, r->peer);
    break;
  case COMM_OP_ALLGATHER:
    snprintf(buf, n, "all-gather of %zu bytes per rank", r->count);
    break;
  default:
    snprintf(buf, n, "%s of %zu %s", op_name(r->op), r->count,
             comm_dtype_name(r->dtype, r->count));
  }
}

/* Aborts the communicator once (a hung or failed NCCL kernel then ends). */
static void abort_comm(nccl_state *s) {
  if (s->aborted) return;
  s->aborted = 1;
  ncclCommAbort(s->comm);
}

static lp_status nccl_fail(lp_comm *c, ncclResult_t res, const char *what) {
  nccl_state *s = S(c);
  const char *detail = s && s->comm ? ncclGetLastError(s->comm) : NULL;
  int more = detail && *detail;
  lp_errf(c->err, "rank %d: NCCL %s failed: %s%s%s%s", c->rank, what,
          ncclGetErrorString(res), more ? " (" : "", more ? detail : "",
          more ? ")" : "");
  return LP_ERR_COMM;
}

static lp_status cuda_fail(lp_comm *c, cudaError_t e, const char *what) {
  lp_errf(c->err, "rank %d: CUDA %s failed: %s", c->rank, what,
          cudaGetErrorString(e));
  return LP_ERR_COMM;
}

/* Orders the communication stream after the work queued so far on the
 * compute stream (which produced the buffers). */
static lp_status follow_compute(lp_comm *c) {
  nccl_state *s = S(c);
  cudaError_t e = cudaSetDevice(s->device);
  if (e == cudaSuccess && s->compute) e = cudaEventRecord(s->ready, s->compute);
  if (e == cudaSuccess && s->compute) e = cudaStreamWaitEvent(s->stream, s->ready, 0);
  return e == cudaSuccess ? LP_OK : cuda_fail(c, e, "stream ordering");
}

/* Records req's completion event on the communication stream. */
static lp_status mark(lp_comm *c, lp_comm_req *r) {
  nccl_state *s = S(c);
  cudaEvent_t ev = NULL;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ev, s->stream);
  if (e != cudaSuccess) {
    if (ev) cudaEventDestroy(ev);
    return cuda_fail(c, e, "event record");
  }
  *req_event(r) = ev;
  return LP_OK;
}

/* Starts every queued point-to-point operation as one NCCL group. */
static lp_status flush(lp_comm *c) {
  nccl_state *s = S(c);
  if (!s->npending) return LP_OK;
  LP_CHECK(follow_compute(c));
  ncclResult_t res = ncclGroupStart();
  for (size_t i = 0; res == ncclSuccess && i < s->npending; i++) {
    pending_op *p = &s->pending[i];
    res = p->send ? ncclSend(p->buf, p->count, ntype(p->dt), p->peer, s->comm,
                             s->stream)
                  : ncclRecv(p->buf, p->count, ntype(p->dt), p->peer, s->comm,
                             s->stream);
  }
  ncclResult_t end = ncclGroupEnd();
  if (res == ncclSuccess) res = end;
  size_t n = s->npending;
  s->npending = 0;
  if (res != ncclSuccess) {
    char what[160];
    describe(s->pending[0].req, what, sizeof what);
    for (size_t i = 0; i < n; i++) *req_event(s->pending[i].req) = NULL;
    abort_comm(s);
    return nccl_fail(c, res, what);
  }
  for (size_t i = 0; i < n; i++) LP_CHECK(mark(c, s->pending[i].req));
  return LP_OK;
}

static lp_status queue_p2p(lp_comm *c, int send, void *buf, size_t count,
                           lp_comm_dtype dt, int peer, lp_comm_req *req) {
  nccl_state *s = S(c);
  if (s->aborted) {
    lp_errf(c->err, "rank %d: the NCCL communicator was aborted earlier", c->rank);
    return LP_ERR_COMM;
  }
  if (s->npending == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 16;
    pending_op *p = lp_realloc(s->pending, cap * sizeof *p);
    if (!p) {
      lp_errf(c->err, "out of memory");
      return LP_ERR_NOMEM;
    }
    s->pending = p, s->cap = cap;
  }
  *req_event(req) = NULL;
  s->pending[s->npending++] =
      (pending_op){req, send, buf, count, dt, peer};
  return LP_OK;
}

static lp_status n_isend(lp_comm *c, const void *buf, size_t count,
                         lp_comm_dtype dt, int peer, int tag, lp_comm_req *req) {
  (void)tag;
  return queue_p2p(c, 1, (void *)buf, count, dt, peer, req);
}

static lp_status n_irecv(lp_comm *c, void *buf, size_t count, lp_comm_dtype dt,
                         int peer, int tag, lp_comm_req *req) {
  (void)tag;
  return queue_p2p(c, 0, buf, count, dt, peer, req);
}

/* Starts a collective (after the queued point-to-point operations). */
#define COLLECTIVE(c, req, what, call)                                         \
  do {                                                                         \
    LP_CHECK(flush(c));                                                        \
    LP_CHECK(follow_compute(c));                                               \
    ncclResult_t res_ = (call);                                                \
    if (res_ != ncclSuccess) {                                                 \
      abort_comm(S(c));                                                        \
      return nccl_fail(c, res_, what);                                         \
    }                                                                          \
    return mark(c, req);                                                       \
  } while (0)

static lp_status n_iallreduce(lp_comm *c, void *buf, size_t count,
                              lp_comm_dtype dt, lp_comm_req *req) {
  COLLECTIVE(c, req, "all-reduce",
             ncclAllReduce(buf, buf, count, ntype(dt), ncclSum, S(c)->comm,
                           S(c)->stream));
}

static lp_status n_ibarrier(lp_comm *c, lp_comm_req *req) {
  COLLECTIVE(c, req, "barrier",
             ncclAllReduce(S(c)->scratch, S(c)->scratch, 1, ncclFloat, ncclSum,
                           S(c)->comm, S(c)->stream));
}

static lp_status n_ibcast(lp_comm *c, void *buf, size_t bytes, int root,
                          lp_comm_req *req) {
  COLLECTIVE(c, req, "broadcast",
             ncclBroadcast(buf, buf, bytes, ncclUint8, root, S(c)->comm,
                           S(c)->stream));
}

static lp_status n_iallgather(lp_comm *c, const void *send, size_t bytes,
                              void *recv, lp_comm_req *req) {
  COLLECTIVE(c, req, "all-gather",
             ncclAllGather(send, recv, bytes, ncclUint8, S(c)->comm,
                           S(c)->stream));
}

/* All-to-all-v: one group of sends and receives; the self piece is a
 * device-to-device copy on the communication stream. */
static lp_status n_ialltoallv(lp_comm *c, const float *send, const size_t *sc,
                              const size_t *sd, float *recv, const size_t *rc,
                              const size_t *rd, lp_comm_req *req) {
  nccl_state *s = S(c);
  LP_CHECK(flush(c));
  LP_CHECK(follow_compute(c));
  if (sc[c->rank]) {
    cudaError_t e = cudaMemcpyAsync(recv + rd[c->rank], send + sd[c->rank],
                                    sc[c->rank] * sizeof(float),
                                    cudaMemcpyDeviceToDevice, s->stream);
    if (e != cudaSuccess) return cuda_fail(c, e, "all-to-all-v self copy");
  }
  ncclResult_t res = ncclGroupStart();
  for (int p = 0; res == ncclSuccess && p < c->size; p++) {
    if (p == c->rank) continue;
    if (sc[p])
      res = ncclSend(send + sd[p], sc[p], ncclFloat, p, s->comm, s->stream);
    if (res == ncclSuccess && rc[p])
      res = ncclRecv(recv + rd[p], rc[p], ncclFloat, p, s->comm, s->stream);
  }
  ncclResult_t end = ncclGroupEnd();
  if (res == ncclSuccess) res = end;
  if (res != ncclSuccess) {
    abort_comm(s);
    return nccl_fail(c, res, "all-to-all-v");
  }
  return mark(c, req);
}

static lp_status n_test(lp_comm *c, lp_comm_req *r, int *done) {
  nccl_state *s = S(c);
  *done = 0;
  if (!*req_event(r)) LP_CHECK(flush(c)); /* still queued: start the group */
  cudaEvent_t ev = *req_event(r);
  if (!ev) {
    *done = 1;
    lp_errf(c->err, "rank %d: the %s was never started", c->rank, op_name(r->op));
    return LP_ERR_COMM;
  }
  ncclResult_t async = ncclSuccess;
  ncclResult_t res = ncclCommGetAsyncError(s->comm, &async);
  if (res == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
    res = async;
  if (res != ncclSuccess) {
    char what[160];
    describe(r, what, sizeof what);
    abort_comm(s);
    *done = 1;
    cudaEventDestroy(ev);
    *req_event(r) = NULL;
    return nccl_fail(c, res, what);
  }
  cudaError_t e = cudaEventQuery(ev);
  if (e == cudaErrorNotReady) return LP_OK;
  *done = 1;
  cudaEventDestroy(ev);
  *req_event(r) = NULL;
  if (e != cudaSuccess) {
    char what[160];
    describe(r, what, sizeof what);
    return cuda_fail(c, e, what);
  }
  return LP_OK;
}

/* A queued operation is simply dropped; one NCCL already runs cannot be
 * taken back, so the communicator is aborted (the job is going down). */
static void n_cancel(lp_comm *c, lp_comm_req *r) {
  nccl_state *s = S(c);
  for (size_t i = 0; i < s->npending; i++)
    if (s->pending[i].req == r) {
      memmove(&s->pending[i], &s->pending[i + 1],
              (s->npending - i - 1) * sizeof *s->pending);
      s->npending--;
      return;
    }
  cudaEvent_t ev = *req_event(r);
  if (!ev) return;
  if (cudaEventQuery(ev) != cudaSuccess) {
    char what[160];
    describe(r, what, sizeof what);
    lp_log(LP_LOG_WARN, "rank %d: aborting the NCCL communicator: %s did not finish",
           c->rank, what);
    abort_comm(s);
  }
  cudaEventDestroy(ev);
  *req_event(r) = NULL;
}

static void n_abort(lp_comm *c, int code) {
  nccl_state *s = S(c);
  abort_comm(s);
  lp_comm_abort(s->boot, code);
}

static void n_destroy(lp_comm *c) {
  nccl_state *s = S(c);
  if (!s) return;
  cudaSetDevice(s->device);
  if (s->comm) {
    if (s->aborted) {
      /* ncclCommAbort already released it */
    } else {
      cudaStreamSynchronize(s->stream);
      ncclCommDestroy(s->comm);
    }
  }
  if (s->scratch) cudaFree(s->scratch);
  if (s->ready) cudaEventDestroy(s->ready);
  if (s->stream) cudaStreamDestroy(s->stream);
  lp_free(s->pending);
  lp_free(s);
}

static lp_status n_split(lp_comm *c, int color, int key, lp_comm **out);

static const lp_comm_backend comm_nccl_backend = {
    .name = "nccl",
    .isend = n_isend,
    .irecv = n_irecv,
    .iallreduce_sum = n_iallreduce,
    .ibarrier = n_ibarrier,
    .ibcast = n_ibcast,
    .ialltoallv = n_ialltoallv,
    .iallgather = n_iallgather,
    .split = n_split,
    .test = n_test,
    .cancel = n_cancel,
    .abort = n_abort,
    .destroy = n_destroy,
};

/* State with stream, events and scratch on `device` (comm set later). */
static lp_status state_new(lp_comm *err_ctx, lp_comm *boot, int device,
                           nccl_state **out) {
  *out = NULL;
  nccl_state *s = lp_calloc(1, sizeof *s);
  if (!s) return LP_ERR_NOMEM;
  s->boot = boot;
  s->device = device;
  const lp_tensor_backend *be = lp_tensor_backend_cuda(device);
  if (!be) {
    lp_errf(err_ctx->err, "rank %d: NCCL needs CUDA device %d: %s",
            err_ctx->rank, device, lp_kernels_last_error());
    lp_free(s);
    return LP_ERR_COMM;
  }
  s->compute = (cudaStream_t)lp_kernels_cuda_stream(be);
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaMalloc((void **)&s->scratch, sizeof(float));
  if (e == cudaSuccess) e = cudaMemset(s->scratch, 0, sizeof(float));
  if (e != cudaSuccess) {
    lp_errf(err_ctx->err, "rank %d: CUDA device %d for NCCL: %s", err_ctx->rank,
            device, cudaGetErrorString(e));
    n_destroy(&(lp_comm){.impl = s});
    return LP_ERR_COMM;
  }
  *out = s;
  return LP_OK;
}

static lp_status n_split(lp_comm *c, int color, int key, lp_comm **out) {
  nccl_state *s = S(c), *ns = NULL;
  LP_CHECK(flush(c));
  LP_CHECK(state_new(c, s->boot, s->device, &ns));
  ncclComm_t nc = NULL;
  ncclResult_t res = ncclCommSplit(s->comm, color, key, &nc, NULL);
  if (res != ncclSuccess || !nc) {
    n_destroy(&(lp_comm){.impl = ns});
    return nccl_fail(c, res != ncclSuccess ? res : ncclInternalError,
                     "communicator split");
  }
  ns->comm = nc;
  int rank = 0, size = 1;
  ncclCommUserRank(nc, &rank);
  ncclCommCount(nc, &size);
  lp_status st = lp_comm_new(&comm_nccl_backend, rank, size, c->tag_ub, ns, out);
  if (st != LP_OK) {
    ncclCommDestroy(nc);
    ns->comm = NULL;
    n_destroy(&(lp_comm){.impl = ns});
  }
  return st;
}

static lp_status nccl_new(lp_comm *boot, int device, lp_comm **out) {
  *out = NULL;
  int rank = lp_comm_rank(boot), size = lp_comm_size(boot);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclResult_t res = ncclSuccess;
  /* rank 0 makes the id; a failure is sent as an all-zero id so every rank
   * stops instead of waiting in ncclCommInitRank */
  if (rank == 0) {
    res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) memset(&id, 0, sizeof id);
  }
  LP_CHECK(lp_comm_bcast(boot, &id, sizeof id, 0, "sending the NCCL unique id"));
  static const ncclUniqueId zero;
  if (!memcmp(&id, &zero, sizeof id)) {
    lp_errf(boot->err, "rank %d: NCCL could not make a unique id on rank 0%s%s",
            rank, rank == 0 ? ": " : "",
            rank == 0 ? ncclGetErrorString(res) : "");
    return LP_ERR_COMM;
  }
  nccl_state *s = NULL;
  LP_CHECK(state_new(boot, boot, device, &s));
  res = ncclCommInitRank(&s->comm, size, id, rank);
  if (res != ncclSuccess) {
    lp_errf(boot->err,
            "rank %d: NCCL could not start on CUDA device %d with %d ranks: %s "
            "(%s)",
            rank, device, size, ncclGetErrorString(res), ncclGetLastError(NULL));
    s->comm = NULL;
    n_destroy(&(lp_comm){.impl = s});
    return LP_ERR_COMM;
  }
  lp_status st = lp_comm_new(&comm_nccl_backend, rank, size, boot->tag_ub, s, out);
  if (st != LP_OK) {
    ncclCommDestroy(s->comm);
    s->comm = NULL;
    n_destroy(&(lp_comm){.impl = s});
    return st;
  }
  lp_log(LP_LOG_DEBUG, "comm: rank %d of %d on NCCL %d.%d, CUDA device %d", rank,
         size, NCCL_MAJOR, NCCL_MINOR, device);
  return LP_OK;
}

static const comm_nccl_module nccl_module = {
    .abi = LP_COMM_NCCL_MODULE_ABI,
    .comm_size = sizeof(struct lp_comm),
    .req_size = sizeof(struct lp_comm_req),
    .create = nccl_new,
};

/* The one exported symbol of luapipe_nccl.so (LP_COMM_NCCL_MODULE_ENTRY). */
__attribute__((visibility("default"))) const comm_nccl_module *lp_comm_nccl_module_v1(void);
const comm_nccl_module *lp_comm_nccl_module_v1(void) { return &nccl_module; }
