/* test_exec_device.c — the executor with the whole model on a device
 * backend (lp_exec_opts.backend): the "fake:0" backend of
 * lp_test_fake_backend.h, whose memory the host cannot dereference (any
 * host read or write of device memory left in the executor, its message
 * plumbing, gradient sums or checkpoints crashes the test). Every run is
 * compared with the same executor on the CPU: losses and final parameters
 * bitwise equal (the fake backend runs the CPU's functions).
 *
 * Alone (ctest) it runs over the MPI world of one process: one-rank
 * schedules (F/B, split I/W, overlapped FB pairs, two local copies of each
 * stage summed at REDUCE_GRAD), checkpoints written from the device and
 * read back onto the device and onto the CPU; every run also with MoE
 * blocks (host routing, device row math, staged EP exchanges). Under
 * mpirun -np 2 (tests/mpi/test_exec_device.sh) it runs 1F1B over two ranks,
 * activations and gradients travelling through the staged comm
 * (lp_comm_for_backend), and one pipeline rank x ep = 2 (dense gradients
 * summed over the EP group); under mpirun -np 4, DualPipe (both directions,
 * overlapped pairs, the copies of every stage summed across ranks). */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec_fixtures.h"
#include "lp_exec.h"
#include "lp_test_fake_backend.h"
#include "schedule_fixtures.h"

static lp_comm *W;

enum { MB = 4, BATCH = 4, D_IN = 5, D_H = 7, D_OUT = 3 };
enum { V = 23, D = 8, H = 2, T = 6 };

/* ---- two models, each in two stages ---- */

/* mlp: linear(5,7) + gelu | linear(7,3), MSE, SGD with momentum.
 * lm:  embedding + transformer block | rmsnorm + linear head, CE, AdamW.
 * moe (use_lm == 2): the lm with MoE transformer blocks (sigmoid router,
 * expert groups, a shared expert, the balance loss).
 * With 4 stages, stages 1 and 2 are linear(7,7) + gelu / a transformer
 * block. */
static int use_lm, nstages = 2;

static lp_status block_new(const char *name, lp_nn_layer **out) {
  if (use_lm != 2)
    return lp_nn_transformer_block_new(name, D, H, 2 * D, LP_TENSOR_ACT_GELU, 42, out);
  lp_nn_moe_opts mo;
  memset(&mo, 0, sizeof mo);
  mo.dim = D, mo.hidden = 6, mo.experts = 4, mo.topk = 2, mo.groups = 2;
  mo.topk_groups = 1, mo.shared = 1, mo.balance_alpha = 0.01f;
  return lp_nn_moe_block_new(name, H, &mo, 42, out);
}

static lp_status build_stage(int stage, lp_nn_layer **out) {
  if (!use_lm) return fx_mlp_stage(stage, nstages, D_IN, D_H, D_OUT, 42, out);
  lp_nn_layer *ls[2] = {NULL, NULL};
  lp_status st;
  char n0[32], n1[32], cn[32];
  snprintf(n0, sizeof n0, "layers.%d", 2 * stage);
  snprintf(n1, sizeof n1, "layers.%d", 2 * stage + 1);
  snprintf(cn, sizeof cn, "stage.%d", stage);
  int last = stage == nstages - 1;
  if (stage == 0) {
    st = lp_nn_embedding_new(n0, V, D, 42, &ls[0]);
    if (st == LP_OK)
      st = block_new(n1, &ls[1]);
  } else if (!last) {
    st = block_new(n0, &ls[0]);
  } else {
    st = lp_nn_rmsnorm_new(n0, D, 1e-5f, &ls[0]);
    if (st == LP_OK) st = lp_nn_linear_new(n1, D, V, 1, 42, &ls[1]);
  }
  if (st == LP_OK) st = lp_nn_chunk_new(cn, ls, ls[1] ? 2 : 1, out);
  lp_nn_layer_release(ls[0]);
  lp_nn_layer_release(ls[1]);
  return st;
}

static lp_status chunk_fn(void *ud, int stage, lp_nn_layer **out, char *err) {
  (void)ud, (void)err;
  return build_stage(stage, out);
}

/* inputs and targets on the host, as a Lua data() gives them */
static lp_status data_fn(void *ud, int64_t step, int mb, lp_tensor **in, lp_tensor **tg,
                         char *err) {
  (void)ud, (void)err;
  if (use_lm) {
    float x[BATCH * T], y[BATCH * T];
    for (int i = 0; i < BATCH * T; i++) {
      x[i] = (float)((i * 7 + (int)step * 3 + mb * 5) % V);
      y[i] = (float)((i * 5 + (int)step + mb * 11 + 3) % V);
    }
    if (in) assert_int_equal(lp_tensor_from_data(NULL, 2, (int64_t[]){BATCH, T}, x, in), LP_OK);
    if (tg) assert_int_equal(lp_tensor_from_data(NULL, 2, (int64_t[]){BATCH, T}, y, tg), LP_OK);
    return LP_OK;
  }
  fx_wave_data(step, mb, 2, (int64_t[]){BATCH, D_IN}, 2, (int64_t[]){BATCH, D_OUT}, in, tg);
  return LP_OK;
}

