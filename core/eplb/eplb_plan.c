/* eplb_plan.c — the public entry points: input checks, the per-layer
 * driver (reference, balanced, relabel, budget), maps, metrics, accessors.
 * Layers, experts and slots are numbered from 0 in messages, as in the
 * maps. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "eplb_internal.h"

void lp_eplb_options_init(lp_eplb_options *o) {
  memset(o, 0, sizeof *o);
  o->mode = LP_EPLB_BALANCED;
  o->previous = NULL;
  o->max_moves = -1;
  o->fixed_x = 0;
}

const char *lp_eplb_mode_name(lp_eplb_mode m) {
  return m == LP_EPLB_REFERENCE ? "reference" : m == LP_EPLB_BALANCED ? "balanced" : "?";
}

int lp_eplb_mode_parse(const char *name) {
  if (name && strcmp(name, "reference") == 0) return LP_EPLB_REFERENCE;
  if (name && strcmp(name, "balanced") == 0) return LP_EPLB_BALANCED;
  return -1;
}

#define FAIL(st, ...)                                                          \
  do {                                                                         \
    if (err) lp_errf(err, __VA_ARGS__);                                        \
    return (st);                                                               \
  } while (0)

lp_status lp_eplb_check_shape(int layers, int experts, int replicas,
                              int groups, int nodes, int gpus, char *err) {
  if (layers < 1) FAIL(LP_ERR_ARG, "no layers: the load matrix is empty");
  if (experts < 1) FAIL(LP_ERR_ARG, "no experts: the load rows are empty");
  if (replicas < 1) FAIL(LP_ERR_ARG, "replicas must be at least 1 (got %d)", replicas);
  if (groups < 1) FAIL(LP_ERR_ARG, "groups must be at least 1 (got %d)", groups);
  if (nodes < 1) FAIL(LP_ERR_ARG, "nodes must be at least 1 (got %d)", nodes);
  if (gpus < 1) FAIL(LP_ERR_ARG, "gpus must be at least 1 (got %d)", gpus);
  if (replicas > LP_EPLB_MAX_REPLICAS)
    FAIL(LP_ERR_ARG, "replicas %d: more than the limit of %d slots per layer", replicas,
         LP_EPLB_MAX_REPLICAS);
  /* and experts <= replicas (below): the load matrix is within it too */
  if ((long long)layers * replicas > LP_EPLB_MAX_SLOTS)
    FAIL(LP_ERR_ARG,
         "%d layers x %d replicas = %lld slots: more than the limit of %d slots in all "
         "(layers x replicas)",
         layers, replicas, (long long)layers * replicas, LP_EPLB_MAX_SLOTS);
  if (replicas % gpus != 0)
    FAIL(LP_ERR_ARG, "replicas (%d) must be a multiple of gpus (%d)", replicas, gpus);
  if (gpus % nodes != 0)
    FAIL(LP_ERR_ARG, "gpus (%d) must be a multiple of nodes (%d)", gpus, nodes);
  if (replicas < experts)
    FAIL(LP_ERR_ARG, "replicas (%d) must be at least the number of experts (%d)",
         replicas, experts);
  if (groups % nodes == 0 && experts % groups != 0)
    FAIL(LP_ERR_ARG,
         "experts (%d) must be a multiple of groups (%d) for the hierarchical "
         "policy (groups %% nodes == 0)",
         experts, groups);
  return LP_OK;
}

static lp_status check_load(const double *load, int layers, int experts, char *err) {
  if (!load) FAIL(LP_ERR_ARG, "no load matrix");
  /* one branch-free pass; the slow one below names the first bad value */
  const size_t n = (size_t)layers * experts;
  /* the bits of 0 <= v <= FLT_MAX order like the values and lie at or
   * below those of FLT_MAX; -0.0 counts as 0; NaN, infinities and
   * negative values lie above */
  const double fmax = FLT_MAX;
  uint64_t lim, worst = 0;
  memcpy(&lim, &fmax, sizeof lim);
  for (size_t i = 0; i < n; i++) {
    uint64_t u;
    memcpy(&u, &load[i], sizeof u);
    u = u == (uint64_t)1 << 63 ? 0 : u;
    worst = u > worst ? u : worst;
  }
  if (worst <= lim) return LP_OK;
  for (int l = 0; l < layers; l++)
    for (int e = 0; e < experts; e++) {
      double v = load[(size_t)l * experts + e];
      if (isnan(v)) FAIL(LP_ERR_ARG, "layer %d, expert %d: load is NaN", l, e);
      if (v < 0) FAIL(LP_ERR_ARG, "layer %d, expert %d: load is negative (%g)", l, e, v);
      if (!isfinite(v) || v > FLT_MAX)
        FAIL(LP_ERR_ARG, "layer %d, expert %d: load %g is not a finite float32", l, e, v);
    }
  return LP_OK;
}

