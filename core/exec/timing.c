/* timing.c — the executor's always-on timing and measured trace events. */
#include "exec_internal.h"

#include <stdio.h>
#include <string.h>

int ex_trace_add(lp_exec *e, int kind, const char *name, const char *cat, double start,
                 double end, int v, int mb, int index, int peer, int tag) {
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
  ev.peer = peer;
  ev.tag = tag;
  ev.step = e->step;
  if (index >= 0 && index < e->nacts)
    lp_action_format(&e->acts[index], ev.action, sizeof ev.action);
  int idx = -1;
  if (lp_trace_add_event(e->trace, &ev, &idx) != LP_OK) return -1;
  return idx;
}

static void add_counter(lp_exec *e, const char *name, double at, double value) {
  lp_trace_counter c;
  memset(&c, 0, sizeof c);
  c.rank = e->rank;
  snprintf(c.name, sizeof c.name, "%s", name);
  c.time_us = (at - e->t0) * 1e6;
  c.value = value;
  lp_trace_add_counter(e->trace, &c); /* a sample lost to NOMEM only thins the counter */
}

void ex_trace_memory(lp_exec *e, double at, int dlive, int dpw) {
  e->live += dlive;
  e->pending_w += dpw;
  if (!e->trace) return;
  if (dlive) add_counter(e, "live activations", at, e->live);
  if (dpw) add_counter(e, "pending W", at, e->pending_w);
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

lp_status ex_hist_new(lp_exec *e) {
  size_t row = (size_t)e->nacts + 2;
  e->hist.cur = lp_calloc(row, sizeof(double));
  e->hist.ring = lp_calloc(row * LP_EXEC_HISTORY, sizeof(double));
  e->hist.head = e->hist.len = 0;
  return e->hist.cur && e->hist.ring ? LP_OK : LP_ERR_NOMEM;
}

void ex_hist_free(lp_exec *e) {
  lp_free(e->hist.cur);
  lp_free(e->hist.ring);
  e->hist.cur = e->hist.ring = NULL;
}

void ex_hist_begin(lp_exec *e) {
  memset(e->hist.cur, 0, ((size_t)e->nacts + 2) * sizeof(double));
}

void ex_hist_action(lp_exec *e, int i, double c) {
  if (i >= 0 && i < e->nacts) e->hist.cur[2 + i] = c;
}

/* The finished step's action times become the newest kept step. */
static void hist_commit(lp_exec *e, double wall, double after) {
  ex_hist *h = &e->hist;
  size_t row = (size_t)e->nacts + 2;
  h->cur[0] = wall;
  h->cur[1] = after;
  memcpy(h->ring + row * (size_t)h->head, h->cur, row * sizeof(double));
  h->head = (h->head + 1) % LP_EXEC_HISTORY;
  if (h->len < LP_EXEC_HISTORY) h->len++;
}

int lp_exec_step_times_count(const lp_exec *e) { return e->hist.len; }

lp_status lp_exec_step_times(const lp_exec *e, int k, double *wall_s, double *after_s,
                             const double **times, int *n) {
  const ex_hist *h = &e->hist;
  if (k < 0 || k >= h->len) return LP_ERR_ARG;
  int at = (h->head - h->len + k + LP_EXEC_HISTORY) % LP_EXEC_HISTORY;
  const double *r = h->ring + ((size_t)e->nacts + 2) * (size_t)at;
  if (wall_s) *wall_s = r[0];
  if (after_s) *after_s = r[1];
  if (times) *times = r + 2;
  if (n) *n = e->nacts;
  return LP_OK;
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
  l->a2a_count = e->xc.n;
  l->a2a = e->xc.s;
  l->a2a_blocked = e->xc.blocked;
  l->a2a_hidden = e->xc.hidden;
  l->a2a_link = e->xc.link;
  t->a2a_hidden += l->a2a_hidden;
  t->a2a_link += l->a2a_link;
  l->reduce = e->t_reduce;
  t->reduce += l->reduce;
  t->a2a_count += l->a2a_count;
  t->a2a += l->a2a;
  t->a2a_blocked += l->a2a_blocked;
  size_t nk = (size_t)LP_EXEC_NKINDS * e->S;
  for (size_t i = 0; i < nk; i++) {
    e->act_s[nk + i] += e->act_s[i];
    e->act_n[nk + i] += e->act_n[i];
  }
  for (size_t i = 0; i < EX_NX * nk; i++) e->act_x[EX_NX * nk + i] += e->act_x[i];
  hist_commit(e, l->wall, l->optim + l->reduce);
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

/* This step's exchange counters of compute kind k on virtual stage v's
 * model stage, NULL for a non-compute kind. */
static double *x_at(lp_exec *e, int k, int v) {
  int ms = k >= 0 ? e->vstage[v] : -1;
  if (ms < 0 || ms >= e->S) return NULL;
  return e->act_x + EX_NX * ((size_t)k * e->S + ms);
}

double *ex_action_x(lp_exec *e) {
  if (e->cur < 0 || e->cur >= e->nacts) return NULL;
  const lp_action *a = &e->acts[e->cur];
  return x_at(e, ex_kind_of(a->type), a->stage);
}

double *ex_half_x(lp_exec *e, int which) {
  const half *h = &e->pr.hf[which ? 1 : 0];
  return h->active ? x_at(e, ex_kind_of(h->type), h->v) : NULL;
}

lp_status lp_exec_action_exchanges(const lp_exec *e, int total, int kind, int stage,
                                   lp_exec_exchanges *out) {
  if (kind < 0 || kind >= LP_EXEC_NKINDS || stage < 0 || stage >= e->S) return LP_ERR_ARG;
  size_t nk = (size_t)LP_EXEC_NKINDS * e->S;
  const double *x = e->act_x + EX_NX * ((total ? nk : 0) + (size_t)kind * e->S + stage);
  out->n = (int64_t)(x[EX_X_N] + 0.5);
  out->bytes_out = x[EX_X_OUT];
  out->bytes_in = x[EX_X_IN];
  out->bytes_max = x[EX_X_MAX];
  out->blocked = x[EX_X_BLOCKED];
  out->halves = (int64_t)(x[EX_X_HALVES] + 0.5);
  return LP_OK;
}

void lp_exec_timing_reset(lp_exec *e) {
  memset(&e->ttotal, 0, sizeof e->ttotal);
  size_t nk = (size_t)LP_EXEC_NKINDS * e->S;
  memset(e->act_s + nk, 0, nk * sizeof *e->act_s);
  memset(e->act_n + nk, 0, nk * sizeof *e->act_n);
  memset(e->act_x + EX_NX * nk, 0, EX_NX * nk * sizeof *e->act_x);
  e->hist.head = e->hist.len = 0;
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

/* ---- gathering the measured trace on rank 0 ---- */

/* Ships each rank's packed events to rank 0 as floats (the bytes travel
 * unchanged: every backend copies them as they are; the buffer is padded
 * to whole floats). Sizes first, by one all-reduce. Called between steps,
 * when no message of a step is in flight, so tag 0 is free. */
lp_status lp_exec_trace_gather(lp_exec *e, lp_trace **out) {
  *out = NULL;
  if (!e->trace) {
    lp_errf(e->err, "rank %d: tracing is off (create the executor with trace = 1)", e->rank);
    return LP_ERR_ARG;
  }
  int P = lp_comm_size(e->world);
  void *mine = NULL;
  size_t bytes = 0;
  double *sizes = lp_calloc((size_t)P, sizeof *sizes);
  lp_trace *all = NULL;
  float *rbuf = NULL;
  lp_status st = sizes ? lp_trace_pack(e->trace, &mine, &bytes) : LP_ERR_NOMEM;
  /* a rank that cannot pack still takes part (size 0) so no rank hangs */
  if (sizes) sizes[e->rank] = st == LP_OK ? (double)bytes : -1;
  if (lp_comm_allreduce_sum_double(e->world, sizes, sizes ? (size_t)P : 0,
                                   "gathering the measured trace (sizes)") != LP_OK) {
    lp_errf(e->err, "%s", lp_comm_last_error(e->world));
    st = LP_ERR_COMM;
    goto done;
  }
  for (int r = 0; r < P; r++)
    if (sizes[r] < 0) {
      lp_errf(e->err, "rank %d: out of memory packing its trace events", r);
      st = LP_ERR_NOMEM;
      goto done;
    }
  char what[96];
  if (e->rank != 0) {
    snprintf(what, sizeof what, "rank %d sends its trace events to rank 0", e->rank);
    size_t nf = (bytes + sizeof(float) - 1) / sizeof(float);
    float *pad = lp_calloc(nf ? nf : 1, sizeof(float));
    if (!pad) { st = LP_ERR_NOMEM; goto done; }
    memcpy(pad, mine, bytes);
    st = lp_comm_send(e->world, pad, nf, 0, 0, what);
    lp_free(pad);
    if (st != LP_OK) lp_errf(e->err, "%s", lp_comm_last_error(e->world));
    goto done;
  }
  all = lp_trace_new();
  if (!all) { st = LP_ERR_NOMEM; goto done; }
  LP_CHECK_GOTO(lp_trace_unpack_append(all, mine, bytes), st, done);
  for (int r = 1; r < P; r++) {
    size_t nb = (size_t)sizes[r], nf = (nb + sizeof(float) - 1) / sizeof(float);
    rbuf = lp_malloc((nf ? nf : 1) * sizeof(float));
    if (!rbuf) { st = LP_ERR_NOMEM; goto done; }
    snprintf(what, sizeof what, "rank 0 waits for the trace events of rank %d", r);
    st = lp_comm_recv(e->world, rbuf, nf, r, 0, what);
    if (st != LP_OK) {
      lp_errf(e->err, "%s", lp_comm_last_error(e->world));
      goto done;
    }
    st = lp_trace_unpack_append(all, rbuf, nb);
    if (st != LP_OK) {
      lp_errf(e->err, "rank 0: the trace events of rank %d are damaged", r);
      goto done;
    }
    lp_free(rbuf);
    rbuf = NULL;
  }
  LP_CHECK_GOTO(lp_trace_link_messages(all), st, done);
  lp_trace_start_at_zero(all);
  *out = all;
  all = NULL;
done:
  if (st == LP_ERR_NOMEM && !*e->err) lp_errf(e->err, "rank %d: out of memory gathering the trace", e->rank);
  lp_trace_free(all);
  lp_free(rbuf);
  lp_free(mine);
  lp_free(sizes);
  return st;
}

lp_status lp_exec_trace_write(lp_exec *e, const char *path) {
  lp_trace *all = NULL;
  e->err[0] = '\0';
  lp_status st = lp_exec_trace_gather(e, &all);
  if (st == LP_OK && all) st = lp_trace_write_json(all, path, e->err);
  lp_trace_free(all);
  /* every rank returns rank 0's outcome */
  int code = st;
  if (lp_comm_bcast(e->world, &code, sizeof code, 0, "the outcome of writing the trace") != LP_OK) {
    lp_errf(e->err, "%s", lp_comm_last_error(e->world));
    return LP_ERR_COMM;
  }
  if (code != LP_OK && st == LP_OK)
    lp_errf(e->err, "rank 0 could not write the trace %s", path);
  return (lp_status)code;
}
