/* lp_exec.h — runs training steps of a lowered, validated schedule on one
 * rank: per virtual stage an nn chunk and a per-micro-batch context, receives
 * posted ahead of need, asynchronous sends, the loss at the end of each
 * route, gradient reduction of replicated stages (DualPipe), the optimizer
 * step, the watchdog (every wait under the comm timeout; a timeout or any
 * failed communication is returned naming rank, action and peer, and the
 * caller applies the job's policy, lp_comm_on_failure) and measured trace events
 * (gathered on rank 0 over the comm). With expert parallelism (opts.ep) the
 * job is a pp x ep grid: MoE layers exchange tokens over the EP group by
 * all-to-all-v, overlapped pairs interleave the two micro-batches' phases,
 * and expert placements can change between steps (EPLB).
 * Uses lp_schedule, lp_comm, lp_nn, lp_tensor, lp_trace. */
#pragma once

#include "lp_base.h"
#include "lp_comm.h"
#include "lp_nn.h"
#include "lp_schedule.h"
#include "lp_tensor.h"
#include "lp_trace.h"

typedef struct lp_exec lp_exec;

/* The data source: the input of micro-batch mb of step `step` (needed on the
 * rank holding position 0 of mb's route) and its target (on the rank holding
 * the last position). Returns new tensors the executor owns and frees; a
 * NULL out pointer means "not needed". LP_OK or a status (the executor then
 * fails the step with the text of `err`, LP_ERRLEN bytes). */
typedef lp_status (*lp_exec_data_fn)(void *ud, int64_t step, int mb,
                                     lp_tensor **input, lp_tensor **target,
                                     char *err);

/* Builds the chunk of model stage `stage` (a new reference the executor
 * releases). Parameters must be initialised from names that do not depend
 * on the split (see lp_nn_init), so every copy of a stage starts equal. */
typedef lp_status (*lp_exec_chunk_fn)(void *ud, int stage, lp_nn_layer **out,
                                      char *err);

/* Optional replacement for an overlapped pair (FB action): called instead
 * of the default (see lp_exec_half_begin). It may interleave the two halves as it likes but
 * must leave the same effects; it composes them from lp_exec_run_half or
 * lp_exec_half_begin / _advance. NULL: the default. */
typedef lp_status (*lp_exec_fb_fn)(void *ud, lp_exec *e, const lp_action *a);

typedef struct lp_exec_opts {
  lp_comm *comm;               /* NULL: lp_comm_world() */
  lp_exec_chunk_fn chunk;      /* required */
  lp_exec_data_fn data;        /* required */
  void *ud;                    /* passed to chunk, data and overlapped_fb */
  lp_nn_loss_kind loss;
  /* shape of the activation entering model stage s (s = 1..S-1; index 0 is
   * unused), the same for every micro-batch; act_ndim[s] dims in
   * act_shape[s][0..]. Gradients travelling back have the same shape. */
  const int *act_ndim;
  const int64_t (*act_shape)[LP_TENSOR_MAXDIM];
  lp_nn_optim_type optim;
  lp_nn_sgd_opts sgd;
  lp_nn_adamw_opts adamw;
  int recv_lookahead;          /* post receives this many compute actions
                                * ahead (0: 4; < 0: all at step start) */
  int trace;                   /* 1: record measured trace events */
  lp_exec_fb_fn overlapped_fb; /* NULL: default F then B */
  /* expert parallelism: the comm's ranks form a pp x ep grid, rank =
   * pipeline rank * ep + EP index (0 or 1: no EP). The EP ranks of one
   * pipeline rank run the same actions, each on its share of every
   * micro-batch (rows of dim 0 of the data's input and target, split
   * evenly; act_shape is that share's shape), their MoE layers exchange
   * tokens by all-to-all-v over the EP group, and at step end dense grads
   * are summed over the EP group and replicated experts' grads over their
   * holders; the step's loss is the mean over micro-batches and shares. */
  int ep;
  /* data parallelism: the comm's ranks form a pp x dp grid, rank =
   * pipeline rank * dp + DP index d (0: dp = ep, the pp x ep grid above;
   * ep must divide dp). The DP ranks of one pipeline rank run the same
   * actions, each on its 1/dp share of every micro-batch (rows of dim 0;
   * act_shape is that share's shape); EP groups are the DP indices in
   * blocks of ep (EP index d % ep, group d / ep). Dense gradients are
   * summed over the DP group, routed experts' over the expert-DP group
   * (the dp / ep ranks with the same EP index), each stage's as soon as
   * its gradients are final (nonblocking, under the remaining backward
   * work; when dp = ep the dense sum stays one all-reduce over the EP
   * group at the step's end). The step's loss is the mean over the global
   * batch: micro-batches x dp shares. */
  int dp;
  /* ZeRO-1 (1; 0: off): each stage's optimizer state sharded over the
   * parameter's DP group (dense) / expert-DP group (experts): gradients
   * reduce-scattered, each rank's optimizer updates its shard, parameters
   * all-gathered. Results equal zero = 0's. Not with expert placements
   * that change (lp_exec_set_placement refuses). */
  int zero;
  /* where the whole model runs (NULL: chunks stay where `chunk` built
   * them, the CPU): every chunk is moved there (lp_nn_layer_to) before its
   * optimizer is made, inputs from the data source are copied there
   * (targets may stay on the host), activations and gradients are received
   * into tensors there and travel between pipeline ranks over
   * lp_comm_for_backend's context (NCCL, or MPI staged through pinned host
   * memory; the comm itself for host tensors or a one-rank pipeline).
   * Gradient sums and checkpoints go through lp_tensor_read / _write. An
   * MoE layer's routing decisions are made on the host; its EP exchanges
   * move the token rows in device memory over the EP group's context for
   * the backend (lp_comm_for_backend: NCCL, or MPI staged through pinned
   * host memory), as activations do. */
  const lp_tensor_backend *backend;
  /* > 0: global gradient-norm clipping at this norm, as
   * torch.nn.utils.clip_grad_norm_ over the whole model (every parameter
   * counted once however many ranks hold it); 0: off */
  float clip;
} lp_exec_opts;

