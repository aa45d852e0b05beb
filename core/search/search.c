/* search.c — the schedule search (see lp_search.h and docs/search.md):
 * problem checks, the memory-gated list-scheduling decoder, seeds, late
 * acceptance hill climbing over candidates, and the best's schedule. */
#include "search_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EPS 1e-9
#define INF HUGE_VAL

/* ---- random numbers (xorshift64*) ---- */

static uint64_t rnd(lp_search *S) {
  uint64_t x = S->rng;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  S->rng = x;
  return x * 0x2545F4914F6CDD1DULL;
}
static int rnd_int(lp_search *S, int n) { return n <= 1 ? 0 : (int)(rnd(S) % (uint64_t)n); }
static double rnd_unit(lp_search *S) { return (double)(rnd(S) >> 11) * (1.0 / 9007199254740992.0); }

/* ---- candidates ---- */

static lp_status cand_alloc(lp_search *S, cand *c) {
  c->key = lp_calloc((size_t)S->nslot, sizeof *c->key);
  c->split = lp_calloc((size_t)S->V * (size_t)S->M, 1);
  c->pair = lp_calloc((size_t)S->P, 1);
  return c->key && c->split && c->pair ? LP_OK : LP_ERR_NOMEM;
}
static void cand_free(cand *c) {
  lp_free(c->key);
  lp_free(c->split);
  lp_free(c->pair);
  memset(c, 0, sizeof *c);
}
static void cand_copy(lp_search *S, cand *dst, const cand *src) {
  memcpy(dst->key, src->key, (size_t)S->nslot * sizeof *dst->key);
  memcpy(dst->split, src->split, (size_t)S->V * (size_t)S->M);
  memcpy(dst->pair, src->pair, (size_t)S->P);
  dst->score = src->score;
}

/* The split bit's default: I + W when splitting is allowed. */
static void cand_defaults(lp_search *S, cand *c) {
  memset(c->split, S->split == LP_SEARCH_SPLIT_NEVER ? 0 : 1, (size_t)S->V * (size_t)S->M);
  /* pair; a pair may take a full B when only that pays; a pair always
   * takes a full B (an FB costs the same with I or B, so B saves the W) */
  memset(c->pair, S->pairs ? 1 | 4 | 8 : 0, (size_t)S->P);
}

/* Replaces every key by its rank among the keys of its rank's slots (ties
 * by slot), so that moves of a few units reorder neighbours. */
static int cmp_key(const void *a, const void *b, void *ctx) {
  const double *key = ctx;
  int x = *(const int *)a, y = *(const int *)b;
  if (key[x] != key[y]) return key[x] < key[y] ? -1 : 1;
  return x - y;
}
static void sort_slots(int *v, int *tmp, int n, const double *key) {
  if (n < 2) return;
  int h = n / 2;
  sort_slots(v, tmp, h, key);
  sort_slots(v + h, tmp, n - h, key);
  int i = 0, j = h, k = 0;
  while (i < h && j < n) tmp[k++] = cmp_key(&v[i], &v[j], (void *)key) <= 0 ? v[i++] : v[j++];
  while (i < h) tmp[k++] = v[i++];
  while (j < n) tmp[k++] = v[j++];
  memcpy(v, tmp, (size_t)n * sizeof *v);
}
static void cand_normalize(lp_search *S, cand *c) {
  for (int r = 0; r < S->P; r++) {
    int n = S->rs_first[r + 1] - S->rs_first[r];
    int *v = S->rs_tmp;
    memcpy(v, S->rs_list + S->rs_first[r], (size_t)n * sizeof *v);
    sort_slots(v, S->sort_tmp, n, c->key);
    for (int k = 0; k < n; k++) c->key[v[k]] = k;
  }
}

/* ---- the decoder ---- */

static double fb_cost(const lp_search *S, int vf, int vb, int split) {
  (void)vb;
  (void)split;
  return S->t[vf].fb;
}
static int pair_pays1(const lp_search *S, int vf, int vb, int split) {
  if (!S->pairs || !S->fbset[vf] || vf == vb) return 0;
  double part = split ? S->t[vb].i : S->t[vb].b;
  return fb_cost(S, vf, vb, split) < S->t[vf].f + part - EPS;
}
/* 1: the pair pays as the candidate splits; 2: only with a full B (the
 * search chooses the split, so the pair takes B); 0: it does not pay */
static int pair_pays(const lp_search *S, int vf, int vb, int split, int may_b) {
  if (pair_pays1(S, vf, vb, split)) return 1;
  if (may_b && split && S->split == LP_SEARCH_SPLIT_AUTO && pair_pays1(S, vf, vb, 0)) return 2;
  return 0;
}

/* May rank r start the F of mb m on a virtual stage of a activation units
 * and stay safe (docs/search.md, the memory gate)? */
static int gate(lp_search *S, int r, int m, double a) {
  double L = S->limit[r];
  if (L == INF) return 1;
  decoder *D = &S->D;
  if (D->usage[r] + a > L + EPS) return 0;
  if (D->usage[r] + a + S->maxneed[r] <= L + EPS) return 1;
  int idx = D->ord_idx[m] >= 0 ? D->ord_idx[m] : D->nord;
  double suffix = 0;
  for (int k = D->nord - 1; k >= D->ord_lo; k--) {
    int j = D->order[k];
    if (D->ord_idx[j] == -2) continue; /* done */
    suffix += D->use[r * S->M + j];
    if (k < idx && suffix + D->rem[r * S->M + j] + a > L + EPS) return 0;
  }
  return 1;
}

