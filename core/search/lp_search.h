/* lp_search.h — schedule search. A candidate is a placement (fixed per
 * search context) plus, per rank, a priority for every action slot (F, the
 * backward, W of each virtual stage and micro-batch), a split bit per
 * backward (full B, or I now and W later) and a pairing switch per rank (F
 * and a backward of another virtual stage run as one overlapped FB when the
 * cost model makes the pair cheaper). The decoder turns a candidate into a
 * schedule by list scheduling over the simulator's cost model: each rank,
 * when free, runs the ready action of best priority that the memory gate
 * admits. The gate keeps the state safe (docs/search.md): every candidate
 * decodes to a valid, deadlock-free schedule within the memory limit.
 * Seeds: rule priorities, Zero Bubble's greedy (reimplemented), and any
 * schedule given (families); improvement: late-acceptance hill climbing
 * (a changed candidate is kept when it scores no worse than the current
 * one or than the score recorded 64 moves before; after 4000 moves without
 * a new best it restarts from the best, kicked by random moves) on the
 * priorities, split bits and pairing, within a time budget. Lower bounds:
 * per-rank work with start skew, one micro-batch's critical path, memory
 * time (docs/search.md). Uses lp_base, lp_schedule and lp_sim. */
#pragma once

#include <stdint.h>

#include "lp_base.h"
#include "lp_schedule.h"
#include "lp_sim.h"

typedef enum lp_search_objective {
  LP_SEARCH_MAKESPAN = 0, /* every rank's end, start skew included (simulate's makespan) */
  LP_SEARCH_SPAN = 1,     /* Zero Bubble's: max over ranks of last end - first start */
  LP_SEARCH_CUSTOM = 2    /* the callback below */
} lp_search_objective;

typedef enum lp_search_split {
  LP_SEARCH_SPLIT_AUTO = 0,   /* the search chooses B or I + W per backward */
  LP_SEARCH_SPLIT_ALWAYS = 1, /* every backward is I, its W later */
  LP_SEARCH_SPLIT_NEVER = 2   /* every backward is a full B */
} lp_search_split;

/* Per rank figures of one decoded candidate. */
typedef struct lp_search_rank_eval {
  double start, finish, busy; /* first action's start, last action's end */
  double peak_memory;         /* activation units, w_share applied */
} lp_search_rank_eval;

typedef struct lp_search_eval {
  double makespan, span;
  int ranks;
  const lp_search_rank_eval *rank; /* [ranks] */
} lp_search_eval;

/* A custom objective: smaller is better; NaN stops the search with an
 * error ("the objective failed"). */
typedef double (*lp_search_objective_fn)(void *ud, const lp_search_eval *e);

typedef struct lp_search_problem {
  int ranks, stages, microbatches;
  int nvstages;
  const int *vstage_stage, *vstage_rank; /* [nvstages] */
  int nroutes;
  const int *routes;   /* [nroutes * stages]: virtual stage ids in model order */
  const int *mb_route; /* [microbatches]: route of each micro-batch; NULL: route 0 */
  const lp_sim_cost *cost; /* times (per model stage) and latency; no exchanges */
  const double *act;       /* [stages] activation units of one mb; NULL: 1 each */
  const double *memory;    /* [ranks] limit in activation units; NULL: unlimited */
  double w_share;          /* share of an activation held from its I to its W, 0..1 */
  int split;               /* lp_search_split */
  int pairs;               /* 1: overlapped FB pairs allowed (used when cheaper) */
  int objective;           /* lp_search_objective */
  lp_search_objective_fn fn;
  void *ud;
  uint64_t seed;
} lp_search_problem;

/* The lower bounds (docs/search.md); all in cost units. */
typedef struct lp_search_bounds {
  double work;        /* max over ranks of the least work a rank must do */
  double skew;        /* max over ranks of (earliest start + work + least tail) */
  double path;        /* one micro-batch's critical path */
  double memory_time; /* max over ranks of (least activation-time) / limit */
  double makespan;    /* max of the five */
  double span;        /* max(work, memory_time, path) */
  double warmup;      /* pairs: max over ranks of the least end when the forwards
                         before a rank's first backward run unpaired */
} lp_search_bounds;

typedef struct lp_search_stats {
  long long evaluations; /* candidates decoded, schedules scored */
  double seconds;        /* spent in seeding and lp_search_run */
  double best;           /* objective of the best (HUGE_VAL when none) */
  double makespan, span; /* of the best */
  double lower_bound;    /* for the objective (custom: the makespan's) */
  double gap;            /* (best - lower_bound) / lower_bound; 0 when both 0 */
  int from_schedule;     /* 1: the best is a given schedule, as given */
  double best_at;        /* seconds from lp_search_new to finding the best */
  double zb_greedy;       /* Zero Bubble's greedy as it orders, simulated (HUGE_VAL: not a
                          * linear placement, or nothing fits) */
  char best_label[64];   /* "annealing", "seed: zb-greedy", "1f1b", ... */
} lp_search_stats;

typedef struct lp_search lp_search;

/* Checks the problem (every count, placement, route, cost, limit; a limit
 * below one micro-batch's need on a rank is an error naming the rank) and
 * builds a context. On failure *out is NULL and err (LP_ERRLEN) says why. */
lp_status lp_search_new(const lp_search_problem *p, lp_search **out, char *err);
void lp_search_free(lp_search *S);
const char *lp_search_last_error(const lp_search *S);

/* Decodes the built-in seeds: rule priorities and Zero Bubble's greedy. */
lp_status lp_search_seed_rules(lp_search *S);
/* Scores s as given (simulated under the cost model; its peak memory must
 * fit the limits: *fits says whether it did) and, when its placement is
 * the context's, seeds a candidate from its per-rank order. `label` names
 * it in the stats. Per-rank peak memory of s goes to peak (when not NULL). */
lp_status lp_search_add_schedule(lp_search *S, lp_schedule *s, const char *label,
                                 int *fits, double *objective, double *peak);
/* Seeds a candidate from keys[slot] (slot = (vstage * microbatches + mb)
 * * 3 + kind, kind 0 F, 1 backward, 2 W; smaller runs first among the ready
 * heads of a rank; slots of (vstage, mb) pairs off the route are ignored)
 * and split[vstage * microbatches + mb] (NULL: the default). */
lp_status lp_search_seed_keys(lp_search *S, const double *keys, const unsigned char *split,
                              const char *label);
/* Improves the candidate (late-acceptance hill climbing) for up to
 * `seconds` (wall clock) or max_evals decodes (<= 0: no limit); can be
 * called again to continue. */
lp_status lp_search_run(lp_search *S, double seconds, long long max_evals);

void lp_search_stats_of(const lp_search *S, lp_search_stats *out);
void lp_search_bounds_of(const lp_search *S, lp_search_bounds *out);
/* Per rank peak memory of the best ([ranks]). LP_ERR_ARG when none yet. */
lp_status lp_search_best_peak(const lp_search *S, double *peak);
/* The best as a schedule (compute actions only, validated); the caller
 * frees it. LP_ERR_ARG when there is no best yet. */
lp_status lp_search_best_schedule(lp_search *S, lp_schedule **out);

/* Peak memory per rank of s (list order; F holds act[stage] from its
 * start to its backward, an I keeps w_share of it until its W). */
lp_status lp_search_schedule_peak(const lp_schedule *s, const double *act, double w_share,
                                  double *peak);
