/* lp_exec.h — runs training steps of a lowered, validated schedule on one
 * rank: per virtual stage an nn chunk and a per-micro-batch context, receives
 * posted ahead of need, asynchronous sends, the loss at the end of each
 * route, gradient reduction of replicated stages (DualPipe), the optimizer
 * step, the watchdog (every wait under the comm timeout; a timeout takes the
 * job down naming rank, action and peer) and measured trace events.
 * Uses lp_schedule, lp_comm, lp_nn, lp_tensor, lp_trace. */
#pragma once

#include "lp_base.h"
#include "lp_comm.h"
#include "lp_nn.h"
#include "lp_schedule.h"
#include "lp_tensor.h"
#include "lp_trace.h"

typedef struct lp_exec lp_exec;

typedef enum lp_exec_loss_kind {
  LP_EXEC_LOSS_MSE = 0,          /* mean squared error against the target */
  LP_EXEC_LOSS_CROSS_ENTROPY = 1 /* logits [..., V] against class ids */
} lp_exec_loss_kind;

typedef enum lp_exec_optim_kind {
  LP_EXEC_OPTIM_SGD = 0,
  LP_EXEC_OPTIM_ADAMW = 1
} lp_exec_optim_kind;

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
 * of the default "F half, then backward half". It may interleave the two
 * halves as it likes but must leave the same effects; it composes them from
 * lp_exec_run_half. NULL: the default. */
typedef lp_status (*lp_exec_fb_fn)(void *ud, lp_exec *e, const lp_action *a);

typedef struct lp_exec_opts {
  lp_comm *comm;               /* NULL: lp_comm_world() */
  lp_exec_chunk_fn chunk;      /* required */
  lp_exec_data_fn data;        /* required */
  void *ud;                    /* passed to chunk, data and overlapped_fb */
  lp_exec_loss_kind loss;
  /* shape of the activation entering model stage s (s = 1..S-1; index 0 is
   * unused), the same for every micro-batch; act_ndim[s] dims in
   * act_shape[s][0..]. Gradients travelling back have the same shape. */
  const int *act_ndim;
  const int64_t (*act_shape)[LP_TENSOR_MAXDIM];
  lp_exec_optim_kind optim;
  lp_nn_sgd_opts sgd;
  lp_nn_adamw_opts adamw;
  int recv_lookahead;          /* post receives this many compute actions
                                * ahead (0: 4; < 0: all at step start) */
  int trace;                   /* 1: record measured trace events */
  lp_exec_fb_fn overlapped_fb; /* NULL: default F then B */
} lp_exec_opts;

/* Creates the executor of this rank (lp_comm_rank of opts->comm) for
 * schedule s, which must be lowered (lp_schedule_lower) or have a single
 * rank. Checks that the comm has lp_schedule_ranks(s) ranks, that every
 * (kind, vstage, mb) message tag fits lp_comm_tag_ub, builds the chunks of
 * this rank's virtual stages (each copy of a replicated stage its own) and
 * one optimizer per virtual stage. s is cloned. LP_OK and *out, or a status
 * with the reason in err (LP_ERRLEN). Collective: every rank calls it (one
 * barrier to align trace clocks). */
lp_status lp_exec_new(const lp_schedule *s, const lp_exec_opts *opts,
                      lp_exec **out, char *err);
void lp_exec_free(lp_exec *e);

/* Text of the last failure ("" when none). */
const char *lp_exec_last_error(const lp_exec *e);

/* Runs one training step (number `step`, passed to the data source): zero
 * grads, every action of this rank in order, gradient reduction of
 * replicated stages (at their REDUCE_GRAD actions, or at the end of the
 * step when the schedule has none), the optimizer step of every virtual
 * stage, and one all-reduce of the loss. *loss (optional) gets the step's
 * loss: the mean over all micro-batches, the same on every rank. A wait
 * that passes the comm timeout calls lp_comm_fatal (every rank exits) with
 * a message naming this rank, the pending action and the peer; other
 * failures return a status with the text in lp_exec_last_error. */
lp_status lp_exec_step(lp_exec *e, int64_t step, double *loss);

/* Timing of the last step on this rank: wall time of the step and time
 * spent in compute actions (F, B, I, W, FB), in seconds. */
void lp_exec_last_timing(const lp_exec *e, double *wall_s, double *busy_s);

/* This rank's virtual stages: count, and the id / model stage / chunk of
 * the i-th (borrowed). */
int lp_exec_vstages(const lp_exec *e);
int lp_exec_vstage_id(const lp_exec *e, int i);
int lp_exec_vstage_stage(const lp_exec *e, int i);
lp_nn_layer *lp_exec_vstage_chunk(const lp_exec *e, int i);

/* Runs one half of an action (for an overlapped_fb hook): type LP_ACT_F,
 * LP_ACT_B, LP_ACT_I or LP_ACT_W on virtual stage v, micro-batch mb. */
lp_status lp_exec_run_half(lp_exec *e, int type, int v, int mb);

/* Sets the text lp_exec_last_error reports (for an overlapped_fb hook that
 * fails for its own reasons); msg is copied. */
void lp_exec_set_error(lp_exec *e, const char *msg);

/* The measured events recorded so far (opts.trace), times in microseconds
 * since the common start (a barrier in lp_exec_new). Borrowed; NULL when
 * tracing is off. */
lp_trace *lp_exec_trace(lp_exec *e);

/* ---- the no-pipeline reference ------------------------------------------ */

/* One training step of `model` (all stages in one chunk, or any layer) on
 * one process, the way a pipeline step must behave: zero grads; for each
 * micro-batch 0..M-1 in order, forward, the loss scaled by 1/M, full
 * backward; then one optimizer step. *loss gets the mean micro-batch loss.
 * LP_OK, or a status with the reason in err (LP_ERRLEN). */
lp_status lp_exec_reference_step(lp_nn_layer *model, lp_nn_optim *optim,
                                 lp_exec_loss_kind loss_kind, int M,
                                 lp_exec_data_fn data, void *ud, int64_t step,
                                 double *loss, char *err);
