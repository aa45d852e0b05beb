/* test_comm_staged.c — the "mpi-staged" comm wrapper over device memory
 * (the fake:0 backend, whose memory the host cannot touch) and the
 * LUAPIPE_COMM choice. Alone it runs over a self context; under mpirun
 * (tests/mpi/test_comm_staged.sh) over the MPI world: a ring of
 * send/receive, an uneven all-to-all-v, all-reduce, broadcast, all-gather
 * and split, every result checked on the host. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_comm_gpu.h"
#include "lp_test_fake_backend.h"

static lp_comm *W, *D; /* world; staged over world */

static float *dev_from(const float *h, size_t n) {
  float *d = fake.alloc(&fake, (n ? n : 1) * sizeof *d);
  assert_non_null(d);
  assert_int_equal(fake.from_host(&fake, d, h, n * sizeof *d), LP_OK);
  return d;
}

static float *host_from(const float *d, size_t n) {
  float *h = lp_malloc((n ? n : 1) * sizeof *h);
  assert_int_equal(fake.to_host(&fake, h, d, n * sizeof *h), LP_OK);
  return h;
}

static void test_ring(void **state) {
  (void)state;
  int r = lp_comm_rank(D), n = lp_comm_size(D);
  if (n < 2) skip();
  float out[5], *in;
  for (int i = 0; i < 5; i++) out[i] = (float)(100 * r + i);
  float *dout = dev_from(out, 5), *din = fake.alloc(&fake, 5 * sizeof(float));
  lp_comm_req *reqs[2];
  /* receive first, then send: both must finish under one wait */
  assert_int_equal(lp_comm_irecv(D, din, 5, (r + n - 1) % n, 7, &reqs[0]), LP_OK);
  assert_int_equal(lp_comm_isend(D, dout, 5, (r + 1) % n, 7, &reqs[1]), LP_OK);
  assert_int_equal(lp_comm_waitall(D, reqs, 2, "ring"), LP_OK);
  in = host_from(din, 5);
  for (int i = 0; i < 5; i++)
    assert_float_equal(in[i], (float)(100 * ((r + n - 1) % n) + i), 0);
  lp_free(in);
  fake.free(&fake, dout), fake.free(&fake, din);
}

static void test_alltoallv(void **state) {
  (void)state;
  int r = lp_comm_rank(D), n = lp_comm_size(D);
  size_t sc[8], sd[8], rc[8], rd[8], so = 0, ro = 0;
  /* rank r sends r + p + 1 floats to rank p; receive displacements leave a
   * gap of 1 float that must stay untouched */
  for (int p = 0; p < n; p++) {
    sc[p] = (size_t)(r + p + 1), sd[p] = so, so += sc[p];
    rc[p] = (size_t)(p + r + 1), rd[p] = ro, ro += rc[p] + 1;
  }
  float *send = lp_malloc(so * sizeof *send), *recv0 = lp_malloc(ro * sizeof *recv0);
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < sc[p]; i++) send[sd[p] + i] = (float)(1000 * r + 10 * p + (int)i);
  for (size_t i = 0; i < ro; i++) recv0[i] = -1.0f;
  float *dsend = dev_from(send, so), *drecv = dev_from(recv0, ro);
  assert_int_equal(lp_comm_alltoallv(D, dsend, sc, sd, drecv, rc, rd, "a2a"), LP_OK);
  float *got = host_from(drecv, ro);
  for (int p = 0; p < n; p++) {
    for (size_t i = 0; i < rc[p]; i++)
      assert_float_equal(got[rd[p] + i], (float)(1000 * p + 10 * r + (int)i), 0);
    assert_float_equal(got[rd[p] + rc[p]], -1.0f, 0); /* the gap */
  }
  lp_free(send), lp_free(recv0), lp_free(got);
  fake.free(&fake, dsend), fake.free(&fake, drecv);
}

