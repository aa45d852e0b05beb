/* timing.c — the executor's always-on timing and measured trace events.
 * It owns e->tm (ex_timing): the common trace clock, the trace and its
 * counters, the step's parts (the action loop and the other files add to
 * them with ex_time_*), per (kind, model stage) action times and exchange
 * counters, the last step and the totals the public getters report, the
 * kept steps' action times (lp_exec_step_times). Across ranks: the trace
 * gathered on rank 0 (lp_exec_trace_gather) and the job's timing gathered
 * on every rank (lp_exec_job_timing: every rank's figures and kept
 * steps, the message latency). */
#include "exec_internal.h"

#include <stdio.h>
#include <stdlib.h>
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
  int k = lp_kind_of(a->type), ms = e->vstage[a->stage];
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

/* *t += *a, field by field (every field of lp_exec_timing). */
static void timing_add(lp_exec_timing *t, const lp_exec_timing *a) {
  t->steps += a->steps;
  t->wall += a->wall;
  t->compute += a->compute;
  t->wait += a->wait;
  t->post += a->post;
  t->optim += a->optim;
  t->overhead += a->overhead;
  t->a2a_count += a->a2a_count;
  t->a2a += a->a2a;
  t->a2a_blocked += a->a2a_blocked;
  t->a2a_hidden += a->a2a_hidden;
  t->a2a_link += a->a2a_link;
  t->reduce += a->reduce;
  t->msg_bytes += a->msg_bytes;
  t->a2a_bytes += a->a2a_bytes;
}

void ex_timing_commit(lp_exec *e, double wall) {
  e->tm.wall = wall;
  lp_exec_timing *l = &e->tm.last;
  l->steps = 1;
  l->wall = e->tm.wall;
  l->optim = e->tm.optim;
  l->compute = e->tm.comp + e->tm.optim;
  l->wait = e->tm.wait;
  l->post = e->tm.post;
  l->overhead = l->wall - l->compute - l->wait;
  l->a2a_count = e->xc.n;
  l->a2a = e->xc.s;
  l->a2a_blocked = e->xc.blocked;
  l->a2a_hidden = e->xc.hidden;
  l->a2a_link = e->xc.link;
  l->reduce = e->tm.reduce;
  l->msg_bytes = e->msg.bytes;
  l->a2a_bytes = e->xc.bytes;
  timing_add(&e->tm.total, l);
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
  return x_at(e, lp_kind_of(a->type), a->stage);
}

