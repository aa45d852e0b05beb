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

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "lp_comm.h"
#include "lp_sim.h"
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
  size_t n1[1] = {2}, d0[1] = {0};
  float y[2];
  assert_int_equal(lp_comm_alltoallv(c, x, n1, d0, y, n1, d0, NULL), LP_ERR_NOMEM);
  assert_int_equal(lp_comm_alltoallv(c, x, n1, NULL, y, n1, NULL, NULL), LP_ERR_NOMEM);
  assert_int_equal(lp_comm_split(c, 0, 0, &s), LP_ERR_NOMEM);
  assert_null(s);
  lp_test_oom_arm(1, 1); /* one allocation succeeds */
  assert_int_equal(lp_comm_barrier(c, NULL), LP_OK);
  lp_test_oom_arm(2, 1); /* prefix sums and request, not the split's context */
  assert_int_equal(lp_comm_alltoallv(c, x, n1, NULL, y, n1, NULL, NULL), LP_OK);
  assert_true(y[0] == 1 && y[1] == 2);
  lp_test_oom_arm(1, 1);
  assert_int_equal(lp_comm_split(c, 0, 0, &s), LP_ERR_NOMEM);
  assert_null(s);
  assert_string_equal(lp_comm_last_error(c), "out of memory");
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
static lp_status fake_ialltoallv(lp_comm *c, const float *s, const size_t *sc,
                                 const size_t *sd, float *r, const size_t *rc,
                                 const size_t *rd, lp_comm_req *req) {
  (void)s, (void)sc, (void)sd, (void)r, (void)rc, (void)rd;
  return fake_start(c, req);
}
static lp_status fake_iallgather(lp_comm *c, const void *s, size_t n, void *r,
                                 lp_comm_req *req) {
  (void)s, (void)n, (void)r;
  return fake_start(c, req);
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
    .ialltoallv = fake_ialltoallv,
    .iallgather = fake_iallgather,
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
  assert_true(dt >= 0.19); /* no upper bound: a loaded machine may be late; a hang is ctest's timeout */
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

/* ---- the emulated link ---- */

static void expect_link_error(const char *text, const char *msg) {
  lp_link l = {1, 1};
  char err[LP_ERRLEN];
  assert_int_equal(lp_link_parse(text, &l, err), LP_ERR_PARSE);
  assert_string_equal(err, msg);
  assert_true(l.latency_s == 0 && l.bytes_per_s == 0);
}

static void test_link_parse(void **state) {
  (void)state;
  lp_link l;
  char err[LP_ERRLEN], text[64];
  assert_int_equal(lp_link_parse("lat=50us,bw=2GB/s", &l, err), LP_OK);
  assert_true(fabs(l.latency_s - 50e-6) < 1e-18 && l.bytes_per_s == 2e9);
  assert_true(fabs(lp_link_time(&l, 4e6) - (50e-6 + 2e-3)) < 1e-15);
  lp_link_format(&l, text, sizeof text);
  assert_string_equal(text, "lat=50us,bw=2GB/s");
  assert_int_equal(lp_link_parse("bw=250MB/s,lat=1.5ms", &l, err), LP_OK);
  assert_true(l.latency_s == 1.5e-3 && l.bytes_per_s == 250e6);
  lp_link_format(&l, text, sizeof text);
  assert_string_equal(text, "lat=1.5ms,bw=250MB/s");
  assert_int_equal(lp_link_parse("lat=2s", &l, err), LP_OK);
  assert_true(l.latency_s == 2 && l.bytes_per_s == 0);
  assert_true(lp_link_time(&l, 1e12) == 2); /* unlimited bandwidth */
  assert_int_equal(lp_link_parse("bw=8KB/s", &l, err), LP_OK);
  assert_true(l.latency_s == 0 && l.bytes_per_s == 8e3);
  assert_true(lp_link_time(&l, 16e3) == 2);
  assert_int_equal(lp_link_active(&l), 1);
  assert_int_equal(lp_link_parse("none", &l, err), LP_OK);
  assert_int_equal(lp_link_active(&l), 0);
  assert_int_equal(lp_link_parse("", &l, err), LP_OK);
  assert_int_equal(lp_link_parse(NULL, &l, err), LP_OK);
  lp_link_format(&l, text, sizeof text);
  assert_string_equal(text, "none");
  assert_true(lp_link_time(NULL, 5) == 0);
  /* all-to-all-v: latency + the larger direction; nothing moving is free;
   * the simulator's phase cost is the same formula */
  assert_int_equal(lp_link_parse("lat=1ms,bw=1MB/s", &l, err), LP_OK);
  assert_true(fabs(lp_link_alltoallv_time(&l, 3000, 5000) - 0.006) < 1e-15);
  assert_true(fabs(lp_link_alltoallv_time(&l, 5000, 0) - 0.006) < 1e-15);
  assert_true(lp_link_alltoallv_time(&l, 0, 0) == 0);
  lp_sim_cost sc;
  lp_sim_cost_init(&sc);
  assert_true(lp_sim_alltoallv_time(&sc, 4000, 4000) == 0); /* no link */
  sc.link = l;
  assert_true(lp_sim_alltoallv_time(&sc, 4000, 1000) == lp_link_alltoallv_time(&l, 4000, 1000));
  assert_true(lp_sim_alltoallv_time(NULL, 1, 1) == 0);
  double delay;
  sc.message_bytes = 2000;
  sc.latency = 0.5;
  assert_int_equal(lp_sim_message_delay(&sc, &delay, err), LP_OK);
  assert_true(fabs(delay - (0.5 + 0.001 + 0.002)) < 1e-15);
  sc.message_bytes = -1;
  assert_int_equal(lp_sim_message_delay(&sc, &delay, err), LP_ERR_ARG);
  assert_string_equal(err, "cost model: bytes = -1 must be a number in 0..1e+15");
  expect_link_error("lat=50,bw=2GB/s",
                    "link 'lat=50,bw=2GB/s': lat=50 needs a unit (us, ms or s)");
  expect_link_error("lat=50ns", "link 'lat=50ns': lat=50ns has an unknown unit "
                                "'ns' (use us, ms or s)");
  expect_link_error("bw=2Gb/s", "link 'bw=2Gb/s': bw=2Gb/s has an unknown unit "
                                "'Gb/s' (use GB/s, MB/s, KB/s or B/s)");
  expect_link_error("bw=0GB/s", "link 'bw=0GB/s': bw=0GB/s must be positive");
  expect_link_error("lat=-1ms", "link 'lat=-1ms': lat=-1ms must be >= 0");
  expect_link_error("lat=fast", "link 'lat=fast': lat=fast is not a number "
                                "with a unit (us, ms or s)");
  expect_link_error("lat=", "link 'lat=': lat= needs a value, e.g. lat=50us");
  expect_link_error("lat=1us,lat=2us", "link 'lat=1us,lat=2us': lat= is given twice");
  expect_link_error("latency=1us",
                    "link 'latency=1us': unknown field 'latency=1us' (expected "
                    "lat=<time> or bw=<rate>, e.g. lat=50us,bw=2GB/s)");
  expect_link_error("lat=1us,", "link 'lat=1us,': unknown field '' (expected "
                                "lat=<time> or bw=<rate>, e.g. lat=50us,bw=2GB/s)");
}

static void test_link_env(void **state) {
  (void)state;
  lp_comm *c, *d;
  setenv("LUAPIPE_LINK", "lat=3ms,bw=1MB/s", 1);
  assert_int_equal(lp_comm_self_new(&c), LP_OK);
  assert_true(lp_comm_link(c)->latency_s == 3e-3);
  assert_true(lp_comm_link(c)->bytes_per_s == 1e6);
  /* a split inherits link and timeout */
  lp_comm_set_timeout(c, 12);
  assert_int_equal(lp_comm_split(c, 0, 0, &d), LP_OK);
  assert_true(lp_comm_link(d)->latency_s == 3e-3 && lp_comm_timeout(d) == 12);
  lp_comm_set_link(c, NULL);
  assert_int_equal(lp_link_active(lp_comm_link(c)), 0);
  lp_comm_free(d);
  lp_comm_free(c);
  char err[LP_ERRLEN];
  lp_link l;
  setenv("LUAPIPE_LINK", "lat=3", 1);
  assert_int_equal(lp_comm_link_from_env(&l, err), LP_ERR_PARSE);
  assert_string_equal(err, "LUAPIPE_LINK: link 'lat=3': lat=3 needs a unit (us, ms or s)");
  /* the bootstrap refuses it even without mpirun */
  int argc = 1;
  char name[] = "test_comm";
  char *args[] = {name, NULL};
  char **argv = args;
  assert_int_equal(lp_comm_mpi_init(&argc, &argv), LP_ERR_PARSE);
  unsetenv("LUAPIPE_LINK");
  assert_int_equal(lp_comm_link_from_env(&l, err), LP_OK);
  assert_int_equal(lp_link_active(&l), 0);
}

/* A message on a 20 ms link is not reported before 20 ms (lower bound
 * only), and the wait sleeps rather than polls: the fake backend finishes
 * at its first test, so a polling wait would test it thousands of times. */
static void test_link_delays_messages(void **state) {
  (void)state;
  fake f = {.polls_to_finish = 0};
  lp_comm *c;
  assert_int_equal(lp_comm_new(&fake_backend, 0, 2, 100, &f, &c), LP_OK);
  lp_link l;
  char err[LP_ERRLEN];
  assert_int_equal(lp_link_parse("lat=20ms", &l, err), LP_OK);
  lp_comm_set_link(c, &l);
  float x[4] = {0};
  lp_comm_req *r;
  double t0 = lp_now();
  assert_int_equal(lp_comm_isend(c, x, 4, 1, 0, &r), LP_OK);
  int done;
  assert_int_equal(lp_comm_test(c, &r, &done), LP_OK);
  assert_int_equal(done, 0); /* the backend is done, the link is not */
  assert_int_equal(lp_comm_wait(c, &r, "delayed"), LP_OK);
  assert_true(lp_now() - t0 >= 0.020);
  assert_null(r);
  /* receive and all-to-all-v too; bandwidth: 8 KB/s, 40 bytes out = 5 ms */
  assert_int_equal(lp_link_parse("lat=20ms,bw=8KB/s", &l, err), LP_OK);
  lp_comm_set_link(c, &l);
  t0 = lp_now();
  assert_int_equal(lp_comm_recv(c, x, 4, 1, 0, NULL), LP_OK);
  assert_true(lp_now() - t0 >= 0.022);
  float s[12] = {0}, rv[12];
  size_t sc[2] = {2, 10}, sd[2] = {0, 2}, rc[2] = {2, 3}, rd[2] = {0, 2};
  t0 = lp_now();
  assert_int_equal(lp_comm_alltoallv(c, s, sc, sd, rv, rc, rd, "a2a"), LP_OK);
  assert_true(lp_now() - t0 >= 0.025); /* max(40, 12) bytes: 20 + 5 ms */
  /* a message whose link time passed while the caller computed is done at
   * its first test */
  assert_int_equal(lp_comm_irecv(c, x, 4, 1, 0, &r), LP_OK);
  lp_sleep_until(lp_now() + 0.03);
  assert_int_equal(lp_comm_test(c, &r, &done), LP_OK);
  assert_int_equal(done, 1);
  /* a cancelled request the backend had finished is not cancelled there */
  assert_int_equal(lp_comm_isend(c, x, 4, 1, 0, &r), LP_OK);
  assert_int_equal(lp_comm_test(c, &r, &done), LP_OK);
  assert_int_equal(done, 0);
  lp_comm_cancel(c, &r);
  assert_int_equal(f.cancelled, 0);
  assert_true(f.started < 10);
  lp_comm_free(c);
}

/* ---- all-to-all-v ---- */

static void test_self_alltoallv(void **state) {
  (void)state;
  lp_comm *c;
  assert_int_equal(lp_comm_self_new(&c), LP_OK);
  float send[5] = {1, 2, 3, 4, 5}, recv[6] = {0};
  size_t sc[1] = {3}, sd[1] = {1}, rc[1] = {3}, rd[1] = {2};
  lp_comm_req *r;
  assert_int_equal(lp_comm_ialltoallv(c, send, sc, sd, recv, rc, rd, &r), LP_OK);
  assert_int_equal(lp_comm_wait(c, &r, "dispatch"), LP_OK);
  assert_null(r);
  float want[6] = {0, 0, 2, 3, 4, 0};
  assert_memory_equal(recv, want, sizeof want);
  /* NULL displacements: packed in rank order (here: from 0) */
  memset(recv, 0, sizeof recv);
  assert_int_equal(lp_comm_alltoallv(c, send, sc, NULL, recv, rc, NULL, NULL), LP_OK);
  float packed[6] = {1, 2, 3, 0, 0, 0};
  assert_memory_equal(recv, packed, sizeof packed);
  /* zero counts and NULL buffers are fine together */
  sc[0] = rc[0] = 0;
  assert_int_equal(lp_comm_alltoallv(c, NULL, sc, sd, NULL, rc, rd, NULL), LP_OK);
  /* misuse */
  sc[0] = 2;
  assert_int_equal(lp_comm_alltoallv(c, send, sc, sd, recv, rc, rd, NULL), LP_ERR_ARG);
  assert_string_equal(lp_comm_last_error(c), "all-to-all-v on rank 0: sends 2 "
                                             "floats to itself but expects 0 from itself");
  rc[0] = 2;
  assert_int_equal(lp_comm_alltoallv(c, NULL, sc, sd, recv, rc, rd, NULL), LP_ERR_ARG);
  assert_string_equal(lp_comm_last_error(c),
                      "all-to-all-v on rank 0: NULL send buffer for 3 floats");
  assert_int_equal(lp_comm_alltoallv(c, send, NULL, sd, recv, rc, rd, NULL), LP_ERR_ARG);
  assert_string_equal(lp_comm_last_error(c), "all-to-all-v on rank 0: NULL count array");
  assert_int_equal(lp_comm_alltoallv(c, send, sc, NULL, recv, NULL, NULL, NULL), LP_ERR_ARG);
  assert_int_equal(lp_comm_ialltoallv(c, send, sc, sd, recv, rc, rd, NULL), LP_ERR_ARG);
  /* a split of a self context is a self context that works the same */
  lp_comm *d;
  assert_int_equal(lp_comm_split(c, -1, 0, &d), LP_ERR_ARG);
  assert_null(d);
  assert_string_equal(lp_comm_last_error(c), "split on rank 0: color -1 must be >= 0");
  assert_int_equal(lp_comm_split(c, 3, 7, &d), LP_OK);
  assert_int_equal(lp_comm_size(d), 1);
  assert_string_equal(lp_comm_backend_name(d), "self");
  memset(recv, 0, sizeof recv);
  assert_int_equal(lp_comm_alltoallv(d, send, sc, sd, recv, rc, rd, NULL), LP_OK);
  assert_true(recv[1] == 0 && recv[2] == 2 && recv[3] == 3 && recv[4] == 0);
  float g = 2.5f;
  assert_int_equal(lp_comm_allreduce_sum_float(d, &g, 1, NULL), LP_OK);
  assert_int_equal(lp_comm_barrier(d, NULL), LP_OK);
  lp_comm_free(d);
  lp_comm_free(c);
}

static void test_alltoallv_watchdog(void **state) {
  (void)state;
  fake f = {.polls_to_finish = -1};
  lp_comm *c;
  assert_int_equal(lp_comm_new(&fake_backend, 1, 3, 100, &f, &c), LP_OK);
  lp_comm_set_timeout(c, 0.05);
  float s[8] = {0}, r[8];
  size_t sc[3] = {0, 2, 5}, sd[3] = {0, 0, 2}, rc[3] = {1, 2, 0}, rd[3] = {0, 1, 3};
  lp_comm_req *q;
  assert_int_equal(lp_comm_ialltoallv(c, s, sc, sd, r, rc, rd, &q), LP_OK);
  assert_int_equal(lp_comm_wait(c, &q, "rank 1: dispatch of layer 3 (5F2) waits"),
                   LP_ERR_TIMEOUT);
  assert_string_equal(lp_comm_last_error(c),
                      "timed out after 0.05 s (LUAPIPE_TIMEOUT) in an "
                      "all-to-all-v on rank 1 (3 ranks) sending 5 floats to "
                      "and receiving 1 float from other ranks: rank 1: "
                      "dispatch of layer 3 (5F2) waits");
  assert_non_null(q);
  lp_comm_cancel(c, &q);
  assert_int_equal(lp_comm_alltoallv(c, s, sc, sd, r, rc, rd, NULL), LP_ERR_TIMEOUT);
  lp_comm_free(c);
  /* a backend without the operations says so */
  lp_comm_backend nope = fake_backend;
  nope.ialltoallv = NULL;
  lp_comm *d;
  assert_int_equal(lp_comm_new(&nope, 1, 3, 100, &f, &d), LP_OK);
  assert_int_equal(lp_comm_ialltoallv(d, s, sc, sd, r, rc, rd, &q), LP_ERR_UNSUPPORTED);
  assert_string_equal(lp_comm_last_error(d), "all-to-all-v: the fake backend has none");
  assert_int_equal(lp_comm_split(d, 0, 0, &c), LP_ERR_UNSUPPORTED);
  assert_string_equal(lp_comm_last_error(d),
                      "split: the fake backend cannot split a communicator");
  lp_comm_free(d);
}

/* All-gather on one rank: the piece comes back; all-gather-v of one piece
 * (and of none); the checks; a peer that never joins times out with the
 * operation named; a backend without it says so. */
static void test_allgather(void **state) {
  (void)state;
  lp_comm *c;
  assert_int_equal(lp_comm_self_new(&c), LP_OK);
  double mine[2] = {1.25, -3.0}, all[2] = {0, 0};
  assert_int_equal(lp_comm_allgather(c, mine, sizeof mine, all, "figures"), LP_OK);
  assert_true(all[0] == 1.25 && all[1] == -3.0);
  assert_int_equal(lp_comm_allgather(c, NULL, 0, NULL, NULL), LP_OK);
  assert_int_equal(lp_comm_allgather(c, mine, 8, NULL, NULL), LP_ERR_ARG);
  assert_string_equal(lp_comm_last_error(c),
                      "all-gather of 8 bytes per rank on rank 0: NULL buffer");
  void *out = NULL;
  size_t sizes[1] = {99};
  assert_int_equal(lp_comm_allgatherv(c, "abc", 3, &out, sizes, NULL), LP_OK);
  assert_int_equal(sizes[0], 3);
  assert_memory_equal(out, "abc", 3);
  lp_free(out);
  assert_int_equal(lp_comm_allgatherv(c, NULL, 0, &out, sizes, NULL), LP_OK);
  assert_int_equal(sizes[0], 0);
  assert_null(out);
  lp_comm_free(c);
  fake f = {.polls_to_finish = -1};
  assert_int_equal(lp_comm_new(&fake_backend, 1, 3, 100, &f, &c), LP_OK);
  lp_comm_set_timeout(c, 0.05);
  double three[6];
  assert_int_equal(lp_comm_allgather(c, mine, sizeof mine, three, "the job's timing"),
                   LP_ERR_TIMEOUT);
  assert_string_equal(lp_comm_last_error(c),
                      "timed out after 0.05 s (LUAPIPE_TIMEOUT) in an all-gather of 16 "
                      "bytes per rank on rank 1 (3 ranks): the job's timing");
  lp_comm_free(c);
  lp_comm_backend nope = fake_backend;
  nope.iallgather = NULL;
  assert_int_equal(lp_comm_new(&nope, 1, 3, 100, &f, &c), LP_OK);
  assert_int_equal(lp_comm_allgather(c, mine, sizeof mine, three, NULL), LP_ERR_UNSUPPORTED);
  assert_string_equal(lp_comm_last_error(c), "all-gather: the fake backend has none");
  assert_int_equal(lp_comm_allgatherv(c, mine, sizeof mine, &out, sizes, NULL),
                   LP_ERR_UNSUPPORTED);
  assert_null(out);
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
      cmocka_unit_test(test_link_parse),
      cmocka_unit_test(test_link_env),
      cmocka_unit_test(test_link_delays_messages),
      cmocka_unit_test(test_self_alltoallv),
      cmocka_unit_test(test_alltoallv_watchdog),
      cmocka_unit_test(test_allgather),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
