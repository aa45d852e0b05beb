/* lp_schedule.h — the schedule IR: ranks, model stages, virtual stages (a
 * model stage placed on a rank), a route per micro-batch and one ordered
 * action list per rank; action text, CSV and JSON I/O; validation; lowering
 * (SEND/RECV insertion); per-rank memory accounting. Uses lp_base only. */
#pragma once

#include "lp_base.h"

typedef enum lp_action_type {
  LP_ACT_F = 0,       /* forward */
  LP_ACT_B,           /* full backward (input-grad + weight-grad) */
  LP_ACT_I,           /* input-grad only; its W comes later */
  LP_ACT_W,           /* weight-grad of an earlier I */
  LP_ACT_FB,          /* overlapped pair: F of one virtual stage, B or I of another */
  LP_ACT_SEND_F,      /* send F output to the next virtual stage of the route */
  LP_ACT_RECV_F,      /* receive F input from the previous virtual stage */
  LP_ACT_SEND_B,      /* send input-grad to the previous virtual stage */
  LP_ACT_RECV_B,      /* receive output-grad from the next virtual stage */
  LP_ACT_REDUCE_GRAD, /* sum gradients of a replicated model stage (no mb) */
  LP_ACT_WAIT_REDUCE_GRAD, /* wait for the reduction its REDUCE_GRAD started */
  LP_ACT_UNSHARD,     /* FSDP: gather a stage's parameters (no mb) */
  LP_ACT_RESHARD,     /* FSDP: free the gathered parameters (no mb) */
  LP_ACT__COUNT
} lp_action_type;

/* One action. Text form (PyTorch torch.distributed.pipelining):
 * `<stage><TYPE><mb>` — "0F3", "7I2", "2SEND_F1", "3REDUCE_GRAD" — and
 * "(0F7;7B3)OVERLAP_F_B" for FB. `stage` is always a virtual stage id. */
typedef struct lp_action {
  int32_t type;   /* lp_action_type */
  int32_t stage;  /* virtual stage (the F half for FB) */
  int32_t mb;     /* micro-batch; -1 for the stage actions (lp_action_has_mb) */
  int32_t btype;  /* FB only: LP_ACT_B or LP_ACT_I */
  int32_t bstage; /* FB only: virtual stage of the backward half */
  int32_t bmb;    /* FB only: micro-batch of the backward half */
} lp_action;

#define LP_ACTION_TEXT_MAX 96

/* Parses one action. On failure returns LP_ERR_PARSE and writes the reason
 * into err (LP_ERRLEN bytes) when err is not NULL. Accepts PyTorch's older
 * "BW" for a full backward. Surrounding spaces are ignored. */
lp_status lp_action_parse(const char *text, lp_action *out, char *err);
/* Writes the text form into buf (LP_ACTION_TEXT_MAX bytes is always enough). */
void lp_action_format(const lp_action *a, char *buf, size_t len);
/* "F", "B", ..., "REDUCE_GRAD", "OVERLAP_F_B" for FB. */
const char *lp_action_type_name(int type);
/* 1 for F, B, I, W, FB (work a rank computes), 0 for communication. */
int lp_action_is_compute(int type);
/* 1 for SEND_F, RECV_F, SEND_B, RECV_B. */
int lp_action_is_p2p(int type);
/* The compute kinds: what the simulator's costs and the executor's timing
 * count, per model stage. Kind k is compute action type k (LP_ACT_F ..
 * LP_ACT_FB, the same order); its name is the one text table every layer
 * uses for costs, timings and trace categories: "F", "B", "I", "W", "FB"
 * (an overlapped pair is "FB" here; its action text is OVERLAP_F_B). */
enum { LP_KIND_F, LP_KIND_B, LP_KIND_I, LP_KIND_W, LP_KIND_FB, LP_NKINDS };
/* The name of kind k; NULL out of range. */
const char *lp_kind_name(int kind);
/* LP_KIND_* of an action type; -1 for a non-compute type. */
int lp_kind_of(int type);
/* 0 for the per-stage actions that take no micro-batch (REDUCE_GRAD,
 * WAIT_REDUCE_GRAD, UNSHARD, RESHARD), 1 for every other type. */
