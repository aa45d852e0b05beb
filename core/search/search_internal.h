/* search_internal.h — the search context shared by search.c (decoder,
 * climb, results), setup.c (checks, bounds) and zb.c (Zero Bubble's
 * greedy). */
#pragma once

#include "lp_search.h"

#define LP_SEARCH_MAX_LOCAL 16 /* virtual stages per rank */

/* A candidate: a key per action slot (smaller runs first among the ready
 * heads), a split bit per (virtual stage, mb), pairing per rank. */
typedef struct cand {
  double *key;          /* [nslot] */
  unsigned char *split; /* [V * M] */
  unsigned char *pair;  /* [P] */
  double score;
} cand;

/* The decoder's state for one candidate. */
typedef struct decoder {
  double *fend, *bend;      /* [V * M]: end of F / of the backward, -1 not yet */
  int *nf, *nb;             /* [V]: next F / backward index into vm_list */
  int *wq, *wq_head, *wq_tail; /* W queue per v: wq[vm_first[v] + k] */
  double *use, *rem;        /* [P * M]: memory of mb on rank, F need still to come */
  double *usage, *peak;     /* [P] */
  double *free_at, *busy, *start, *T; /* [P] */
  int *ch_kind, *ch_v, *ch_m, *ch_pv, *ch_pm, *ch_forceb; /* [P]: the choice */
  long long left;                     /* actions still to run */
  int *order, *ord_idx, nord, ord_lo; /* admission order; ord_idx -1 not yet, -2 done */
  int *mb_left;                       /* [M] actions left */
  lp_action *out;                     /* [nslot]: per rank at out_first[r] */
  double *out_start, *out_end;
  int *out_n;                         /* [P] */
  lp_search_rank_eval *ev_rank;       /* [P] */
  double makespan, span;
} decoder;

struct lp_search {
  char err[LP_ERRLEN];
  int P, S, M, V, NR;
  int *vs_stage, *vs_rank; /* [V] */
  int *routes;             /* [NR * S] */
  int *mb_route;           /* [M] */
  int *pos;                /* [V * M] route position, -1 */
  lp_sim_times *t;         /* [V] resolved, fb = LP_SIM_UNSET when not set */
  int *fbset;              /* [V] */
  double *act, *act_v;     /* [S], [V] */
  double lat, w_share;
  double *limit;           /* [P], HUGE_VAL unlimited */
  int split, pairs, objective;
  lp_search_objective_fn fn;
  void *ud;
  lp_sim_cost cost_copy;
  lp_sim_times *stage_times; /* [S] copy of the overrides */
  const lp_sim_cost *cost;
  int *vm_first, *vm_list; /* mbs through v, in order */
  int *rv_first, *rv_list; /* virtual stages of a rank */
  int *rs_first, *rs_list, *rs_tmp, *sort_tmp; /* slots of a rank; sort space */
  int nslot;
  int *out_first;          /* [P + 1] */
  double *need, *maxneed;  /* [P * M], [P] */
  double *f_asap, *b_asap; /* [V] earliest F start, backward start of one mb */
  decoder D;
  cand cur, trial, best_c;
  int have_cur;
  double *hist;
  int nhist;
  long long iter, since_best, evaluations;
  double seconds;
  uint64_t rng;
  /* the best */
  int have_best, best_is_sched;
  double best_score, best_makespan, best_span;
  double *best_peak;   /* [P] */
  lp_action *best_acts; /* [nslot] at out_first */
  int *best_n;          /* [P] */
  lp_schedule *best_sched; /* when the best is a given schedule */
  char best_label[64];
  lp_search_bounds bounds;
  double lb_obj;
  double t0, best_at; /* creation time; seconds from it to the best */
  double zb_best; /* Zero Bubble's greedy, as it orders (simulated); HUGE_VAL none */
};

static inline int slot_of(const lp_search *S, int v, int m, int kind) {
  return (v * S->M + m) * 3 + kind;
}

lp_status search_setup(lp_search *S, const lp_search_problem *p, char *err);
lp_status search_score(lp_search *S, const lp_search_eval *e, double *score);
lp_status search_alloc_candidates(lp_search *S);
void search_free_candidates(lp_search *S);
lp_status search_zb_greedy(lp_search *S);
