/* lower.c — lp_schedule_lower: inserts SEND/RECV into a validated
 * compute-only schedule.
 *
 * Global-order construction: rounds over ranks 0..P-1; in a round each rank
 * may emit its next compute action once all its cross-rank inputs have been
 * received (their RECV is already in its list). Emitting appends the action,
 * then for each cross-rank output a SEND on this rank and, at the same
 * moment, the matching RECV on the consumer's rank. All lists are then
 * subsequences of one global sequence in which each SEND is immediately
 * followed by its RECV, so the result cannot deadlock under blocking
 * rendezvous send/receive, and the k-th message between two ranks is sent
 * and received k-th. */
#include "schedule_internal.h"

#include <stdio.h>
#include <string.h>

typedef struct lctx {
  const lp_schedule *s;
  lp_schedule *out;
  int S;
  unsigned char *got_f; /* [M*S] F input of (mb, k) received */
  unsigned char *got_b; /* [M*S] output-grad of (mb, k) received */
} lctx;

#define LKEY(c, m, k) ((size_t)(m) * (size_t)(c)->S + (size_t)(k))

static int lrank(const lctx *c, int m, int k) {
  return c->s->vst[c->s->routes[m][k]].rank;
}

/* 1 when every cross-rank input of a (on rank r) has been received. */
static int inputs_ready(const lctx *c, int r, const lp_action *a) {
  lp__half h[2];
  int nh = lp__halves(a, h);
  for (int j = 0; j < nh; j++) {
    int m = h[j].mb, k = lp__kpos(c->s, h[j].v, m);
    if (h[j].type == LP_ACT_F) {
      if (k > 0 && lrank(c, m, k - 1) != r && !c->got_f[LKEY(c, m, k)]) return 0;
    } else if (h[j].type != LP_ACT_W) {
      if (k < c->S - 1 && lrank(c, m, k + 1) != r && !c->got_b[LKEY(c, m, k)]) return 0;
    }
  }
  return 1;
}

static lp_status push_msg(lp_schedule *out, int rank, int type, int v, int mb) {
  lp_action a = {type, v, mb, -1, -1, -1};
  return lp_schedule_push(out, rank, &a);
}

/* Appends compute action a to rank r, then its SEND/RECV pairs. */
static lp_status emit(lctx *c, int r, const lp_action *a) {
  LP_CHECK(lp_schedule_push(c->out, r, a));
  lp__half h[2];
  int nh = lp__halves(a, h);
  for (int j = 0; j < nh; j++) {
    int v = h[j].v, m = h[j].mb, k = lp__kpos(c->s, v, m);
    if (h[j].type == LP_ACT_F && k < c->S - 1 && lrank(c, m, k + 1) != r) {
      int u = c->s->routes[m][k + 1];
      LP_CHECK(push_msg(c->out, r, LP_ACT_SEND_F, v, m));
      LP_CHECK(push_msg(c->out, lrank(c, m, k + 1), LP_ACT_RECV_F, u, m));
      c->got_f[LKEY(c, m, k + 1)] = 1;
    } else if ((h[j].type == LP_ACT_B || h[j].type == LP_ACT_I) && k > 0 &&
               lrank(c, m, k - 1) != r) {
      int u = c->s->routes[m][k - 1];
      LP_CHECK(push_msg(c->out, r, LP_ACT_SEND_B, v, m));
      LP_CHECK(push_msg(c->out, lrank(c, m, k - 1), LP_ACT_RECV_B, u, m));
      c->got_b[LKEY(c, m, k - 1)] = 1;
    }
  }
  return LP_OK;
}

/* An empty schedule with s's name, placement and routes. */
static lp_status copy_frame(const lp_schedule *s, lp_schedule **out) {
  LP_CHECK(lp_schedule_new(s->ranks, s->stages, s->microbatches, out));
  lp_status st;
  if (s->name) LP_CHECK_GOTO(lp_schedule_set_name(*out, s->name), st, fail);
  for (int v = 0; v < s->nvst; v++)
    LP_CHECK_GOTO(lp_schedule_add_vstage(*out, s->vst[v].stage, s->vst[v].rank, NULL),
                  st, fail);
  for (int m = 0; m < s->microbatches; m++)
    LP_CHECK_GOTO(lp_schedule_set_route(*out, m, s->routes[m], s->route_len[m]), st,
                  fail);
  return LP_OK;
fail:
  lp_schedule_free(*out);
  *out = NULL;
  return st;
}

