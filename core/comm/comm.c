/* comm.c — the generic half of the comm layer: argument checks, requests,
 * the watchdog wait loop, error text and abort. Backends only start and
 * poll operations (comm_self.c, comm_mpi.c). */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_internal.h"

/* ---- contexts ---- */

void comm_init(lp_comm *c, const lp_comm_backend *be, int rank, int size,
               int tag_ub, void *impl) {
  memset(c, 0, sizeof *c);
  c->be = be;
  c->rank = rank;
  c->size = size;
  c->tag_ub = tag_ub;
  c->impl = impl;
  c->timeout_s = lp_env_double("LUAPIPE_TIMEOUT", 300);
  char err[LP_ERRLEN];
  /* a malformed LUAPIPE_LINK was reported by lp_comm_mpi_init: none here */
  if (lp_comm_link_from_env(&c->link, err) != LP_OK) memset(&c->link, 0, sizeof c->link);
}

lp_status lp_comm_link_from_env(lp_link *out, char *err) {
  char e[LP_ERRLEN];
  lp_status st = lp_link_parse(getenv("LUAPIPE_LINK"), out, e);
  if (st != LP_OK) lp_errf(err, "LUAPIPE_LINK: %s", e);
  return st;
}

void lp_comm_set_link(lp_comm *c, const lp_link *link) {
  if (link) c->link = *link;
  else memset(&c->link, 0, sizeof c->link);
}

const lp_link *lp_comm_link(const lp_comm *c) { return &c->link; }

int lp_comm_any_order(const lp_comm *c) { return c && c->be->any_order; }

static lp_comm *world;     /* set by comm_mpi.c while MPI runs */
static lp_comm self_world; /* the world of a process without MPI */

void comm_set_world(lp_comm *c) { world = c; }

lp_comm *lp_comm_world(void) {
  if (world) return world;
  if (!self_world.be) {
    comm_init(&self_world, &comm_self_backend, 0, 1, INT_MAX, NULL);
    self_world.is_world = 1;
  }
  return &self_world;
}

lp_status lp_comm_new(const lp_comm_backend *be, int rank, int size, int tag_ub,
                      void *impl, lp_comm **out) {
  *out = NULL;
  if (!be || size < 1 || rank < 0 || rank >= size || tag_ub < 0)
    return LP_ERR_ARG;
  lp_comm *c = lp_malloc(sizeof *c);
  if (!c) return LP_ERR_NOMEM;
  comm_init(c, be, rank, size, tag_ub, impl);
  *out = c;
  return LP_OK;
}

lp_status lp_comm_self_new(lp_comm **out) {
  return lp_comm_new(&comm_self_backend, 0, 1, INT_MAX, NULL, out);
}

void *lp_comm_backend_state(lp_comm *c) { return c->impl; }

void lp_comm_free(lp_comm *c) {
  if (!c || c->is_world) return;
  if (c->be->destroy) c->be->destroy(c);
  lp_free(c);
}

int lp_comm_rank(const lp_comm *c) { return c->rank; }
int lp_comm_size(const lp_comm *c) { return c->size; }
const char *lp_comm_backend_name(const lp_comm *c) { return c->be->name; }
int lp_comm_tag_ub(const lp_comm *c) { return c->tag_ub; }
const char *lp_comm_last_error(const lp_comm *c) { return c->err; }
void lp_comm_set_timeout(lp_comm *c, double seconds) { c->timeout_s = seconds; }
double lp_comm_timeout(const lp_comm *c) { return c->timeout_s; }

size_t comm_dtype_size(lp_comm_dtype dt) {
  return dt == LP_COMM_DOUBLE ? sizeof(double) : sizeof(float);
}

const char *comm_dtype_name(lp_comm_dtype dt, size_t count) {
  if (dt == LP_COMM_DOUBLE) return count == 1 ? "double" : "doubles";
  return count == 1 ? "float" : "floats";
}

/* ---- requests ---- */

