/* validate.c — lp_schedule_validate: structure (routes, each micro-batch
 * forwarded and backwarded once per stage), per-rank order, deadlock of the
 * per-rank orders against the data dependencies, and for lowered schedules
 * SEND/RECV placement, per-pair message order and deadlock under the chosen
 * send model: non-blocking (the default, what the executor and PyTorch's
 * runtime do: SEND and RECV only post, the compute that uses a message
 * waits for its SEND), buffered (a send never waits, a RECV waits for its
 * send) or rendezvous (a send waits for its receive). The
 * stage actions: WAIT_REDUCE_GRAD after its REDUCE_GRAD, waiting for every
 * other copy of the stage to start its reduction; no compute on a stage
 * between its RESHARD and the next UNSHARD. Index arrays keep it linear in the number of
 * actions (the progress loops add rounds × ranks). */
#include "schedule_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { DEP_FWD, DEP_BWD, DEP_IGRAD };
static const char *dep_names[] = {"forward", "backward", "input-grad"};

/* One data dependency of a half: the action computing `kind` of (v, mb),
 * found at rank, pos. */
typedef struct dep {
  int kind, v, mb, rank, pos;
} dep;

typedef struct vctx {
  lp_schedule *s;
  int P, S, M;
  size_t N;                    /* total actions */
  size_t *off;                 /* [P] global index of rank r's action 0 */
  int *f_at, *b_at, *w_at;     /* [M*S] position on the vstage's rank, -1 none */
  signed char *b_kind;         /* [M*S] LP_ACT_B or LP_ACT_I */
  int *last_work;              /* [nvst] position of the last B or W, -1 none */
  int *red_at;                 /* [nvst] position of its REDUCE_GRAD, -1 none */
  int *first_copy, *next_copy; /* [stages], [nvst]: copies of a model stage */
  lp_send_model sends;
  int *cur;                    /* [P] progress of each rank */
  /* lowered schedules only */
  int *sendF, *recvF, *sendB, *recvB; /* [M*(S-1)] position, -1 none */
  int *peer_rank, *peer_pos;   /* [N] the matched end of a SEND/RECV */
  size_t *pair_off;            /* [P*P+1] */
  size_t *fill;                /* [P*P] */
  int *snd, *rcv;              /* [messages] positions, grouped by rank pair */
} vctx;

#define KEY(c, m, k) ((size_t)(m) * (size_t)(c)->S + (size_t)(k))
#define EDGE(c, m, k) ((size_t)(m) * (size_t)((c)->S - 1) + (size_t)(k))

static const lp_action *act_at(const vctx *c, int r, int i) {
  return &c->s->acts[r].v[i];
}

static int vrank(const vctx *c, int v) { return c->s->vst[v].rank; }

static int route_at(const vctx *c, int m, int k) { return c->s->routes[m][k]; }

static int is_comm(int type) { return lp_action_is_p2p(type); }
static int is_send(int type) { return type == LP_ACT_SEND_F || type == LP_ACT_SEND_B; }

/* Writes the error (a whole message) and returns LP_ERR_INVALID. */
static lp_status fail(vctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static lp_status fail(vctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->s->err, LP_ERRLEN, fmt, ap);
  va_end(ap);
  return LP_ERR_INVALID;
}

/* Same, prefixed with "rank r, action i (text): ". */
static lp_status fail_at(vctx *c, int r, int i, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static lp_status fail_at(vctx *c, int r, int i, const char *fmt, ...) {
  char t[LP_ACTION_TEXT_MAX];
  int n = snprintf(c->s->err, LP_ERRLEN, "rank %d, action %d (%s): ", r, i,
                   ACT_TEXT(act_at(c, r, i), t));
  if (n < 0 || n >= LP_ERRLEN) return LP_ERR_INVALID;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->s->err + n, (size_t)(LP_ERRLEN - n), fmt, ap);
  va_end(ap);
  return LP_ERR_INVALID;
}