/* 1 when a WAIT_REDUCE_GRAD of v may be emitted: every other copy of v's
 * model stage has emitted its REDUCE_GRAD (or its whole list, without one).
 * red_at: [nvst] position of each vstage's REDUCE_GRAD, -1 none. */
static int reduce_emitted(const lp_schedule *s, const int *red_at, const int *cur, int v) {
  for (int u = 0; u < s->nvst; u++) {
    if (u == v || s->vst[u].stage != s->vst[v].stage) continue;
    int r = s->vst[u].rank;
    if (cur[r] <= (red_at[u] >= 0 ? red_at[u] : s->acts[r].n - 1)) return 0;
  }
  return 1;
}

static lp_status build(lctx *c) {
  const lp_schedule *s = c->s;
  int P = s->ranks;
  size_t left = 0;
  int *cur = lp_calloc((size_t)P, sizeof *cur);
  int *red_at = lp_malloc((size_t)(s->nvst ? s->nvst : 1) * sizeof *red_at);
  if (!cur || !red_at) {
    lp_free(cur);
    lp_free(red_at);
    return LP_ERR_NOMEM;
  }
  for (int v = 0; v < s->nvst; v++) red_at[v] = -1;
  for (int r = 0; r < P; r++) {
    left += (size_t)s->acts[r].n;
    for (int i = 0; i < s->acts[r].n; i++)
      if (s->acts[r].v[i].type == LP_ACT_REDUCE_GRAD) red_at[s->acts[r].v[i].stage] = i;
  }
  lp_status st = LP_OK;
  while (left > 0) {
    int moved = 0;
    for (int r = 0; r < P; r++) {
      const action_list *l = &s->acts[r];
      while (cur[r] < l->n && !lp_action_is_compute(l->v[cur[r]].type) &&
             (l->v[cur[r]].type != LP_ACT_WAIT_REDUCE_GRAD ||
              reduce_emitted(s, red_at, cur, l->v[cur[r]].stage))) {
        LP_CHECK_GOTO(lp_schedule_push(c->out, r, &l->v[cur[r]]), st, done);
        cur[r]++, left--, moved = 1;
      }
      if (cur[r] < l->n && lp_action_is_compute(l->v[cur[r]].type) &&
          inputs_ready(c, r, &l->v[cur[r]])) {
        LP_CHECK_GOTO(emit(c, r, &l->v[cur[r]]), st, done);
        cur[r]++, left--, moved = 1;
      }
    }
    if (!moved) {
      char t[LP_ACTION_TEXT_MAX];
      int r = 0;
      while (cur[r] >= s->acts[r].n) r++;
      lp_errf(c->out->err, "lowering made no progress at rank %d, action %d (%s)", r,
              cur[r], ACT_TEXT(&s->acts[r].v[cur[r]], t));
      st = LP_ERR_INTERNAL;
      goto done;
    }
  }
done:
  lp_free(cur);
  lp_free(red_at);
  return st;
}

lp_status lp_schedule_lower(lp_schedule *s, lp_schedule **out) {
  *out = NULL;
  if (lp_schedule_has_comm(s)) {
    lp_errf(s->err, "schedule is already lowered (it has SEND/RECV actions)");
    return LP_ERR_INVALID;
  }
  LP_CHECK(lp_schedule_validate(s));
  lctx c;
  memset(&c, 0, sizeof c);
  c.s = s;
  c.S = s->stages;
  lp_status st = copy_frame(s, &c.out);
  if (st != LP_OK) goto done;
  size_t MS = (size_t)s->microbatches * (size_t)s->stages;
  c.got_f = lp_calloc(MS, 1);
  c.got_b = lp_calloc(MS, 1);
  if (!c.got_f || !c.got_b) {
    st = LP_ERR_NOMEM;
    goto done;
  }
  LP_CHECK_GOTO(build(&c), st, done);
  LP_CHECK_GOTO(lp_schedule_validate_sends(c.out, LP_SENDS_RENDEZVOUS), st, done);
done:
  if (st != LP_OK) {
    if (st == LP_ERR_NOMEM) lp_errf(s->err, "out of memory");
    else if (c.out) lp_errf(s->err, "lowered schedule: %s", c.out->err);
    lp_schedule_free(c.out);
    c.out = NULL;
  }
  lp_free(c.got_f);
  lp_free(c.got_b);
  *out = c.out;
  return st;
}