/* Every slot id in range; with `complete`, every expert in every layer. */
static lp_status check_map(const char *what, const int *map, int layers,
                           int experts, int replicas, int complete,
                           int *seen, char *err) {
  for (int l = 0; l < layers; l++) {
    const int *row = map + (size_t)l * replicas;
    if (complete) memset(seen, 0, (size_t)experts * sizeof *seen);
    for (int s = 0; s < replicas; s++) {
      if (row[s] < 0 || row[s] >= experts)
        FAIL(LP_ERR_ARG, "%s, layer %d, slot %d: expert %d is out of range 0..%d",
             what, l, s, row[s], experts - 1);
      if (complete) seen[row[s]] = 1;
    }
    if (complete)
      for (int e = 0; e < experts; e++)
        if (!seen[e])
          FAIL(LP_ERR_ARG, "%s, layer %d: expert %d has no slot", what, l, e);
  }
  return LP_OK;
}

static void init_dims(eplb_dims *d, int experts, int replicas, int groups,
                      int nodes, int gpus, int hier) {
  d->E = experts;
  d->R = replicas;
  d->G = gpus;
  d->N = nodes;
  d->groups = groups;
  d->hier = hier;
  d->ng = hier ? groups : 1;
  d->nn = hier ? nodes : 1;
  d->k = replicas / gpus;
}

/* ---- metrics ---- */

/* Max GPU load, total (summed in GPU order) and max node load. */
static void gpu_totals(const double *gpu_load, int nodes, int gpn, eplb_eval *out) {
  out->max = out->node_max = out->total = 0;
  for (int n = 0, g = 0; n < nodes; n++) {
    double node = 0;
    for (int j = 0; j < gpn; j++, g++) {
      double s = gpu_load[g];
      if (s > out->max) out->max = s;
      out->total += s;
      node += s;
    }
    if (node > out->node_max) out->node_max = node;
  }
}

void eplb_layer_eval(const eplb_dims *d, const double *load,
                     const int *phy2log, eplb_ws *ws, double *gpu_load,
                     eplb_eval *out) {
  int *cnt = ws->m_cnt, *start = ws->m_list, *bye = ws->m_list2;
  const int E = d->E, R = d->R, k = d->k, gpn = d->G / d->N;
  if (!gpu_load) gpu_load = ws->dc;
  memset(cnt, 0, (size_t)E * sizeof *cnt);
  for (int s = 0; s < R; s++) cnt[phy2log[s]]++;
  /* slots grouped by expert, ascending within each: every GPU then sums
   * its shares in expert order, whatever the slot order */
  start[0] = 0;
  for (int e = 0; e < E; e++) start[e + 1] = start[e] + cnt[e];
  for (int s = 0; s < R; s++) bye[start[phy2log[s]]++] = s;
  for (int g = 0; g < d->G; g++) gpu_load[g] = 0;
  out->dups = 0;
  const int *sg = ws->slot_gpu;
  (void)k;
  int t = 0;
  for (int e = 0; e < E; e++) {
    if (cnt[e] == 1) { /* most experts: one slot, no division */
      gpu_load[sg[bye[t++]]] += load[e];
      continue;
    }
    double share = load[e] / cnt[e];
    for (int c = 0; c < cnt[e]; c++, t++) {
      int g = sg[bye[t]];
      gpu_load[g] += share;
      if (c > 0 && sg[bye[t - 1]] == g) out->dups++;
    }
  }
  gpu_totals(gpu_load, d->N, gpn, out);
}

int eplb_better(const eplb_eval *a, const eplb_eval *b) {
  if (a->max != b->max) return a->max < b->max;
  if (a->dups != b->dups) return a->dups < b->dups;
  return a->node_max < b->node_max;
}