/* Creates the executor of this rank (lp_comm_rank of opts->comm) for
 * schedule s, which must be lowered (lp_schedule_lower) or have a single
 * rank. Checks that the comm has lp_schedule_ranks(s) x ep ranks, that every
 * (kind, vstage, mb) message tag fits lp_comm_tag_ub, builds the chunks of
 * this rank's virtual stages (each copy of a replicated stage its own) and
 * one optimizer per virtual stage. s is cloned. LP_OK and *out, or a status
 * with the reason in err (LP_ERRLEN). Collective: every rank calls it (one
 * barrier to align trace clocks). */
lp_status lp_exec_new(const lp_schedule *s, const lp_exec_opts *opts,
                      lp_exec **out, char *err);

/* The one rule of a job's shape: a schedule of P pipeline ranks, each
 * with ep EP ranks (0 or 1: no EP), runs on P x ep processes (rank =
 * pipeline rank * ep + EP index). LP_OK, or LP_ERR_ARG with the mistake in
 * err (LP_ERRLEN) in the words of someone who chose how many processes to
 * start: sname names the schedule ("schedule '1f1b' needs 4 ranks, but
 * mpirun started 2 (run it with mpirun -np 4)"); NULL speaks of pp and ep
 * as given ("pp x ep = 1 x 2 needs 2 ranks, but this is one process ...").
 * lp_exec_new asks it; so does luapipe.train before it builds anything. */
lp_status lp_exec_grid_check(int P, int ep, int nprocs, const char *sname, char *err);
/* The same rule with data parallelism: P pipeline ranks of dp DP ranks
 * each (0: dp = ep), EP groups of ep of them (ep must divide dp), on
 * P x dp processes (rank = pipeline rank * dp + DP index); the messages
 * speak of dp when it goes beyond ep ("pp x dp = 1 x 2 needs 2 ranks, but
 * mpirun started 4 ...", "ep = 4 does not divide dp = 2 ..."). */
lp_status lp_exec_grid_check_dp(int P, int ep, int dp, int nprocs, const char *sname,
                                char *err);
void lp_exec_free(lp_exec *e);

/* Text of the last failure ("" when none). */
const char *lp_exec_last_error(const lp_exec *e);