double *ex_half_x(lp_exec *e, int which) {
  const half *h = &e->pr.hf[which ? 1 : 0];
  return h->active ? x_at(e, lp_kind_of(h->type), h->v) : NULL;
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
  if (st == LP_ERR_NOMEM && !*e->err)
    lp_errf(e->err, "rank %d: out of memory gathering the trace", e->rank);
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

/* ---- the job's timing, gathered on every rank (lp_exec_job_timing) ----
 * Two all-gathers over e->world. The first carries each rank's fixed
 * figures (rank_head) followed by its (kind, model stage) sums; from them
 * every rank computes the same count of kept steps. The second carries
 * each rank's piece: its messages (msg_rec), its last step's compute
 * slices, then its last `kept` kept steps' rows. */

/* A rank's fixed figures as they travel (the bytes unchanged: every rank
 * runs the same build); fig's pointers are set on arrival. */
typedef struct rank_head {
  lp_exec_rank_times fig;
  int64_t nmsg;   /* message records in its piece */
  int64_t failed; /* 1: this rank could not pack its piece (out of memory) */
} rank_head;

/* One message slice of a rank's trace: a send (its start) or a receive
 * it waited for (the wait's start and end), keyed by (step, sender,
 * receiver, tag). */
typedef struct msg_rec {
  int64_t step;
  int32_t from, to, tag, recv;
  double start, end;
} msg_rec;

/* The message slices and the last step's compute slices of this rank's
 * trace, in recorded order (nothing without a trace). */
static lp_status trace_pieces(const lp_exec *e, msg_rec **msgs, int64_t *nmsg,
                              lp_exec_slice **slices, int *nslices) {
  int n = 0;
  const lp_trace_event *ev = e->tm.trace ? lp_trace_events(e->tm.trace, &n) : NULL;
  *msgs = lp_calloc((size_t)(n ? n : 1), sizeof **msgs);
  *slices = lp_calloc((size_t)(n ? n : 1), sizeof **slices);
  *nmsg = *nslices = 0;
  if (!*msgs || !*slices) return LP_ERR_NOMEM;
  /* the last step: after the next-to-last optimizer slice (a compute
   * slice of no action) */
  int first = 0, seen = 0;
  for (int i = n - 1; i >= 0; i--)
    if (ev[i].kind == LP_TRACE_COMPUTE && ev[i].index < 0 && ++seen == 2) {
      first = i + 1;
      break;
    }
  for (int i = 0; i < n; i++) {
    const lp_trace_event *v = &ev[i];
    if (v->kind == LP_TRACE_COMPUTE && i >= first && strcmp(v->cat, "phase") != 0)
      (*slices)[(*nslices)++] = (lp_exec_slice){v->index, v->start_us, v->dur_us};
    if (v->peer < 0 || v->tag < 0) continue;
    if (v->kind == LP_TRACE_SEND)
      (*msgs)[(*nmsg)++] = (msg_rec){v->step, e->rank, v->peer, v->tag, 0, v->start_us, 0};
    else if (v->kind == LP_TRACE_RECV && v->dur_us > 0)
      (*msgs)[(*nmsg)++] =
          (msg_rec){v->step, v->peer, e->rank, v->tag, 1, v->start_us, v->start_us + v->dur_us};
  }
  return LP_OK;
}

/* Orders message keys; equal keys by position (a later send of one key
 * replaces an earlier one). */
typedef struct send_at {
  const msg_rec *m;
  int64_t pos;
} send_at;

static int cmp_key(const msg_rec *a, const msg_rec *b) {
  if (a->step != b->step) return a->step < b->step ? -1 : 1;
  if (a->from != b->from) return a->from < b->from ? -1 : 1;
  if (a->to != b->to) return a->to < b->to ? -1 : 1;
  if (a->tag != b->tag) return a->tag < b->tag ? -1 : 1;
  return 0;
}

static int cmp_send(const void *pa, const void *pb) {
  const send_at *a = pa, *b = pb;
  int c = cmp_key(a->m, b->m);
  return c ? c : (a->pos < b->pos ? -1 : a->pos > b->pos);
}

/* The message latency (lp_exec_job_times) of the gathered messages m[0..n-1]
 * (every rank's in rank order): each receive, in that order, against the
 * last send of its key. */
static lp_status latency(const msg_rec *m, int64_t n, double *ms, int64_t *count) {
  *ms = 0;
  *count = 0;
  send_at *snd = lp_malloc((size_t)(n ? n : 1) * sizeof *snd);
  if (!snd) return LP_ERR_NOMEM;
  int64_t ns = 0;
  for (int64_t i = 0; i < n; i++)
    if (!m[i].recv) snd[ns++] = (send_at){&m[i], i};
  qsort(snd, (size_t)ns, sizeof *snd, cmp_send);
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!m[i].recv) continue;
    /* the last send of this key: the first entry past it, less one */
    int64_t lo = 0, hi = ns;
    while (lo < hi) {
      int64_t mid = lo + (hi - lo) / 2;
      if (cmp_key(snd[mid].m, &m[i]) <= 0) lo = mid + 1;
      else hi = mid;
    }
    if (lo == 0 || cmp_key(snd[lo - 1].m, &m[i]) != 0) continue;
    double sent = snd[lo - 1].m->start;
    if (m[i].end >= sent) {
      sum += m[i].end - (m[i].start > sent ? m[i].start : sent);
      (*count)++;
    }
  }
  lp_free(snd);
  if (*count > 0) *ms = sum / (double)*count / 1000;
  return LP_OK;
}

/* This rank's fixed figures (f; not its slices) and (kind, model stage)
 * totals into kinds ([LP_EXEC_NKINDS x S]). */
