/* trace.c — trace events, the Chrome/Perfetto JSON writer, atomic file
 * writes, and the trace of a simulation (see lp_trace.h). */
#define _POSIX_C_SOURCE 200809L
#include "lp_trace.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct lp_trace {
  lp_trace_event *ev;
  int nev, capev;
  lp_trace_flow *fl;
  int nfl, capfl;
  lp_trace_counter *ct;
  int nct, capct;
  lp_trace_marker *mk;
  int nmk, capmk;
  int ranks; /* 1 + the largest rank seen */
};

lp_trace *lp_trace_new(void) { return lp_calloc(1, sizeof(lp_trace)); }

void lp_trace_free(lp_trace *t) {
  if (!t) return;
  lp_free(t->ev);
  lp_free(t->fl);
  lp_free(t->ct);
  lp_free(t->mk);
  lp_free(t);
}

void lp_trace_event_init(lp_trace_event *e) {
  memset(e, 0, sizeof *e);
  e->stage = e->mb = e->index = -1;
  e->peer = e->tag = -1;
  e->step = -1;
}

/* Grows *v (of elements of size sz) to hold one more; 0 on failure. */
static int grow(void **v, int n, int *cap, size_t sz) {
  if (n < *cap) return 1;
  int c = *cap ? 2 * *cap : 64;
  void *p = lp_realloc(*v, (size_t)c * sz);
  if (!p) return 0;
  *v = p;
  *cap = c;
  return 1;
}

static void see_rank(lp_trace *t, int rank) {
  if (rank + 1 > t->ranks) t->ranks = rank + 1;
}

lp_status lp_trace_add_event(lp_trace *t, const lp_trace_event *e, int *index) {
  if (e->rank < 0 || e->kind < LP_TRACE_COMPUTE || e->kind > LP_TRACE_RECV)
    return LP_ERR_ARG;
  if (!grow((void **)&t->ev, t->nev, &t->capev, sizeof *t->ev))
    return LP_ERR_NOMEM;
  lp_trace_event *d = &t->ev[t->nev];
  *d = *e;
  d->name[sizeof d->name - 1] = '\0';
  d->cat[sizeof d->cat - 1] = '\0';
  d->action[sizeof d->action - 1] = '\0';
  if (d->dur_us < 0) d->dur_us = 0;
  see_rank(t, e->rank);
  if (index) *index = t->nev;
  t->nev++;
  return LP_OK;
}

lp_status lp_trace_add_flow(lp_trace *t, const lp_trace_flow *f) {
  if (f->from_rank < 0 || f->to_rank < 0) return LP_ERR_ARG;
  if (f->from_event >= t->nev || f->to_event >= t->nev) return LP_ERR_ARG;
  if (!grow((void **)&t->fl, t->nfl, &t->capfl, sizeof *t->fl))
    return LP_ERR_NOMEM;
  t->fl[t->nfl++] = *f;
  see_rank(t, f->from_rank);
  see_rank(t, f->to_rank);
  return LP_OK;
}

lp_status lp_trace_add_counter(lp_trace *t, const lp_trace_counter *c) {
  if (c->rank < 0) return LP_ERR_ARG;
  if (!grow((void **)&t->ct, t->nct, &t->capct, sizeof *t->ct))
    return LP_ERR_NOMEM;
  lp_trace_counter *d = &t->ct[t->nct++];
  *d = *c;
  d->name[sizeof d->name - 1] = '\0';
  see_rank(t, c->rank);
  return LP_OK;
}

lp_status lp_trace_add_marker(lp_trace *t, const lp_trace_marker *m) {
  if (m->rank < 0) return LP_ERR_ARG;
  if (!grow((void **)&t->mk, t->nmk, &t->capmk, sizeof *t->mk))
    return LP_ERR_NOMEM;
  lp_trace_marker *d = &t->mk[t->nmk++];
  *d = *m;
  d->name[sizeof d->name - 1] = '\0';
  see_rank(t, m->rank);
  return LP_OK;
}

const lp_trace_marker *lp_trace_markers(const lp_trace *t, int *n) {
  *n = t->nmk;
  return t->mk;
}

const lp_trace_event *lp_trace_events(const lp_trace *t, int *n) {
  *n = t->nev;
  return t->ev;
}
const lp_trace_flow *lp_trace_flows(const lp_trace *t, int *n) {
  *n = t->nfl;
  return t->fl;
}
int lp_trace_ranks(const lp_trace *t) { return t->ranks; }