/* Ready times of the heads of virtual stage v (INF when an input is not
 * computed yet). */
static double ready_f(lp_search *S, int v, int r, int *mb) {
  decoder *D = &S->D;
  int k = D->nf[v];
  if (k >= S->vm_first[v + 1] - S->vm_first[v]) return -1;
  int m = S->vm_list[S->vm_first[v] + k];
  *mb = m;
  int p = S->pos[v * S->M + m];
  if (p == 0) return 0;
  int u = S->routes[S->mb_route[m] * S->S + p - 1];
  double e = D->fend[u * S->M + m];
  if (e < 0) return INF;
  return e + (S->vs_rank[u] != r ? S->lat : 0);
}
static double ready_b(lp_search *S, int v, int r, int *mb) {
  decoder *D = &S->D;
  int k = D->nb[v];
  if (k >= S->vm_first[v + 1] - S->vm_first[v]) return -1;
  int m = S->vm_list[S->vm_first[v] + k];
  *mb = m;
  double fe = D->fend[v * S->M + m];
  if (fe < 0) return INF;
  int p = S->pos[v * S->M + m];
  if (p == S->S - 1) return fe;
  int u = S->routes[S->mb_route[m] * S->S + p + 1];
  double be = D->bend[u * S->M + m];
  if (be < 0) return INF;
  be += S->vs_rank[u] != r ? S->lat : 0;
  return be > fe ? be : fe;
}

/* Chooses rank r's next action from its heads: sets D->T[r] (INF: none
 * possible now) and the choice. */
static void choose(lp_search *S, const cand *c, int r) {
  decoder *D = &S->D;
  int n = S->rv_first[r + 1] - S->rv_first[r];
  const int *vs = S->rv_list + S->rv_first[r];
  double rf[LP_SEARCH_MAX_LOCAL], rb[LP_SEARCH_MAX_LOCAL], rw[LP_SEARCH_MAX_LOCAL];
  int mf[LP_SEARCH_MAX_LOCAL], mbk[LP_SEARCH_MAX_LOCAL], mw[LP_SEARCH_MAX_LOCAL];
  double tmin = INF;
  for (int j = 0; j < n; j++) {
    int v = vs[j];
    rf[j] = ready_f(S, v, r, &mf[j]);
    if (rf[j] >= 0 && rf[j] < INF && !gate(S, r, mf[j], S->act_v[v])) rf[j] = INF;
    rb[j] = ready_b(S, v, r, &mbk[j]);
    rw[j] = -1;
    if (D->wq_head[v] < D->wq_tail[v]) {
      mw[j] = D->wq[S->vm_first[v] + D->wq_head[v]];
      rw[j] = D->bend[v * S->M + mw[j]];
    }
    if (rf[j] >= 0 && rf[j] < tmin) tmin = rf[j];
    if (rb[j] >= 0 && rb[j] < tmin) tmin = rb[j];
    if (rw[j] >= 0 && rw[j] < tmin) tmin = rw[j];
  }
  if (tmin == INF) {
    D->T[r] = INF;
    return;
  }
  double T = tmin > D->free_at[r] ? tmin : D->free_at[r];
  if (c->pair[r] & 2) T = INF; /* waiting: the best-keyed known head, however late */
  double best = INF;
  int bk = -1, bj = -1;
  for (int j = 0; j < n; j++) {
    int v = vs[j];
    if (rf[j] >= 0 && rf[j] <= T && rf[j] < INF && c->key[slot_of(S, v, mf[j], 0)] < best)
      best = c->key[slot_of(S, v, mf[j], 0)], bk = 0, bj = j;
    if (rb[j] >= 0 && rb[j] <= T && rb[j] < INF && c->key[slot_of(S, v, mbk[j], 1)] < best)
      best = c->key[slot_of(S, v, mbk[j], 1)], bk = 1, bj = j;
    if (rw[j] >= 0 && rw[j] <= T && rw[j] < INF && c->key[slot_of(S, v, mw[j], 2)] < best)
      best = c->key[slot_of(S, v, mw[j], 2)], bk = 2, bj = j;
  }
  if (T == INF) {
    double at = bk == 0 ? rf[bj] : bk == 1 ? rb[bj] : rw[bj];
    T = at > D->free_at[r] ? at : D->free_at[r];
  }
  D->T[r] = T;
  D->ch_kind[r] = bk;
  D->ch_v[r] = vs[bj];
  D->ch_m[r] = bk == 0 ? mf[bj] : bk == 1 ? mbk[bj] : mw[bj];
  D->ch_pv[r] = -1;
  if (!(c->pair[r] & 1) || bk == 2) return;
  /* the partner: the best-keyed head of the other kind that is ready and
   * makes a cheaper pair */
  double pb = INF;
  D->ch_forceb[r] = 0;
  for (int j = 0; j < n; j++) {
    if (j == bj) continue;
    int v = vs[j], pay;
    if (bk == 0 && rb[j] >= 0 && rb[j] <= T &&
        (pay = pair_pays(S, vs[bj], v, c->split[v * S->M + mbk[j]], c->pair[r] & 4)) &&
        c->key[slot_of(S, v, mbk[j], 1)] < pb) {
      pb = c->key[slot_of(S, v, mbk[j], 1)];
      D->ch_pv[r] = v;
      D->ch_pm[r] = mbk[j];
      D->ch_forceb[r] = pay == 2 || ((c->pair[r] & 8) && S->split == LP_SEARCH_SPLIT_AUTO);
    } else if (bk == 1 && rf[j] >= 0 && rf[j] <= T && rf[j] < INF &&
               (pay = pair_pays(S, v, vs[bj], c->split[vs[bj] * S->M + mbk[bj]], c->pair[r] & 4)) &&
               c->key[slot_of(S, v, mf[j], 0)] < pb) {
      pb = c->key[slot_of(S, v, mf[j], 0)];
      D->ch_pv[r] = v;
      D->ch_pm[r] = mf[j];
      D->ch_forceb[r] = pay == 2 || ((c->pair[r] & 8) && S->split == LP_SEARCH_SPLIT_AUTO);
    }
  }
}

