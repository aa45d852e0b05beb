/* comm_mpi.c — the "mpi" backend (Open MPI) and the bootstrap the host
 * calls. Every operation is non-blocking (MPI_Isend, MPI_Iallreduce,
 * MPI_Ibarrier, MPI_Iallgather, ...) so comm.c's watchdog can bound every
 * wait. The world context works on a duplicate of MPI_COMM_WORLD with
 * MPI_ERRORS_RETURN; split contexts own their MPI communicator (impl, a mpi_ctx). A progress
 * thread (see lp_comm.h) drives MPI while operations are pending.
 * The only file in core/ that includes mpi.h. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <time.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_internal.h"

static struct {
  int started;   /* MPI_Init_thread succeeded */
  int finalized; /* lp_comm_mpi_finalize ran */
  int aborted;   /* MPI_Abort was called: never finalize after it */
  int broken;    /* a collective was abandoned: MPI_Finalize could hang */
  int provided;  /* thread level MPI gave us */
  MPI_Comm comm;
  lp_comm ctx;
  /* the progress thread */
  int thread_on;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int pending; /* operations started and not yet finished */
  double last_start; /* lp_now() of the latest start (the thread's pace) */
  int stop;
  struct deferred *deferred; /* sends waiting for their link time (FIFO) */
  MPI_Comm progress_comm; /* private: MPI_Iprobe on it only drives progress */
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* A split context's backend state. */
typedef struct mpi_ctx {
  MPI_Comm comm;
} mpi_ctx;

/* The backend part of a request: the MPI request and, for an all-to-all-v,
 * the int count/displacement arrays MPI reads until it completes. */
typedef struct mpi_req {
  MPI_Request q;
  int *arrays;
  int deferred; /* a send queued for the progress thread (under g.mu) */
  int post_rc;  /* MPI error of the deferred MPI_Isend, or MPI_SUCCESS */
} mpi_req;

/* A send on an emulated link, posted by the progress thread at `due`. */
typedef struct deferred {
  struct deferred *next;
  lp_comm_req *r;
  const void *buf;
  int count, peer, tag;
  MPI_Datatype type;
  MPI_Comm comm;
  double due;
} deferred;

_Static_assert(sizeof(mpi_req) <= sizeof(((lp_comm_req *)0)->impl),
               "lp_comm_req.impl too small for an MPI_Request");
_Static_assert(_Alignof(mpi_req) <= _Alignof(long long),
               "lp_comm_req.impl not aligned for an MPI_Request");

static mpi_req *mr(lp_comm_req *r) { return (mpi_req *)(void *)&r->impl; }
static MPI_Request *mreq(lp_comm_req *r) { return &mr(r)->q; }

static MPI_Comm mcomm(lp_comm *c) {
  return c->impl ? ((mpi_ctx *)c->impl)->comm : g.comm;
}

/* ---- the progress thread ---- */

/* One more (+1) or one fewer (-1) operation pending; wakes the thread. */
static void pending_add(int d) {
  if (!g.thread_on) return;
  pthread_mutex_lock(&g.mu);
  g.pending += d;
  if (d > 0) g.last_start = lp_now();
  if (d > 0 && g.pending == 1) pthread_cond_signal(&g.cv);
  pthread_mutex_unlock(&g.mu);
}

/* While operations are pending: let MPI progress (MPI_Iprobe runs Open
 * MPI's progress engine, which moves point-to-point fragments and the
 * schedules of non-blocking collectives), then sleep ~50 us. Otherwise
 * sleep on the condition variable: an idle rank costs nothing. */
/* Posts the deferred sends whose time has come, in queue order (under
 * g.mu); returns the earliest time still waited for (0: none). */
static double post_due_sends(double now) {
  double next = 0;
  for (deferred **pp = &g.deferred; *pp;) {
    deferred *d = *pp;
    if (d->due > now) {
      if (next == 0 || d->due < next) next = d->due;
      pp = &d->next;
      continue;
    }
    mpi_req *m = (mpi_req *)(void *)&d->r->impl;
    m->post_rc = MPI_Isend(d->buf, d->count, d->type, d->peer, d->tag, d->comm, &m->q);
    m->deferred = 0;
    *pp = d->next;
    lp_free(d);
  }
  return next;
}

