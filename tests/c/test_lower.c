/* test_lower.c — lp_schedule_lower (SEND/RECV insertion by one global
 * order) on 1F1B, the DualPipe worked example and a V placement with a
 * same-rank turnaround; error paths and out-of-memory; and
 * lp_schedule_memory_of. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "schedule_fixtures.h"

static lp_schedule *lower_ok(lp_schedule *s) {
  lp_schedule *low = NULL;
  lp_status st = lp_schedule_lower(s, &low);
  if (st != LP_OK) print_error("lower: %s\n", lp_schedule_last_error(s));
  assert_int_equal(st, LP_OK);
  assert_non_null(low);
  assert_true(lp_schedule_has_comm(low) || lp_schedule_ranks(s) == 1);
  assert_int_equal(lp_schedule_validate(low), LP_OK);
  return low;
}

/* Rank r's actions as space-separated text (static buffer). */
static const char *rank_text(const lp_schedule *s, int r) {
  static char buf[16384];
  int n;
  const lp_action *a = lp_schedule_actions(s, r, &n);
  buf[0] = '\0';
  for (int i = 0; i < n; i++) {
    char t[LP_ACTION_TEXT_MAX];
    lp_action_format(&a[i], t, sizeof t);
    if (i) strcat(buf, " ");
    strcat(buf, t);
  }
  return buf;
}

/* Route position of v for mb (the test's own lookup). */
static int pos_of(const lp_schedule *s, int v, int mb) {
  int n;
  const int *route = lp_schedule_route(s, mb, &n);
  for (int k = 0; k < n; k++)
    if (route[k] == v) return k;
  return -1;
}

/* Checks, independently of validate: compute sequences are unchanged;
 * every message crosses ranks between route neighbours; and for each pair
 * of ranks the k-th send carries the same message as the k-th receive.
 * Returns the number of messages. */
static int check_lowered(const lp_schedule *s, const lp_schedule *low) {
  int P = lp_schedule_ranks(s), msgs = 0;
  for (int r = 0; r < P; r++) {
    int na, nb, j = 0;
    const lp_action *a = lp_schedule_actions(s, r, &na), *b = lp_schedule_actions(low, r, &nb);
    for (int i = 0; i < nb; i++)
      if (lp_action_is_compute(b[i].type) || b[i].type == LP_ACT_REDUCE_GRAD) {
        assert_true(j < na);
        assert_memory_equal(&a[j], &b[i], sizeof *a);
        j++;
      }
    assert_int_equal(j, na);
  }
  /* message key: (dir, mb, sending vstage); for each pair a list in order */
  for (int x = 0; x < P; x++) {
    for (int y = 0; y < P; y++) {
      int sends[4096], recvs[4096], ns = 0, nr = 0;
      int n;
      const lp_action *a = lp_schedule_actions(low, x, &n);
      for (int i = 0; i < n; i++) {
        int t = a[i].type;
        if (t != LP_ACT_SEND_F && t != LP_ACT_SEND_B) continue;
        int S, k = pos_of(low, a[i].stage, a[i].mb);
        const int *route = lp_schedule_route(low, a[i].mb, &S);
        int to = route[t == LP_ACT_SEND_F ? k + 1 : k - 1];
        assert_int_not_equal(lp_schedule_vstage_rank(low, to), x);
        if (lp_schedule_vstage_rank(low, to) != y) continue;
        sends[ns++] = (t == LP_ACT_SEND_B) * 1000000 + a[i].mb * 1000 + a[i].stage;
      }
      const lp_action *b = lp_schedule_actions(low, y, &n);
      for (int i = 0; i < n; i++) {
        int t = b[i].type;
        if (t != LP_ACT_RECV_F && t != LP_ACT_RECV_B) continue;
        int S, k = pos_of(low, b[i].stage, b[i].mb);
        const int *route = lp_schedule_route(low, b[i].mb, &S);
        int from = route[t == LP_ACT_RECV_F ? k - 1 : k + 1];
        assert_int_not_equal(lp_schedule_vstage_rank(low, from), y);
        if (lp_schedule_vstage_rank(low, from) != x) continue;
        recvs[nr++] = (t == LP_ACT_RECV_B) * 1000000 + b[i].mb * 1000 + from;
      }
      assert_int_equal(ns, nr);
      for (int i = 0; i < ns; i++) assert_int_equal(sends[i], recvs[i]);
      msgs += ns;
    }
  }
  return msgs;
}

