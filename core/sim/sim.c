/* sim.c — the pipeline simulator (see lp_sim.h).
 *
 * Each rank runs its list in order. A compute action starts when its rank
 * is free and every input has arrived: an input made on the same rank is
 * there when its producer ends, one from another rank `latency` after it
 * is sent: when its producer ends, or, in a schedule with explicit
 * SEND/RECV, when its rank reaches the SEND. SEND and RECV take no rank
 * time and a RECV never waits: the compute that uses the message does (the
 * non-blocking model of validation, the executor's and PyTorch's).
 * The inputs of an action on virtual stage v for micro-batch m:
 *   F      the F of the previous virtual stage on m's route (none at entry);
 *   B / I  the F of (v, m) itself, and the B or I of the next virtual stage
 *          on m's route (none at the loss stage);
 *   W      the I of (v, m);
 *   FB     the inputs of both halves; both outputs appear at the pair's end.
 * An action's start is a pure function of its rank's previous action and
 * its producers, so the fixed point below does not depend on visit order. */
#include "lp_sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lp_sim_result {
  char *name;
  int ranks, stages, microbatches;
  double latency, makespan, max_bubble;
  lp_sim_event *ev; /* [nev], by rank then position */
  int nev;
  int *ev_first; /* [ranks + 1] */
  lp_sim_message *msg;
  int nmsg;
  lp_sim_rank_stats *stats; /* [ranks] */
  lp_sim_sample *mem;       /* all ranks' samples, by rank */
  int nmem;
  int *mem_first; /* [ranks + 1] */
};

/* ---- the cost model ---- */

void lp_sim_times_init(lp_sim_times *t) {
  t->f = t->b = t->i = t->w = t->fb = LP_SIM_UNSET;
}

void lp_sim_cost_init(lp_sim_cost *c) {
  lp_sim_times_init(&c->t);
  c->latency = 0;
  memset(&c->link, 0, sizeof c->link);
  c->message_bytes = 0;
  c->act_values = 0;
  c->value_bytes = 4;
  c->link_unit = 1;
  c->exchanges = NULL;
  c->nexchange_stages = 0;
  c->durations = NULL;
  c->dp_ranks = 0;
  c->dp_bytes = NULL;
  c->ndp_stages = 0;
  c->nduration_ranks = 0;
  c->nstages = 0;
  c->stages = NULL;
}

static int is_set(double x) { return x != LP_SIM_UNSET; }

lp_status lp_sim_time_check(const char *key, double v, char *err) {
  if (v >= 0 && v <= LP_SIM_MAX_TIME) return LP_OK; /* false for NaN */
  if (err) lp_errf(err, "%s = %g must be a number in 0..%g", key, v, LP_SIM_MAX_TIME);
  return LP_ERR_ARG;
}

static lp_status check_times(const lp_sim_times *t, const char *where,
                             char *err) {
  const double v[LP_NKINDS] = {t->f, t->b, t->i, t->w, t->fb}; /* LP_KIND_* order */
  for (int k = 0; k < LP_NKINDS; k++) {
    char why[LP_ERRLEN];
    if (is_set(v[k]) && lp_sim_time_check(lp_kind_name(k), v[k], why) != LP_OK) {
      lp_errf(err, "cost %s%s: %s", where, *where ? "" : "model", why);
      return LP_ERR_ARG;
    }
  }
  return LP_OK;
}

lp_status lp_sim_cost_resolve(const lp_sim_cost *c, int stage,
                              lp_sim_times *out, char *err) {
  char local[LP_ERRLEN], where[48] = "";
  if (!err) err = local;
  lp_sim_cost dflt;
  if (!c) {
    lp_sim_cost_init(&dflt);
    c = &dflt;
  }
  lp_sim_times t = c->t;
  LP_CHECK(check_times(&t, "", err));
  if (stage >= 0 && stage < c->nstages && c->stages) {
    const lp_sim_times *o = &c->stages[stage];
    snprintf(where, sizeof where, "of model stage %d", stage);
    LP_CHECK(check_times(o, where, err));
    if (is_set(o->f)) t.f = o->f;
    if (is_set(o->b)) t.b = o->b;
    if (is_set(o->i)) t.i = o->i;
    if (is_set(o->w)) t.w = o->w;
    if (is_set(o->fb)) t.fb = o->fb;
  } else {
    snprintf(where, sizeof where, "model");
  }
  if (!is_set(t.f)) t.f = 1;
  int hb = is_set(t.b), hi = is_set(t.i), hw = is_set(t.w);
  if (hb && hi && hw) {
    /* kept as given */
  } else if (hb && hw) {
    t.i = t.b - t.w;
  } else if (hb && hi) {
    t.w = t.b - t.i;
  } else if (hb) {
    t.i = t.w = t.b / 2;
  } else if (hi && hw) {
    t.b = t.i + t.w;
  } else if (hi) {
    t.w = t.i;
    t.b = 2 * t.i;
  } else if (hw) {
    t.i = t.w;
    t.b = 2 * t.w;
  } else {
    t.b = 2, t.i = 1, t.w = 1;
  }
  if (t.i < 0 || t.w < 0) {
    lp_errf(err, "cost %s: B = %g is less than %s = %g (B = I + W)", where, t.b,
            t.i < 0 ? "W" : "I", t.i < 0 ? t.w : t.i);
    return LP_ERR_ARG;
  }
  *out = t;
  return LP_OK;
}