/* Checks a point-to-point call; LP_OK or LP_ERR_ARG with text. */
static lp_status check_p2p(lp_comm *c, comm_op op, const void *buf, size_t n,
                           int peer, int tag, lp_comm_req **req) {
  const char *verb = op == COMM_OP_SEND ? "send to" : "receive from";
  if (!req) {
    lp_errf(c->err, "%s rank %d: no place for the request", verb, peer);
    return LP_ERR_ARG;
  }
  *req = NULL;
  if (peer < 0 || peer >= c->size) {
    lp_errf(c->err, "%s rank %d: no such rank (ranks are 0..%d)", verb, peer,
            c->size - 1);
    return LP_ERR_ARG;
  }
  if (peer == c->rank) {
    lp_errf(c->err, "%s rank %d: a rank cannot %s itself (tag %d)", verb, peer,
            op == COMM_OP_SEND ? "send to" : "receive from", tag);
    return LP_ERR_ARG;
  }
  if (tag < 0 || tag > c->tag_ub) {
    lp_errf(c->err, "%s rank %d: tag %d is out of range 0..%d", verb, peer, tag,
            c->tag_ub);
    return LP_ERR_ARG;
  }
  if (!buf && n > 0) {
    lp_errf(c->err, "%s rank %d: NULL buffer for %zu floats", verb, peer, n);
    return LP_ERR_ARG;
  }
  return LP_OK;
}

static lp_comm_req *new_req(lp_comm *c, comm_op op, lp_comm_dtype dt,
                            size_t count, int peer, int tag) {
  lp_comm_req *r = lp_malloc(sizeof *r);
  if (!r) {
    lp_errf(c->err, "out of memory");
    return NULL;
  }
  memset(r, 0, sizeof *r);
  r->op = op;
  r->dtype = dt;
  r->count = count;
  r->peer = peer;
  r->tag = tag;
  r->started = lp_now();
  return r;
}

/* Stamps r with its modelled arrival for `bytes` on c's emulated link. */
static void set_arrival(const lp_comm *c, lp_comm_req *r, double bytes) {
  if (lp_link_active(&c->link))
    r->arrival = r->started + lp_link_time(&c->link, bytes);
}

/* Checks and starts one point-to-point float transfer (op SEND or RECV). */
static lp_status start_p2p(lp_comm *c, comm_op op, float *buf, size_t n, int peer,
                           int tag, lp_comm_req **req) {
  LP_CHECK(check_p2p(c, op, buf, n, peer, tag, req));
  lp_comm_req *r = new_req(c, op, LP_COMM_FLOAT, n, peer, tag);
  if (!r) return LP_ERR_NOMEM;
  set_arrival(c, r, (double)n * sizeof(float)); /* the backend may use it */
  lp_status st = op == COMM_OP_SEND
                     ? c->be->isend(c, buf, n, LP_COMM_FLOAT, peer, tag, r)
                     : c->be->irecv(c, buf, n, LP_COMM_FLOAT, peer, tag, r);
  if (st != LP_OK) {
    lp_free(r);
    return st;
  }
  *req = r;
  return LP_OK;
}

lp_status lp_comm_isend(lp_comm *c, const float *buf, size_t n, int peer,
                        int tag, lp_comm_req **req) {
  return start_p2p(c, COMM_OP_SEND, (float *)buf, n, peer, tag, req);
}

lp_status lp_comm_irecv(lp_comm *c, float *buf, size_t n, int peer, int tag,
                        lp_comm_req **req) {
  return start_p2p(c, COMM_OP_RECV, buf, n, peer, tag, req);
}

lp_status lp_comm_test(lp_comm *c, lp_comm_req **req, int *done) {
  *done = 1;
  if (!*req) return LP_OK;
  lp_comm_req *r = *req;
  if (!r->be_done) {
    int d = 0;
    lp_status st = c->be->test(c, r, &d);
    if (st != LP_OK) {
      lp_free(r);
      *req = NULL;
      return st;
    }
    r->be_done = d;
  }
  if (!r->be_done || (r->arrival > 0 && lp_now() < r->arrival)) {
    *done = 0;
    return LP_OK;
  }
  lp_free(r);
  *req = NULL;
  return LP_OK;
}

