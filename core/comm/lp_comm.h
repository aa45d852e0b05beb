/* lp_comm.h — the communication layer the executor runs schedules over: one
 * context type (lp_comm) in front of a backend vtable (Redis-engine style).
 * Point-to-point isend/irecv of float buffers, all-reduce, all-to-all-v,
 * all-gather, barrier, broadcast, split, abort; every wait has a watchdog deadline
 * (LUAPIPE_TIMEOUT): a wait past it returns LP_ERR_TIMEOUT with a message
 * naming rank, operation and peer, and lp_comm_on_failure holds the job's
 * policy (a timeout ends every rank). Backends: "self" (one process, no
 * MPI), "mpi" (comm_mpi.c, the only file besides the host bootstrap that
 * sees mpi.h), "nccl" (comm_nccl.c, device buffers; comm_nccl_stub.c
 * without NCCL) and "mpi-staged" (comm_staged.c: device buffers through
 * pinned host memory over an MPI context); the device ones through
 * lp_comm_gpu.h. Depends on lp_base. */
#pragma once

#include <stddef.h>

#include "lp_base.h"

typedef struct lp_comm lp_comm;         /* a communicator: rank, size, backend */
typedef struct lp_comm_req lp_comm_req; /* one pending operation */

typedef enum lp_comm_dtype { LP_COMM_FLOAT, LP_COMM_DOUBLE } lp_comm_dtype;

/* ---- the backend vtable ---------------------------------------------------
 * The generic layer (comm.c) checks arguments (peer in range and not this
 * rank, tag in 0..tag_ub, counts), allocates the request and fills in what
 * the watchdog reports; a backend only starts and polls operations. Every
 * start function fills req (see comm_internal.h) and returns LP_OK, or
 * writes the context's error text and returns a status (then req is
 * released without calling cancel). isend / irecv find req->arrival set to
 * the emulated link's modelled arrival (0: no link): a backend may realise
 * the link itself by posting a send only at that time (keeping the order
 * of messages to one peer) and then clears a receive's req->arrival (the
 * data already comes late); otherwise comm.c bounds both sides. */
typedef struct lp_comm_backend {
  const char *name; /* "self", "mpi", "nccl" */
  /* 1 when operations on different contexts of this backend complete
   * whatever order the ranks started them in (MPI: every communicator
   * progresses on its own; self). 0 (NCCL: kernels of one device queue
   * behind each other) means every rank must start them in one order. */
  int any_order;
  lp_status (*isend)(lp_comm *c, const void *buf, size_t count, lp_comm_dtype dt,
                     int peer, int tag, lp_comm_req *req);
  lp_status (*irecv)(lp_comm *c, void *buf, size_t count, lp_comm_dtype dt,
                     int peer, int tag, lp_comm_req *req);
  lp_status (*iallreduce_sum)(lp_comm *c, void *buf, size_t count,
                              lp_comm_dtype dt, lp_comm_req *req);
  lp_status (*ibarrier)(lp_comm *c, lp_comm_req *req);
  /* Reduce-scatter of floats: send holds size x shard floats, recv gets
   * the sum of every rank's piece `rank` (shard floats). Optional (NULL):
   * comm.c then does it with an all-reduce (the same sums; more bytes
   * moved). */
  lp_status (*ireduce_scatter_sum)(lp_comm *c, const float *send, float *recv,
                                   size_t shard, lp_comm_req *req);
  lp_status (*ibcast)(lp_comm *c, void *buf, size_t bytes, int root,
                      lp_comm_req *req);
  /* Starts an all-gather of `bytes` bytes per rank (checked by comm.c):
   * rank r's send lands at recv + r * bytes on every rank; send and recv
   * do not overlap. */
  lp_status (*iallgather)(lp_comm *c, const void *send, size_t bytes,
                          void *recv, lp_comm_req *req);
  /* Starts an all-to-all-v of floats over c (arguments already checked by
   * comm.c: lp_comm_size(c) entries each, displacements filled in, the
   * self piece's send and receive counts equal). The self piece is a local
   * copy. The four arrays are only valid during the call: a backend copies
   * what it needs until completion (MPI: int copies). May be NULL: then
   * lp_comm_ialltoallv answers LP_ERR_UNSUPPORTED. */
  lp_status (*ialltoallv)(lp_comm *c, const float *send,
                          const size_t *send_counts, const size_t *send_displs,
                          float *recv, const size_t *recv_counts,
                          const size_t *recv_displs, lp_comm_req *req);
  /* Collective over c: a new context of the ranks with the same color
   * (>= 0), ordered by (key, rank in c), made with lp_comm_new (the generic
   * layer then copies timeout and link into it). Called only after a
   * barrier over c under the watchdog, so every rank has arrived. May be
   * NULL (LP_ERR_UNSUPPORTED). */
  lp_status (*split)(lp_comm *c, int color, int key, lp_comm **out);
  /* *done = 1 once req finished; LP_OK, or an error (text in the context)
   * when the operation failed (the request is then finished too). */
  lp_status (*test)(lp_comm *c, lp_comm_req *req, int *done);
  /* Cancels an unfinished request and releases what the backend holds. */
  void (*cancel)(lp_comm *c, lp_comm_req *req);
  /* Takes every rank of the job down with exit code `code`; never returns. */
  void (*abort)(lp_comm *c, int code);
  /* Releases the backend state of the context (not the context itself). */
  void (*destroy)(lp_comm *c);
} lp_comm_backend;