/* While operations are pending: posts due deferred sends, lets MPI
 * progress (MPI_Iprobe runs Open MPI's progress engine, which moves
 * point-to-point fragments and the schedules of non-blocking collectives),
 * then naps: 50 us during the first 5 ms after an operation started (when
 * transfers need driving), 200 us until 50 ms, then 1 ms (a receive posted
 * long before its message costs next to nothing; ~5% of a core at a
 * constant 50 us); never past a deferred send's time. Otherwise sleeps on
 * the condition variable: an idle rank costs nothing. */
static void *progress_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g.mu);
  for (;;) {
    while (!g.stop && g.pending <= 0) pthread_cond_wait(&g.cv, &g.mu);
    if (g.stop) break;
    double now = lp_now();
    double next = g.deferred ? post_due_sends(now) : 0;
    double since = now - g.last_start;
    pthread_mutex_unlock(&g.mu);
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, g.progress_comm, &flag,
               MPI_STATUS_IGNORE);
    double nap = since < 5e-3 ? 50e-6 : since < 50e-3 ? 200e-6 : 1e-3;
    if (next > 0 && next - now < nap) nap = next - now > 0 ? next - now : 0;
    lp_sleep_until(now + nap);
    pthread_mutex_lock(&g.mu);
  }
  while (g.deferred) { /* shutting down: never posted */
    deferred *d = g.deferred;
    g.deferred = d->next;
    lp_free(d);
  }
  pthread_mutex_unlock(&g.mu);
  return NULL;
}

/* Queues a send for the progress thread at r->arrival, but not before a
 * queued send to the same peer (MPI's order between them stays). */
static lp_status defer_send(lp_comm *c, const void *buf, size_t count,
                            lp_comm_dtype dt, int peer, int tag, lp_comm_req *r) {
  deferred *d = lp_malloc(sizeof *d);
  if (!d) {
    lp_errf(c->err, "out of memory");
    return LP_ERR_NOMEM;
  }
  *d = (deferred){NULL, r, buf, (int)count, peer, tag,
                  dt == LP_COMM_DOUBLE ? MPI_DOUBLE : MPI_FLOAT, mcomm(c), r->arrival};
  mr(r)->q = MPI_REQUEST_NULL;
  mr(r)->post_rc = MPI_SUCCESS;
  pthread_mutex_lock(&g.mu);
  deferred **pp = &g.deferred;
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->peer == peer && (*pp)->comm == d->comm && (*pp)->due > d->due)
      d->due = (*pp)->due;
  *pp = d;
  mr(r)->deferred = 1;
  g.pending++;
  g.last_start = lp_now();
  pthread_cond_signal(&g.cv);
  pthread_mutex_unlock(&g.mu);
  return LP_OK;
}

/* For a send: 1 while still queued; *rc the deferred post's MPI result. */
static int still_deferred(lp_comm_req *r, int *rc) {
  *rc = MPI_SUCCESS;
  if (!g.thread_on || r->op != COMM_OP_SEND) return 0;
  pthread_mutex_lock(&g.mu);
  int q = mr(r)->deferred;
  *rc = mr(r)->post_rc;
  pthread_mutex_unlock(&g.mu);
  return q;
}

/* Takes a queued send back (cancel); 1 when it was still queued. */
static int undefer(lp_comm_req *r) {
  if (!g.thread_on || r->op != COMM_OP_SEND) return 0;
  int found = 0;
  pthread_mutex_lock(&g.mu);
  for (deferred **pp = &g.deferred; *pp; pp = &(*pp)->next) {
    if ((*pp)->r == r) {
      deferred *d = *pp;
      *pp = d->next;
      lp_free(d);
      mr(r)->deferred = 0;
      g.pending--;
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&g.mu);
  return found;
}

static void progress_start(void) {
  if (g.provided < MPI_THREAD_MULTIPLE || !lp_env_int("LUAPIPE_COMM_THREAD", 1))
    return;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &g.progress_comm) != MPI_SUCCESS) return;
  g.stop = 0;
  g.pending = 0;
  g.thread_on = pthread_create(&g.thread, NULL, progress_main, NULL) == 0;
  if (!g.thread_on) MPI_Comm_free(&g.progress_comm);
}

