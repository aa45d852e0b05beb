/* test_validate.c — lp_schedule_validate: every error message (structure,
 * per-rank order, deadlock, SEND/RECV placement and order, rendezvous
 * deadlock, REDUCE_GRAD), valid families, a seeded randomized comparison
 * with a naive oracle, a large schedule's speed, and out-of-memory paths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "schedule_fixtures.h"

static void expect_valid(lp_schedule *s) {
  lp_status st = lp_schedule_validate(s);
  if (st != LP_OK) print_error("unexpected: %s\n", lp_schedule_last_error(s));
  assert_int_equal(st, LP_OK);
  assert_string_equal(lp_schedule_last_error(s), "");
}

/* Validation fails with exactly `msg`; frees s. */
static void expect_invalid(lp_schedule *s, const char *msg) {
  assert_int_equal(lp_schedule_validate(s), LP_ERR_INVALID);
  if (strcmp(lp_schedule_last_error(s), msg) != 0)
    print_error("got:  %s\nwant: %s\n", lp_schedule_last_error(s), msg);
  assert_string_equal(lp_schedule_last_error(s), msg);
  lp_schedule_free(s);
}

/* P ranks / vstages, one micro-batch per list entry; lists[r] for rank r. */
static lp_schedule *linear(int P, int M, const char *const *lists) {
  lp_schedule *s = fx_linear(P, M);
  for (int r = 0; r < P; r++) fx_push(s, r, lists[r]);
  return s;
}

/* One rank holding `S` consecutive stages (vstage k = stage k), M mbs. */
static lp_schedule *one_rank(int S, int M, const char *list) {
  lp_schedule *s;
  assert_int_equal(lp_schedule_new(1, S, M, &s), LP_OK);
  int route[16];
  for (int k = 0; k < S; k++) {
    assert_int_equal(lp_schedule_add_vstage(s, k, 0, NULL), LP_OK);
    route[k] = k;
  }
  for (int m = 0; m < M; m++) assert_int_equal(lp_schedule_set_route(s, m, route, S), LP_OK);
  fx_push(s, 0, list);
  return s;
}

/* ---- valid schedules ---- */

static void test_valid(void **state) {
  (void)state;
  lp_schedule *s = fx_1f1b(4, 8, 0);
  expect_valid(s);
  lp_schedule_free(s);
  s = fx_1f1b(4, 8, 1);
  expect_valid(s);
  lp_schedule_free(s);
  s = fx_1f1b(3, 1, 0);
  expect_valid(s);
  lp_schedule_free(s);
  s = fx_dualpipe();
  expect_valid(s);
  fx_push(s, 0, "0REDUCE_GRAD 7REDUCE_GRAD");
  expect_valid(s);
  lp_schedule_free(s);
  /* the example in the task: 0B0 on rank 0 waits for 1B0 on rank 1 */
  s = linear(2, 1, (const char *const[]){"0F0 0B0", "1F0 1B0"});
  expect_valid(s);
  lp_schedule_free(s);
  /* a V: stages 0 and 3 on rank 0, 1 and 2 on rank 1 (turnaround on rank 1) */
  assert_int_equal(lp_schedule_new(2, 4, 2, &s), LP_OK);
  int place[4] = {0, 1, 1, 0}, route[4] = {0, 1, 2, 3};
  for (int v = 0; v < 4; v++) assert_int_equal(lp_schedule_add_vstage(s, v, place[v], NULL), LP_OK);
  for (int m = 0; m < 2; m++) assert_int_equal(lp_schedule_set_route(s, m, route, 4), LP_OK);
  fx_push(s, 0, "0F0 0F1 3F0 3B0 3F1 3B1 0B0 0B1");
  fx_push(s, 1, "1F0 2F0 1F1 2F1 2B0 1B0 2B1 1B1");
  expect_valid(s);
  lp_schedule_free(s);
}

/* ---- a) b) structure ---- */