/* Appends to a fixed-size message, truncating quietly. */
static void msg_add(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void msg_add(char *buf, size_t cap, const char *fmt, ...) {
  size_t n = strlen(buf);
  if (n + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + n, cap - n, fmt, ap);
  va_end(ap);
}

static void *alloc_fill(size_t n, size_t size, int byte) {
  void *p = lp_malloc((n ? n : 1) * size);
  if (p) memset(p, byte, (n ? n : 1) * size);
  return p;
}

static void ctx_free(vctx *c) {
  lp_free(c->off);
  lp_free(c->f_at);
  lp_free(c->b_at);
  lp_free(c->w_at);
  lp_free(c->b_kind);
  lp_free(c->last_work);
  lp_free(c->red_at);
  lp_free(c->first_copy);
  lp_free(c->next_copy);
  lp_free(c->cur);
  lp_free(c->sendF);
  lp_free(c->recvF);
  lp_free(c->sendB);
  lp_free(c->recvB);
  lp_free(c->peer_rank);
  lp_free(c->peer_pos);
  lp_free(c->pair_off);
  lp_free(c->fill);
  lp_free(c->snd);
  lp_free(c->rcv);
}

/* The data dependencies of half h (at route position k) into d; returns
 * how many. Positions are -1 where the producer does not exist. */
static int deps_of(const vctx *c, const lp__half *h, int k, dep d[2]) {
  int m = h->mb, n = 0;
  switch (h->type) {
  case LP_ACT_F:
    if (k > 0) {
      int u = route_at(c, m, k - 1);
      d[n++] = (dep){DEP_FWD, u, m, vrank(c, u), c->f_at[KEY(c, m, k - 1)]};
    }
    break;
  case LP_ACT_B:
  case LP_ACT_I:
    d[n++] = (dep){DEP_FWD, h->v, m, vrank(c, h->v), c->f_at[KEY(c, m, k)]};
    if (k < c->S - 1) {
      int u = route_at(c, m, k + 1);
      d[n++] = (dep){DEP_BWD, u, m, vrank(c, u), c->b_at[KEY(c, m, k + 1)]};
    }
    break;
  case LP_ACT_W:
    d[n++] = (dep){DEP_IGRAD, h->v, m, vrank(c, h->v), c->b_at[KEY(c, m, k)]};
    break;
  default: break;
  }
  return n;
}

/* ---- a) and b): routes, each (stage, mb) forwarded and backwarded once ---- */

static lp_status check_structure(vctx *c) {
  lp_schedule *s = c->s;
  for (int m = 0; m < c->M; m++)
    if (!s->routes[m]) return fail(c, "micro-batch %d has no route", m);
  for (int v = 0; v < s->nvst; v++)
    if (s->vst[v].rank < 0 || s->vst[v].rank >= c->P)
      return fail(c, "virtual stage %d is not placed on a rank", v);

  for (int r = 0; r < c->P; r++) {
    for (int i = 0; i < s->acts[r].n; i++) {
      lp__half h[2];
      int nh = lp__halves(act_at(c, r, i), h);
      for (int j = 0; j < nh; j++) {
        int k = lp__kpos(s, h[j].v, h[j].mb);
        if (k < 0)
          return fail_at(c, r, i, "stage %d is not on the route of micro-batch %d",
                         h[j].v, h[j].mb);
        size_t key = KEY(c, h[j].mb, k);
        if (h[j].type == LP_ACT_F) {
          if (c->f_at[key] >= 0)
            return fail_at(c, r, i, "micro-batch %d is forwarded twice on stage %d "
                           "(first at rank %d, action %d)", h[j].mb, h[j].v, r,
                           c->f_at[key]);
          c->f_at[key] = i;
        } else if (h[j].type == LP_ACT_W) {
          if (c->w_at[key] >= 0)
            return fail_at(c, r, i, "weight-grad of micro-batch %d on stage %d "
                           "appears twice (first at rank %d, action %d)", h[j].mb,
                           h[j].v, r, c->w_at[key]);
          c->w_at[key] = i;
        } else {
          if (c->b_at[key] >= 0)
            return fail_at(c, r, i, "micro-batch %d is backwarded twice on stage %d "
                           "(first at rank %d, action %d)", h[j].mb, h[j].v, r,
                           c->b_at[key]);
          c->b_at[key] = i;
          c->b_kind[key] = (signed char)h[j].type;
        }
      }
    }
  }

  for (int m = 0; m < c->M; m++) {
    for (int k = 0; k < c->S; k++) {
      int v = route_at(c, m, k);
      if (c->f_at[KEY(c, m, k)] < 0)
        return fail(c, "micro-batch %d is never forwarded on stage %d (rank %d)", m,
                    v, vrank(c, v));
      if (c->b_at[KEY(c, m, k)] < 0)
        return fail(c, "micro-batch %d is never backwarded on stage %d (rank %d)", m,
                    v, vrank(c, v));
    }
  }

  for (int r = 0; r < c->P; r++) {
    for (int i = 0; i < s->acts[r].n; i++) {
      const lp_action *a = act_at(c, r, i);
      if (a->type != LP_ACT_W) continue;
      size_t key = KEY(c, a->mb, lp__kpos(s, a->stage, a->mb));
      if (c->b_kind[key] != LP_ACT_I)
        return fail_at(c, r, i, "weight-grad of micro-batch %d on stage %d without "
                       "an input-grad (I)", a->mb, a->stage);
    }
  }

  for (int m = 0; m < c->M; m++) {
    for (int k = 0; k < c->S; k++) {
      size_t key = KEY(c, m, k);
      int v = route_at(c, m, k);
      int last = c->b_kind[key] == LP_ACT_I ? c->w_at[key] : c->b_at[key];
      if (c->b_kind[key] == LP_ACT_I && c->w_at[key] < 0)
        return fail(c, "stage %d, micro-batch %d: I without its W (rank %d, action %d)",
                    v, m, vrank(c, v), c->b_at[key]);
      if (last > c->last_work[v]) c->last_work[v] = last;
    }
  }
  return LP_OK;
}

/* ---- c) and f): order on one rank ---- */

static lp_status order_error(vctx *c, int r, int i, const lp__half *h, int which,
                             const dep *d) {
  if (d->pos == i) return fail_at(c, r, i, "the two halves depend on each other");
  switch (h->type) {
  case LP_ACT_F:
    return fail_at(c, r, i, "forward of micro-batch %d on stage %d comes before the "
                   "forward on upstream stage %d", h->mb, h->v, d->v);
  case LP_ACT_W:
    return fail_at(c, r, i, "weight-grad of micro-batch %d on stage %d comes before "
                   "its input-grad", h->mb, h->v);
  default:
    if (which == 0)
      return fail_at(c, r, i, "backward of micro-batch %d on stage %d comes before "
                     "its forward", h->mb, h->v);
    return fail_at(c, r, i, "backward of micro-batch %d on stage %d comes before the "
                   "backward on downstream stage %d", h->mb, h->v, d->v);
  }
}

/* The stage actions (REDUCE_GRAD, WAIT_REDUCE_GRAD, UNSHARD, RESHARD) of
 * action i on rank r; `resharded` is the RESHARD position per vstage, -1
 * while its parameters are gathered. */
static lp_status check_stage_action(vctx *c, int r, int i, const lp_action *a,
                                    int *resharded) {
  int v = a->stage;
  switch (a->type) {
  case LP_ACT_REDUCE_GRAD:
    if (c->last_work[v] > i)
      return fail_at(c, r, i, "gradients of stage %d are reduced before its last "
                     "weight-grad (action %d)", v, c->last_work[v]);
    if (c->red_at[v] >= 0)
      return fail_at(c, r, i, "gradients of stage %d are reduced twice (first at "
                     "action %d)", v, c->red_at[v]);
    c->red_at[v] = i;
    break;
  case LP_ACT_WAIT_REDUCE_GRAD:
    if (c->red_at[v] < 0)
      return fail_at(c, r, i, "waits for the gradient reduction of stage %d, which "
                     "no earlier REDUCE_GRAD on rank %d starts", v, r);
    break;
  case LP_ACT_RESHARD: resharded[v] = i; break;
  case LP_ACT_UNSHARD: resharded[v] = -1; break;
  default: break;
  }
  return LP_OK;
}

static lp_status check_order(vctx *c) {
  lp_schedule *s = c->s;
  int *resharded = alloc_fill((size_t)s->nvst, sizeof(int), 0xff);
  if (!resharded) return LP_ERR_NOMEM;
  lp_status st = LP_OK;
  for (int r = 0; r < c->P && st == LP_OK; r++) {
    for (int i = 0; i < s->acts[r].n && st == LP_OK; i++) {
      const lp_action *a = act_at(c, r, i);
      if (!lp_action_has_mb(a->type)) {
        st = check_stage_action(c, r, i, a, resharded);
        continue;
      }
      lp__half h[2];
      int nh = lp__halves(a, h);
      for (int j = 0; j < nh && st == LP_OK; j++) {
        if (resharded[h[j].v] >= 0) {
          st = fail_at(c, r, i, "stage %d computes after its RESHARD (action %d) "
                       "without an UNSHARD in between", h[j].v, resharded[h[j].v]);
          break;
        }
        dep d[2];
        int nd = deps_of(c, &h[j], lp__kpos(s, h[j].v, h[j].mb), d);
        for (int x = 0; x < nd && st == LP_OK; x++)
          if (d[x].rank == r && d[x].pos >= i) st = order_error(c, r, i, &h[j], x, &d[x]);
      }
    }
  }
  lp_free(resharded);
  return st;
}

/* ---- d) and e): progress of all ranks together ---- */

/* 1 when every data dependency of rank r's current action is done; else 0
 * and the first missing one in *blocker. */
static int deps_ready(const vctx *c, int r, dep *blocker) {
  const lp_action *a = act_at(c, r, c->cur[r]);
  lp__half h[2];
  int nh = lp__halves(a, h);
  for (int j = 0; j < nh; j++) {
    dep d[2];
    int nd = deps_of(c, &h[j], lp__kpos(c->s, h[j].v, h[j].mb), d);
    for (int x = 0; x < nd; x++) {
      if (d[x].pos >= c->cur[d[x].rank]) {
        *blocker = d[x];
        return 0;
      }
    }
  }
  return 1;
}

/* How SEND/RECV move in check_progress: FREE before the messages are
 * matched (only data dependencies count), then the send model. */
enum { MODE_FREE = -1 };

/* For a WAIT_REDUCE_GRAD of v: the first other copy of v's model stage
 * that has not yet started its reduction (passed its REDUCE_GRAD, or its
 * rank's end when it has none) in *copy; 1 when there is none. */
static int reduce_ready(const vctx *c, int v, int *copy) {
  for (int u = c->first_copy[c->s->vst[v].stage]; u >= 0; u = c->next_copy[u]) {
    if (u == v) continue;
    int ur = vrank(c, u);
    int at = c->red_at[u] >= 0 ? c->red_at[u] : c->s->acts[ur].n - 1;
    if (c->cur[ur] <= at) {
      *copy = u;
      return 0;
    }
  }
  return 1;
}

/* Non-blocking model: 1 when the SEND of every message rank r's current
 * (compute) action receives has been issued; else 0 and that SEND's rank
 * and position in *b, *q. The RECV comes before the action
 * (check_messages_present), so its match is known. */
static int sends_issued(const vctx *c, int r, int *b, int *q) {
  lp__half h[2];
  int nh = lp__halves(act_at(c, r, c->cur[r]), h);
  for (int j = 0; j < nh; j++) {
    int m = h[j].mb, k = lp__kpos(c->s, h[j].v, m), p = -1;
    if (h[j].type == LP_ACT_F) {
      if (k > 0 && vrank(c, route_at(c, m, k - 1)) != r) p = c->recvF[EDGE(c, m, k - 1)];
    } else if (h[j].type != LP_ACT_W) {
      if (k < c->S - 1 && vrank(c, route_at(c, m, k + 1)) != r) p = c->recvB[EDGE(c, m, k)];
    }
    if (p < 0) continue;
    size_t g = c->off[r] + (size_t)p;
    if (c->cur[c->peer_rank[g]] <= c->peer_pos[g]) {
      *b = c->peer_rank[g];
      *q = c->peer_pos[g];
      return 0;
    }
  }
  return 1;
}

/* Advances rank r by one action if it can. Rendezvous: a SEND/RECV advances
 * together with its matched peer. Buffered: a SEND is free, a RECV waits
 * until its SEND has been issued. Non-blocking: both are free, and a
 * compute action waits until the SENDs of the messages it uses have been
 * issued. FREE: both are free. */
static int step(vctx *c, int r, int mode) {
  const lp_action *a = act_at(c, r, c->cur[r]);
  if (is_comm(a->type) && mode != MODE_FREE) {
    size_t g = c->off[r] + (size_t)c->cur[r];
    int b = c->peer_rank[g];
    if (mode == LP_SENDS_RENDEZVOUS) {
      if (c->cur[b] != c->peer_pos[g]) return 0;
      c->cur[b]++;
    } else if (mode == LP_SENDS_BUFFERED && !is_send(a->type) &&
               c->cur[b] <= c->peer_pos[g]) {
      return 0;
    }
    c->cur[r]++;
    return 1;
  }
  dep d;
  int copy, b, q;
  if (lp_action_is_compute(a->type) && !deps_ready(c, r, &d)) return 0;
  if (mode == LP_SENDS_NONBLOCKING && lp_action_is_compute(a->type) &&
      !sends_issued(c, r, &b, &q))
    return 0;
  if (a->type == LP_ACT_WAIT_REDUCE_GRAD && !reduce_ready(c, a->stage, &copy)) return 0;
  c->cur[r]++;
  return 1;
}

static lp_status report_deadlock(vctx *c, int mode) {
  char msg[LP_ERRLEN], t[LP_ACTION_TEXT_MAX], t2[LP_ACTION_TEXT_MAX];
  int shown = 0, more = 0;
  snprintf(msg, sizeof msg, "%s",
           mode == LP_SENDS_RENDEZVOUS
               ? "deadlock under rendezvous sends (a send waits for its receive): "
           : mode == LP_SENDS_BUFFERED
               ? "deadlock under buffered sends (a send does not wait for its receive): "
           : mode == LP_SENDS_NONBLOCKING
               ? "deadlock under non-blocking sends and receives (a compute waits for the "
                 "sends of its inputs): "
               : "deadlock: ");
  for (int r = 0; r < c->P; r++) {
    int i = c->cur[r];
    if (i >= c->s->acts[r].n) continue;
    if (shown == 3) {
      more++;
      continue;
    }
    const lp_action *a = act_at(c, r, i);
    msg_add(msg, sizeof msg, "%srank %d waits at action %d (%s) for ", shown ? "; " : "",
            r, i, ACT_TEXT(a, t));
    int copy, b, q;
    if (is_comm(a->type) && mode != MODE_FREE) {
      size_t g = c->off[r] + (size_t)i;
      b = c->peer_rank[g];
      q = c->peer_pos[g];
      msg_add(msg, sizeof msg, "rank %d to reach action %d (%s)", b, q,
              ACT_TEXT(act_at(c, b, q), t2));
    } else if (mode == LP_SENDS_NONBLOCKING && lp_action_is_compute(a->type) &&
               !sends_issued(c, r, &b, &q)) {
      msg_add(msg, sizeof msg, "rank %d to reach action %d (%s)", b, q,
              ACT_TEXT(act_at(c, b, q), t2));
    } else if (a->type == LP_ACT_WAIT_REDUCE_GRAD && !reduce_ready(c, a->stage, &copy)) {
      msg_add(msg, sizeof msg, "stage %d (rank %d) to start reducing the same model "
              "stage's gradients", copy, vrank(c, copy));
    } else {
      dep d;
      if (deps_ready(c, r, &d))
        msg_add(msg, sizeof msg, "nothing (internal error)");
      else
        msg_add(msg, sizeof msg, "the %s of micro-batch %d on stage %d (rank %d, action %d)",
                dep_names[d.kind], d.mb, d.v, d.rank, d.pos);
    }
    shown++;
  }
  if (more) msg_add(msg, sizeof msg, "; and %d more rank%s", more, more > 1 ? "s" : "");
  return fail(c, "%s", msg);
}

static lp_status check_progress(vctx *c, int mode) {
  lp_schedule *s = c->s;
  memset(c->cur, 0, (size_t)c->P * sizeof *c->cur);
  for (;;) {
    int moved = 0, left = 0;
    for (int r = 0; r < c->P; r++) {
      while (c->cur[r] < s->acts[r].n && step(c, r, mode)) moved = 1;
      if (c->cur[r] < s->acts[r].n) left = 1;
    }
    if (!left) return LP_OK;
    if (!moved) return report_deadlock(c, mode);
  }
}

/* ---- e) lowered schedules: where each message goes ---- */

/* For a SEND/RECV at rank r, position i: its edge index, the array slot it
 * fills and the peer virtual stage; errors when it has no peer. */
static lp_status comm_edge(vctx *c, int r, int i, size_t *e, int **arr, int *peer) {
  const lp_action *a = act_at(c, r, i);
  int v = a->stage, m = a->mb;
  int k = lp__kpos(c->s, v, m);
  if (k < 0)
    return fail_at(c, r, i, "stage %d is not on the route of micro-batch %d", v, m);
  int next = a->type == LP_ACT_SEND_F || a->type == LP_ACT_RECV_B;
  if (next && k == c->S - 1)
    return fail_at(c, r, i, "stage %d is the last stage of micro-batch %d's route; "
                   "there is no next stage to %s", v, m,
                   a->type == LP_ACT_SEND_F ? "send to" : "receive a gradient from");
  if (!next && k == 0)
    return fail_at(c, r, i, "stage %d is the first stage of micro-batch %d's route; "
                   "there is no previous stage to %s", v, m,
                   a->type == LP_ACT_RECV_F ? "receive from" : "send a gradient to");
  int u = route_at(c, m, next ? k + 1 : k - 1);
  if (vrank(c, u) == r)
    return fail_at(c, r, i, "stage %d and stage %d (the %s stage of micro-batch %d) are "
                   "both on rank %d; they need no message", v, u,
                   next ? "next" : "previous", m, r);
  *e = EDGE(c, m, next ? k : k - 1);
  *peer = u;
  switch (a->type) {
  case LP_ACT_SEND_F: *arr = c->sendF; break;
  case LP_ACT_RECV_F: *arr = c->recvF; break;
  case LP_ACT_SEND_B: *arr = c->sendB; break;
  default: *arr = c->recvB; break;
  }
  return LP_OK;
}

/* Which message a (checked) SEND/RECV carries: its edge and direction. */
static size_t msg_id(const vctx *c, const lp_action *a) {
  int k = lp__kpos(c->s, a->stage, a->mb);
  int lower = a->type == LP_ACT_SEND_F || a->type == LP_ACT_RECV_B; /* edge k -> k+1 */
  return EDGE(c, a->mb, lower ? k : k - 1) * 2 +
         (a->type == LP_ACT_SEND_B || a->type == LP_ACT_RECV_B);
}

/* Every cross-rank dependency of each compute half has its RECV before the
 * consumer and its SEND after the producer. */
static lp_status check_messages_present(vctx *c) {
  lp_schedule *s = c->s;
  char t[LP_ACTION_TEXT_MAX];
  for (int r = 0; r < c->P; r++) {
    for (int i = 0; i < s->acts[r].n; i++) {
      lp__half h[2];
      int nh = lp__halves(act_at(c, r, i), h);
      for (int j = 0; j < nh; j++) {
        int v = h[j].v, m = h[j].mb, k = lp__kpos(s, v, m);
        if (h[j].type == LP_ACT_W) continue;
        int fwd = h[j].type == LP_ACT_F;
        const char *what = fwd ? "forward" : "backward";
        /* input: from the previous stage (F) or the next stage (B/I) */
        int kin = fwd ? k - 1 : k + 1;
        if (kin >= 0 && kin < c->S && vrank(c, route_at(c, m, kin)) != r) {
          int u = route_at(c, m, kin);
          int p = fwd ? c->recvF[EDGE(c, m, k - 1)] : c->recvB[EDGE(c, m, k)];
          lp_action ra = {fwd ? LP_ACT_RECV_F : LP_ACT_RECV_B, v, m, -1, -1, -1};
          if (p < 0)
            return fail_at(c, r, i, "%s of micro-batch %d on stage %d needs %s from "
                           "stage %d on rank %d, but rank %d never receives it (no %s)",
                           what, m, v, fwd ? "its input" : "the output-grad", u,
                           vrank(c, u), r, ACT_TEXT(&ra, t));
          if (p > i)
            return fail_at(c, r, i, "%s of micro-batch %d on stage %d comes before its "
                           "receive %s (action %d)", what, m, v, ACT_TEXT(&ra, t), p);
        }
        /* output: to the next stage (F) or the previous stage (B/I) */
        int kout = fwd ? k + 1 : k - 1;
        if (kout >= 0 && kout < c->S && vrank(c, route_at(c, m, kout)) != r) {
          int u = route_at(c, m, kout);
          int p = fwd ? c->sendF[EDGE(c, m, k)] : c->sendB[EDGE(c, m, k - 1)];
          lp_action sa = {fwd ? LP_ACT_SEND_F : LP_ACT_SEND_B, v, m, -1, -1, -1};
          if (p < 0)
            return fail_at(c, r, i, "the %s of micro-batch %d on stage %d is never sent "
                           "to stage %d on rank %d (no %s)",
                           fwd ? "forward output" : "input-grad", m, v, u, vrank(c, u),
                           ACT_TEXT(&sa, t));
          if (p < i)
            return fail_at(c, r, p, "sends the %s of micro-batch %d on stage %d before "
                           "computing it (action %d)",
                           fwd ? "forward output" : "input-grad", m, v, i);
        }
      }
    }
  }
  return LP_OK;
}

static lp_status check_comm(vctx *c) {
  lp_schedule *s = c->s;
  size_t E = (size_t)c->M * (size_t)(c->S - 1);
  c->sendF = alloc_fill(E, sizeof(int), 0xff);
  c->recvF = alloc_fill(E, sizeof(int), 0xff);
  c->sendB = alloc_fill(E, sizeof(int), 0xff);
  c->recvB = alloc_fill(E, sizeof(int), 0xff);
  c->peer_rank = alloc_fill(c->N, sizeof(int), 0xff);
  c->peer_pos = alloc_fill(c->N, sizeof(int), 0xff);
  size_t PP = (size_t)c->P * (size_t)c->P;
  c->pair_off = alloc_fill(PP + 1, sizeof(size_t), 0);
  c->fill = alloc_fill(PP, sizeof(size_t), 0);
  if (!c->sendF || !c->recvF || !c->sendB || !c->recvB || !c->peer_rank ||
      !c->peer_pos || !c->pair_off || !c->fill)
    return LP_ERR_NOMEM;

  /* each SEND/RECV: on its route, a cross-rank neighbour, not repeated */
  size_t nsend = 0;
  for (int r = 0; r < c->P; r++) {
    for (int i = 0; i < s->acts[r].n; i++) {
      const lp_action *a = act_at(c, r, i);
      if (!is_comm(a->type)) continue;
      size_t e;
      int *arr, peer;
      LP_CHECK(comm_edge(c, r, i, &e, &arr, &peer));
      if (arr[e] >= 0)
        return fail_at(c, r, i, "message %s twice (first at action %d)",
                       is_send(a->type) ? "sent" : "received", arr[e]);
      arr[e] = i;
      if (is_send(a->type)) {
        c->pair_off[(size_t)r * (size_t)c->P + (size_t)vrank(c, peer)]++;
        nsend++;
      }
    }
  }
  LP_CHECK(check_messages_present(c));

  /* the k-th send from a to b is the k-th receive on b from a */
  size_t acc = 0;
  for (size_t p = 0; p <= PP; p++) {
    size_t n = p < PP ? c->pair_off[p] : 0;
    c->pair_off[p] = acc;
    acc += n;
  }
  c->snd = alloc_fill(nsend, sizeof(int), 0);
  c->rcv = alloc_fill(nsend, sizeof(int), 0);
  if (!c->snd || !c->rcv) return LP_ERR_NOMEM;
  for (int pass = 0; pass < 2; pass++) {
    memset(c->fill, 0, PP * sizeof *c->fill);
    for (int r = 0; r < c->P; r++) {
      for (int i = 0; i < s->acts[r].n; i++) {
        const lp_action *a = act_at(c, r, i);
        if (!is_comm(a->type) || is_send(a->type) != (pass == 0)) continue;
        size_t e;
        int *arr, peer;
        LP_CHECK(comm_edge(c, r, i, &e, &arr, &peer));
        size_t pair = pass == 0 ? (size_t)r * (size_t)c->P + (size_t)vrank(c, peer)
                                : (size_t)vrank(c, peer) * (size_t)c->P + (size_t)r;
        (pass == 0 ? c->snd : c->rcv)[c->pair_off[pair] + c->fill[pair]++] = i;
      }
    }
  }
  char t1[LP_ACTION_TEXT_MAX], t2[LP_ACTION_TEXT_MAX];
  for (int a = 0; a < c->P; a++) {
    for (int b = 0; b < c->P; b++) {
      size_t pair = (size_t)a * (size_t)c->P + (size_t)b;
      for (size_t j = c->pair_off[pair]; j < c->pair_off[pair + 1]; j++) {
        const lp_action *sa = act_at(c, a, c->snd[j]), *ra = act_at(c, b, c->rcv[j]);
        int same = msg_id(c, sa) == msg_id(c, ra);
        if (!same)
          return fail(c, "messages from rank %d to rank %d do not match in order: send "
                      "%zu is %s (rank %d, action %d) but receive %zu is %s (rank %d, "
                      "action %d)", a, b, j - c->pair_off[pair], ACT_TEXT(sa, t1), a,
                      c->snd[j], j - c->pair_off[pair], ACT_TEXT(ra, t2), b, c->rcv[j]);
        c->peer_rank[c->off[a] + (size_t)c->snd[j]] = b;
        c->peer_pos[c->off[a] + (size_t)c->snd[j]] = c->rcv[j];
        c->peer_rank[c->off[b] + (size_t)c->rcv[j]] = a;
        c->peer_pos[c->off[b] + (size_t)c->rcv[j]] = c->snd[j];
      }
    }
  }
  return check_progress(c, (int)c->sends);
}

lp_status lp_schedule_validate(lp_schedule *s) {
  return lp_schedule_validate_sends(s, LP_SENDS_NONBLOCKING);
}

lp_status lp_schedule_validate_sends(lp_schedule *s, lp_send_model sends) {
  vctx c;
  memset(&c, 0, sizeof c);
  c.s = s;
  c.sends = sends;
  c.P = s->ranks;
  c.S = s->stages;
  c.M = s->microbatches;
  s->err[0] = '\0';
  lp_status st = LP_ERR_NOMEM;
  size_t MS = (size_t)c.M * (size_t)c.S;
  c.off = alloc_fill((size_t)c.P, sizeof(size_t), 0);
  c.f_at = alloc_fill(MS, sizeof(int), 0xff);
  c.b_at = alloc_fill(MS, sizeof(int), 0xff);
  c.w_at = alloc_fill(MS, sizeof(int), 0xff);
  c.b_kind = alloc_fill(MS, 1, 0);
  c.last_work = alloc_fill((size_t)s->nvst, sizeof(int), 0xff);
  c.cur = alloc_fill((size_t)c.P, sizeof(int), 0);
  c.red_at = alloc_fill((size_t)s->nvst, sizeof(int), 0xff);
  c.first_copy = alloc_fill((size_t)c.S, sizeof(int), 0xff);
  c.next_copy = alloc_fill((size_t)s->nvst, sizeof(int), 0xff);
  if (!c.off || !c.f_at || !c.b_at || !c.w_at || !c.b_kind || !c.last_work || !c.cur ||
      !c.red_at || !c.first_copy || !c.next_copy)
    goto done;
  for (int v = s->nvst - 1; v >= 0; v--) {
    c.next_copy[v] = c.first_copy[s->vst[v].stage];
    c.first_copy[s->vst[v].stage] = v;
  }
  for (int r = 0; r < c.P; r++) {
    c.off[r] = c.N;
    c.N += (size_t)s->acts[r].n;
  }
  LP_CHECK_GOTO(check_structure(&c), st, done);
  LP_CHECK_GOTO(check_order(&c), st, done);
  LP_CHECK_GOTO(check_progress(&c, MODE_FREE), st, done);
  if (lp_schedule_has_comm(s)) LP_CHECK_GOTO(check_comm(&c), st, done);
  st = LP_OK;
done:
  if (st == LP_ERR_NOMEM) lp_errf(s->err, "out of memory");
  ctx_free(&c);
  return st;
}