/* ---- result accessors ---- */

void lp_sim_result_free(lp_sim_result *r) {
  if (!r) return;
  lp_free(r->name);
  lp_free(r->ev);
  lp_free(r->ev_first);
  lp_free(r->msg);
  lp_free(r->stats);
  lp_free(r->mem);
  lp_free(r->mem_first);
  lp_free(r);
}

int lp_sim_ranks(const lp_sim_result *r) { return r->ranks; }
int lp_sim_stages(const lp_sim_result *r) { return r->stages; }
int lp_sim_microbatches(const lp_sim_result *r) { return r->microbatches; }
const char *lp_sim_name(const lp_sim_result *r) {
  return r->name ? r->name : "";
}
double lp_sim_makespan(const lp_sim_result *r) { return r->makespan; }
double lp_sim_max_bubble(const lp_sim_result *r) { return r->max_bubble; }
double lp_sim_latency(const lp_sim_result *r) { return r->latency; }

lp_status lp_sim_rank_stats_of(const lp_sim_result *r, int rank,
                               lp_sim_rank_stats *out) {
  if (rank < 0 || rank >= r->ranks) return LP_ERR_ARG;
  *out = r->stats[rank];
  return LP_OK;
}

const lp_sim_event *lp_sim_events(const lp_sim_result *r, int *n) {
  *n = r->nev;
  return r->ev;
}

const lp_sim_event *lp_sim_rank_events(const lp_sim_result *r, int rank,
                                       int *n) {
  if (rank < 0 || rank >= r->ranks) {
    *n = 0;
    return NULL;
  }
  *n = r->ev_first[rank + 1] - r->ev_first[rank];
  return r->ev + r->ev_first[rank];
}

const lp_sim_message *lp_sim_messages(const lp_sim_result *r, int *n) {
  *n = r->nmsg;
  return r->msg;
}

const lp_sim_sample *lp_sim_memory(const lp_sim_result *r, int rank, int *n) {
  if (rank < 0 || rank >= r->ranks) {
    *n = 0;
    return NULL;
  }
  *n = r->mem_first[rank + 1] - r->mem_first[rank];
  return r->mem + r->mem_first[rank];
}

/* ---- the run ---- */

/* Where an output is made: rank and position, -1 when nobody makes it. */
typedef struct where {
  int rank, idx;
} where;

/* One input of an action. */
typedef struct dep {
  where from;
  where via; /* the SEND that carries it (explicit SEND/RECV), rank -1 none */
  int kind; /* 0: forward, 1: backward (B or I), 2: the I a W needs */
  int vstage, mb;
} dep;

#define MAX_DEPS 4

typedef struct node {
  dep deps[MAX_DEPS];
  int ndeps;
  double dur, start, end;
  double a2a, a2a_hidden; /* its exchanges' modelled time, the hidden part */
  int done;
} node;

typedef struct run {
  lp_schedule *s;
  int P, M, V;
  const lp_action **acts; /* [P] */
  int *nacts;             /* [P] */
  node **nodes;           /* [P][nacts] */
  int *pos;               /* [V * M]: position of v on m's route, -1 */
  int *rlen;              /* [M] route lengths */
  where *fwd, *bwd;       /* [V * M] producers */
  where *sendf, *sendb;   /* [V * M] SEND_F / SEND_B of (v, mb), rank -1 none */
  int *bwd_type;          /* [V * M]: LP_ACT_B or LP_ACT_I */
  lp_sim_times *times;    /* [S] resolved */
  int *fb_set;            /* [S]: FB given for this F-half stage */
  double *xt;             /* [3 S]: exchange time per F, B, I half */
  const lp_sim_cost *cost; /* its per-action times (durations), or NULL */
  char *err;
} run;

static const char *kind_word(int kind) {
  return kind == 0 ? "forward" : kind == 1 ? "backward" : "input-grad (I)";
}

static void act_text(const lp_action *a, char *buf, size_t n) {
  lp_action_format(a, buf, n);
}

/* Records that (rank, idx) produces `out` for (v, mb). */
static lp_status claim(run *R, where *map, int v, int mb, int rank, int idx,
                       const char *what) {
  where *w = &map[v * R->M + mb];
  if (w->rank >= 0) {
    char t1[LP_ACTION_TEXT_MAX], t2[LP_ACTION_TEXT_MAX];
    act_text(&R->acts[rank][idx], t1, sizeof t1);
    act_text(&R->acts[w->rank][w->idx], t2, sizeof t2);
    lp_errf(R->err,
            "rank %d, action %d (%s): the %s of micro-batch %d on "
            "virtual stage %d is already computed by rank %d, action "
            "%d (%s)",
            rank, idx, t1, what, mb, v, w->rank, w->idx, t2);
    return LP_ERR_INTERNAL;
  }
  w->rank = rank;
  w->idx = idx;
  return LP_OK;
}