static void test_structure_errors(void **state) {
  (void)state;
  lp_schedule *s;
  assert_int_equal(lp_schedule_new(2, 2, 2, &s), LP_OK);
  assert_int_equal(lp_schedule_add_vstage(s, 0, 0, NULL), LP_OK);
  assert_int_equal(lp_schedule_add_vstage(s, 1, 1, NULL), LP_OK);
  assert_int_equal(lp_schedule_set_route(s, 0, (int[]){0, 1}, 2), LP_OK);
  expect_invalid(s, "micro-batch 1 has no route");

  s = fx_dualpipe();
  fx_push(s, 0, "0F5");
  expect_invalid(s, "rank 0, action 16 (0F5): stage 0 is not on the route of micro-batch 5");

  const char *r1 = "1F0 1B0";
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0F0 0B0", r1}),
                 "rank 0, action 1 (0F0): micro-batch 0 is forwarded twice on stage 0 "
                 "(first at rank 0, action 0)");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0B0 0I0", r1}),
                 "rank 0, action 2 (0I0): micro-batch 0 is backwarded twice on stage 0 "
                 "(first at rank 0, action 1)");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 (0F0;0B0)OVERLAP_F_B", r1}),
                 "rank 0, action 1 ((0F0;0B0)OVERLAP_F_B): micro-batch 0 is forwarded "
                 "twice on stage 0 (first at rank 0, action 0)");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0I0 0W0 0W0", r1}),
                 "rank 0, action 3 (0W0): weight-grad of micro-batch 0 on stage 0 appears "
                 "twice (first at rank 0, action 2)");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0B0", "1B0"}),
                 "micro-batch 0 is never forwarded on stage 1 (rank 1)");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0B0", "1F0"}),
                 "micro-batch 0 is never backwarded on stage 1 (rank 1)");
  expect_invalid(linear(2, 2, (const char *const[]){"0F0 0B0 0F1 0B1", "1F0 1B0 1F1"}),
                 "micro-batch 1 is never backwarded on stage 1 (rank 1)");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0B0 0W0", r1}),
                 "rank 0, action 2 (0W0): weight-grad of micro-batch 0 on stage 0 without "
                 "an input-grad (I)");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0I0", r1}),
                 "stage 0, micro-batch 0: I without its W (rank 0, action 1)");
}

/* ---- c) f) order on one rank ---- */

static void test_order_errors(void **state) {
  (void)state;
  expect_invalid(linear(2, 1, (const char *const[]){"0B0 0F0", "1F0 1B0"}),
                 "rank 0, action 0 (0B0): backward of micro-batch 0 on stage 0 comes "
                 "before its forward");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0W0 0I0", "1F0 1B0"}),
                 "rank 0, action 1 (0W0): weight-grad of micro-batch 0 on stage 0 comes "
                 "before its input-grad");
  expect_invalid(one_rank(2, 1, "1F0 0F0 1B0 0B0"),
                 "rank 0, action 0 (1F0): forward of micro-batch 0 on stage 1 comes before "
                 "the forward on upstream stage 0");
  expect_invalid(one_rank(2, 1, "0F0 1F0 0B0 1B0"),
                 "rank 0, action 2 (0B0): backward of micro-batch 0 on stage 0 comes before "
                 "the backward on downstream stage 1");
  expect_invalid(one_rank(2, 1, "0F0 1F0 0I0 1B0 0W0"),
                 "rank 0, action 2 (0I0): backward of micro-batch 0 on stage 0 comes before "
                 "the backward on downstream stage 1");
  expect_invalid(one_rank(1, 1, "(0F0;0B0)OVERLAP_F_B"),
                 "rank 0, action 0 ((0F0;0B0)OVERLAP_F_B): the two halves depend on each "
                 "other");
  /* a legitimate pair: forward of mb 1 with backward of mb 0 */
  lp_schedule *s = one_rank(1, 2, "0F0 (0F1;0B0)OVERLAP_F_B 0B1");
  expect_valid(s);
  lp_schedule_free(s);
  /* REDUCE_GRAD must follow the last backward work of its stage */
  expect_invalid(one_rank(1, 2, "0F0 0I0 0F1 0B1 0REDUCE_GRAD 0W0"),
                 "rank 0, action 4 (0REDUCE_GRAD): gradients of stage 0 are reduced before "
                 "its last weight-grad (action 5)");
  expect_invalid(one_rank(1, 2, "0F0 0B0 0REDUCE_GRAD 0F1 0B1"),
                 "rank 0, action 2 (0REDUCE_GRAD): gradients of stage 0 are reduced before "
                 "its last weight-grad (action 4)");
  s = one_rank(1, 2, "0REDUCE_GRAD 0F0 0I0 0F1 0B1 0W0 0REDUCE_GRAD");
  assert_int_equal(lp_schedule_validate(s), LP_ERR_INVALID);
  assert_string_equal(lp_schedule_last_error(s),
                      "rank 0, action 0 (0REDUCE_GRAD): gradients of stage 0 are reduced "
                      "before its last weight-grad (action 5)");
  lp_schedule_clear_rank(s, 0);
  fx_push(s, 0, "0F0 0I0 0F1 0B1 0W0 0REDUCE_GRAD");
  expect_valid(s);
  lp_schedule_free(s);
}

