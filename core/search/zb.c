/* zb.c — Zero Bubble's greedy scheduler (Qi et al. 2023; the heuristic
 * in sail-sg/zero-bubble-pipeline-parallelism), reimplemented from its
 * description for a linear placement (one virtual stage per rank, one
 * route): micro-batch by micro-batch, the first one's warm-up forwards fill
 * each stage until its first backward can arrive (or memory is full), then
 * every stage runs one F and one backward (I) per micro-batch, putting
 * weight-grads (W) where memory forces them or where they fill a wait for
 * an input. Three switches give its 8 settings: whether the warm-up may
 * leave a bubble before the first backward, whether a stage that ran ahead
 * skips its F (backward first), and whether a W fills a wait shorter than
 * itself. Each setting's order is simulated as given (its own best is kept
 * as the "Zero Bubble greedy" figure) and seeds the search. */
#include "search_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct zb {
  lp_search *S;
  int n, M;
  const int *route;
  double *e, *mem, *tf, *tb; /* [n], [n], [n * M], [n * M] */
  int *f, *b, *w;            /* [n] counts */
  lp_action *ord;            /* [n * 3M] */
  int *nord;                 /* [n] */
  int *req;                  /* [n] forwards a stage is to run */
  double comm;
} zb;

static double cost_of(const zb *z, int j, int kind) {
  const lp_sim_times *t = &z->S->t[z->route[j]];
  return kind == 0 ? t->f : kind == 1 ? t->i : t->w;
}
static double mem_of(const zb *z, int j, int kind) {
  double a = z->S->act_v[z->route[j]], w = z->S->w_share;
  return kind == 0 ? a : kind == 1 ? -(a - w * a) : -w * a;
}

static void put(zb *z, int j, int kind) {
  int v = z->route[j];
  int mb = kind == 0 ? z->f[j] : kind == 1 ? z->b[j] : z->w[j];
  double t = z->e[j] + cost_of(z, j, kind);
  if (kind == 0 && j > 0) t = fmax(t, z->tf[(j - 1) * z->M + mb] + z->comm + cost_of(z, j, 0));
  if (kind == 1 && j + 1 < z->n)
    t = fmax(t, z->tb[(j + 1) * z->M + mb] + z->comm + cost_of(z, j, 1));
  if (kind == 1 && j + 1 == z->n) t = fmax(t, z->tf[j * z->M + mb] + cost_of(z, j, 1));
  z->e[j] = t;
  if (kind == 0) z->tf[j * z->M + mb] = t, z->f[j]++;
  if (kind == 1) z->tb[j * z->M + mb] = t, z->b[j]++;
  if (kind == 2) z->w[j]++;
  z->mem[j] += mem_of(z, j, kind);
  lp_action *a = &z->ord[j * 3 * z->M + z->nord[j]++];
  memset(a, 0, sizeof *a);
  a->type = kind == 0 ? LP_ACT_F : kind == 1 ? LP_ACT_I : LP_ACT_W;
  a->stage = v;
  a->mb = mb;
  a->btype = a->bstage = a->bmb = -1;
}

/* W's before an action of stage j whose input arrives at `at`: those memory
 * needs, and those that fit into the wait. */
static void fill_w(zb *z, int j, double need, double at, int greedy) {
  double lim = z->S->limit[z->S->vs_rank[z->route[j]]];
  while (z->mem[j] + need > lim + 1e-9 && z->w[j] < z->b[j]) put(z, j, 2);
  while (z->w[j] < z->b[j] && z->e[j] + cost_of(z, j, 2) <= at) put(z, j, 2);
  if (greedy && z->w[j] < z->b[j] && z->e[j] < at) put(z, j, 2);
}