/* ---- the JSON writer ---- */

/* Appends x with at most 3 decimals and no trailing zeros. */
static void put_num(lp_buf *b, double x) {
  char s[64];
  snprintf(s, sizeof s, "%.3f", x);
  char *dot = strchr(s, '.');
  if (dot) {
    char *e = s + strlen(s) - 1;
    while (e > dot && *e == '0')
      *e-- = '\0';
    if (e == dot) *e = '\0';
  }
  if (strcmp(s, "-0") == 0) strcpy(s, "0");
  lp_buf_puts(b, s);
}

static int track_of(const lp_trace_event *e) {
  return e->kind == LP_TRACE_COMPUTE ? 0 : 1;
}

/* Lanes: slices of one (rank, track) sorted by start go to the first lane
 * that is free by then; tid = 2 * lane + track. */
typedef struct lanes {
  int *tid;     /* [nev] */
  int *maxlane; /* [ranks * 2]: lanes used - 1 */
} lanes;

typedef struct slice_key {
  int rank, track, idx;
  double start;
} slice_key;

static int cmp_slices(const void *pa, const void *pb) {
  const slice_key *x = pa, *y = pb;
  if (x->rank != y->rank) return x->rank - y->rank;
  if (x->track != y->track) return x->track - y->track;
  if (x->start != y->start) return x->start < y->start ? -1 : 1;
  return x->idx - y->idx;
}

/* Slack for rounding when times were scaled (1 ns). */
#define LANE_EPS 1e-3

static lp_status assign_lanes(const lp_trace *t, lanes *L) {
  int R = t->ranks > 0 ? t->ranks : 1;
  L->tid = lp_malloc((size_t)(t->nev ? t->nev : 1) * sizeof *L->tid);
  L->maxlane = lp_calloc((size_t)R * 2, sizeof *L->maxlane);
  slice_key *order = lp_malloc((size_t)(t->nev ? t->nev : 1) * sizeof *order);
  double *ends = NULL;
  int nends = 0, capends = 0;
  lp_status st = LP_OK;
  if (!L->tid || !L->maxlane || !order) {
    st = LP_ERR_NOMEM;
    goto done;
  }
  for (int i = 0; i < t->nev; i++) {
    order[i].rank = t->ev[i].rank;
    order[i].track = track_of(&t->ev[i]);
    order[i].idx = i;
    order[i].start = t->ev[i].start_us;
  }
  qsort(order, (size_t)t->nev, sizeof *order, cmp_slices);
  for (int k = 0; k < t->nev; k++) {
    const lp_trace_event *e = &t->ev[order[k].idx];
    if (k == 0 || order[k].rank != order[k - 1].rank ||
        order[k].track != order[k - 1].track)
      nends = 0; /* a new (rank, track) group */
    int lane = 0;
    while (lane < nends && e->start_us < ends[lane] - LANE_EPS)
      lane++;
    if (lane == nends) {
      if (!grow((void **)&ends, nends, &capends, sizeof *ends)) {
        st = LP_ERR_NOMEM;
        goto done;
      }
      nends++;
    }
    ends[lane] = e->start_us + e->dur_us;
    L->tid[order[k].idx] = 2 * lane + track_of(e);
    int *ml = &L->maxlane[e->rank * 2 + track_of(e)];
    if (lane > *ml) *ml = lane;
  }
done:
  lp_free(order);
  lp_free(ends);
  return st;
}

/* The event a flow end binds to: the known index, or the slice of `kind`
 * on rank that contains t (the last one starting at or before t). */
static int flow_event(const lp_trace *t, int known, int rank, int kind,
                      double us) {
  if (known >= 0) return known;
  int best = -1;
  for (int i = 0; i < t->nev; i++) {
    const lp_trace_event *e = &t->ev[i];
    if (e->rank != rank || e->kind != kind) continue;
    if (e->start_us <= us + LANE_EPS &&
        us <= e->start_us + e->dur_us + LANE_EPS &&
        (best < 0 || e->start_us >= t->ev[best].start_us))
      best = i;
  }
  return best;
}

/* Starts the next element of traceEvents. */
static void next(lp_buf *b, int *count) {
  lp_buf_puts(b, (*count)++ ? ",\n{" : "{");
}