/* Runs one training step (number `step`, passed to the data source): zero
 * grads, every action of this rank in order, gradient reduction of
 * replicated stages (at their REDUCE_GRAD actions, or at the end of the
 * step when the schedule has none), the optimizer step of every virtual
 * stage, and one all-reduce of the loss. *loss (optional) gets the step's
 * loss: the mean over all micro-batches, the same on every rank. A wait
 * that passes the comm timeout returns LP_ERR_TIMEOUT, another failed
 * communication LP_ERR_COMM, with a message naming this rank, the pending
 * action and the peer (lp_exec_last_error); nothing exits here: give the
 * status to lp_comm_on_failure, which takes the job down after a timeout
 * (a started operation cannot be cancelled and a silent peer would leave
 * the others waiting). After a failed communication the executor refuses
 * further steps (LP_ERR_TIMEOUT / _COMM, naming the first failure). Other
 * failures return a status with the text in lp_exec_last_error. */
lp_status lp_exec_step(lp_exec *e, int64_t step, double *loss);

/* The gradient norm of the last step over the whole model, before
 * clipping (the same on every rank); -1 when clipping is off. */
double lp_exec_grad_norm(const lp_exec *e);
/* Sets the learning rate of every optimizer of this rank (from the next
 * step on; a schedule calls it before each step). */
void lp_exec_set_lr(lp_exec *e, float lr);

/* Timing of the last step on this rank: wall time of the step and time
 * spent in compute actions (F, B, I, W, FB), in seconds. */
void lp_exec_last_timing(const lp_exec *e, double *wall_s, double *busy_s);

/* Always-on step timing of this rank (a few clock reads per action, no
 * allocation, no Lua). Seconds; overhead = wall - compute - wait, which
 * holds the posting of sends and receives, polling, the executor's own
 * bookkeeping and the data/loss calls' share outside compute actions. */
typedef struct lp_exec_timing {
  int64_t steps;   /* steps summed (the last step: 1; 0 before any) */
  double wall;     /* zero-grad to the end of the optimizer step */
  double compute;  /* F, B, I, W, FB actions less their waits, gradient
                    * sums of replicated stages, zero-grad, optimizer */
  double wait;     /* waiting on messages: receives, the step's last
                    * sends, gradient reductions */
  double post;     /* posting sends/receives, polling sends (overhead) */
  double optim;    /* zero-grad and optimizer step (part of compute) */
  double overhead; /* wall - compute - wait */
  /* MoE all-to-alls (EP > 1): count; their time (per exchange: from its
   * start to the end of its wait when the rank had to wait for it, else
   * the emulated link's time for its bytes, capped at the time from its
   * start to its wait); the part the rank spent blocked waiting for it;
   * the part hidden under compute (in flight while the rank was neither
   * blocked on it nor on another exchange or message: hidden share =
   * a2a_hidden / a2a); and the emulated link's modelled time of them all
   * (latency + the larger direction's bytes / bandwidth; the rest of a2a
   * beyond it is waiting for the slower EP partner). The blocked part
   * counts in its action's compute time (it is what the action costs when
   * its all-to-all is not hidden). */
  int64_t a2a_count;
  double a2a, a2a_blocked, a2a_hidden, a2a_link;
  /* step end before the optimizer: summing the copies of replicated stages
   * and the EP group's gradients, waits excluded (part of compute) */
  double reduce;
  /* bytes this rank sent: activations and gradients to other pipeline
   * ranks (bf16 between stages: 2 a value, else 4), and MoE token rows to
   * the other EP ranks (the all-to-alls' pieces for other ranks) */
  double msg_bytes, a2a_bytes;
} lp_exec_timing;

/* Compute action kinds of lp_exec_action_time, in this order: the
 * schedule's compute kinds (LP_KIND_*), whose one name table is
 * lp_kind_name ("F", "B", "I", "W", "FB"). */
enum {
  LP_EXEC_K_F = LP_KIND_F,
  LP_EXEC_K_B = LP_KIND_B,
  LP_EXEC_K_I = LP_KIND_I,
  LP_EXEC_K_W = LP_KIND_W,
  LP_EXEC_K_FB = LP_KIND_FB,
  LP_EXEC_NKINDS = LP_NKINDS
};

/* Timing of the last successful step (total 0) or the sum over the steps
 * since lp_exec_timing_reset (total 1; divide by out->steps for means). */
void lp_exec_timing_of(const lp_exec *e, int total, lp_exec_timing *out);
/* Measured time of the compute actions of `kind` (LP_EXEC_K_*) on model
 * stage `stage` (an FB pair counts on its F half's stage), waits excluded:
 * sum in seconds and count, for the last step or since the reset.
 * LP_ERR_ARG for a bad kind or stage. */