static void progress_stop(void) {
  if (!g.thread_on) return;
  pthread_mutex_lock(&g.mu);
  g.stop = 1;
  pthread_cond_signal(&g.cv);
  pthread_mutex_unlock(&g.mu);
  pthread_join(g.thread, NULL);
  g.thread_on = 0;
  MPI_Comm_free(&g.progress_comm);
}

int lp_comm_progress_thread(void) { return g.thread_on; }

static MPI_Datatype mtype(lp_comm_dtype dt) {
  return dt == LP_COMM_DOUBLE ? MPI_DOUBLE : MPI_FLOAT;
}

/* Writes "<what>: <MPI error text>" into the context; LP_ERR_COMM. */
static lp_status mpi_fail(lp_comm *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static lp_status mpi_fail(lp_comm *c, int rc, const char *fmt, ...) {
  char what[LP_ERRLEN / 2], estr[MPI_MAX_ERROR_STRING];
  int len = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (MPI_Error_string(rc, estr, &len) != MPI_SUCCESS)
    snprintf(estr, sizeof estr, "MPI error %d", rc);
  lp_errf(c->err, "%s: %s", what, estr);
  return LP_ERR_COMM;
}

static lp_status check_count(lp_comm *c, size_t count, const char *what) {
  if (count > INT_MAX) {
    lp_errf(c->err, "%s of %zu elements exceeds the MPI count limit (%d)", what,
            count, INT_MAX);
    return LP_ERR_ARG;
  }
  return LP_OK;
}

static lp_status mpi_isend(lp_comm *c, const void *buf, size_t count,
                           lp_comm_dtype dt, int peer, int tag,
                           lp_comm_req *req) {
  LP_CHECK(check_count(c, count, "send"));
  if (g.thread_on && req->arrival > 0) /* the link: post it when it arrives */
    return defer_send(c, buf, count, dt, peer, tag, req);
  int rc = MPI_Isend(buf, (int)count, mtype(dt), peer, tag, mcomm(c), mreq(req));
  if (rc != MPI_SUCCESS)
    return mpi_fail(c, rc, "send of %zu %s to rank %d (tag %d) from rank %d",
                    count, comm_dtype_name(dt, count), peer, tag, c->rank);
  pending_add(1);
  return LP_OK;
}

static lp_status mpi_irecv(lp_comm *c, void *buf, size_t count,
                           lp_comm_dtype dt, int peer, int tag,
                           lp_comm_req *req) {
  LP_CHECK(check_count(c, count, "receive"));
  if (g.thread_on) req->arrival = 0; /* senders post at their arrival time */
  int rc = MPI_Irecv(buf, (int)count, mtype(dt), peer, tag, mcomm(c), mreq(req));
  if (rc != MPI_SUCCESS)
    return mpi_fail(c, rc, "receive of %zu %s from rank %d (tag %d) on rank %d",
                    count, comm_dtype_name(dt, count), peer, tag, c->rank);
  pending_add(1);
  return LP_OK;
}

static lp_status mpi_iallreduce(lp_comm *c, void *buf, size_t count,
                                lp_comm_dtype dt, lp_comm_req *req) {
  LP_CHECK(check_count(c, count, "all-reduce"));
  int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, mtype(dt), MPI_SUM,
                          mcomm(c), mreq(req));
  if (rc != MPI_SUCCESS)
    return mpi_fail(c, rc, "all-reduce of %zu %s on rank %d", count,
                    comm_dtype_name(dt, count), c->rank);
  pending_add(1);
  return LP_OK;
}