static void own_figures(const lp_exec *e, lp_exec_rank_times *f, lp_exec_kind_times *kinds) {
  f->total = e->tm.total;
  f->host_ranks = lp_exec_host_share(e, &f->host_cores);
  f->grad_floats = 0;
  for (int s = 0; s < e->S; s++) {
    size_t act = 0, grad = 0;
    if (lp_exec_message_floats(e, s, &act, &grad) == LP_OK && (int64_t)grad > f->grad_floats)
      f->grad_floats = (int64_t)grad;
  }
  f->nacts = e->nacts;
  f->nkept = e->tm.hist.len;
  for (int k = 0; k < LP_EXEC_NKINDS; k++)
    for (int s = 0; s < e->S; s++) {
      lp_exec_kind_times *t = &kinds[k * e->S + s];
      lp_exec_action_time(e, 1, k, s, &t->sum, &t->n);
      lp_exec_action_exchanges(e, 1, k, s, &t->x);
    }
}

/* *t += *a (one (kind, model stage)) */
static void kind_add(lp_exec_kind_times *t, const lp_exec_kind_times *a) {
  t->sum += a->sum;
  t->n += a->n;
  t->x.n += a->x.n;
  t->x.bytes_out += a->x.bytes_out;
  t->x.bytes_in += a->x.bytes_in;
  t->x.bytes_max += a->x.bytes_max;
  t->x.blocked += a->x.blocked;
  t->x.halves += a->x.halves;
}

void lp_exec_job_times_free(lp_exec_job_times *t) {
  if (!t) return;
  lp_free(t->rank);
  lp_free(t->kinds);
  lp_free(t->data);
  lp_free(t);
}

static lp_status comm_failed(lp_exec *e, lp_status st) {
  lp_errf(e->err, "%s", lp_comm_last_error(e->world));
  return st;
}

