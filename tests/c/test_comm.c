/* test_comm.c — the comm layer in one process: the "self" backend (rank 0
 * of 1, identity collectives, refused point-to-point), argument errors and
 * their text, out-of-memory paths, and the watchdog through a fake
 * two-rank backend whose requests finish only when the test says so. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "lp_comm.h"
#include "lp_test_oom.h"

/* ---- the self backend ---- */

static void test_world_is_self(void **state) {
  (void)state;
  int argc = 1;
  char name[] = "test_comm";
  char *args[] = {name, NULL};
  char **argv = args;
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("PMIX_RANK");
  unsetenv("PMI_RANK");
  assert_int_equal(lp_comm_mpi_init(&argc, &argv), LP_OK);
  assert_int_equal(lp_comm_mpi_active(), 0);
  lp_comm *w = lp_comm_world();
  assert_non_null(w);
  assert_ptr_equal(w, lp_comm_world());
  assert_int_equal(lp_comm_rank(w), 0);
  assert_int_equal(lp_comm_size(w), 1);
  assert_string_equal(lp_comm_backend_name(w), "self");
  assert_true(lp_comm_tag_ub(w) >= 32767);
  assert_string_equal(lp_comm_last_error(w), "");
  lp_comm_free(w); /* the world is not the caller's: ignored */
  lp_comm_free(NULL);
  assert_int_equal(lp_comm_size(lp_comm_world()), 1);
  lp_comm_mpi_finalize(); /* nothing started: a no-op */
}

static void test_self_collectives(void **state) {
  (void)state;
  lp_comm *c;
  assert_int_equal(lp_comm_self_new(&c), LP_OK);
  float f[3] = {1.5f, -2.0f, 3.25f};
  assert_int_equal(lp_comm_allreduce_sum_float(c, f, 3, "grads"), LP_OK);
  assert_true(f[0] == 1.5f && f[1] == -2.0f && f[2] == 3.25f);
  double d[2] = {1e300, -7.0};
  assert_int_equal(lp_comm_allreduce_sum_double(c, d, 2, NULL), LP_OK);
  assert_true(d[0] == 1e300 && d[1] == -7.0);
  assert_int_equal(lp_comm_allreduce_sum_float(c, NULL, 0, NULL), LP_OK);
  assert_int_equal(lp_comm_barrier(c, NULL), LP_OK);
  char text[] = "hello";
  assert_int_equal(lp_comm_bcast(c, text, sizeof text, 0, NULL), LP_OK);
  assert_string_equal(text, "hello");
  assert_string_equal(lp_comm_last_error(c), "");
  lp_comm_free(c);
}

static void test_self_p2p_refused(void **state) {
  (void)state;
  lp_comm *c;
  assert_int_equal(lp_comm_self_new(&c), LP_OK);
  float x[4] = {0};
  lp_comm_req *r = (lp_comm_req *)(uintptr_t)1; /* must be reset to NULL */
  assert_int_equal(lp_comm_isend(c, x, 4, 0, 3, &r), LP_ERR_ARG);
  assert_null(r);
  assert_non_null(strstr(lp_comm_last_error(c), "send to rank 0"));
  assert_non_null(strstr(lp_comm_last_error(c), "itself"));
  assert_int_equal(lp_comm_irecv(c, x, 4, 0, 3, &r), LP_ERR_ARG);
  assert_non_null(strstr(lp_comm_last_error(c), "receive from rank 0"));
  assert_int_equal(lp_comm_irecv(c, x, 4, 1, 3, &r), LP_ERR_ARG);
  assert_string_equal(lp_comm_last_error(c),
                      "receive from rank 1: no such rank (ranks are 0..0)");
  assert_int_equal(lp_comm_send(c, x, 4, -1, 0, "w"), LP_ERR_ARG);
  assert_non_null(strstr(lp_comm_last_error(c), "no such rank"));
  assert_int_equal(lp_comm_recv(c, x, 4, 0, 0, "w"), LP_ERR_ARG);
  assert_int_equal(lp_comm_bcast(c, x, 4, 1, NULL), LP_ERR_ARG);
  assert_string_equal(lp_comm_last_error(c),
                      "broadcast from rank 1: no such rank (ranks are 0..0)");
  assert_int_equal(lp_comm_allreduce_sum_float(c, NULL, 2, NULL), LP_ERR_ARG);
  assert_non_null(strstr(lp_comm_last_error(c), "NULL buffer"));
  lp_comm_free(c);
}