/* Pass 1: who produces each forward and backward. */
static lp_status map_producers(run *R) {
  for (int r = 0; r < R->P; r++) {
    for (int i = 0; i < R->nacts[r]; i++) {
      const lp_action *a = &R->acts[r][i];
      switch (a->type) {
      case LP_ACT_F:
        LP_CHECK(claim(R, R->fwd, a->stage, a->mb, r, i, "forward"));
        break;
      case LP_ACT_B:
      case LP_ACT_I:
        LP_CHECK(claim(R, R->bwd, a->stage, a->mb, r, i, "backward"));
        R->bwd_type[a->stage * R->M + a->mb] = a->type;
        break;
      case LP_ACT_FB:
        LP_CHECK(claim(R, R->fwd, a->stage, a->mb, r, i, "forward"));
        LP_CHECK(claim(R, R->bwd, a->bstage, a->bmb, r, i, "backward"));
        R->bwd_type[a->bstage * R->M + a->bmb] = a->btype;
        break;
      case LP_ACT_SEND_F:
      case LP_ACT_SEND_B:
        if (a->stage >= 0 && a->stage < R->V && a->mb >= 0 && a->mb < R->M)
          (a->type == LP_ACT_SEND_F ? R->sendf : R->sendb)[a->stage * R->M + a->mb] =
              (where){r, i};
        break;
      default:
        break;
      }
    }
  }
  return LP_OK;
}

/* Route position of v for mb, or an error naming the action. */
static lp_status route_pos(run *R, int r, int i, int v, int mb, int *k) {
  *k = R->pos[v * R->M + mb];
  if (*k >= 0) return LP_OK;
  char t[LP_ACTION_TEXT_MAX];
  act_text(&R->acts[r][i], t, sizeof t);
  lp_errf(R->err,
          "rank %d, action %d (%s): virtual stage %d is not on the "
          "route of micro-batch %d",
          r, i, t, v, mb);
  return LP_ERR_INTERNAL;
}

static lp_status add_dep(run *R, node *n, int r, int i, int kind, int v,
                         int mb) {
  where w = kind == 0 ? R->fwd[v * R->M + mb] : R->bwd[v * R->M + mb];
  char t[LP_ACTION_TEXT_MAX];
  if (w.rank < 0 || (kind == 2 && R->bwd_type[v * R->M + mb] != LP_ACT_I)) {
    act_text(&R->acts[r][i], t, sizeof t);
    lp_errf(R->err,
            "rank %d, action %d (%s): needs the %s of micro-batch %d "
            "on virtual stage %d, which no rank computes",
            r, i, t, kind_word(kind), mb, v);
    return LP_ERR_INTERNAL;
  }
  n->deps[n->ndeps].from = w;
  n->deps[n->ndeps].via = (where){-1, -1};
  if (w.rank != r && kind != 2) {
    where x = kind == 0 ? R->sendf[v * R->M + mb] : R->sendb[v * R->M + mb];
    if (x.rank == w.rank) n->deps[n->ndeps].via = x;
  }
  n->deps[n->ndeps].kind = kind;
  n->deps[n->ndeps].vstage = v;
  n->deps[n->ndeps].mb = mb;
  n->ndeps++;
  return LP_OK;
}

static lp_status forward_deps(run *R, node *n, int r, int i, int v, int mb) {
  int k;
  LP_CHECK(route_pos(R, r, i, v, mb, &k));
  if (k > 0) {
    int n_;
    const int *route = lp_schedule_route(R->s, mb, &n_);
    LP_CHECK(add_dep(R, n, r, i, 0, route[k - 1], mb));
  }
  return LP_OK;
}

static lp_status backward_deps(run *R, node *n, int r, int i, int v, int mb) {
  int k, len;
  LP_CHECK(route_pos(R, r, i, v, mb, &k));
  LP_CHECK(add_dep(R, n, r, i, 0, v, mb));
  const int *route = lp_schedule_route(R->s, mb, &len);
  if (k + 1 < len) LP_CHECK(add_dep(R, n, r, i, 1, route[k + 1], mb));
  return LP_OK;
}

static double stage_time(run *R, int v, int type) {
  const lp_sim_times *t = &R->times[lp_schedule_vstage_stage(R->s, v)];
  switch (type) {
  case LP_ACT_F:
    return t->f;
  case LP_ACT_B:
    return t->b;
  case LP_ACT_I:
    return t->i;
  case LP_ACT_W:
    return t->w;
  default:
    return 0;
  }
}