int eplb_copies(const eplb_dims *d, const int *prev, const int *cur, eplb_ws *ws,
                int *per_gpu) {
  int *a = ws->m_list, *b = ws->m_list2, k = d->k, copies = 0;
  for (int g = 0; g < d->G; g++) {
    memcpy(a, prev + (size_t)g * k, (size_t)k * sizeof *a);
    memcpy(b, cur + (size_t)g * k, (size_t)k * sizeof *b);
    eplb_sort_int(a, k);
    eplb_sort_int(b, k);
    int i = 0, j = 0, same = 0;
    while (i < k && j < k) {
      if (a[i] == b[j]) {
        same++;
        i++;
        j++;
      } else if (a[i] < b[j]) {
        i++;
      } else {
        j++;
      }
    }
    copies += k - same;
    if (per_gpu) per_gpu[g] = k - same;
  }
  return copies;
}

void eplb_rank_slots(const eplb_dims *d, const int *phy2log, const int *home,
                     int *cursor, int *phyrank) {
  const int per_node = d->R / d->N;
  memset(cursor, 0, (size_t)d->E * sizeof *cursor);
  for (int pass = 0; pass < 2; pass++)
    for (int s = 0; s < d->R; s++) {
      int e = phy2log[s];
      int at_home = !home || home[e] < 0 || s / per_node == home[e];
      if (at_home == (pass == 0)) phyrank[s] = cursor[e]++;
    }
}

/* ---- plan ---- */

void lp_eplb_plan_free(lp_eplb_plan *p) {
  if (!p) return;
  lp_free(p->phy2log);
  lp_free(p->phyrank);
  lp_free(p->log2phy);
  lp_free(p->logcnt);
  lp_free(p->home);
  lp_free(p->gpu_load);
  lp_free(p->gpu_copies);
  lp_free(p->layer);
  lp_free(p);
}

static lp_eplb_plan *plan_new(int layers, const eplb_dims *d) {
  lp_eplb_plan *p = lp_calloc(1, sizeof *p);
  if (!p) return NULL;
  size_t L = (size_t)layers;
  p->layers = layers;
  p->experts = d->E;
  p->replicas = d->R;
  p->groups = d->groups;
  p->nodes = d->N;
  p->gpus = d->G;
  p->hierarchical = d->hier;
  p->phy2log = lp_malloc(L * d->R * sizeof(int));
  p->phyrank = lp_malloc(L * d->R * sizeof(int));
  p->logcnt = lp_malloc(L * d->E * sizeof(int));
  p->home = lp_malloc(L * d->E * sizeof(int));
  p->gpu_load = lp_malloc(L * d->G * sizeof(double));
  p->layer = lp_calloc(L, sizeof(lp_eplb_layer_stats));
  if (!p->phy2log || !p->phyrank || !p->logcnt || !p->home || !p->gpu_load ||
      !p->layer) {
    lp_eplb_plan_free(p);
    return NULL;
  }
  return p;
}

/* GPU loads and duplicates of one layer from its logical_to_physical, as
 * eplb_layer_eval computes them from phy2log: each GPU still adds its
 * shares in expert order (an expert's shares on one GPU are equal, so the
 * order of its slots does not matter), and an expert's duplicates are its
 * slots minus the GPUs they are on. *off is set when some expert with a
 * home node has a slot elsewhere. */
static void finish_eval(const eplb_dims *d, const double *load, const int *cnt,
                        const int *l2p, int width, const int *home, eplb_ws *ws,
                        double *gpu_load, eplb_eval *out, int *off) {
  const int E = d->E, G = d->G, gpn = d->G / d->N;
  const int *sg = ws->slot_gpu, *sn = ws->slot_node;
  int *stamp = ws->m_list, dups = 0, away = 0;
  for (int g = 0; g < G; g++) {
    gpu_load[g] = 0;
    stamp[g] = -1;
  }
  for (int e = 0; e < E; e++) {
    const int *sl = l2p + (size_t)e * width;
    const int c = cnt[e], h = home[e];
    if (c == 1) { /* most experts: one slot, no division */
      gpu_load[sg[sl[0]]] += load[e];
      away |= h >= 0 && sn[sl[0]] != h;
      continue;
    }
    double share = load[e] / c;
    for (int r = 0; r < c; r++) {
      int g = sg[sl[r]];
      gpu_load[g] += share;
      dups += stamp[g] == e;
      stamp[g] = e;
      away |= h >= 0 && sn[sl[r]] != h;
    }
  }
  out->dups = dups;
  *off = away;
  gpu_totals(gpu_load, d->N, gpn, out);
}