static lp_status mpi_ireduce_scatter(lp_comm *c, const float *send, float *recv,
                                     size_t shard, lp_comm_req *req) {
  LP_CHECK(check_count(c, shard * (size_t)c->size, "reduce-scatter"));
  int rc = MPI_Ireduce_scatter_block(send, recv, (int)shard, MPI_FLOAT, MPI_SUM, mcomm(c),
                                     mreq(req));
  if (rc != MPI_SUCCESS)
    return mpi_fail(c, rc, "reduce-scatter of %zu floats per rank on rank %d", shard, c->rank);
  pending_add(1);
  return LP_OK;
}

static lp_status mpi_ibarrier(lp_comm *c, lp_comm_req *req) {
  int rc = MPI_Ibarrier(mcomm(c), mreq(req));
  if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "barrier on rank %d", c->rank);
  pending_add(1);
  return LP_OK;
}

static lp_status mpi_ibcast(lp_comm *c, void *buf, size_t bytes, int root,
                            lp_comm_req *req) {
  LP_CHECK(check_count(c, bytes, "broadcast"));
  int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, mcomm(c), mreq(req));
  if (rc != MPI_SUCCESS)
    return mpi_fail(c, rc, "broadcast of %zu bytes from rank %d on rank %d",
                    bytes, root, c->rank);
  pending_add(1);
  return LP_OK;
}

static lp_status mpi_iallgather(lp_comm *c, const void *send, size_t bytes,
                                void *recv, lp_comm_req *req) {
  LP_CHECK(check_count(c, bytes, "all-gather"));
  static char none_in, none_out; /* valid pointers when nothing moves */
  int rc = MPI_Iallgather(bytes ? send : &none_in, (int)bytes, MPI_BYTE,
                          bytes ? recv : &none_out, (int)bytes, MPI_BYTE,
                          mcomm(c), mreq(req));
  if (rc != MPI_SUCCESS)
    return mpi_fail(c, rc, "all-gather of %zu bytes per rank on rank %d", bytes,
                    c->rank);
  pending_add(1);
  return LP_OK;
}

/* Copies n size_t counts into ints for MPI; LP_ERR_ARG past INT_MAX. */
static lp_status to_ints(lp_comm *c, const size_t *v, int *out, const char *what) {
  for (int p = 0; p < c->size; p++) {
    if (v[p] > INT_MAX) {
      lp_errf(c->err,
              "all-to-all-v on rank %d: %s %zu for rank %d exceeds the MPI "
              "count limit (%d floats; MPI_Ialltoallv takes int counts)",
              c->rank, what, v[p], p, INT_MAX);
      return LP_ERR_ARG;
    }
    out[p] = (int)v[p];
  }
  return LP_OK;
}

static lp_status mpi_ialltoallv(lp_comm *c, const float *send,
                                const size_t *send_counts,
                                const size_t *send_displs, float *recv,
                                const size_t *recv_counts,
                                const size_t *recv_displs, lp_comm_req *req) {
  int n = c->size;
  int *a = lp_malloc(4 * (size_t)n * sizeof(int));
  if (!a) {
    lp_errf(c->err, "out of memory");
    return LP_ERR_NOMEM;
  }
  lp_status st = to_ints(c, send_counts, a, "send count");
  if (st == LP_OK) st = to_ints(c, send_displs, a + n, "send displacement");
  if (st == LP_OK) st = to_ints(c, recv_counts, a + 2 * n, "receive count");
  if (st == LP_OK) st = to_ints(c, recv_displs, a + 3 * n, "receive displacement");
  if (st != LP_OK) {
    lp_free(a);
    return st;
  }
  /* MPI wants valid pointers even when nothing moves */
  static float none;
  int rc = MPI_Ialltoallv(send ? send : &none, a, a + n, MPI_FLOAT,
                          recv ? recv : &none, a + 2 * n, a + 3 * n, MPI_FLOAT,
                          mcomm(c), mreq(req));
  if (rc != MPI_SUCCESS) {
    lp_free(a);
    return mpi_fail(c, rc, "all-to-all-v on rank %d (%d ranks)", c->rank, n);
  }
  mr(req)->arrays = a;
  pending_add(1);
  return LP_OK;
}