static void test_collectives(void **state) {
  (void)state;
  int r = lp_comm_rank(D), n = lp_comm_size(D);
  float v[3] = {(float)r, 1.0f, (float)(r * r)};
  float *dv = dev_from(v, 3);
  assert_int_equal(lp_comm_allreduce_sum_float(D, dv, 3, "sum"), LP_OK);
  float *h = host_from(dv, 3);
  float s = 0, s2 = 0;
  for (int i = 0; i < n; i++) s += (float)i, s2 += (float)(i * i);
  assert_float_equal(h[0], s, 0);
  assert_float_equal(h[1], (float)n, 0);
  assert_float_equal(h[2], s2, 0);
  lp_free(h);
  float b[2] = {(float)(7 + r), 9.0f};
  float *db = dev_from(b, 2);
  assert_int_equal(lp_comm_bcast(D, db, sizeof b, n - 1, "bcast"), LP_OK);
  h = host_from(db, 2);
  assert_float_equal(h[0], (float)(7 + n - 1), 0);
  lp_free(h);
  assert_int_equal(lp_comm_barrier(D, "barrier"), LP_OK);
  /* all-gather: every rank's two floats, in rank order, on the device */
  float g[2] = {(float)(10 * r), (float)(10 * r + 1)}, *dg = dev_from(g, 2);
  float *dall = fake.alloc(&fake, 2 * (size_t)n * sizeof(float));
  assert_int_equal(lp_comm_allgather(D, dg, sizeof g, dall, "gather"), LP_OK);
  h = host_from(dall, 2 * (size_t)n);
  for (int i = 0; i < n; i++) {
    assert_float_equal(h[2 * i], (float)(10 * i), 0);
    assert_float_equal(h[2 * i + 1], (float)(10 * i + 1), 0);
  }
  lp_free(h);
  fake.free(&fake, dg), fake.free(&fake, dall);
  /* split: even and odd ranks; the sub-context is staged too */
  lp_comm *sub = NULL;
  assert_int_equal(lp_comm_split(D, r % 2, r, &sub), LP_OK);
  assert_string_equal(lp_comm_backend_name(sub), "mpi-staged");
  float one = 1.0f, *d1 = dev_from(&one, 1);
  assert_int_equal(lp_comm_allreduce_sum_float(sub, d1, 1, "count"), LP_OK);
  h = host_from(d1, 1);
  assert_float_equal(h[0], (float)((n + (r % 2 ? 0 : 1)) / 2), 0);
  lp_free(h);
  lp_comm_free(sub);
  fake.free(&fake, dv), fake.free(&fake, db), fake.free(&fake, d1);
}

static void test_choice(void **state) {
  (void)state;
  lp_comm *c = NULL;
  int owned = -1;
  /* host tensors: the world itself */
  assert_int_equal(lp_comm_for_backend(W, lp_tensor_backend_cpu(), &c, &owned), LP_OK);
  assert_ptr_equal(c, W);
  assert_int_equal(owned, 0);
  /* a device backend that is not CUDA: staged (NCCL needs a CUDA device) */
  unsetenv("LUAPIPE_COMM");
  assert_int_equal(lp_comm_for_backend(W, &fake, &c, &owned), LP_OK);
  assert_string_equal(lp_comm_backend_name(c), "mpi-staged");
  assert_int_equal(owned, 1);
  lp_comm_free(c);
  setenv("LUAPIPE_COMM", "mpi", 1);
  assert_int_equal(lp_comm_for_backend(W, &fake, &c, &owned), LP_OK);
  assert_string_equal(lp_comm_backend_name(c), "mpi-staged");
  lp_comm_free(c);
  setenv("LUAPIPE_COMM", "nccl", 1);
  assert_int_equal(lp_comm_for_backend(W, &fake, &c, &owned), LP_ERR_ARG);
  assert_null(c);
  assert_string_equal(lp_comm_last_error(W),
                      "LUAPIPE_COMM=nccl needs tensors on a CUDA device, not fake:0");
  setenv("LUAPIPE_COMM", "gloo", 1);
  assert_int_equal(lp_comm_for_backend(W, &fake, &c, &owned), LP_ERR_ARG);
  assert_string_equal(lp_comm_last_error(W), "LUAPIPE_COMM=gloo: use nccl or mpi");
  unsetenv("LUAPIPE_COMM");
}

int main(int argc, char **argv) {
  fake_backend_init();
  if (lp_comm_mpi_init(&argc, &argv) != LP_OK) return 1;
  W = lp_comm_world();
  if (lp_comm_staged_new(W, &fake, &D) != LP_OK) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring),
      cmocka_unit_test(test_alltoallv),
      cmocka_unit_test(test_collectives),
      cmocka_unit_test(test_choice),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  lp_comm_free(D);
  return rc;
}
