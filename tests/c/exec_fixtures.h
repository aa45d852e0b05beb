/* exec_fixtures.h — the executor tests' shared pieces (test_exec,
 * test_checkpoint, test_exec_device, test_exec_pairs): the one-rank
 * schedule of two model stages written as action text, the small MLP they
 * train split into stages, and its deterministic data. Include after
 * cmocka.h. */
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "lp_exec.h"

/* One rank, two model stages both on rank 0, M micro-batches, the actions
 * `acts` in order; copies = 2 places each stage twice (micro-batches 0-1
 * take virtual stages 0, 1 and 2-3 take 2, 3); name NULL for none. Fails
 * the test unless it validates. */
static inline lp_schedule *fx_two_stage(int M, const char *const *acts, int n, int copies,
                                        const char *name) {
  lp_schedule *s = NULL;
  assert_int_equal(lp_schedule_new(1, 2, M, &s), LP_OK);
  if (name) assert_int_equal(lp_schedule_set_name(s, name), LP_OK);
  for (int c = 0; c < copies; c++) {
    assert_int_equal(lp_schedule_add_vstage(s, 0, 0, NULL), LP_OK);
    assert_int_equal(lp_schedule_add_vstage(s, 1, 0, NULL), LP_OK);
  }
  int ra[2] = {0, 1}, rb[2] = {2, 3};
  for (int mb = 0; mb < M; mb++)
    assert_int_equal(lp_schedule_set_route(s, mb, copies == 2 && mb >= 2 ? rb : ra, 2), LP_OK);
  for (int i = 0; i < n; i++)
    assert_int_equal(lp_schedule_push_text(s, 0, acts[i]), LP_OK);
  if (lp_schedule_validate(s) != LP_OK) fail_msg("invalid: %s", lp_schedule_last_error(s));
  return s;
}

/* Model stage `stage` of `nstages` of the MLP linear(d_in, d_h) + gelu |
 * [linear(d_h, d_h) + gelu ...] | linear(d_h, d_out): layers named
 * "layers.<2 stage>" and "layers.<2 stage + 1>", the chunk "stage.<stage>";
 * parameters from seed. */
static inline lp_status fx_mlp_stage(int stage, int nstages, int d_in, int d_h, int d_out,
                                     uint64_t seed, lp_nn_layer **out) {
  lp_nn_layer *ls[2] = {NULL, NULL};
  char n0[32], n1[32], cn[32];
  snprintf(n0, sizeof n0, "layers.%d", 2 * stage);
  snprintf(n1, sizeof n1, "layers.%d", 2 * stage + 1);
  snprintf(cn, sizeof cn, "stage.%d", stage);
  lp_status st;
  if (stage < nstages - 1) {
    st = lp_nn_linear_new(n0, stage ? d_h : d_in, d_h, 1, seed, &ls[0]);
    if (st == LP_OK) st = lp_nn_act_new(n1, LP_TENSOR_ACT_GELU, &ls[1]);
  } else {
    st = lp_nn_linear_new(n0, d_h, d_out, 1, seed, &ls[0]);
  }
  if (st == LP_OK) st = lp_nn_chunk_new(cn, ls, ls[1] ? 2 : 1, out);
  lp_nn_layer_release(ls[0]);
  lp_nn_layer_release(ls[1]);
  return st;
}

/* The data of micro-batch mb of step `step`: input values sin(0.3 step +
 * 1.1 mb + 0.7 i) in shape in_shape (in_ndim dims), targets cos(0.5 step +
 * 0.9 mb + 0.4 i) in tg_shape, host tensors; a NULL pointer skips one. */
static inline void fx_wave_data(int64_t step, int mb, int in_ndim, const int64_t *in_shape,
                                int tg_ndim, const int64_t *tg_shape, lp_tensor **in,
                                lp_tensor **tg) {
  int64_t nin = 1, ntg = 1;
  for (int d = 0; d < in_ndim; d++)
    nin *= in_shape[d];
  for (int d = 0; d < tg_ndim; d++)
    ntg *= tg_shape[d];
  float *x = malloc((size_t)(nin + ntg) * sizeof *x), *y = x + nin;
  assert_non_null(x);
  for (int64_t i = 0; i < nin; i++)
    x[i] = (float)sin(0.3 * (double)step + 1.1 * mb + 0.7 * (double)i);
  for (int64_t i = 0; i < ntg; i++)
    y[i] = (float)cos(0.5 * (double)step + 0.9 * mb + 0.4 * (double)i);
  if (in) assert_int_equal(lp_tensor_from_data(NULL, in_ndim, in_shape, x, in), LP_OK);
  if (tg) assert_int_equal(lp_tensor_from_data(NULL, tg_ndim, tg_shape, y, tg), LP_OK);
  free(x);
}
