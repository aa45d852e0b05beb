/* setup.c — checks a search problem, builds the context's tables, and
 * computes the lower bounds (derivations in docs/search.md). */
#include "search_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define INF HUGE_VAL

static void *zalloc(size_t n, size_t size, int *bad) {
  void *p = lp_calloc(n ? n : 1, size);
  if (!p) *bad = 1;
  return p;
}

static lp_status check_problem(const lp_search_problem *p, char *err) {
  char why[LP_ERRLEN];
  if (lp_schedule_check_counts(p->ranks, p->stages, p->microbatches, why) != LP_OK) {
    lp_errf(err, "%s", why);
    return LP_ERR_ARG;
  }
  if (p->nvstages < p->stages || p->nvstages > LP_SCHEDULE_MAX_VSTAGES || !p->vstage_stage ||
      !p->vstage_rank) {
    lp_errf(err, "the placement must place every model stage (%d virtual stages for %d "
            "model stages)", p->nvstages, p->stages);
    return LP_ERR_ARG;
  }
  for (int v = 0; v < p->nvstages; v++) {
    if (p->vstage_stage[v] < 0 || p->vstage_stage[v] >= p->stages) {
      lp_errf(err, "virtual stage %d holds model stage %d, not one of 0..%d", v,
              p->vstage_stage[v], p->stages - 1);
      return LP_ERR_ARG;
    }
    if (p->vstage_rank[v] < 0 || p->vstage_rank[v] >= p->ranks) {
      lp_errf(err, "virtual stage %d is placed on rank %d, not one of 0..%d", v,
              p->vstage_rank[v], p->ranks - 1);
      return LP_ERR_ARG;
    }
  }
  if (p->nroutes < 1 || !p->routes) {
    lp_errf(err, "no route");
    return LP_ERR_ARG;
  }
  for (int k = 0; k < p->nroutes; k++) {
    for (int s = 0; s < p->stages; s++) {
      int v = p->routes[k * p->stages + s];
      if (v < 0 || v >= p->nvstages || p->vstage_stage[v] != s) {
        lp_errf(err, "route %d, position %d: virtual stage %d does not hold model stage %d",
                k, s, v, s);
        return LP_ERR_ARG;
      }
    }
  }
  for (int m = 0; p->mb_route && m < p->microbatches; m++) {
    if (p->mb_route[m] < 0 || p->mb_route[m] >= p->nroutes) {
      lp_errf(err, "micro-batch %d takes route %d, not one of 0..%d", m, p->mb_route[m],
              p->nroutes - 1);
      return LP_ERR_ARG;
    }
  }
  if (!(p->w_share >= 0 && p->w_share <= 1)) {
    lp_errf(err, "w_share = %g must be a number in 0..1", p->w_share);
    return LP_ERR_ARG;
  }
  for (int s = 0; p->act && s < p->stages; s++) {
    if (!(p->act[s] > 0 && p->act[s] < 1e12)) {
      lp_errf(err, "activation size of model stage %d = %g must be a positive number", s,
              p->act[s]);
      return LP_ERR_ARG;
    }
  }
  for (int r = 0; p->memory && r < p->ranks; r++) {
    if (!(p->memory[r] > 0)) {
      lp_errf(err, "memory limit of rank %d = %g must be a positive number of "
              "activations", r, p->memory[r]);
      return LP_ERR_ARG;
    }
  }
  if (p->split < 0 || p->split > 2 || p->objective < 0 || p->objective > 2) {
    lp_errf(err, "bad split mode or objective");
    return LP_ERR_ARG;
  }
  if (p->objective == LP_SEARCH_CUSTOM && !p->fn) {
    lp_errf(err, "a custom objective needs a function");
    return LP_ERR_ARG;
  }
  if (p->cost && p->cost->nexchange_stages > 0) {
    lp_errf(err, "MoE exchanges in the cost model are not searched over (give F, B, I, "
            "W, FB and latency)");
    return LP_ERR_ARG;
  }
  return LP_OK;
}

static lp_status bounds(lp_search *S);