static void put_meta(lp_buf *b, int *count, const char *name, int pid, int tid,
                     const char *key, const char *sval, long ival) {
  next(b, count);
  lp_buf_printf(b,
                "\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                "\"ts\":0,\"args\":{\"%s\":",
                name, pid, tid, key);
  if (sval)
    lp_buf_json_string(b, sval);
  else
    lp_buf_printf(b, "%ld", ival);
  lp_buf_puts(b, "}}");
}

/* Where a flow end sits: inside its slice when the slice has a length
 * (a quarter in for the start, three quarters for the end, so the arrow
 * points forward when a send and its receive span the same interval). */
static double flow_ts(const lp_trace_event *e, double at, double fallback) {
  if (!e) return fallback;
  return e->start_us + e->dur_us * at;
}

char *lp_trace_to_json(const lp_trace *t) {
  lanes L = {NULL, NULL};
  lp_buf b;
  lp_buf_init(&b);
  if (assign_lanes(t, &L) != LP_OK) goto fail;
  int count = 0;
  lp_buf_puts(&b, "{\"traceEvents\":[\n");
  for (int r = 0; r < t->ranks; r++) {
    char pname[32];
    snprintf(pname, sizeof pname, "rank %d", r);
    put_meta(&b, &count, "process_name", r, 0, "name", pname, 0);
    put_meta(&b, &count, "process_sort_index", r, 0, "sort_index", NULL, r);
    for (int track = 0; track < 2; track++) {
      int ml = L.maxlane[r * 2 + track];
      for (int lane = 0; lane <= ml; lane++) {
        char tname[32];
        if (lane == 0)
          snprintf(tname, sizeof tname, "%s", track ? "comm" : "compute");
        else
          snprintf(tname, sizeof tname, "%s %d", track ? "comm" : "compute",
                   lane + 1);
        put_meta(&b, &count, "thread_name", r, 2 * lane + track, "name", tname,
                 0);
        put_meta(&b, &count, "thread_sort_index", r, 2 * lane + track,
                 "sort_index", NULL, 2 * lane + track);
      }
    }
  }
  for (int i = 0; i < t->nev; i++) {
    const lp_trace_event *e = &t->ev[i];
    next(&b, &count);
    lp_buf_puts(&b, "\"name\":");
    lp_buf_json_string(&b, e->name);
    lp_buf_puts(&b, ",\"cat\":");
    lp_buf_json_string(&b, e->cat[0]                     ? e->cat
                           : e->kind == LP_TRACE_COMPUTE ? "compute"
                                                         : "comm");
    lp_buf_printf(&b, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":", e->rank,
                  L.tid[i]);
    put_num(&b, e->start_us);
    lp_buf_puts(&b, ",\"dur\":");
    put_num(&b, e->dur_us);
    lp_buf_puts(&b, ",\"args\":{");
    const char *sep = "";
    if (e->stage >= 0) {
      lp_buf_printf(&b, "\"stage\":%d", e->stage);
      sep = ",";
    }
    if (e->mb >= 0) {
      lp_buf_printf(&b, "%s\"mb\":%d", sep, e->mb);
      sep = ",";
    }
    if (e->index >= 0) {
      lp_buf_printf(&b, "%s\"index\":%d", sep, e->index);
      sep = ",";
    }
    if (e->action[0]) {
      lp_buf_printf(&b, "%s\"action\":", sep);
      lp_buf_json_string(&b, e->action);
      sep = ",";
    }
    if (e->peer >= 0) {
      lp_buf_printf(&b, "%s\"peer\":%d", sep, e->peer);
      sep = ",";
    }
    if (e->tag >= 0) {
      lp_buf_printf(&b, "%s\"tag\":%d", sep, e->tag);
      sep = ",";
    }
    if (e->step >= 0) lp_buf_printf(&b, "%s\"step\":%lld", sep, (long long)e->step);
    lp_buf_puts(&b, "}}");
  }
  for (int i = 0; i < t->nfl; i++) {
    const lp_trace_flow *f = &t->fl[i];
    int se =
        flow_event(t, f->from_event, f->from_rank, LP_TRACE_SEND, f->from_us);
    int re = flow_event(t, f->to_event, f->to_rank, LP_TRACE_RECV, f->to_us);
    const lp_trace_event *sev = se >= 0 ? &t->ev[se] : NULL;
    const lp_trace_event *rev = re >= 0 ? &t->ev[re] : NULL;
    next(&b, &count);
    lp_buf_printf(&b,
                  "\"name\":\"message\",\"cat\":\"message\",\"ph\":\"s\","
                  "\"bp\":\"e\",\"id\":%ld,\"pid\":%d,\"tid\":%d,\"ts\":",
                  f->id, f->from_rank, sev ? L.tid[se] : 1);
    put_num(&b, flow_ts(sev, 0.25, f->from_us));
    lp_buf_puts(&b, "}");
    next(&b, &count);
    lp_buf_printf(&b,
                  "\"name\":\"message\",\"cat\":\"message\",\"ph\":\"f\","
                  "\"bp\":\"e\",\"id\":%ld,\"pid\":%d,\"tid\":%d,\"ts\":",
                  f->id, f->to_rank, rev ? L.tid[re] : 1);
    put_num(&b, flow_ts(rev, 0.75, f->to_us));
    lp_buf_puts(&b, "}");
  }
  for (int i = 0; i < t->nct; i++) {
    const lp_trace_counter *c = &t->ct[i];
    next(&b, &count);
    lp_buf_puts(&b, "\"name\":");
    lp_buf_json_string(&b, c->name);
    lp_buf_printf(&b, ",\"ph\":\"C\",\"pid\":%d,\"tid\":0,\"ts\":", c->rank);
    put_num(&b, c->time_us);
    lp_buf_puts(&b, ",\"args\":{\"value\":");
    put_num(&b, c->value);
    lp_buf_puts(&b, "}}");
  }
  for (int i = 0; i < t->nmk; i++) {
    const lp_trace_marker *m = &t->mk[i];
    next(&b, &count);
    lp_buf_puts(&b, "\"name\":");
    lp_buf_json_string(&b, m->name);
    lp_buf_printf(&b, ",\"cat\":\"marker\",\"ph\":\"i\",\"s\":\"p\",\"pid\":%d,\"tid\":0,\"ts\":",
                  m->rank);
    put_num(&b, m->time_us);
    lp_buf_puts(&b, "}");
  }
  lp_buf_puts(&b, "\n],\"displayTimeUnit\":\"ms\"}\n");
  lp_free(L.tid);
  lp_free(L.maxlane);
  return lp_buf_take(&b);
fail:
  lp_free(L.tid);
  lp_free(L.maxlane);
  lp_buf_free(&b);
  return NULL;
}