static void note_memory(lp_search *S, int r) {
  decoder *D = &S->D;
  if (D->usage[r] > D->peak[r]) D->peak[r] = D->usage[r];
}

static void mb_step(lp_search *S, int m) {
  decoder *D = &S->D;
  if (--D->mb_left[m] > 0) return;
  D->ord_idx[m] = -2;
  while (D->ord_lo < D->nord && D->ord_idx[D->order[D->ord_lo]] == -2) D->ord_lo++;
}

static void emit(lp_search *S, int r, const lp_action *a, double start, double end) {
  decoder *D = &S->D;
  int k = S->out_first[r] + D->out_n[r]++;
  D->out[k] = *a;
  D->out_start[k] = start;
  D->out_end[k] = end;
  if (D->out_n[r] == 1) D->start[r] = start;
  D->free_at[r] = end;
  D->busy[r] += end - start;
}

/* F half of (v, m) on r starting at t, its output at `end`. */
static void do_f(lp_search *S, int r, int v, int m, double t, double end) {
  decoder *D = &S->D;
  double a = S->act_v[v];
  D->use[r * S->M + m] += a;
  D->rem[r * S->M + m] -= a;
  D->usage[r] += a;
  note_memory(S, r);
  if (S->pos[v * S->M + m] == 0) {
    D->ord_idx[m] = D->nord;
    D->order[D->nord++] = m;
  }
  D->fend[v * S->M + m] = end;
  D->nf[v]++;
  (void)t;
  mb_step(S, m);
}

static void do_b(lp_search *S, int split, int r, int v, int m, double end) {
  decoder *D = &S->D;
  double a = S->act_v[v];
  D->bend[v * S->M + m] = end;
  D->nb[v]++;
  D->use[r * S->M + m] -= a;
  D->usage[r] -= a;
  if (split) {
    double h = S->w_share * a;
    D->use[r * S->M + m] += h;
    D->usage[r] += h;
    D->wq[S->vm_first[v] + D->wq_tail[v]++] = m;
  }
  mb_step(S, m);
}

/* Runs rank r's chosen action; returns the ranks whose heads it feeds. */
static int execute(lp_search *S, const cand *c, int r, int *touched) {
  decoder *D = &S->D;
  int kind = D->ch_kind[r], v = D->ch_v[r], m = D->ch_m[r];
  double t = D->T[r];
  int nt = 0;
  lp_action a;
  memset(&a, 0, sizeof a);
  a.btype = a.bstage = a.bmb = -1;
  int vf = -1, mf = -1, vb = -1, mb = -1;
  if (kind == 0) vf = v, mf = m;
  if (kind == 1) vb = v, mb = m;
  if (D->ch_pv[r] >= 0) {
    if (kind == 0) vb = D->ch_pv[r], mb = D->ch_pm[r];
    else vf = D->ch_pv[r], mf = D->ch_pm[r];
  }
  if (kind == 2) {
    double h = S->w_share * S->act_v[v];
    a.type = LP_ACT_W;
    a.stage = v;
    a.mb = m;
    double end = t + S->t[v].w;
    emit(S, r, &a, t, end);
    D->wq_head[v]++;
    D->use[r * S->M + m] -= h;
    D->usage[r] -= h;
    mb_step(S, m);
    return 0;
  }
  int split = vb >= 0 ? c->split[vb * S->M + mb] : 0;
  if (vf >= 0 && vb >= 0 && D->ch_forceb[r] && split) {
    split = 0; /* the pair takes a full B: its W is not to come */
    D->left--;
    mb_step(S, mb);
  }
  double dur;
  if (vf >= 0 && vb >= 0) {
    a.type = LP_ACT_FB;
    a.stage = vf;
    a.mb = mf;
    a.btype = split ? LP_ACT_I : LP_ACT_B;
    a.bstage = vb;
    a.bmb = mb;
    dur = fb_cost(S, vf, vb, split);
  } else if (vf >= 0) {
    a.type = LP_ACT_F;
    a.stage = vf;
    a.mb = mf;
    dur = S->t[vf].f;
  } else {
    a.type = split ? LP_ACT_I : LP_ACT_B;
    a.stage = vb;
    a.mb = mb;
    dur = split ? S->t[vb].i : S->t[vb].b;
  }
  double end = t + dur;
  emit(S, r, &a, t, end);
  if (vf >= 0) {
    do_f(S, r, vf, mf, t, end);
    int p = S->pos[vf * S->M + mf];
    if (p + 1 < S->S) touched[nt++] = S->vs_rank[S->routes[S->mb_route[mf] * S->S + p + 1]];
  }
  if (vb >= 0) {
    do_b(S, split, r, vb, mb, end);
    int p = S->pos[vb * S->M + mb];
    if (p > 0) touched[nt++] = S->vs_rank[S->routes[S->mb_route[mb] * S->S + p - 1]];
  }
  return nt;
}

