/* timing.c — the executor's always-on timing and measured trace events. */
#include "exec_internal.h"

#include <stdio.h>
#include <string.h>

int ex_trace_add(lp_exec *e, int kind, const char *name, const char *cat,
                     double start, double end, int v, int mb, int index) {
  if (!e->trace) return -1;
  lp_trace_event ev;
  lp_trace_event_init(&ev);
  ev.rank = e->rank;
  ev.kind = kind;
  snprintf(ev.name, sizeof ev.name, "%s", name);
  snprintf(ev.cat, sizeof ev.cat, "%s", cat);
  ev.start_us = (start - e->t0) * 1e6;
  ev.dur_us = (end - start) * 1e6;
  ev.stage = v;
  ev.mb = mb;
  ev.index = index;
  if (index >= 0 && index < e->nacts)
    lp_action_format(&e->acts[index], ev.action, sizeof ev.action);
  int idx = -1;
  if (lp_trace_add_event(e->trace, &ev, &idx) != LP_OK) return -1;
  return idx;
}

int ex_kind_of(int type) {
  switch (type) {
  case LP_ACT_F: return LP_EXEC_K_F;
  case LP_ACT_B: return LP_EXEC_K_B;
  case LP_ACT_I: return LP_EXEC_K_I;
  case LP_ACT_W: return LP_EXEC_K_W;
  case LP_ACT_FB: return LP_EXEC_K_FB;
  default: return -1;
  }
}

/* The finished step's timing becomes the last step's and joins the totals. */
void ex_timing_commit(lp_exec *e) {
  lp_exec_timing *l = &e->tlast, *t = &e->ttotal;
  l->steps = 1;
  l->wall = e->wall;
  l->optim = e->t_optim;
  l->compute = e->t_comp + e->t_optim;
  l->wait = e->t_wait;
  l->post = e->t_post;
  l->overhead = l->wall - l->compute - l->wait;
  t->steps++;
  t->wall += l->wall;
  t->optim += l->optim;
  t->compute += l->compute;
  t->wait += l->wait;
  t->post += l->post;
  t->overhead += l->overhead;
  size_t nk = (size_t)LP_EXEC_NKINDS * e->S;
  for (size_t i = 0; i < nk; i++) {
    e->act_s[nk + i] += e->act_s[i];
    e->act_n[nk + i] += e->act_n[i];
  }
}

void lp_exec_last_timing(const lp_exec *e, double *wall_s, double *busy_s) {
  if (wall_s) *wall_s = e->wall;
  if (busy_s) *busy_s = e->busy;
}

void lp_exec_timing_of(const lp_exec *e, int total, lp_exec_timing *out) {
  *out = total ? e->ttotal : e->tlast;
}

lp_status lp_exec_action_time(const lp_exec *e, int total, int kind, int stage,
                              double *sum_s, int64_t *count) {
  if (kind < 0 || kind >= LP_EXEC_NKINDS || stage < 0 || stage >= e->S) return LP_ERR_ARG;
  size_t i = (total ? (size_t)LP_EXEC_NKINDS * e->S : 0) + (size_t)kind * e->S + stage;
  if (sum_s) *sum_s = e->act_s[i];
  if (count) *count = e->act_n[i];
  return LP_OK;
}

void lp_exec_timing_reset(lp_exec *e) {
  memset(&e->ttotal, 0, sizeof e->ttotal);
  size_t nk = (size_t)LP_EXEC_NKINDS * e->S;
  memset(e->act_s + nk, 0, nk * sizeof *e->act_s);
  memset(e->act_n + nk, 0, nk * sizeof *e->act_n);
}

lp_trace *lp_exec_trace(lp_exec *e) { return e->trace; }

lp_status lp_exec_trace_clear(lp_exec *e) {
  if (!e->trace) return LP_OK;
  lp_trace *t = lp_trace_new();
  if (!t) return LP_ERR_NOMEM;
  lp_trace_free(e->trace);
  e->trace = t;
  return LP_OK;
}
