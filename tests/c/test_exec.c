/* test_exec.c — the executor on one process (self comm): a two-stage model
 * on one rank run with F/B and with FB pairs gives the no-pipeline
 * reference's losses and parameters bitwise, with I/W split within 1e-6
 * (weight-grads out of micro-batch order); an overlapped_fb hook is called
 * for FB actions; two local copies of each stage are summed implicitly or at
 * REDUCE_GRAD actions; misuse errors (wrong rank count, missing activation
 * shape, a failing data source, recovery on the next step). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "exec_fixtures.h"
#include "lp_exec.h"
#include "lp_test_oom.h"

#define D_IN 5
#define D_H 7
#define D_OUT 3
#define BATCH 4
#define MB 4

/* stage 0: linear(5,7) + gelu; stage 1: linear(7,3) */
static lp_status build_stage(int stage, uint64_t seed, lp_nn_layer **out) {
  return fx_mlp_stage(stage, 2, D_IN, D_H, D_OUT, seed, out);
}

static lp_status chunk_fn(void *ud, int stage, lp_nn_layer **out, char *err) {
  (void)ud;
  (void)err;
  return build_stage(stage, 42, out);
}

static int data_calls, data_fail, fb_calls;

static lp_status data_fn(void *ud, int64_t step, int mb, lp_tensor **in, lp_tensor **tg,
                         char *err) {
  (void)ud;
  data_calls++;
  if (data_fail) {
    lp_errf(err, "no data for micro-batch %d", mb);
    return LP_ERR_IO;
  }
  fx_wave_data(step, mb, 2, (int64_t[]){BATCH, D_IN}, 2, (int64_t[]){BATCH, D_OUT}, in, tg);
  return LP_OK;
}

static const int act_ndim[2] = {0, 2};
static const int64_t act_shape[2][LP_TENSOR_MAXDIM] = {{0}, {BATCH, D_H}};

static lp_exec_opts base_opts(void) {
  lp_exec_opts o;
  memset(&o, 0, sizeof o);
  o.chunk = chunk_fn;
  o.data = data_fn;
  o.loss = LP_NN_LOSS_MSE;
  o.act_ndim = act_ndim;
  o.act_shape = act_shape;
  o.optim = LP_NN_OPTIM_SGD;
  o.sgd = (lp_nn_sgd_opts){0.1f, 0.9f, 0.0f};
  o.trace = 1;
  return o;
}

/* One rank, two stages (both on rank 0), actions from text. */
static lp_schedule *two_stage(const char *const *acts, int n) {
  return fx_two_stage(MB, acts, n, 1, NULL);
}

/* Trains 3 steps with schedule s and with the reference; compares. */
/* exact: bitwise (weight-grads accumulate in the reference's order);
 * otherwise within 1e-6 (another accumulation order). */