static void mpi_destroy(lp_comm *c) {
  mpi_ctx *m = c->impl;
  if (!m) return;
  int done = 0;
  MPI_Finalized(&done);
  if (!done && !g.finalized) MPI_Comm_free(&m->comm);
  lp_free(m);
}

static const lp_comm_backend comm_mpi_backend;

static lp_status mpi_split(lp_comm *c, int color, int key, lp_comm **out) {
  mpi_ctx *m = lp_malloc(sizeof *m);
  if (!m) {
    lp_errf(c->err, "out of memory");
    return LP_ERR_NOMEM;
  }
  int rc = MPI_Comm_split(mcomm(c), color, key, &m->comm);
  if (rc != MPI_SUCCESS) {
    lp_free(m);
    return mpi_fail(c, rc, "split on rank %d (color %d, key %d)", c->rank,
                    color, key);
  }
  MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(m->comm, &rank);
  MPI_Comm_size(m->comm, &size);
  lp_status st = lp_comm_new(&comm_mpi_backend, rank, size, c->tag_ub, m, out);
  if (st != LP_OK) {
    MPI_Comm_free(&m->comm);
    lp_free(m);
    lp_errf(c->err, "out of memory");
  }
  return st;
}

static lp_status mpi_test(lp_comm *c, lp_comm_req *r, int *done) {
  MPI_Status st;
  int flag = 0, rc;
  if (still_deferred(r, &rc)) {
    *done = 0;
    return LP_OK;
  }
  if (rc == MPI_SUCCESS) rc = MPI_Test(mreq(r), &flag, &st);
  if (rc != MPI_SUCCESS || flag) {
    pending_add(-1);
    lp_free(mr(r)->arrays);
    mr(r)->arrays = NULL;
  }
  const char *ty = comm_dtype_name(r->dtype, r->count);
  if (rc != MPI_SUCCESS) {
    *done = 1;
    int cls = 0;
    MPI_Error_class(rc, &cls);
    if (r->op == COMM_OP_RECV && cls == MPI_ERR_TRUNCATE) {
      lp_errf(c->err,
              "rank %d sent more than the %zu %s rank %d expected (tag %d)",
              r->peer, r->count, ty, c->rank, r->tag);
      return LP_ERR_COMM;
    }
    switch (r->op) {
    case COMM_OP_SEND:
      return mpi_fail(c, rc, "send of %zu %s to rank %d (tag %d) from rank %d",
                      r->count, ty, r->peer, r->tag, c->rank);
    case COMM_OP_RECV:
      return mpi_fail(c, rc, "receive of %zu %s from rank %d (tag %d) on rank %d",
                      r->count, ty, r->peer, r->tag, c->rank);
    case COMM_OP_ALLTOALLV:
      return mpi_fail(c, rc, "all-to-all-v on rank %d (%d ranks)", c->rank,
                      c->size);
    default:
      return mpi_fail(c, rc, "collective operation on rank %d", c->rank);
    }
  }
  *done = flag;
  if (flag && r->op == COMM_OP_RECV) {
    int got = 0;
    MPI_Get_count(&st, mtype(r->dtype), &got);
    if (got < 0 || (size_t)got != r->count) {
      lp_errf(c->err, "rank %d sent %d %s (tag %d) but rank %d expected %zu",
              r->peer, got, comm_dtype_name(r->dtype, (size_t)got), r->tag,
              c->rank, r->count);
      return LP_ERR_COMM;
    }
  }
  return LP_OK;
}

/* Point-to-point: cancel, then give it a moment to finish; a send MPI cannot
 * take back is freed (it completes in the background). Collectives cannot
 * be cancelled: they are abandoned and MPI_Finalize is skipped later, since
 * it could hang on them (the job must be aborted anyway). */
