/* exec_internal.h — what the executor's files share (not a public header):
 * the executor's state and the functions of its parts.
 *   exec.c   construction, the compute halves and the action loop of a step
 *   pairs.c  overlapped F&B pairs, their waits and the weight-grad carry
 *   msg.c    message plumbing: tags, posting receives ahead, sends, waits
 *   reduce.c gradient reduction of replicated stages
 *   clip.c   global gradient-norm clipping at the end of a step
 *   timing.c always-on timing, measured trace events and their gathering,
 *            the job's timing gathered on every rank
 *   host.c   ranks and cores of this rank's host (does the prediction apply?)
 *   ep.c     the pp x dp grid with its EP groups, the MoE exchanges
 *            (lp_nn_ep) and their accounting, the step-end sums over the
 *            EP group
 *   dp.c     data parallelism: each stage's gradient buckets summed over
 *            its DP group (dense) and expert-DP group (experts), started
 *            as soon as the stage's gradients are final; ZeRO-1's shards
 *   placement.c  EPLB: expert weights and optimizer state moved between ranks
 *   checkpoint.c saving and loading each rank's stages
 *   reference.c  the one-process reference step (tests, --reference)
 *   device.c     which device a rank trains on (lp_exec_device; no state)
 *
 * Who writes what in struct lp_exec (its rooms; construction in lp_exec_new
 * included, which calls each file's *_new): every other file reads a part
 * directly or through its owner's functions, and writes it only through
 * those functions.
 *   pr    pairs.c (and exec.c's halves): the running halves, the carry
 *   xc    ep.c: MoE exchanges in flight and the step's all-to-all accounting
 *   moe   ep.c: the EP group's device contexts, the lp_nn_ep of MoE layers,
 *         the step-end sum of expert loads (placement.c reads its layout)
 *   tm    timing.c: the trace clock, the trace, the step's times and the
 *         totals; others add through ex_time_* and, to the exchange
 *         counters, through the slots ex_action_x / ex_half_x hand out
 *   msg   msg.c: the context for activations and gradients, receives
 *         posted ahead, sends in flight
 *   rd    reduce.c, with vst.rd of every local vstage: gradient reduction
 *   cl    clip.c: the last step's gradient norm (global clipping)
 *   dpr   dp.c, with vst.dp of every local vstage: the DP sums in flight,
 *         their accounting, ZeRO-1's shards
 *   host  host.c: the ranks and cores of this host
 *   fail  exec.c (ex_comm_fail): the first failed communication
 *   the grid (world, comm, pp_own, ep_comm, ep_comm_b, dp_comm, xdp_comm,
 *         dp_own, xdp_own, rank, prank, ep, ep_rank, dp, dp_rank):
 *         ep.c's ex_grid_new / ex_ep_device_new, at construction
 *   the plan (s, o, be, P, S, V, M, nloc, vs, loc, vrank, vstage, kpos,
 *         route, rlen, shape, ndim, numel, acts, nacts, compute_idx,
 *         ncompute): exec.c at construction, read-only after (kept flat:
 *         every file reads it). Within vs[li]: chunk (exec.c), optim
 *         (exec.c; placement.c rebuilds it for a new expert placement),
 *         slots (exec.c's halves; msg.c's receive targets and requests),
 *         wq (exec.c), rd (reduce.c)
 *   step, cur, loss_sum: exec.c's action loop; err: the text of what a
 *         function of any file returns
 * checkpoint.c, reference.c and device.c use the public functions only
 * (lp_exec.h), not this header. */
#pragma once
#define _POSIX_C_SOURCE 200809L
#include "lp_exec.h"

enum { K_F = 0, K_B = 1, K_RED = 2, K__N = 3 };

/* the counters of one (kind, model stage) in act_x */
enum { EX_X_N, EX_X_OUT, EX_X_IN, EX_X_MAX, EX_X_BLOCKED, EX_X_HALVES, EX_NX };