void lp_comm_cancel(lp_comm *c, lp_comm_req **req) {
  if (!req || !*req) return;
  if (!(*req)->be_done) c->be->cancel(c, *req);
  lp_free(*req);
  *req = NULL;
}

/* ---- the watchdog ---- */

/* Writes the timeout message for the unfinished request r. */
static void timeout_text(lp_comm *c, const lp_comm_req *r, double limit,
                         const char *what) {
  char head[LP_ERRLEN];
  const char *ty = comm_dtype_name(r->dtype, r->count);
  switch (r->op) {
  case COMM_OP_RECV:
    snprintf(head, sizeof head, "waiting for rank %d to send %zu %s (tag %d) to rank %d",
             r->peer, r->count, ty, r->tag, c->rank);
    break;
  case COMM_OP_SEND:
    snprintf(head, sizeof head,
             "waiting for rank %d to receive %zu %s (tag %d) from rank %d",
             r->peer, r->count, ty, r->tag, c->rank);
    break;
  case COMM_OP_ALLREDUCE:
    snprintf(head, sizeof head, "in an all-reduce of %zu %s on rank %d (%d ranks)",
             r->count, ty, c->rank, c->size);
    break;
  case COMM_OP_BARRIER:
    snprintf(head, sizeof head, "in a barrier on rank %d (%d ranks)", c->rank,
             c->size);
    break;
  case COMM_OP_BCAST:
    snprintf(head, sizeof head,
             "in a broadcast of %zu bytes from rank %d, on rank %d", r->count,
             r->peer, c->rank);
    break;
  case COMM_OP_ALLTOALLV:
    snprintf(head, sizeof head,
             "in an all-to-all-v on rank %d (%d ranks) sending %zu %s to and "
             "receiving %zu %s from other ranks",
             c->rank, c->size, r->count, ty, r->count_in,
             comm_dtype_name(r->dtype, r->count_in));
    break;
  case COMM_OP_ALLGATHER:
    snprintf(head, sizeof head,
             "in an all-gather of %zu bytes per rank on rank %d (%d ranks)",
             r->count, c->rank, c->size);
    break;
  }
  lp_errf(c->err, "timed out after %g s (LUAPIPE_TIMEOUT) %s%s%s", limit, head,
          what && *what ? ": " : "", what ? what : "");
}

/* Sleeps a little longer the longer a wait lasts: a few polls first
 * (latency), then short sleeps, then longer ones. A waiting rank never
 * spins or yields in a loop: on a machine with fewer cores than ranks the
 * core it leaves is the one its exchange partner needs (a sched_yield loop
 * kept a waiting rank at a third of a core on 2 cores). ~20 us sleeps (50-70
 * us with the kernel's timer slack) for the first ~15 ms, then 200 us. */
void lp_comm_backoff(unsigned polls) {
  if (polls < 16) return;
  struct timespec ts = {0, polls < 128 ? 50000 : 200000};
  nanosleep(&ts, NULL);
}

/* When the pending requests cannot be reported before some future time
 * (their modelled arrival on the emulated link), the time to sleep until:
 * the earliest arrival, but at most 1 ms ahead while the backend has not
 * finished one yet (it may need polling). 0 when polling should go on. */
static double link_wake(lp_comm_req **reqs, int n, double now) {
  double wake = 0;
  for (int i = 0; i < n; i++) {
    const lp_comm_req *r = reqs[i];
    if (!r) continue;
    if (r->arrival <= now) return 0; /* only the real transfer is left */
    double t = r->be_done ? r->arrival : fmin(r->arrival, now + 1e-3);
    if (wake == 0 || t < wake) wake = t;
  }
  return wake;
}