/* Counts, width, logical_to_physical and every metric, from phy2log,
 * phyrank and home. */
static lp_status plan_finish(lp_eplb_plan *p, const eplb_dims *d,
                             const double *load, const int *previous,
                             int fixed_x, eplb_ws *ws, char *err) {
  const int L = p->layers, E = d->E, R = d->R, G = d->G;
  int width = 0;
  for (int l = 0; l < L; l++) {
    int *cnt = p->logcnt + (size_t)l * E;
    const int *map = p->phy2log + (size_t)l * R;
    memset(cnt, 0, (size_t)E * sizeof *cnt);
    int most = 0;
    for (int s = 0; s < R; s++) {
      int c = ++cnt[map[s]];
      most = c > most ? c : most;
    }
    if (most > width) width = most;
    if (fixed_x > 0 && most > fixed_x)
      for (int e = 0; e < E; e++)
        if (cnt[e] > fixed_x)
          FAIL(LP_ERR_ARG,
               "fixed_x=%d is too small: layer %d, expert %d has %d replicas", fixed_x,
               l, e, cnt[e]);
  }
  if (fixed_x > 0) width = fixed_x;
  p->width = width;
  p->log2phy = lp_malloc((size_t)L * E * width * sizeof(int));
  if (!p->log2phy) FAIL(LP_ERR_NOMEM, "out of memory");
  if (previous) {
    p->gpu_copies = lp_malloc((size_t)L * G * sizeof(int));
    if (!p->gpu_copies) FAIL(LP_ERR_NOMEM, "out of memory");
  }
  memset(&p->total, 0, sizeof p->total);
  p->total.copies = previous ? 0 : -1;
  p->has_previous = previous != NULL;
  for (int l = 0; l < L; l++) {
    const int *map = p->phy2log + (size_t)l * R, *rank = p->phyrank + (size_t)l * R;
    const int *cnt = p->logcnt + (size_t)l * E, *home = p->home + (size_t)l * E;
    const double *row = load + (size_t)l * E;
    int *l2p = p->log2phy + (size_t)l * E * width;
    memset(l2p, 0xff, (size_t)E * width * sizeof *l2p); /* -1 */
    for (int s = 0; s < R; s++) {
      int e = map[s], r = rank[s];
      if ((unsigned)r >= (unsigned)cnt[e] || l2p[(size_t)e * width + r] != -1)
        FAIL(LP_ERR_INTERNAL, "layer %d, slot %d: bad replica rank %d of expert %d",
             l, s, r, e);
      l2p[(size_t)e * width + r] = s;
    }
    eplb_eval ev;
    int off;
    finish_eval(d, row, cnt, l2p, width, home, ws, p->gpu_load + (size_t)l * G, &ev, &off);
    lp_eplb_layer_stats *st = &p->layer[l];
    st->max_load = ev.max;
    st->mean_load = ev.total / G;
    double node_mean = ev.total / d->N;
    st->gpu_max_over_mean = ev.total > 0 ? ev.max / st->mean_load : 1.0;
    st->node_max_over_mean = ev.total > 0 ? ev.node_max / node_mean : 1.0;
    st->balancedness = ev.max > 0 ? st->mean_load / ev.max : 1.0;
    st->duplicates = ev.dups;
    st->off_node_load = 0;
    if (off) /* summed in slot order */
      for (int s = 0; s < R; s++) {
        int e = map[s];
        if (home[e] >= 0 && ws->slot_node[s] != home[e]) st->off_node_load += row[e] / cnt[e];
      }
    st->copies = previous ? eplb_copies(d, previous + (size_t)l * R, map, ws,
                                        p->gpu_copies + (size_t)l * G)
                          : -1;
    p->total.balancedness += st->balancedness / L;
    p->total.gpu_max_over_mean += st->gpu_max_over_mean / L;
    p->total.node_max_over_mean += st->node_max_over_mean / L;
    p->total.off_node_load += st->off_node_load;
    p->total.duplicates += st->duplicates;
    if (previous) p->total.copies += st->copies;
  }
  return LP_OK;
}

