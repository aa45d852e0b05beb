/* comm_staged.c — the "mpi-staged" wrapper (see lp_comm_gpu.h): device
 * buffers carried through pinned host memory over a host context, so
 * several ranks sharing one GPU (which NCCL refuses) can still run a
 * device model. Copies go through the tensor backend's to_host/from_host
 * (which wait for the compute stream); pinned blocks come from a small
 * per-context pool. Also the LUAPIPE_COMM choice (lp_comm_for_backend). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_internal.h"
#include "lp_comm_gpu.h"
#include "lp_kernels.h"

typedef struct pin_block {
  void *p;
  size_t bytes;
  int busy;
} pin_block;

typedef struct staged_state {
  lp_comm *inner;
  int owns_inner; /* made by split */
  const lp_tensor_backend *be;
  pin_block *pool;
  size_t npool;
} staged_state;

/* One staged operation: the inner request and what to copy back. */
typedef struct staged_req {
  lp_comm_req *inner; /* NULL once finished (blocking collectives) */
  void *host, *host2; /* pinned blocks (all-to-all-v: send, receive) */
  float *dev;         /* device destination (receive, all-to-all-v) */
  size_t bytes;       /* receive: bytes to copy back */
  size_t *counts;     /* all-to-all-v: receive counts and displacements */
  int size;
} staged_req;

static staged_state *S(lp_comm *c) { return (staged_state *)c->impl; }
static staged_req **SR(lp_comm_req *r) { return (staged_req **)(void *)&r->impl; }

static void *pin_get(lp_comm *c, size_t bytes) {
  staged_state *s = S(c);
  for (size_t i = 0; i < s->npool; i++)
    if (!s->pool[i].busy && s->pool[i].bytes >= bytes) {
      s->pool[i].busy = 1;
      return s->pool[i].p;
    }
  pin_block *pool = lp_realloc(s->pool, (s->npool + 1) * sizeof *pool);
  if (!pool) {
    lp_errf(c->err, "out of memory");
    return NULL;
  }
  s->pool = pool;
  void *p = lp_kernels_host_alloc(bytes ? bytes : 1);
  if (!p) {
    lp_errf(c->err, "rank %d: no pinned host memory for %zu bytes: %s",
            c->rank, bytes, lp_kernels_last_error());
    return NULL;
  }
  s->pool[s->npool++] = (pin_block){p, bytes ? bytes : 1, 1};
  return p;
}

static void pin_put(lp_comm *c, void *p) {
  staged_state *s = S(c);
  for (size_t i = 0; p && i < s->npool; i++)
    if (s->pool[i].p == p) s->pool[i].busy = 0;
}

static void req_release(lp_comm *c, staged_req *sr) {
  if (!sr) return;
  pin_put(c, sr->host);
  pin_put(c, sr->host2);
  lp_free(sr->counts);
  lp_free(sr);
}

/* A device-copy failure, with the kernel text, as this context's error. */
static lp_status copy_fail(lp_comm *c, lp_status st, const char *what) {
  lp_errf(c->err, "rank %d: staging %s through host memory: %s", c->rank, what,
          lp_kernels_last_error());
  return st;
}

static lp_status inner_fail(lp_comm *c, lp_status st) {
  lp_errf(c->err, "%s", lp_comm_last_error(S(c)->inner));
  return st;
}

static staged_req *req_new(lp_comm *c, lp_comm_req *req) {
  staged_req *sr = lp_calloc(1, sizeof *sr);
  if (!sr) lp_errf(c->err, "out of memory");
  *SR(req) = sr;
  return sr;
}

/* Send: the device buffer is copied to pinned memory first (to_host waits
 * for the compute stream that wrote it). Receive: lands in pinned memory;
 * st_test copies it to the device. */
