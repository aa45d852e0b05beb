/* test_exec_pairs.c — the overlapped-pair scheduler (exec.c run_fb_any)
 * without mpirun: one process over an in-process comm of two ranks whose
 * second rank is an emulated EP partner, a mirror of this rank (every
 * all-to-all-v gives back the blocks this rank sent it, every sum counts
 * this rank twice), with a chosen delay before the forward halves' and
 * the backward halves' exchanges finish (they run on two EP contexts).
 * A one-rank schedule of two MoE stages with FB pairs then shows the
 * scheduler's decisions in the measured trace: with the backward partner
 * late the forward half runs all its exchanges while the backward's first
 * one flies, with the forward partner late the backward half runs ahead;
 * whatever the delays, losses and parameters are bitwise the same. A
 * partner that never answers makes the step return LP_ERR_TIMEOUT with
 * the watchdog's text (the process goes on), and the executor refuses
 * the next step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "exec_fixtures.h"
#include "lp_exec.h"
#include "lp_test_oom.h"

enum { MB = 4, BATCH = 4, T = 4, D = 8, EP = 2 };

/* ---- the partner comm ---- */

typedef struct partner {
  double delay;  /* seconds until an all-to-all-v finishes (< 0: never) */
  int own;       /* a split's state (freed by destroy) */
} partner;

static double delay_f, delay_b; /* for the EP contexts the executor splits */
static int splits;              /* splits of the world so far */

static const lp_comm_backend partner_backend;

static lp_status p_done(lp_comm_req *r) {
  r->impl.d = 0; /* finished at once */
  return LP_OK;
}
static lp_status p_isend(lp_comm *c, const void *b, size_t n, lp_comm_dtype dt, int p, int t,
                         lp_comm_req *r) {
  (void)c, (void)b, (void)n, (void)dt, (void)p, (void)t;
  return p_done(r);
}
static lp_status p_irecv(lp_comm *c, void *b, size_t n, lp_comm_dtype dt, int p, int t,
                         lp_comm_req *r) {
  (void)c, (void)b, (void)n, (void)dt, (void)p, (void)t;
  r->impl.d = -1; /* the schedule has one pipeline rank: never used */
  return LP_OK;
}
static lp_status p_iallreduce(lp_comm *c, void *b, size_t n, lp_comm_dtype dt, lp_comm_req *r) {
  (void)c;
  for (size_t i = 0; i < n; i++) { /* the mirror adds the same numbers */
    if (dt == LP_COMM_FLOAT) ((float *)b)[i] *= 2;
    else ((double *)b)[i] *= 2;
  }
  return p_done(r);
}
static lp_status p_ibarrier(lp_comm *c, lp_comm_req *r) {
  (void)c;
  return p_done(r);
}
static lp_status p_ibcast(lp_comm *c, void *b, size_t n, int root, lp_comm_req *r) {
  (void)c, (void)b, (void)n, (void)root; /* root is this rank */
  return p_done(r);
}
static lp_status p_ialltoallv(lp_comm *c, const float *s, const size_t *sc, const size_t *sd,
                              float *rv, const size_t *rc, const size_t *rd, lp_comm_req *r) {
  partner *p = lp_comm_backend_state(c);
  for (int k = 0; k < 2; k++) {
    assert_int_equal(sc[k], rc[k]); /* a mirror sends what it received */
    memmove(rv + rd[k], s + sd[k], sc[k] * sizeof(float));
  }
  r->impl.d = p->delay < 0 ? -1 : lp_now() + p->delay;
  return LP_OK;
}
static lp_status p_split(lp_comm *c, int color, int key, lp_comm **out) {
  (void)c, (void)color, (void)key;
  /* ex_grid_new splits the pipeline group (one rank here), then the EP
   * group for forward and for backward halves; host.c the host's ranks */
  int k = ++splits;
  if (k == 1) return lp_comm_self_new(out);
  partner *p = calloc(1, sizeof *p);
  p->own = 1;
  p->delay = k == 2 ? delay_f : k == 3 ? delay_b : 0;
  lp_status st = lp_comm_new(&partner_backend, 0, 2, 1 << 20, p, out);
  if (st != LP_OK) free(p);
  return st;
}
static lp_status p_test(lp_comm *c, lp_comm_req *r, int *done) {
  (void)c;
  *done = r->impl.d >= 0 && lp_now() >= r->impl.d;
  return LP_OK;
}
static void p_cancel(lp_comm *c, lp_comm_req *r) { (void)c, (void)r; }
static void p_abort(lp_comm *c, int code) {
  (void)c;
  fail_msg("the job was aborted (code %d): a failure must be returned", code);
}
static void p_destroy(lp_comm *c) {
  partner *p = lp_comm_backend_state(c);
  if (p && p->own) free(p);
}

static const lp_comm_backend partner_backend = {
    .name = "partner",
    .any_order = 1,
    .isend = p_isend,
    .irecv = p_irecv,
    .iallreduce_sum = p_iallreduce,
    .ibarrier = p_ibarrier,
    .ibcast = p_ibcast,
    .ialltoallv = p_ialltoallv,
    .split = p_split,
    .test = p_test,
    .cancel = p_cancel,
    .abort = p_abort,
    .destroy = p_destroy,
};