lp_status lp_trace_write_json(const lp_trace *t, const char *path, char *err) {
  char local[LP_ERRLEN];
  if (!err) err = local;
  char *json = lp_trace_to_json(t);
  if (!json) {
    lp_errf(err, "%s: out of memory", path);
    return LP_ERR_NOMEM;
  }
  lp_status st = lp_write_file_atomic(path, json, strlen(json), err);
  lp_free(json);
  return st;
}

/* ---- messages, time origin, packing ---- */

typedef struct msg_key {
  int from, to, tag;
  int64_t step;
  int idx;
} msg_key;

static int cmp_msg(const void *pa, const void *pb) {
  const msg_key *x = pa, *y = pb;
  if (x->from != y->from) return x->from < y->from ? -1 : 1;
  if (x->to != y->to) return x->to < y->to ? -1 : 1;
  if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return x->idx - y->idx;
}

lp_status lp_trace_link_messages(lp_trace *t) {
  int n = t->nev, ns = 0, nr = 0;
  msg_key *snd = lp_malloc((size_t)(n ? n : 1) * sizeof *snd);
  msg_key *rcv = lp_malloc((size_t)(n ? n : 1) * sizeof *rcv);
  lp_status st = LP_OK;
  if (!snd || !rcv) {
    st = LP_ERR_NOMEM;
    goto done;
  }
  for (int i = 0; i < n; i++) {
    const lp_trace_event *e = &t->ev[i];
    if (e->peer < 0 || e->tag < 0) continue;
    if (e->kind == LP_TRACE_SEND)
      snd[ns++] = (msg_key){e->rank, e->peer, e->tag, e->step, i};
    else if (e->kind == LP_TRACE_RECV)
      rcv[nr++] = (msg_key){e->peer, e->rank, e->tag, e->step, i};
  }
  qsort(snd, (size_t)ns, sizeof *snd, cmp_msg);
  qsort(rcv, (size_t)nr, sizeof *rcv, cmp_msg);
  long id = t->nfl;
  for (int i = 0, j = 0; i < ns && j < nr;) {
    msg_key a = snd[i], b = rcv[j];
    a.idx = b.idx = 0;
    int c = cmp_msg(&a, &b);
    if (c < 0) { i++; continue; }
    if (c > 0) { j++; continue; }
    lp_trace_event *s = &t->ev[snd[i].idx], *r = &t->ev[rcv[j].idx];
    double sent = s->start_us, arrived = r->start_us + r->dur_us;
    if (arrived < sent) arrived = sent;
    s->dur_us = r->dur_us = arrived - sent;
    r->start_us = sent;
    lp_trace_flow f = {++id, s->rank, r->rank, sent, arrived, snd[i].idx, rcv[j].idx};
    LP_CHECK_GOTO(lp_trace_add_flow(t, &f), st, done);
    i++;
    j++;
  }
done:
  lp_free(snd);
  lp_free(rcv);
  return st;
}