static lp_status start_p2p(lp_comm *c, int send, void *buf, size_t count,
                           lp_comm_dtype dt, int peer, int tag,
                           lp_comm_req *req) {
  const lp_tensor_backend *be = S(c)->be;
  size_t bytes = count * comm_dtype_size(dt);
  staged_req *sr = req_new(c, req);
  if (!sr) return LP_ERR_NOMEM;
  lp_status st = LP_ERR_NOMEM;
  if (!(sr->host = pin_get(c, bytes))) goto fail;
  if (send && (st = be->to_host(be, sr->host, buf, bytes)) != LP_OK) {
    st = copy_fail(c, st, "a send");
    goto fail;
  }
  if (!send) sr->dev = buf, sr->bytes = bytes;
  st = send ? lp_comm_isend(S(c)->inner, sr->host, count, peer, tag, &sr->inner)
            : lp_comm_irecv(S(c)->inner, sr->host, count, peer, tag, &sr->inner);
  if (st != LP_OK) {
    st = inner_fail(c, st);
    goto fail;
  }
  return LP_OK;
fail:
  req_release(c, sr);
  *SR(req) = NULL;
  return st;
}

static lp_status st_isend(lp_comm *c, const void *buf, size_t count,
                          lp_comm_dtype dt, int peer, int tag,
                          lp_comm_req *req) {
  return start_p2p(c, 1, (void *)buf, count, dt, peer, tag, req);
}

static lp_status st_irecv(lp_comm *c, void *buf, size_t count, lp_comm_dtype dt,
                          int peer, int tag, lp_comm_req *req) {
  return start_p2p(c, 0, buf, count, dt, peer, tag, req);
}

/* Blocking collective on a host copy of buf: down, run, up. */
static lp_status staged_blocking(lp_comm *c, void *buf, size_t bytes,
                                 lp_comm_req *req, int kind, size_t count,
                                 lp_comm_dtype dt, int root) {
  const lp_tensor_backend *be = S(c)->be;
  lp_comm *in = S(c)->inner;
  *SR(req) = NULL; /* finished when this returns */
  void *h = pin_get(c, bytes);
  if (!h) return LP_ERR_NOMEM;
  lp_status st = be->to_host(be, h, buf, bytes);
  if (st != LP_OK) {
    pin_put(c, h);
    return copy_fail(c, st, kind == 0 ? "an all-reduce" : "a broadcast");
  }
  if (kind == 0)
    st = dt == LP_COMM_DOUBLE
             ? lp_comm_allreduce_sum_double(in, h, count, "staged all-reduce")
             : lp_comm_allreduce_sum_float(in, h, count, "staged all-reduce");
  else
    st = lp_comm_bcast(in, h, bytes, root, "staged broadcast");
  if (st != LP_OK) {
    pin_put(c, h);
    return inner_fail(c, st);
  }
  st = be->from_host(be, buf, h, bytes);
  pin_put(c, h);
  return st == LP_OK ? LP_OK : copy_fail(c, st, "a collective result");
}

static lp_status st_iallreduce(lp_comm *c, void *buf, size_t count,
                               lp_comm_dtype dt, lp_comm_req *req) {
  return staged_blocking(c, buf, count * comm_dtype_size(dt), req, 0, count, dt, 0);
}

static lp_status st_ibcast(lp_comm *c, void *buf, size_t bytes, int root,
                           lp_comm_req *req) {
  return staged_blocking(c, buf, bytes, req, 1, 0, LP_COMM_FLOAT, root);
}

/* Blocking: the piece down to pinned memory, the inner all-gather, the
 * whole result up. */
static lp_status st_iallgather(lp_comm *c, const void *send, size_t bytes,
                               void *recv, lp_comm_req *req) {
  const lp_tensor_backend *be = S(c)->be;
  size_t all = bytes * (size_t)c->size;
  *SR(req) = NULL; /* finished when this returns */
  void *h = pin_get(c, bytes), *h2 = h ? pin_get(c, all) : NULL;
  lp_status st = h && h2 ? LP_OK : LP_ERR_NOMEM;
  if (st == LP_OK && bytes && (st = be->to_host(be, h, send, bytes)) != LP_OK)
    st = copy_fail(c, st, "an all-gather");
  if (st == LP_OK &&
      (st = lp_comm_allgather(S(c)->inner, h, bytes, h2, "staged all-gather")) != LP_OK)
    st = inner_fail(c, st);
  if (st == LP_OK && all && (st = be->from_host(be, recv, h2, all)) != LP_OK)
    st = copy_fail(c, st, "an all-gather result");
  pin_put(c, h);
  pin_put(c, h2);
  return st;
}

static lp_status st_ibarrier(lp_comm *c, lp_comm_req *req) {
  *SR(req) = NULL;
  lp_status st = lp_comm_barrier(S(c)->inner, "staged barrier");
  return st == LP_OK ? LP_OK : inner_fail(c, st);
}