/* ---- d) deadlock ---- */

static void test_deadlock(void **state) {
  (void)state;
  expect_invalid(linear(2, 2, (const char *const[]){"0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0"}),
                 "deadlock: rank 0 waits at action 1 (0B0) for the backward of micro-batch 0 "
                 "on stage 1 (rank 1, action 3); rank 1 waits at action 0 (1F1) for the "
                 "forward of micro-batch 1 on stage 0 (rank 0, action 2)");
  /* five stuck ranks: three are shown */
  const char *l[5] = {"0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0", "2F1 2B1 2F0 2B0",
                      "3F1 3B1 3F0 3B0", "4F1 4B1 4F0 4B0"};
  expect_invalid(linear(5, 2, l),
                 "deadlock: rank 0 waits at action 1 (0B0) for the backward of micro-batch 0 "
                 "on stage 1 (rank 1, action 3); rank 1 waits at action 0 (1F1) for the "
                 "forward of micro-batch 1 on stage 0 (rank 0, action 2); rank 2 waits at "
                 "action 0 (2F1) for the forward of micro-batch 1 on stage 1 (rank 1, action "
                 "0); and 2 more ranks");
  /* an overlapped pair whose backward half needs its own F half indirectly */
  expect_invalid(linear(2, 1, (const char *const[]){"(0F0;0B0)OVERLAP_F_B", "1F0 1B0"}),
                 "rank 0, action 0 ((0F0;0B0)OVERLAP_F_B): the two halves depend on each "
                 "other");
  lp_schedule *s;
  assert_int_equal(lp_schedule_new(2, 2, 2, &s), LP_OK);
  assert_int_equal(lp_schedule_add_vstage(s, 0, 0, NULL), LP_OK);
  assert_int_equal(lp_schedule_add_vstage(s, 1, 1, NULL), LP_OK);
  for (int m = 0; m < 2; m++)
    assert_int_equal(lp_schedule_set_route(s, m, (int[]){0, 1}, 2), LP_OK);
  fx_push(s, 0, "0F0 (0F1;0B0)OVERLAP_F_B 0B1");
  fx_push(s, 1, "1F0 1F1 1B1 1B0");
  expect_invalid(s, "deadlock: rank 0 waits at action 1 ((0F1;0B0)OVERLAP_F_B) for the "
                    "backward of micro-batch 0 on stage 1 (rank 1, action 3); rank 1 waits "
                    "at action 1 (1F1) for the forward of micro-batch 1 on stage 0 (rank 0, "
                    "action 1)");
}

/* ---- e) lowered schedules ---- */

static const char *const low0 = "0F0 0SEND_F0 0RECV_B0 0B0";
static const char *const low1 = "1RECV_F0 1F0 1B0 1SEND_B0";