static void test_null_requests(void **state) {
  (void)state;
  lp_comm *c = lp_comm_world();
  lp_comm_req *r = NULL;
  int done = 0;
  assert_int_equal(lp_comm_test(c, &r, &done), LP_OK);
  assert_int_equal(done, 1);
  assert_int_equal(lp_comm_wait(c, &r, NULL), LP_OK);
  lp_comm_req *rs[3] = {NULL, NULL, NULL};
  assert_int_equal(lp_comm_waitall(c, rs, 3, "nothing"), LP_OK);
  lp_comm_cancel(c, &r);
  lp_comm_cancel(c, NULL);
}

static void test_timeout_knob(void **state) {
  (void)state;
  lp_comm *c;
  setenv("LUAPIPE_TIMEOUT", "7.5", 1);
  assert_int_equal(lp_comm_self_new(&c), LP_OK);
  assert_true(lp_comm_timeout(c) == 7.5);
  lp_comm_set_timeout(c, 0.25);
  assert_true(lp_comm_timeout(c) == 0.25);
  lp_comm_free(c);
  unsetenv("LUAPIPE_TIMEOUT");
  assert_int_equal(lp_comm_self_new(&c), LP_OK);
  assert_true(lp_comm_timeout(c) == 300);
  lp_comm_free(c);
}

/* ---- out of memory ---- */

static void test_out_of_memory(void **state) {
  (void)state;
  lp_comm *c = lp_comm_world();
  lp_test_oom_arm(0, 1); /* every allocation fails */
  lp_comm *s = NULL;
  assert_int_equal(lp_comm_self_new(&s), LP_ERR_NOMEM);
  assert_null(s);
  float x[2] = {1, 2};
  assert_int_equal(lp_comm_allreduce_sum_float(c, x, 2, NULL), LP_ERR_NOMEM);
  assert_string_equal(lp_comm_last_error(c), "out of memory");
  assert_int_equal(lp_comm_barrier(c, NULL), LP_ERR_NOMEM);
  lp_test_oom_arm(1, 1); /* one allocation succeeds */
  assert_int_equal(lp_comm_barrier(c, NULL), LP_OK);
  lp_set_allocator(NULL, NULL);
}

/* ---- the watchdog, through a fake backend of 2 ranks ----
 * A request finishes after `polls_to_finish` tests (-1: never); `fail`
 * makes test report an error. */

typedef struct fake {
  int polls_to_finish;
  int fail;
  int started, cancelled, destroyed;
} fake;

static lp_status fake_start(lp_comm *c, lp_comm_req *req) {
  fake *f = lp_comm_backend_state(c);
  f->started++;
  req->impl.i = f->polls_to_finish;
  return LP_OK;
}
static lp_status fake_isend(lp_comm *c, const void *b, size_t n,
                            lp_comm_dtype dt, int p, int t, lp_comm_req *r) {
  (void)b, (void)n, (void)dt, (void)p, (void)t;
  return fake_start(c, r);
}
static lp_status fake_irecv(lp_comm *c, void *b, size_t n, lp_comm_dtype dt,
                            int p, int t, lp_comm_req *r) {
  (void)b, (void)n, (void)dt, (void)p, (void)t;
  return fake_start(c, r);
}
static lp_status fake_iallreduce(lp_comm *c, void *b, size_t n,
                                 lp_comm_dtype dt, lp_comm_req *r) {
  (void)b, (void)n, (void)dt;
  return fake_start(c, r);
}
static lp_status fake_ibarrier(lp_comm *c, lp_comm_req *r) {
  return fake_start(c, r);
}
static lp_status fake_ibcast(lp_comm *c, void *b, size_t n, int root,
                             lp_comm_req *r) {
  (void)b, (void)n, (void)root;
  return fake_start(c, r);
}
static lp_status fake_test(lp_comm *c, lp_comm_req *r, int *done) {
  fake *f = lp_comm_backend_state(c);
  if (f->fail) {
    lp_errf(c->err, "link down");
    *done = 1;
    return LP_ERR_COMM;
  }
  *done = r->impl.i == 0;
  if (r->impl.i > 0) r->impl.i--;
  return LP_OK;
}
static void fake_cancel(lp_comm *c, lp_comm_req *r) {
  (void)r;
  ((fake *)lp_comm_backend_state(c))->cancelled++;
}
static void fake_abort(lp_comm *c, int code) {
  (void)c;
  exit(code);
}
static void fake_destroy(lp_comm *c) {
  ((fake *)lp_comm_backend_state(c))->destroyed++;
}