static int ep_size = 1; /* expert-parallel ranks: each takes 1/ep of the rows */
static int act_ndim[4];
static int64_t act_shape[4][LP_TENSOR_MAXDIM];

static lp_exec_opts opts_for(const lp_tensor_backend *be) {
  lp_exec_opts o;
  memset(&o, 0, sizeof o);
  o.comm = W;
  o.chunk = chunk_fn;
  o.data = data_fn;
  if (use_lm) {
    for (int i = 1; i < 4; i++) {
      act_ndim[i] = 3;
      memcpy(act_shape[i], (int64_t[]){BATCH / ep_size, T, D}, 3 * sizeof(int64_t));
    }
    o.loss = LP_NN_LOSS_CROSS_ENTROPY;
    o.optim = LP_NN_OPTIM_ADAMW;
    o.adamw = (lp_nn_adamw_opts){1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f};
  } else {
    for (int i = 1; i < 4; i++) {
      act_ndim[i] = 2;
      memcpy(act_shape[i], (int64_t[]){BATCH / ep_size, D_H}, 2 * sizeof(int64_t));
    }
    o.loss = LP_NN_LOSS_MSE;
    o.optim = LP_NN_OPTIM_SGD;
    o.sgd = (lp_nn_sgd_opts){0.1f, 0.9f, 1e-3f};
  }
  o.act_ndim = act_ndim;
  o.act_shape = (const int64_t(*)[LP_TENSOR_MAXDIM])act_shape;
  o.trace = 1;
  o.ep = ep_size;
  o.backend = be;
  return o;
}

static lp_exec *exec_on(const lp_schedule *s, const lp_tensor_backend *be) {
  lp_exec_opts o = opts_for(be);
  lp_exec *e = NULL;
  char err[LP_ERRLEN] = "";
  if (lp_exec_new(s, &o, &e, err) != LP_OK) fail_msg("lp_exec_new: %s", err);
  return e;
}

static void step(lp_exec *e, int64_t k, double *loss) {
  if (lp_exec_step(e, k, loss) != LP_OK) fail_msg("step %lld: %s", (long long)k, lp_exec_last_error(e));
}

/* bitwise equal, wherever each lives */
static int same(const lp_tensor *a, const lp_tensor *b) {
  lp_tensor *ha = NULL, *hb = NULL;
  assert_int_equal(lp_tensor_to_host(a, &ha), LP_OK);
  assert_int_equal(lp_tensor_to_host(b, &hb), LP_OK);
  int eq = lp_tensor_equal(ha, hb);
  lp_tensor_free(ha);
  lp_tensor_free(hb);
  return eq;
}

/* every parameter of every local stage of a equals b's; on_fake: a's
 * parameters and grads live on the fake device */
static void same_params(const lp_exec *a, const lp_exec *b, int on_fake) {
  assert_int_equal(lp_exec_vstages(a), lp_exec_vstages(b));
  for (int i = 0; i < lp_exec_vstages(a); i++) {
    size_t na, nb;
    const lp_nn_param *pa = lp_nn_params(lp_exec_vstage_chunk(a, i), &na);
    const lp_nn_param *pb = lp_nn_params(lp_exec_vstage_chunk(b, i), &nb);
    assert_int_equal(na, nb);
    assert_true(na > 0);
    for (size_t j = 0; j < na; j++) {
      if (on_fake) {
        assert_ptr_equal(lp_tensor_backend_of(pa[j].value), &fake);
        assert_ptr_equal(lp_tensor_backend_of(pa[j].grad), &fake);
      }
      if (!same(pa[j].value, pb[j].value))
        fail_msg("stage %d, parameter %s differs", lp_exec_vstage_id(a, i), pa[j].name);
    }
  }
}

/* 3 steps on the CPU and on the fake device from the same start: losses
 * and parameters bitwise equal */
static void twin(const lp_schedule *s) {
  for (use_lm = 0; use_lm < 3; use_lm++) {
    lp_exec *c = exec_on(s, NULL), *f = exec_on(s, &fake);
    for (int k = 1; k <= 3; k++) {
      double lc = 0, lf = 0;
      step(c, k, &lc);
      step(f, k, &lf);
      assert_true(isfinite(lc) && lc > 0);
      if (memcmp(&lc, &lf, sizeof lc) != 0)
        fail_msg("%s, step %d: loss %.17g on fake:0, %.17g on the CPU",
                 (const char *[]){"mlp", "lm", "moe"}[use_lm], k, lf, lc);
    }
    same_params(f, c, 1);
    lp_exec_free(c);
    lp_exec_free(f);
  }
  use_lm = 0;
}

