/* timing.c — the executor's always-on timing and measured trace events.
 * It owns e->tm (ex_timing): the common trace clock, the trace and its
 * counters, the step's parts (the action loop and the other files add to
 * them with ex_time_*), per (kind, model stage) action times and exchange
 * counters, the last step and the totals the public getters report, the
 * kept steps' action times (lp_exec_step_times). */
#include "exec_internal.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- construction ---- */

/* The step history (e->tm.hist) for e->nacts actions; freed with it. */
static lp_status hist_new(lp_exec *e) {
  ex_hist *h = &e->tm.hist;
  size_t row = (size_t)e->nacts + 2;
  h->cur = lp_calloc(row, sizeof(double));
  h->ring = lp_calloc(row * LP_EXEC_HISTORY, sizeof(double));
  h->head = h->len = 0;
  return h->cur && h->ring ? LP_OK : LP_ERR_NOMEM;
}

static void hist_free(lp_exec *e) {
  lp_free(e->tm.hist.cur);
  lp_free(e->tm.hist.ring);
  e->tm.hist.cur = e->tm.hist.ring = NULL;
}

lp_status ex_timing_new(lp_exec *e) {
  lp_status st;
  e->tm.act_s = lp_calloc((size_t)(2 * LP_EXEC_NKINDS * e->S), sizeof(double));
  e->tm.act_n = lp_calloc((size_t)(2 * LP_EXEC_NKINDS * e->S), sizeof(int64_t));
  e->tm.act_x = lp_calloc((size_t)(2 * EX_NX * LP_EXEC_NKINDS * e->S), sizeof(double));
  if (!e->tm.act_s || !e->tm.act_n || !e->tm.act_x) return LP_ERR_NOMEM;
  LP_CHECK(hist_new(e));
  if (e->o.trace) {
    e->tm.trace = lp_trace_new();
    if (!e->tm.trace) return LP_ERR_NOMEM;
  }
  /* the common trace clock: rank 0's start time. Ranks on rank 0's host
   * share its monotonic clock and take the time itself; others take the
   * moment the broadcast arrives (off by its latency). */
  struct {
    double t0;
    char host[64];
  } clk;
  memset(&clk, 0, sizeof clk);
  char host[64] = "";
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  if ((st = lp_comm_barrier(e->world, "lp_exec_new: aligning the trace clocks")) != LP_OK) {
    lp_errf(e->err, "%s", lp_comm_last_error(e->world));
    return st;
  }
  clk.t0 = lp_now();
  memcpy(clk.host, host, sizeof clk.host);
  if ((st = lp_comm_bcast(e->world, &clk, sizeof clk, 0, "lp_exec_new: the trace clock")) !=
      LP_OK) {
    lp_errf(e->err, "%s", lp_comm_last_error(e->world));
    return st;
  }
  e->tm.t0 = host[0] && strncmp(clk.host, host, sizeof host) == 0 ? clk.t0 : lp_now();
  return LP_OK;
}

void ex_timing_free(lp_exec *e) {
  lp_free(e->tm.act_s);
  lp_free(e->tm.act_n);
  lp_free(e->tm.act_x);
  hist_free(e);
  lp_trace_free(e->tm.trace);
  e->tm.act_s = e->tm.act_x = NULL;
  e->tm.act_n = NULL;
  e->tm.trace = NULL;
}

/* ---- the step's parts ---- */

double ex_time_step_begin(lp_exec *e) {
  e->tm.busy = 0;
  e->tm.wait = e->tm.post = e->tm.comp = e->tm.optim = 0;
  e->tm.reduce = 0;
  memset(e->tm.act_s, 0, (size_t)LP_EXEC_NKINDS * e->S * sizeof *e->tm.act_s);
  memset(e->tm.act_n, 0, (size_t)LP_EXEC_NKINDS * e->S * sizeof *e->tm.act_n);
  memset(e->tm.act_x, 0, (size_t)EX_NX * LP_EXEC_NKINDS * e->S * sizeof *e->tm.act_x);
  memset(e->tm.hist.cur, 0, ((size_t)e->nacts + 2) * sizeof(double));
  double start = lp_now();
  e->tm.live = e->tm.pending_w = 0;
  if (e->tm.trace) {
    lp_trace_marker mk = {e->rank, "", (start - e->tm.t0) * 1e6};
    snprintf(mk.name, sizeof mk.name, "step %lld", (long long)e->step);
    lp_trace_add_marker(e->tm.trace, &mk); /* a marker lost to NOMEM is only cosmetic */
  }
  return start;
}