/* ---- the model: two MoE blocks, one per stage ---- */

static lp_status chunk_fn(void *ud, int stage, lp_nn_layer **out, char *err) {
  (void)ud, (void)err;
  lp_nn_moe_opts mo;
  memset(&mo, 0, sizeof mo);
  mo.dim = D, mo.hidden = 6, mo.experts = 4, mo.topk = 2, mo.shared = 1;
  char name[16], cn[16];
  snprintf(name, sizeof name, "blocks.%d", stage);
  snprintf(cn, sizeof cn, "stage.%d", stage);
  lp_nn_layer *b = NULL;
  lp_status st = lp_nn_moe_block_new(name, 2, &mo, 42, &b);
  if (st == LP_OK) st = lp_nn_chunk_new(cn, &b, 1, out);
  lp_nn_layer_release(b);
  return st;
}

static lp_status data_fn(void *ud, int64_t step, int mb, lp_tensor **in, lp_tensor **tg,
                         char *err) {
  (void)ud, (void)err;
  int64_t sh[3] = {BATCH, T, D};
  fx_wave_data(step, mb, 3, sh, 3, sh, in, tg);
  return LP_OK;
}

static const int act_ndim[2] = {0, 3};
static const int64_t act_shape[2][LP_TENSOR_MAXDIM] = {{0}, {BATCH / EP, T, D}};

static lp_schedule *pairs_schedule(void) {
  const char *acts[] = {"0F0", "1F0", "0F1", "(1F1;1B0)OVERLAP_F_B", "0B0",
                        "0F2", "(1F2;1B1)OVERLAP_F_B", "0B1", "0F3",
                        "(1F3;1B2)OVERLAP_F_B", "0B2", "1B3", "0B3"};
  return fx_two_stage(MB, acts, (int)(sizeof acts / sizeof *acts), 1, NULL);
}

static partner world_state;

/* The executor over a fresh partner world with the given delays. */
static lp_exec *exec_with(const lp_schedule *s, double df, double db, double timeout,
                          lp_comm **world) {
  delay_f = df, delay_b = db, splits = 0;
  world_state = (partner){0, 0};
  assert_int_equal(lp_comm_new(&partner_backend, 0, 2, 1 << 20, &world_state, world), LP_OK);
  if (timeout > 0) lp_comm_set_timeout(*world, timeout);
  lp_exec_opts o;
  memset(&o, 0, sizeof o);
  o.comm = *world;
  o.chunk = chunk_fn;
  o.data = data_fn;
  o.loss = LP_NN_LOSS_MSE;
  o.act_ndim = act_ndim;
  o.act_shape = act_shape;
  o.optim = LP_NN_OPTIM_SGD;
  o.sgd = (lp_nn_sgd_opts){0.1f, 0.9f, 0.0f};
  o.trace = 1;
  o.ep = EP;
  lp_exec *e = NULL;
  char err[LP_ERRLEN] = "";
  if (lp_exec_new(s, &o, &e, err) != LP_OK) fail_msg("lp_exec_new: %s", err);
  return e;
}

/* Every parameter of every local stage, flat on the host (malloc'd). */
static float *all_params(const lp_exec *e, size_t *n) {
  *n = 0;
  for (int i = 0; i < lp_exec_vstages(e); i++) *n += lp_nn_param_numel(lp_exec_vstage_chunk(e, i));
  float *buf = malloc(*n * sizeof *buf), *at = buf;
  for (int i = 0; i < lp_exec_vstages(e); i++) {
    size_t np;
    const lp_nn_param *p = lp_nn_params(lp_exec_vstage_chunk(e, i), &np);
    for (size_t j = 0; j < np; j++) {
      assert_int_equal(lp_tensor_read(p[j].value, at), LP_OK);
      at += lp_tensor_numel(p[j].value);
    }
  }
  return buf;
}