void lp_trace_start_at_zero(lp_trace *t) {
  double t0 = 0;
  int any = 0;
#define LP_SEE(x) do { if (!any || (x) < t0) t0 = (x); any = 1; } while (0)
  for (int i = 0; i < t->nev; i++) LP_SEE(t->ev[i].start_us);
  for (int i = 0; i < t->nct; i++) LP_SEE(t->ct[i].time_us);
  for (int i = 0; i < t->nmk; i++) LP_SEE(t->mk[i].time_us);
#undef LP_SEE
  if (!any) return;
  for (int i = 0; i < t->nev; i++) t->ev[i].start_us -= t0;
  for (int i = 0; i < t->nct; i++) t->ct[i].time_us -= t0;
  for (int i = 0; i < t->nmk; i++) t->mk[i].time_us -= t0;
  for (int i = 0; i < t->nfl; i++) {
    t->fl[i].from_us -= t0;
    t->fl[i].to_us -= t0;
  }
}

/* packed: "LPTR", three int64 counts, then the arrays back to back */
lp_status lp_trace_pack(const lp_trace *t, void **buf, size_t *bytes) {
  int64_t cnt[3] = {t->nev, t->nct, t->nmk};
  size_t n = 4 + sizeof cnt + (size_t)t->nev * sizeof *t->ev +
             (size_t)t->nct * sizeof *t->ct + (size_t)t->nmk * sizeof *t->mk;
  char *p = lp_malloc(n);
  if (!p) return LP_ERR_NOMEM;
  char *q = p;
  memcpy(q, "LPTR", 4);
  q += 4;
  memcpy(q, cnt, sizeof cnt);
  q += sizeof cnt;
  if (t->nev) memcpy(q, t->ev, (size_t)t->nev * sizeof *t->ev);
  q += (size_t)t->nev * sizeof *t->ev;
  if (t->nct) memcpy(q, t->ct, (size_t)t->nct * sizeof *t->ct);
  q += (size_t)t->nct * sizeof *t->ct;
  if (t->nmk) memcpy(q, t->mk, (size_t)t->nmk * sizeof *t->mk);
  *buf = p;
  *bytes = n;
  return LP_OK;
}

lp_status lp_trace_unpack_append(lp_trace *t, const void *buf, size_t bytes) {
  const char *q = buf;
  int64_t cnt[3];
  if (bytes < 4 + sizeof cnt || memcmp(q, "LPTR", 4) != 0) return LP_ERR_PARSE;
  memcpy(cnt, q + 4, sizeof cnt);
  q += 4 + sizeof cnt;
  if (cnt[0] < 0 || cnt[1] < 0 || cnt[2] < 0 || cnt[0] > INT32_MAX || cnt[1] > INT32_MAX ||
      cnt[2] > INT32_MAX ||
      bytes != 4 + sizeof cnt + (size_t)cnt[0] * sizeof(lp_trace_event) +
                   (size_t)cnt[1] * sizeof(lp_trace_counter) +
                   (size_t)cnt[2] * sizeof(lp_trace_marker))
    return LP_ERR_PARSE;
  for (int64_t i = 0; i < cnt[0]; i++, q += sizeof(lp_trace_event)) {
    lp_trace_event e;
    memcpy(&e, q, sizeof e);
    LP_CHECK(lp_trace_add_event(t, &e, NULL));
  }
  for (int64_t i = 0; i < cnt[1]; i++, q += sizeof(lp_trace_counter)) {
    lp_trace_counter c;
    memcpy(&c, q, sizeof c);
    LP_CHECK(lp_trace_add_counter(t, &c));
  }
  for (int64_t i = 0; i < cnt[2]; i++, q += sizeof(lp_trace_marker)) {
    lp_trace_marker m;
    memcpy(&m, q, sizeof m);
    LP_CHECK(lp_trace_add_marker(t, &m));
  }
  return LP_OK;
}