void ex_time_wait(lp_exec *e, double s) { e->tm.wait += s; }
void ex_time_post(lp_exec *e, double s) { e->tm.post += s; }

void ex_time_compute(lp_exec *e, int i, double s) {
  const lp_action *a = &e->acts[i];
  e->tm.busy += s;
  e->tm.comp += s;
  int k = ex_kind_of(a->type), ms = e->vstage[a->stage];
  if (k >= 0 && ms >= 0 && ms < e->S) {
    e->tm.act_s[k * e->S + ms] += s;
    e->tm.act_n[k * e->S + ms]++;
  }
  if (i >= 0 && i < e->nacts) e->tm.hist.cur[2 + i] = s;
}

void ex_time_reduce(lp_exec *e, double s) {
  e->tm.reduce = s;
  e->tm.comp += s;
}

void ex_time_zero_grad(lp_exec *e, double s) { e->tm.optim += s; }

void ex_time_optim(lp_exec *e, double s) {
  e->tm.busy += s;
  e->tm.optim += s;
}

void ex_time_action_begin(lp_exec *e) { e->tm.waited = 0; }
void ex_time_recv_wait(lp_exec *e, double s) { e->tm.waited += s; }

/* ---- trace events ---- */

int ex_trace_add(lp_exec *e, int kind, const char *name, const char *cat, double start,
                 double end, int v, int mb, int index, int peer, int tag) {
  if (!e->tm.trace) return -1;
  lp_trace_event ev;
  lp_trace_event_init(&ev);
  ev.rank = e->rank;
  ev.kind = kind;
  snprintf(ev.name, sizeof ev.name, "%s", name);
  snprintf(ev.cat, sizeof ev.cat, "%s", cat);
  ev.start_us = (start - e->tm.t0) * 1e6;
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
  if (lp_trace_add_event(e->tm.trace, &ev, &idx) != LP_OK) return -1;
  return idx;
}

static void add_counter(lp_exec *e, const char *name, double at, double value) {
  lp_trace_counter c;
  memset(&c, 0, sizeof c);
  c.rank = e->rank;
  snprintf(c.name, sizeof c.name, "%s", name);
  c.time_us = (at - e->tm.t0) * 1e6;
  c.value = value;
  lp_trace_add_counter(e->tm.trace, &c); /* a sample lost to NOMEM only thins the counter */
}