/* Exchange time X of the half `type` (F, B or I) of virtual stage v. */
static double xchg_time(run *R, int v, int type) {
  int h = type == LP_ACT_F ? 0 : type == LP_ACT_B ? 1 : type == LP_ACT_I ? 2 : -1;
  return h < 0 ? 0 : R->xt[3 * lp_schedule_vstage_stage(R->s, v) + h];
}

/* The time cost.durations gives action i of rank r, LP_SIM_UNSET: none. */
static double action_time(const run *R, int r, int i) {
  const lp_sim_cost *c = R->cost;
  if (!c || !c->durations || r >= c->nduration_ranks || !c->durations[r]) return LP_SIM_UNSET;
  return c->durations[r][i];
}

/* Every per-action time is a time, and only compute actions have one. */
static lp_status check_durations(run *R) {
  const lp_sim_cost *c = R->cost;
  if (!c || c->nduration_ranks <= 0) return LP_OK;
  if (!c->durations) {
    lp_errf(R->err, "cost model: per-action times for %d ranks given without an array",
            c->nduration_ranks);
    return LP_ERR_ARG;
  }
  for (int r = 0; r < c->nduration_ranks; r++) {
    if (!c->durations[r]) continue;
    if (r >= R->P) {
      lp_errf(R->err, "cost model: per-action times for rank %d, but the schedule has ranks "
              "0..%d", r, R->P - 1);
      return LP_ERR_ARG;
    }
    for (int i = 0; i < R->nacts[r]; i++) {
      double t = c->durations[r][i];
      if (!is_set(t)) continue;
      char text[LP_ACTION_TEXT_MAX], why[LP_ERRLEN];
      act_text(&R->acts[r][i], text, sizeof text);
      if (!lp_action_is_compute(R->acts[r][i].type)) {
        lp_errf(R->err, "cost model: a time for rank %d, action %d (%s): only compute "
                "actions (F, B, I, W, FB) take time", r, i, text);
        return LP_ERR_ARG;
      }
      if (lp_sim_time_check("time", t, why) != LP_OK) {
        lp_errf(R->err, "cost model: rank %d, action %d (%s): %s", r, i, text, why);
        return LP_ERR_ARG;
      }
    }
  }
  return LP_OK;
}

/* Pass 2: inputs and duration of every action. */
static lp_status build_nodes(run *R) {
  for (int r = 0; r < R->P; r++) {
    for (int i = 0; i < R->nacts[r]; i++) {
      const lp_action *a = &R->acts[r][i];
      node *n = &R->nodes[r][i];
      switch (a->type) {
      case LP_ACT_F:
        LP_CHECK(forward_deps(R, n, r, i, a->stage, a->mb));
        n->a2a = xchg_time(R, a->stage, LP_ACT_F);
        n->dur = stage_time(R, a->stage, LP_ACT_F) + n->a2a;
        break;
      case LP_ACT_B:
      case LP_ACT_I:
        LP_CHECK(backward_deps(R, n, r, i, a->stage, a->mb));
        n->a2a = xchg_time(R, a->stage, a->type);
        n->dur = stage_time(R, a->stage, a->type) + n->a2a;
        break;
      case LP_ACT_W:
        LP_CHECK(route_pos(R, r, i, a->stage, a->mb, &(int){0}));
        LP_CHECK(add_dep(R, n, r, i, 2, a->stage, a->mb));
        n->dur = stage_time(R, a->stage, LP_ACT_W);
        break;
      case LP_ACT_FB: {
        LP_CHECK(forward_deps(R, n, r, i, a->stage, a->mb));
        LP_CHECK(backward_deps(R, n, r, i, a->bstage, a->bmb));
        int st = lp_schedule_vstage_stage(R->s, a->stage);
        double cf = stage_time(R, a->stage, LP_ACT_F);
        double cb = stage_time(R, a->bstage, a->btype);
        double xf = xchg_time(R, a->stage, LP_ACT_F);
        double xb = xchg_time(R, a->bstage, a->btype);
        /* max-style overlap (lp_sim.h): each half's exchanges under the
         * other half's compute */
        double exposed = (xf > cb ? xf - cb : 0) + (xb > cf ? xb - cf : 0);
        n->a2a = xf + xb;
        n->a2a_hidden = n->a2a - exposed;
        n->dur = (R->fb_set[st] ? R->times[st].fb : cf + cb) + exposed;
        break;
      }
      default:
        n->dur = 0; /* SEND/RECV and the stage actions: no rank time */
        break;
      }
      double given = action_time(R, r, i);
      if (is_set(given)) {
        n->dur = given;
        n->a2a_hidden = 0;
      }
    }
  }
  return LP_OK;
}