typedef struct slot {
  lp_nn_ctx *ctx;
  lp_tensor *fin, *bin;   /* forward input / output-grad, ready */
  lp_tensor *rbuf_f, *rbuf_b; /* receive targets (on the model's backend)
                               * while a receive is pending */
  lp_comm_req *rreq_f, *rreq_b;
  uint16_t *rwire_f, *rwire_b; /* bf16 wire: where a pending receive lands
                                * (unpacked into rbuf_* when it completes) */
  lp_tensor *fout, *bout; /* outputs waiting for SEND_F / SEND_B */
} slot;

/* reduce.c: the gradient reduction of one local vstage (buffers only when
 * its model stage is replicated) */
typedef struct vst_reduce {
  float *pack;         /* this copy's grads, flat */
  float **peer_pack;   /* [V]: received packs of remote copies */
  lp_comm_req **req;   /* [2V]: sends then receives */
  int started;         /* its reduction started this step */
  int seq;             /* order its reduction started in this step */
  int last_grad;       /* index of the last action writing its grads
                        * (-1: none), for an early start (ex_reduce_early) */
} vst_reduce;

/* dp.c: the gradients of a local vstage's parameters of one kind (dense
 * ones, or routed experts' slots) that one group sums: flat in chunk
 * order, in segments (vst_dp's groups of children) each summed by its own
 * all-reduce as soon as its children's weight-grads are final */
typedef struct dp_bucket {
  lp_comm *comm;    /* the group summing it (NULL: nothing to sum) */
  size_t *idx;      /* [np]: indices in the chunk's parameter list */
  size_t *off;      /* [np]: offset of each in the flat pack */
  size_t np, n;     /* parameters, floats */
  float *pack;      /* [n padded to a multiple of the group's size] */
  size_t *seg;      /* [ng + 1]: the pack range [seg[j + 1], seg[j]) of
                     * group j (groups from the chunk's end) */
  size_t *seg_p;    /* [ng + 1]: the same as ranges of idx */
  lp_comm_req **req; /* [ng]: their all-reduces in flight (zero = 0) */
  /* ZeRO-1: this rank's shard [lo, lo + shard) of the flat parameters,
   * its master values and summed gradients (host tensors of `shard`
   * floats: a parameter of the vstage's optimizer) */
  size_t shard, lo;
  lp_tensor *wv, *wg;
} dp_bucket;

/* dp.c: a local vstage's buckets (dense over the DP group, experts over
 * the expert-DP group), summed in groups of its chunk's children: group 0
 * the last children (the first whose weight-grads a backward finishes),
 * each group at least LUAPIPE_DP_BUCKET floats but the first children's */
enum { DP_DENSE = 0, DP_EXPERT = 1, DP_NB = 2 };
typedef struct vst_dp {
  dp_bucket b[DP_NB];
  int ng;        /* groups */
  int *child0;   /* [ng]: the first child of group j (children child0[j]..
                  * child0[j - 1] - 1) */
  int nchild;    /* children of the chunk (1 for a lone layer) */
  int started;   /* groups whose sums started this step */
  int last_grad; /* the last action writing its grads (-1: none) */
  double t0;     /* lp_now() at the first start */
  double done_at; /* > 0: lp_now() when a poll found every sum finished */
} vst_dp;

typedef struct vst {
  int id, stage;
  lp_nn_layer *chunk;
  lp_nn_optim *optim;
  slot *slots; /* [M] */
  int *wq;     /* FIFO of micro-batches waiting for W */
  int wq_head, wq_len;
  vst_reduce rd; /* reduce.c */
  vst_dp dp;     /* dp.c */
} vst;

typedef struct pending_send {
  lp_comm_req *req;
  lp_tensor *t;  /* kept alive until the send completes */
  uint16_t *wire; /* bf16 wire: the packed values sent (owned), else NULL */
  double posted; /* lp_now() of the isend */
  int v, mb, fwd, index; /* what it carries, for its trace slice */
  int peer, tag;
} pending_send;

/* A forward or backward half in progress (begun, advanced in phases). */
typedef struct half {
  int active;
  int type;      /* LP_ACT_F, LP_ACT_B (input- and weight-grad) or LP_ACT_I */
  int v, mb;
  lp_tensor *in; /* x or dy, held until the pass ends */
  lp_tensor *tg; /* the target, when the data source gave it with x */
  int keep_w;    /* B: its finish leaves the weight-grad to the pair (carry_w) */
} half;