lp_status lp_exec_action_time(const lp_exec *e, int total, int kind, int stage,
                              double *sum_s, int64_t *count);
/* The MoE exchanges (EP all-to-all-v) of kind F, B or I on the stage,
 * counted per half (a lone action, or either half of an FB pair, under
 * its own kind and stage): how many the halves started, the bytes this
 * rank sent to / received from the other EP ranks in them, the sum over
 * them of the larger direction (what the link serialises:
 * lp_link_alltoallv_time), and how many halves ran. And per action (FB
 * pairs under FB): the seconds it sat blocked waiting for exchanges (part
 * of the actions' time in lp_exec_action_time: time minus blocked is the
 * actions' compute alone, what the simulator's exchange model adds to). */
typedef struct lp_exec_exchanges {
  int64_t n;
  double bytes_out, bytes_in, bytes_max, blocked;
  int64_t halves;
} lp_exec_exchanges;
lp_status lp_exec_action_exchanges(const lp_exec *e, int total, int kind, int stage,
                                   lp_exec_exchanges *out);
/* Clears the totals (e.g. after a warm-up step) and the kept steps. */
void lp_exec_timing_reset(lp_exec *e);
/* Each compute action's time in the last steps (always on): up to
 * LP_EXEC_HISTORY successful steps since lp_exec_timing_reset are kept, the
 * oldest dropped; lp_exec_step_times_count says how many. Step k (0: the
 * oldest kept): *wall_s its wall time, *after_s what followed the last
 * action (the optimizer with the gradient sums of replicated stages and
 * the EP group: lp_exec_timing's optim + reduce), *times one entry per
 * action of this rank's list (*n of them): seconds in the action, waits
 * for its receives excluded (as lp_exec_action_time), 0 for a non-compute
 * action. Borrowed until the next step. LP_ERR_ARG for a bad k. What
 * perf.summary replays (each step simulated with its own action times). */
enum { LP_EXEC_HISTORY = 64 };
int lp_exec_step_times_count(const lp_exec *e);
lp_status lp_exec_step_times(const lp_exec *e, int k, double *wall_s, double *after_s,
                             const double **times, int *n);

/* ---- the job's timing, gathered on every rank (timing.c) ----
 * What perf.summary compares with the simulator, collected from every
 * rank of the job in one collective (lp_exec_job_timing) so that no
 * caller packs figures into numbered slots: per world rank its totals,
 * host share, gradient-sum message and kept steps; per (kind, model stage)
 * the sums over the ranks; the measured message latency. A new per-rank
 * figure is a field of lp_exec_rank_times (set in timing.c's own_figures,
 * named in the binding: lb_exec.c's push_job_p), never a position. */

/* One compute slice of a rank's last traced step: its action's index in
 * the rank's list (-1: the optimizer step), its start on the common trace
 * clock and its length, microseconds (as lp_trace_event's). */
typedef struct lp_exec_slice {
  int index;
  double start_us, dur_us;
} lp_exec_slice;

/* One world rank's figures. */
typedef struct lp_exec_rank_times {
  lp_exec_timing total;       /* lp_exec_timing_of(total = 1) on that rank */
  int host_ranks, host_cores; /* lp_exec_host_share */
  int64_t grad_floats;        /* its largest gradient-sum message (the max
                               * over stages of lp_exec_message_floats'
                               * grad; 0: it holds no replicated stage) */
  int nacts;                  /* actions in its list */
  int nkept;                  /* steps it kept (lp_exec_step_times_count) */
  /* the last job->kept of its kept steps, oldest first: step k's row at
   * kept + k * (2 + nacts) holds wall, after and one time per action, as
   * lp_exec_step_times gives them (seconds; 0 for non-compute actions) */
  const double *kept;
  /* with tracing on: the compute slices of its last step (those after its
   * next-to-last optimizer slice), in recorded order; else none */
  int nslices;
  const lp_exec_slice *slices;
} lp_exec_rank_times;

/* One (kind, model stage), summed over the job's ranks in rank order:
 * lp_exec_action_time's sum and count and lp_exec_action_exchanges'
 * counters, since the reset (total = 1). */
typedef struct lp_exec_kind_times {
  double sum;
  int64_t n;
  lp_exec_exchanges x;
} lp_exec_kind_times;

/* The most kept-step numbers a gather carries over all ranks together:
 * a job whose ranks kept more gathers fewer steps (8 MB; 64 ranks of
 * 4,000 actions: 3 steps). */