lp_status lp_comm_waitall(lp_comm *c, lp_comm_req **reqs, int n,
                          const char *what) {
  double limit = c->timeout_s;
  double deadline = lp_now() + limit;
  for (unsigned polls = 0;; polls++) {
    int pending = -1;
    for (int i = 0; i < n; i++) {
      if (!reqs[i]) continue;
      int done;
      LP_CHECK(lp_comm_test(c, &reqs[i], &done));
      if (!done && pending < 0) pending = i;
    }
    if (pending < 0) return LP_OK;
    double now = lp_now();
    if (limit > 0 && now >= deadline) {
      timeout_text(c, reqs[pending], limit, what);
      return LP_ERR_TIMEOUT;
    }
    double wake = link_wake(reqs, n, now);
    if (wake > 0) lp_sleep_until(limit > 0 ? fmin(wake, deadline) : wake);
    else lp_comm_backoff(polls);
  }
}

lp_status lp_comm_wait(lp_comm *c, lp_comm_req **req, const char *what) {
  return lp_comm_waitall(c, req, 1, what);
}

lp_status lp_comm_send(lp_comm *c, const float *buf, size_t n, int peer,
                       int tag, const char *what) {
  lp_comm_req *r;
  LP_CHECK(lp_comm_isend(c, buf, n, peer, tag, &r));
  lp_status st = lp_comm_wait(c, &r, what);
  lp_comm_cancel(c, &r);
  return st;
}

lp_status lp_comm_recv(lp_comm *c, float *buf, size_t n, int peer, int tag,
                       const char *what) {
  lp_comm_req *r;
  LP_CHECK(lp_comm_irecv(c, buf, n, peer, tag, &r));
  lp_status st = lp_comm_wait(c, &r, what);
  lp_comm_cancel(c, &r);
  return st;
}

/* ---- collectives ---- */

/* Starts a collective through `start` and waits for it. On a timeout the
 * request is dropped (a started collective cannot be cancelled: the context
 * should be taken down with lp_comm_fatal). */
static lp_status collective(lp_comm *c, lp_comm_req *r, lp_status st,
                            const char *what) {
  if (st != LP_OK) {
    lp_free(r);
    return st;
  }
  st = lp_comm_wait(c, &r, what);
  lp_comm_cancel(c, &r);
  return st;
}

static lp_status allreduce(lp_comm *c, void *buf, size_t n, lp_comm_dtype dt,
                           const char *what) {
  if (!buf && n > 0) {
    lp_errf(c->err, "all-reduce: NULL buffer for %zu %s", n,
            comm_dtype_name(dt, n));
    return LP_ERR_ARG;
  }
  lp_comm_req *r = new_req(c, COMM_OP_ALLREDUCE, dt, n, -1, -1);
  if (!r) return LP_ERR_NOMEM;
  return collective(c, r, c->be->iallreduce_sum(c, buf, n, dt, r), what);
}

lp_status lp_comm_allreduce_sum_float(lp_comm *c, float *buf, size_t n,
                                      const char *what) {
  return allreduce(c, buf, n, LP_COMM_FLOAT, what);
}

lp_status lp_comm_allreduce_sum_double(lp_comm *c, double *buf, size_t n,
                                       const char *what) {
  return allreduce(c, buf, n, LP_COMM_DOUBLE, what);
}

lp_status lp_comm_iallreduce_sum_float(lp_comm *c, float *buf, size_t n,
                                       lp_comm_req **req) {
  *req = NULL;
  if (!buf && n > 0) {
    lp_errf(c->err, "all-reduce: NULL buffer for %zu %s", n,
            comm_dtype_name(LP_COMM_FLOAT, n));
    return LP_ERR_ARG;
  }
  lp_comm_req *r = new_req(c, COMM_OP_ALLREDUCE, LP_COMM_FLOAT, n, -1, -1);
  if (!r) return LP_ERR_NOMEM;
  lp_status st = c->be->iallreduce_sum(c, buf, n, LP_COMM_FLOAT, r);
  if (st != LP_OK) {
    lp_free(r);
    return st;
  }
  if (lp_link_active(&c->link) && n > 0 && c->size > 1)
    r->arrival = r->started + lp_link_allreduce_time(&c->link, c->size,
                                                     (double)n * sizeof(float));
  *req = r;
  return LP_OK;
}