/* ---- contexts ------------------------------------------------------------ */

/* The process's communicator: the MPI world when lp_comm_mpi_init started
 * MPI, otherwise a "self" context (rank 0 of 1). Never NULL; owned by the
 * library (lp_comm_free ignores it). */
lp_comm *lp_comm_world(void);
/* A new stand-alone "self" context (rank 0 of 1) in *out; the caller frees
 * it with lp_comm_free. LP_ERR_NOMEM on allocation failure. */
lp_status lp_comm_self_new(lp_comm **out);
/* A new context for backend `be` (which a backend file calls when it sets
 * one up): rank of size ranks, tags 0..tag_ub, backend state `impl` (given
 * back by lp_comm_backend_state and released by be->destroy). */
lp_status lp_comm_new(const lp_comm_backend *be, int rank, int size, int tag_ub,
                      void *impl, lp_comm **out);
void *lp_comm_backend_state(lp_comm *c);
/* Frees a context made by lp_comm_self_new / lp_comm_new (calls the
 * backend's destroy); NULL and the world are ignored. */
void lp_comm_free(lp_comm *c);

int lp_comm_rank(const lp_comm *c);
int lp_comm_size(const lp_comm *c);
const char *lp_comm_backend_name(const lp_comm *c); /* "self", "mpi", "nccl", "mpi-staged" */
/* Largest tag usable with isend/irecv (at least 32767). */
int lp_comm_tag_ub(const lp_comm *c);
/* Text of the last failure on this context ("" when none). Fixed buffer,
 * valid until the next failing call. */
const char *lp_comm_last_error(const lp_comm *c);

/* Watchdog limit in seconds for every wait on this context. Starts as
 * LUAPIPE_TIMEOUT (default 300); seconds <= 0 waits forever. */
void lp_comm_set_timeout(lp_comm *c, double seconds);
double lp_comm_timeout(const lp_comm *c);

/* ---- emulated link --------------------------------------------------------
 * A context can model a slower link than the one it runs on (to measure
 * how much communication a schedule hides on a machine whose real link is
 * shared memory). It starts as LUAPIPE_LINK (lp_link_parse syntax, e.g.
 * "lat=50us,bw=2GB/s"; unset: none) and split contexts inherit it. The
 * model, with T(B) = latency + B / bandwidth (lp_link_time):
 *  - a send of n floats is not reported complete before start + T(4n),
 *    and the receiver gets it no earlier than that: the MPI backend (with
 *    its progress thread) posts the real send at start + T(4n) and keeps
 *    the order of messages to one peer (a message never overtakes an
 *    earlier one to the same rank: its time is at least the earlier one's).
 *    Set the same link on both sides (LUAPIPE_LINK does);
 *  - without that (no progress thread, other backends) a receive of n
 *    floats is not reported complete before it was posted + T(4n): the
 *    receiver cannot see the sender's clock, so when the send starts d s
 *    after the receive is posted this bound is early by min(d, T);
 *  - an all-to-all-v not before start + T(max(bytes out, bytes in)), where
 *    out / in count only the pieces to / from other ranks (each rank's
 *    link serialises its own traffic, both directions at once; the self
 *    piece is a local copy and free; no traffic at all costs nothing:
 *    lp_link_alltoallv_time). Its start is this rank's: a peer that joins
 *    d s later delays the real completion by d, but the bound does not
 *    add T to the peer's start (collectives are never deferred: that could
 *    reorder them);
 *  - all-reduce, barrier and broadcast are not delayed.
 * "Start" is the lp_now() of the isend / irecv / ialltoallv call, so a
 * message started before the caller computes arrives while it computes.
 * Completion is also never reported before the real transfer finished.
 * Waiting for the modelled time sleeps (no core is spun). */