static void test_comm_errors(void **state) {
  (void)state;
  lp_schedule *s = linear(2, 1, (const char *const[]){low0, low1});
  expect_valid(s);
  lp_schedule_free(s);

  expect_invalid(linear(2, 1, (const char *const[]){low0, "1F0 1B0 1SEND_B0"}),
                 "rank 1, action 0 (1F0): forward of micro-batch 0 on stage 1 needs its "
                 "input from stage 0 on rank 0, but rank 1 never receives it (no 1RECV_F0)");
  expect_invalid(linear(2, 1, (const char *const[]){low0, "1F0 1RECV_F0 1B0 1SEND_B0"}),
                 "rank 1, action 0 (1F0): forward of micro-batch 0 on stage 1 comes before "
                 "its receive 1RECV_F0 (action 1)");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0RECV_B0 0B0", low1}),
                 "rank 0, action 0 (0F0): the forward output of micro-batch 0 on stage 0 is "
                 "never sent to stage 1 on rank 1 (no 0SEND_F0)");
  expect_invalid(linear(2, 1, (const char *const[]){"0SEND_F0 0F0 0RECV_B0 0B0", low1}),
                 "rank 0, action 0 (0SEND_F0): sends the forward output of micro-batch 0 on "
                 "stage 0 before computing it (action 1)");
  expect_invalid(linear(2, 1, (const char *const[]){low0, "1RECV_F0 1F0 1SEND_B0 1B0"}),
                 "rank 1, action 2 (1SEND_B0): sends the input-grad of micro-batch 0 on "
                 "stage 1 before computing it (action 3)");
  expect_invalid(linear(2, 1, (const char *const[]){low0, "1RECV_F0 1F0 1B0"}),
                 "rank 1, action 2 (1B0): the input-grad of micro-batch 0 on stage 1 is "
                 "never sent to stage 0 on rank 0 (no 1SEND_B0)");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0SEND_F0 0B0", low1}),
                 "rank 0, action 2 (0B0): backward of micro-batch 0 on stage 0 needs the "
                 "output-grad from stage 1 on rank 1, but rank 0 never receives it (no "
                 "0RECV_B0)");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0SEND_F0 0B0 0RECV_B0", low1}),
                 "rank 0, action 2 (0B0): backward of micro-batch 0 on stage 0 comes before "
                 "its receive 0RECV_B0 (action 3)");
  expect_invalid(linear(2, 1, (const char *const[]){low0, "1RECV_F0 1F0 1B0 1SEND_B0 1SEND_F0"}),
                 "rank 1, action 4 (1SEND_F0): stage 1 is the last stage of micro-batch 0's "
                 "route; there is no next stage to send to");
  expect_invalid(linear(2, 1, (const char *const[]){low0, "1RECV_F0 1RECV_B0 1F0 1B0 1SEND_B0"}),
                 "rank 1, action 1 (1RECV_B0): stage 1 is the last stage of micro-batch 0's "
                 "route; there is no next stage to receive a gradient from");
  expect_invalid(linear(2, 1, (const char *const[]){"0RECV_F0 0F0 0SEND_F0 0RECV_B0 0B0", low1}),
                 "rank 0, action 0 (0RECV_F0): stage 0 is the first stage of micro-batch 0's "
                 "route; there is no previous stage to receive from");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0SEND_F0 0RECV_B0 0B0 0SEND_B0", low1}),
                 "rank 0, action 4 (0SEND_B0): stage 0 is the first stage of micro-batch 0's "
                 "route; there is no previous stage to send a gradient to");
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0SEND_F0 0SEND_F0 0RECV_B0 0B0", low1}),
                 "rank 0, action 2 (0SEND_F0): message sent twice (first at action 1)");
  expect_invalid(linear(2, 1, (const char *const[]){low0, "1RECV_F0 1RECV_F0 1F0 1B0 1SEND_B0"}),
                 "rank 1, action 1 (1RECV_F0): message received twice (first at action 0)");
  expect_invalid(one_rank(2, 1, "0F0 0SEND_F0 1F0 1B0 0B0"),
                 "rank 0, action 1 (0SEND_F0): stage 0 and stage 1 (the next stage of "
                 "micro-batch 0) are both on rank 0; they need no message");
  expect_invalid(one_rank(2, 1, "0F0 1RECV_F0 1F0 1B0 0B0"),
                 "rank 0, action 1 (1RECV_F0): stage 1 and stage 0 (the previous stage of "
                 "micro-batch 0) are both on rank 0; they need no message");
  s = fx_dualpipe();
  fx_push(s, 0, "0SEND_F5");
  expect_invalid(s, "rank 0, action 16 (0SEND_F5): stage 0 is not on the route of "
                    "micro-batch 5");
}