lp_status search_setup(lp_search *S, const lp_search_problem *p, char *err) {
  char local[LP_ERRLEN];
  if (!err) err = local;
  err[0] = '\0';
  LP_CHECK(check_problem(p, err));
  int P = S->P = p->ranks, NS = S->S = p->stages, M = S->M = p->microbatches;
  int V = S->V = p->nvstages;
  S->NR = p->nroutes;
  S->w_share = p->w_share;
  S->split = p->split;
  S->pairs = p->pairs;
  S->objective = p->objective;
  S->fn = p->fn;
  S->ud = p->ud;
  S->rng = p->seed ? p->seed * 0x9E3779B97F4A7C15ULL + 1 : 0x9E3779B97F4A7C15ULL;
  S->best_score = INF;
  S->zb_best = INF;
  S->t0 = lp_now();
  int bad = 0;
  size_t vm = (size_t)V * (size_t)M, pm = (size_t)P * (size_t)M;
  S->vs_stage = zalloc((size_t)V, sizeof(int), &bad);
  S->vs_rank = zalloc((size_t)V, sizeof(int), &bad);
  S->routes = zalloc((size_t)S->NR * (size_t)NS, sizeof(int), &bad);
  S->mb_route = zalloc((size_t)M, sizeof(int), &bad);
  S->pos = zalloc(vm, sizeof(int), &bad);
  S->t = zalloc((size_t)V, sizeof *S->t, &bad);
  S->fbset = zalloc((size_t)V, sizeof(int), &bad);
  S->act = zalloc((size_t)NS, sizeof(double), &bad);
  S->act_v = zalloc((size_t)V, sizeof(double), &bad);
  S->limit = zalloc((size_t)P, sizeof(double), &bad);
  S->vm_first = zalloc((size_t)V + 1, sizeof(int), &bad);
  S->vm_list = zalloc(vm, sizeof(int), &bad);
  S->rv_first = zalloc((size_t)P + 1, sizeof(int), &bad);
  S->rv_list = zalloc((size_t)V, sizeof(int), &bad);
  S->need = zalloc(pm, sizeof(double), &bad);
  S->maxneed = zalloc((size_t)P, sizeof(double), &bad);
  S->f_asap = zalloc((size_t)V, sizeof(double), &bad);
  S->b_asap = zalloc((size_t)V, sizeof(double), &bad);
  S->stage_times = zalloc((size_t)NS, sizeof *S->stage_times, &bad);
  if (bad) return LP_ERR_NOMEM;
  memcpy(S->vs_stage, p->vstage_stage, (size_t)V * sizeof(int));
  memcpy(S->vs_rank, p->vstage_rank, (size_t)V * sizeof(int));
  memcpy(S->routes, p->routes, (size_t)S->NR * (size_t)NS * sizeof(int));
  for (int m = 0; m < M; m++) S->mb_route[m] = p->mb_route ? p->mb_route[m] : 0;
  for (int s = 0; s < NS; s++) S->act[s] = p->act ? p->act[s] : 1;
  for (int r = 0; r < P; r++) S->limit[r] = p->memory ? p->memory[r] : INF;

  /* the cost model: a private copy (the search outlives the caller's) */
  if (p->cost) {
    S->cost_copy = *p->cost;
    for (int s = 0; s < NS; s++) lp_sim_times_init(&S->stage_times[s]);
    if (p->cost->nstages > 0 && p->cost->stages) {
      int n = p->cost->nstages < NS ? p->cost->nstages : NS;
      memcpy(S->stage_times, p->cost->stages, (size_t)n * sizeof *S->stage_times);
    }
    S->cost_copy.stages = S->stage_times;
    S->cost_copy.nstages = NS;
  } else {
    lp_sim_cost_init(&S->cost_copy);
  }
  S->cost = &S->cost_copy;
  char why[LP_ERRLEN];
  if (lp_sim_message_delay(S->cost, &S->lat, why) != LP_OK) {
    lp_errf(err, "%s", why);
    return LP_ERR_ARG;
  }
  for (int v = 0; v < V; v++) {
    if (lp_sim_cost_resolve(S->cost, S->vs_stage[v], &S->t[v], why) != LP_OK) {
      lp_errf(err, "%s", why);
      return LP_ERR_ARG;
    }
    S->fbset[v] = S->t[v].fb != LP_SIM_UNSET;
    S->act_v[v] = S->act[S->vs_stage[v]];
  }

  /* route positions; micro-batches per virtual stage */
  for (size_t k = 0; k < vm; k++) S->pos[k] = -1;
  for (int m = 0; m < M; m++)
    for (int s = 0; s < NS; s++) S->pos[S->routes[S->mb_route[m] * NS + s] * M + m] = s;
  for (int v = 0; v < V; v++) {
    S->vm_first[v + 1] = S->vm_first[v];
    for (int m = 0; m < M; m++)
      if (S->pos[v * M + m] >= 0) S->vm_list[S->vm_first[v + 1]++] = m;
  }
  /* virtual stages of each rank */
  for (int r = 0; r < P; r++) {
    S->rv_first[r + 1] = S->rv_first[r];
    for (int v = 0; v < V; v++)
      if (S->vs_rank[v] == r) S->rv_list[S->rv_first[r + 1]++] = v;
    if (S->rv_first[r + 1] - S->rv_first[r] > LP_SEARCH_MAX_LOCAL) {
      lp_errf(err, "rank %d holds %d virtual stages, more than the %d a search handles", r,
              S->rv_first[r + 1] - S->rv_first[r], LP_SEARCH_MAX_LOCAL);
      return LP_ERR_ARG;
    }
  }
  /* slots of each rank */
  S->nslot = V * M * 3;
  S->rs_first = zalloc((size_t)P + 1, sizeof(int), &bad);
  S->rs_list = zalloc((size_t)S->nslot, sizeof(int), &bad);
  S->rs_tmp = zalloc((size_t)S->nslot, sizeof(int), &bad);
  S->sort_tmp = zalloc((size_t)S->nslot, sizeof(int), &bad);
  S->out_first = zalloc((size_t)P + 1, sizeof(int), &bad);
  if (bad) return LP_ERR_NOMEM;
  for (int r = 0; r < P; r++) {
    int n = S->rs_first[r];
    for (int j = S->rv_first[r]; j < S->rv_first[r + 1]; j++) {
      int v = S->rv_list[j];
      for (int k = S->vm_first[v]; k < S->vm_first[v + 1]; k++)
        for (int kind = 0; kind < 3; kind++) S->rs_list[n++] = slot_of(S, v, S->vm_list[k], kind);
    }
    S->rs_first[r + 1] = n;
    S->out_first[r + 1] = n;
  }
  /* memory need of one micro-batch on each rank */
  for (int m = 0; m < M; m++) {
    for (int s = 0; s < NS; s++) {
      int v = S->routes[S->mb_route[m] * NS + s];
      S->need[S->vs_rank[v] * M + m] += S->act_v[v];
    }
  }
  for (int r = 0; r < P; r++) {
    for (int m = 0; m < M; m++)
      if (S->need[r * M + m] > S->maxneed[r]) S->maxneed[r] = S->need[r * M + m];
    if (S->maxneed[r] > S->limit[r] + 1e-9) {
      lp_errf(err, "the memory limit of rank %d (%g activations) is less than one "
              "micro-batch needs there (%g)", r, S->limit[r], S->maxneed[r]);
      return LP_ERR_ARG;
    }
  }
  /* decoder state */
  decoder *D = &S->D;
  D->fend = zalloc(vm, sizeof(double), &bad);
  D->bend = zalloc(vm, sizeof(double), &bad);
  D->nf = zalloc((size_t)V, sizeof(int), &bad);
  D->nb = zalloc((size_t)V, sizeof(int), &bad);
  D->wq = zalloc(vm, sizeof(int), &bad);
  D->wq_head = zalloc((size_t)V, sizeof(int), &bad);
  D->wq_tail = zalloc((size_t)V, sizeof(int), &bad);
  D->use = zalloc(pm, sizeof(double), &bad);
  D->rem = zalloc(pm, sizeof(double), &bad);
  D->usage = zalloc((size_t)P, sizeof(double), &bad);
  D->peak = zalloc((size_t)P, sizeof(double), &bad);
  D->free_at = zalloc((size_t)P, sizeof(double), &bad);
  D->busy = zalloc((size_t)P, sizeof(double), &bad);
  D->start = zalloc((size_t)P, sizeof(double), &bad);
  D->T = zalloc((size_t)P, sizeof(double), &bad);
  D->ch_kind = zalloc((size_t)P, sizeof(int), &bad);
  D->ch_v = zalloc((size_t)P, sizeof(int), &bad);
  D->ch_m = zalloc((size_t)P, sizeof(int), &bad);
  D->ch_pv = zalloc((size_t)P, sizeof(int), &bad);
  D->ch_pm = zalloc((size_t)P, sizeof(int), &bad);
  D->ch_forceb = zalloc((size_t)P, sizeof(int), &bad);
  D->order = zalloc((size_t)M, sizeof(int), &bad);
  D->ord_idx = zalloc((size_t)M, sizeof(int), &bad);
  D->mb_left = zalloc((size_t)M, sizeof(int), &bad);
  D->out = zalloc((size_t)S->nslot, sizeof *D->out, &bad);
  D->out_start = zalloc((size_t)S->nslot, sizeof(double), &bad);
  D->out_end = zalloc((size_t)S->nslot, sizeof(double), &bad);
  D->out_n = zalloc((size_t)P, sizeof(int), &bad);
  D->ev_rank = zalloc((size_t)P, sizeof *D->ev_rank, &bad);
  S->best_peak = zalloc((size_t)P, sizeof(double), &bad);
  S->best_acts = zalloc((size_t)S->nslot, sizeof *S->best_acts, &bad);
  S->best_n = zalloc((size_t)P, sizeof(int), &bad);
  if (bad) return LP_ERR_NOMEM;
  LP_CHECK(search_alloc_candidates(S));
  LP_CHECK(bounds(S));
  S->lb_obj = S->objective == LP_SEARCH_SPAN ? S->bounds.span : S->bounds.makespan;
  return LP_OK;
}