enum { LP_EXEC_JOB_KEPT_MAX = 1000000 };

typedef struct lp_exec_job_times {
  int ranks;                /* world ranks (pp x dp) */
  int stages;               /* model stages */
  int ep;                   /* ranks per pipeline rank (the DP group, dp; = the EP group
                             * size without DP): world rank = pipeline rank * ep + index */
  lp_exec_rank_times *rank; /* [ranks], by world rank */
  lp_exec_timing sum;       /* every rank's total, summed in rank order */
  lp_exec_kind_times *kinds; /* [LP_EXEC_NKINDS x stages]: kind k (LP_EXEC_K_*)
                              * on model stage s at k * stages + s */
  /* kept steps gathered per rank: the fewest any rank kept (0: a rank kept
   * none, then no rank's are gathered), at most LP_EXEC_JOB_KEPT_MAX numbers
   * in all (sum over ranks of 2 + nacts per step) but at least 1 */
  int kept;
  /* the measured message latency (tracing on; else 0 and 0): over the
   * messages whose receiver had to wait (a receive slice of nonzero length
   * matched to its send by step, sender, receiver and tag), from the later
   * of the send's start and the wait's start to the end of the wait; the
   * mean in ms and the count. The same on every rank (the ranks of one
   * host share the trace clock). */
  double latency_ms;
  int64_t latency_messages;
  void *data; /* owned: what rank[].kept and rank[].slices point into */
} lp_exec_job_times;

/* Gathers the job's timing (above) on every rank over the job's comm:
 * collective, between steps; every rank gets the same *out (free with
 * lp_exec_job_times_free). Two all-gathers: each rank's fixed figures, then
 * its kept steps, messages and slices. LP_OK, or a status with the text in
 * lp_exec_last_error: LP_ERR_NOMEM (every rank returns it when one rank
 * could not pack its figures; a rank that runs out of memory while
 * gathering leaves the others to the watchdog), the comm's failure, or
 * LP_ERR_INTERNAL when a rank's piece is not the size its figures say. */
lp_status lp_exec_job_timing(lp_exec *e, lp_exec_job_times **out);
void lp_exec_job_times_free(lp_exec_job_times *t);

/* This rank's virtual stages: count, and the id / model stage / chunk of
 * the i-th (borrowed). */
int lp_exec_vstages(const lp_exec *e);
/* The tokens routed to each logical expert in the last step, summed over
 * every rank (the same on all): *layers MoE layers of the whole model in
 * model order, (*experts)[l] experts of layer l, their counts back to back
 * in *counts (NULL before the first step or without MoE). Borrowed. */
lp_status lp_exec_expert_loads(const lp_exec *e, int *layers, const int **experts,
                               const double **counts);
/* Applies a new expert placement to MoE layer `layer` of the model (0-based
 * in model order, as lp_exec_expert_loads): slots_per_rank slots per EP
 * rank, phys_to_log[slot] its logical expert (ep x slots_per_rank
 * entries, every expert at least once). Between steps; collective over
 * every rank (ranks not holding the layer's stage do nothing). Expert
 * weights and their optimizer state move point to point inside each EP
 * group from the lowest old holder; the stage's optimizer is rebuilt over
 * the new parameter list with the moved state, so training continues as
 * it would have. *bytes_moved (optional) gets the bytes this rank sent.
 * LP_ERR_ARG for a bad layer or map (text in lp_exec_last_error), nothing
 * changed; a failure after the layer took the new slots (out of memory
 * rebuilding the optimizer) leaves the executor unusable: end the job. */
lp_status lp_exec_set_placement(lp_exec *e, int layer, int slots_per_rank,
                                const int *phys_to_log, int64_t *bytes_moved);
/* Sets MoE layer `moe` (lp_nn_moe_find order) of this rank's i-th virtual
 * stage to the placement (slots_per_rank, phys_to_log) without moving
 * anything: local, not collective, for loading a checkpoint that holds
 * the values. Slots of experts this rank did not hold start from their
 * seeded values; the stage's optimizer is rebuilt with zero state (import
 * the real state). LP_ERR_ARG (nothing changed) for a bad index or map;
 * another failure leaves the executor unusable. */
lp_status lp_exec_restore_placement(lp_exec *e, int i, int moe, int slots_per_rank,
                                    const int *phys_to_log);
