/* lp_test_oom.h — out-of-memory injection for the C tests, through the
 * lp_set_allocator hook. Arm, run the call under test, disarm, assert:
 * lp_test_oom_arm(k, 0) makes only the k-th allocation from now (0-based)
 * fail; lp_test_oom_arm(k, 1) makes it and every later one fail. `live`
 * counts blocks not yet freed (0 after a clean failure), `failed` says
 * whether the failure point was reached (a loop over k = 0, 1, ... ends
 * once a call succeeds without reaching it). */
#pragma once

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