int lp_action_has_mb(int type);

typedef struct lp_schedule lp_schedule;

/* Limits on a schedule's counts, checked before anything is allocated (so
 * "ranks": 4294967298 or 1e8 micro-batches is one clear error, not a
 * truncated count or minutes of work). Actions: about 24 bytes each, so
 * the limit keeps a schedule under ~1.6 GB (validation adds as much). */
#define LP_SCHEDULE_MAX_RANKS 4096
#define LP_SCHEDULE_MAX_STAGES 65536        /* model stages */
#define LP_SCHEDULE_MAX_MICROBATCHES 65536
#define LP_SCHEDULE_MAX_CELLS (1LL << 26)   /* stages x micro-batches */
#define LP_SCHEDULE_MAX_VSTAGES (1 << 20)
#define LP_SCHEDULE_MAX_ACTIONS (1LL << 26) /* all ranks together */

/* LP_OK when 1 <= ranks, stages, microbatches <= their limits and stages x
 * microbatches <= LP_SCHEDULE_MAX_CELLS; else LP_ERR_ARG and err
 * (LP_ERRLEN) names the count and its limit: "ranks must be 1..4096, got
 * 4294967298". */
lp_status lp_schedule_check_counts(long long ranks, long long stages, long long microbatches,
                                   char *err);

/* Creates an empty schedule: no virtual stages, no routes, no actions.
 * Returns LP_ERR_ARG when a count is out of range (lp_schedule_check_counts),
 * LP_ERR_NOMEM on allocation failure; *out is then NULL. The caller owns
 * *out (lp_schedule_free). */
lp_status lp_schedule_new(int ranks, int stages, int microbatches,
                          lp_schedule **out);
void lp_schedule_free(lp_schedule *s);
/* Deep copy; NULL on allocation failure. */
lp_schedule *lp_schedule_clone(const lp_schedule *s);

/* The last error of any call on s, as text naming rank, action and reason;
 * "" when none. Valid until the next call on s. */
const char *lp_schedule_last_error(const lp_schedule *s);

lp_status lp_schedule_set_name(lp_schedule *s, const char *name);
const char *lp_schedule_name(const lp_schedule *s); /* "" when unset */
int lp_schedule_ranks(const lp_schedule *s);
int lp_schedule_stages(const lp_schedule *s);       /* model stages */
int lp_schedule_microbatches(const lp_schedule *s);

/* Places model stage `stage` on `rank` as a new virtual stage; its id
 * (0, 1, 2, ... in order of addition) goes to *id when id is not NULL. */
lp_status lp_schedule_add_vstage(lp_schedule *s, int stage, int rank, int *id);
int lp_schedule_vstages(const lp_schedule *s);
int lp_schedule_vstage_stage(const lp_schedule *s, int vstage); /* -1 if bad id */
int lp_schedule_vstage_rank(const lp_schedule *s, int vstage);  /* -1 if bad id */

/* Sets micro-batch mb's route: the ordered virtual stages it passes through
 * (copied). Every model stage must appear exactly once, in model order. */
lp_status lp_schedule_set_route(lp_schedule *s, int mb, const int *vstages,
                                int n);
/* The route of mb and its length in *n; NULL (and *n = 0) when unset. */
const int *lp_schedule_route(const lp_schedule *s, int mb, int *n);

/* Appends an action to rank's list. Checks only that ids are in range and
 * that the virtual stages are placed on this rank; order is checked by
 * lp_schedule_validate. */