/* The EP group size (1: no EP) and this rank's index in it. */
int lp_exec_ep(const lp_exec *e, int *ep_rank);
/* The DP group size (1: none) and this rank's index in it. */
int lp_exec_dp(const lp_exec *e, int *dp_rank);
/* Bytes of optimizer state this rank holds (every local stage's). */
size_t lp_exec_optim_bytes(const lp_exec *e);
/* The DP gradient sums (dp beyond the EP group, or ZeRO-1) since the
 * executor started: count, their time (start to finish), the part hidden
 * under the rank's other work (in flight before the step end's wait for
 * them), the link model's time of them. */
typedef struct lp_exec_dp_timing {
  int64_t n;
  double s, hidden, link;
} lp_exec_dp_timing;
void lp_exec_dp_timing_of(const lp_exec *e, lp_exec_dp_timing *out);
/* The same per rank (the mean over every rank), and the optimizer bytes
 * per rank (the mean): collective over the job's comm, between steps. */
typedef struct lp_exec_dp_stats {
  int dp, ep, zero;
  double optim_bytes;     /* per rank, mean over ranks */
  lp_exec_dp_timing sums; /* per rank: the mean over ranks */
} lp_exec_dp_stats;
lp_status lp_exec_dp_stats_of(lp_exec *e, lp_exec_dp_stats *out);
/* Ranks of the job on this rank's host; *cores: the CPUs their affinity
 * masks allow together. More ranks than cores: ranks also wait for a core,
 * which the simulator does not model (its prediction does not apply). */
int lp_exec_host_share(const lp_exec *e, int *cores);
/* Floats of the messages this rank's model stage `stage` takes part in, for
 * the simulator's link model: *act the activation (and input-grad) message
 * into the stage (0 for stage 0), *grad the gradient-sum message of the
 * stage when this rank holds a copy of it that is stored more than once
 * (DualPipe), else 0. LP_ERR_ARG for a stage out of range. */
lp_status lp_exec_message_floats(const lp_exec *e, int stage, size_t *act, size_t *grad);
/* The precision of the values between model stages (the chunks' boundary
 * precision, lp_nn_chunk_boundary) and *value_bytes (optional), the bytes
 * a value takes in a message: 2 for bf16 values of host tensors, else 4. */
lp_tensor_precision lp_exec_wire(const lp_exec *e, int *value_bytes);
int lp_exec_vstage_id(const lp_exec *e, int i);
int lp_exec_vstage_stage(const lp_exec *e, int i);
lp_nn_layer *lp_exec_vstage_chunk(const lp_exec *e, int i);
/* ... and its optimizer (borrowed), the executor's schedule (its clone)
 * and communicator. */
lp_nn_optim *lp_exec_vstage_optim(const lp_exec *e, int i);
const lp_schedule *lp_exec_schedule(const lp_exec *e);
lp_comm *lp_exec_comm(const lp_exec *e); /* the job's comm (all pp x ep ranks) */

/* Runs one half of an action (for an overlapped_fb hook): type LP_ACT_F,
 * LP_ACT_B, LP_ACT_I or LP_ACT_W on virtual stage v, micro-batch mb. */
lp_status lp_exec_run_half(lp_exec *e, int type, int v, int mb);

/* The same halves in phases, for an overlapped_fb hook that orders the
 * two micro-batches' phases itself: lp_exec_half_begin takes the inputs
 * (type LP_ACT_F, LP_ACT_B or LP_ACT_I on virtual stage v, micro-batch
 * mb; at most one forward and one backward half at a time);
 * lp_exec_half_advance runs the forward (backward = 0) or backward half
 * up to its next expert-parallel exchange (lp_nn_advance), *done = 1 once
 * the half finished (output handed on, loss taken, weight-grad run for
 * B); lp_exec_half_phase names what its next advance runs ("attn/dense",
 * "dispatch", "experts", "combine"; "done" when no half runs);
 * lp_exec_half_weight_grad_part runs one weight-grad piece the running
 * full-backward half's input-grad has made ready (lp_nn_weight_grad_part:
 * a layer's experts, a finished block; *did = 0 when none is ready, or the
 * half is I or none runs): the half's finish runs only the rest. A hook
 * must finish both halves, in the same order of advances on every rank of
 * the EP group (an advance waits for its half's exchange, so ranks taking
 * different orders could wait for each other).
 *
 * The default pair, where the EP group's comm lets ranks start operations
 * on two contexts in any order (MPI: backward halves exchange on a second
 * context), runs whichever half can go on without waiting (the forward
 * when both can: its chain of exchanges is the longer), a ready
 * weight-grad piece while both wait (the previous pair's backward's last
 * weight-grads, carried over, first), and waits for whichever exchange
 * ends first only when nothing is left. Otherwise (a backend that needs one
 * order on every rank, as NCCL does: a GPU run's EP context over NCCL) a
 * fixed order, DeepSeek-V3's: advances alternate backward first,
 * the forward's "dispatch" advance right after the one before it, and the
 * ready weight-grad pieces after each backward advance. */