static void decoder_reset(lp_search *S, const cand *c) {
  decoder *D = &S->D;
  size_t vm = (size_t)S->V * (size_t)S->M, pm = (size_t)S->P * (size_t)S->M;
  for (size_t k = 0; k < vm; k++) D->fend[k] = D->bend[k] = -1;
  memset(D->nf, 0, (size_t)S->V * sizeof *D->nf);
  memset(D->nb, 0, (size_t)S->V * sizeof *D->nb);
  memset(D->wq_head, 0, (size_t)S->V * sizeof *D->wq_head);
  memset(D->wq_tail, 0, (size_t)S->V * sizeof *D->wq_tail);
  memset(D->use, 0, pm * sizeof *D->use);
  memcpy(D->rem, S->need, pm * sizeof *D->rem);
  for (int r = 0; r < S->P; r++) {
    D->free_at[r] = D->usage[r] = D->peak[r] = D->busy[r] = D->start[r] = 0;
    D->out_n[r] = 0;
  }
  for (int m = 0; m < S->M; m++) {
    D->ord_idx[m] = -1;
    int left = 0;
    for (int p = 0; p < S->S; p++) {
      int v = S->routes[S->mb_route[m] * S->S + p];
      left += 2 + c->split[v * S->M + m];
    }
    D->mb_left[m] = left;
  }
  D->nord = D->ord_lo = 0;
}

/* Decodes c into the decoder's timeline; fills ev (makespan, span, ranks)
 * and returns the objective in *score. */
static lp_status decode(lp_search *S, cand *c) {
  decoder *D = &S->D;
  decoder_reset(S, c);
  D->left = 0;
  for (int m = 0; m < S->M; m++) D->left += D->mb_left[m];
  for (int r = 0; r < S->P; r++) choose(S, c, r);
  while (D->left > 0) {
    int r = -1;
    double bt = INF;
    for (int q = 0; q < S->P; q++)
      if (D->T[q] < bt) bt = D->T[q], r = q;
    if (r < 0) {
      lp_errf(S->err, "the decoder stalled with %lld actions left (a bug: the memory gate "
              "should keep every candidate deadlock-free)", D->left);
      return LP_ERR_INTERNAL;
    }
    int touched[2];
    int pairwise = D->ch_pv[r] >= 0;
    int nt = execute(S, c, r, touched);
    D->left -= pairwise ? 2 : 1;
    choose(S, c, r);
    for (int k = 0; k < nt; k++)
      if (touched[k] != r) choose(S, c, touched[k]);
  }
  double mk = 0, span = 0;
  for (int r = 0; r < S->P; r++) {
    double fin = D->out_n[r] > 0 ? D->free_at[r] : 0;
    D->ev_rank[r].start = D->start[r];
    D->ev_rank[r].finish = fin;
    D->ev_rank[r].busy = D->busy[r];
    D->ev_rank[r].peak_memory = D->peak[r];
    if (fin > mk) mk = fin;
    if (fin - D->start[r] > span) span = fin - D->start[r];
  }
  D->makespan = mk;
  D->span = span;
  S->evaluations++;
  lp_search_eval e = {mk, span, S->P, D->ev_rank};
  return search_score(S, &e, &c->score);
}

lp_status search_score(lp_search *S, const lp_search_eval *e, double *score) {
  if (S->objective == LP_SEARCH_MAKESPAN) {
    *score = e->makespan;
  } else if (S->objective == LP_SEARCH_SPAN) {
    *score = e->span;
  } else {
    double v = S->fn(S->ud, e);
    if (!(v == v)) {
      lp_errf(S->err, "the objective function failed or returned no number");
      return LP_ERR_ARG;
    }
    *score = v;
  }
  return LP_OK;
}

/* a beats b by more than rounding */
static int better(double a, double b) {
  if (b == INF) return a < INF;
  return a < b - EPS * (1 + fabs(b));
}

/* Keeps the decoder's timeline as the best when it beats it. */
static void consider(lp_search *S, const cand *c, const char *label) {
  if (!better(c->score, S->best_score)) return;
  decoder *D = &S->D;
  S->best_score = c->score;
  S->best_makespan = D->makespan;
  S->best_span = D->span;
  memcpy(S->best_peak, D->peak, (size_t)S->P * sizeof *S->best_peak);
  for (int r = 0; r < S->P; r++) {
    S->best_n[r] = D->out_n[r];
    memcpy(S->best_acts + S->out_first[r], D->out + S->out_first[r],
           (size_t)D->out_n[r] * sizeof *S->best_acts);
  }
  lp_schedule_free(S->best_sched);
  S->best_sched = NULL;
  S->have_best = 1;
  S->best_at = lp_now() - S->t0;
  snprintf(S->best_label, sizeof S->best_label, "%s", label);
  cand_copy(S, &S->best_c, c);
  S->since_best = 0;
}