lp_status lp_eplb_rebalance(const double *load, int layers, int experts,
                            int replicas, int groups, int nodes, int gpus,
                            const lp_eplb_options *opt, lp_eplb_plan **out,
                            char *err) {
  double t0 = lp_now();
  lp_eplb_options defaults;
  if (!out) FAIL(LP_ERR_ARG, "no place for the plan (out is NULL)");
  *out = NULL;
  if (!opt) {
    lp_eplb_options_init(&defaults);
    opt = &defaults;
  }
  LP_CHECK(lp_eplb_check_shape(layers, experts, replicas, groups, nodes, gpus, err));
  if (opt->mode != LP_EPLB_REFERENCE && opt->mode != LP_EPLB_BALANCED)
    FAIL(LP_ERR_ARG, "unknown mode %d (expected reference or balanced)", (int)opt->mode);
  if (opt->spill && opt->mode == LP_EPLB_REFERENCE)
    FAIL(LP_ERR_ARG, "spill needs mode balanced (reference is DeepSeek's algorithm exactly)");
  if (opt->max_moves >= 0 && !opt->previous)
    FAIL(LP_ERR_ARG, "max_moves needs a previous plan");
  if (opt->fixed_x < 0)
    FAIL(LP_ERR_ARG, "fixed_x must be 0 (automatic) or positive (got %d)", opt->fixed_x);
  if (opt->previous && gpus > LP_EPLB_MAX_RELABEL_GPUS)
    FAIL(LP_ERR_ARG,
         "gpus %d: more than the limit of %d GPUs for re-planning against a previous plan", gpus,
         LP_EPLB_MAX_RELABEL_GPUS);
  LP_CHECK(check_load(load, layers, experts, err));

  eplb_dims d;
  init_dims(&d, experts, replicas, groups, nodes, gpus, groups % nodes == 0);
  eplb_ws ws;
  if (eplb_ws_alloc(&ws, &d, opt->previous != NULL) != LP_OK) FAIL(LP_ERR_NOMEM, "out of memory");
  lp_status st = LP_OK;
  lp_eplb_plan *p = NULL;
  if (opt->previous) {
    st = check_map("previous plan", opt->previous, layers, experts, replicas,
                   opt->max_moves >= 0, ws.ia, err);
    if (st != LP_OK) goto fail;
  }
  p = plan_new(layers, &d);
  if (!p) {
    st = LP_ERR_NOMEM;
    if (err) lp_errf(err, "out of memory");
    goto fail;
  }
  p->mode = opt->mode;
  for (int l = 0; l < layers; l++) {
    const double *row = load + (size_t)l * experts;
    int *map = p->phy2log + (size_t)l * replicas;
    int *rank = p->phyrank + (size_t)l * replicas;
    int *home = p->home + (size_t)l * experts;
    eplb_reference_layer(&d, row, &ws, map, rank, home);
    if (opt->mode == LP_EPLB_BALANCED) {
      ws.refine_left = eplb_refine_budget(replicas);
      eplb_balanced_layer(&d, row, opt->spill, &ws, map, rank, home);
    }
    if (opt->previous) {
      const int *prev = opt->previous + (size_t)l * replicas;
      eplb_relabel_layer(&d, prev, &ws, map, rank, home);
      if (opt->max_moves >= 0 && eplb_copies(&d, prev, map, &ws, NULL) > opt->max_moves) {
        /* from prev: its groups' nodes are the homes (the off-node load
         * and, without spill, where new replicas may go) */
        int *tmp = ws.c_phy2log;
        eplb_prev_homes(&d, row, prev, &ws, home);
        eplb_budget_layer(&d, row, prev, opt->max_moves, opt->spill ? NULL : home, &ws, tmp);
        memcpy(map, tmp, (size_t)replicas * sizeof *map);
        eplb_rank_slots(&d, map, home, ws.ia, rank);
      }
    }
  }
  st = plan_finish(p, &d, load, opt->previous, opt->fixed_x, &ws, err);
  if (st != LP_OK) goto fail;
  p->total.refine_steps = ws.refine_steps;
  p->total.refine_work = ws.refine_work;
  p->total.refine_cut = ws.refine_cut;
  eplb_ws_free(&ws);
  p->total.solve_ms = (lp_now() - t0) * 1e3;
  *out = p;
  return LP_OK;
fail:
  eplb_ws_free(&ws);
  lp_eplb_plan_free(p);
  return st;
}