static void check_against_reference(lp_schedule *s, lp_exec_fb_fn hook, int exact) {
  lp_exec_opts o = base_opts();
  o.overlapped_fb = hook;
  lp_exec *e = NULL;
  char err[LP_ERRLEN] = "";
  lp_status st = lp_exec_new(s, &o, &e, err);
  if (st != LP_OK) fail_msg("lp_exec_new: %s", err);

  lp_nn_layer *ref[2], *full = NULL;
  assert_int_equal(build_stage(0, 42, &ref[0]), LP_OK);
  assert_int_equal(build_stage(1, 42, &ref[1]), LP_OK);
  assert_int_equal(lp_nn_chunk_new("model", ref, 2, &full), LP_OK);
  size_t np;
  const lp_nn_param *p = lp_nn_params(full, &np);
  lp_nn_optim *opt = NULL;
  assert_int_equal(lp_nn_optim_sgd_new(p, np, &o.sgd, &opt), LP_OK);

  for (int k = 1; k <= 3; k++) {
    double l1 = 0, l2 = 0;
    st = lp_exec_step(e, k, &l1);
    if (st != LP_OK) fail_msg("step %d: %s", k, lp_exec_last_error(e));
    assert_int_equal(lp_exec_reference_step(full, opt, LP_NN_LOSS_MSE, MB, data_fn, NULL, k,
                                            &l2, err),
                     LP_OK);
    assert_true(exact ? l1 == l2 : fabs(l1 - l2) <= 1e-6 * fabs(l2));
  }
  /* parameters: bitwise equal to the reference */
  assert_int_equal(lp_exec_vstages(e), 2);
  size_t idx = 0;
  for (int i = 0; i < 2; i++) {
    size_t n;
    const lp_nn_param *q = lp_nn_params(lp_exec_vstage_chunk(e, i), &n);
    for (size_t j = 0; j < n; j++, idx++) {
      assert_string_equal(q[j].name, p[idx].name);
      if (exact) {
        assert_true(lp_tensor_equal(q[j].value, p[idx].value));
      } else {
        double d;
        assert_int_equal(lp_tensor_max_abs_diff(q[j].value, p[idx].value, &d), LP_OK);
        assert_true(d <= 1e-6);
      }
    }
  }
  assert_int_equal(idx, np);
  int nev = 0;
  lp_trace_events(lp_exec_trace(e), &nev);
  assert_true(nev > 0);
  double wall, busy;
  lp_exec_last_timing(e, &wall, &busy);
  assert_true(wall > 0 && busy > 0 && busy <= wall * 1.01);
  /* always-on timing: the parts add up; every compute action counted */
  lp_exec_timing tl, tt;
  lp_exec_timing_of(e, 0, &tl);
  lp_exec_timing_of(e, 1, &tt);
  assert_int_equal(tl.steps, 1);
  assert_int_equal(tt.steps, 3);
  assert_true(tl.wall == wall && tl.compute > 0 && tl.compute <= tl.wall * 1.0001);
  assert_true(tl.wait >= 0 && tl.post >= 0 && tl.optim >= 0 && tl.optim <= tl.compute);
  assert_true(fabs(tl.overhead - (tl.wall - tl.compute - tl.wait)) < 1e-12);
  assert_true(tt.wall >= tl.wall && tt.compute >= tl.compute);
  int64_t nacts = 0, nlast = 0;
  for (int k = 0; k < LP_EXEC_NKINDS; k++) {
    for (int stg = 0; stg < lp_schedule_stages(s); stg++) {
      double sum = -1;
      int64_t n = -1, n1 = -1;
      assert_int_equal(lp_exec_action_time(e, 1, k, stg, &sum, &n), LP_OK);
      assert_int_equal(lp_exec_action_time(e, 0, k, stg, NULL, &n1), LP_OK);
      assert_true(sum >= 0 && (n > 0 || sum == 0));
      nacts += n;
      nlast += n1;
    }
  }
  int ncomp = 0;
  for (int r = 0; r < lp_schedule_ranks(s); r++) {
    int n;
    const lp_action *acts = lp_schedule_actions(s, r, &n);
    for (int i = 0; i < n; i++) ncomp += lp_action_is_compute(acts[i].type);
  }
  assert_int_equal(nlast, ncomp);
  assert_int_equal(nacts, 3 * ncomp);
  assert_int_equal(lp_exec_action_time(e, 1, LP_EXEC_NKINDS, 0, NULL, NULL), LP_ERR_ARG);
  assert_int_equal(lp_exec_action_time(e, 1, 0, lp_schedule_stages(s), NULL, NULL), LP_ERR_ARG);
  lp_exec_timing_reset(e);
  lp_exec_timing_of(e, 1, &tt);
  assert_true(tt.steps == 0 && tt.wall == 0);
  lp_nn_optim_free(opt);
  lp_nn_layer_release(full);
  lp_nn_layer_release(ref[0]);
  lp_nn_layer_release(ref[1]);
  lp_exec_free(e);
}

static void test_fb_order(void **state) {
  (void)state;
  const char *acts[] = {"0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1",
                        "0F2", "1F2", "1B2", "0B2", "0F3", "1F3", "1B3", "0B3"};
  lp_schedule *s = two_stage(acts, 16);
  check_against_reference(s, NULL, 1);
  lp_schedule_free(s);
}

static void test_split_backward(void **state) {
  (void)state;
  const char *acts[] = {"0F0", "0F1", "1F0", "1F1", "0F2", "1I0", "1F2", "0I0", "1W0",
                        "1I1", "0F3", "1F3", "0I1", "0W1", "0W0", "1I2", "1W1", "0I2",
                        "1I3", "1W2", "1W3", "0I3", "0W2", "0W3"};
  lp_schedule *s = two_stage(acts, 24);
  check_against_reference(s, NULL, 0);
  lp_schedule_free(s);
}

static lp_status hook(void *ud, lp_exec *e, const lp_action *a) {
  (void)ud;
  fb_calls++;
  LP_CHECK(lp_exec_run_half(e, a->btype, a->bstage, a->bmb));
  return lp_exec_run_half(e, LP_ACT_F, a->stage, a->mb);
}