/* Pass 3: the fixed point. Returns LP_ERR_INTERNAL when ranks stall. */
static lp_status simulate(run *R, double latency) {
  int *next = lp_calloc((size_t)R->P, sizeof *next);
  double *free_at = lp_calloc((size_t)R->P, sizeof *free_at);
  lp_status st = LP_OK;
  if (!next || !free_at) {
    st = LP_ERR_NOMEM;
    goto done;
  }
  for (int progress = 1; progress;) {
    progress = 0;
    for (int r = 0; r < R->P; r++) {
      while (next[r] < R->nacts[r]) {
        int i = next[r];
        node *n = &R->nodes[r][i];
        if (!lp_action_is_compute(R->acts[r][i].type)) {
          n->start = n->end = free_at[r];
          n->done = 1;
          next[r]++;
          continue;
        }
        double ready = free_at[r];
        int blocked = 0;
        for (int d = 0; d < n->ndeps && !blocked; d++) {
          where w = n->deps[d].via.rank >= 0 ? n->deps[d].via : n->deps[d].from;
          const node *p = &R->nodes[w.rank][w.idx];
          if (!p->done) {
            blocked = 1;
          } else {
            double at = p->end + (w.rank != r ? latency : 0);
            if (at > ready) ready = at;
          }
        }
        if (blocked) break;
        n->start = ready;
        n->end = ready + n->dur;
        n->done = 1;
        free_at[r] = n->end;
        next[r]++;
        progress = 1;
      }
    }
  }
  for (int r = 0; r < R->P; r++) {
    if (next[r] >= R->nacts[r]) continue;
    int i = next[r];
    const node *n = &R->nodes[r][i];
    char t1[LP_ACTION_TEXT_MAX], t2[LP_ACTION_TEXT_MAX];
    act_text(&R->acts[r][i], t1, sizeof t1);
    for (int d = 0; d < n->ndeps; d++) {
      where w = n->deps[d].via.rank >= 0 ? n->deps[d].via : n->deps[d].from;
      if (R->nodes[w.rank][w.idx].done) continue;
      act_text(&R->acts[w.rank][w.idx], t2, sizeof t2);
      lp_errf(R->err,
              "simulation stalled: rank %d, action %d (%s) waits for "
              "the %s of micro-batch %d on virtual stage %d (rank %d, "
              "action %d (%s)), which never runs: the schedule "
              "deadlocks",
              r, i, t1, kind_word(n->deps[d].kind), n->deps[d].mb,
              n->deps[d].vstage, w.rank, w.idx, t2);
      break;
    }
    st = LP_ERR_INTERNAL;
    break;
  }
done:
  lp_free(next);
  lp_free(free_at);
  return st;
}

static int cmp_msg(const void *pa, const void *pb) {
  const lp_sim_message *a = pa, *b = pb;
  if (a->sent != b->sent) return a->sent < b->sent ? -1 : 1;
  if (a->from != b->from) return a->from - b->from;
  if (a->from_index != b->from_index) return a->from_index - b->from_index;
  if (a->to != b->to) return a->to - b->to;
  return a->to_index - b->to_index;
}

/* The producing half of action (rank, idx) for a dependency of `kind`. */
static lp_action producing_half(run *R, const dep *d) {
  const lp_action *a = &R->acts[d->from.rank][d->from.idx];
  lp_action h = *a;
  h.btype = h.bstage = h.bmb = -1;
  if (a->type == LP_ACT_FB) {
    if (d->kind == 0) {
      h.type = LP_ACT_F;
    } else {
      h.type = a->btype;
      h.stage = a->bstage;
      h.mb = a->bmb;
    }
  }
  return h;
}

/* Adds a sample (t, live, pw) to rank's series, merging equal times. */
static void sample(lp_sim_result *res, int rank, double t, int live, int pw) {
  int first = res->mem_first[rank];
  if (res->nmem > first && res->mem[res->nmem - 1].t == t) {
    res->mem[res->nmem - 1].live = live;
    res->mem[res->nmem - 1].pending_w = pw;
    return;
  }
  res->mem[res->nmem].t = t;
  res->mem[res->nmem].live = live;
  res->mem[res->nmem].pending_w = pw;
  res->nmem++;
}

/* Pass 4: copy the timeline into the result. */
/* Rank r's data-parallel gradient sums (cost.dp_ranks > 1): each local
 * vstage's, from the end of its last grad-writing action (a replicated
 * stage's from the rank's last action), one at a time on the rank's link;
 * the part before the rank's last action ends is hidden; *finish grows to
 * the last one's end. */