lp_status lp_eplb_evaluate(const double *load, int layers, int experts,
                           const int *phy2log, int replicas, int nodes,
                           int gpus, const int *previous, lp_eplb_plan **out,
                           char *err) {
  double t0 = lp_now();
  if (!out) FAIL(LP_ERR_ARG, "no place for the plan (out is NULL)");
  *out = NULL;
  if (!phy2log) FAIL(LP_ERR_ARG, "no placement to evaluate");
  /* groups = 1: no group condition applies */
  LP_CHECK(lp_eplb_check_shape(layers, experts, replicas, 1, nodes, gpus, err));
  LP_CHECK(check_load(load, layers, experts, err));
  eplb_dims d;
  init_dims(&d, experts, replicas, 1, nodes, gpus, 0);
  eplb_ws ws;
  if (eplb_ws_alloc(&ws, &d, 0) != LP_OK) FAIL(LP_ERR_NOMEM, "out of memory");
  lp_eplb_plan *p = NULL;
  lp_status st = check_map("placement", phy2log, layers, experts, replicas, 1, ws.ia, err);
  if (st == LP_OK && previous)
    st = check_map("previous plan", previous, layers, experts, replicas, 0, ws.ia, err);
  if (st != LP_OK) goto fail;
  p = plan_new(layers, &d);
  if (!p) {
    st = LP_ERR_NOMEM;
    if (err) lp_errf(err, "out of memory");
    goto fail;
  }
  p->groups = 0;
  p->mode = LP_EPLB_REFERENCE;
  memcpy(p->phy2log, phy2log, (size_t)layers * replicas * sizeof(int));
  for (size_t i = 0; i < (size_t)layers * experts; i++) p->home[i] = -1;
  for (int l = 0; l < layers; l++)
    eplb_rank_slots(&d, p->phy2log + (size_t)l * replicas, NULL, ws.ia,
                    p->phyrank + (size_t)l * replicas);
  st = plan_finish(p, &d, load, previous, 0, &ws, err);
  if (st != LP_OK) goto fail;
  eplb_ws_free(&ws);
  p->total.solve_ms = (lp_now() - t0) * 1e3;
  *out = p;
  return LP_OK;
fail:
  eplb_ws_free(&ws);
  lp_eplb_plan_free(p);
  return st;
}

int lp_eplb_plan_layers(const lp_eplb_plan *p) { return p->layers; }
int lp_eplb_plan_experts(const lp_eplb_plan *p) { return p->experts; }
int lp_eplb_plan_replicas(const lp_eplb_plan *p) { return p->replicas; }
int lp_eplb_plan_gpus(const lp_eplb_plan *p) { return p->gpus; }
int lp_eplb_plan_nodes(const lp_eplb_plan *p) { return p->nodes; }
int lp_eplb_plan_width(const lp_eplb_plan *p) { return p->width; }
int lp_eplb_plan_hierarchical(const lp_eplb_plan *p) { return p->hierarchical; }
lp_eplb_mode lp_eplb_plan_mode(const lp_eplb_plan *p) { return p->mode; }
const int *lp_eplb_plan_phy2log(const lp_eplb_plan *p) { return p->phy2log; }
const int *lp_eplb_plan_log2phy(const lp_eplb_plan *p) { return p->log2phy; }
const int *lp_eplb_plan_logcnt(const lp_eplb_plan *p) { return p->logcnt; }
const double *lp_eplb_plan_gpu_load(const lp_eplb_plan *p) { return p->gpu_load; }
const int *lp_eplb_plan_gpu_copies(const lp_eplb_plan *p) { return p->gpu_copies; }
const lp_eplb_layer_stats *lp_eplb_plan_layer_stats(const lp_eplb_plan *p) {
  return p->layer;
}
void lp_eplb_plan_stats(const lp_eplb_plan *p, lp_eplb_stats *out) { *out = p->total; }