/* One all-to-all-v of an MoE layer in flight (lp_nn_ep handle). */
typedef struct a2a {
  lp_comm_req *req;
  lp_comm *comm;  /* the EP context it runs on (ep_comm or ep_comm_b) */
  int half;       /* the half (0 forward, 1 backward) whose pass started it */
  lp_nn_xkind kind;
  const char *layer; /* the MoE layer's name */
  int v, mb;      /* that half's virtual stage and micro-batch (-1: none) */
  size_t *displs; /* [2 * ep]: send then receive displacements */
  double start, modelled; /* lp_now() at start; the link model's time */
  double blocked0;        /* the rank's blocked time (a2a + messages) at start */
  double done_at;   /* > 0: lp_now() when ex_half_ready found it finished */
  int found_waiting; /* ... while the rank polled for it (else: after compute) */
  /* bf16 rows (token rows of a bf16 model on the host): what travels is
   * their bf16 bits, two to a float; unpacked into recv at the wait */
  float *wsend, *wrecv; /* packed send and receive buffers (owned) */
  float *recv;          /* the caller's receive buffer */
  size_t *counts;       /* [2 * ep]: the caller's send then receive counts */
} a2a;

/* The executor's rooms: each part of struct lp_exec below that one file
 * owns (writes); the others read it, directly or through that file's
 * functions (see the top of this header). */

/* pairs.c (and exec.c's halves): the running forward / backward half and
 * the weight-grad an overlapped pair's full backward left to the next */
typedef struct ex_pairs {
  half hf[2];
  int carry_v, carry_mb; /* -1: none */
} ex_pairs;

/* ep.c: each half's exchange in flight and the step's all-to-all
 * accounting: time (max of the blocked wait and the link model), the
 * blocked part, the hidden part, the link model's time, the count */
typedef struct ex_xchg {
  a2a *half_x[2]; /* NULL: none */
  double s, blocked, hidden, link;
  int64_t n;
  double bytes; /* bytes sent to the other EP ranks this step */
} ex_xchg;

/* ep.c: what MoE layers get of the EP group, and the step-end sum of
 * expert loads (router biases, EPLB's records) */
typedef struct ex_moe {
  lp_comm *dcomm, *dcomm_b; /* device rows of MoE exchanges (chunks off the
                             * host): contexts for e->be over ep_comm /
                             * ep_comm_b (staged or NCCL; owned), else NULL */
  lp_nn_ep nnep;            /* given to every chunk with MoE layers */
  double *counts;  /* [total]: expert loads by stage, for the step-end sum */
  size_t total;
  size_t *off;     /* [S + 1]: offset of each model stage's counts */
  int layers;      /* MoE layers of the whole model */
  int *experts;    /* [layers]: experts of each */
} ex_moe;

/* timing.c: each compute action's time in the running step (cur) and in
 * the last LP_EXEC_HISTORY steps (ring: row = wall, after, nacts times;
 * len rows kept, the newest at head - 1) */
typedef struct ex_hist {
  double *cur, *ring;
  int head, len;
} ex_hist;

/* timing.c: the trace clock and the measured trace, and the always-on
 * timing: this step's parts, the last step, the totals, and per (kind,
 * model stage) action times [2][LP_EXEC_NKINDS][S] (0: this step, 1: since
 * the reset). The other files add to it with ex_time_* and read it. */
typedef struct ex_timing {
  double t0;           /* the common trace clock: rank 0's start (lp_now()) */
  lp_trace *trace;     /* NULL: tracing is off */
  int live, pending_w; /* trace counters of this rank */
  /* this step: waits for messages and collectives, posting and other
   * work between actions, compute (summing reduced grads included),
   * optimizer (zeroing grads included), summing reduced grads */
  double wait, post, comp, optim, reduce;
  double waited;       /* seconds the running action spent waiting for receives */
  double wall, busy;   /* the last step: wall time, compute and optimizer
                        * steps without waits */
  lp_exec_timing last, total;
  double *act_s;
  int64_t *act_n;
  /* per (kind, model stage), same layout x EX_NX (EX_X_*): MoE exchanges
   * the F / B / I halves started (lone or in an FB pair), their bytes out
   * / in / larger direction, the halves run; the time the actions sat
   * blocked waiting for exchanges (an FB pair's under FB) */
  double *act_x;
  ex_hist hist; /* the kept steps' action times (lp_exec_step_times) */
} ex_timing;