void lp_search_free(lp_search *S) {
  if (!S) return;
  decoder *D = &S->D;
  void *ptrs[] = {S->vs_stage, S->vs_rank, S->routes, S->mb_route, S->pos, S->t, S->fbset,
                  S->act, S->act_v, S->limit, S->vm_first, S->vm_list, S->rv_first, S->rv_list,
                  S->rs_first, S->rs_list, S->rs_tmp, S->sort_tmp, S->out_first, S->need, S->maxneed,
                  S->f_asap, S->b_asap, S->stage_times, S->hist, S->best_peak, S->best_acts,
                  S->best_n, D->fend, D->bend, D->nf, D->nb, D->wq, D->wq_head, D->wq_tail,
                  D->use, D->rem, D->usage, D->peak, D->free_at, D->busy, D->start, D->T,
                  D->ch_kind, D->ch_v, D->ch_m, D->ch_pv, D->ch_pm, D->ch_forceb, D->order, D->ord_idx,
                  D->mb_left, D->out, D->out_start, D->out_end, D->out_n, D->ev_rank};
  for (size_t k = 0; k < sizeof ptrs / sizeof ptrs[0]; k++) lp_free(ptrs[k]);
  search_free_candidates(S);
  lp_schedule_free(S->best_sched);
  lp_free(S);
}