static void test_overlapped_pairs(void **state) {
  (void)state;
  /* (1F1;1B0): F of mb 1 on stage 1 with B of mb 0 on stage 1 */
  const char *acts[] = {"0F0", "1F0", "0F1", "(1F1;1B0)OVERLAP_F_B", "0B0",
                        "0F2", "(1F2;1B1)OVERLAP_F_B", "0B1", "0F3",
                        "(1F3;1B2)OVERLAP_F_B", "0B2", "1B3", "0B3"};
  lp_schedule *s = two_stage(acts, 13);
  check_against_reference(s, NULL, 1);
  fb_calls = 0;
  check_against_reference(s, hook, 1);
  assert_int_equal(fb_calls, 3 * 3);
  lp_schedule_free(s);
}

/* Two copies of each stage on the one rank (mbs 0-1 through copy A, 2-3
 * through copy B); gradients are summed at the end of the step (implicit)
 * or at explicit REDUCE_GRAD actions: both copies end equal to each other
 * bitwise and to the reference within 1e-6. */
static void run_local_copies(int explicit_reduce) {
  lp_schedule *s = NULL;
  assert_int_equal(lp_schedule_new(1, 2, MB, &s), LP_OK);
  for (int c = 0; c < 2; c++) {
    assert_int_equal(lp_schedule_add_vstage(s, 0, 0, NULL), LP_OK);
    assert_int_equal(lp_schedule_add_vstage(s, 1, 0, NULL), LP_OK);
  }
  int ra[2] = {0, 1}, rb[2] = {2, 3};
  for (int mb = 0; mb < MB; mb++)
    assert_int_equal(lp_schedule_set_route(s, mb, mb < 2 ? ra : rb, 2), LP_OK);
  const char *acts[] = {"0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1", "2F2",
                        "3F2", "3B2", "2B2", "2F3", "3F3", "3B3", "2B3", "0REDUCE_GRAD",
                        "1REDUCE_GRAD", "2REDUCE_GRAD", "3REDUCE_GRAD"};
  /* explicit_reduce 2: PyTorch's FSDP-style actions around it (no-ops
   * here: stages are not sharded) and WAIT_REDUCE_GRAD after each */
  if (explicit_reduce == 2) assert_int_equal(lp_schedule_push_text(s, 0, "0UNSHARD"), LP_OK);
  for (int i = 0; i < (explicit_reduce ? 20 : 16); i++)
    assert_int_equal(lp_schedule_push_text(s, 0, acts[i]), LP_OK);
  if (explicit_reduce == 2)
    for (int v = 0; v < 4; v++) {
      lp_action w = {LP_ACT_WAIT_REDUCE_GRAD, v, -1, -1, -1, -1};
      assert_int_equal(lp_schedule_push(s, 0, &w), LP_OK);
    }
  if (explicit_reduce == 2) assert_int_equal(lp_schedule_push_text(s, 0, "0RESHARD"), LP_OK);
  if (lp_schedule_validate(s) != LP_OK) fail_msg("invalid: %s", lp_schedule_last_error(s));

  lp_exec_opts o = base_opts();
  lp_exec *e = NULL;
  char err[LP_ERRLEN] = "";
  if (lp_exec_new(s, &o, &e, err) != LP_OK) fail_msg("lp_exec_new: %s", err);
  lp_nn_layer *ref[2], *full = NULL;
  assert_int_equal(build_stage(0, 42, &ref[0]), LP_OK);
  assert_int_equal(build_stage(1, 42, &ref[1]), LP_OK);
  assert_int_equal(lp_nn_chunk_new("model", ref, 2, &full), LP_OK);
  size_t np;
  const lp_nn_param *p = lp_nn_params(full, &np);
  lp_nn_optim *opt = NULL;
  assert_int_equal(lp_nn_optim_sgd_new(p, np, &o.sgd, &opt), LP_OK);
  for (int k = 1; k <= 3; k++) {
    double l1 = 0, l2 = 0;
    if (lp_exec_step(e, k, &l1) != LP_OK) fail_msg("step %d: %s", k, lp_exec_last_error(e));
    assert_int_equal(lp_exec_reference_step(full, opt, LP_NN_LOSS_MSE, MB, data_fn, NULL, k,
                                            &l2, err),
                     LP_OK);
    assert_true(fabs(l1 - l2) <= 1e-6 * fabs(l2));
  }
  assert_int_equal(lp_exec_vstages(e), 4);
  for (int i = 0; i < 4; i++) {
    size_t n, n2;
    const lp_nn_param *q = lp_nn_params(lp_exec_vstage_chunk(e, i), &n);
    const lp_nn_param *twin = lp_nn_params(lp_exec_vstage_chunk(e, (i + 2) % 4), &n2);
    assert_int_equal(n, n2);
    for (size_t j = 0; j < n; j++) {
      assert_true(lp_tensor_equal(q[j].value, twin[j].value));
      size_t r = 0;
      while (r < np && strcmp(p[r].name, q[j].name) != 0) r++;
      assert_true(r < np);
      double d;
      assert_int_equal(lp_tensor_max_abs_diff(q[j].value, p[r].value, &d), LP_OK);
      assert_true(d <= 1e-6);
    }
  }
  lp_nn_optim_free(opt);
  lp_nn_layer_release(full);
  lp_nn_layer_release(ref[0]);
  lp_nn_layer_release(ref[1]);
  lp_exec_free(e);
  lp_schedule_free(s);
}