/* msg.c: activations and gradients between pipeline ranks */
typedef struct ex_msg {
  lp_comm *pcomm; /* comm itself for host tensors, else the device-capable
                   * context of lp_comm_for_backend (NCCL or MPI-staged) */
  int pcomm_own;  /* pcomm was made here (freed with the executor) */
  int posted;     /* RECV actions with index < posted are posted */
  pending_send *ps; /* [nps] sends in flight, oldest first (room for cps) */
  int nps, cps;
  /* the values between model stages are bf16 (the chunks' boundary
   * precision, lp_nn_chunk_boundary): rounded where a stage's output or
   * input-grad is made (ex_round_boundary), and on host tensors carried
   * as bf16 bits (wire16: two bytes a value, lossless) */
  int bf16, wire16;
  double bytes; /* bytes this rank sent between pipeline stages this step */
} ex_msg;

/* reduce.c (with vst.rd): the step's gradient reductions */
typedef struct ex_reduce {
  int has_actions; /* the schedule has REDUCE_GRAD actions */
  int nstarted;    /* reductions started this step (vst_reduce.seq) */
} ex_reduce;

/* host.c: the job's ranks on this host and the cores they may use */
typedef struct ex_host {
  int ranks, cores;
} ex_host;

/* clip.c: the gradient norm of the last step, before clipping (-1: not
 * computed, clipping off) */
typedef struct ex_clip_room {
  double norm;
} ex_clip_room;

/* dp.c: the step's DP gradient sums (the buckets are in vst.dp): on (dp
 * beyond the EP group, or ZeRO-1), and their time, the part hidden under
 * the rank's other work, the link model's time, the count */
typedef struct ex_dp {
  int on;
  double s, hidden, link;
  int64_t n;
} ex_dp;

/* exec.c (ex_comm_fail): a failed communication (0: none) and its text */
typedef struct ex_fail {
  lp_status st;
  char text[LP_ERRLEN];
} ex_fail;

struct lp_exec {
  /* the grid: ep.c (ex_grid_new, ex_ep_device_new), at construction */
  lp_comm *comm;  /* the pipeline group: ranks of one EP index (the job's
                   * comm when ep = 1) */
  lp_comm *world; /* the job's comm: pp x ep ranks */
  lp_comm *pp_own, *ep_comm; /* owned split contexts when ep > 1 */
  lp_comm *dp_comm;   /* the DP group: the dp ranks of this pipeline rank
                       * (ep_comm when dp = ep, NULL when dp = 1) */
  lp_comm *xdp_comm;  /* the expert-DP group: the dp / ep ranks of this
                       * pipeline rank and EP index (dp_comm when ep = 1,
                       * NULL when dp = ep) */
  lp_comm *dp_own, *xdp_own; /* owned split contexts */
  int dp, dp_rank;   /* DP group size (1: none) and this rank's index d in
                      * it (EP index = d % ep, EP group = d / ep) */
  lp_comm *ep_comm_b; /* the EP group again, for backward halves' exchanges
                       * (when its backend lets ranks start operations on
                       * two contexts in any order), else NULL: then every
                       * exchange goes over ep_comm in one order */
  int rank;      /* in world: messages and traces name it */
  int prank;     /* in the pipeline group: the schedule's rank */
  int ep, ep_rank; /* EP group size (1: none) and this rank's index in it */

  /* the plan: exec.c, at construction; read-only after */
  lp_schedule *s;
  lp_exec_opts o;
  const lp_tensor_backend *be; /* where every chunk runs (opts.backend or the CPU) */
  int P, S, V, M;
  int nloc;
  vst *vs;      /* [nloc] */
  int *loc;     /* [V] -> local index or -1 */
  int *vrank;   /* [V] rank of each vstage */
  int *vstage;  /* [V] model stage of each vstage */
  int **kpos;   /* [nloc][M]: position of vstage in mb's route, -1 */
  const int **route;
  int *rlen;
  int64_t (*shape)[LP_TENSOR_MAXDIM]; /* [S] activation shape entering s */
  int *ndim;
  size_t *numel; /* [S] */
  const lp_action *acts;
  int nacts;
  int *compute_idx; /* indices of compute actions */
  int ncompute;