static void test_decisions_and_numbers(void **state) {
  (void)state;
  lp_schedule *s = pairs_schedule();
  const double late = 0.02; /* a partner 20 ms late: far above compute here */
  const double cfg[3][2] = {{0, 0}, {0, late}, {late, 0}};
  double loss[3][3];
  float *params[3] = {NULL, NULL, NULL};
  size_t np[3] = {0, 0, 0};
  for (int c = 0; c < 3; c++) {
    lp_comm *w = NULL;
    lp_exec *e = exec_with(s, cfg[c][0], cfg[c][1], 0, &w);
    for (int k = 0; k < 3; k++)
      if (lp_exec_step(e, k + 1, &loss[c][k]) != LP_OK)
        fail_msg("config %d, step %d: %s", c, k + 1, lp_exec_last_error(e));
    /* the last step's pairs (actions 3, 6, 9: F of vstage 1, B of vstage 1) */
    const lp_trace *t = lp_exec_trace(e);
    for (int idx = 3; c > 0 && idx <= 9; idx += 3) {
      /* both halves are of vstage 1: tell them apart by micro-batch */
      int n = 0;
      const lp_trace_event *ev = lp_trace_events(t, &n);
      double f_first_end = -1, f_last_start = -1, b_first_end = -1, b_last_start = -1;
      int fmb = idx / 3, nf = 0, nb = 0;
      for (int i = 0; i < n; i++) {
        if (ev[i].index != idx || strcmp(ev[i].name, "all-to-all") != 0 || ev[i].step != 3)
          continue;
        double end = ev[i].start_us + ev[i].dur_us;
        int fw = ev[i].mb == fmb;
        double *fe = fw ? &f_first_end : &b_first_end, *ls = fw ? &f_last_start : &b_last_start;
        if (*fe < 0 || end < *fe) *fe = end;
        if (ev[i].start_us > *ls) *ls = ev[i].start_us;
        if (fw) nf++; else nb++;
      }
      /* one MoE layer: three forward exchanges (counts, dispatch, combine),
       * two backward ones */
      assert_int_equal(nf, 3);
      assert_int_equal(nb, 2);
      if (c == 1) { /* backward partner late: the forward runs all its exchanges meanwhile */
        if (!(f_last_start < b_first_end))
          fail_msg("pair %d: the forward half's last exchange started at %.0f us, after the "
                   "backward's first one ended (%.0f us)", idx, f_last_start, b_first_end);
      } else { /* forward partner late: the backward runs ahead */
        if (!(b_last_start < f_first_end))
          fail_msg("pair %d: the backward half's last exchange started at %.0f us, after the "
                   "forward's first one ended (%.0f us)", idx, b_last_start, f_first_end);
      }
    }
    params[c] = all_params(e, &np[c]);
    if (c > 0) {
      for (int k = 0; k < 3; k++)
        if (memcmp(&loss[c][k], &loss[0][k], sizeof(double)) != 0)
          fail_msg("config %d, step %d: loss %.17g, without delays %.17g", c, k + 1, loss[c][k],
                   loss[0][k]);
      assert_int_equal(np[c], np[0]);
      assert_memory_equal(params[c], params[0], np[0] * sizeof(float));
    }
    lp_exec_free(e);
    lp_comm_free(w);
  }
  for (int c = 0; c < 3; c++) free(params[c]);
  lp_schedule_free(s);
}

static void test_silent_partner(void **state) {
  (void)state;
  lp_schedule *s = pairs_schedule();
  lp_comm *w = NULL;
  lp_exec *e = exec_with(s, -1, -1, 0.2, &w);
  double loss = 0;
  assert_int_equal(lp_exec_step(e, 1, &loss), LP_ERR_TIMEOUT); /* returned, nothing exits */
  const char *m = lp_exec_last_error(e);
  printf("# %s\n", m);
  assert_string_equal(m, "timed out after 0.2 s (LUAPIPE_TIMEOUT) in an all-to-all-v on rank 0 "
                         "(2 ranks) sending 2 floats to and receiving 2 floats from other "
                         "ranks: rank 0 (EP rank 0 of 2): moe blocks.0.moe dispatch count");
  assert_int_equal(lp_exec_step(e, 2, &loss), LP_ERR_TIMEOUT);
  m = lp_exec_last_error(e);
  assert_non_null(strstr(m, "rank 0: step 2: the executor cannot go on after a failed "
                            "communication (timed out after 0.2 s"));
  lp_exec_free(e);
  lp_comm_free(w);
  lp_schedule_free(s);
}

/* lp_exec_new with EP (the grid's splits, MoE layers, the expert-load
 * sums) under the out-of-memory loop: LP_ERR_NOMEM, nothing leaked. */
static lp_schedule *oom_sched;

static lp_status oom_new(void) {
  delay_f = delay_b = 0, splits = 0;
  world_state = (partner){0, 0};
  lp_comm *w = NULL;
  lp_status st = lp_comm_new(&partner_backend, 0, 2, 1 << 20, &world_state, &w);
  if (st != LP_OK) return st;
  lp_exec_opts o;
  memset(&o, 0, sizeof o);
  o.comm = w, o.chunk = chunk_fn, o.data = data_fn, o.loss = LP_NN_LOSS_MSE;
  o.act_ndim = act_ndim, o.act_shape = act_shape, o.optim = LP_NN_OPTIM_ADAMW;
  o.adamw = (lp_nn_adamw_opts){1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f};
  o.trace = 1, o.ep = EP;
  lp_exec *e = NULL;
  char err[LP_ERRLEN] = "";
  st = lp_exec_new(oom_sched, &o, &e, err);
  if (st == LP_OK) lp_exec_free(e);
  else assert_true(*err != '\0');
  lp_comm_free(w);
  return st;
}

static void test_new_oom(void **state) {
  (void)state;
  oom_sched = pairs_schedule();
  int points = lp_test_oom_points(oom_new, 20000);
  printf("# lp_exec_new with ep = 2: %d allocation failure points\n", points);
  assert_true(points > 50);
  lp_schedule_free(oom_sched);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decisions_and_numbers),
      cmocka_unit_test(test_silent_partner),
      cmocka_unit_test(test_new_oom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