lp_status lp_comm_reduce_scatter_sum_float(lp_comm *c, const float *send, float *recv,
                                           size_t shard, const char *what) {
  size_t n = shard * (size_t)c->size;
  if ((!send || !recv) && shard > 0) {
    lp_errf(c->err, "reduce-scatter: NULL buffer for %zu floats", n);
    return LP_ERR_ARG;
  }
  if (c->be->ireduce_scatter_sum) {
    lp_comm_req *r = new_req(c, COMM_OP_ALLREDUCE, LP_COMM_FLOAT, n, -1, -1);
    if (!r) return LP_ERR_NOMEM;
    return collective(c, r, c->be->ireduce_scatter_sum(c, send, recv, shard, r), what);
  }
  float *tmp = lp_malloc((n ? n : 1) * sizeof *tmp);
  if (!tmp) {
    lp_errf(c->err, "reduce-scatter: out of memory");
    return LP_ERR_NOMEM;
  }
  memcpy(tmp, send, n * sizeof *tmp);
  lp_status st = allreduce(c, tmp, n, LP_COMM_FLOAT, what);
  if (st == LP_OK) memcpy(recv, tmp + (size_t)c->rank * shard, shard * sizeof *tmp);
  lp_free(tmp);
  return st;
}

lp_status lp_comm_allgather_float(lp_comm *c, const float *send, float *recv, size_t shard,
                                  const char *what) {
  return lp_comm_allgather(c, send, shard * sizeof(float), recv, what);
}

lp_status lp_comm_barrier(lp_comm *c, const char *what) {
  lp_comm_req *r = new_req(c, COMM_OP_BARRIER, LP_COMM_FLOAT, 0, -1, -1);
  if (!r) return LP_ERR_NOMEM;
  return collective(c, r, c->be->ibarrier(c, r), what);
}

lp_status lp_comm_bcast(lp_comm *c, void *buf, size_t bytes, int root,
                        const char *what) {
  if (root < 0 || root >= c->size) {
    lp_errf(c->err, "broadcast from rank %d: no such rank (ranks are 0..%d)",
            root, c->size - 1);
    return LP_ERR_ARG;
  }
  if (!buf && bytes > 0) {
    lp_errf(c->err, "broadcast from rank %d: NULL buffer for %zu bytes", root,
            bytes);
    return LP_ERR_ARG;
  }
  lp_comm_req *r = new_req(c, COMM_OP_BCAST, LP_COMM_FLOAT, bytes, root, -1);
  if (!r) return LP_ERR_NOMEM;
  return collective(c, r, c->be->ibcast(c, buf, bytes, root, r), what);
}

lp_status lp_comm_allgather(lp_comm *c, const void *send, size_t bytes,
                            void *recv, const char *what) {
  if ((!send || !recv) && bytes > 0) {
    lp_errf(c->err, "all-gather of %zu bytes per rank on rank %d: NULL buffer",
            bytes, c->rank);
    return LP_ERR_ARG;
  }
  if (!c->be->iallgather) {
    lp_errf(c->err, "all-gather: the %s backend has none", c->be->name);
    return LP_ERR_UNSUPPORTED;
  }
  lp_comm_req *r = new_req(c, COMM_OP_ALLGATHER, LP_COMM_FLOAT, bytes, -1, -1);
  if (!r) return LP_ERR_NOMEM;
  return collective(c, r, c->be->iallgather(c, send, bytes, recv, r), what);
}