/* ---- the trace of a simulation ---- */

/* A compute action's kind name (lp_kind_name), else its type's name. */
static const char *cat_of(const lp_action *a) {
  int k = lp_kind_of(a->type);
  return k >= 0 ? lp_kind_name(k) : lp_action_type_name(a->type);
}

static lp_status add_counter(lp_trace *t, int rank, const char *name, double us,
                             double v) {
  lp_trace_counter c;
  memset(&c, 0, sizeof c);
  c.rank = rank;
  snprintf(c.name, sizeof c.name, "%s", name);
  c.time_us = us;
  c.value = v;
  return lp_trace_add_counter(t, &c);
}

static lp_status from_sim(const lp_sim_result *r, lp_trace *t) {
  const double k = LP_TRACE_US_PER_UNIT;
  int nev, nmsg;
  const lp_sim_event *ev = lp_sim_events(r, &nev);
  const lp_sim_message *msg = lp_sim_messages(r, &nmsg);
  for (int i = 0; i < nev; i++) {
    lp_trace_event e;
    lp_trace_event_init(&e);
    e.rank = ev[i].rank;
    e.kind = LP_TRACE_COMPUTE;
    lp_action_format(&ev[i].action, e.action, sizeof e.action);
    snprintf(e.name, sizeof e.name, "%s", e.action);
    snprintf(e.cat, sizeof e.cat, "%s", cat_of(&ev[i].action));
    e.start_us = ev[i].start * k;
    e.dur_us = (ev[i].end - ev[i].start) * k;
    e.stage = ev[i].action.stage;
    e.mb = ev[i].action.mb;
    e.index = ev[i].index;
    LP_CHECK(lp_trace_add_event(t, &e, NULL));
  }
  for (int i = 0; i < nmsg; i++) {
    const lp_sim_message *m = &msg[i];
    lp_trace_event e;
    lp_trace_flow f;
    lp_trace_event_init(&e);
    e.start_us = m->sent * k;
    e.dur_us = (m->arrived - m->sent) * k;
    e.stage = m->what.stage;
    e.mb = m->what.mb;
    snprintf(e.cat, sizeof e.cat, "comm");
    snprintf(e.action, sizeof e.action, "%s", m->text);
    e.rank = m->from;
    e.kind = LP_TRACE_SEND;
    e.index = m->from_index;
    snprintf(e.name, sizeof e.name, "send %s to rank %d", m->text, m->to);
    LP_CHECK(lp_trace_add_event(t, &e, &f.from_event));
    e.rank = m->to;
    e.kind = LP_TRACE_RECV;
    e.index = m->to_index;
    snprintf(e.name, sizeof e.name, "recv %s from rank %d", m->text, m->from);
    LP_CHECK(lp_trace_add_event(t, &e, &f.to_event));
    f.id = i + 1;
    f.from_rank = m->from;
    f.to_rank = m->to;
    f.from_us = m->sent * k;
    f.to_us = m->sent * k;
    LP_CHECK(lp_trace_add_flow(t, &f));
  }
  int any_w = 0; /* "pending W" only for schedules that split B */
  for (int rank = 0; rank < lp_sim_ranks(r); rank++) {
    lp_sim_rank_stats rs;
    if (lp_sim_rank_stats_of(r, rank, &rs) == LP_OK && rs.peak_pending_w > 0)
      any_w = 1;
  }
  for (int rank = 0; rank < lp_sim_ranks(r); rank++) {
    int n;
    const lp_sim_sample *s = lp_sim_memory(r, rank, &n);
    for (int i = 0; i < n; i++) {
      LP_CHECK(add_counter(t, rank, "live activations", s[i].t * k, s[i].live));
      if (any_w)
        LP_CHECK(add_counter(t, rank, "pending W", s[i].t * k, s[i].pending_w));
    }
  }
  /* ranks with nothing to do still get their process */
  if (t->ranks < lp_sim_ranks(r)) t->ranks = lp_sim_ranks(r);
  return LP_OK;
}

lp_status lp_trace_from_sim(const lp_sim_result *r, lp_trace **out) {
  *out = NULL;
  lp_trace *t = lp_trace_new();
  if (!t) return LP_ERR_NOMEM;
  lp_status st = from_sim(r, t);
  if (st != LP_OK) {
    lp_trace_free(t);
    return st;
  }
  *out = t;
  return LP_OK;
}
