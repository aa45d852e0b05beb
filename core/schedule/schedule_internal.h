/* schedule_internal.h — the lp_schedule struct, shared by the files of
 * core/schedule only. */
#pragma once

#include "lp_schedule.h"

typedef struct vstage_info {
  int stage, rank;
} vstage_info;

typedef struct action_list {
  lp_action *v;
  int n, cap;
} action_list;

struct lp_schedule {
  char *name;
  int ranks, stages, microbatches;
  vstage_info *vst;
  int nvst, capvst;
  int **routes;   /* [microbatches], NULL when unset */
  int *route_len; /* [microbatches] */
  action_list *acts; /* [ranks] */
  long long nacts;   /* all ranks together (LP_SCHEDULE_MAX_ACTIONS) */
  char err[LP_ERRLEN];
};

/* Formats action a into a static-size buffer for messages. */
#define ACT_TEXT(a, buf) (lp_action_format((a), (buf), sizeof(buf)), (buf))

/* Route position of vstage v for micro-batch mb in O(1) (position k holds
 * model stage k), -1 when v is not on mb's route or mb has none. */
static inline int lp__kpos(const lp_schedule *s, int v, int mb) {
  if (v < 0 || v >= s->nvst || mb < 0 || mb >= s->microbatches || !s->routes[mb])
    return -1;
  int k = s->vst[v].stage;
  return (k < s->route_len[mb] && s->routes[mb][k] == v) ? k : -1;
}

/* One half of a compute action: F, B, I or W of (v, mb). FB has two. */
typedef struct lp__half {
  int type, v, mb;
} lp__half;

/* Splits compute action a into its halves (F half first); returns how many
 * (0 for communication and REDUCE_GRAD). */
static inline int lp__halves(const lp_action *a, lp__half h[2]) {
  if (a->type == LP_ACT_FB) {
    h[0] = (lp__half){LP_ACT_F, a->stage, a->mb};
    h[1] = (lp__half){a->btype, a->bstage, a->bmb};
    return 2;
  }
  if (a->type >= LP_ACT_F && a->type <= LP_ACT_W) {
    h[0] = (lp__half){a->type, a->stage, a->mb};
    return 1;
  }
  return 0;
}