static void order(zb *z, int bubble_ok, int b_first, int greedy) {
  int n = z->n, M = z->M;
  for (int j = 0; j < n; j++) z->e[j] = z->mem[j] = 0, z->f[j] = z->b[j] = z->w[j] = z->nord[j] = 0;
  int *req = z->req;
  for (int i = 0; i < M; i++) {
    if (i == 0) {
      for (int j = 0; j < n; j++) put(z, j, 0);
      /* warm-up: extra forwards until the first backward comes back */
      double last = z->tf[(n - 1) * M] + cost_of(z, n - 1, 1);
      for (int j = n - 2; j >= 0; j--) {
        double lim = z->S->limit[z->S->vs_rank[z->route[j]]];
        double mem = z->mem[j], t = z->e[j];
        req[j] = 0;
        while (z->f[j] + req[j] < M && mem + mem_of(z, j, 0) <= lim + 1e-9) {
          if (bubble_ok ? t + cost_of(z, j, 0) > last + z->comm : t >= last + z->comm) break;
          mem += mem_of(z, j, 0);
          t += cost_of(z, j, 0);
          req[j]++;
        }
        last = fmax(t, last + z->comm) + cost_of(z, j, 1);
      }
      req[n - 1] = 0;
      for (int j = 1; j < n; j++) /* fewer warm-up forwards downstream */
        while (req[j] > 0 && req[j] >= req[j - 1]) req[j]--;
      for (int j = 0; j < n; j++)
        for (int k = 0; k < req[j]; k++) put(z, j, 0);
      for (int j = n - 1; j >= 0; j--) put(z, j, 1);
      continue;
    }
    for (int j = 0; j < n; j++) {
      req[j] = z->f[j] < M;
      if (req[j] && b_first && j + 1 < n && z->f[j] >= z->f[j + 1] + 2) req[j] = 0;
    }
    for (int j = n - 2; j >= 0; j--)
      if (req[j + 1] < req[j]) req[j] = req[j + 1];
    for (int j = 0; j < n; j++) {
      if (!req[j]) continue;
      double at = j > 0 ? z->tf[(j - 1) * M + z->f[j]] + z->comm : z->e[j];
      fill_w(z, j, mem_of(z, j, 0), at, greedy);
      put(z, j, 0);
    }
    for (int j = n - 1; j >= 0; j--) {
      if (z->b[j] >= z->f[j]) continue;
      if (j + 1 < n && z->b[j + 1] <= z->b[j]) continue; /* its input is not computed */
      double at = j + 1 < n ? z->tb[(j + 1) * M + z->b[j]] + z->comm : z->tf[j * M + z->b[j]];
      fill_w(z, j, 0, at, greedy);
      put(z, j, 1);
    }
  }
  /* the forwards and backwards left (stages that skipped), then the W's */
  for (int guard = 0; guard < 4 * M; guard++) {
    int any = 0;
    for (int j = 0; j < n; j++)
      if (z->f[j] < M && (j == 0 || z->f[j - 1] > z->f[j])) put(z, j, 0), any = 1;
    for (int j = n - 1; j >= 0; j--)
      if (z->b[j] < z->f[j] && (j + 1 == n || z->b[j + 1] > z->b[j])) put(z, j, 1), any = 1;
    if (!any) break;
  }
  for (int j = 0; j < n; j++)
    while (z->w[j] < z->b[j]) put(z, j, 2);
}

static int linear(const lp_search *S) {
  if (S->NR != 1 || S->split == LP_SEARCH_SPLIT_NEVER) return 0;
  for (int r = 0; r < S->P; r++)
    if (S->rv_first[r + 1] - S->rv_first[r] != 1) return 0;
  return S->V == S->S;
}

lp_status search_zb_greedy(lp_search *S) {
  if (!linear(S)) return LP_OK;
  zb z;
  memset(&z, 0, sizeof z);
  z.S = S;
  z.n = S->S;
  z.M = S->M;
  z.route = S->routes;
  z.comm = S->lat;
  size_t nm = (size_t)z.n * (size_t)z.M;
  z.e = lp_calloc((size_t)z.n, sizeof *z.e);
  z.mem = lp_calloc((size_t)z.n, sizeof *z.mem);
  z.tf = lp_calloc(nm, sizeof *z.tf);
  z.tb = lp_calloc(nm, sizeof *z.tb);
  z.f = lp_calloc((size_t)z.n, sizeof *z.f);
  z.b = lp_calloc((size_t)z.n, sizeof *z.b);
  z.w = lp_calloc((size_t)z.n, sizeof *z.w);
  z.nord = lp_calloc((size_t)z.n, sizeof *z.nord);
  z.ord = lp_calloc(nm * 3, sizeof *z.ord);
  z.req = lp_calloc((size_t)z.n, sizeof *z.req);
  lp_status st = LP_OK;
  if (!z.e || !z.mem || !z.tf || !z.tb || !z.f || !z.b || !z.w || !z.nord || !z.ord || !z.req) {
    st = LP_ERR_NOMEM;
    goto out;
  }
  for (int setting = 0; setting < 8 && st == LP_OK; setting++) {
    order(&z, setting & 1, (setting >> 1) & 1, (setting >> 2) & 1);
    int complete = 1;
    for (int j = 0; j < z.n; j++) complete &= z.nord[j] == 3 * z.M;
    if (!complete) continue;
    lp_schedule *s = NULL;
    st = lp_schedule_new(S->P, S->S, S->M, &s);
    for (int v = 0; v < S->V && st == LP_OK; v++)
      st = lp_schedule_add_vstage(s, S->vs_stage[v], S->vs_rank[v], NULL);
    for (int m = 0; m < S->M && st == LP_OK; m++) st = lp_schedule_set_route(s, m, S->routes, S->S);
    for (int j = 0; j < z.n && st == LP_OK; j++)
      for (int k = 0; k < z.nord[j] && st == LP_OK; k++)
        st = lp_schedule_push(s, S->vs_rank[z.route[j]], &z.ord[j * 3 * z.M + k]);
    if (st == LP_OK) st = lp_schedule_set_name(s, "zb-greedy");
    lp_status vst = st == LP_OK ? lp_schedule_validate(s) : st;
    if (vst == LP_ERR_NOMEM) st = vst;
    if (st == LP_OK && vst == LP_OK) {
      int fits;
      double obj;
      char label[32];
      snprintf(label, sizeof label, "zb-greedy %d", setting);
      st = lp_search_add_schedule(S, s, label, &fits, &obj, NULL);
      if (st == LP_OK && fits && obj < S->zb_best) S->zb_best = obj;
    }
    lp_schedule_free(s);
  }
out:
  lp_free(z.e);
  lp_free(z.mem);
  lp_free(z.tf);
  lp_free(z.tb);
  lp_free(z.f);
  lp_free(z.b);
  lp_free(z.w);
  lp_free(z.nord);
  lp_free(z.ord);
  lp_free(z.req);
  return st;
}