static void test_comm_order_and_rendezvous(void **state) {
  (void)state;
  const char *r0 = "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1";
  lp_schedule *s = linear(2, 2, (const char *const[]){r0, "1RECV_F0 1F0 1B0 1SEND_B0 "
                                                          "1RECV_F1 1F1 1B1 1SEND_B1"});
  /* per-pair order is fine; rank 0 sends F1 while rank 1 sends B0: fine with
   * buffered sends (the executor's, and PyTorch's isend), a deadlock when a
   * send waits for its receive */
  expect_valid(s);
  assert_int_equal(lp_schedule_validate_sends(s, LP_SENDS_BUFFERED), LP_OK);
  assert_int_equal(lp_schedule_validate_sends(s, LP_SENDS_RENDEZVOUS), LP_ERR_INVALID);
  assert_string_equal(lp_schedule_last_error(s),
                      "deadlock under rendezvous sends (a send waits for its receive): "
                      "rank 0 waits at action 3 (0SEND_F1) for rank 1 to reach action 4 "
                      "(1RECV_F1); rank 1 waits at action 3 (1SEND_B0) for rank 0 to reach "
                      "action 4 (0RECV_B0)");
  lp_schedule_free(s);
  /* a receive posted before anything is sent to it: fine when a RECV only
   * posts (non-blocking, the default: the executor's and PyTorch's), a
   * deadlock when it blocks (buffered) */
  s = linear(2, 2, (const char *const[]){"0RECV_B0 0F0 0SEND_F0 0F1 0SEND_F1 "
                                         "0B0 0RECV_B1 0B1",
                                         "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 "
                                         "1F1 1B1 1SEND_B1"});
  expect_valid(s);
  assert_int_equal(lp_schedule_validate_sends(s, LP_SENDS_NONBLOCKING), LP_OK);
  assert_int_equal(lp_schedule_validate_sends(s, LP_SENDS_BUFFERED), LP_ERR_INVALID);
  assert_string_equal(lp_schedule_last_error(s),
                      "deadlock under buffered sends (a send does not wait for its receive): "
                      "rank 0 waits at action 0 (0RECV_B0) for rank 1 to reach action 3 "
                      "(1SEND_B0); rank 1 waits at action 0 (1RECV_F0) for rank 0 to reach "
                      "action 2 (0SEND_F0)");
  lp_schedule_free(s);
  /* a real deadlock with non-blocking messages: rank 0 sends F0 only after
   * the backward that needs rank 1's gradient, which needs that F0 */
  expect_invalid(linear(2, 1, (const char *const[]){"0F0 0RECV_B0 0B0 0SEND_F0",
                                                    "1RECV_F0 1F0 1B0 1SEND_B0"}),
                 "deadlock under non-blocking sends and receives (a compute waits for the "
                 "sends of its inputs): rank 0 waits at action 2 (0B0) for rank 1 to reach "
                 "action 3 (1SEND_B0); rank 1 waits at action 1 (1F0) for rank 0 to reach "
                 "action 3 (0SEND_F0)");
  /* receiving F1 first: the k-th send is not the k-th receive */
  expect_invalid(linear(2, 2, (const char *const[]){r0, "1RECV_F1 1RECV_F0 1F0 1B0 1SEND_B0 "
                                                        "1F1 1B1 1SEND_B1"}),
                 "messages from rank 0 to rank 1 do not match in order: send 0 is 0SEND_F0 "
                 "(rank 0, action 1) but receive 0 is 1RECV_F1 (rank 1, action 0)");
  expect_invalid(linear(2, 2, (const char *const[]){r0, "1RECV_F0 1RECV_F1 1F0 1B0 1F1 1B1 "
                                                        "1SEND_B1 1SEND_B0"}),
                 "messages from rank 1 to rank 0 do not match in order: send 0 is 1SEND_B1 "
                 "(rank 1, action 6) but receive 0 is 0RECV_B0 (rank 0, action 4)");
  /* the same with receives posted early: fine */
  s = linear(2, 2, (const char *const[]){r0, "1RECV_F0 1RECV_F1 1F0 1B0 1SEND_B0 1F1 1B1 "
                                             "1SEND_B1"});
  expect_valid(s);
  lp_schedule_free(s);
}

/* PyTorch's stage actions: WAIT_REDUCE_GRAD after its REDUCE_GRAD and only
 * once every other copy of the stage has started reducing; no compute
 * between RESHARD and UNSHARD. */