/* ---- lower bounds (docs/search.md) ---- */

static double dmin(double a, double b) { return a < b ? a : b; }
static double dmax(double a, double b) { return a > b ? a : b; }

/* Least time of the F of v on a chain (an F inside a pair ends with the pair). */
static double fmin_of(const lp_search *S, int v) {
  double f = S->t[v].f;
  if (S->pairs && S->fbset[v]) f = dmin(f, S->t[v].fb);
  return f;
}
/* Least time of v's backward on the chain (I, or B). */
static double bmin_of(const lp_search *S, int v) {
  double b = S->split == LP_SEARCH_SPLIT_ALWAYS ? S->t[v].i
             : S->split == LP_SEARCH_SPLIT_NEVER ? S->t[v].b
                                                 : dmin(S->t[v].i, S->t[v].b);
  if (S->pairs) /* a pair with F on another stage w ends at fb(w) */
    for (int w = 0; w < S->V; w++)
      if (w != v && S->vs_rank[w] == S->vs_rank[v] && S->fbset[w]) b = dmin(b, S->t[w].fb);
  return b;
}
/* Least work of one full backward of v (B, or I + W). */
static double bfull_of(const lp_search *S, int v) {
  return S->split == LP_SEARCH_SPLIT_ALWAYS  ? S->t[v].i + S->t[v].w
         : S->split == LP_SEARCH_SPLIT_NEVER ? S->t[v].b
                                             : dmin(S->t[v].b, S->t[v].i + S->t[v].w);
}

