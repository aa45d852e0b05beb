/* schedule_fixtures.h — schedules built by hand for the core/schedule tests
 * (1F1B, the DualPipe worked example of specs/dualpipe.md), a
 * space-separated push helper and a failing allocator for out-of-memory
 * tests. Include after cmocka.h. */
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_schedule.h"
#include "lp_test_oom.h"

/* Pushes the space-separated actions of `list` to rank; fails the test on
 * error (printing the schedule's message). */
static inline void fx_push(lp_schedule *s, int rank, const char *list) {
  char buf[8192];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *t = strtok(buf, " \n"); t; t = strtok(NULL, " \n")) {
    if (lp_schedule_push_text(s, rank, t) != LP_OK) {
      print_error("push '%s' to rank %d: %s\n", t, rank, lp_schedule_last_error(s));
      fail();
    }
  }
}

/* A schedule with model stage r on rank r (vstage r) and route 0..P-1 for
 * every micro-batch; no actions. */
static inline lp_schedule *fx_linear(int P, int M) {
  lp_schedule *s;
  assert_int_equal(lp_schedule_new(P, P, M, &s), LP_OK);
  int *route = malloc((size_t)P * sizeof *route);
  for (int r = 0; r < P; r++) {
    assert_int_equal(lp_schedule_add_vstage(s, r, r, NULL), LP_OK);
    route[r] = r;
  }
  for (int m = 0; m < M; m++) assert_int_equal(lp_schedule_set_route(s, m, route, P), LP_OK);
  free(route);
  return s;
}

static inline void fx_push_action(lp_schedule *s, int rank, int type, int v, int mb) {
  lp_action a = {type, v, mb, -1, -1, -1};
  assert_int_equal(lp_schedule_push(s, rank, &a), LP_OK);
}

/* 1F1B on P ranks, M micro-batches: rank r runs min(P-1-r, M) warm-up
 * forwards, then alternates F and backward, then the cool-down backwards.
 * With split, each backward is an I immediately followed by its W. */
static inline lp_schedule *fx_1f1b(int P, int M, int split) {
  lp_schedule *s = fx_linear(P, M);
  for (int r = 0; r < P; r++) {
    int w = P - 1 - r < M ? P - 1 - r : M, f = 0, b = 0;
    while (f < w) fx_push_action(s, r, LP_ACT_F, r, f++);
    while (f < M || b < M) {
      if (f < M) fx_push_action(s, r, LP_ACT_F, r, f++);
      if (split) {
        fx_push_action(s, r, LP_ACT_I, r, b);
        fx_push_action(s, r, LP_ACT_W, r, b++);
      } else {
        fx_push_action(s, r, LP_ACT_B, r, b++);
      }
    }
  }
  return s;
}

/* The DualPipe P = 4, M = 8 example of specs/dualpipe.md. Vstage v < 4 is
 * model stage v on rank v; vstage 4 + s is model stage s on rank 3 - s.
 * Ranks 3 and 2 mirror ranks 0 and 1: vstage v -> (v + 4) % 8, micro-batch
 * m -> (m + 4) % 8. */
static const char *const fx_dp_rank0 =
    "0F0 0F1 0F2 7F4 7I4 7W4 7F5 (0F3;7B5)OVERLAP_F_B (7F6;0B0)OVERLAP_F_B "
    "7B6 (7F7;0B1)OVERLAP_F_B 7B7 0I2 0W2 0I3 0W3";
static const char *const fx_dp_rank1 =
    "1F0 6F4 1F1 6F5 1F2 6B4 (6F6;1B0)OVERLAP_F_B (1F3;6B5)OVERLAP_F_B "
    "(6F7;1B1)OVERLAP_F_B 6B6 1B2 6I7 1I3 6W7 1W3";

static inline void fx_push_mirror(lp_schedule *s, int rank, const lp_schedule *src,
                                  int from) {
  int n;
  const lp_action *a = lp_schedule_actions(src, from, &n);
  for (int i = 0; i < n; i++) {
    lp_action b = a[i];
    b.stage = (b.stage + 4) % 8;
    b.mb = (b.mb + 4) % 8;
    if (b.type == LP_ACT_FB) {
      b.bstage = (b.bstage + 4) % 8;
      b.bmb = (b.bmb + 4) % 8;
    }
    assert_int_equal(lp_schedule_push(s, rank, &b), LP_OK);
  }
}

static inline lp_schedule *fx_dualpipe(void) {
  lp_schedule *s;
  assert_int_equal(lp_schedule_new(4, 4, 8, &s), LP_OK);
  lp_schedule_set_name(s, "dualpipe");
  for (int v = 0; v < 4; v++) assert_int_equal(lp_schedule_add_vstage(s, v, v, NULL), LP_OK);
  for (int st = 0; st < 4; st++)
    assert_int_equal(lp_schedule_add_vstage(s, st, 3 - st, NULL), LP_OK);
  int down[4] = {0, 1, 2, 3}, up[4] = {4, 5, 6, 7};
  for (int m = 0; m < 8; m++)
    assert_int_equal(lp_schedule_set_route(s, m, m < 4 ? down : up, 4), LP_OK);
  fx_push(s, 0, fx_dp_rank0);
  fx_push(s, 1, fx_dp_rank1);
  fx_push_mirror(s, 2, s, 1);
  fx_push_mirror(s, 3, s, 0);
  return s;
}

/* Two schedules are equal: same counts, placement, routes and actions. */
static inline void fx_assert_same(const lp_schedule *a, const lp_schedule *b) {
  assert_int_equal(lp_schedule_ranks(a), lp_schedule_ranks(b));
  assert_int_equal(lp_schedule_stages(a), lp_schedule_stages(b));
  assert_int_equal(lp_schedule_microbatches(a), lp_schedule_microbatches(b));
  assert_int_equal(lp_schedule_vstages(a), lp_schedule_vstages(b));
  for (int v = 0; v < lp_schedule_vstages(a); v++) {
    assert_int_equal(lp_schedule_vstage_stage(a, v), lp_schedule_vstage_stage(b, v));
    assert_int_equal(lp_schedule_vstage_rank(a, v), lp_schedule_vstage_rank(b, v));
  }
  for (int m = 0; m < lp_schedule_microbatches(a); m++) {
    int na, nb;
    const int *ra = lp_schedule_route(a, m, &na), *rb = lp_schedule_route(b, m, &nb);
    assert_int_equal(na, nb);
    if (na) assert_memory_equal(ra, rb, (size_t)na * sizeof *ra);
  }
  for (int r = 0; r < lp_schedule_ranks(a); r++) {
    int na, nb;
    const lp_action *xa = lp_schedule_actions(a, r, &na), *xb = lp_schedule_actions(b, r, &nb);
    assert_int_equal(na, nb);
    for (int i = 0; i < na; i++) {
      char ta[LP_ACTION_TEXT_MAX], tb[LP_ACTION_TEXT_MAX];
      lp_action_format(&xa[i], ta, sizeof ta);
      lp_action_format(&xb[i], tb, sizeof tb);
      assert_string_equal(ta, tb);
    }
  }
}