lp_status lp_comm_allgatherv(lp_comm *c, const void *send, size_t bytes,
                             void **out, size_t *sizes, const char *what) {
  *out = NULL;
  int P = c->size;
  uint64_t mine = bytes, *all = lp_malloc((size_t)P * sizeof *all);
  if (!all) {
    lp_errf(c->err, "out of memory");
    return LP_ERR_NOMEM;
  }
  lp_status st = lp_comm_allgather(c, &mine, sizeof mine, all, what);
  size_t most = 0, total = 0;
  for (int r = 0; st == LP_OK && r < P; r++) {
    sizes[r] = (size_t)all[r];
    if (sizes[r] > most) most = sizes[r];
    total += sizes[r];
  }
  lp_free(all);
  if (st != LP_OK || most == 0) return st;
  /* every piece padded to the largest: one all-gather of equal counts */
  char *pad = lp_calloc(most, 1), *pieces = lp_malloc((size_t)P * most);
  char *packed = lp_malloc(total);
  if (!pad || !pieces || !packed) {
    lp_errf(c->err, "out of memory");
    st = LP_ERR_NOMEM;
    goto done;
  }
  if (bytes) memcpy(pad, send, bytes);
  st = lp_comm_allgather(c, pad, most, pieces, what);
  if (st != LP_OK) goto done;
  size_t off = 0;
  for (int r = 0; r < P; r++) {
    if (sizes[r]) memcpy(packed + off, pieces + (size_t)r * most, sizes[r]);
    off += sizes[r];
  }
  *out = packed;
  packed = NULL;
done:
  lp_free(pad);
  lp_free(pieces);
  lp_free(packed);
  return st;
}

/* ---- sub-communicators ---- */

lp_status lp_comm_split(lp_comm *c, int color, int key, lp_comm **out) {
  *out = NULL;
  if (color < 0) {
    lp_errf(c->err, "split on rank %d: color %d must be >= 0", c->rank, color);
    return LP_ERR_ARG;
  }
  if (!c->be->split) {
    lp_errf(c->err, "split: the %s backend cannot split a communicator",
            c->be->name);
    return LP_ERR_UNSUPPORTED;
  }
  char what[96];
  snprintf(what, sizeof what, "splitting the communicator (color %d, key %d)",
           color, key);
  LP_CHECK(lp_comm_barrier(c, what));
  lp_comm *n = NULL;
  LP_CHECK(c->be->split(c, color, key, &n));
  n->timeout_s = c->timeout_s;
  n->link = c->link;
  *out = n;
  return LP_OK;
}

/* ---- all-to-all-v ---- */

/* Checks an all-to-all-v call; LP_OK or LP_ERR_ARG with text; *out_total /
 * *in_total get the floats to / from other ranks. */
static lp_status check_alltoallv(lp_comm *c, const float *send,
                                 const size_t *sc, const size_t *sd,
                                 const float *recv, const size_t *rc,
                                 const size_t *rd, lp_comm_req **req,
                                 size_t *out_total, size_t *in_total) {
  if (!req) {
    lp_errf(c->err, "all-to-all-v on rank %d: no place for the request", c->rank);
    return LP_ERR_ARG;
  }
  *req = NULL;
  if (!sc || !sd || !rc || !rd) {
    lp_errf(c->err, "all-to-all-v on rank %d: NULL count array", c->rank);
    return LP_ERR_ARG;
  }
  size_t out = 0, in = 0, send_end = 0, recv_end = 0;
  for (int p = 0; p < c->size; p++) {
    if (p != c->rank) {
      out += sc[p];
      in += rc[p];
    }
    if (sc[p] && sd[p] + sc[p] > send_end) send_end = sd[p] + sc[p];
    if (rc[p] && rd[p] + rc[p] > recv_end) recv_end = rd[p] + rc[p];
  }
  if (sc[c->rank] != rc[c->rank]) {
    lp_errf(c->err,
            "all-to-all-v on rank %d: sends %zu floats to itself but expects "
            "%zu from itself",
            c->rank, sc[c->rank], rc[c->rank]);
    return LP_ERR_ARG;
  }
  if ((!send && send_end > 0) || (!recv && recv_end > 0)) {
    lp_errf(c->err, "all-to-all-v on rank %d: NULL %s buffer for %zu floats",
            c->rank, !send && send_end ? "send" : "receive",
            !send && send_end ? send_end : recv_end);
    return LP_ERR_ARG;
  }
  *out_total = out;
  *in_total = in;
  return LP_OK;
}