static lp_status bounds(lp_search *S) {
  int P = S->P, NS = S->S, M = S->M;
  lp_search_bounds *b = &S->bounds;
  memset(b, 0, sizeof *b);
  double *fm = lp_calloc((size_t)S->V, sizeof *fm), *bm = lp_calloc((size_t)S->V, sizeof *bm);
  double *hold = lp_calloc((size_t)S->V, sizeof *hold), *rt = lp_calloc((size_t)S->V, sizeof *rt);
  double *tailv = lp_calloc((size_t)S->V, sizeof *tailv);
  lp_status st = LP_OK;
  if (!fm || !bm || !hold || !rt || !tailv) {
    st = LP_ERR_NOMEM;
    goto out;
  }
  for (int v = 0; v < S->V; v++) fm[v] = fmin_of(S, v), bm[v] = bmin_of(S, v);
  for (int v = 0; v < S->V; v++) S->f_asap[v] = S->b_asap[v] = INF;
  /* per route: earliest F start of each position (skew), round trip and
   * tail after each backward */
  double path = INF;
  for (int k = 0; k < S->NR; k++) {
    const int *route = S->routes + k * NS;
    int used = 0;
    for (int m = 0; m < M; m++) used |= S->mb_route[m] == k;
    if (!used) continue;
    double t = 0;
    for (int s = 0; s < NS; s++) {
      int v = route[s];
      if (s > 0 && S->vs_rank[route[s - 1]] != S->vs_rank[v]) t += S->lat;
      S->f_asap[v] = dmin(S->f_asap[v], t);
      t += fm[v];
    }
    /* after the last F: backwards up the route */
    double down = t; /* end of the last F */
    double bt = down;
    for (int s = NS - 1; s >= 0; s--) {
      int v = route[s];
      if (s < NS - 1 && S->vs_rank[route[s + 1]] != S->vs_rank[v]) bt += S->lat;
      S->b_asap[v] = dmin(S->b_asap[v], bt);
      bt += bm[v];
    }
    /* round trip of position s: from its F start to its backward end */
    for (int s = 0; s < NS; s++) {
      int v = route[s];
      double tt = 0;
      for (int q = s; q < NS; q++) {
        if (q > s && S->vs_rank[route[q - 1]] != S->vs_rank[route[q]]) tt += S->lat;
        tt += fm[route[q]];
      }
      double back = 0; /* the backwards of positions NS-1 .. s+1 */
      for (int q = NS - 1; q > s; q--) {
        if (q < NS - 1 && S->vs_rank[route[q + 1]] != S->vs_rank[route[q]]) back += S->lat;
        back += bm[route[q]];
      }
      if (s < NS - 1 && S->vs_rank[route[s + 1]] != S->vs_rank[v]) back += S->lat;
      double pre = tt + back; /* F start .. own backward may start */
      /* activation-time of one micro-batch on v: held from F start to its
       * backward's end, then w_share of it until W's end */
      double own = S->split == LP_SEARCH_SPLIT_ALWAYS
                       ? S->t[v].i + S->w_share * S->t[v].w
                   : S->split == LP_SEARCH_SPLIT_NEVER
                       ? S->t[v].b
                       : dmin(S->t[v].b, S->t[v].i + S->w_share * S->t[v].w);
      if (S->pairs) own = dmin(own, bm[v]);
      double h = pre + own;
      hold[v] = hold[v] == 0 ? h : dmin(hold[v], h);
      /* ... to the end of its whole backward: B, or I then W (a pair with
       * an F of another stage on the rank ends with the pair) */
      double pairfb = INF;
      if (S->pairs)
        for (int u = 0; u < S->V; u++)
          if (u != v && S->vs_rank[u] == S->vs_rank[v] && S->fbset[u]) pairfb = dmin(pairfb, S->t[u].fb);
      if (pairfb < INF && S->split == LP_SEARCH_SPLIT_ALWAYS) pairfb += S->t[v].w;
      double r1 = pre + dmin(bfull_of(S, v), pairfb);
      rt[v] = rt[v] == 0 ? r1 : dmin(rt[v], r1);
      /* tail: after v's backward, the backwards of positions below on
       * other ranks (0 when a W can be last) */
      double tl = 0;
      if (S->split == LP_SEARCH_SPLIT_NEVER) {
        for (int q = s - 1; q >= 0; q--) {
          if (S->vs_rank[route[q + 1]] != S->vs_rank[route[q]]) tl += S->lat;
          tl += bm[route[q]];
        }
      }
      tailv[v] = tailv[v] == 0 ? tl : dmin(tailv[v], tl);
    }
    path = dmin(path, rt[route[0]]);
  }
  double work = 0, skew = 0, memt = 0, span_path = 0, warm = 0;
  for (int r = 0; r < P; r++) {
    double base = 0, head = INF, tail = INF, at = 0, save = 0;
    double tb = INF, fmx = 0, sg = 0; /* first backward's earliest start, largest F, saving */
    int cnt_all = 0;
    for (int j = S->rv_first[r]; j < S->rv_first[r + 1]; j++) {
      int v = S->rv_list[j];
      cnt_all += S->vm_first[v + 1] - S->vm_first[v];
    }
    for (int j = S->rv_first[r]; j < S->rv_first[r + 1]; j++) {
      int v = S->rv_list[j];
      int cnt = S->vm_first[v + 1] - S->vm_first[v];
      if (cnt == 0) continue;
      base += cnt * (S->t[v].f + bfull_of(S, v));
      head = dmin(head, S->f_asap[v]);
      tail = dmin(tail, tailv[v]);
      tb = dmin(tb, S->b_asap[v]);
      fmx = dmax(fmx, S->t[v].f);
      at += cnt * S->act_v[v] * hold[v];
      span_path = dmax(span_path, rt[v]);
      /* pairs: each F of v can pair with one backward of another stage */
      if (S->pairs && S->fbset[v]) {
        double best = 0;
        int others = cnt_all - cnt;
        for (int q = S->rv_first[r]; q < S->rv_first[r + 1]; q++) {
          int u = S->rv_list[q];
          if (u == v) continue;
          best = dmax(best, S->t[v].f + bfull_of(S, u) - S->t[v].fb);
        }
        save += (cnt < others ? cnt : others) * best;
        sg = dmax(sg, best);
      }
    }
    if (head == INF) continue; /* an idle rank */
    double wr = dmax(0, base - save);
    work = dmax(work, wr);
    skew = dmax(skew, head + wr + tail);
    /* warm-up (docs/search.md, bound 5): the k forwards r runs before its
     * first backward starts are unpaired and that backward starts at tb at
     * the earliest; the pairs left use the other cnt_all - k forwards */
    if (save > 0 && tb < INF) {
      /* that backward needs every F of its micro-batch, those on r too:
       * at least the fewest vstages of r on a route; and the k forwards'
       * activations are all held at once: at most limit / least size */
      int kmin = cnt_all, kmax = cnt_all;
      double amin = INF;
      for (int q = 0; q < S->NR; q++) {
        int used = 0, on = 0;
        for (int m = 0; m < M && !used; m++) used = S->mb_route[m] == q;
        if (!used) continue;
        for (int p = 0; p < NS; p++) on += S->vs_rank[S->routes[q * NS + p]] == r;
        if (on < kmin) kmin = on;
      }
      for (int j = S->rv_first[r]; j < S->rv_first[r + 1]; j++)
        if (S->act_v[S->rv_list[j]] > 0) amin = dmin(amin, S->act_v[S->rv_list[j]]);
      if (S->limit[r] < INF && amin < INF) {
        double km = floor((S->limit[r] + 1e-9) / amin);
        if (km < kmax) kmax = (int)km;
      }
      if (kmin > kmax) kmin = kmax; /* (the limit is checked elsewhere) */
      double lb = INF;
      for (int k = kmin; k <= kmax; k++) {
        double wait = dmax(tb - k * fmx, head);
        lb = dmin(lb, wait + base - dmin(save, (cnt_all - k) * sg) + tail);
        if (tb - k * fmx <= head) break; /* more k: less to save, same wait */
      }
      warm = dmax(warm, lb);
    }
    if (S->limit[r] < INF) memt = dmax(memt, at / S->limit[r]);
  }
  b->work = work;
  b->skew = skew;
  b->path = dmax(path == INF ? 0 : path, span_path);
  b->memory_time = memt;
  b->warmup = warm;
  b->makespan = dmax(dmax(dmax(work, skew), dmax(b->path, memt)), warm);
  b->span = dmax(dmax(work, span_path), memt);
out:
  lp_free(fm);
  lp_free(bm);
  lp_free(hold);
  lp_free(rt);
  lp_free(tailv);
  return st;
}