static void test_lower_1f1b(void **state) {
  (void)state;
  lp_schedule *s = fx_1f1b(2, 2, 0);
  lp_schedule *low = lower_ok(s);
  assert_string_equal(rank_text(low, 0),
                      "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1");
  assert_string_equal(rank_text(low, 1),
                      "1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1B1 1SEND_B1");
  lp_schedule_free(low);
  lp_schedule_free(s);

  s = fx_1f1b(4, 8, 0);
  lp_schedule_set_name(s, "1f1b");
  low = lower_ok(s);
  assert_string_equal(lp_schedule_name(low), "1f1b");
  assert_int_equal(check_lowered(s, low), 2 * 8 * 3);
  /* rank 0 sends every forward output and receives every gradient */
  int n;
  const lp_action *a = lp_schedule_actions(low, 0, &n);
  assert_int_equal(n, 8 * 4);
  assert_int_equal(a[0].type, LP_ACT_F);
  assert_int_equal(a[1].type, LP_ACT_SEND_F);
  lp_schedule_free(low);
  lp_schedule_free(s);

  s = fx_1f1b(4, 8, 1); /* with I/W: W needs no message */
  low = lower_ok(s);
  assert_int_equal(check_lowered(s, low), 2 * 8 * 3);
  lp_schedule_free(low);
  lp_schedule_free(s);
}

static void test_lower_dualpipe(void **state) {
  (void)state;
  lp_schedule *s = fx_dualpipe();
  fx_push(s, 0, "0REDUCE_GRAD 7REDUCE_GRAD");
  lp_schedule *low = lower_ok(s);
  /* 8 micro-batches, 3 cross-rank hops each way */
  assert_int_equal(check_lowered(s, low), 8 * 3 * 2);
  assert_string_equal(
      rank_text(low, 0),
      "0F0 0SEND_F0 0F1 0SEND_F1 0F2 0SEND_F2 7RECV_F4 7F4 7I4 7SEND_B4 7RECV_F5 7W4 "
      "7F5 (0F3;7B5)OVERLAP_F_B 0SEND_F3 7SEND_B5 7RECV_F6 0RECV_B0 "
      "(7F6;0B0)OVERLAP_F_B 7B6 7SEND_B6 7RECV_F7 0RECV_B1 (7F7;0B1)OVERLAP_F_B 7B7 "
      "7SEND_B7 0RECV_B2 0I2 0W2 0RECV_B3 0I3 0W3 0REDUCE_GRAD 7REDUCE_GRAD");
  /* lowering a lowered schedule is refused */
  lp_schedule *again = (lp_schedule *)1;
  assert_int_equal(lp_schedule_lower(low, &again), LP_ERR_INVALID);
  assert_null(again);
  assert_string_equal(lp_schedule_last_error(low),
                      "schedule is already lowered (it has SEND/RECV actions)");
  lp_schedule_free(low);
  lp_schedule_free(s);
}

static void test_lower_same_rank_neighbours(void **state) {
  (void)state;
  /* a V: vstages 0 and 3 on rank 0, 1 and 2 on rank 1 (turnaround 1 -> 2) */
  lp_schedule *s;
  assert_int_equal(lp_schedule_new(2, 4, 2, &s), LP_OK);
  int place[4] = {0, 1, 1, 0}, route[4] = {0, 1, 2, 3};
  for (int v = 0; v < 4; v++) assert_int_equal(lp_schedule_add_vstage(s, v, place[v], NULL), LP_OK);
  for (int m = 0; m < 2; m++) assert_int_equal(lp_schedule_set_route(s, m, route, 4), LP_OK);
  fx_push(s, 0, "0F0 0F1 3F0 3B0 3F1 3B1 0B0 0B1");
  fx_push(s, 1, "1F0 2F0 1F1 2F1 2B0 1B0 2B1 1B1");
  lp_schedule *low = lower_ok(s);
  /* hops 0->1 and 2->3 cross ranks, 1->2 does not */
  assert_int_equal(check_lowered(s, low), 2 * 2 * 2);
  assert_null(strstr(rank_text(low, 1), "1SEND_F"));
  assert_null(strstr(rank_text(low, 1), "2RECV_F"));
  assert_null(strstr(rank_text(low, 1), "2SEND_B"));
  assert_null(strstr(rank_text(low, 1), "1RECV_B"));
  lp_schedule_free(low);
  lp_schedule_free(s);

  /* one rank: nothing to send */
  assert_int_equal(lp_schedule_new(1, 2, 1, &s), LP_OK);
  assert_int_equal(lp_schedule_add_vstage(s, 0, 0, NULL), LP_OK);
  assert_int_equal(lp_schedule_add_vstage(s, 1, 0, NULL), LP_OK);
  assert_int_equal(lp_schedule_set_route(s, 0, (int[]){0, 1}, 2), LP_OK);
  fx_push(s, 0, "0F0 1F0 1B0 0B0");
  low = lower_ok(s);
  assert_string_equal(rank_text(low, 0), "0F0 1F0 1B0 0B0");
  lp_schedule_free(low);
  lp_schedule_free(s);
}