static void test_stage_actions(void **state) {
  (void)state;
  lp_schedule *s = linear(1, 1, (const char *const[]){"0UNSHARD 0F0 0B0 0REDUCE_GRAD "
                                                      "0WAIT_REDUCE_GRAD 0RESHARD"});
  expect_valid(s);
  lp_schedule_free(s);
  expect_invalid(linear(1, 1, (const char *const[]){"0F0 0B0 0WAIT_REDUCE_GRAD"}),
                 "rank 0, action 2 (0WAIT_REDUCE_GRAD): waits for the gradient reduction "
                 "of stage 0, which no earlier REDUCE_GRAD on rank 0 starts");
  expect_invalid(linear(1, 1, (const char *const[]){"0F0 0RESHARD 0B0"}),
                 "rank 0, action 2 (0B0): stage 0 computes after its RESHARD (action 1) "
                 "without an UNSHARD in between");
  expect_invalid(linear(1, 1, (const char *const[]){"0F0 0B0 0REDUCE_GRAD 0REDUCE_GRAD"}),
                 "rank 0, action 3 (0REDUCE_GRAD): gradients of stage 0 are reduced twice "
                 "(first at action 2)");
  lp_action a;
  char err[LP_ERRLEN];
  assert_int_equal(lp_action_parse("3WAIT_REDUCE_GRAD2", &a, err), LP_ERR_PARSE);
  assert_string_equal(err, "action '3WAIT_REDUCE_GRAD2': WAIT_REDUCE_GRAD takes no micro-batch");

  /* two copies of each model stage (mb 0 down 0 -> 1, mb 1 down 2 -> 3):
   * rank 0 waits for stage 2's reduction before computing what rank 1
   * needs to get there */
  assert_int_equal(lp_schedule_new(2, 2, 2, &s), LP_OK);
  int stage_rank[4][2] = {{0, 0}, {1, 1}, {0, 1}, {1, 0}};
  for (int v = 0; v < 4; v++)
    assert_int_equal(lp_schedule_add_vstage(s, stage_rank[v][0], stage_rank[v][1], NULL), LP_OK);
  assert_int_equal(lp_schedule_set_route(s, 0, (int[]){0, 1}, 2), LP_OK);
  assert_int_equal(lp_schedule_set_route(s, 1, (int[]){2, 3}, 2), LP_OK);
  fx_push(s, 0, "0F0 0B0 0REDUCE_GRAD 0WAIT_REDUCE_GRAD 3F1 3B1 3REDUCE_GRAD");
  fx_push(s, 1, "1F0 1B0 2F1 2B1 2REDUCE_GRAD 1REDUCE_GRAD");
  lp_schedule *ok = lp_schedule_clone(s);
  expect_invalid(s, "deadlock: rank 0 waits at action 3 (0WAIT_REDUCE_GRAD) for stage 2 "
                    "(rank 1) to start reducing the same model stage's gradients; rank 1 "
                    "waits at action 3 (2B1) for the backward of micro-batch 1 on stage 3 "
                    "(rank 0, action 5)");
  /* waiting at the end is fine, and lowering keeps it so under both models */
  lp_schedule_clear_rank(ok, 0);
  fx_push(ok, 0, "0F0 0B0 0REDUCE_GRAD 3F1 3B1 3REDUCE_GRAD 0WAIT_REDUCE_GRAD");
  expect_valid(ok);
  lp_schedule *low;
  assert_int_equal(lp_schedule_lower(ok, &low), LP_OK);
  assert_int_equal(lp_schedule_validate_sends(low, LP_SENDS_BUFFERED), LP_OK);
  assert_int_equal(lp_schedule_validate_sends(low, LP_SENDS_RENDEZVOUS), LP_OK);
  lp_schedule_free(low);
  lp_schedule_free(ok);
}

/* ---- a naive oracle for randomized comparison ---- */

/* Position of the action holding half (type, v, mb) on rank r, -1 if none;
 * types B and I both match a backward. */
static int naive_find(const lp_schedule *s, int r, int type, int v, int mb) {
  int n;
  const lp_action *a = lp_schedule_actions(s, r, &n);
  for (int i = 0; i < n; i++) {
    int bwd = type == LP_ACT_B || type == LP_ACT_I;
    int t0 = a[i].type == LP_ACT_FB ? LP_ACT_F : a[i].type;
    if (a[i].stage == v && a[i].mb == mb &&
        (t0 == type || (bwd && (t0 == LP_ACT_B || t0 == LP_ACT_I))))
      return i;
    if (a[i].type == LP_ACT_FB && a[i].bstage == v && a[i].bmb == mb && bwd) return i;
  }
  return -1;
}

/* 1 when every compute action can run in some order respecting ranks and
 * data dependencies (the schedule has no repeated or missing work). */
