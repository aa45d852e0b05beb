/* comm_self.c — the "self" backend: one process, rank 0 of 1, no MPI.
 * Collectives finish at once (all-reduce is the identity); point-to-point
 * never reaches it (comm.c refuses a send to oneself and peers out of
 * range, which is every peer here). All-to-all-v is the copy of the self
 * piece, all-gather the copy of the one piece; a split gives a new self context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"

static lp_status self_p2p(lp_comm *c, int peer) {
  lp_errf(c->err, "rank %d of 1: no peer rank %d to talk to", c->rank, peer);
  return LP_ERR_INTERNAL;
}

static lp_status self_isend(lp_comm *c, const void *buf, size_t count,
                            lp_comm_dtype dt, int peer, int tag,
                            lp_comm_req *req) {
  (void)buf, (void)count, (void)dt, (void)tag, (void)req;
  return self_p2p(c, peer);
}

static lp_status self_irecv(lp_comm *c, void *buf, size_t count,
                            lp_comm_dtype dt, int peer, int tag,
                            lp_comm_req *req) {
  (void)buf, (void)count, (void)dt, (void)tag, (void)req;
  return self_p2p(c, peer);
}

static lp_status self_iallreduce(lp_comm *c, void *buf, size_t count,
                                 lp_comm_dtype dt, lp_comm_req *req) {
  (void)c, (void)buf, (void)count, (void)dt, (void)req;
  return LP_OK; /* the sum over one rank is the input */
}

static lp_status self_ibarrier(lp_comm *c, lp_comm_req *req) {
  (void)c, (void)req;
  return LP_OK;
}

static lp_status self_ibcast(lp_comm *c, void *buf, size_t bytes, int root,
                             lp_comm_req *req) {
  (void)c, (void)buf, (void)bytes, (void)root, (void)req;
  return LP_OK; /* root is 0, the only rank: nothing to copy */
}

static lp_status self_iallgather(lp_comm *c, const void *send, size_t bytes,
                                 void *recv, lp_comm_req *req) {
  (void)c, (void)req;
  if (bytes) memcpy(recv, send, bytes); /* the one rank's piece */
  return LP_OK;
}

static lp_status self_ialltoallv(lp_comm *c, const float *send,
                                 const size_t *send_counts,
                                 const size_t *send_displs, float *recv,
                                 const size_t *recv_counts,
                                 const size_t *recv_displs, lp_comm_req *req) {
  (void)c, (void)recv_counts, (void)req; /* comm.c checked the counts match */
  if (send_counts[0] > 0)
    memmove(recv + recv_displs[0], send + send_displs[0],
            send_counts[0] * sizeof(float));
  return LP_OK;
}

static lp_status self_split(lp_comm *c, int color, int key, lp_comm **out) {
  (void)color, (void)key;
  lp_status st = lp_comm_self_new(out);
  if (st == LP_ERR_NOMEM) lp_errf(c->err, "out of memory");
  return st;
}

static lp_status self_test(lp_comm *c, lp_comm_req *req, int *done) {
  (void)c, (void)req;
  *done = 1;
  return LP_OK;
}

static void self_cancel(lp_comm *c, lp_comm_req *req) { (void)c, (void)req; }

static void self_abort(lp_comm *c, int code) {
  (void)c;
  exit(code);
}

const lp_comm_backend comm_self_backend = {
    .name = "self",
    .any_order = 1,
    .isend = self_isend,
    .irecv = self_irecv,
    .iallreduce_sum = self_iallreduce,
    .ibarrier = self_ibarrier,
    .ibcast = self_ibcast,
    .ialltoallv = self_ialltoallv,
    .iallgather = self_iallgather,
    .split = self_split,
    .test = self_test,
    .cancel = self_cancel,
    .abort = self_abort,
    .destroy = NULL,
};