lp_status lp_schedule_push(lp_schedule *s, int rank, const lp_action *a);
/* Parses and appends; parse errors name the text. */
lp_status lp_schedule_push_text(lp_schedule *s, int rank, const char *text);
/* Rank's action list and its length in *n (owned by s). */
const lp_action *lp_schedule_actions(const lp_schedule *s, int rank, int *n);
/* Removes every action of rank (to rebuild its list). */
void lp_schedule_clear_rank(lp_schedule *s, int rank);
/* Keeps the first n actions of rank and removes the rest (n from 0 to the
 * rank's count; a larger n, or a rank out of range, changes nothing). */
void lp_schedule_truncate_rank(lp_schedule *s, int rank, int n);

/* 1 when any SEND/RECV action is present (the schedule is lowered). */
int lp_schedule_has_comm(const lp_schedule *s);

/* ---- I/O ---- */

/* PyTorch-style CSV: one row per rank, one action per cell, empty cell =
 * idle slot. Returns a NUL-terminated string to lp_free, NULL on OOM. */
char *lp_schedule_to_csv(const lp_schedule *s);
/* Reads CSV text. Placement and routes are inferred: a virtual stage lives
 * on the rank whose row holds its actions; micro-batch m's route is the
 * virtual stages that compute m, in increasing id order; a virtual stage's
 * model stage is its position in the routes. Older spellings accepted ("BW";
 * a B followed by a W of the same stage and mb is an I, also among SEND/RECV).
 * `origin` names the source in errors ("file.csv:3: ..."). On failure *out
 * is NULL and err (LP_ERRLEN) says why. */
lp_status lp_schedule_from_csv(const char *text, const char *origin,
                               lp_schedule **out, char *err);
/* JSON: {"name","ranks","stages","microbatches","virtual_stages":[{"id",
 * "stage","rank"}],"routes":[[...]],"actions":[[text...]]}. lp_free it. */
char *lp_schedule_to_json(const lp_schedule *s);

/* ---- validation and lowering ---- */

/* Checks everything the executor and simulator rely on (see README
 * "Validation"). LP_OK, or LP_ERR_INVALID with the first problem in
 * lp_schedule_last_error, e.g. "rank 2, action 14 (5B3): backward of
 * micro-batch 3 on stage 5 comes before its forward". */
lp_status lp_schedule_validate(lp_schedule *s);

/* How a lowered schedule's SEND and RECV wait. NONBLOCKING is what the
 * executor does over MPI and the self backend, and what PyTorch's
 * pipelining runtime does: a SEND posts an isend, a RECV posts an irecv,
 * and the first compute that uses the message waits for it (so a RECV may
 * come long before its SEND is reached, as in PyTorch's schedules whose
 * receives are placed early or deferred). lp_schedule_validate uses it. */
typedef enum lp_send_model {
  LP_SENDS_BUFFERED = 0,   /* a SEND never waits; a RECV waits for its SEND */
  LP_SENDS_RENDEZVOUS = 1, /* a SEND and its RECV happen together */
  LP_SENDS_NONBLOCKING = 2 /* SEND and RECV only post; the consuming compute
                              waits for the SEND */
} lp_send_model;
/* lp_schedule_validate under the given send model; a deadlock message
 * names the model ("deadlock under rendezvous sends ..."). */
lp_status lp_schedule_validate_sends(lp_schedule *s, lp_send_model sends);

/* Validates s (compute-only), then returns a new schedule with SEND/RECV
 * inserted so that it cannot deadlock under any send model; the result is
 * validated again under rendezvous sends (the strictest model). Errors go
 * to s. */
lp_status lp_schedule_lower(lp_schedule *s, lp_schedule **out);

/* ---- memory accounting (walks each rank's list in order) ---- */
typedef struct lp_schedule_memory {
  int peak_live;      /* max activations with F done and B/I not yet */
  int peak_pending_w; /* max activations still held for a pending W */
  int peak_total;     /* max of live + pending_w at the same moment */
  int param_stages;   /* model-stage parameter copies held by the rank */
} lp_schedule_memory;
lp_status lp_schedule_memory_of(const lp_schedule *s, int rank,
                                lp_schedule_memory *out);