static lp_status st_ialltoallv(lp_comm *c, const float *send, const size_t *sc,
                               const size_t *sd, float *recv, const size_t *rc,
                               const size_t *rd, lp_comm_req *req) {
  const lp_tensor_backend *be = S(c)->be;
  size_t send_end = 0, recv_end = 0;
  for (int p = 0; p < c->size; p++) {
    if (sc[p] && sd[p] + sc[p] > send_end) send_end = sd[p] + sc[p];
    if (rc[p] && rd[p] + rc[p] > recv_end) recv_end = rd[p] + rc[p];
  }
  staged_req *sr = req_new(c, req);
  if (!sr) return LP_ERR_NOMEM;
  lp_status st = LP_ERR_NOMEM;
  sr->dev = recv;
  sr->size = c->size;
  sr->counts = lp_malloc(2 * (size_t)c->size * sizeof *sr->counts);
  if (!sr->counts) goto fail;
  memcpy(sr->counts, rc, (size_t)c->size * sizeof *rc);
  memcpy(sr->counts + c->size, rd, (size_t)c->size * sizeof *rd);
  if (!(sr->host = pin_get(c, send_end * sizeof(float)))) goto fail;
  if (!(sr->host2 = pin_get(c, recv_end * sizeof(float)))) goto fail;
  if (send_end && (st = be->to_host(be, sr->host, send, send_end * sizeof(float))) != LP_OK) {
    st = copy_fail(c, st, "an all-to-all-v");
    goto fail;
  }
  if ((st = lp_comm_ialltoallv(S(c)->inner, sr->host, sc, sd, sr->host2, rc, rd,
                               &sr->inner)) != LP_OK) {
    st = inner_fail(c, st);
    goto fail;
  }
  return LP_OK;
fail:
  req_release(c, sr);
  *SR(req) = NULL;
  return st;
}

/* Copies what a finished receive / all-to-all-v brought to the device. */
static lp_status land(lp_comm *c, staged_req *sr) {
  const lp_tensor_backend *be = S(c)->be;
  lp_status st = LP_OK;
  if (sr->counts) {
    for (int p = 0; st == LP_OK && p < sr->size; p++) {
      size_t n = sr->counts[p], d = sr->counts[sr->size + p];
      if (n)
        st = be->from_host(be, sr->dev + d, (float *)sr->host2 + d, n * sizeof(float));
    }
  } else if (sr->dev) {
    st = be->from_host(be, sr->dev, sr->host, sr->bytes);
  }
  return st == LP_OK ? LP_OK : copy_fail(c, st, "a received message");
}

static lp_status st_test(lp_comm *c, lp_comm_req *r, int *done) {
  staged_req *sr = *SR(r);
  *done = 1;
  if (!sr) return LP_OK; /* a blocking collective */
  int d = 0;
  lp_status st = lp_comm_test(S(c)->inner, &sr->inner, &d);
  if (st != LP_OK) {
    st = inner_fail(c, st);
  } else if (d) {
    st = land(c, sr);
  } else {
    *done = 0;
    return LP_OK;
  }
  req_release(c, sr);
  *SR(r) = NULL;
  return st;
}

static void st_cancel(lp_comm *c, lp_comm_req *r) {
  staged_req *sr = *SR(r);
  if (!sr) return;
  lp_comm_cancel(S(c)->inner, &sr->inner);
  req_release(c, sr);
  *SR(r) = NULL;
}

static void st_abort(lp_comm *c, int code) { lp_comm_abort(S(c)->inner, code); }

static void st_destroy(lp_comm *c) {
  staged_state *s = S(c);
  if (!s) return;
  for (size_t i = 0; i < s->npool; i++) lp_kernels_host_free(s->pool[i].p);
  lp_free(s->pool);
  if (s->owns_inner) lp_comm_free(s->inner);
  lp_free(s);
}

static lp_status st_split(lp_comm *c, int color, int key, lp_comm **out);

static const lp_comm_backend comm_staged_backend = {
    .name = "mpi-staged",
    /* each staged context wraps its own host context (MPI, self), whose
     * operations progress whatever order ranks started them in */
    .any_order = 1,
    .isend = st_isend,
    .irecv = st_irecv,
    .iallreduce_sum = st_iallreduce,
    .ibarrier = st_ibarrier,
    .ibcast = st_ibcast,
    .ialltoallv = st_ialltoallv,
    .iallgather = st_iallgather,
    .split = st_split,
    .test = st_test,
    .cancel = st_cancel,
    .abort = st_abort,
    .destroy = st_destroy,
};