static lp_status dp_sums(const run *R, int r, lp_sim_rank_stats *stt) {
  const lp_sim_cost *c = R->cost;
  if (!c || c->dp_ranks <= 1 || !c->dp_bytes) return LP_OK;
  double last = stt->finish, unit = c->link_unit > 0 ? c->link_unit : 1;
  double *ready = lp_malloc(2 * (size_t)R->V * sizeof *ready), *took = ready + R->V;
  if (!ready) return LP_ERR_NOMEM;
  int n = 0;
  for (int v = 0; v < R->V; v++) {
    if (lp_schedule_vstage_rank(R->s, v) != r) continue;
    int stage = lp_schedule_vstage_stage(R->s, v);
    if (stage >= c->ndp_stages || !(c->dp_bytes[stage] > 0)) continue;
    int copies = 0;
    for (int u = 0; u < R->V; u++) copies += lp_schedule_vstage_stage(R->s, u) == stage;
    double t = copies > 1 ? last : -1;
    for (int i = 0; i < R->nacts[r] && copies == 1; i++) {
      const lp_action *a = &R->acts[r][i];
      int writes = ((a->type == LP_ACT_B || a->type == LP_ACT_W) && a->stage == v) ||
                   (a->type == LP_ACT_FB && a->bstage == v && a->btype == LP_ACT_B);
      if (writes && R->nodes[r][i].end > t) t = R->nodes[r][i].end;
    }
    if (t < 0) t = last;
    /* in order of readiness */
    int k = n++;
    while (k > 0 && ready[k - 1] > t) {
      ready[k] = ready[k - 1];
      took[k] = took[k - 1];
      k--;
    }
    ready[k] = t;
    took[k] = unit * lp_link_allreduce_time(&c->link, c->dp_ranks, c->dp_bytes[stage]);
  }
  double free_at = 0;
  for (int k = 0; k < n; k++) {
    double start = ready[k] > free_at ? ready[k] : free_at, end = start + took[k];
    stt->dp += took[k];
    stt->dp_hidden += (end < last ? end : last) > start ? (end < last ? end : last) - start : 0;
    free_at = end;
  }
  if (free_at > stt->finish) stt->finish = free_at;
  lp_free(ready);
  return LP_OK;
}

static lp_status collect(run *R, lp_sim_result *res, double latency) {
  int nev = 0, nmsg = 0;
  for (int r = 0; r < R->P; r++) {
    for (int i = 0; i < R->nacts[r]; i++) {
      if (!lp_action_is_compute(R->acts[r][i].type)) continue;
      nev++;
      const node *n = &R->nodes[r][i];
      for (int d = 0; d < n->ndeps; d++)
        if (n->deps[d].from.rank != r) nmsg++;
    }
  }
  res->ev = lp_malloc((size_t)nev * sizeof *res->ev);
  res->ev_first = lp_calloc((size_t)R->P + 1, sizeof *res->ev_first);
  res->msg = lp_malloc((size_t)nmsg * sizeof *res->msg);
  res->stats = lp_calloc((size_t)R->P, sizeof *res->stats);
  res->mem = lp_malloc(((size_t)2 * nev + (size_t)R->P) * sizeof *res->mem);
  res->mem_first = lp_calloc((size_t)R->P + 1, sizeof *res->mem_first);
  if (!res->ev || !res->ev_first || !res->msg || !res->stats || !res->mem ||
      !res->mem_first)
    return LP_ERR_NOMEM;

  for (int r = 0; r < R->P; r++) {
    lp_sim_rank_stats *stt = &res->stats[r];
    int live = 0, pw = 0, held = 0; /* held: peak of live + pw */
    res->ev_first[r] = res->nev;
    res->mem_first[r] = res->nmem;
    sample(res, r, 0, 0, 0);
    for (int i = 0; i < R->nacts[r]; i++) {
      const lp_action *a = &R->acts[r][i];
      if (!lp_action_is_compute(a->type)) continue;
      const node *n = &R->nodes[r][i];
      lp_sim_event *e = &res->ev[res->nev++];
      e->rank = r;
      e->index = i;
      e->action = *a;
      e->start = n->start;
      e->end = n->end;
      stt->busy += n->dur;
      stt->a2a += n->a2a;
      stt->a2a_hidden += n->a2a_hidden;
      if (n->end > stt->finish) stt->finish = n->end;
      /* counters: an F holds its activation from its start; a B or I
       * releases it at its end, an I moves it to the pending-W pool */
      int btype = a->type == LP_ACT_FB ? a->btype : a->type;
      if (a->type == LP_ACT_F || a->type == LP_ACT_FB) {
        live++;
        if (live > stt->peak_live) stt->peak_live = live;
        if (live + pw > held) held = live + pw;
        sample(res, r, n->start, live, pw);
      }
      if (btype == LP_ACT_B || btype == LP_ACT_I) {
        live--;
        if (btype == LP_ACT_I) pw++;
        if (pw > stt->peak_pending_w) stt->peak_pending_w = pw;
        sample(res, r, n->end, live, pw);
      } else if (btype == LP_ACT_W) {
        pw--;
        sample(res, r, n->end, live, pw);
      }
      for (int d = 0; d < n->ndeps; d++) {
        where w = n->deps[d].from;
        if (w.rank == r) continue;
        lp_sim_message *m = &res->msg[res->nmsg++];
        m->from = w.rank;
        m->to = r;
        m->from_index = w.idx;
        m->to_index = i;
        where x = n->deps[d].via.rank >= 0 ? n->deps[d].via : w;
        m->sent = R->nodes[x.rank][x.idx].end;
        m->arrived = m->sent + latency;
        m->what = producing_half(R, &n->deps[d]);
        lp_action_format(&m->what, m->text, sizeof m->text);
      }
    }
    LP_CHECK(dp_sums(R, r, stt));
    stt->peak_act_bytes = held * lp_sim_act_bytes(R->cost);
    if (stt->finish > res->makespan) res->makespan = stt->finish;
  }
  res->ev_first[R->P] = res->nev;
  res->mem_first[R->P] = res->nmem;
  qsort(res->msg, (size_t)res->nmsg, sizeof *res->msg, cmp_msg);
  res->max_bubble = 0;
  for (int r = 0; r < R->P; r++) {
    lp_sim_rank_stats *stt = &res->stats[r];
    stt->bubble = res->makespan - stt->busy;
    stt->bubble_ratio = res->makespan > 0 ? stt->bubble / res->makespan : 0;
    if (r == 0 || stt->bubble > res->max_bubble) res->max_bubble = stt->bubble;
  }
  return LP_OK;
}