/* Decodes c, considers it, and makes it a seed of the pool (the pool's
 * best starts the climb). */
static lp_status seed(lp_search *S, cand *c, const char *label) {
  cand_normalize(S, c);
  LP_CHECK(decode(S, c));
  consider(S, c, label);
  if (!S->have_cur || c->score < S->cur.score) {
    cand_copy(S, &S->cur, c);
    S->have_cur = 1;
  }
  return LP_OK;
}

/* ---- seeds ---- */

/* Rule keys: class order of F / backward / W, then micro-batch, then the
 * deeper route position first. */
static void rule_keys(lp_search *S, cand *c, const int cls[3], double mb_weight) {
  for (int v = 0; v < S->V; v++) {
    for (int k = S->vm_first[v]; k < S->vm_first[v + 1]; k++) {
      int m = S->vm_list[k];
      int p = S->pos[v * S->M + m];
      for (int kind = 0; kind < 3; kind++)
        c->key[slot_of(S, v, m, kind)] =
            cls[kind] * 1e9 + mb_weight * m * (S->S + 1) - p + kind * 0.1;
    }
  }
}

/* ASAP keys: the earliest time each action could start with one
 * micro-batch in flight per route position, plus a class offset. */
static void asap_keys(lp_search *S, cand *c, double wdelay) {
  for (int v = 0; v < S->V; v++) {
    for (int k = S->vm_first[v]; k < S->vm_first[v + 1]; k++) {
      int m = S->vm_list[k];
      int p = S->pos[v * S->M + m];
      int idx = k - S->vm_first[v];
      /* steady state: one micro-batch per "slot" of F + B of the stage */
      double period = S->t[v].f + S->t[v].b;
      double tf = S->f_asap[v] + idx * period;
      double tb = S->b_asap[v] + idx * period;
      c->key[slot_of(S, v, m, 0)] = tf;
      c->key[slot_of(S, v, m, 1)] = tb - 0.01;
      c->key[slot_of(S, v, m, 2)] = tb + S->t[v].i + wdelay * period;
      (void)p;
    }
  }
}

lp_status lp_search_seed_rules(lp_search *S) {
  cand c;
  memset(&c, 0, sizeof c);
  lp_status st = cand_alloc(S, &c);
  static const int orders[][3] = {
      {1, 0, 2}, /* backward first, then F, W last: Zero Bubble's greedy core */
      {0, 1, 2}, /* F first (GPipe-like, held back by the memory gate) */
      {1, 0, 0}, /* backward first, W as soon as F cannot go */
      {2, 0, 1}, /* backward, then W, then F: 1F1B with immediate W */
  };
  static const char *names[] = {"seed: backward-first", "seed: forward-first",
                                "seed: backward-first, W eager", "seed: 1F1B-like"};
  for (int k = 0; st == LP_OK && k < 4; k++) {
    for (int wt = 0; st == LP_OK && wt < 4; wt++) {
      cand_defaults(S, &c);
      rule_keys(S, &c, orders[k], wt & 1 ? 0.5 : 1.0);
      if (wt & 2)
        for (int r = 0; r < S->P; r++) c.pair[r] |= 2;
      st = seed(S, &c, names[k]);
    }
  }
  for (int k = 0; st == LP_OK && k < 3; k++) {
    cand_defaults(S, &c);
    asap_keys(S, &c, k * 1.0);
    st = seed(S, &c, "seed: asap");
  }
  if (st == LP_OK && S->split == LP_SEARCH_SPLIT_AUTO) {
    cand_defaults(S, &c);
    memset(c.split, 0, (size_t)S->V * (size_t)S->M);
    rule_keys(S, &c, orders[0], 1.0);
    st = seed(S, &c, "seed: backward-first, no split");
  }
  if (st == LP_OK) st = search_zb_greedy(S);
  cand_free(&c);
  return st;
}

lp_status lp_search_seed_keys(lp_search *S, const double *keys, const unsigned char *split,
                              const char *label) {
  cand c;
  memset(&c, 0, sizeof c);
  lp_status st = cand_alloc(S, &c);
  if (st == LP_OK) {
    cand_defaults(S, &c);
    memcpy(c.key, keys, (size_t)S->nslot * sizeof *c.key);
    if (split && S->split == LP_SEARCH_SPLIT_AUTO)
      for (int k = 0; k < S->V * S->M; k++) c.split[k] = split[k] != 0;
    char name[80];
    snprintf(name, sizeof name, "seed: %s", label);
    st = seed(S, &c, name);
  }
  cand_free(&c);
  return st;
}

/* ---- moves and the climb ---- */