static const lp_comm_backend fake_backend = {
    .name = "fake",
    .isend = fake_isend,
    .irecv = fake_irecv,
    .iallreduce_sum = fake_iallreduce,
    .ibarrier = fake_ibarrier,
    .ibcast = fake_ibcast,
    .test = fake_test,
    .cancel = fake_cancel,
    .abort = fake_abort,
    .destroy = fake_destroy,
};

static void test_new_checks_args(void **state) {
  (void)state;
  lp_comm *c = (lp_comm *)(uintptr_t)1;
  fake f = {0};
  assert_int_equal(lp_comm_new(&fake_backend, 2, 2, 100, &f, &c), LP_ERR_ARG);
  assert_null(c);
  assert_int_equal(lp_comm_new(NULL, 0, 1, 100, &f, &c), LP_ERR_ARG);
  assert_int_equal(lp_comm_new(&fake_backend, 0, 0, 100, &f, &c), LP_ERR_ARG);
}

static void test_wait_finishes(void **state) {
  (void)state;
  fake f = {.polls_to_finish = 5};
  lp_comm *c;
  assert_int_equal(lp_comm_new(&fake_backend, 0, 2, 100, &f, &c), LP_OK);
  assert_string_equal(lp_comm_backend_name(c), "fake");
  float x[4];
  lp_comm_req *r;
  assert_int_equal(lp_comm_irecv(c, x, 4, 1, 7, &r), LP_OK);
  assert_non_null(r);
  int done;
  assert_int_equal(lp_comm_test(c, &r, &done), LP_OK);
  assert_int_equal(done, 0);
  assert_non_null(r);
  assert_int_equal(lp_comm_wait(c, &r, "x"), LP_OK);
  assert_null(r);
  /* waitall over a mix of requests and NULLs */
  lp_comm_req *rs[3] = {NULL, NULL, NULL};
  assert_int_equal(lp_comm_isend(c, x, 4, 1, 7, &rs[0]), LP_OK);
  assert_int_equal(lp_comm_irecv(c, x, 4, 1, 8, &rs[2]), LP_OK);
  assert_int_equal(lp_comm_waitall(c, rs, 3, NULL), LP_OK);
  assert_null(rs[0]);
  assert_null(rs[2]);
  /* the tag limit comes from the backend */
  assert_int_equal(lp_comm_isend(c, x, 4, 1, 101, &r), LP_ERR_ARG);
  assert_string_equal(lp_comm_last_error(c),
                      "send to rank 1: tag 101 is out of range 0..100");
  assert_int_equal(lp_comm_isend(c, x, 4, 1, -1, &r), LP_ERR_ARG);
  assert_int_equal(f.cancelled, 0);
  lp_comm_free(c);
  assert_int_equal(f.destroyed, 1);
}

static void test_watchdog_recv(void **state) {
  (void)state;
  fake f = {.polls_to_finish = -1};
  lp_comm *c;
  assert_int_equal(lp_comm_new(&fake_backend, 0, 4, 100, &f, &c), LP_OK);
  lp_comm_set_timeout(c, 0.2);
  float x[4];
  lp_comm_req *r;
  assert_int_equal(lp_comm_irecv(c, x, 4, 3, 7, &r), LP_OK);
  double t0 = lp_now();
  assert_int_equal(
      lp_comm_wait(c, &r, "action 14 (5B3) waits for RECV_B from rank 3"),
      LP_ERR_TIMEOUT);
  double dt = lp_now() - t0;
  assert_true(dt >= 0.19 && dt < 2.0);
  assert_string_equal(lp_comm_last_error(c),
                      "timed out after 0.2 s (LUAPIPE_TIMEOUT) waiting for rank "
                      "3 to send 4 floats (tag 7) to rank 0: action 14 (5B3) "
                      "waits for RECV_B from rank 3");
  assert_non_null(r); /* still pending: the caller decides */
  lp_comm_cancel(c, &r);
  assert_null(r);
  assert_int_equal(f.cancelled, 1);
  lp_comm_free(c);
}