lp_status lp_exec_half_begin(lp_exec *e, int type, int v, int mb);
lp_status lp_exec_half_advance(lp_exec *e, int backward, int *done);
const char *lp_exec_half_phase(const lp_exec *e, int backward);
lp_status lp_exec_half_weight_grad_part(lp_exec *e, int *did);

/* Sets the text lp_exec_last_error reports (for an overlapped_fb hook that
 * fails for its own reasons); msg is copied. */
void lp_exec_set_error(lp_exec *e, const char *msg);

/* The measured events recorded so far (opts.trace), times in microseconds
 * since the common start (a barrier in lp_exec_new). Borrowed; NULL when
 * tracing is off. */
lp_trace *lp_exec_trace(lp_exec *e);

/* Gathers the measured events of every rank on rank 0 over the comm (no
 * shared file system needed): collective, between steps. On rank 0 *out
 * gets one trace (to lp_trace_free) with every send paired with its
 * receive (lp_trace_link_messages) and times starting at 0; on other ranks
 * *out is NULL. The events carry a step marker per step and the counters
 * "live activations" and "pending W" (as simulated traces do). LP_OK, or a
 * status with the text in lp_exec_last_error (LP_ERR_ARG when tracing is
 * off). */
lp_status lp_exec_trace_gather(lp_exec *e, lp_trace **out);
/* Gathers (lp_exec_trace_gather) and writes the Chrome JSON at path on
 * rank 0 (atomically). Collective; every rank returns rank 0's status. */
lp_status lp_exec_trace_write(lp_exec *e, const char *path);

/* Drops the measured events recorded so far (to keep only the last steps
 * of a long run). LP_OK (nothing to do when tracing is off) or
 * LP_ERR_NOMEM. */
lp_status lp_exec_trace_clear(lp_exec *e);

/* ---- checkpoints (checkpoint.c) -------------------------------------------
 * One file per rank, <dir>/rank<R>.ckpt: magic "LPIPECKP", format version,
 * byte-order mark, rank, rank count, model stages, virtual stages, schedule
 * name, optimizer kind, EP size and EP index, the step; per local virtual
 * stage its MoE layers (experts, slots per rank, the placement in force as
 * phys_to_log, the router bias); then per local virtual stage its id, model
 * stage, optimizer step count, parameter names and shapes, parameter values
 * and optimizer state (floats, native byte order), the steps that updated
 * each parameter of the optimizer (count, then int64s: an expert no token
 * reached in a step was not updated); an FNV-1a 64 checksum of everything
 * before it at the end (format version 3; version 2 files, without the
 * per-parameter steps, are read as every parameter taking every step;
 * version 1 files, which have no MoE records, are refused naming the
 * versions read). A DualPipe rank
 * saves each of its copies. Loading restores each MoE layer's placement
 * (lp_exec_restore_placement) before it checks and reads the parameters, so
 * slot parameters land in their slots, and sets the router biases last.
 * Not collective: each rank saves / loads its own file. */

/* Writes this rank's stages (parameter values, optimizer state) and `step`
 * to <dir>/rank<R>.ckpt: first <dir>/rank<R>.ckpt.tmp, fsync, rename over
 * the old file, fsync of dir, so the file is always either the old
 * checkpoint or the complete new one. dir must exist. LP_OK, or LP_ERR_IO /
 * LP_ERR_NOMEM with the text (naming the file) in lp_exec_last_error. */
