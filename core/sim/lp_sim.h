/* lp_sim.h — the deterministic pipeline simulator: a validated schedule and
 * a cost model in, a timeline out (per-action start/end, per-rank busy time
 * and bubble, messages between ranks, activation counters over time).
 * Uses lp_base and lp_schedule only. Times are in abstract cost units. */
#pragma once

#include "lp_base.h"
#include "lp_schedule.h"

/* A field holding LP_SIM_UNSET was not given; any other negative value is
 * an error (LP_ERR_ARG). */
#define LP_SIM_UNSET (-1.0)

/* Compute times of one model stage (or of every stage, as the default). */
typedef struct lp_sim_times {
  double f;  /* forward */
  double b;  /* full backward */
  double i;  /* input-grad only */
  double w;  /* weight-grad */
  double fb; /* an overlapped F&B pair; unset: F + the backward half's time */
} lp_sim_times;

/* The MoE all-to-all exchanges (expert-parallel dispatch / combine) of one
 * half (F, B or I) of an action on one model stage: how many per action (a
 * mean is fine) and the bytes this rank sends to / receives from the other
 * EP ranks in one of them. Each takes the link's all-to-all-v time
 * (lp_sim_alltoallv_time) times link_unit. */
typedef struct lp_sim_exchanges {
  double n, bytes_out, bytes_in; /* each >= 0 */
} lp_sim_exchanges;

/* The cost model. Resolution for a model stage: the stage's override
 * fields replace the defaults field by field, then the gaps are filled so
 * that B = I + W: B unset, I and W set: B = I + W; B and W: I = B - W;
 * B and I: W = B - I; only B: I = W = B/2; only I: W = I, B = 2I; only W:
 * I = W, B = 2W; none: B = 2, I = W = 1. F unset: 1. All three given are
 * kept as given. FB unset: F of the pair's F-half stage + B (or I) of its
 * backward-half stage; FB set (on the F half's stage or globally) is used
 * for every pair whose F half is on that stage. */
typedef struct lp_sim_cost {
  lp_sim_times t; /* defaults for every model stage */
  double latency; /* per cross-rank message, >= 0 */
  /* Emulated link (lp_link, the comm layer's model and LUAPIPE_LINK's
   * syntax): a cross-rank message of message_bytes bytes takes
   * latency + link_unit * lp_link_time(&link, message_bytes) from its
   * producer's end to its consumer (lp_sim_message_delay). Link times are
   * in seconds, scaled by link_unit into cost units. Zero link: no change. */
  lp_link link;
  double message_bytes; /* bytes of one activation / gradient message, >= 0 */
  /* The activation's size by dtype: act_values values in one activation
   * (one micro-batch entering a model stage: what a message carries, and
   * the unit of the memory counters), value_bytes bytes a value (4:
   * float32, also for 0; 2: bf16, where activations at stage boundaries and
   * messages are bf16). With act_values > 0 a message is act_values x
   * value_bytes bytes (message_bytes must then be 0: one or the other) and
   * the rank stats give peak_act_bytes. */
  double act_values;
  int value_bytes;
  /* cost units per second of link time, for exchanges and messages: 1
   * (and 0, the same) when F, B, I, W are in seconds, 1000 in ms */
  double link_unit;
  /* MoE exchanges: [3 * stage + h], h = 0 F, 1 B, 2 I, for model stages
   * 0..nexchange_stages-1 (NULL / 0: none; borrowed). With X_h = n *
   * link_unit * lp_sim_alltoallv_time(bytes_out, bytes_in) of the action's
   * half h (0 when no link is set), an action is charged:
   *   F, B, I  its compute + X_F, X_B, X_I (nothing hides them);
   *   FB       C + max(0, X_f - C_b) + max(0, X_b - C_f), where C_f, C_b
   *            are the compute times of the F half and the backward half
   *            (B or I) and C = FB when given, else C_f + C_b: each half's
   *            exchanges hide under the other half's compute, the part
   *            longer than it is exposed (max-style overlap). */
  const lp_sim_exchanges *exchanges;
  int nexchange_stages;
  /* Per-action times (each measured action of one step, say): durations[r]
   * holds one entry per action of rank r's list; a set entry replaces the
   * whole time of that compute action (an FB pair's, exchanges included:
   * they are reported as modelled, none hidden), LP_SIM_UNSET keeps the
   * model's. Ranks r >= nduration_ranks or with durations[r] NULL keep the
   * model. A set entry on a non-compute action is an error (LP_ERR_ARG).
   * Borrowed, only read during lp_sim_run. */
  const double *const *durations;
  int nduration_ranks;
  /* Data parallelism: every model stage's gradients summed over a DP
   * group of dp_ranks ranks (0 or 1: none), dp_bytes[stage] bytes
   * (stages 0..ndp_stages-1; NULL: none; borrowed). A copy's sum starts
   * at the end of its last grad-writing action (B, W, an FB pair's B; a
   * stage with two copies on the pipeline at the end of its rank's last
   * action, after the copies' sum), one at a time on the rank's link, and
   * takes link_unit * lp_link_allreduce_time(&link, dp_ranks, bytes) (a
   * ring); the rank finishes no earlier than its sums. The part of each
   * before the rank's last action ends is hidden (lp_sim_rank_stats). */
  int dp_ranks;
  const double *dp_bytes;
  int ndp_stages;
  int nstages;    /* entries in `stages` (0: no overrides) */
  /* [model stage]: overrides, LP_SIM_UNSET = inherit; borrowed, only
   * read during lp_sim_run */
  const lp_sim_times *stages;
} lp_sim_cost;