static lp_status staged_over(lp_comm *inner, const lp_tensor_backend *be,
                             int owns_inner, lp_comm **out) {
  *out = NULL;
  if (!inner || !be) return LP_ERR_ARG;
  staged_state *s = lp_calloc(1, sizeof *s);
  if (!s) return LP_ERR_NOMEM;
  s->inner = inner;
  s->be = be;
  lp_status st = lp_comm_new(&comm_staged_backend, lp_comm_rank(inner),
                             lp_comm_size(inner), lp_comm_tag_ub(inner), s, out);
  if (st != LP_OK) {
    lp_free(s);
    return st;
  }
  s->owns_inner = owns_inner;
  /* the inner context already models the link (if any) and times out */
  lp_comm_set_link(*out, NULL);
  lp_comm_set_timeout(*out, lp_comm_timeout(inner));
  return LP_OK;
}

static lp_status st_split(lp_comm *c, int color, int key, lp_comm **out) {
  lp_comm *ni = NULL;
  lp_status st = lp_comm_split(S(c)->inner, color, key, &ni);
  if (st != LP_OK) return inner_fail(c, st);
  st = staged_over(ni, S(c)->be, 1, out);
  if (st != LP_OK) lp_comm_free(ni);
  return st;
}

lp_status lp_comm_staged_new(lp_comm *inner, const lp_tensor_backend *be,
                             lp_comm **out) {
  return staged_over(inner, be, 0, out);
}

/* ---- choosing the context for a device --------------------------------- */

/* 1 when no two ranks of world share (host, device): every rank puts a key
 * in its own slot and a sum all-reduce gives everyone the table. */
static lp_status devices_distinct(lp_comm *world, int device, int *distinct) {
  int n = lp_comm_size(world), me = lp_comm_rank(world);
  double *keys = lp_calloc((size_t)n, sizeof *keys);
  if (!keys) return LP_ERR_NOMEM;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  uint64_t h = lp_tensor_hash_name(host);
  keys[me] = (double)((h & 0xffffffffu) * 1024u + (uint64_t)(device & 1023));
  lp_status st = lp_comm_allreduce_sum_double(world, keys, (size_t)n,
                                              "comparing the ranks' GPUs");
  *distinct = 1;
  for (int i = 0; st == LP_OK && i < n; i++)
    for (int j = i + 1; j < n; j++)
      if (keys[i] == keys[j]) *distinct = 0;
  lp_free(keys);
  return st;
}

lp_status lp_comm_for_backend(lp_comm *world, const lp_tensor_backend *be,
                              lp_comm **out, int *owned) {
  *out = NULL;
  *owned = 0;
  if (!be || be->host_accessible) {
    *out = world;
    return LP_OK;
  }
  const char *want = getenv("LUAPIPE_COMM");
  if (want && !*want) want = NULL;
  if (want && strcmp(want, "nccl") && strcmp(want, "mpi")) {
    lp_errf(world->err, "LUAPIPE_COMM=%s: use nccl or mpi", want);
    return LP_ERR_ARG;
  }
  int device = lp_kernels_cuda_device(be);
  int use_nccl = want ? !strcmp(want, "nccl") : 0;
  if (!want && lp_comm_nccl_built() && device >= 0) {
    int distinct = 0;
    LP_CHECK(devices_distinct(world, device, &distinct));
    use_nccl = distinct;
    if (!distinct)
      lp_log(LP_LOG_INFO,
             "comm: ranks share a GPU; device buffers go through MPI with "
             "pinned host staging (NCCL needs one GPU per rank)");
  }
  if (use_nccl) {
    if (device < 0) {
      lp_errf(world->err, "LUAPIPE_COMM=nccl needs tensors on a CUDA device, not %s",
              be->name);
      return LP_ERR_ARG;
    }
    LP_CHECK(lp_comm_nccl_new(world, device, out));
  } else {
    LP_CHECK(lp_comm_staged_new(world, be, out));
  }
  *owned = 1;
  return LP_OK;
}