  /* the rooms */
  ex_pairs pr;  /* pairs.c */
  ex_xchg xc;   /* ep.c */
  ex_moe moe;   /* ep.c */
  ex_timing tm; /* timing.c */
  ex_msg msg;   /* msg.c */
  ex_reduce rd; /* reduce.c */
  ex_host host; /* host.c */
  ex_clip_room cl; /* clip.c */
  ex_dp dpr;    /* dp.c */
  ex_fail fail; /* exec.c: a communication failed (LP_ERR_TIMEOUT / _COMM): a
                 * started operation may still be in flight, so the executor
                 * refuses further steps */

  /* exec.c's action loop */
  int64_t step;
  int cur; /* index of the action running */
  double loss_sum;
  char err[LP_ERRLEN];
};


/* ---- exec.c: the halves ---- */
/* Begins the forward half of (v, mb) / the backward half (full: B, else I):
 * inputs in hand (data, handoff or a finished receive), the pass begun. */
lp_status ex_f_begin(lp_exec *e, int v, int mb);
lp_status ex_b_begin(lp_exec *e, int v, int mb, int full);
/* One advance of the running forward (which = 0) or backward (1) half;
 * *done = 1 once its pass ended and the half finished. */
lp_status ex_half_advance(lp_exec *e, int which, int *done);
/* The phase of half `which`'s next advance (LP_NN_PHASE_DONE: none). */
lp_nn_phase ex_half_phase(const lp_exec *e, int which);
/* "rank R, action i (text): what failed: <nn text>"; returns st. */
lp_status ex_nnfail(lp_exec *e, slot *sl, const char *what, lp_status st);

/* ---- pairs.c ---- */
/* Runs the FB action a (no hook) as an overlapped pair. */
lp_status ex_run_fb(lp_exec *e, const lp_action *a);
/* Weight-grad pieces the running full backward has made ready: all, or
 * one when ran != NULL (*ran = 1 when one ran). */
lp_status ex_bw_parts(lp_exec *e, int *ran);
/* The carried weight-grad: one piece (ran != NULL) or all that is left
 * (ran NULL: the carry ends). */
lp_status ex_carry_w(lp_exec *e, int *ran);
/* Pieces of the carry while half `which`'s exchange flies. */
lp_status ex_fill_with_carry(lp_exec *e, int which);

/* ---- clip.c ---- */
/* With o.clip > 0: the global gradient norm (every parameter once: the
 * first copy of a replicated stage, dense ones on DP index 0, a routed
 * expert on its first slot of the first EP group; ZeRO-1's shards each on
 * its rank), summed over the world, then every local
 * gradient scaled by min(1, clip / (norm + 1e-6)). Call after every
 * gradient sum of the step, before any optimizer step. */
lp_status ex_clip(lp_exec *e);

/* ---- exec.c: communication failures ---- */
/* Records a failed operation of comm c (status st) and returns st: after a
 * timeout e->err is the watchdog's text (it names the rank, the operation
 * and the peer, with `what`), else "rank R: what: <comm text>"; the
 * executor is broken from then on. Nothing exits: the caller decides
 * (lp_comm_on_failure holds the job's policy). */
lp_status ex_comm_fail(lp_exec *e, lp_comm *c, lp_status st, const char *what);

/* ---- msg.c ---- */
/* Message tag of (kind, consumer vstage v, micro-batch mb). */
int ex_tag(const lp_exec *e, int kind, int v, int mb);
/* Text of action i of this rank ("(end of step)" past the end) in buf. */
const char *ex_act_text(const lp_exec *e, int i, char *buf, size_t n);
/* Waits for *req (a request of e->comm / of c) under the watchdog; a
 * failure (a timeout included) is returned with its text (ex_comm_fail). */