void ex_trace_memory(lp_exec *e, double at, int dlive, int dpw) {
  e->tm.live += dlive;
  e->tm.pending_w += dpw;
  if (!e->tm.trace) return;
  if (dlive) add_counter(e, "live activations", at, e->tm.live);
  if (dpw) add_counter(e, "pending W", at, e->tm.pending_w);
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

/* The finished step's action times become the newest kept step. */
static void hist_commit(lp_exec *e, double wall, double after) {
  ex_hist *h = &e->tm.hist;
  size_t row = (size_t)e->nacts + 2;
  h->cur[0] = wall;
  h->cur[1] = after;
  memcpy(h->ring + row * (size_t)h->head, h->cur, row * sizeof(double));
  h->head = (h->head + 1) % LP_EXEC_HISTORY;
  if (h->len < LP_EXEC_HISTORY) h->len++;
}

int lp_exec_step_times_count(const lp_exec *e) { return e->tm.hist.len; }

lp_status lp_exec_step_times(const lp_exec *e, int k, double *wall_s, double *after_s,
                             const double **times, int *n) {
  const ex_hist *h = &e->tm.hist;
  if (k < 0 || k >= h->len) return LP_ERR_ARG;
  int at = (h->head - h->len + k + LP_EXEC_HISTORY) % LP_EXEC_HISTORY;
  const double *r = h->ring + ((size_t)e->nacts + 2) * (size_t)at;
  if (wall_s) *wall_s = r[0];
  if (after_s) *after_s = r[1];
  if (times) *times = r + 2;
  if (n) *n = e->nacts;
  return LP_OK;
}

void ex_timing_commit(lp_exec *e, double wall) {
  e->tm.wall = wall;
  lp_exec_timing *l = &e->tm.last, *t = &e->tm.total;
  l->steps = 1;
  l->wall = e->tm.wall;
  l->optim = e->tm.optim;
  l->compute = e->tm.comp + e->tm.optim;
  l->wait = e->tm.wait;
  l->post = e->tm.post;
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
  l->reduce = e->tm.reduce;
  t->reduce += l->reduce;
  t->a2a_count += l->a2a_count;
  t->a2a += l->a2a;
  t->a2a_blocked += l->a2a_blocked;
  size_t nk = (size_t)LP_EXEC_NKINDS * e->S;
  for (size_t i = 0; i < nk; i++) {
    e->tm.act_s[nk + i] += e->tm.act_s[i];
    e->tm.act_n[nk + i] += e->tm.act_n[i];
  }
  for (size_t i = 0; i < EX_NX * nk; i++) e->tm.act_x[EX_NX * nk + i] += e->tm.act_x[i];
  hist_commit(e, l->wall, l->optim + l->reduce);
}

void lp_exec_last_timing(const lp_exec *e, double *wall_s, double *busy_s) {
  if (wall_s) *wall_s = e->tm.wall;
  if (busy_s) *busy_s = e->tm.busy;
}

void lp_exec_timing_of(const lp_exec *e, int total, lp_exec_timing *out) {
  *out = total ? e->tm.total : e->tm.last;
}

lp_status lp_exec_action_time(const lp_exec *e, int total, int kind, int stage,
                              double *sum_s, int64_t *count) {
  if (kind < 0 || kind >= LP_EXEC_NKINDS || stage < 0 || stage >= e->S) return LP_ERR_ARG;
  size_t i = (total ? (size_t)LP_EXEC_NKINDS * e->S : 0) + (size_t)kind * e->S + stage;
  if (sum_s) *sum_s = e->tm.act_s[i];
  if (count) *count = e->tm.act_n[i];
  return LP_OK;
}

/* This step's exchange counters of compute kind k on virtual stage v's
 * model stage, NULL for a non-compute kind. */
static double *x_at(lp_exec *e, int k, int v) {
  int ms = k >= 0 ? e->vstage[v] : -1;
  if (ms < 0 || ms >= e->S) return NULL;
  return e->tm.act_x + EX_NX * ((size_t)k * e->S + ms);
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
  const double *x = e->tm.act_x + EX_NX * ((total ? nk : 0) + (size_t)kind * e->S + stage);
  out->n = (int64_t)(x[EX_X_N] + 0.5);
  out->bytes_out = x[EX_X_OUT];
  out->bytes_in = x[EX_X_IN];
  out->bytes_max = x[EX_X_MAX];
  out->blocked = x[EX_X_BLOCKED];
  out->halves = (int64_t)(x[EX_X_HALVES] + 0.5);
  return LP_OK;
}

void lp_exec_timing_reset(lp_exec *e) {
  memset(&e->tm.total, 0, sizeof e->tm.total);
  size_t nk = (size_t)LP_EXEC_NKINDS * e->S;
  memset(e->tm.act_s + nk, 0, nk * sizeof *e->tm.act_s);
  memset(e->tm.act_n + nk, 0, nk * sizeof *e->tm.act_n);
  memset(e->tm.act_x + EX_NX * nk, 0, EX_NX * nk * sizeof *e->tm.act_x);
  e->tm.hist.head = e->tm.hist.len = 0;
}

lp_trace *lp_exec_trace(lp_exec *e) { return e->tm.trace; }

lp_status lp_exec_trace_clear(lp_exec *e) {
  if (!e->tm.trace) return LP_OK;
  lp_trace *t = lp_trace_new();
  if (!t) return LP_ERR_NOMEM;
  lp_trace_free(e->tm.trace);
  e->tm.trace = t;
  return LP_OK;
}

/* ---- gathering the measured trace on rank 0 ---- */

/* Ships each rank's packed events to rank 0 as floats (the bytes travel
 * unchanged: every backend copies them as they are; the buffer is padded
 * to whole floats). Sizes first, by one all-reduce. Called between steps,
 * when no message of a step is in flight, so tag 0 is free. */
lp_status lp_exec_trace_gather(lp_exec *e, lp_trace **out) {
  *out = NULL;
  if (!e->tm.trace) {
    lp_errf(e->err, "rank %d: tracing is off (create the executor with trace = 1)", e->rank);
    return LP_ERR_ARG;
  }
  int P = lp_comm_size(e->world);
  void *mine = NULL;
  size_t bytes = 0;
  double *sizes = lp_calloc((size_t)P, sizeof *sizes);
  lp_trace *all = NULL;
  float *rbuf = NULL;
  lp_status st = sizes ? lp_trace_pack(e->tm.trace, &mine, &bytes) : LP_ERR_NOMEM;
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