static void move(lp_search *S, cand *c) {
  int kind = rnd_int(S, 100);
  if (kind < 12 && S->split == LP_SEARCH_SPLIT_AUTO) {
    int v = rnd_int(S, S->V);
    int n = S->vm_first[v + 1] - S->vm_first[v];
    if (n == 0) return;
    int m = S->vm_list[S->vm_first[v] + rnd_int(S, n)];
    c->split[v * S->M + m] ^= 1;
    return;
  }
  if (kind < 16 && S->pairs) {
    int bit = rnd_int(S, 3);
    c->pair[rnd_int(S, S->P)] ^= bit == 0 ? 1 : bit == 1 ? 4 : 8;
    return;
  }
  if (kind < 20) { /* a rank waits for its best-keyed head, or not */
    c->pair[rnd_int(S, S->P)] ^= 2;
    return;
  }
  int r = rnd_int(S, S->P);
  int n = S->rs_first[r + 1] - S->rs_first[r];
  if (n == 0) return;
  int s = S->rs_list[S->rs_first[r] + rnd_int(S, n)];
  int nloc = S->rv_first[r + 1] - S->rv_first[r];
  int span = 6 * nloc + 2;
  if (kind < 45) {
    /* swap with the next slot of this rank in key order: one transposition
     * of the priority list */
    const int *slots = S->rs_list + S->rs_first[r];
    int nxt = -1;
    for (int q = 0; q < n; q++) {
      int t = slots[q];
      if (c->key[t] > c->key[s] && (nxt < 0 || c->key[t] < c->key[nxt])) nxt = t;
    }
    if (nxt >= 0) {
      double k = c->key[s];
      c->key[s] = c->key[nxt];
      c->key[nxt] = k;
    }
    return;
  }
  if (kind < 60) {
    /* a block: this slot's kind on this virtual stage from this mb on */
    int v = s / 3 / S->M, m = s / 3 % S->M, k = s % 3;
    double d = (rnd_int(S, span) + 1) * (rnd(S) & 1 ? 1 : -1);
    for (int q = S->vm_first[v]; q < S->vm_first[v + 1]; q++) {
      int mm = S->vm_list[q];
      if (mm >= m) c->key[slot_of(S, v, mm, k)] += d;
    }
    return;
  }
  double d = (rnd_int(S, span) + 1) * (rnd(S) & 1 ? 1 : -1) + (rnd_unit(S) - 0.5) * 0.5;
  c->key[s] += d;
}

lp_status lp_search_run(lp_search *S, double seconds, long long max_evals) {
  double t0 = lp_now();
  if (!S->have_cur) LP_CHECK(lp_search_seed_rules(S));
  if (!S->have_cur) {
    S->seconds += lp_now() - t0;
    return LP_OK;
  }
  if (!S->hist) {
    S->nhist = 64;
    S->hist = lp_malloc((size_t)S->nhist * sizeof *S->hist);
    if (!S->hist) return LP_ERR_NOMEM;
    for (int k = 0; k < S->nhist; k++) S->hist[k] = S->cur.score;
  }
  long long n = 0;
  lp_status st = LP_OK;
  for (;;) {
    if (max_evals > 0 && n >= max_evals) break;
    if ((n & 7) == 0 && lp_now() - t0 >= seconds) break;
    if (S->have_best && S->lb_obj > 0 && S->best_score <= S->lb_obj * (1 + 1e-12)) break;
    cand_copy(S, &S->trial, &S->cur);
    int nm = 1 + rnd_int(S, 3);
    for (int k = 0; k < nm; k++) move(S, &S->trial);
    st = decode(S, &S->trial);
    if (st != LP_OK) break;
    n++;
    S->since_best++;
    consider(S, &S->trial, "annealing");
    long long i = S->iter++ % S->nhist;
    if (S->trial.score <= S->cur.score || S->trial.score <= S->hist[i]) {
      cand_copy(S, &S->cur, &S->trial);
    }
    if (S->cur.score < S->hist[i]) S->hist[i] = S->cur.score;
    if (S->since_best > 4000) { /* restart from the best, kicked by a few random moves */
      cand_copy(S, &S->cur, &S->best_c);
      int kick = 4 + rnd_int(S, 24);
      for (int k = 0; k < kick; k++) move(S, &S->cur);
      st = decode(S, &S->cur);
      if (st != LP_OK) break;
      consider(S, &S->cur, "annealing");
      for (int k = 0; k < S->nhist; k++) S->hist[k] = S->cur.score;
      S->since_best = 0;
    }
  }
  S->seconds += lp_now() - t0;
  return st;
}

/* ---- results ---- */

void lp_search_stats_of(const lp_search *S, lp_search_stats *out) {
  memset(out, 0, sizeof *out);
  out->evaluations = S->evaluations;
  out->seconds = S->seconds;
  out->best = S->have_best ? S->best_score : INF;
  out->makespan = S->have_best ? S->best_makespan : INF;
  out->span = S->have_best ? S->best_span : INF;
  out->lower_bound = S->lb_obj;
  if (S->have_best) {
    double b = S->objective == LP_SEARCH_CUSTOM ? S->best_makespan : S->best_score;
    out->gap = S->lb_obj > 0 ? (b - S->lb_obj) / S->lb_obj : (b > 0 ? INF : 0);
    if (out->gap < 0 && out->gap > -1e-9) out->gap = 0;
  } else {
    out->gap = INF;
  }
  out->zb_greedy = S->zb_best;
  out->best_at = S->best_at;
  out->from_schedule = S->best_is_sched;
  snprintf(out->best_label, sizeof out->best_label, "%s", S->best_label);
}