void lp_comm_set_link(lp_comm *c, const lp_link *link); /* NULL: none */
const lp_link *lp_comm_link(const lp_comm *c);
/* Reads LUAPIPE_LINK into *out (zero link when unset); LP_ERR_PARSE with
 * "LUAPIPE_LINK: link '...': ..." in err (LP_ERRLEN) when it is malformed. */
lp_status lp_comm_link_from_env(lp_link *out, char *err);

/* ---- sub-communicators ----------------------------------------------------
 * Like MPI_Comm_split, collective over c: the ranks passing the same color
 * (>= 0) form one new context, ordered by key then by rank in c. Used for
 * the pipeline x expert grid (EP group = ranks of one pipeline stage, PP
 * group = ranks with one EP index). The new context inherits c's timeout
 * and link and works with every call of this header (point to point,
 * collectives, all-to-all-v); free it with lp_comm_free before the MPI
 * shutdown. Self backend: a new self context. Every rank first meets in a
 * barrier under the watchdog, so a rank that never joins gives a timeout
 * ("... in a barrier on rank R (N ranks): splitting the communicator ...")
 * instead of a hang. LP_ERR_ARG for a negative color. */
lp_status lp_comm_split(lp_comm *c, int color, int key, lp_comm **out);

/* ---- point to point ------------------------------------------------------
 * Start sending / receiving n floats to / from rank `peer` with tag `tag`;
 * *req gets the request, which the caller finishes with lp_comm_wait,
 * lp_comm_waitall or lp_comm_test, or drops with lp_comm_cancel. The buffer
 * must stay untouched until then. A peer equal to this rank, a peer out of
 * range or a tag outside 0..tag_ub is LP_ERR_ARG. A receive of a message
 * with a different length fails (LP_ERR_COMM) when it completes. */
lp_status lp_comm_isend(lp_comm *c, const float *buf, size_t n, int peer,
                        int tag, lp_comm_req **req);
lp_status lp_comm_irecv(lp_comm *c, float *buf, size_t n, int peer, int tag,
                        lp_comm_req **req);

/* Polls *req: *done = 1 when it has finished, and then *req is released and
 * set to NULL. Returns the operation's failure if it failed (the request is
 * released as well). A NULL *req counts as done. */
lp_status lp_comm_test(lp_comm *c, lp_comm_req **req, int *done);
/* Waits for *req under the watchdog. LP_OK: finished, *req released and set
 * to NULL. LP_ERR_TIMEOUT: the limit passed; *req stays pending (wait again
 * or cancel it) and the error text names this rank, the operation, the peer,
 * the tag and `what` (caller's words, e.g. "action 14 (5B3) waits for RECV_B
 * from rank 3"; may be NULL). Other errors release the request. */
lp_status lp_comm_wait(lp_comm *c, lp_comm_req **req, const char *what);
/* Waits for all n requests (NULL entries are skipped) under one deadline;
 * each finished one is released and set to NULL. On timeout the message
 * names the first unfinished request. */
lp_status lp_comm_waitall(lp_comm *c, lp_comm_req **reqs, int n,
                          const char *what);
/* Cancels and releases *req (no-op when NULL); sets *req to NULL. */
void lp_comm_cancel(lp_comm *c, lp_comm_req **req);

/* Blocking send / receive: isend / irecv followed by lp_comm_wait. On
 * failure no request is left behind. */
lp_status lp_comm_send(lp_comm *c, const float *buf, size_t n, int peer,
                       int tag, const char *what);
lp_status lp_comm_recv(lp_comm *c, float *buf, size_t n, int peer, int tag,
                       const char *what);

/* ---- collectives (every rank calls them in the same order) ---------------
 * Blocking, under the watchdog; `what` describes the caller for the
 * timeout message (may be NULL). A started collective cannot be cancelled:
 * after LP_ERR_TIMEOUT the context is unusable; return the status up to
 * lp_comm_on_failure, which ends the job (the MPI backend also skips
 * MPI_Finalize then, which could wait on it forever). */