lp_status ex_wait(lp_exec *e, lp_comm_req **req, const char *what);
lp_status ex_wait_on(lp_exec *e, lp_comm *c, lp_comm_req **req, const char *what);
/* Makes e->msg.pcomm for tensors on e->be (collective over e->comm). */
lp_status ex_pcomm_new(lp_exec *e);
/* A new step: no receive of it is posted yet. */
void ex_msg_reset(lp_exec *e);
/* Cancels the sends in flight and drops what they kept alive (a failed
 * step, the executor's end). */
void ex_sends_drop(lp_exec *e);
/* Frees msg.c's part (after ex_sends_drop and every slot's receives). */
void ex_msg_free(lp_exec *e);
/* Drops a pending receive of a slot (cancel, free its target and its
 * bf16 landing buffer). */
void ex_recv_drop(lp_exec *e, lp_comm_req **req, lp_tensor **buf, uint16_t **wire);
/* After the chunks are built: the precision of the values between model
 * stages (every local chunk's boundary precision; LP_ERR_ARG when they
 * differ) and whether messages carry them as bf16 bits (host tensors). */
lp_status ex_msg_setup(lp_exec *e);
/* A stage output (forward) or input-grad (backward) that crosses a model
 * stage boundary: rounded to bf16 values in place when the boundary is
 * bf16 (as a chunk rounds between its layers), before anything else reads
 * it; nothing at f32. */
lp_status ex_round_boundary(lp_exec *e, lp_tensor **t);
/* The input of a first stage (data source) on e->be; replaces *t. */
lp_status ex_to_backend(lp_exec *e, lp_tensor **t);
/* Past a backlog of sends (SEND_BACKLOG), drops the finished ones; nothing
 * below it. */
lp_status ex_poll_sends(lp_exec *e);
/* Step end: waits for every send in flight. */
lp_status ex_wait_sends(lp_exec *e);
/* Posts every RECV action before index `limit`. */
lp_status ex_post_upto(lp_exec *e, int limit);
/* Completes the receive of (fwd, v, mb) from `peer` into a tensor of model
 * stage `stin`'s activation shape. */
lp_status ex_finish_recv(lp_exec *e, int fwd, int v, int mb, int stin, int peer,
                         lp_tensor **out);
/* SEND_F / SEND_B action a. */
lp_status ex_send(lp_exec *e, const lp_action *a);

/* ---- exec.c ---- */
/* Drops the running halves (a failed step). */
void ex_halves_clear(lp_exec *e);

/* ---- reduce.c ---- */
size_t ex_grad_numel(const lp_nn_layer *l);
/* 1 when model stage of vstage v has another copy. */
int ex_replicated(const lp_exec *e, int v);
/* Buffers of local vstage vs's reduction when its model stage is
 * replicated (after its chunk is built); nothing otherwise. */
lp_status ex_reduce_new(lp_exec *e, vst *vs);
/* The buffers follow vs's parameter list's size (a new expert placement). */
lp_status ex_reduce_resize(lp_exec *e, vst *vs);
/* Cancels vs's reduction messages and frees its buffers. */
void ex_reduce_free(lp_exec *e, vst *vs);
/* A failed step: vs's reduction messages cancelled, none started. */
void ex_reduce_drop(lp_exec *e, vst *vs);
/* The step's reductions are over: the next step numbers its own from 0. */
void ex_reduce_reset(lp_exec *e);
lp_status ex_reduce_start(lp_exec *e, int li);
lp_status ex_reduce_wait(lp_exec *e, int li);
lp_status ex_reduce_finish(lp_exec *e);
/* The same for local vstage li alone (nothing when its reduction did not
 * start). */
lp_status ex_reduce_finish_one(lp_exec *e, int li);
/* Whether the schedule has REDUCE_GRAD actions, and each local vstage's
 * last action that writes its grads (B, W, an FB pair's full backward), or
 * this rank's last send when that is later. */
void ex_reduce_plan(lp_exec *e);
/* Without REDUCE_GRAD actions: starts the reduction of every replicated
 * local stage whose last grad-writing action (index <= e->cur) is done
 * and whose weight-grad is not carried, so its messages fly under the
 * rank's remaining actions. */