static void test_lower_errors(void **state) {
  (void)state;
  lp_schedule *s = fx_linear(2, 2), *low = (lp_schedule *)1;
  fx_push(s, 0, "0F0 0B0 0F1 0B1");
  fx_push(s, 1, "1F1 1B1 1F0 1B0");
  assert_int_equal(lp_schedule_lower(s, &low), LP_ERR_INVALID);
  assert_null(low);
  assert_string_equal(lp_schedule_last_error(s),
                      "deadlock: rank 0 waits at action 1 (0B0) for the backward of "
                      "micro-batch 0 on stage 1 (rank 1, action 3); rank 1 waits at action 0 "
                      "(1F1) for the forward of micro-batch 1 on stage 0 (rank 0, action 2)");
  lp_schedule_free(s);

  s = fx_linear(2, 1);
  fx_push(s, 0, "0B0 0F0");
  fx_push(s, 1, "1F0 1B0");
  assert_int_equal(lp_schedule_lower(s, &low), LP_ERR_INVALID);
  assert_null(low);
  assert_string_equal(lp_schedule_last_error(s), "rank 0, action 0 (0B0): backward of "
                                                 "micro-batch 0 on stage 0 comes before its "
                                                 "forward");
  lp_schedule_free(s);
}

static void test_lower_out_of_memory(void **state) {
  (void)state;
  lp_schedule *s = fx_dualpipe();
  lp_schedule *want = lower_ok(s);
  long fails = 0;
  for (long k = 0;; k++) {
    lp_schedule *low = (lp_schedule *)1;
    lp_test_oom_arm(k, 0);
    lp_status st = lp_schedule_lower(s, &low);
    int failed = lp_test_oom_state.failed;
    if (st == LP_OK) {
      fx_assert_same(want, low);
    } else {
      assert_int_equal(st, LP_ERR_NOMEM);
      assert_null(low);
      assert_string_equal(lp_schedule_last_error(s), "out of memory");
    }
    lp_schedule_free(low);
    long live = lp_test_oom_state.live;
    lp_test_oom_disarm();
    assert_int_equal(live, 0);
    if (!failed) break;
    fails++;
  }
  assert_true(fails > 20);
  lp_schedule_free(want);
  lp_schedule_free(s);
}

static void test_memory(void **state) {
  (void)state;
  lp_schedule_memory m;
  lp_schedule *s = fx_1f1b(4, 8, 0);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(lp_schedule_memory_of(s, r, &m), LP_OK);
    assert_int_equal(m.peak_live, 4 - r); /* rank 0: min(P, M) */
    assert_int_equal(m.peak_pending_w, 0);
    assert_int_equal(m.peak_total, 4 - r);
    assert_int_equal(m.param_stages, 1);
  }
  assert_int_equal(lp_schedule_memory_of(s, 4, &m), LP_ERR_ARG);
  assert_int_equal(lp_schedule_memory_of(s, -1, &m), LP_ERR_ARG);
  lp_schedule_free(s);

  s = fx_1f1b(8, 3, 0); /* fewer micro-batches than ranks */
  assert_int_equal(lp_schedule_memory_of(s, 0, &m), LP_OK);
  assert_int_equal(m.peak_live, 3);
  lp_schedule_free(s);

  s = fx_dualpipe();
  lp_schedule *low = lower_ok(s);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(lp_schedule_memory_of(s, r, &m), LP_OK);
    assert_int_equal(m.peak_live, 4 + 1); /* P + 1 on every rank */
    assert_int_equal(m.param_stages, 2);
    lp_schedule_memory ml;
    assert_int_equal(lp_schedule_memory_of(low, r, &ml), LP_OK);
    assert_memory_equal(&m, &ml, sizeof m); /* messages do not count */
  }
  /* rank 0 walk: ... 7F4 (4 live) 7I4 (3 live, 1 pending) 7W4 ... */
  assert_int_equal(lp_schedule_memory_of(s, 0, &m), LP_OK);
  assert_int_equal(m.peak_pending_w, 1);
  assert_int_equal(m.peak_total, 5);
  lp_schedule_free(low);
  lp_schedule_free(s);

  /* deferred weight-grads pile up; an FB counts its F half first */
  s = fx_linear(1, 3);
  fx_push(s, 0, "0F0 (0F1;0I0)OVERLAP_F_B 0F2 0I1 0I2 0W0 0W1 0W2");
  assert_int_equal(lp_schedule_memory_of(s, 0, &m), LP_OK);
  assert_int_equal(m.peak_live, 2);
  assert_int_equal(m.peak_pending_w, 3);
  assert_int_equal(m.peak_total, 3);
  assert_int_equal(m.param_stages, 1);
  lp_schedule_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lower_1f1b),
      cmocka_unit_test(test_lower_dualpipe),
      cmocka_unit_test(test_lower_same_rank_neighbours),
      cmocka_unit_test(test_lower_errors),
      cmocka_unit_test(test_lower_out_of_memory),
      cmocka_unit_test(test_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