static void test_watchdog_messages(void **state) {
  (void)state;
  fake f = {.polls_to_finish = -1};
  lp_comm *c;
  assert_int_equal(lp_comm_new(&fake_backend, 2, 4, 100, &f, &c), LP_OK);
  lp_comm_set_timeout(c, 0.05);
  float x[1];
  double d[3];
  /* blocking send: times out, leaves no request behind */
  assert_int_equal(lp_comm_send(c, x, 1, 3, 9, NULL), LP_ERR_TIMEOUT);
  assert_string_equal(lp_comm_last_error(c),
                      "timed out after 0.05 s (LUAPIPE_TIMEOUT) waiting for "
                      "rank 3 to receive 1 float (tag 9) from rank 2");
  assert_int_equal(f.cancelled, 1);
  assert_int_equal(lp_comm_recv(c, x, 1, 0, 1, "step 3"), LP_ERR_TIMEOUT);
  assert_int_equal(f.cancelled, 2);
  assert_int_equal(lp_comm_allreduce_sum_double(c, d, 3, "REDUCE_GRAD"),
                   LP_ERR_TIMEOUT);
  assert_string_equal(lp_comm_last_error(c),
                      "timed out after 0.05 s (LUAPIPE_TIMEOUT) in an "
                      "all-reduce of 3 doubles on rank 2 (4 ranks): REDUCE_GRAD");
  assert_int_equal(lp_comm_barrier(c, ""), LP_ERR_TIMEOUT);
  assert_string_equal(lp_comm_last_error(c),
                      "timed out after 0.05 s (LUAPIPE_TIMEOUT) in a barrier "
                      "on rank 2 (4 ranks)");
  assert_int_equal(lp_comm_bcast(c, d, 24, 1, NULL), LP_ERR_TIMEOUT);
  assert_string_equal(lp_comm_last_error(c),
                      "timed out after 0.05 s (LUAPIPE_TIMEOUT) in a broadcast "
                      "of 24 bytes from rank 1, on rank 2");
  /* waitall names the first unfinished request */
  lp_comm_req *rs[2];
  f.polls_to_finish = 0;
  assert_int_equal(lp_comm_isend(c, x, 1, 1, 4, &rs[0]), LP_OK);
  f.polls_to_finish = -1;
  assert_int_equal(lp_comm_irecv(c, x, 1, 0, 5, &rs[1]), LP_OK);
  assert_int_equal(lp_comm_waitall(c, rs, 2, "pair"), LP_ERR_TIMEOUT);
  assert_null(rs[0]);
  assert_non_null(rs[1]);
  assert_non_null(strstr(lp_comm_last_error(c), "waiting for rank 0 to send 1 "
                                                "float (tag 5) to rank 2: pair"));
  lp_comm_cancel(c, &rs[1]);
  /* timeout <= 0 waits forever: here a request that finishes later */
  lp_comm_set_timeout(c, 0);
  f.polls_to_finish = 3000;
  assert_int_equal(lp_comm_barrier(c, NULL), LP_OK);
  lp_comm_free(c);
}

static void test_backend_failure(void **state) {
  (void)state;
  fake f = {.polls_to_finish = -1, .fail = 1};
  lp_comm *c;
  assert_int_equal(lp_comm_new(&fake_backend, 0, 2, 100, &f, &c), LP_OK);
  float x[2];
  lp_comm_req *r;
  assert_int_equal(lp_comm_irecv(c, x, 2, 1, 0, &r), LP_OK);
  assert_int_equal(lp_comm_wait(c, &r, NULL), LP_ERR_COMM);
  assert_null(r); /* a failed request is released */
  assert_string_equal(lp_comm_last_error(c), "link down");
  assert_int_equal(f.cancelled, 0);
  lp_comm_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_world_is_self),
      cmocka_unit_test(test_self_collectives),
      cmocka_unit_test(test_self_p2p_refused),
      cmocka_unit_test(test_null_requests),
      cmocka_unit_test(test_timeout_knob),
      cmocka_unit_test(test_out_of_memory),
      cmocka_unit_test(test_new_checks_args),
      cmocka_unit_test(test_wait_finishes),
      cmocka_unit_test(test_watchdog_recv),
      cmocka_unit_test(test_watchdog_messages),
      cmocka_unit_test(test_backend_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