/* One rank, two stages (both on rank 0), actions from text. */
static lp_schedule *two_stage(const char *const *acts, int n, int copies) {
  return fx_two_stage(MB, acts, n, copies, NULL);
}

static void test_one_rank(void **state) {
  (void)state;
  if (lp_comm_size(W) != 1) skip();
  const char *fb[] = {"0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1",
                      "0F2", "1F2", "1B2", "0B2", "0F3", "1F3", "1B3", "0B3"};
  const char *iw[] = {"0F0", "0F1", "1F0", "1F1", "0F2", "1I0", "1F2", "0I0", "1W0",
                      "1I1", "0F3", "1F3", "0I1", "0W1", "0W0", "1I2", "1W1", "0I2",
                      "1I3", "1W2", "1W3", "0I3", "0W2", "0W3"};
  const char *pairs[] = {"0F0", "1F0", "0F1", "(1F1;1B0)OVERLAP_F_B", "0B0",
                         "0F2", "(1F2;1B1)OVERLAP_F_B", "0B1", "0F3",
                         "(1F3;1B2)OVERLAP_F_B", "0B2", "1B3", "0B3"};
  /* two copies of each stage, gradients summed at REDUCE_GRAD (packed
   * through lp_tensor_read / _write) */
  const char *copies[] = {"0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1", "2F2",
                          "3F2", "3B2", "2B2", "2F3", "3F3", "3B3", "2B3", "0REDUCE_GRAD",
                          "1REDUCE_GRAD", "2REDUCE_GRAD", "3REDUCE_GRAD"};
  struct {
    const char *const *acts;
    int n, copies;
  } cases[] = {{fb, 16, 1}, {iw, 24, 1}, {pairs, 13, 1}, {copies, 20, 2}, {copies, 16, 2}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    lp_schedule *s = two_stage(cases[i].acts, cases[i].n, cases[i].copies);
    twin(s);
    lp_schedule_free(s);
  }
}

/* Redundant expert slots and a rebalance with the MoE model on fake:0:
 * the replicas' gradients are summed (ep.c reduce_replicas) and an EPLB
 * move packs and unpacks expert weights (placement.c move_layer), both
 * through lp_tensor_read / _write; the CPU twin takes the same placements:
 * losses and parameters bitwise equal. */
static void test_replicas_rebalance(void **state) {
  (void)state;
  if (lp_comm_size(W) != 1) skip();
  const char *fb[] = {"0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1",
                      "0F2", "1F2", "1B2", "0B2", "0F3", "1F3", "1B3", "0B3"};
  lp_schedule *s = two_stage(fb, 16, 1);
  use_lm = 2;
  lp_exec *c = exec_on(s, NULL), *f = exec_on(s, &fake);
  const int redundant[6] = {0, 1, 2, 3, 0, 1}, rebalanced[6] = {3, 2, 2, 0, 1, 3};
  for (int k = 1; k <= 4; k++) {
    if (k == 1 || k == 3) {
      const int *p2l = k == 1 ? redundant : rebalanced;
      int64_t bc = -1, bf = -1;
      if (lp_exec_set_placement(c, 0, 6, p2l, &bc) != LP_OK)
        fail_msg("placement on the CPU: %s", lp_exec_last_error(c));
      if (lp_exec_set_placement(f, 0, 6, p2l, &bf) != LP_OK)
        fail_msg("placement on fake:0: %s", lp_exec_last_error(f));
      assert_int_equal(bc, bf);
      same_params(f, c, 1);
    }
    double lc = 0, lf = 0;
    step(c, k, &lc);
    step(f, k, &lf);
    assert_true(isfinite(lc) && lc > 0);
    if (memcmp(&lc, &lf, sizeof lc) != 0)
      fail_msg("step %d: loss %.17g on fake:0, %.17g on the CPU", k, lf, lc);
    same_params(f, c, 1);
  }
  /* the replicas of each expert stayed equal (their gradients summed) */
  lp_nn_layer *m = lp_nn_moe_find(lp_exec_vstage_chunk(f, 0), 0);
  for (int a = 0; a < 6; a++)
    for (int b = a + 1; b < 6; b++) {
      if (rebalanced[a] != rebalanced[b]) continue;
      const lp_nn_param *pa, *pb;
      int na, nb;
      assert_int_equal(lp_nn_moe_slot_params(m, a, &pa, &na), LP_OK);
      assert_int_equal(lp_nn_moe_slot_params(m, b, &pb, &nb), LP_OK);
      for (int j = 0; j < na; j++)
        if (!same(pa[j].value, pb[j].value)) fail_msg("slots %d and %d of expert %d differ", a, b,
                                                      rebalanced[a]);
    }
  lp_exec_free(c);
  lp_exec_free(f);
  lp_schedule_free(s);
  use_lm = 0;
}

