/* test_search.c — lp_search from C: the found schedule validates and
 * simulates to the figures the search reports, within the memory limit;
 * the V placement and bidirectional routes; the bound is below what is
 * found; problem errors name the place; every allocation failure returns
 * LP_ERR_NOMEM and leaks nothing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "lp_search.h"
#include "lp_test_oom.h"

#define EPS 1e-9

typedef struct spec {
  int vs_stage[32], vs_rank[32], routes[64], mb_route[64];
  double memory[16];
  lp_sim_cost cost;
  lp_search_problem p;
} spec;

/* linear: stage i on rank i; v: 2P stages in a V (act 1/2 each); times F,
 * I, W per stage, latency, limit per rank, w_share */
static void make(spec *x, int P, int M, int vshape, double f, double i, double w, double fb,
                 double lat, double mem, double w_share) {
  memset(x, 0, sizeof *x);
  int S = vshape ? 2 * P : P;
  for (int k = 0; k < S; k++) {
    x->vs_stage[k] = k;
    x->vs_rank[k] = k < P ? k : 2 * P - 1 - k;
    x->routes[k] = k;
  }
  lp_sim_cost_init(&x->cost);
  double sc = vshape ? 0.5 : 1;
  x->cost.t.f = f * sc;
  x->cost.t.i = i * sc;
  x->cost.t.w = w * sc;
  if (fb > 0) x->cost.t.fb = fb * sc;
  x->cost.latency = lat;
  for (int r = 0; r < P; r++) x->memory[r] = mem;
  static double half[32];
  for (int k = 0; k < 32; k++) half[k] = 0.5;
  x->p = (lp_search_problem){.ranks = P, .stages = S, .microbatches = M, .nvstages = S,
                             .vstage_stage = x->vs_stage, .vstage_rank = x->vs_rank,
                             .nroutes = 1, .routes = x->routes, .mb_route = NULL,
                             .cost = &x->cost, .act = vshape ? half : NULL,
                             .memory = mem > 0 ? x->memory : NULL, .w_share = w_share,
                             .split = LP_SEARCH_SPLIT_AUTO, .pairs = 1,
                             .objective = LP_SEARCH_MAKESPAN, .seed = 3};
}

/* Runs a search of max_evals decodes and checks the best against the simulator. */
static void check_found(const lp_search_problem *p, long long evals) {
  lp_search *S;
  char err[LP_ERRLEN];
  assert_int_equal(lp_search_new(p, &S, err), LP_OK);
  assert_int_equal(lp_search_seed_rules(S), LP_OK);
  assert_int_equal(lp_search_run(S, 60, evals), LP_OK);
  lp_search_stats st;
  lp_search_stats_of(S, &st);
  assert_true(st.best < HUGE_VAL);
  assert_true(st.lower_bound <= st.best + EPS);
  assert_true(st.evaluations >= evals);
  lp_schedule *s;
  assert_int_equal(lp_search_best_schedule(S, &s), LP_OK);
  assert_int_equal(lp_schedule_validate(s), LP_OK);
  lp_sim_result *res;
  assert_int_equal(lp_sim_run(s, p->cost, &res, err), LP_OK);
  assert_true(fabs(lp_sim_makespan(res) - st.makespan) < 1e-9);
  double peak[16], mine[16];
  assert_int_equal(lp_search_best_peak(S, peak), LP_OK);
  assert_int_equal(lp_search_schedule_peak(s, p->act, p->w_share, mine), LP_OK);
  for (int r = 0; r < p->ranks; r++) {
    assert_true(fabs(peak[r] - mine[r]) < 1e-9);
    if (p->memory) assert_true(peak[r] <= p->memory[r] + 1e-9);
  }
  lp_sim_result_free(res);
  lp_schedule_free(s);
  lp_search_free(S);
}

static void test_linear_and_v(void **state) {
  (void)state;
  spec x;
  make(&x, 4, 8, 0, 1, 1, 1, 0, 0, 3, 0.5);
  check_found(&x.p, 300);
  make(&x, 4, 8, 0, 2, 3, 1, 0, 0.5, 0, 0); /* unlimited memory, latency */
  check_found(&x.p, 300);
  make(&x, 4, 8, 1, 1, 1, 1, 2.2, 0, 4, 0); /* V, FB pairs */
  check_found(&x.p, 300);
  x.p.objective = LP_SEARCH_SPAN;
  x.p.split = LP_SEARCH_SPLIT_NEVER;
  check_found(&x.p, 300);
}