lp_status lp_comm_allreduce_sum_float(lp_comm *c, float *buf, size_t n,
                                      const char *what);
lp_status lp_comm_allreduce_sum_double(lp_comm *c, double *buf, size_t n,
                                       const char *what);
lp_status lp_comm_barrier(lp_comm *c, const char *what);
/* Nonblocking all-reduce (sum) of n floats in place: *req finishes as any
 * request (lp_comm_wait / _test / _waitall under the watchdog); buf stays
 * untouched until then; like every collective it cannot be cancelled once
 * started. On an emulated link it arrives no earlier than
 * lp_link_allreduce_time after its start (a ring over the context's
 * ranks). For sums that overlap with other work (a DP group's gradient
 * buckets). */
lp_status lp_comm_iallreduce_sum_float(lp_comm *c, float *buf, size_t n,
                                       lp_comm_req **req);
/* Reduce-scatter (sum): send holds lp_comm_size(c) x shard floats; recv
 * (shard floats) gets the sum over every rank of its piece number
 * lp_comm_rank(c); backends without their own (self, staged, NCCL) run it
 * as an all-reduce. All-gather of floats: send holds this rank's shard
 * floats; recv (size x shard) gets every rank's, in rank order
 * (lp_comm_allgather of shard x 4 bytes). Blocking, under the watchdog
 * (ZeRO-1's gradient shards and parameter shards). */
lp_status lp_comm_reduce_scatter_sum_float(lp_comm *c, const float *send, float *recv,
                                           size_t shard, const char *what);
lp_status lp_comm_allgather_float(lp_comm *c, const float *send, float *recv, size_t shard,
                                  const char *what);
/* Copies `bytes` bytes of buf on rank `root` into buf on every rank. */
lp_status lp_comm_bcast(lp_comm *c, void *buf, size_t bytes, int root,
                        const char *what);
/* All-gather: every rank gives `bytes` bytes of send (the same count on
 * every rank: the ranks' records of one layout); on every rank recv
 * (lp_comm_size(c) x bytes, not overlapping send) gets rank r's bytes at
 * recv + r * bytes. The bytes travel unchanged (all ranks run one build).
 * Not delayed by the emulated link. A backend on device memory (nccl,
 * mpi-staged) takes device buffers. LP_ERR_ARG for a NULL buffer with
 * bytes > 0. */
lp_status lp_comm_allgather(lp_comm *c, const void *send, size_t bytes,
                            void *recv, const char *what);
/* All-gather of pieces of any size (host memory only: a context of the
 * self or mpi backend): rank r gives `bytes` bytes of send; on every rank
 * sizes[r] (lp_comm_size(c) entries, the caller's array) gets rank r's
 * count and *out a new buffer (lp_free; NULL when every piece is empty)
 * with the pieces back to back in rank order. Two all-gathers: the sizes,
 * then every piece padded to the largest. On failure *out is NULL. */
lp_status lp_comm_allgatherv(lp_comm *c, const void *send, size_t bytes,
                             void **out, size_t *sizes, const char *what);

/* ---- all-to-all-v (expert-parallel dispatch / combine) ------------------
 * Every rank of c sends send_counts[p] floats starting at
 * send + send_displs[p] to rank p, and receives recv_counts[p] floats from
 * rank p into recv + recv_displs[p]; arrays of lp_comm_size(c) entries
 * (counts may be 0; the self entry is a local copy and its send and
 * receive counts must be equal). A NULL send_displs / recv_displs means the
 * prefix sums of the counts (pieces packed in rank order). recv_counts[p]
 * must equal what rank p sends here (a mismatch is LP_ERR_COMM or
 * undefined in MPI: exchange the counts first). The count and displacement
 * arrays are read during the call only (they may be freed when it
 * returns); the buffers stay untouched until the request is finished with
 * lp_comm_wait / lp_comm_test / lp_comm_waitall, exactly
 * like point to point and under the same watchdog; the timeout text reads
 * "timed out after S s (LUAPIPE_TIMEOUT) in an all-to-all-v on rank R
 * (N ranks) sending A floats to and receiving B floats from other ranks:
 * <what>". Like every collective, an unfinished one cannot be cancelled
 * (lp_comm_cancel abandons it; the context is unusable afterwards). The MPI
 * backend uses MPI_Ialltoallv, whose counts and displacements are ints: a
 * count or displacement above INT_MAX is LP_ERR_ARG naming the rank and
 * entry. LP_ERR_UNSUPPORTED from a backend without it. */