void lp_search_bounds_of(const lp_search *S, lp_search_bounds *out) { *out = S->bounds; }

lp_status lp_search_best_peak(const lp_search *S, double *peak) {
  if (!S->have_best) return LP_ERR_ARG;
  memcpy(peak, S->best_peak, (size_t)S->P * sizeof *peak);
  return LP_OK;
}

const char *lp_search_last_error(const lp_search *S) { return S->err; }

lp_status lp_search_best_schedule(lp_search *S, lp_schedule **out) {
  *out = NULL;
  if (!S->have_best) {
    lp_errf(S->err, "no schedule found yet");
    return LP_ERR_ARG;
  }
  if (S->best_sched) {
    *out = lp_schedule_clone(S->best_sched);
    return *out ? LP_OK : LP_ERR_NOMEM;
  }
  lp_schedule *s = NULL;
  lp_status st = lp_schedule_new(S->P, S->S, S->M, &s);
  if (st != LP_OK) return st;
  for (int v = 0; v < S->V && st == LP_OK; v++)
    st = lp_schedule_add_vstage(s, S->vs_stage[v], S->vs_rank[v], NULL);
  for (int m = 0; m < S->M && st == LP_OK; m++)
    st = lp_schedule_set_route(s, m, S->routes + S->mb_route[m] * S->S, S->S);
  for (int r = 0; r < S->P && st == LP_OK; r++)
    for (int k = 0; k < S->best_n[r] && st == LP_OK; k++)
      st = lp_schedule_push(s, r, &S->best_acts[S->out_first[r] + k]);
  if (st == LP_OK) st = lp_schedule_set_name(s, "search");
  if (st == LP_OK) {
    st = lp_schedule_validate(s);
    if (st != LP_OK)
      lp_errf(S->err, "the found schedule does not validate (a bug): %s",
              lp_schedule_last_error(s));
  }
  if (st != LP_OK) {
    lp_schedule_free(s);
    return st;
  }
  *out = s;
  return LP_OK;
}

/* ---- given schedules ---- */

lp_status lp_search_schedule_peak(const lp_schedule *s, const double *act, double w_share,
                                  double *peak) {
  int P = lp_schedule_ranks(s);
  for (int r = 0; r < P; r++) {
    int n;
    const lp_action *a = lp_schedule_actions(s, r, &n);
    double use = 0, pk = 0;
    for (int i = 0; i < n; i++) {
      int fst = -1, bst = -1, bt = -1;
      if (a[i].type == LP_ACT_F) fst = a[i].stage;
      if (a[i].type == LP_ACT_B || a[i].type == LP_ACT_I || a[i].type == LP_ACT_W)
        bst = a[i].stage, bt = a[i].type;
      if (a[i].type == LP_ACT_FB) fst = a[i].stage, bst = a[i].bstage, bt = a[i].btype;
      if (fst >= 0) {
        use += act ? act[lp_schedule_vstage_stage(s, fst)] : 1;
        if (use > pk) pk = use;
      }
      if (bst >= 0) {
        double x = act ? act[lp_schedule_vstage_stage(s, bst)] : 1;
        if (bt == LP_ACT_B) use -= x;
        if (bt == LP_ACT_I) use -= x - w_share * x;
        if (bt == LP_ACT_W) use -= w_share * x;
      }
    }
    peak[r] = pk;
  }
  return LP_OK;
}

/* Does s have the context's placement and routes? */
static int same_placement(const lp_search *S, lp_schedule *s) {
  if (lp_schedule_ranks(s) != S->P || lp_schedule_stages(s) != S->S ||
      lp_schedule_microbatches(s) != S->M || lp_schedule_vstages(s) != S->V)
    return 0;
  for (int v = 0; v < S->V; v++)
    if (lp_schedule_vstage_stage(s, v) != S->vs_stage[v] ||
        lp_schedule_vstage_rank(s, v) != S->vs_rank[v])
      return 0;
  for (int m = 0; m < S->M; m++) {
    int n;
    const int *route = lp_schedule_route(s, m, &n);
    if (n != S->S || memcmp(route, S->routes + S->mb_route[m] * S->S, (size_t)n * sizeof *route))
      return 0;
  }
  return 1;
}