lp_status lp_exec_checkpoint_save(lp_exec *e, const char *dir, int64_t step);
/* Reads <dir>/rank<R>.ckpt and, only when every check passes, replaces this
 * rank's parameter values and optimizer states with it; *step (optional)
 * gets its step. Errors name the file and what is wrong: LP_ERR_IO (missing,
 * unreadable), LP_ERR_PARSE (not a checkpoint, truncated, checksum mismatch,
 * other format version or byte order), LP_ERR_INVALID (written for another
 * rank, rank count, schedule, model or optimizer: the message says which
 * and both values; EP size; MoE layers or experts per layer). On failure
 * nothing is changed, except that a placement already restored is set back
 * with its expert slots at their seeded values and zero optimizer state —
 * what a fresh executor, the one a resume loads into, holds anyway. */
lp_status lp_exec_checkpoint_load(lp_exec *e, const char *dir, int64_t *step);
/* <dir>/rank<rank>.ckpt into buf (n bytes, truncated like snprintf). */
void lp_exec_checkpoint_path(const char *dir, int rank, char *buf, size_t n);

/* ---- the no-pipeline reference ------------------------------------------ */

/* One training step of `model` (all stages in one chunk, or any layer) on
 * one process, the way a pipeline step must behave: zero grads; for each
 * micro-batch 0..M-1 in order, forward, the loss scaled by 1/M, full
 * backward; then one optimizer step and the MoE layers' router-bias update
 * from the step's expert loads. *loss gets the mean micro-batch loss.
 * LP_OK, or a status with the reason in err (LP_ERRLEN). */
lp_status lp_exec_reference_step(lp_nn_layer *model, lp_nn_optim *optim,
                                 lp_nn_loss_kind loss_kind, int M,
                                 lp_exec_data_fn data, void *ud, int64_t step,
                                 double *loss, char *err);
/* The same with global gradient-norm clipping at `clip` (0: off) before
 * the optimizer step, as torch.nn.utils.clip_grad_norm_ over every
 * parameter of model; *gnorm (optional) gets the norm before clipping (-1
 * when off). A negative or non-finite clip is LP_ERR_ARG. */
lp_status lp_exec_reference_step_clip(lp_nn_layer *model, lp_nn_optim *optim,
                                      lp_nn_loss_kind loss_kind, int M,
                                      lp_exec_data_fn data, void *ud, int64_t step,
                                      float clip, double *loss, double *gnorm,
                                      char *err);

/* ---- the training device (device.c) ----
 * The rule that decides which device a rank trains on. A name is "cpu",
 * "cuda" (this process's GPU: its local rank on the node modulo the visible
 * devices) or "cuda:N" (device N, 0 <= N <= LP_DEVICE_MAX). */
#define LP_DEVICE_CPU (-1)   /* parsed "cpu"; picked: no device */
#define LP_DEVICE_LOCAL (-2) /* parsed "cuda": the local rank's device */
#define LP_DEVICE_MAX 1023
/* name -> *want (LP_DEVICE_CPU, LP_DEVICE_LOCAL or N); LP_ERR_ARG with
 * "device 'x' is not cpu, cuda or cuda:N" in err (LP_ERRLEN). */
lp_status lp_exec_device_parse(const char *name, int *want, char *err);
/* The device index for a parsed want, given this process's local rank and
 * the number of visible devices: *device = LP_DEVICE_CPU for the CPU, the
 * index otherwise; LP_ERR_UNSUPPORTED when a device is wanted and none is
 * visible. name is only for the message. Pure: no device is touched. */
lp_status lp_exec_device_pick(const char *name, int want, int local_rank, int visible,
                              int *device, char *err);
/* This process's rank among the ranks of its node (OMPI_COMM_WORLD_LOCAL_RANK,
 * MPI_LOCALRANKID or SLURM_LOCALID), 0 when no launcher says. */
int lp_exec_local_rank(void);
/* The device index a name means for this process, by the rule above,
 * without making a backend: LP_DEVICE_CPU for "cpu", N for "cuda:N", for
 * "cuda" the local rank's device modulo the visible ones (device 0 when
 * none is visible or the CUDA module cannot load: the backend then says
 * why). LP_ERR_ARG with the parse error for a bad name. (layer:to asks
 * this, so "cuda" means the same device there as in training.) */
lp_status lp_exec_device_index(const char *name, int *device, char *err);
/* name -> the backend to train on (*be NULL for the CPU), loading the CUDA
 * module when a device is wanted. LP_OK, or a status with one line in err
 * naming the device and why it cannot be used (bad name, built without
 * CUDA, no visible device, a device that does not exist). */
lp_status lp_exec_device(const char *name, const lp_tensor_backend **be, char *err);