/* R->xt from cost's exchanges (lp_sim.h), each checked. */
static lp_status exchange_times(run *R, const lp_sim_cost *cost, int S) {
  /* half h: kind h's name, F, B, I (lp_sim.h's exchange layout) */
  double unit = cost->link_unit == 0 ? 1 : cost->link_unit;
  char why[LP_ERRLEN];
  if (!(unit > 0 && unit <= LP_SIM_MAX_TIME)) {
    lp_errf(R->err, "cost model: link_unit = %g must be a number of cost units per second "
            "in 0..%g", cost->link_unit, LP_SIM_MAX_TIME);
    return LP_ERR_ARG;
  }
  if (cost->nexchange_stages > 0 && !cost->exchanges) {
    lp_errf(R->err, "cost model: exchanges for %d stages given without an array",
            cost->nexchange_stages);
    return LP_ERR_ARG;
  }
  for (int k = 0; k < cost->nexchange_stages; k++) {
    for (int h = 0; h < 3; h++) {
      const lp_sim_exchanges *x = &cost->exchanges[3 * k + h];
      const char *key = "exchanges";
      if (lp_sim_time_check(key, x->n, why) != LP_OK ||
          lp_sim_time_check("bytes_out", x->bytes_out, why) != LP_OK ||
          lp_sim_time_check("bytes_in", x->bytes_in, why) != LP_OK) {
        lp_errf(R->err, "cost model: exchanges of %s on model stage %d: %s", lp_kind_name(h), k,
                why);
        return LP_ERR_ARG;
      }
      if (x->n == 0) continue;
      if (k >= S) {
        lp_errf(R->err, "cost model: exchanges for model stage %d, but the schedule has "
                "stages 0..%d", k, S - 1);
        return LP_ERR_ARG;
      }
      double t = x->n * unit * lp_sim_alltoallv_time(cost, x->bytes_out, x->bytes_in);
      if (lp_sim_time_check("exchange time", t, why) != LP_OK) {
        lp_errf(R->err, "cost model: the exchanges of %s on model stage %d take %.17g, more "
                "than the limit of %g", lp_kind_name(h), k, t, LP_SIM_MAX_TIME);
        return LP_ERR_ARG;
      }
      R->xt[3 * k + h] = t;
    }
  }
  return LP_OK;
}