lp_status lp_search_add_schedule(lp_search *S, lp_schedule *s, const char *label, int *fits,
                                 double *objective, double *peak_out) {
  *fits = 0;
  *objective = INF;
  lp_sim_result *res = NULL;
  char err[LP_ERRLEN];
  lp_status st = lp_sim_run(s, S->cost, &res, err);
  if (st != LP_OK) {
    lp_errf(S->err, "%s: %s", label, err);
    return st;
  }
  int P = lp_sim_ranks(res);
  double *peak = lp_calloc((size_t)P, sizeof *peak);
  lp_search_rank_eval *ev = lp_calloc((size_t)P, sizeof *ev);
  if (!peak || !ev) {
    lp_free(peak);
    lp_free(ev);
    lp_sim_result_free(res);
    return LP_ERR_NOMEM;
  }
  /* model-stage activation sizes apply when the stage counts agree */
  const double *act = lp_schedule_stages(s) == S->S ? S->act : NULL;
  lp_search_schedule_peak(s, act, S->w_share, peak);
  double span = 0;
  int ok = P == S->P;
  for (int r = 0; r < P; r++) {
    int n;
    const lp_sim_event *e = lp_sim_rank_events(res, r, &n);
    lp_sim_rank_stats rs;
    lp_sim_rank_stats_of(res, r, &rs);
    ev[r].start = n > 0 ? e[0].start : 0;
    ev[r].finish = rs.finish;
    ev[r].busy = rs.busy;
    ev[r].peak_memory = peak[r];
    if (rs.finish - ev[r].start > span) span = rs.finish - ev[r].start;
    if (ok && peak[r] > S->limit[r] + EPS) ok = 0;
    if (peak_out) peak_out[r] = peak[r];
  }
  /* a schedule of another placement (interleaved's 2P stages on a V
   * search) is scored, but is not the search's to return */
  int same = same_placement(S, s);
  if (!same) ok = 0;
  /* the split and pairing rules of the search hold for given schedules too */
  for (int r = 0; ok && r < P; r++) {
    int n;
    const lp_action *a = lp_schedule_actions(s, r, &n);
    for (int i = 0; ok && i < n; i++) {
      int bt = a[i].type == LP_ACT_FB ? a[i].btype : a[i].type;
      if ((a[i].type == LP_ACT_FB && !S->pairs) ||
          (bt == LP_ACT_I && S->split == LP_SEARCH_SPLIT_NEVER) ||
          (bt == LP_ACT_B && S->split == LP_SEARCH_SPLIT_ALWAYS))
        ok = 0;
    }
  }
  lp_search_eval e = {lp_sim_makespan(res), span, P, ev};
  double score = INF;
  st = search_score(S, &e, &score);
  S->evaluations++;
  if (st == LP_OK) {
    *objective = score;
    *fits = ok;
    if (ok && better(score, S->best_score)) {
      lp_schedule *copy = lp_schedule_clone(s);
      if (!copy) {
        st = LP_ERR_NOMEM;
      } else {
        lp_schedule_free(S->best_sched);
        S->best_sched = copy;
        S->best_score = score;
        S->best_makespan = e.makespan;
        S->best_span = span;
        memcpy(S->best_peak, peak, (size_t)P * sizeof *peak);
        S->have_best = 1;
        S->best_is_sched = 1;
        S->best_at = lp_now() - S->t0;
        snprintf(S->best_label, sizeof S->best_label, "%s", label);
      }
    }
  }
  lp_free(peak);
  lp_free(ev);
  lp_sim_result_free(res);
  if (st != LP_OK || !same) return st;
  /* seed from its order: key = position on its rank */
  cand c;
  memset(&c, 0, sizeof c);
  st = cand_alloc(S, &c);
  if (st == LP_OK) {
    cand_defaults(S, &c);
    for (int k = 0; k < S->nslot; k++) c.key[k] = 1e12 + k; /* unused slots */
    for (int r = 0; r < S->P; r++) {
      int n;
      const lp_action *a = lp_schedule_actions(s, r, &n);
      int paired = 0;
      for (int i = 0; i < n; i++) {
        const lp_action *x = &a[i];
        if (x->type == LP_ACT_F || x->type == LP_ACT_FB) c.key[slot_of(S, x->stage, x->mb, 0)] = i;
        if (x->type == LP_ACT_B || x->type == LP_ACT_I) {
          c.key[slot_of(S, x->stage, x->mb, 1)] = i;
          if (S->split == LP_SEARCH_SPLIT_AUTO)
            c.split[x->stage * S->M + x->mb] = x->type == LP_ACT_I;
        }
        if (x->type == LP_ACT_FB) {
          paired = 1;
          c.key[slot_of(S, x->bstage, x->bmb, 1)] = i;
          if (S->split == LP_SEARCH_SPLIT_AUTO)
            c.split[x->bstage * S->M + x->bmb] = x->btype == LP_ACT_I;
        }
        if (x->type == LP_ACT_W) c.key[slot_of(S, x->stage, x->mb, 2)] = i;
      }
      c.pair[r] = (S->pairs && paired) | 2; /* as written: wait for the next */
    }
    char name[80];
    snprintf(name, sizeof name, "seed: %s's order", label);
    st = seed(S, &c, name);
  }
  cand_free(&c);
  return st;
}

/* ---- setup ---- */

lp_status lp_search_new(const lp_search_problem *p, lp_search **out, char *err) {
  *out = NULL;
  lp_search *S = lp_calloc(1, sizeof *S);
  if (!S) return LP_ERR_NOMEM;
  lp_status st = search_setup(S, p, err);
  if (st != LP_OK) {
    lp_search_free(S);
    return st;
  }
  *out = S;
  return LP_OK;
}

lp_status search_alloc_candidates(lp_search *S) {
  LP_CHECK(cand_alloc(S, &S->cur));
  LP_CHECK(cand_alloc(S, &S->trial));
  LP_CHECK(cand_alloc(S, &S->best_c));
  return LP_OK;
}

void search_free_candidates(lp_search *S) {
  cand_free(&S->cur);
  cand_free(&S->trial);
  cand_free(&S->best_c);
}