lp_status ex_reduce_early(lp_exec *e);

/* ---- ep.c ---- */
/* Splits the job's comm into the pp x ep grid (rank = pipeline rank * ep +
 * EP index): e->comm becomes the pipeline group, e->ep_comm the EP group
 * (and e->ep_comm_b a second context of it for backward halves when the
 * backend allows any order). */
lp_status ex_grid_new(lp_exec *e);
void ex_grid_free(lp_exec *e);
/* A new step's exchange accounting (e->xc, which only ep.c writes). */
void ex_xchg_reset(lp_exec *e);
/* World rank of pipeline rank p in this rank's pipeline group. */
int ex_world(const lp_exec *e, int p);
/* *ready = 1 when half `which` (0 forward, 1 backward) has no exchange in
 * flight or its exchange has finished (noted with the time: `waiting` says
 * the rank was polling for it, else it comes after compute); never blocks.
 * A failed exchange: its error, with text. */
lp_status ex_half_ready(lp_exec *e, int which, int waiting, int *ready);
/* The rank sat blocked from t0 to t1 on both halves' exchanges of an
 * overlapped pair: counted as exposed all-to-all time of the action, and
 * traced. */
void ex_a2a_blocked(lp_exec *e, double t0, double t1);
/* With chunks off the host: the EP group's contexts for device rows
 * (lp_comm_for_backend over ep_comm and ep_comm_b; a backend that needs one
 * order on every rank, NCCL, drops ep_comm_b: pairs then run in the fixed
 * order). Collective over the EP group; nothing without EP or on the host. */
lp_status ex_ep_device_new(lp_exec *e);
/* Gives the chunk of vstage vs the EP group (MoE layers only). */
lp_status ex_ep_attach(lp_exec *e, vst *vs);
/* Sets up the step-end sum of expert loads (collective; after chunks). */
lp_status ex_moe_loads_new(lp_exec *e);
/* This rank's share of a micro-batch tensor (rows of dim 0); replaces *t. */
lp_status ex_shard(lp_exec *e, lp_tensor **t, const char *what, int mb);
/* Step end: dense grads summed over the EP group, replicated experts' grads
 * summed over their holders; router biases from the loads of all ranks. */
lp_status ex_ep_reduce(lp_exec *e);
/* The step's expert loads of every rank summed into e->moe.counts
 * (collective over the world; before the optimizer: nograd.c's masks),
 * then the router biases from them (loads reset). */
lp_status ex_moe_loads_sum(lp_exec *e);
lp_status ex_moe_bias_update(lp_exec *e);

/* ---- nograd.c ---- */
/* The optimizer step of local vstage li, leaving alone the routed experts
 * no rank routed a token to in this step (e->moe.counts, summed by
 * ex_moe_loads_sum), as torch does with a grad of None. Without MoE layers,
 * or under ZeRO-1 (whose expert shard mixes experts), a plain step. */
lp_status ex_optim_step(lp_exec *e, int li);

/* ---- dp.c ---- */
/* Buckets of local vstage vs (after its chunk is built, before its
 * optimizer): dense parameters over the DP group, routed experts' over
 * the expert-DP group; with ZeRO-1 the shards' master values and grads. */
lp_status ex_dp_new(lp_exec *e, vst *vs);
void ex_dp_free(lp_exec *e, vst *vs);
/* The parameters vs's optimizer updates: with ZeRO-1 the unsharded ones
 * and one shard parameter per sharded bucket (*params to lp_free), else
 * the chunk's list (*own = 0: borrowed). */
lp_status ex_dp_optim_params(lp_exec *e, vst *vs, lp_nn_param **params, size_t *n, int *own);
/* Each local vstage's last grad-writing action. */
void ex_dp_plan(lp_exec *e);
/* zero = 0: starts the sums of every local stage (not replicated) whose
 * gradients are final (index <= e->cur, no queued or carried
 * weight-grad), so they fly under the rank's remaining actions. */