static lp_status setup(run *R, const lp_sim_cost *cost) {
  lp_schedule *s = R->s;
  int S = lp_schedule_stages(s);
  size_t vm = (size_t)R->V * (size_t)R->M;
  R->acts = lp_calloc((size_t)R->P, sizeof *R->acts);
  R->nacts = lp_calloc((size_t)R->P, sizeof *R->nacts);
  R->nodes = lp_calloc((size_t)R->P, sizeof *R->nodes);
  R->pos = lp_malloc(vm * sizeof *R->pos);
  R->rlen = lp_calloc((size_t)R->M, sizeof *R->rlen);
  R->fwd = lp_malloc(vm * sizeof *R->fwd);
  R->bwd = lp_malloc(vm * sizeof *R->bwd);
  R->sendf = lp_malloc(vm * sizeof *R->sendf);
  R->sendb = lp_malloc(vm * sizeof *R->sendb);
  R->bwd_type = lp_calloc(vm, sizeof *R->bwd_type);
  R->times = lp_calloc((size_t)S, sizeof *R->times);
  R->fb_set = lp_calloc((size_t)S, sizeof *R->fb_set);
  R->xt = lp_calloc((size_t)S * 3, sizeof *R->xt);
  if (!R->acts || !R->nacts || !R->nodes || !R->pos || !R->rlen || !R->fwd ||
      !R->bwd || !R->sendf || !R->sendb || !R->bwd_type || !R->times || !R->fb_set ||
      !R->xt)
    return LP_ERR_NOMEM;
  for (size_t k = 0; k < vm; k++) {
    R->pos[k] = -1;
    R->fwd[k].rank = R->fwd[k].idx = -1;
    R->bwd[k].rank = R->bwd[k].idx = -1;
    R->sendf[k].rank = R->sendf[k].idx = -1;
    R->sendb[k].rank = R->sendb[k].idx = -1;
  }
  for (int m = 0; m < R->M; m++) {
    const int *route = lp_schedule_route(s, m, &R->rlen[m]);
    for (int k = 0; k < R->rlen[m]; k++)
      if (route[k] >= 0 && route[k] < R->V && R->pos[route[k] * R->M + m] < 0)
        R->pos[route[k] * R->M + m] = k;
  }
  for (int r = 0; r < R->P; r++) {
    R->acts[r] = lp_schedule_actions(s, r, &R->nacts[r]);
    if (R->nacts[r] > 0) {
      R->nodes[r] = lp_calloc((size_t)R->nacts[r], sizeof **R->nodes);
      if (!R->nodes[r]) return LP_ERR_NOMEM;
    }
  }
  if (cost && cost->nstages > 0 && !cost->stages) {
    lp_errf(R->err, "cost model: %d stage overrides given without an array",
            cost->nstages);
    return LP_ERR_ARG;
  }
  char why[LP_ERRLEN];
  if (cost && lp_sim_time_check("latency", cost->latency, why) != LP_OK) {
    lp_errf(R->err, "cost model: %s", why);
    return LP_ERR_ARG;
  }
  for (int k = S; cost && k < cost->nstages; k++) {
    const lp_sim_times *o = &cost->stages[k];
    if (is_set(o->f) || is_set(o->b) || is_set(o->i) || is_set(o->w) ||
        is_set(o->fb)) {
      lp_errf(R->err,
              "cost model: override for model stage %d, but the "
              "schedule has stages 0..%d",
              k, S - 1);
      return LP_ERR_ARG;
    }
  }
  for (int k = 0; k < S; k++) {
    LP_CHECK(lp_sim_cost_resolve(cost, k, &R->times[k], R->err));
    R->fb_set[k] = is_set(R->times[k].fb);
  }
  R->cost = cost;
  LP_CHECK(check_durations(R));
  return cost ? exchange_times(R, cost, S) : LP_OK;
}

static void teardown(run *R) {
  if (R->nodes)
    for (int r = 0; r < R->P; r++)
      lp_free(R->nodes[r]);
  lp_free(R->nodes);
  lp_free(R->acts);
  lp_free(R->nacts);
  lp_free(R->pos);
  lp_free(R->rlen);
  lp_free(R->fwd);
  lp_free(R->bwd);
  lp_free(R->sendf);
  lp_free(R->sendb);
  lp_free(R->bwd_type);
  lp_free(R->times);
  lp_free(R->fb_set);
  lp_free(R->xt);
}

lp_status lp_sim_run(lp_schedule *s, const lp_sim_cost *cost,
                     lp_sim_result **out, char *err) {
  char local[LP_ERRLEN];
  if (!err) err = local;
  err[0] = '\0';
  *out = NULL;
  if (!s) {
    lp_errf(err, "no schedule");
    return LP_ERR_ARG;
  }
  lp_status st = lp_schedule_validate(s);
  if (st != LP_OK) {
    if (st == LP_ERR_NOMEM)
      lp_errf(err, "out of memory");
    else
      lp_errf(err, "%s", lp_schedule_last_error(s));
    return st;
  }
  run R;
  memset(&R, 0, sizeof R);
  R.s = s;
  R.P = lp_schedule_ranks(s);
  R.M = lp_schedule_microbatches(s);
  R.V = lp_schedule_vstages(s);
  R.err = err;
  lp_sim_result *res = NULL;
  LP_CHECK_GOTO(setup(&R, cost), st, fail);
  LP_CHECK_GOTO(map_producers(&R), st, fail);
  LP_CHECK_GOTO(build_nodes(&R), st, fail);
  double latency = 0; /* per message: cost latency + link (sim_link.c) */
  LP_CHECK_GOTO(lp_sim_message_delay(cost, &latency, err), st, fail);
  LP_CHECK_GOTO(simulate(&R, latency), st, fail);
  res = lp_calloc(1, sizeof *res);
  if (!res) {
    st = LP_ERR_NOMEM;
    goto fail;
  }
  res->ranks = R.P;
  res->stages = lp_schedule_stages(s);
  res->microbatches = R.M;
  res->latency = latency;
  res->name = lp_strdup(lp_schedule_name(s));
  if (!res->name) {
    st = LP_ERR_NOMEM;
    goto fail;
  }
  LP_CHECK_GOTO(collect(&R, res, latency), st, fail);
  teardown(&R);
  *out = res;
  return LP_OK;
fail:
  if (st == LP_ERR_NOMEM) lp_errf(err, "out of memory");
  lp_sim_result_free(res);
  teardown(&R);
  return st;
}