static void test_local_copies(void **state) {
  (void)state;
  run_local_copies(0);
  run_local_copies(1);
  run_local_copies(2);
}

static void test_errors(void **state) {
  (void)state;
  lp_exec_opts o = base_opts();
  lp_exec *e = NULL;
  char err[LP_ERRLEN] = "";
  /* a 2-rank schedule on a 1-rank job */
  lp_schedule *s = NULL;
  assert_int_equal(lp_schedule_new(2, 2, 2, &s), LP_OK);
  lp_schedule_set_name(s, "mine");
  assert_int_equal(lp_schedule_add_vstage(s, 0, 0, NULL), LP_OK);
  assert_int_equal(lp_schedule_add_vstage(s, 1, 1, NULL), LP_OK);
  int route[2] = {0, 1};
  for (int mb = 0; mb < 2; mb++) lp_schedule_set_route(s, mb, route, 2);
  assert_int_equal(lp_exec_new(s, &o, &e, err), LP_ERR_ARG);
  assert_null(e);
  assert_string_equal(err, "schedule 'mine' needs 2 ranks, but this is one process (run it with "
                           "mpirun -np 2)");
  lp_schedule_free(s);

  /* missing activation shape */
  const char *acts[] = {"0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1",
                        "0F2", "1F2", "1B2", "0B2", "0F3", "1F3", "1B3", "0B3"};
  s = two_stage(acts, 16);
  o.act_ndim = NULL;
  assert_int_equal(lp_exec_new(s, &o, &e, err), LP_ERR_ARG);
  assert_string_equal(err, "lp_exec_new: no activation shape for the input of model stage 1");

  /* a failing data source fails the step with its text */
  o = base_opts();
  assert_int_equal(lp_exec_new(s, &o, &e, err), LP_OK);
  data_fail = 1;
  double loss;
  assert_int_equal(lp_exec_step(e, 1, &loss), LP_ERR_IO);
  assert_string_equal(lp_exec_last_error(e),
                      "rank 0, action 0 (0F0): data for micro-batch 0 of step 1: no data for "
                      "micro-batch 0");
  data_fail = 0;
  /* and the executor recovers for the next step */
  assert_int_equal(lp_exec_step(e, 2, &loss), LP_OK);
  assert_true(loss > 0);
  /* no MoE layer: no placement to set, no loads */
  int one[1] = {0}, nl = -1;
  const int *ex = NULL;
  const double *cnt = NULL;
  assert_int_equal(lp_exec_set_placement(e, 0, 1, one, NULL), LP_ERR_ARG);
  assert_string_equal(lp_exec_last_error(e),
                      "set_placement: no MoE layer 0 (the model has 0) or bad slots per rank 1");
  assert_int_equal(lp_exec_expert_loads(e, &nl, &ex, &cnt), LP_OK);
  assert_int_equal(nl, 0);
  assert_null(cnt);
  assert_int_equal(lp_exec_ep(e, NULL), 1);
  lp_exec_free(e);

  /* two copies of each stage with REDUCE_GRAD for three of the four:
   * the fourth is named at the end of the step */
  {
    lp_schedule *c = NULL;
    assert_int_equal(lp_schedule_new(1, 2, MB, &c), LP_OK);
    for (int k = 0; k < 2; k++) {
      assert_int_equal(lp_schedule_add_vstage(c, 0, 0, NULL), LP_OK);
      assert_int_equal(lp_schedule_add_vstage(c, 1, 0, NULL), LP_OK);
    }
    int ra[2] = {0, 1}, rb[2] = {2, 3};
    for (int mb = 0; mb < MB; mb++)
      assert_int_equal(lp_schedule_set_route(c, mb, mb < 2 ? ra : rb, 2), LP_OK);
    const char *ca[] = {"0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1", "2F2",
                        "3F2", "3B2", "2B2", "2F3", "3F3", "3B3", "2B3", "0REDUCE_GRAD",
                        "1REDUCE_GRAD", "2REDUCE_GRAD"};
    for (int i = 0; i < 19; i++) assert_int_equal(lp_schedule_push_text(c, 0, ca[i]), LP_OK);
    if (lp_schedule_validate(c) == LP_OK) {
      lp_exec_opts oc = base_opts();
      assert_int_equal(lp_exec_new(c, &oc, &e, err), LP_OK);
      assert_int_equal(lp_exec_step(e, 1, &loss), LP_ERR_INVALID);
      assert_string_equal(lp_exec_last_error(e),
                          "rank 0: virtual stage 3 is a copy of model stage 1 (replicated) but "
                          "has no REDUCE_GRAD action, while other stages have one: give every "
                          "copy its REDUCE_GRAD");
      lp_exec_free(e);
    } else {
      fail_msg("validation refused a missing REDUCE_GRAD: %s", lp_schedule_last_error(c));
    }
    lp_schedule_free(c);
  }

  /* an EP group the job has no room for: the one rule of the job's shape
   * (lp_exec_grid_check, which luapipe.train asks too) */
  o = base_opts();
  o.ep = 2;
  assert_int_equal(lp_exec_new(s, &o, &e, err), LP_ERR_ARG);
  assert_null(e);
  assert_string_equal(err, "schedule '(unnamed)' runs on 1 pipeline rank; with ep = 2 that is 2 "
                           "ranks, but this is one process");
  char gerr[LP_ERRLEN];
  assert_int_equal(lp_exec_grid_check(2, 2, 4, "x", gerr), LP_OK);
  assert_int_equal(lp_exec_grid_check(3, 0, 3, "x", gerr), LP_OK);
  assert_int_equal(lp_exec_grid_check(1, 2, 3, NULL, gerr), LP_ERR_ARG);
  assert_string_equal(gerr, "pp x ep = 1 x 2 needs 2 ranks, but mpirun started 3 (run it with "
                            "mpirun -np 2)");
  assert_int_equal(lp_exec_grid_check(4, 1, 2, "1f1b", gerr), LP_ERR_ARG);
  assert_string_equal(gerr, "schedule '1f1b' needs 4 ranks, but mpirun started 2 (run it with "
                            "mpirun -np 4)");
  lp_schedule_free(s);
}