lp_status ex_dp_early(lp_exec *e);
/* Step end, after the replicated stages' sums: starts the rest, waits for
 * every bucket and writes the sums into the grads (zero = 0); with ZeRO-1
 * reduce-scatters each bucket into this rank's shard instead. */
lp_status ex_dp_finish(lp_exec *e);
/* The weight-grad of vs's micro-batch ctx; when it is the stage's last
 * (action e->cur is its last grad-writing one, nothing queued, zero = 0,
 * not replicated) child by child, each group's sums started as soon as its
 * children are done, while the weight-grads of the earlier children run
 * (the same gradients, bitwise). */
lp_status ex_dp_weight_grad(lp_exec *e, vst *vs, lp_nn_ctx *ctx);
/* ZeRO-1, after the optimizer step: the updated shards all-gathered into
 * every rank's parameters. */
lp_status ex_dp_gather(lp_exec *e);
/* ZeRO-1: zeroes the grads of the sharded parameters (the optimizer
 * zeroes the rest). */
lp_status ex_dp_zero_grad(lp_exec *e, vst *vs);
/* Clipping with ZeRO-1: the sum of squares of vs's gradient shards, over
 * the parameters with counts[i] (chunk order) set; those of sharded
 * parameters become 2 (counted here). Nothing without ZeRO-1. Scaling the
 * shards by coef. */
lp_status ex_dp_shard_sumsq(lp_exec *e, vst *vs, char *counts, double *out);
lp_status ex_dp_shard_scale(lp_exec *e, vst *vs, float coef);
/* A failed step: sums in flight dropped. */
void ex_dp_drop(lp_exec *e);
void ex_dp_reset(lp_exec *e);

/* ---- host.c ---- */
/* Counts the ranks of this host and the cores their affinity allows
 * (collective over e->world). */
lp_status ex_host_share_new(lp_exec *e);
/* Heap policy for repeated steps: freed activations stay mapped (once per
 * process; glibc only). */
void ex_keep_memory(void);

/* ---- timing.c ---- */
/* The action-time tables, the trace (opts.trace) and the common trace
 * clock (collective over e->world). */
lp_status ex_timing_new(lp_exec *e);
void ex_timing_free(lp_exec *e);
/* A new step's timing (the step's marker in the trace); returns its start
 * (lp_now()). */
double ex_time_step_begin(lp_exec *e);
/* The parts of a step, in seconds: a wait for a message or a collective;
 * posting and other work between actions; compute action i of this
 * rank's list (busy time, this step's time of its kind and model stage,
 * its own time in the kept steps); the step end's summing of reduced
 * grads (compute); zeroing grads (optimizer time); optimizer steps (busy
 * optimizer time). */
void ex_time_wait(lp_exec *e, double s);
void ex_time_post(lp_exec *e, double s);
void ex_time_compute(lp_exec *e, int i, double s);
void ex_time_reduce(lp_exec *e, double s);
void ex_time_zero_grad(lp_exec *e, double s);
void ex_time_optim(lp_exec *e, double s);
/* The running action's waits for receives (tm.waited): from 0 at its
 * start (ex_time_action_begin), each adds s. */
void ex_time_action_begin(lp_exec *e);
void ex_time_recv_wait(lp_exec *e, double s);
/* The exchange counters (EX_X_*) of the running compute action's kind and
 * model stage (an FB pair's on its F half's stage), NULL outside one; of
 * half `which` (its kind and model stage), NULL when none runs. */
double *ex_action_x(lp_exec *e);
double *ex_half_x(lp_exec *e, int which);
/* Records a slice [start, end] (lp_now() seconds) when tracing; peer and
 * tag describe a message (-1 when none). Returns its index or -1. */
int ex_trace_add(lp_exec *e, int kind, const char *name, const char *cat, double start,
                 double end, int v, int mb, int index, int peer, int tag);
/* Counters of this rank (tracing only): the live activations (forward
 * passes whose backward has not finished) and the pending weight-grads
 * change by dlive / dpw at time `at` (lp_now()). */
void ex_trace_memory(lp_exec *e, double at, int dlive, int dpw);
/* The finished step (wall seconds) becomes the last step and joins the
 * totals (and its action times a kept step). */
void ex_timing_commit(lp_exec *e, double wall);
