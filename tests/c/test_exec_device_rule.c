/* test_exec_device_rule.c — the rule that picks a rank's training device
 * (core/exec/device.c): names parsed or refused with their text, the local
 * rank modulo the visible devices for "cuda", an explicit index kept, no
 * visible device refused, the launcher's local-rank variables, and
 * lp_exec_device end to end on this machine (the CPU always; a GPU when
 * one is visible, else the reason it cannot be used). */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_exec.h"
#include "lp_kernels.h"

static void test_parse(void **state) {
  (void)state;
  char err[LP_ERRLEN] = "";
  int want = 99;
  assert_int_equal(lp_exec_device_parse("cpu", &want, err), LP_OK);
  assert_int_equal(want, LP_DEVICE_CPU);
  assert_int_equal(lp_exec_device_parse("cuda", &want, err), LP_OK);
  assert_int_equal(want, LP_DEVICE_LOCAL);
  assert_int_equal(lp_exec_device_parse("cuda:0", &want, err), LP_OK);
  assert_int_equal(want, 0);
  assert_int_equal(lp_exec_device_parse("cuda:1023", &want, err), LP_OK);
  assert_int_equal(want, 1023);
  static const char *const bad[] = {"gpu", "CUDA", "cuda:", "cuda:-1", "cuda:+1", "cuda: 1",
                                    "cuda:1x", "cuda:1024", "cuda1", "", "cpu:0"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    want = 99;
    assert_int_equal(lp_exec_device_parse(bad[i], &want, err), LP_ERR_ARG);
    assert_int_equal(want, LP_DEVICE_CPU);
    char expect[LP_ERRLEN];
    snprintf(expect, sizeof expect, "device '%s' is not cpu, cuda or cuda:N", bad[i]);
    assert_string_equal(err, expect);
  }
  assert_int_equal(lp_exec_device_parse(NULL, &want, err), LP_ERR_ARG);
}

static void test_pick(void **state) {
  (void)state;
  char err[LP_ERRLEN] = "";
  int dev = 99;
  /* the CPU needs no device */
  assert_int_equal(lp_exec_device_pick("cpu", LP_DEVICE_CPU, 5, 0, &dev, err), LP_OK);
  assert_int_equal(dev, LP_DEVICE_CPU);
  /* "cuda": local rank modulo the visible devices */
  int expect[] = {0, 1, 2, 0, 1, 2, 0};
  for (int r = 0; r < 7; r++) {
    assert_int_equal(lp_exec_device_pick("cuda", LP_DEVICE_LOCAL, r, 3, &dev, err), LP_OK);
    assert_int_equal(dev, expect[r]);
  }
  assert_int_equal(lp_exec_device_pick("cuda", LP_DEVICE_LOCAL, 3, 1, &dev, err), LP_OK);
  assert_int_equal(dev, 0);
  /* "cuda:N": N, whichever rank asks */
  assert_int_equal(lp_exec_device_pick("cuda:2", 2, 0, 4, &dev, err), LP_OK);
  assert_int_equal(dev, 2);
  assert_int_equal(lp_exec_device_pick("cuda:2", 2, 3, 4, &dev, err), LP_OK);
  assert_int_equal(dev, 2);
  /* a device wanted, none visible */
  dev = 99;
  assert_int_equal(lp_exec_device_pick("cuda", LP_DEVICE_LOCAL, 0, 0, &dev, err),
                   LP_ERR_UNSUPPORTED);
  assert_int_equal(dev, LP_DEVICE_CPU);
  assert_string_equal(err, "device 'cuda' requested but no CUDA device is visible");
  assert_int_equal(lp_exec_device_pick("cuda:1", 1, 0, 0, &dev, err), LP_ERR_UNSUPPORTED);
  assert_string_equal(err, "device 'cuda:1' requested but no CUDA device is visible");
}

static void test_local_rank(void **state) {
  (void)state;
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("MPI_LOCALRANKID");
  unsetenv("SLURM_LOCALID");
  assert_int_equal(lp_exec_local_rank(), 0);
  setenv("SLURM_LOCALID", "5", 1);
  assert_int_equal(lp_exec_local_rank(), 5);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1); /* Open MPI's first */
  assert_int_equal(lp_exec_local_rank(), 3);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x", 1); /* not a number: the next one */
  assert_int_equal(lp_exec_local_rank(), 5);
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
}

static void test_device_here(void **state) {
  (void)state;
  char err[LP_ERRLEN] = "";
  const lp_tensor_backend *be = (const lp_tensor_backend *)1;
  assert_int_equal(lp_exec_device("cpu", &be, err), LP_OK);
  assert_null(be);
  assert_int_equal(lp_exec_device("tpu", &be, err), LP_ERR_ARG);
  assert_string_equal(err, "device 'tpu' is not cpu, cuda or cuda:N");
  int gpus = lp_kernels_load() == LP_KERNELS_OK ? lp_kernels_device_count() : 0;
  lp_status st = lp_exec_device("cuda", &be, err);
  if (gpus > 0) {
    assert_int_equal(st, LP_OK);
    assert_non_null(be);
    assert_int_equal(strncmp(be->name, "cuda:", 5), 0);
  } else {
    assert_int_not_equal(st, LP_OK);
    assert_null(be);
    assert_int_equal(strncmp(err, "device 'cuda' requested but ", 28), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),
      cmocka_unit_test(test_pick),
      cmocka_unit_test(test_local_rank),
      cmocka_unit_test(test_device_here),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
