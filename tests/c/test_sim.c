/* test_sim.c — the simulator on hand-built schedules: exact timings for
 * 1F1B, latency, overlapped pairs, MoE exchanges and their overlap, per-stage overrides, the
 * B = I + W rules, per-action times (a replay), memory counters, determinism, refusal of invalid
 * schedules, and out-of-memory paths through the allocation hook. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lp_schedule.h"
#include "lp_sim.h"
#include "lp_test_oom.h"

#define EPS 1e-9

/* stage i on rank i, every micro-batch through 0..P-1 */
static lp_schedule *linear(int P, int M) {
  lp_schedule *s;
  assert_int_equal(lp_schedule_new(P, P, M, &s), LP_OK);
  for (int i = 0; i < P; i++)
    assert_int_equal(lp_schedule_add_vstage(s, i, i, NULL), LP_OK);
  int route[64];
  for (int i = 0; i < P; i++)
    route[i] = i;
  for (int m = 0; m < M; m++)
    assert_int_equal(lp_schedule_set_route(s, m, route, P), LP_OK);
  return s;
}

static void push(lp_schedule *s, int rank, const char *fmt, ...) {
  char text[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  lp_status st = lp_schedule_push_text(s, rank, text);
  if (st != LP_OK) fail_msg("push %s: %s", text, lp_schedule_last_error(s));
}

/* 1F1B: P-1-r warm-up forwards, then one forward / one backward. */
static lp_schedule *onef1b(int P, int M) {
  lp_schedule *s = linear(P, M);
  for (int r = 0; r < P; r++) {
    int f = 0, b = 0;
    for (int k = 0; k < P - 1 - r && f < M; k++)
      push(s, r, "%dF%d", r, f++);
    while (b < M) {
      if (f < M) push(s, r, "%dF%d", r, f++);
      push(s, r, "%dB%d", r, b++);
    }
  }
  return s;
}

/* DualPipe on P=2, M=4, as the spec's eight steps give it. Virtual stages:
 * 0 = stage 0 on rank 0, 1 = stage 1 on rank 1 (down), 2 = stage 0 on
 * rank 1, 3 = stage 1 on rank 0 (up); mbs 0,1 down, 2,3 up. */
static lp_schedule *dualpipe_p2(void) {
  lp_schedule *s;
  assert_int_equal(lp_schedule_new(2, 2, 4, &s), LP_OK);
  assert_int_equal(lp_schedule_add_vstage(s, 0, 0, NULL), LP_OK);
  assert_int_equal(lp_schedule_add_vstage(s, 1, 1, NULL), LP_OK);
  assert_int_equal(lp_schedule_add_vstage(s, 0, 1, NULL), LP_OK);
  assert_int_equal(lp_schedule_add_vstage(s, 1, 0, NULL), LP_OK);
  int down[2] = {0, 1}, up[2] = {2, 3};
  for (int m = 0; m < 4; m++)
    assert_int_equal(lp_schedule_set_route(s, m, m < 2 ? down : up, 2), LP_OK);
  const char *r0[] = {"0F0", "3F2", "0F1", "3B2", "(3F3;0B0)OVERLAP_F_B",
                      "3B3", "0I1", "0W1"};
  const char *r1[] = {"2F2", "1F0", "2F3", "1B0", "(1F1;2B2)OVERLAP_F_B",
                      "1B1", "2I3", "2W3"};
  for (int i = 0; i < 8; i++) {
    push(s, 0, "%s", r0[i]);
    push(s, 1, "%s", r1[i]);
  }
  return s;
}

static lp_sim_result *run_ok(lp_schedule *s, const lp_sim_cost *c) {
  lp_sim_result *r = NULL;
  char err[LP_ERRLEN];
  lp_status st = lp_sim_run(s, c, &r, err);
  if (st != LP_OK) fail_msg("lp_sim_run: %s", err);
  assert_non_null(r);
  return r;
}

static lp_sim_cost cost_fb(double f, double b) {
  lp_sim_cost c;
  lp_sim_cost_init(&c);
  c.t.f = f;
  c.t.b = b;
  return c;
}

static void check_event(const lp_sim_result *r, int rank, int index,
                        const char *text, double start, double end) {
  int n;
  const lp_sim_event *ev = lp_sim_rank_events(r, rank, &n);
  for (int i = 0; i < n; i++) {
    if (ev[i].index != index) continue;
    char t[LP_ACTION_TEXT_MAX];
    lp_action_format(&ev[i].action, t, sizeof t);
    assert_string_equal(t, text);
    if (ev[i].start < start - EPS || ev[i].start > start + EPS ||
        ev[i].end < end - EPS || ev[i].end > end + EPS)
      fail_msg("rank %d, action %d (%s): [%g, %g], expected [%g, %g]", rank,
               index, t, ev[i].start, ev[i].end, start, end);
    return;
  }
  fail_msg("rank %d has no event at position %d", rank, index);
}

static void assert_near(double x, double want) {
  if (x < want - EPS || x > want + EPS)
    fail_msg("got %.12g, expected %.12g", x, want);
}

/* 1F1B P=4 M=8 under F=1, B=2: makespan (M+P-1)(F+B) = 33 and a bubble of
 * (P-1)(F+B) = 9 on every rank. */
static void test_1f1b_bubble(void **state) {
  (void)state;
  const int P = 4, M = 8;
  lp_schedule *s = onef1b(P, M);
  lp_sim_cost c = cost_fb(1, 2);
  lp_sim_result *r = run_ok(s, &c);
  assert_int_equal(lp_sim_ranks(r), P);
  assert_near(lp_sim_makespan(r), (M + P - 1) * 3.0);
  assert_near(lp_sim_max_bubble(r), (P - 1) * 3.0);
  for (int k = 0; k < P; k++) {
    lp_sim_rank_stats st;
    assert_int_equal(lp_sim_rank_stats_of(r, k, &st), LP_OK);
    assert_near(st.busy, M * 3.0);
    assert_near(st.bubble, (P - 1) * 3.0);
    assert_near(st.bubble_ratio, 9.0 / 33.0);
    assert_near(st.finish, 33.0 - 2.0 * k);
    assert_int_equal(st.peak_live, P - k);
    assert_int_equal(st.peak_pending_w, 0);
  }
  lp_sim_rank_stats st;
  assert_int_equal(lp_sim_rank_stats_of(r, P, &st), LP_ERR_ARG);
  check_event(r, 3, 0, "3F0", 3, 4);
  check_event(r, 3, 1, "3B0", 4, 6);
  check_event(r, 0, 4, "0B0", 10, 12);
  int nev, nmsg;
  lp_sim_events(r, &nev);
  assert_int_equal(nev, 2 * P * M);
  const lp_sim_message *m = lp_sim_messages(r, &nmsg);
  assert_int_equal(nmsg, 2 * (P - 1) * M);
  for (int i = 1; i < nmsg; i++)
    assert_true(m[i - 1].sent <= m[i].sent);
  assert_int_equal(m[0].from, 0);
  assert_int_equal(m[0].to, 1);
  assert_string_equal(m[0].text, "0F0");
  lp_sim_result_free(r);
  lp_schedule_free(s);
}

/* Two ranks, one micro-batch, latency 0.5: every hop costs 0.5. */
static void test_latency(void **state) {
  (void)state;
  lp_schedule *s = linear(2, 1);
  push(s, 0, "0F0");
  push(s, 0, "0B0");
  push(s, 1, "1F0");
  push(s, 1, "1B0");
  lp_sim_cost c = cost_fb(1, 2);
  c.latency = 0.5;
  lp_sim_result *r = run_ok(s, &c);
  check_event(r, 0, 0, "0F0", 0, 1);
  check_event(r, 1, 0, "1F0", 1.5, 2.5);
  check_event(r, 1, 1, "1B0", 2.5, 4.5);
  check_event(r, 0, 1, "0B0", 5, 7);
  assert_near(lp_sim_makespan(r), 7);
  assert_near(lp_sim_latency(r), 0.5);
  for (int k = 0; k < 2; k++) {
    lp_sim_rank_stats st;
    lp_sim_rank_stats_of(r, k, &st);
    assert_near(st.busy, 3);
    assert_near(st.bubble, 4);
  }
  int n;
  const lp_sim_message *m = lp_sim_messages(r, &n);
  assert_int_equal(n, 2);
  assert_int_equal(m[0].from, 0);
  assert_int_equal(m[0].to, 1);
  assert_int_equal(m[0].from_index, 0);
  assert_int_equal(m[0].to_index, 0);
  assert_near(m[0].sent, 1);
  assert_near(m[0].arrived, 1.5);
  assert_string_equal(m[0].text, "0F0");
  assert_int_equal(m[1].from, 1);
  assert_int_equal(m[1].to, 0);
  assert_near(m[1].sent, 4.5);
  assert_near(m[1].arrived, 5);
  assert_string_equal(m[1].text, "1B0");
  lp_sim_result_free(r);
  lp_schedule_free(s);
}

/* Overlapped pairs: default FB = F + B; FB = 2.5 given; both halves'
 * outputs appear at the pair's end. */
static void test_fb_timing(void **state) {
  (void)state;
  lp_schedule *s = dualpipe_p2();
  lp_sim_cost c = cost_fb(1, 2);
  lp_sim_result *r = run_ok(s, &c);
  assert_near(lp_sim_makespan(r), 12); /* FB = 3: no bubble */
  check_event(r, 0, 4, "(3F3;0B0)OVERLAP_F_B", 5, 8);
  assert_near(lp_sim_max_bubble(r), 0);
  lp_sim_result_free(r);

  c.t.fb = 2.5;
  r = run_ok(s, &c);
  const char *t0[] = {"0F0", "3F2", "0F1", "3B2", "(3F3;0B0)OVERLAP_F_B",
                      "3B3", "0I1", "0W1"};
  const char *t1[] = {"2F2", "1F0", "2F3", "1B0", "(1F1;2B2)OVERLAP_F_B",
                      "1B1", "2I3", "2W3"};
  const double start[] = {0, 1, 2, 3, 5, 7.5, 9.5, 10.5};
  const double end[] = {1, 2, 3, 5, 7.5, 9.5, 10.5, 11.5};
  for (int i = 0; i < 8; i++) {
    check_event(r, 0, i, t0[i], start[i], end[i]);
    check_event(r, 1, i, t1[i], start[i], end[i]);
  }
  assert_near(lp_sim_makespan(r), 11.5);
  lp_sim_rank_stats st;
  lp_sim_rank_stats_of(r, 0, &st);
  assert_near(st.busy, 11.5);
  assert_int_equal(st.peak_live, 3);
  assert_int_equal(st.peak_pending_w, 1);
  /* the pair's B half (0B0) feeds nothing across ranks; its F half (3F3)
   * is the loss stage; 1B1 on rank 1 waited for the pair's F half 1F1 */
  lp_sim_result_free(r);

  /* with latency, the cross-rank inputs of the pairs arrive late */
  c.latency = 1;
  r = run_ok(s, &c);
  /* rank 0: 0F0 [0,1]; 3F2 needs 2F2 (rank 1, ends 1) + 1 -> [2,3];
   * 0F1 [3,4]; 3B2 [4,6]; the pair needs 2F3 (rank 1) and 1B0 (rank 1) */
  check_event(r, 0, 1, "3F2", 2, 3);
  check_event(r, 1, 1, "1F0", 2, 3);
  check_event(r, 1, 3, "1B0", 4, 6);
  check_event(r, 0, 4, "(3F3;0B0)OVERLAP_F_B", 7, 9.5);
  /* 1B1 needs its own forward 1F1 from the pair on the same rank */
  check_event(r, 1, 4, "(1F1;2B2)OVERLAP_F_B", 7, 9.5);
  check_event(r, 1, 5, "1B1", 9.5, 11.5);
  /* 0I1 needs 1B1 from rank 1: 11.5 + 1 */
  check_event(r, 0, 6, "0I1", 12.5, 13.5);
  lp_sim_result_free(r);
  lp_schedule_free(s);
}

/* MoE exchanges on the DualPipe P=2 schedule, F=1 B=2 (I=W=1), a link of
 * 1 B/s and no latency (X = n * bytes): stage 0 F X=1, B X=1.5, I X=0.5;
 * stage 1 F X=2.5, B X=2, I none. Durations: stage 0 F 2, B 3.5, I 1.5;
 * stage 1 F 3.5, B 4, I 1; W 1. Each pair (F half stage 1, B half stage 0):
 * C_f + C_b = 3, exposed max(0, 2.5 - 2) + max(0, 1.5 - 1) = 1: 4.
 *   both ranks: F [0,2], F(stage 1) [2,5.5], F [5.5,7.5], B(stage 1)
 *   [7.5,11.5], pair [11.5,15.5], B(stage 1) [15.5,19.5], I [19.5,21],
 *   W [21,22]: makespan 22; exchanges 13 per rank, 3 hidden (the pair). */
static void test_exchanges(void **state) {
  (void)state;
  lp_schedule *s = dualpipe_p2();
  lp_sim_cost c = cost_fb(1, 2);
  c.link.latency_s = 0;
  c.link.bytes_per_s = 1;
  lp_sim_exchanges x[6] = {
      {2, 0.25, 0.5}, {1, 1.5, 1}, {1, 0.5, 0}, /* stage 0: F, B, I */
      {1, 2.5, 0},    {2, 1, 0.5}, {0, 0, 0},   /* stage 1 */
  };
  c.exchanges = x;
  c.nexchange_stages = 2;
  lp_sim_result *r = run_ok(s, &c);
  const char *t0[] = {"0F0", "3F2", "0F1", "3B2", "(3F3;0B0)OVERLAP_F_B",
                      "3B3", "0I1", "0W1"};
  const char *t1[] = {"2F2", "1F0", "2F3", "1B0", "(1F1;2B2)OVERLAP_F_B",
                      "1B1", "2I3", "2W3"};
  const double start[] = {0, 2, 5.5, 7.5, 11.5, 15.5, 19.5, 21};
  const double end[] = {2, 5.5, 7.5, 11.5, 15.5, 19.5, 21, 22};
  for (int i = 0; i < 8; i++) {
    check_event(r, 0, i, t0[i], start[i], end[i]);
    check_event(r, 1, i, t1[i], start[i], end[i]);
  }
  assert_near(lp_sim_makespan(r), 22);
  for (int k = 0; k < 2; k++) {
    lp_sim_rank_stats st;
    assert_int_equal(lp_sim_rank_stats_of(r, k, &st), LP_OK);
    assert_near(st.busy, 22);
    assert_near(st.a2a, 13);
    assert_near(st.a2a_hidden, 3);
  }
  lp_sim_result_free(r);

  /* FB given replaces the pair's compute, the exposed part stays: 2.5 + 1 */
  c.t.fb = 2.5;
  r = run_ok(s, &c);
  check_event(r, 0, 4, "(3F3;0B0)OVERLAP_F_B", 11.5, 15);
  assert_near(lp_sim_makespan(r), 21.5);
  lp_sim_result_free(r);
  c.t.fb = LP_SIM_UNSET;

  /* the same in ms: a 1000 B/s link, 1000 cost units per second */
  c.link.bytes_per_s = 1000;
  c.link_unit = 1000;
  r = run_ok(s, &c);
  assert_near(lp_sim_makespan(r), 22);
  lp_sim_result_free(r);

  /* a pair whose other half hides everything: exchanges fully hidden */
  c.link.bytes_per_s = 4000; /* X: stage 1 F 0.625 < C_b 2, stage 0 B 0.375 < C_f 1 */
  r = run_ok(s, &c);
  check_event(r, 0, 4, "(3F3;0B0)OVERLAP_F_B", 6.625, 9.625);
  lp_sim_rank_stats st;
  lp_sim_rank_stats_of(r, 0, &st);
  assert_near(st.a2a, 3.25);
  assert_near(st.a2a_hidden, 1);
  lp_sim_result_free(r);

  /* bad exchange descriptions are refused with the stage and half named */
  char err[LP_ERRLEN];
  x[4].n = -1;
  assert_int_equal(lp_sim_run(s, &c, &r, err), LP_ERR_ARG);
  assert_null(r);
  assert_string_equal(err, "cost model: exchanges of B on model stage 1: exchanges = -1 "
                           "must be a number in 0..1e+15");
  x[4].n = 2;
  lp_sim_exchanges x3[9] = {{0, 0, 0}};
  x3[6].n = 1;
  c.exchanges = x3;
  c.nexchange_stages = 3;
  assert_int_equal(lp_sim_run(s, &c, &r, err), LP_ERR_ARG);
  assert_string_equal(err, "cost model: exchanges for model stage 2, but the schedule has "
                           "stages 0..1");
  c.exchanges = NULL;
  assert_int_equal(lp_sim_run(s, &c, &r, err), LP_ERR_ARG);
  assert_string_equal(err, "cost model: exchanges for 3 stages given without an array");
  lp_schedule_free(s);
}

/* Stage 1 twice as slow: F=2, B=4 there. */
static void test_stage_overrides(void **state) {
  (void)state;
  lp_schedule *s = onef1b(2, 2);
  lp_sim_times ov[2];
  lp_sim_times_init(&ov[0]);
  lp_sim_times_init(&ov[1]);
  ov[1].f = 2;
  ov[1].b = 4;
  lp_sim_cost c = cost_fb(1, 2);
  c.stages = ov;
  c.nstages = 2;
  lp_sim_result *r = run_ok(s, &c);
  check_event(r, 1, 0, "1F0", 1, 3);
  check_event(r, 1, 1, "1B0", 3, 7);
  check_event(r, 1, 2, "1F1", 7, 9);
  check_event(r, 1, 3, "1B1", 9, 13);
  check_event(r, 0, 2, "0B0", 7, 9);
  check_event(r, 0, 3, "0B1", 13, 15);
  assert_near(lp_sim_makespan(r), 15);
  lp_sim_rank_stats a, b;
  lp_sim_rank_stats_of(r, 0, &a);
  lp_sim_rank_stats_of(r, 1, &b);
  assert_near(a.busy, 6);
  assert_near(a.bubble, 9);
  assert_near(b.busy, 12);
  assert_near(b.bubble, 3);
  assert_near(lp_sim_max_bubble(r), 9);
  lp_sim_result_free(r);

  /* an override for a stage the schedule does not have is refused */
  lp_sim_times big[3];
  for (int k = 0; k < 3; k++)
    lp_sim_times_init(&big[k]);
  big[2].f = 1;
  c.stages = big;
  c.nstages = 3;
  char err[LP_ERRLEN];
  assert_int_equal(lp_sim_run(s, &c, &r, err), LP_ERR_ARG);
  assert_null(r);
  assert_non_null(strstr(err, "model stage 2"));
  lp_schedule_free(s);
}

static void resolve(const lp_sim_cost *c, int stage, double f, double b,
                    double i, double w) {
  lp_sim_times t;
  char err[LP_ERRLEN];
  lp_status st = lp_sim_cost_resolve(c, stage, &t, err);
  if (st != LP_OK) fail_msg("resolve: %s", err);
  assert_near(t.f, f);
  assert_near(t.b, b);
  assert_near(t.i, i);
  assert_near(t.w, w);
}

/* B = I + W when only some are given. */
static void test_b_equals_i_plus_w(void **state) {
  (void)state;
  lp_sim_cost c;
  lp_sim_cost_init(&c);
  resolve(&c, 0, 1, 2, 1, 1); /* nothing given */
  resolve(NULL, 0, 1, 2, 1, 1);
  c.t.b = 4;
  resolve(&c, 0, 1, 4, 2, 2); /* only B: I = W = B/2 */
  c.t.w = 1;
  resolve(&c, 0, 1, 4, 3, 1); /* B and W: I = B - W */
  c.t.w = LP_SIM_UNSET;
  c.t.i = 1.5;
  resolve(&c, 0, 1, 4, 1.5, 2.5); /* B and I: W = B - I */
  c.t.b = LP_SIM_UNSET;
  c.t.w = 0.5;
  resolve(&c, 0, 1, 2, 1.5, 0.5); /* I and W: B = I + W */
  c.t.w = LP_SIM_UNSET;
  resolve(&c, 0, 1, 3, 1.5, 1.5); /* only I: W = I */
  c.t.i = LP_SIM_UNSET;
  c.t.w = 2;
  c.t.f = 3;
  resolve(&c, 0, 3, 4, 2, 2); /* only W: I = W */

  /* overrides merge field by field, then derive */
  lp_sim_times ov[2];
  lp_sim_times_init(&ov[0]);
  lp_sim_times_init(&ov[1]);
  lp_sim_cost_init(&c);
  c.t.b = 2;
  ov[1].b = 6;
  c.stages = ov;
  c.nstages = 2;
  resolve(&c, 0, 1, 2, 1, 1);
  resolve(&c, 1, 1, 6, 3, 3);

  /* errors */
  lp_sim_times t;
  char err[LP_ERRLEN];
  lp_sim_cost_init(&c);
  c.t.b = 1;
  c.t.w = 2;
  assert_int_equal(lp_sim_cost_resolve(&c, 0, &t, err), LP_ERR_ARG);
  assert_non_null(strstr(err, "B = I + W"));
  lp_sim_cost_init(&c);
  c.t.f = -3;
  assert_int_equal(lp_sim_cost_resolve(&c, 0, &t, err), LP_ERR_ARG);
  assert_non_null(strstr(err, "F = -3"));

  /* the simulator uses the derived I and W: only B = 4 on F I W */
  lp_schedule *s = linear(1, 1);
  push(s, 0, "0F0");
  push(s, 0, "0I0");
  push(s, 0, "0W0");
  lp_sim_cost_init(&c);
  c.t.b = 4;
  lp_sim_result *r = run_ok(s, &c);
  check_event(r, 0, 1, "0I0", 1, 3);
  check_event(r, 0, 2, "0W0", 3, 5);
  lp_sim_rank_stats st;
  lp_sim_rank_stats_of(r, 0, &st);
  assert_int_equal(st.peak_pending_w, 1);
  assert_int_equal(st.peak_live, 1);
  int n;
  const lp_sim_sample *m = lp_sim_memory(r, 0, &n);
  /* t=0 live 1; t=3 live 0 pending 1; t=5 pending 0 */
  assert_int_equal(n, 3);
  assert_near(m[0].t, 0);
  assert_int_equal(m[0].live, 1);
  assert_near(m[1].t, 3);
  assert_int_equal(m[1].live, 0);
  assert_int_equal(m[1].pending_w, 1);
  assert_near(m[2].t, 5);
  assert_int_equal(m[2].pending_w, 0);
  lp_sim_result_free(r);
  lp_schedule_free(s);
}

/* Two ranks, one micro-batch, with explicit SEND/RECV: rank 0 runs
 * 0F0 0SEND_F0 0RECV_B0 0B0, rank 1 1RECV_F0 1F0 1B0 1SEND_B0. */
static lp_schedule *lowered_pair(void) {
  lp_schedule *s = linear(2, 1);
  const char *r0[] = {"0F0", "0SEND_F0", "0RECV_B0", "0B0"};
  const char *r1[] = {"1RECV_F0", "1F0", "1B0", "1SEND_B0"};
  for (int i = 0; i < 4; i++) {
    push(s, 0, "%s", r0[i]);
    push(s, 1, "%s", r1[i]);
  }
  return s;
}

/* SEND/RECV in a lowered schedule take no time; timings are unchanged. */
static void test_lowered_comm_ignored(void **state) {
  (void)state;
  lp_schedule *s = lowered_pair();
  lp_sim_cost c = cost_fb(1, 2);
  c.latency = 0.25;
  lp_sim_result *r = run_ok(s, &c);
  check_event(r, 0, 0, "0F0", 0, 1);
  check_event(r, 1, 1, "1F0", 1.25, 2.25);
  check_event(r, 1, 2, "1B0", 2.25, 4.25);
  check_event(r, 0, 3, "0B0", 4.5, 6.5);
  int n;
  lp_sim_events(r, &n);
  assert_int_equal(n, 4);
  lp_sim_messages(r, &n);
  assert_int_equal(n, 2);
  lp_sim_result_free(r);
  lp_schedule_free(s);
}

/* Per-action times: a set entry replaces that action's whole time, the
 * others keep the model's; the replay follows the dependencies (rank 1's
 * F waits for rank 0's longer F); an FB pair's time replaces the pair's;
 * a time on a SEND / RECV or a bad value is refused with the action named. */
static void test_action_times(void **state) {
  (void)state;
  lp_schedule *s = lowered_pair();
  lp_sim_cost c = cost_fb(1, 2);
  double t0[4] = {3, LP_SIM_UNSET, LP_SIM_UNSET, LP_SIM_UNSET};
  double t1[4] = {LP_SIM_UNSET, LP_SIM_UNSET, 0.5, LP_SIM_UNSET};
  const double *rows[2] = {t0, t1};
  c.durations = rows;
  c.nduration_ranks = 2;
  lp_sim_result *r = run_ok(s, &c);
  check_event(r, 0, 0, "0F0", 0, 3);
  check_event(r, 1, 1, "1F0", 3, 4);
  check_event(r, 1, 2, "1B0", 4, 4.5);
  check_event(r, 0, 3, "0B0", 4.5, 6.5);
  assert_near(lp_sim_makespan(r), 6.5);
  lp_sim_result_free(r);
  /* only rank 1 given (rank 0's row NULL): rank 0 keeps the model */
  rows[0] = NULL;
  r = run_ok(s, &c);
  check_event(r, 0, 0, "0F0", 0, 1);
  check_event(r, 1, 2, "1B0", 2, 2.5);
  lp_sim_result_free(r);
  char err[LP_ERRLEN];
  lp_sim_result *bad = NULL;
  t1[0] = 1; /* 1RECV_F0 */
  rows[0] = t0;
  assert_int_equal(lp_sim_run(s, &c, &bad, err), LP_ERR_ARG);
  assert_null(bad);
  assert_string_equal(err, "cost model: a time for rank 1, action 0 (1RECV_F0): only compute "
                      "actions (F, B, I, W, FB) take time");
  t1[0] = LP_SIM_UNSET;
  t0[3] = -2;
  assert_int_equal(lp_sim_run(s, &c, &bad, err), LP_ERR_ARG);
  assert_non_null(strstr(err, "rank 0, action 3 (0B0): time = -2 must be a number"));
  c.durations = NULL;
  assert_int_equal(lp_sim_run(s, &c, &bad, err), LP_ERR_ARG);
  assert_string_equal(err, "cost model: per-action times for 2 ranks given without an array");
  lp_schedule_free(s);
  /* an FB pair's given time is the pair's (exchanges included) */
  s = dualpipe_p2();
  lp_sim_cost d = cost_fb(1, 2);
  lp_sim_result *m = run_ok(s, &d);
  int n0 = 0, fb = -1;
  const lp_action *a0 = lp_schedule_actions(s, 0, &n0);
  for (int i = 0; i < n0 && fb < 0; i++)
    if (a0[i].type == LP_ACT_FB) fb = i;
  assert_true(fb >= 0);
  double *row = malloc((size_t)n0 * sizeof *row);
  for (int i = 0; i < n0; i++) row[i] = LP_SIM_UNSET;
  row[fb] = 10;
  const double *rows2[1] = {row};
  d.durations = rows2;
  d.nduration_ranks = 1;
  lp_sim_result *g = run_ok(s, &d);
  int ne;
  const lp_sim_event *ev = lp_sim_rank_events(g, 0, &ne);
  int found = 0;
  for (int i = 0; i < ne; i++)
    if (ev[i].index == fb) {
      assert_near(ev[i].end - ev[i].start, 10);
      found = 1;
    }
  assert_true(found);
  assert_true(lp_sim_makespan(g) > lp_sim_makespan(m));
  free(row);
  lp_sim_result_free(g);
  lp_sim_result_free(m);
  lp_schedule_free(s);
}

static int same_results(const lp_sim_result *a, const lp_sim_result *b) {
  int na, nb;
  const lp_sim_event *ea = lp_sim_events(a, &na), *eb = lp_sim_events(b, &nb);
  if (na != nb) return 0;
  for (int i = 0; i < na; i++)
    if (ea[i].rank != eb[i].rank || ea[i].index != eb[i].index ||
        ea[i].start != eb[i].start || ea[i].end != eb[i].end)
      return 0;
  const lp_sim_message *ma = lp_sim_messages(a, &na),
                       *mb = lp_sim_messages(b, &nb);
  if (na != nb) return 0;
  for (int i = 0; i < na; i++)
    if (ma[i].from != mb[i].from || ma[i].to != mb[i].to ||
        ma[i].sent != mb[i].sent || ma[i].arrived != mb[i].arrived ||
        strcmp(ma[i].text, mb[i].text) != 0)
      return 0;
  return lp_sim_makespan(a) == lp_sim_makespan(b);
}

static void test_determinism(void **state) {
  (void)state;
  lp_schedule *s = onef1b(4, 8);
  lp_sim_cost c = cost_fb(1.3, 2.7);
  c.latency = 0.37;
  lp_sim_result *a = run_ok(s, &c);
  for (int k = 0; k < 5; k++) {
    lp_sim_result *b = run_ok(s, &c);
    assert_true(same_results(a, b));
    lp_sim_result_free(b);
  }
  lp_schedule *d = dualpipe_p2();
  lp_sim_result *x = run_ok(d, &c), *y = run_ok(d, &c);
  assert_true(same_results(x, y));
  lp_sim_result_free(x);
  lp_sim_result_free(y);
  lp_schedule_free(d);
  lp_sim_result_free(a);
  lp_schedule_free(s);
}

/* A backward before its forward: refused with the validator's message
 * (or, while validation is incomplete, the simulator's own guard). */
static void test_invalid_refused(void **state) {
  (void)state;
  lp_schedule *s = linear(2, 1);
  push(s, 0, "0B0");
  push(s, 0, "0F0");
  push(s, 1, "1F0");
  push(s, 1, "1B0");
  lp_sim_result *r = (lp_sim_result *)&r; /* must be reset */
  char err[LP_ERRLEN];
  lp_status st = lp_sim_run(s, NULL, &r, err);
  assert_int_not_equal(st, LP_OK);
  assert_null(r);
  assert_non_null(strstr(err, "rank 0"));
  if (lp_schedule_validate(s) != LP_OK) {
    assert_int_equal(st, LP_ERR_INVALID);
    assert_string_equal(err, lp_schedule_last_error(s));
  } else {
    assert_int_equal(st, LP_ERR_INTERNAL);
    assert_non_null(strstr(err, "deadlocks"));
  }
  lp_schedule_free(s);

  /* a forward nobody computes */
  s = linear(2, 1);
  push(s, 0, "0F0");
  push(s, 0, "0B0");
  push(s, 1, "1B0");
  st = lp_sim_run(s, NULL, &r, err);
  assert_int_not_equal(st, LP_OK);
  assert_null(r);
  assert_non_null(strstr(err, "rank 1"));
  lp_schedule_free(s);

  /* a bad cost model */
  s = onef1b(2, 2);
  lp_sim_cost c;
  lp_sim_cost_init(&c);
  c.latency = -1;
  assert_int_equal(lp_sim_run(s, &c, &r, err), LP_ERR_ARG);
  assert_non_null(strstr(err, "latency"));
  lp_schedule_free(s);
}

/* ---- out of memory: every allocation may fail; nothing leaks ---- */

static void test_out_of_memory(void **state) {
  (void)state;
  lp_schedule *s = dualpipe_p2();
  lp_sim_cost c = cost_fb(1, 2);
  c.latency = 0.5;
  int ok = 0;
  for (long n = 0; n < 10000 && !ok; n++) {
    lp_sim_result *r = NULL;
    char err[LP_ERRLEN];
    lp_test_oom_arm(n, 1);
    lp_status st = lp_sim_run(s, &c, &r, err);
    if (st == LP_OK) {
      lp_sim_result_free(r);
      ok = 1;
    } else {
      assert_int_equal(st, LP_ERR_NOMEM);
      assert_null(r);
      assert_string_equal(err, "out of memory");
    }
    lp_test_oom_disarm();
    assert_int_equal(lp_test_oom_state.live, 0);
  }
  assert_true(ok);
  lp_schedule_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_1f1b_bubble),
      cmocka_unit_test(test_latency),
      cmocka_unit_test(test_fb_timing),
      cmocka_unit_test(test_exchanges),
      cmocka_unit_test(test_stage_overrides),
      cmocka_unit_test(test_b_equals_i_plus_w),
      cmocka_unit_test(test_lowered_comm_ignored),
      cmocka_unit_test(test_action_times),
      cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_invalid_refused),
      cmocka_unit_test(test_out_of_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