/* lp_exec_new under the out-of-memory loop: every allocation point of
 * construction (chunks, optimizers, slots, copies' packs, timing, the
 * trace) fails alone in turn; each returns LP_ERR_NOMEM and frees all. */
static const lp_schedule *oom_sched;

static lp_status oom_new(void) {
  lp_exec_opts o = base_opts();
  lp_exec *e = NULL;
  char err[LP_ERRLEN] = "";
  lp_status st = lp_exec_new(oom_sched, &o, &e, err);
  if (st == LP_OK) {
    assert_non_null(e);
    lp_exec_free(e);
  } else {
    assert_null(e);
    assert_true(*err != '\0');
  }
  return st;
}

static void test_new_oom(void **state) {
  (void)state;
  (void)lp_comm_world(); /* made once, outside the loop */
  lp_schedule *s = NULL;
  assert_int_equal(lp_schedule_new(1, 2, MB, &s), LP_OK);
  for (int c = 0; c < 2; c++) { /* two copies of each stage: reduction packs too */
    assert_int_equal(lp_schedule_add_vstage(s, 0, 0, NULL), LP_OK);
    assert_int_equal(lp_schedule_add_vstage(s, 1, 0, NULL), LP_OK);
  }
  int ra[2] = {0, 1}, rb[2] = {2, 3};
  for (int mb = 0; mb < MB; mb++)
    assert_int_equal(lp_schedule_set_route(s, mb, mb < 2 ? ra : rb, 2), LP_OK);
  const char *acts[] = {"0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1",
                        "2F2", "3F2", "3B2", "2B2", "2F3", "3F3", "3B3", "2B3"};
  for (int i = 0; i < 16; i++) assert_int_equal(lp_schedule_push_text(s, 0, acts[i]), LP_OK);
  assert_int_equal(lp_schedule_validate(s), LP_OK);
  oom_sched = s;
  int points = lp_test_oom_points(oom_new, 5000);
  printf("# lp_exec_new: %d allocation failure points\n", points);
  assert_true(points > 20);
  lp_schedule_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fb_order),
      cmocka_unit_test(test_split_backward),
      cmocka_unit_test(test_overlapped_pairs),
      cmocka_unit_test(test_local_copies),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_new_oom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