static int naive_runs(const lp_schedule *s) {
  int P = lp_schedule_ranks(s), cur[64] = {0}, left = 1;
  while (left) {
    int moved = 0;
    left = 0;
    for (int r = 0; r < P; r++) {
      int n;
      const lp_action *a = lp_schedule_actions(s, r, &n);
      while (cur[r] < n) {
        lp_action h[2] = {a[cur[r]], a[cur[r]]};
        int nh = 1;
        if (a[cur[r]].type == LP_ACT_FB) {
          h[0].type = LP_ACT_F;
          h[1].type = a[cur[r]].btype, h[1].stage = a[cur[r]].bstage, h[1].mb = a[cur[r]].bmb;
          nh = 2;
        }
        int ok = 1;
        for (int j = 0; j < nh && ok; j++) {
          int S, v = h[j].stage, m = h[j].mb, k = 0;
          const int *route = lp_schedule_route(s, m, &S);
          while (route[k] != v) k++;
          int need[2][2], nn = 0; /* (type, vstage) */
          if (h[j].type == LP_ACT_F && k > 0) need[nn][0] = LP_ACT_F, need[nn++][1] = route[k - 1];
          if (h[j].type == LP_ACT_B || h[j].type == LP_ACT_I) {
            need[nn][0] = LP_ACT_F, need[nn++][1] = v;
            if (k < S - 1) need[nn][0] = LP_ACT_B, need[nn++][1] = route[k + 1];
          }
          if (h[j].type == LP_ACT_W) need[nn][0] = LP_ACT_I, need[nn++][1] = v;
          for (int x = 0; x < nn; x++) {
            int pr = lp_schedule_vstage_rank(s, need[x][1]);
            int p = naive_find(s, pr, need[x][0], need[x][1], m);
            if (p < 0 || p >= cur[pr] || (pr == r && p == cur[r])) ok = 0;
          }
        }
        if (!ok) break;
        cur[r]++;
        moved = 1;
      }
      if (cur[r] < n) left = 1;
    }
    if (left && !moved) return 0;
  }
  return 1;
}

/* The compute actions of each rank of a and b are the same sequence. */
static void same_compute(const lp_schedule *a, const lp_schedule *b) {
  for (int r = 0; r < lp_schedule_ranks(a); r++) {
    int na, nb, i = 0, j = 0;
    const lp_action *xa = lp_schedule_actions(a, r, &na), *xb = lp_schedule_actions(b, r, &nb);
    for (;;) {
      while (i < na && !lp_action_is_compute(xa[i].type)) i++;
      while (j < nb && !lp_action_is_compute(xb[j].type)) j++;
      if (i == na || j == nb) break;
      assert_memory_equal(&xa[i], &xb[j], sizeof xa[i]);
      i++, j++;
    }
    assert_int_equal(i, na);
    assert_int_equal(j, nb);
  }
}

static void test_randomized(void **state) {
  (void)state;
  unsigned seed = (unsigned)time(NULL);
  const char *env = getenv("LUAPIPE_TEST_SEED");
  if (env) seed = (unsigned)strtoul(env, NULL, 10);
  printf("test_randomized: seed %u (set LUAPIPE_TEST_SEED to repeat)\n", seed);
  srand(seed);
  int valid = 0, invalid = 0;
  for (int trial = 0; trial < 400; trial++) {
    lp_schedule *s = (trial % 3 == 0) ? fx_dualpipe()
                                      : fx_1f1b(2 + rand() % 4, 1 + rand() % 8, rand() % 2);
    int swaps = rand() % 4;
    for (int x = 0; x < swaps; x++) { /* swap two adjacent actions of one rank */
      int r = rand() % lp_schedule_ranks(s), n;
      const lp_action *a = lp_schedule_actions(s, r, &n);
      if (n < 2) continue;
      int i = rand() % (n - 1);
      lp_action *copy = malloc((size_t)n * sizeof *copy);
      memcpy(copy, a, (size_t)n * sizeof *copy);
      lp_action t = copy[i];
      copy[i] = copy[i + 1];
      copy[i + 1] = t;
      lp_schedule_clear_rank(s, r);
      for (int j = 0; j < n; j++) assert_int_equal(lp_schedule_push(s, r, &copy[j]), LP_OK);
      free(copy);
    }
    lp_status st = lp_schedule_validate(s);
    int oracle = naive_runs(s);
    if (oracle != (st == LP_OK))
      print_error("trial %d: validate says '%s'\n", trial, lp_schedule_last_error(s));
    assert_int_equal(oracle, st == LP_OK);
    lp_schedule *low = NULL;
    if (st == LP_OK) {
      valid++;
      assert_int_equal(lp_schedule_lower(s, &low), LP_OK);
      same_compute(s, low);
      char *csv = lp_schedule_to_csv(low);
      lp_schedule *back;
      char err[LP_ERRLEN];
      assert_int_equal(lp_schedule_from_csv(csv, "r.csv", &back, err), LP_OK);
      fx_assert_same(low, back);
      assert_int_equal(lp_schedule_validate(back), LP_OK);
      lp_schedule_free(back);
      lp_free(csv);
    } else {
      invalid++;
      assert_int_equal(st, LP_ERR_INVALID);
      char msg[LP_ERRLEN];
      snprintf(msg, sizeof msg, "%s", lp_schedule_last_error(s));
      assert_true(!strncmp(msg, "rank ", 5) || !strncmp(msg, "deadlock: ", 10));
      assert_int_equal(lp_schedule_lower(s, &low), LP_ERR_INVALID);
      assert_null(low);
      assert_string_equal(lp_schedule_last_error(s), msg);
    }
    lp_schedule_free(low);
    lp_schedule_free(s);
  }
  printf("test_randomized: %d valid, %d invalid\n", valid, invalid);
  assert_true(valid > 50 && invalid > 50);
}

