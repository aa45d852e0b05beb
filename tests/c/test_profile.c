/* test_profile.c — the C API of core/profile: figures in exact
 * nanoseconds (decimal microseconds kept to the nanosecond), classes set
 * by name index (LP_ERR_ARG out of range), operations in start order with
 * their phase, error statuses with one line naming the file, and every
 * allocation failure returning LP_ERR_NOMEM without a leak. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "lp_profile.h"
#include "lp_test_oom.h"

static char path[64];

static const char trace[] =
    "{\"traceEvents\":[\n"
    "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"outer\",\"pid\":5,\"tid\":5,\"ts\":0,"
    "\"dur\":100},\n"
    "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"a\",\"pid\":5,\"tid\":5,\"ts\":1,"
    "\"dur\":9},\n"
    "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"b\",\"pid\":5,\"tid\":5,\"ts\":10,"
    "\"dur\":10},\n"
    "{\"ph\":\"X\",\"cat\":\"cuda_runtime\",\"name\":\"cudaLaunchKernel\",\"pid\":5,\"tid\":5,"
    "\"ts\":2,\"dur\":1,\"args\":{\"correlation\":11}},\n"
    "{\"ph\":\"X\",\"cat\":\"cuda_runtime\",\"name\":\"cudaLaunchKernel\",\"pid\":5,\"tid\":6,"
    "\"ts\":12,\"dur\":1,\"args\":{\"correlation\":12}},\n"
    "{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"gemm\",\"pid\":0,\"tid\":7,\"ts\":20.125,"
    "\"dur\":10.5,\"args\":{\"stream\":7,\"correlation\":11}},\n"
    "{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"nccl_allreduce\",\"pid\":0,\"tid\":9,\"ts\":25,"
    "\"dur\":10,\"args\":{\"stream\":9,\"correlation\":12}},\n"
    "{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"gemm\",\"pid\":0,\"tid\":7,\"ts\":40,\"dur\":1,"
    "\"args\":{\"stream\":7,\"correlation\":99}}\n"
    "]}\n";

static void write_trace(const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int setup(void **state) {
  (void)state;
  snprintf(path, sizeof path, "/tmp/lp_test_profile_%ld.json", (long)getpid());
  return 0;
}

static int teardown(void **state) {
  (void)state;
  remove(path);
  return 0;
}

static void test_figures(void **state) {
  (void)state;
  write_trace(trace);
  lp_profile *p = lp_profile_new();
  assert_non_null(p);
  assert_int_equal(lp_profile_read(p, path), LP_OK);
  assert_int_equal(lp_profile_name_count(p), 2);
  int comm = -1;
  for (int i = 0; i < 2; i++) {
    const char *cat;
    int64_t ops, total;
    const char *n = lp_profile_name(p, i, &cat, &ops, &total);
    assert_string_equal(cat, "kernel");
    if (strcmp(n, "nccl_allreduce") == 0) comm = i;
    else assert_int_equal(total, 11500); /* 10.5 + 1 us */
  }
  assert_true(comm >= 0);
  assert_int_equal(lp_profile_set_class(p, comm, LP_PROFILE_COMM), LP_OK);
  assert_int_equal(lp_profile_set_class(p, 2, LP_PROFILE_COMM), LP_ERR_ARG);
  assert_int_equal(lp_profile_set_class(p, 0, LP_PROFILE_NCLASS), LP_ERR_ARG);
  assert_int_equal(lp_profile_analyze(p), LP_OK);
  assert_int_equal(lp_profile_rank_count(p), 1);
  const lp_profile_rank *r = lp_profile_rank_at(p, 0);
  assert_int_equal(r->rank, 0);
  assert_int_equal(r->t0_ns, 20125);
  assert_int_equal(r->span_ns, 41000 - 20125);
  assert_int_equal(r->busy_ns[LP_PROFILE_COMPUTE], 10500 + 1000);
  assert_int_equal(r->busy_ns[LP_PROFILE_COMM], 10000);
  assert_int_equal(r->overlap_ns, 30625 - 25000);
  assert_int_equal(r->exposed_ns, 10000 - 5625);
  assert_int_equal(r->idle_ns, (41000 - 20125) - (35000 - 20125) - 1000);
  assert_int_equal(r->nstreams, 2);
  assert_int_equal(r->streams[0].stream, 7);
  assert_int_equal(r->streams[1].stream, 9);
  /* phases: a and b (outer holds them); b's kernel came from thread 6 */
  assert_int_equal(r->nphases, 2);
  assert_string_equal(lp_profile_annotation_name(p, r->phases[0].name), "a");
  assert_int_equal(r->phases[0].gpu_ns, 10500);
  assert_int_equal(r->phases[0].ops, 1);
  assert_string_equal(lp_profile_annotation_name(p, r->phases[1].name), "b");
  assert_int_equal(r->phases[1].class_ns[LP_PROFILE_COMM], 10000);
  assert_int_equal(r->phases[1].cpu_dur_ns, 10000);
  assert_int_equal(r->unattributed_ops, 1); /* correlation 99 has no call */
  assert_int_equal(lp_profile_rank_ops(p, 0, 0, NULL), 3);
  lp_profile_op_view v[3];
  for (int j = 0; j < 3; j++) lp_profile_rank_ops(p, 0, j, &v[j]);
  assert_int_equal(v[0].start_ns, 0);
  assert_int_equal(v[0].phase, 0);
  assert_int_equal(v[1].start_ns, 25000 - 20125);
  assert_int_equal(v[1].cls, LP_PROFILE_COMM);
  assert_int_equal(v[1].stream, 1);
  assert_int_equal(v[1].phase, 1);
  assert_int_equal(v[2].phase, -1);
  /* a class change and a second analysis */
  assert_int_equal(lp_profile_set_class(p, comm, LP_PROFILE_IGNORE), LP_OK);
  assert_int_equal(lp_profile_analyze(p), LP_OK);
  r = lp_profile_rank_at(p, 0);
  assert_int_equal(r->busy_ns[LP_PROFILE_COMM], 0);
  assert_int_equal(r->ops, 2);
  lp_profile_free(p);
}

static void test_errors(void **state) {
  (void)state;
  write_trace("{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"k\",\"ts\":1}]}");
  lp_profile *p = lp_profile_new();
  assert_int_equal(lp_profile_read(p, path), LP_ERR_PARSE);
  char want[256];
  snprintf(want, sizeof want,
           "%s: traceEvents[0] (\"k\"): a complete event (\"ph\": \"X\") without \"dur\"", path);
  assert_string_equal(lp_profile_last_error(p), want);
  lp_profile_free(p);
  p = lp_profile_new();
  assert_int_equal(lp_profile_read(p, "/nonexistent/x.json"), LP_ERR_IO);
  assert_non_null(strstr(lp_profile_last_error(p), "/nonexistent/x.json: cannot open"));
  lp_profile_free(p);
}

static lp_status oom_scenario(void) {
  lp_profile *p = lp_profile_new();
  if (!p) return LP_ERR_NOMEM;
  lp_status st = lp_profile_read(p, path);
  if (st == LP_OK) st = lp_profile_analyze(p);
  lp_profile_free(p);
  return st;
}

static void test_out_of_memory(void **state) {
  (void)state;
  write_trace(trace);
  int points = lp_test_oom_points(oom_scenario, 10000);
  assert_true(points > 10);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_figures, setup, teardown),
      cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_out_of_memory, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
