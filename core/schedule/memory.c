/* memory.c — lp_schedule_memory_of: activation accounting along one rank's
 * action list (F holds an activation until its B or I; an I's activation is
 * held for its W). Communication and the stage actions do not count. */
#include "schedule_internal.h"

#include <string.h>

static void note(lp_schedule_memory *m, int live, int pending) {
  if (live > m->peak_live) m->peak_live = live;
  if (pending > m->peak_pending_w) m->peak_pending_w = pending;
  if (live + pending > m->peak_total) m->peak_total = live + pending;
}

lp_status lp_schedule_memory_of(const lp_schedule *s, int rank,
                                lp_schedule_memory *out) {
  memset(out, 0, sizeof *out);
  if (rank < 0 || rank >= s->ranks) return LP_ERR_ARG;
  for (int v = 0; v < s->nvst; v++)
    if (s->vst[v].rank == rank) out->param_stages++;
  int live = 0, pending = 0;
  const action_list *l = &s->acts[rank];
  for (int i = 0; i < l->n; i++) {
    lp__half h[2];
    int nh = lp__halves(&l->v[i], h);
    for (int j = 0; j < nh; j++) { /* FB: its F half, then its backward half */
      switch (h[j].type) {
      case LP_ACT_F: live++; break;
      case LP_ACT_B: live--; break;
      case LP_ACT_I: live--, pending++; break;
      case LP_ACT_W: pending--; break;
      default: break;
      }
      note(out, live, pending);
    }
  }
  return LP_OK;
}
