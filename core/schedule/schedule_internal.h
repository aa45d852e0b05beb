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
  char err[LP_ERRLEN];
};

/* Position of vstage v in micro-batch mb's route, -1 when absent. */
int lp__route_pos(const lp_schedule *s, int mb, int v);
/* Formats action a into a static-size buffer for messages. */
#define ACT_TEXT(a, buf) (lp_action_format((a), (buf), sizeof(buf)), (buf))