lp_status lp_comm_ialltoallv(lp_comm *c, const float *send,
                             const size_t *send_counts,
                             const size_t *send_displs, float *recv,
                             const size_t *recv_counts,
                             const size_t *recv_displs, lp_comm_req **req) {
  size_t out, in, *prefix = NULL;
  if (req) *req = NULL;
  if ((!send_displs || !recv_displs) && send_counts && recv_counts) {
    /* NULL displacements: the prefix sums of the counts */
    prefix = lp_malloc(2 * (size_t)c->size * sizeof *prefix);
    if (!prefix) {
      lp_errf(c->err, "out of memory");
      return LP_ERR_NOMEM;
    }
    for (int p = 0; p < c->size; p++) {
      prefix[p] = p ? prefix[p - 1] + send_counts[p - 1] : 0;
      prefix[c->size + p] = p ? prefix[c->size + p - 1] + recv_counts[p - 1] : 0;
    }
    if (!send_displs) send_displs = prefix;
    if (!recv_displs) recv_displs = prefix + c->size;
  }
  lp_status st = check_alltoallv(c, send, send_counts, send_displs, recv,
                                 recv_counts, recv_displs, req, &out, &in);
  if (st == LP_OK && !c->be->ialltoallv) {
    lp_errf(c->err, "all-to-all-v: the %s backend has none", c->be->name);
    st = LP_ERR_UNSUPPORTED;
  }
  lp_comm_req *r = NULL;
  if (st == LP_OK && !(r = new_req(c, COMM_OP_ALLTOALLV, LP_COMM_FLOAT, out, -1, -1)))
    st = LP_ERR_NOMEM;
  if (st == LP_OK) {
    r->count_in = in;
    st = c->be->ialltoallv(c, send, send_counts, send_displs, recv,
                           recv_counts, recv_displs, r);
  }
  lp_free(prefix); /* backends copy what they keep */
  if (st != LP_OK) {
    lp_free(r);
    return st;
  }
  if (lp_link_active(&c->link) && out + in > 0)
    r->arrival = r->started + lp_link_alltoallv_time(&c->link, (double)out * sizeof(float),
                                                     (double)in * sizeof(float));
  *req = r;
  return LP_OK;
}

lp_status lp_comm_alltoallv(lp_comm *c, const float *send,
                            const size_t *send_counts,
                            const size_t *send_displs, float *recv,
                            const size_t *recv_counts,
                            const size_t *recv_displs, const char *what) {
  lp_comm_req *r;
  LP_CHECK(lp_comm_ialltoallv(c, send, send_counts, send_displs, recv,
                              recv_counts, recv_displs, &r));
  lp_status st = lp_comm_wait(c, &r, what);
  lp_comm_cancel(c, &r);
  return st;
}

/* ---- abort ---- */

_Noreturn void lp_comm_abort(lp_comm *c, int code) {
  if (!c) c = lp_comm_world();
  fflush(stdout);
  fflush(stderr);
  c->be->abort(c, code);
  _exit(code); /* a backend abort that returned */
}

void lp_comm_on_failure(lp_comm *c, lp_status st, const char *msg) {
  if (st == LP_ERR_TIMEOUT) lp_comm_fatal(c, msg);
}

_Noreturn void lp_comm_fatal(lp_comm *c, const char *msg) {
  if (!c) c = lp_comm_world();
  fprintf(stderr, "luapipe: rank %d: %s\n", c->rank,
          msg && *msg ? msg : "fatal error");
  lp_comm_abort(c, 1);
}