static void mpi_cancel(lp_comm *c, lp_comm_req *r) {
  (void)c;
  if (undefer(r)) return;
  MPI_Request *q = mreq(r);
  if (*q == MPI_REQUEST_NULL) {
    if (mr(r)->post_rc != MPI_SUCCESS) pending_add(-1); /* a failed post */
    return;
  }
  pending_add(-1);
  if (r->op != COMM_OP_SEND && r->op != COMM_OP_RECV) {
    g.broken = 1; /* MPI may still read an all-to-all-v's arrays: kept */
    return;
  }
  MPI_Cancel(q);
  double until = lp_now() + 0.1;
  int flag = 0;
  while (!flag && lp_now() < until) {
    if (MPI_Test(q, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
  }
  if (!flag && *q != MPI_REQUEST_NULL) MPI_Request_free(q);
}

static void mpi_abort(lp_comm *c, int code) {
  (void)c;
  g.aborted = 1;
  MPI_Abort(MPI_COMM_WORLD, code);
  _exit(code);
}

static const lp_comm_backend comm_mpi_backend = {
    .name = "mpi",
    .any_order = 1,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .iallreduce_sum = mpi_iallreduce,
    .ibarrier = mpi_ibarrier,
    .ireduce_scatter_sum = mpi_ireduce_scatter,
    .ibcast = mpi_ibcast,
    .ialltoallv = mpi_ialltoallv,
    .iallgather = mpi_iallgather,
    .split = mpi_split,
    .test = mpi_test,
    .cancel = mpi_cancel,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
};

/* ---- bootstrap ---- */

static int launched_by_mpirun(void) {
  static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return 1;
  }
  return 0;
}

lp_status lp_comm_mpi_init(int *argc, char ***argv) {
  lp_link link;
  char err[LP_ERRLEN];
  if (lp_comm_link_from_env(&link, err) != LP_OK) {
    fprintf(stderr, "luapipe: %s\n", err);
    return LP_ERR_PARSE;
  }
  if (g.started || !launched_by_mpirun()) return LP_OK;
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    /* Open MPI's MPI_Finalize waits for every rank (a PMIx fence); when a
     * rank aborts while others sit in that fence, mpirun (4.1 with an
     * external PMIx) can deadlock in its own teardown. Ranks that are done
     * leave at once instead, unless the user chose otherwise. */
    setenv("OMPI_MCA_async_mpi_finalize", "1", 0);
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &g.provided);
    if (rc != MPI_SUCCESS) {
      fprintf(stderr, "luapipe: MPI_Init_thread failed (error %d)\n", rc);
      return LP_ERR_COMM;
    }
  }
  g.started = 1;
  MPI_Query_thread(&g.provided); /* also right when MPI was started elsewhere */
  int rank = 0, size = 1, flag = 0, *ub = NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &g.comm);
  MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(g.comm, &rank);
  MPI_Comm_size(g.comm, &size);
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  comm_init(&g.ctx, &comm_mpi_backend, rank, size, flag && ub ? *ub : 32767, NULL);
  g.ctx.is_world = 1;
  comm_set_world(&g.ctx);
  progress_start();
  atexit(lp_comm_mpi_finalize);
  lp_log(LP_LOG_DEBUG, "comm: rank %d of %d on MPI (thread level %d, progress thread %s)",
         rank, size, g.provided, g.thread_on ? "on" : "off");
  return LP_OK;
}

void lp_comm_mpi_finalize(void) {
  if (!g.started || g.finalized || g.aborted) return;
  g.finalized = 1;
  comm_set_world(NULL); /* from here on the process is alone */
  progress_stop();
  if (g.broken) return; /* MPI_Finalize could wait forever on the collective */
  int done = 0;
  MPI_Finalized(&done);
  if (done) return;
  MPI_Comm_free(&g.comm);
  MPI_Finalize();
}

int lp_comm_mpi_active(void) { return g.started && !g.finalized; }