/* The delay of one cross-rank message under c (NULL: 0) into *out:
 * c->latency + link_unit * lp_link_time(&c->link, c->message_bytes) (a
 * link_unit of 0 counts as 1). LP_ERR_ARG with
 * the reason in err for a latency or message size lp_sim_time_check
 * refuses, or a negative or non-finite link field. */
lp_status lp_sim_message_delay(const lp_sim_cost *c, double *out, char *err);
/* Bytes of one activation under c: act_values x value_bytes (0 counts as
 * 4); 0 without act_values. The bytes of one message: message_bytes, or
 * the activation's bytes when act_values is given. */
double lp_sim_act_bytes(const lp_sim_cost *c);
double lp_sim_message_bytes(const lp_sim_cost *c);
/* Time of one rank's all-to-all-v phase (expert-parallel dispatch or
 * combine) under c's link: lp_link_alltoallv_time(&c->link, bytes_out,
 * bytes_in), the comm layer's model; 0 for a NULL c. */
double lp_sim_alltoallv_time(const lp_sim_cost *c, double bytes_out,
                             double bytes_in);
/* The one check of a time or latency value (the Lua layers ask it too):
 * LP_OK when 0 <= v <= LP_SIM_MAX_TIME (so sums stay finite), else
 * LP_ERR_ARG and err (LP_ERRLEN) says "<key> = <v> must be a number in
 * 0..1e+15". */
#define LP_SIM_MAX_TIME 1e15
lp_status lp_sim_time_check(const char *key, double v, char *err);

/* Every time unset, latency 0, no overrides (the default cost model). */
void lp_sim_cost_init(lp_sim_cost *c);
void lp_sim_times_init(lp_sim_times *t); /* every field LP_SIM_UNSET */

/* Resolved times of model stage `stage` (out->fb stays LP_SIM_UNSET when
 * FB is derived per pair). LP_ERR_ARG with the reason in err (LP_ERRLEN)
 * for a negative time or a derived negative I or W. */
lp_status lp_sim_cost_resolve(const lp_sim_cost *c, int stage,
                              lp_sim_times *out, char *err);

typedef struct lp_sim_result lp_sim_result;

