/* lp_test_oom.h — out-of-memory injection for the C tests, through the
 * lp_set_allocator hook. Arm, run the call under test, disarm, assert:
 * lp_test_oom_arm(k, 0) makes only the k-th allocation from now (0-based)
 * fail; lp_test_oom_arm(k, 1) makes it and every later one fail. `live`
 * counts blocks not yet freed (0 after a clean failure), `failed` says
 * whether the failure point was reached (a loop over k = 0, 1, ... ends
 * once a call succeeds without reaching it). */
#pragma once

#include <stdio.h>
#include <stdlib.h>

#include "lp_base.h"

typedef struct lp_test_oom {
  long countdown; /* allocations left before the failing one; < 0: none */
  int sticky;     /* every allocation after the k-th fails too */
  int failed;     /* the failing allocation happened */
  long live;      /* blocks allocated and not yet freed */
} lp_test_oom;

static lp_test_oom lp_test_oom_state;

static inline void *lp_test_oom_alloc(void *ud, void *ptr, size_t size) {
  lp_test_oom *o = ud;
  if (size == 0) {
    if (ptr) o->live--;
    free(ptr);
    return NULL;
  }
  if (o->countdown == 0) {
    o->failed = 1;
    if (!o->sticky) o->countdown = -1;
    return NULL;
  }
  if (o->countdown > 0) o->countdown--;
  void *p = realloc(ptr, size);
  if (p && !ptr) o->live++;
  return p;
}

static inline void lp_test_oom_arm(long k, int sticky) {
  lp_test_oom_state = (lp_test_oom){k, sticky, 0, 0};
  lp_set_allocator(lp_test_oom_alloc, &lp_test_oom_state);
}

static inline void lp_test_oom_disarm(void) { lp_set_allocator(NULL, NULL); }

/* Runs scenario() with allocation k = 0, 1, 2, ... failing (alone) until it
 * succeeds; asserts (cmocka) that every failure returns LP_ERR_NOMEM and
 * leaks nothing, and that it ends within max_points. Returns the number of
 * failure points. Include cmocka.h first. */
static inline int lp_test_oom_points(lp_status (*scenario)(void), long max_points) {
  int failures = 0;
  for (long k = 0;; k++) {
    lp_test_oom_arm(k, 0);
    lp_status st = scenario();
    lp_test_oom_disarm();
    long live = lp_test_oom_state.live;
    if (live != 0) printf("  leak: %ld blocks when failing allocation %ld\n", live, k);
    assert_int_equal(live, 0);
    if (st == LP_OK) return failures;
    if (st != LP_ERR_NOMEM) printf("  allocation %ld: status %d\n", k, (int)st);
    assert_int_equal(st, LP_ERR_NOMEM);
    failures++;
    assert_true(k < max_points);
  }
}
