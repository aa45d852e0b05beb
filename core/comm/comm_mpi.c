/* comm_mpi.c — the "mpi" backend (Open MPI) and the bootstrap the host
 * calls. Every operation is non-blocking (MPI_Isend, MPI_Iallreduce,
 * MPI_Ibarrier, ...) so comm.c's watchdog can bound every wait. The world
 * context works on a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN.
 * The only file in core/ that includes mpi.h. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <mpi.h>
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
} g;

_Static_assert(sizeof(MPI_Request) <= sizeof(((lp_comm_req *)0)->impl),
               "lp_comm_req.impl too small for an MPI_Request");
_Static_assert(_Alignof(MPI_Request) <= _Alignof(long long),
               "lp_comm_req.impl not aligned for an MPI_Request");

static MPI_Request *mreq(lp_comm_req *r) { return (MPI_Request *)(void *)&r->impl; }

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
  if (MPI_Error_string(rc, estr, &len) != MPI_SUCCESS) snprintf(estr, sizeof estr, "MPI error %d", rc);
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
  int rc = MPI_Isend(buf, (int)count, mtype(dt), peer, tag, g.comm, mreq(req));
  if (rc != MPI_SUCCESS)
    return mpi_fail(c, rc, "send of %zu %s to rank %d (tag %d) from rank %d",
                    count, comm_dtype_name(dt, count), peer, tag, c->rank);
  return LP_OK;
}

static lp_status mpi_irecv(lp_comm *c, void *buf, size_t count,
                           lp_comm_dtype dt, int peer, int tag,
                           lp_comm_req *req) {
  LP_CHECK(check_count(c, count, "receive"));
  int rc = MPI_Irecv(buf, (int)count, mtype(dt), peer, tag, g.comm, mreq(req));
  if (rc != MPI_SUCCESS)
    return mpi_fail(c, rc, "receive of %zu %s from rank %d (tag %d) on rank %d",
                    count, comm_dtype_name(dt, count), peer, tag, c->rank);
  return LP_OK;
}

static lp_status mpi_iallreduce(lp_comm *c, void *buf, size_t count,
                                lp_comm_dtype dt, lp_comm_req *req) {
  LP_CHECK(check_count(c, count, "all-reduce"));
  int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, mtype(dt), MPI_SUM,
                          g.comm, mreq(req));
  if (rc != MPI_SUCCESS)
    return mpi_fail(c, rc, "all-reduce of %zu %s on rank %d", count,
                    comm_dtype_name(dt, count), c->rank);
  return LP_OK;
}

static lp_status mpi_ibarrier(lp_comm *c, lp_comm_req *req) {
  int rc = MPI_Ibarrier(g.comm, mreq(req));
  if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "barrier on rank %d", c->rank);
  return LP_OK;
}

static lp_status mpi_ibcast(lp_comm *c, void *buf, size_t bytes, int root,
                            lp_comm_req *req) {
  LP_CHECK(check_count(c, bytes, "broadcast"));
  int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, g.comm, mreq(req));
  if (rc != MPI_SUCCESS)
    return mpi_fail(c, rc, "broadcast of %zu bytes from rank %d on rank %d",
                    bytes, root, c->rank);
  return LP_OK;
}

static lp_status mpi_test(lp_comm *c, lp_comm_req *r, int *done) {
  MPI_Status st;
  int flag = 0;
  int rc = MPI_Test(mreq(r), &flag, &st);
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
  MPI_Request *q = mreq(r);
  if (*q == MPI_REQUEST_NULL) return;
  if (r->op != COMM_OP_SEND && r->op != COMM_OP_RECV) {
    g.broken = 1;
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
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .iallreduce_sum = mpi_iallreduce,
    .ibarrier = mpi_ibarrier,
    .ibcast = mpi_ibcast,
    .test = mpi_test,
    .cancel = mpi_cancel,
    .abort = mpi_abort,
    .destroy = NULL,
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
  if (g.started || !launched_by_mpirun()) return LP_OK;
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    /* Open MPI's MPI_Finalize waits for every rank (a PMIx fence); when a
     * rank aborts while others sit in that fence, mpirun (4.1 with an
     * external PMIx) can deadlock in its own teardown. Ranks that are done
     * leave at once instead, unless the user chose otherwise. */
    setenv("OMPI_MCA_async_mpi_finalize", "1", 0);
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &g.provided);
    if (rc != MPI_SUCCESS) {
      fprintf(stderr, "luapipe: MPI_Init_thread failed (error %d)\n", rc);
      return LP_ERR_COMM;
    }
  }
  g.started = 1;
  int rank = 0, size = 1, flag = 0, *ub = NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &g.comm);
  MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(g.comm, &rank);
  MPI_Comm_size(g.comm, &size);
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  comm_init(&g.ctx, &comm_mpi_backend, rank, size, flag && ub ? *ub : 32767, NULL);
  g.ctx.is_world = 1;
  comm_set_world(&g.ctx);
  atexit(lp_comm_mpi_finalize);
  lp_log(LP_LOG_DEBUG, "comm: rank %d of %d on MPI (thread level %d)", rank,
         size, g.provided);
  return LP_OK;
}

void lp_comm_mpi_finalize(void) {
  if (!g.started || g.finalized || g.aborted) return;
  g.finalized = 1;
  comm_set_world(NULL); /* from here on the process is alone */
  if (g.broken) return; /* MPI_Finalize could wait forever on the collective */
  int done = 0;
  MPI_Finalized(&done);
  if (done) return;
  MPI_Comm_free(&g.comm);
  MPI_Finalize();
}

int lp_comm_mpi_active(void) { return g.started && !g.finalized; }