/* Validates s (lp_schedule_validate) and simulates it. On success *out is
 * a new result the caller frees with lp_sim_result_free. On failure *out
 * is NULL and err (LP_ERRLEN bytes) holds the message: LP_ERR_INVALID with
 * the validator's text, LP_ERR_ARG for a bad cost model, LP_ERR_NOMEM, or
 * LP_ERR_INTERNAL when a rank waits for an input that never comes (which
 * validation should have caught). SEND/RECV actions take no rank time:
 * messages are derived from the routes. REDUCE_GRAD, WAIT_REDUCE_GRAD,
 * UNSHARD and RESHARD take no time either (stages are not sharded).
 * cost may be NULL (the default model). Deterministic. */
lp_status lp_sim_run(lp_schedule *s, const lp_sim_cost *cost,
                     lp_sim_result **out, char *err);
void lp_sim_result_free(lp_sim_result *r);

/* One computed action (F, B, I, W, FB) of the timeline. */
typedef struct lp_sim_event {
  int rank;
  int index; /* position in the rank's action list (0-based) */
  lp_action action;
  double start, end;
} lp_sim_event;

/* One cross-rank message (an F output or an input-grad). */
typedef struct lp_sim_message {
  int from, to;         /* ranks */
  int from_index;       /* producer's position in from's action list */
  int to_index;         /* consumer's position in to's action list */
  double sent, arrived; /* producer's end (explicit SEND/RECV: when its rank
                          reaches the SEND); sent + latency */
  lp_action what;       /* the producing half, e.g. 0F3 or 7B5 (never FB) */
  char text[LP_ACTION_TEXT_MAX]; /* its text */
} lp_sim_message;

/* Per-rank figures. */
typedef struct lp_sim_rank_stats {
  double busy;         /* sum of action durations */
  double finish;       /* end of the rank's last action (0 when none) */
  double bubble;       /* makespan - busy */
  double bubble_ratio; /* bubble / makespan (0 when makespan is 0) */
  int peak_live;       /* activations with F started and B/I not finished */
  int peak_pending_w;  /* activations held after an I for its W */
  /* MoE exchanges (cost.exchanges): their modelled time summed over the
   * rank's actions, and the part hidden under the other half's compute of
   * an FB pair (hidden share = a2a_hidden / a2a) */
  double a2a, a2a_hidden;
  /* data-parallel gradient sums (cost.dp_ranks): their modelled time and
   * the part hidden under the rank's actions (the rest extends finish) */
  double dp, dp_hidden;
  /* peak over time of the activations held (live + pending W) x the
   * activation's bytes (cost.act_values x value_bytes; 0 without them) */
  double peak_act_bytes;
} lp_sim_rank_stats;

/* A point of a rank's memory counters: values from time t on. */
typedef struct lp_sim_sample {
  double t;
  int live, pending_w;
} lp_sim_sample;

int lp_sim_ranks(const lp_sim_result *r);
int lp_sim_stages(const lp_sim_result *r); /* model stages */
int lp_sim_microbatches(const lp_sim_result *r);
const char *lp_sim_name(const lp_sim_result *r); /* the schedule's name */
double lp_sim_makespan(const lp_sim_result *r);
double lp_sim_max_bubble(const lp_sim_result *r);
/* The delay of every cross-rank message: lp_sim_message_delay. */
double lp_sim_latency(const lp_sim_result *r);
/* Fills *out for rank; LP_ERR_ARG when rank is out of range. */
lp_status lp_sim_rank_stats_of(const lp_sim_result *r, int rank,
                               lp_sim_rank_stats *out);
/* Every event, ordered by rank then position; owned by r. */
const lp_sim_event *lp_sim_events(const lp_sim_result *r, int *n);
/* The events of one rank (a slice of lp_sim_events); NULL, *n = 0 if bad. */
const lp_sim_event *lp_sim_rank_events(const lp_sim_result *r, int rank,
                                       int *n);
/* Every message, ordered by (sent, from, from_index, to); owned by r. */
const lp_sim_message *lp_sim_messages(const lp_sim_result *r, int *n);
/* Rank's counter series: first sample at t = 0, then one per change. */
const lp_sim_sample *lp_sim_memory(const lp_sim_result *r, int rank, int *n);