/* Checkpoints of a device run: saved from fake:0 (parameters read back
 * from the device), loaded onto fake:0 and onto the CPU; the three then
 * take the same next step. */
static void test_checkpoint(void **state) {
  (void)state;
  if (lp_comm_size(W) != 1) skip();
  const char *fb[] = {"0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1",
                      "0F2", "1F2", "1B2", "0B2", "0F3", "1F3", "1B3", "0B3"};
  char dir[] = "/tmp/lp_exec_device_XXXXXX";
  assert_non_null(mkdtemp(dir));
  for (use_lm = 0; use_lm < 3; use_lm++) {
    lp_schedule *s = two_stage(fb, 16, 1);
    lp_exec *f = exec_on(s, &fake);
    for (int k = 1; k <= 2; k++) step(f, k, NULL);
    if (lp_exec_checkpoint_save(f, dir, 2) != LP_OK) fail_msg("save: %s", lp_exec_last_error(f));
    lp_exec *f2 = exec_on(s, &fake), *c2 = exec_on(s, NULL);
    int64_t at = 0;
    if (lp_exec_checkpoint_load(f2, dir, &at) != LP_OK) fail_msg("load: %s", lp_exec_last_error(f2));
    assert_int_equal(at, 2);
    if (lp_exec_checkpoint_load(c2, dir, NULL) != LP_OK) fail_msg("load: %s", lp_exec_last_error(c2));
    same_params(f2, f, 1);
    same_params(c2, f, 0);
    double l1 = 0, l2 = 0, l3 = 0;
    step(f, 3, &l1);
    step(f2, 3, &l2);
    step(c2, 3, &l3);
    assert_memory_equal(&l1, &l2, sizeof l1);
    assert_memory_equal(&l1, &l3, sizeof l1);
    same_params(f2, f, 1);
    same_params(c2, f, 0);
    lp_exec_free(f);
    lp_exec_free(f2);
    lp_exec_free(c2);
    lp_schedule_free(s);
  }
  use_lm = 0;
  char path[256];
  lp_exec_checkpoint_path(dir, 0, path, sizeof path);
  unlink(path);
  rmdir(dir);
}

/* 1F1B over two ranks (plain and with split backward): activations and
 * gradients go between device buffers through the staged comm; then the
 * two ranks as one pipeline rank x ep = 2, each on half of every
 * micro-batch's rows, their dense gradients summed over the EP group
 * (packed through lp_tensor_read / _write) */
static void test_two_ranks(void **state) {
  (void)state;
  if (lp_comm_size(W) != 2) skip();
  for (int split = 0; split < 2; split++) {
    lp_schedule *s = fx_1f1b(2, MB, split);
    lp_schedule *low = NULL;
    if (lp_schedule_lower(s, &low) != LP_OK) fail_msg("lower: %s", lp_schedule_last_error(s));
    twin(low);
    lp_schedule_free(low);
    lp_schedule_free(s);
  }
  const char *fb[] = {"0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1",
                      "0F2", "1F2", "1B2", "0B2", "0F3", "1F3", "1B3", "0B3"};
  lp_schedule *s = two_stage(fb, 16, 1);
  ep_size = 2;
  twin(s);
  ep_size = 1;
  lp_schedule_free(s);
}

/* DualPipe over four ranks (specs/dualpipe.md's example, 4 stages, 8
 * micro-batches): both directions at once, overlapped F&B pairs, and the
 * two copies of every stage summed across ranks at the end of the step */
static void test_dualpipe_four_ranks(void **state) {
  (void)state;
  if (lp_comm_size(W) != 4) skip();
  lp_schedule *s = fx_dualpipe(), *low = NULL;
  if (lp_schedule_lower(s, &low) != LP_OK) fail_msg("lower: %s", lp_schedule_last_error(s));
  nstages = 4;
  twin(low);
  nstages = 2;
  lp_schedule_free(low);
  lp_schedule_free(s);
}

int main(int argc, char **argv) {
  fake_backend_init();
  if (lp_comm_mpi_init(&argc, &argv) != LP_OK) return 1;
  W = lp_comm_world();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_rank),
      cmocka_unit_test(test_checkpoint),
      cmocka_unit_test(test_replicas_rebalance),
      cmocka_unit_test(test_two_ranks),
      cmocka_unit_test(test_dualpipe_four_ranks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