/* ---- scale ----
 * Functional checks at a size where a quadratic validator or lowering would
 * show; the timings live in scripts/bench/schedules (no wall-clock limits in
 * tests). */

static void test_large(void **state) {
  (void)state;
  lp_schedule *s = fx_1f1b(64, 1024, 0);
  assert_int_equal(lp_schedule_validate(s), LP_OK);
  int n;
  lp_schedule_actions(s, 0, &n);
  assert_int_equal(n, 2 * 1024);
  lp_schedule_free(s);

  s = fx_1f1b(64, 512, 1);
  lp_schedule *low;
  assert_int_equal(lp_schedule_validate(s), LP_OK);
  assert_int_equal(lp_schedule_lower(s, &low), LP_OK);
  assert_int_equal(lp_schedule_validate(low), LP_OK);
  assert_int_equal(lp_schedule_validate_sends(low, LP_SENDS_RENDEZVOUS), LP_OK);
  /* lowering adds the sends and receives: rank 0 sends every F output and
   * receives every gradient; a middle rank does both in both directions */
  int n0, n1;
  lp_schedule_actions(s, 0, &n0);
  lp_schedule_actions(low, 0, &n1);
  assert_true(n1 >= n0 + 2 * 512);
  lp_schedule_actions(s, 32, &n0);
  lp_schedule_actions(low, 32, &n1);
  assert_true(n1 >= n0 + 4 * 512);
  lp_schedule_free(low);
  lp_schedule_free(s);
}

/* ---- out of memory ---- */

static void test_validate_out_of_memory(void **state) {
  (void)state;
  lp_schedule *s = fx_dualpipe(), *low;
  assert_int_equal(lp_schedule_lower(s, &low), LP_OK);
  lp_schedule *bad = linear(2, 2, (const char *const[]){"0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0"});
  long fails = 0;
  for (long k = 0;; k++) {
    lp_test_oom_arm(k, 0);
    lp_status st1 = lp_schedule_validate(low);
    lp_status st2 = lp_schedule_validate(bad);
    int failed = lp_test_oom_state.failed;
    long live = lp_test_oom_state.live;
    lp_test_oom_disarm();
    assert_int_equal(live, 0);
    if (st1 == LP_ERR_NOMEM) assert_string_equal(lp_schedule_last_error(low), "out of memory");
    else assert_int_equal(st1, LP_OK);
    if (st2 == LP_ERR_NOMEM) assert_string_equal(lp_schedule_last_error(bad), "out of memory");
    else assert_int_equal(st2, LP_ERR_INVALID);
    if (!failed) break;
    fails++;
  }
  assert_true(fails > 5);
  assert_int_equal(lp_schedule_validate(low), LP_OK);
  lp_schedule_free(bad);
  lp_schedule_free(low);
  lp_schedule_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid),
      cmocka_unit_test(test_structure_errors),
      cmocka_unit_test(test_order_errors),
      cmocka_unit_test(test_deadlock),
      cmocka_unit_test(test_comm_errors),
      cmocka_unit_test(test_comm_order_and_rendezvous),
      cmocka_unit_test(test_stage_actions),
      cmocka_unit_test(test_randomized),
      cmocka_unit_test(test_large),
      cmocka_unit_test(test_validate_out_of_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