lp_status lp_comm_ialltoallv(lp_comm *c, const float *send,
                             const size_t *send_counts,
                             const size_t *send_displs, float *recv,
                             const size_t *recv_counts,
                             const size_t *recv_displs, lp_comm_req **req);
/* Blocking form: ialltoallv + lp_comm_wait(what). */
lp_status lp_comm_alltoallv(lp_comm *c, const float *send,
                            const size_t *send_counts,
                            const size_t *send_displs, float *recv,
                            const size_t *recv_counts,
                            const size_t *recv_displs, const char *what);

/* ---- taking the job down -------------------------------------------------- */

/* Ends every rank of the job with exit code `code` (MPI_Abort under MPI,
 * exit in a single process). c may be NULL (the world). */
_Noreturn void lp_comm_abort(lp_comm *c, int code);
/* Prints "luapipe: rank R: <msg>" to stderr and aborts every rank with exit
 * code 1, so a failed or dead peer never leaves the job hanging. */
_Noreturn void lp_comm_fatal(lp_comm *c, const char *msg);
/* The job's policy for a failure a caller got back from a wait or a layer
 * above (the executor returns them): after LP_ERR_TIMEOUT (the watchdog
 * fired: a peer stopped or hung, and a started operation cannot be
 * cancelled) every rank ends, with msg (lp_comm_fatal); any other status
 * returns here, for the caller to report. The top of the program calls it
 * (the Lua bindings do, when a step or a placement fails); library code
 * returns instead. */
void lp_comm_on_failure(lp_comm *c, lp_status st, const char *msg);

/* ---- MPI bootstrap (the host calls these) --------------------------------- */

/* Progress: under MPI the library asks for MPI_THREAD_MULTIPLE and, when
 * MPI provides it (checked with MPI_Query_thread), runs one progress
 * thread per process that drives MPI's progress engine (MPI_Iprobe on a
 * private communicator: every 50 us for 5 ms after an operation started,
 * then every 200 us, after 50 ms every 1 ms) while any operation is
 * pending, and sleeps on a condition variable otherwise; it also posts the
 * sends of an emulated link at their time. So a transfer or an
 * all-to-all-v started before a long computation finishes during it,
 * without the caller calling into MPI; lp_comm_test never blocks (one
 * MPI_Test). LUAPIPE_COMM_THREAD=0 turns the thread off (progress then
 * happens only inside lp_comm_test / lp_comm_wait). lp_comm_progress_thread
 * tells whether it runs. */
int lp_comm_progress_thread(void);
/* What a rank polling for something it waits on does after `polls`
 * unsuccessful polls (0, 1, ...): nothing for the first few (latency), then
 * short sleeps, then longer ones; never a spin or yield loop, which would
 * take the core a partner on the same core needs. lp_comm_wait uses it;
 * so does a caller polling several requests of different contexts. */
void lp_comm_backoff(unsigned polls);
/* 1 when c's backend lets ranks start operations on different contexts in
 * different orders (lp_comm_backend.any_order). */
int lp_comm_any_order(const lp_comm *c);

/* When launched by mpirun (OMPI_COMM_WORLD_SIZE or PMIX_RANK in the
 * environment) starts MPI (MPI_Init_thread, which may edit argc/argv) and
 * makes lp_comm_world() the MPI world; otherwise does nothing and the
 * process is rank 0 of 1. Registers lp_comm_mpi_finalize with atexit, so
 * os.exit in a script still shuts MPI down. Sets OMPI_MCA_async_mpi_finalize=1
 * unless already set (a finished rank leaves without waiting for the others:
 * mpirun can hang when an abort meets ranks waiting in MPI_Finalize).
 * LP_ERR_COMM when MPI fails to start (message printed to stderr).
 * LP_ERR_PARSE (message printed) when LUAPIPE_LINK is malformed, checked
 * with or without mpirun. */
lp_status lp_comm_mpi_init(int *argc, char ***argv);
/* Shuts MPI down when it was started (idempotent; skipped after an abort). */
void lp_comm_mpi_finalize(void);
/* 1 when this process runs under MPI (lp_comm_mpi_init started it). */
int lp_comm_mpi_active(void);