lp_status lp_exec_job_timing(lp_exec *e, lp_exec_job_times **out) {
  *out = NULL;
  e->err[0] = '\0';
  int P = lp_comm_size(e->world), S = e->S, NK = LP_EXEC_NKINDS;
  size_t row = (size_t)e->nacts + 2;
  size_t fixed = sizeof(rank_head) + (size_t)NK * S * sizeof(lp_exec_kind_times);
  lp_exec_job_times *t = lp_calloc(1, sizeof *t);
  char *mine = lp_calloc(1, fixed), *heads = lp_malloc((size_t)P * fixed);
  size_t *sizes = lp_malloc((size_t)P * sizeof *sizes);
  msg_rec *msgs = NULL;
  lp_exec_slice *slices = NULL;
  char *piece = NULL;
  lp_status st = LP_OK;
  if (!t || !mine || !heads || !sizes) {
    st = LP_ERR_NOMEM; /* this rank cannot take part: the others wait */
    goto done;
  }
  /* this rank's piece, packed before the first gather (whose heads tell
   * every rank whether all could): messages, slices, every kept row */
  rank_head *h = (rank_head *)(void *)mine;
  lp_exec_rank_times *f = &h->fig;
  own_figures(e, f, (lp_exec_kind_times *)(void *)(mine + sizeof *h));
  size_t bytes = 0;
  if (trace_pieces(e, &msgs, &h->nmsg, &slices, &f->nslices) == LP_OK) {
    bytes = (size_t)h->nmsg * sizeof *msgs + (size_t)f->nslices * sizeof *slices;
    piece = lp_malloc(bytes + (size_t)f->nkept * row * sizeof(double) + 1);
  }
  if (piece) {
    char *q = piece;
    memcpy(q, msgs, (size_t)h->nmsg * sizeof *msgs);
    q += (size_t)h->nmsg * sizeof *msgs;
    memcpy(q, slices, (size_t)f->nslices * sizeof *slices);
    for (int k = 0; k < f->nkept; k++) {
      double wall = 0, after = 0, *r = (double *)(void *)(piece + bytes) + (size_t)k * row;
      const double *times = NULL;
      lp_exec_step_times(e, k, &wall, &after, &times, NULL);
      r[0] = wall;
      r[1] = after;
      memcpy(r + 2, times, (row - 2) * sizeof *r);
    }
  } else {
    h->failed = 1;
    f->nkept = 0;
  }
  if ((st = lp_comm_allgather(e->world, mine, fixed, heads,
                              "gathering the job's timing (each rank's figures)")) != LP_OK) {
    comm_failed(e, st);
    goto done;
  }
  t->ranks = P;
  t->stages = S;
  t->ep = e->dp; /* ranks per pipeline rank: the DP group (= ep without DP) */
  t->rank = lp_calloc((size_t)P, sizeof *t->rank);
  t->kinds = lp_calloc((size_t)NK * (S ? S : 1), sizeof *t->kinds);
  int64_t fewest = -1, per_step = 0;
  for (int r = 0; r < P; r++) {
    const rank_head *hr = (const rank_head *)(void *)(heads + (size_t)r * fixed);
    if (hr->failed && !*e->err) lp_errf(e->err, "rank %d: out of memory packing its timing", r);
    if (fewest < 0 || hr->fig.nkept < fewest) fewest = hr->fig.nkept;
    per_step += hr->fig.nacts + 2;
  }
  if (*e->err || !t->rank || !t->kinds) {
    st = LP_ERR_NOMEM; /* every rank gives up here when one rank failed */
    if (!*e->err) lp_errf(e->err, "rank %d: out of memory gathering the job's timing", e->rank);
    goto done;
  }
  t->kept = fewest < 1 ? 0 : (int)(LP_EXEC_JOB_KEPT_MAX / per_step < fewest
                                        ? LP_EXEC_JOB_KEPT_MAX / per_step
                                        : fewest);
  if (fewest >= 1 && t->kept < 1) t->kept = 1;
  for (int r = 0; r < P; r++) {
    const char *at = heads + (size_t)r * fixed;
    const rank_head *hr = (const rank_head *)(const void *)at;
    const lp_exec_kind_times *kr = (const lp_exec_kind_times *)(const void *)(at + sizeof *hr);
    t->rank[r] = hr->fig; /* its pointers are set below */
    timing_add(&t->sum, &hr->fig.total);
    for (int i = 0; i < NK * S; i++) kind_add(&t->kinds[i], &kr[i]);
  }
  /* the second gather: this rank's last t->kept rows follow its slices */
  memmove(piece + bytes, piece + bytes + (size_t)(f->nkept - t->kept) * row * sizeof(double),
          (size_t)t->kept * row * sizeof(double));
  bytes += (size_t)t->kept * row * sizeof(double);
  if ((st = lp_comm_allgatherv(e->world, piece, bytes, &t->data, sizes,
                               "gathering the job's timing (kept steps and messages)")) != LP_OK) {
    comm_failed(e, st);
    goto done;
  }
  /* every rank's piece: its messages (back to back, for the latency), its
   * slices and rows (pointed into) */
  int64_t nmsg_all = 0;
  for (int r = 0; r < P; r++)
    nmsg_all += ((const rank_head *)(void *)(heads + (size_t)r * fixed))->nmsg;
  msg_rec *all = lp_malloc((size_t)(nmsg_all ? nmsg_all : 1) * sizeof *all);
  if (!all) {
    st = LP_ERR_NOMEM;
    lp_errf(e->err, "rank %d: out of memory gathering the job's timing", e->rank);
    goto done;
  }
  const char *q = t->data;
  int64_t m = 0;
  for (int r = 0; r < P && st == LP_OK; r++) {
    const rank_head *hr = (const rank_head *)(void *)(heads + (size_t)r * fixed);
    size_t mb = (size_t)hr->nmsg * sizeof *all;
    size_t sb = (size_t)hr->fig.nslices * sizeof(lp_exec_slice);
    size_t want = mb + sb + (size_t)t->kept * ((size_t)hr->fig.nacts + 2) * sizeof(double);
    if (sizes[r] != want) {
      lp_errf(e->err, "rank %d: the timing of rank %d has %zu bytes, %zu expected", e->rank, r,
              sizes[r], want);
      st = LP_ERR_INTERNAL;
      break;
    }
    if (!want) continue; /* nothing to point into */
    if (mb) memcpy(all + m, q, mb);
    m += hr->nmsg;
    t->rank[r].slices = (const lp_exec_slice *)(const void *)(q + mb);
    t->rank[r].kept = (const double *)(const void *)(q + mb + sb);
    q += sizes[r];
  }
  if (st == LP_OK && (st = latency(all, nmsg_all, &t->latency_ms, &t->latency_messages)) != LP_OK)
    lp_errf(e->err, "rank %d: out of memory gathering the job's timing", e->rank);
  lp_free(all);
done:
  if (st == LP_OK) {
    *out = t;
    t = NULL;
  }
  lp_exec_job_times_free(t);
  lp_free(mine);
  lp_free(heads);
  lp_free(sizes);
  lp_free(msgs);
  lp_free(slices);
  lp_free(piece);
  return st;
}