static void test_bidirectional(void **state) {
  (void)state;
  spec x;
  make(&x, 4, 8, 0, 1, 1, 1, 2.4, 0, 5, 0.5);
  /* DualPipe's placement: v < P down, P + s up (stage s on rank P-1-s) */
  for (int s = 0; s < 4; s++) {
    x.vs_stage[4 + s] = s;
    x.vs_rank[4 + s] = 3 - s;
    x.routes[4 + s] = 4 + s;
  }
  for (int m = 0; m < 8; m++) x.mb_route[m] = m < 4 ? 0 : 1;
  x.p.nvstages = 8;
  x.p.nroutes = 2;
  x.p.mb_route = x.mb_route;
  check_found(&x.p, 300);
}

/* ZB-H2: F = I = W, memory 2P-1 under w_share 0.5: span 3M, gap 0 */
static void test_zero_bubble(void **state) {
  (void)state;
  spec x;
  make(&x, 4, 12, 0, 1, 1, 1, 0, 0, 7, 0.5);
  x.p.objective = LP_SEARCH_SPAN;
  lp_search *S;
  assert_int_equal(lp_search_new(&x.p, &S, NULL), LP_OK);
  assert_int_equal(lp_search_run(S, 5, 2000), LP_OK);
  lp_search_stats st;
  lp_search_stats_of(S, &st);
  assert_true(fabs(st.span - 36) < EPS);
  assert_true(fabs(st.lower_bound - 36) < EPS);
  assert_true(st.gap == 0);
  lp_search_free(S);
}

static void expect_error(const lp_search_problem *p, const char *text) {
  lp_search *S = (lp_search *)1;
  char err[LP_ERRLEN];
  assert_int_equal(lp_search_new(p, &S, err), LP_ERR_ARG);
  assert_null(S);
  if (!strstr(err, text)) printf("  got: %s\n", err);
  assert_non_null(strstr(err, text));
}

static void test_errors(void **state) {
  (void)state;
  spec x;
  make(&x, 4, 8, 0, 1, 1, 1, 0, 0, 0.5, 0);
  expect_error(&x.p, "the memory limit of rank 0 (0.5 activations) is less than one micro-batch "
                     "needs there (1)");
  make(&x, 4, 8, 0, 1, 1, 1, 0, 0, 3, 1.5);
  expect_error(&x.p, "w_share = 1.5 must be a number in 0..1");
  make(&x, 4, 8, 0, 1, 1, 1, 0, 0, 3, 0);
  x.vs_rank[2] = 7;
  expect_error(&x.p, "virtual stage 2 is placed on rank 7, not one of 0..3");
  make(&x, 4, 8, 0, 1, 1, 1, 0, 0, 3, 0);
  x.routes[1] = 2;
  expect_error(&x.p, "route 0, position 1: virtual stage 2 does not hold model stage 1");
  make(&x, 4, 8, 0, 1, 1, 1, 0, 0, 3, 0);
  x.cost.t.b = 1;
  x.cost.t.i = x.cost.t.w = LP_SIM_UNSET;
  x.cost.t.w = 2;
  expect_error(&x.p, "B = 1 is less than W = 2");
}

static spec oom_spec;

static lp_status oom_scenario(void) {
  lp_search *S = NULL;
  lp_status st = lp_search_new(&oom_spec.p, &S, NULL);
  if (st == LP_OK) st = lp_search_seed_rules(S);
  if (st == LP_OK) st = lp_search_run(S, 60, 5);
  lp_schedule *s = NULL;
  if (st == LP_OK) st = lp_search_best_schedule(S, &s);
  lp_schedule_free(s);
  lp_search_free(S);
  return st;
}

static void test_out_of_memory(void **state) {
  (void)state;
  make(&oom_spec, 2, 3, 0, 1, 1, 1, 0, 0, 2, 0.5);
  int points = lp_test_oom_points(oom_scenario, 20000);
  assert_true(points > 50);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_linear_and_v), cmocka_unit_test(test_bidirectional),
      cmocka_unit_test(test_zero_bubble), cmocka_unit_test(test_errors),
      cmocka_unit_test(test_out_of_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
