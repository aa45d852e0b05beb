/* test_exec_timing.c — the job's timing gathered on every rank
 * (lp_exec_job_timing) over the comm layer's all-gather: every rank trains
 * a few steps, then each rank's own figures (its totals, host share,
 * gradient-sum message, action list, kept steps, (kind, model stage) sums)
 * come back on every rank under its world rank, exactly, and the job's
 * sums are the ranks' in rank order; known message and compute slices
 * planted in every rank's trace give the message latency and the last
 * step's slices they must. Also lp_comm_allgather / _allgatherv with
 * pieces of every rank's own size.
 *
 * Alone (ctest) it runs over the MPI world of one process (one pipeline
 * rank; the out-of-memory loop over every allocation of the gather); under
 * mpirun (tests/mpi/test_exec_timing.sh) on 2 ranks (pp 2) and 4 ranks
 * (pp 2 x ep 2). */
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

#include "lp_exec.h"
#include "exec_fixtures.h"
#include "schedule_fixtures.h"

static lp_comm *W;
static int P, R; /* world size, this rank */

enum { D = 4, D_OUT = 2, BATCH = 4, MB = 4, STEPS = 3 };

/* ---- the all-gather ---- */

/* Rank r gives 3 r + 1 bytes of value r + i (all-gather-v) and 8 bytes
 * (all-gather); every rank finds every rank's. */
static void test_allgather(void **state) {
  (void)state;
  int64_t mine = 1000 + R, *all = lp_malloc((size_t)P * sizeof *all);
  assert_int_equal(lp_comm_allgather(W, &mine, sizeof mine, all, "test all-gather"), LP_OK);
  for (int r = 0; r < P; r++) assert_int_equal(all[r], 1000 + r);
  lp_free(all);
  unsigned char piece[3 * 8 + 1];
  size_t n = 3 * (size_t)R + 1;
  for (size_t i = 0; i < n; i++) piece[i] = (unsigned char)(R + i);
  size_t *sizes = lp_malloc((size_t)P * sizeof *sizes);
  void *out = NULL;
  assert_int_equal(lp_comm_allgatherv(W, piece, n, &out, sizes, "test all-gather-v"), LP_OK);
  const unsigned char *q = out;
  for (int r = 0; r < P; r++) {
    assert_int_equal(sizes[r], 3 * (size_t)r + 1);
    for (size_t i = 0; i < sizes[r]; i++) assert_int_equal(q[i], (unsigned char)(r + i));
    q += sizes[r];
  }
  lp_free(out);
  lp_free(sizes);
}

/* ---- an executor: pp = P / ep pipeline ranks of one model stage each ---- */

static int EP, PP;

/* The MLP and data every executor test trains (exec_fixtures.h). */
static lp_status chunk_fn(void *ud, int stage, lp_nn_layer **out, char *err) {
  (void)ud, (void)err;
  return fx_mlp_stage(stage, PP, D, D, D_OUT, 42, out);
}

static lp_status data_fn(void *ud, int64_t step, int mb, lp_tensor **in, lp_tensor **tg,
                         char *err) {
  (void)ud, (void)err;
  fx_wave_data(step, mb, 2, (int64_t[]){BATCH, D}, 2, (int64_t[]){BATCH, D_OUT}, in, tg);
  return LP_OK;
}

static int act_ndim[8];
static int64_t act_shape[8][LP_TENSOR_MAXDIM];

/* The executor of this rank, trained STEPS steps (1F1B, trace on). */
static lp_exec *trained(void) {
  EP = P >= 4 ? 2 : 1;
  PP = P / EP;
  lp_schedule *s = fx_1f1b(PP, MB, 0), *low = NULL;
  assert_int_equal(lp_schedule_lower(s, &low), LP_OK);
  for (int st = 1; st < PP; st++) {
    act_ndim[st] = 2;
    act_shape[st][0] = BATCH / EP;
    act_shape[st][1] = D;
  }
  lp_exec_opts o;
  memset(&o, 0, sizeof o);
  o.comm = W;
  o.chunk = chunk_fn;
  o.data = data_fn;
  o.loss = LP_NN_LOSS_MSE;
  o.act_ndim = act_ndim;
  o.act_shape = (const int64_t(*)[LP_TENSOR_MAXDIM])act_shape;
  o.optim = LP_NN_OPTIM_SGD;
  o.sgd = (lp_nn_sgd_opts){0.1f, 0.9f, 0.0f};
  o.trace = 1;
  o.ep = EP;
  lp_exec *e = NULL;
  char err[LP_ERRLEN] = "";
  if (lp_exec_new(low, &o, &e, err) != LP_OK) fail_msg("lp_exec_new: %s", err);
  for (int k = 1; k <= STEPS; k++) {
    double loss;
    if (lp_exec_step(e, k, &loss) != LP_OK) fail_msg("step %d: %s", k, lp_exec_last_error(e));
  }
  lp_schedule_free(s);
  lp_schedule_free(low);
  return e;
}

/* What one rank had, as the test carries it to every rank itself (one
 * broadcast per rank: a path of its own, not the all-gather under test). */
typedef struct had {
  lp_exec_timing total;
  int host_ranks, host_cores, nacts, nkept;
  int64_t grad;
  lp_exec_kind_times kinds[LP_EXEC_NKINDS * 8];
} had;

static void own(const lp_exec *e, had *h) {
  memset(h, 0, sizeof *h);
  lp_exec_timing_of(e, 1, &h->total);
  h->host_ranks = lp_exec_host_share(e, &h->host_cores);
  for (int s = 0; s < PP; s++) {
    size_t act, grad;
    assert_int_equal(lp_exec_message_floats(e, s, &act, &grad), LP_OK);
    if ((int64_t)grad > h->grad) h->grad = (int64_t)grad;
    for (int k = 0; k < LP_EXEC_NKINDS; k++) {
      lp_exec_kind_times *t = &h->kinds[k * PP + s];
      assert_int_equal(lp_exec_action_time(e, 1, k, s, &t->sum, &t->n), LP_OK);
      assert_int_equal(lp_exec_action_exchanges(e, 1, k, s, &t->x), LP_OK);
    }
  }
  h->nkept = lp_exec_step_times_count(e);
  const double *times;
  assert_int_equal(lp_exec_step_times(e, 0, NULL, NULL, &times, &h->nacts), LP_OK);
}

static void same_timing(const lp_exec_timing *a, const lp_exec_timing *b) {
  assert_true(a->steps == b->steps && a->wall == b->wall && a->compute == b->compute &&
              a->wait == b->wait && a->post == b->post && a->optim == b->optim &&
              a->overhead == b->overhead && a->a2a_count == b->a2a_count && a->a2a == b->a2a &&
              a->a2a_blocked == b->a2a_blocked && a->a2a_hidden == b->a2a_hidden &&
              a->a2a_link == b->a2a_link && a->reduce == b->reduce);
}

static void same_kind(const lp_exec_kind_times *a, const lp_exec_kind_times *b) {
  assert_true(a->sum == b->sum && a->n == b->n && a->x.n == b->x.n &&
              a->x.bytes_out == b->x.bytes_out && a->x.bytes_in == b->x.bytes_in &&
              a->x.bytes_max == b->x.bytes_max && a->x.blocked == b->x.blocked &&
              a->x.halves == b->x.halves);
}

/* Every rank's figures come back under its world rank on every rank;
 * the sums are the ranks' in rank order; the kept steps are every rank's
 * last ones. */
static void test_job_timing(void **state) {
  (void)state;
  lp_exec *e = trained();
  lp_exec_job_times *t = NULL;
  if (lp_exec_job_timing(e, &t) != LP_OK) fail_msg("job timing: %s", lp_exec_last_error(e));
  assert_int_equal(t->ranks, P);
  assert_int_equal(t->stages, PP);
  assert_int_equal(t->ep, EP);
  assert_int_equal(t->kept, STEPS); /* every rank kept all its steps */
  lp_exec_timing sum;
  memset(&sum, 0, sizeof sum);
  lp_exec_kind_times kinds[LP_EXEC_NKINDS * 8];
  memset(kinds, 0, sizeof kinds);
  for (int r = 0; r < P; r++) {
    had h;
    if (r == R) own(e, &h);
    assert_int_equal(lp_comm_bcast(W, &h, sizeof h, r, "what rank r had"), LP_OK);
    const lp_exec_rank_times *rt = &t->rank[r];
    same_timing(&rt->total, &h.total);
    assert_int_equal(rt->total.steps, STEPS);
    assert_int_equal(rt->host_ranks, h.host_ranks);
    assert_int_equal(rt->host_cores, h.host_cores);
    assert_int_equal(rt->grad_floats, h.grad);
    assert_int_equal(rt->nacts, h.nacts);
    assert_int_equal(rt->nkept, h.nkept);
    /* its kept rows: wall, after, a time per action */
    size_t row = (size_t)h.nacts + 2;
    double *rows = lp_malloc((size_t)STEPS * row * sizeof *rows);
    if (r == R)
      for (int k = 0; k < STEPS; k++) {
        const double *times;
        double *q = rows + (size_t)k * row;
        assert_int_equal(lp_exec_step_times(e, h.nkept - STEPS + k, &q[0], &q[1], &times, NULL),
                         LP_OK);
        memcpy(q + 2, times, (row - 2) * sizeof *q);
      }
    assert_int_equal(lp_comm_bcast(W, rows, (size_t)STEPS * row * sizeof *rows, r, "rows"), LP_OK);
    assert_memory_equal(rt->kept, rows, (size_t)STEPS * row * sizeof *rows);
    int ncomp = 0;
    for (int i = 0; i < h.nacts; i++) ncomp += rows[2 + i] > 0;
    assert_true(ncomp >= 2 * MB && rows[0] > 0 && rows[1] > 0);
    lp_free(rows);
    /* the sums, in rank order */
    sum.steps += h.total.steps, sum.wall += h.total.wall, sum.compute += h.total.compute;
    sum.wait += h.total.wait, sum.post += h.total.post, sum.optim += h.total.optim;
    sum.overhead += h.total.overhead, sum.a2a_count += h.total.a2a_count;
    sum.a2a += h.total.a2a, sum.a2a_blocked += h.total.a2a_blocked;
    sum.a2a_hidden += h.total.a2a_hidden, sum.a2a_link += h.total.a2a_link;
    sum.reduce += h.total.reduce;
    for (int i = 0; i < LP_EXEC_NKINDS * PP; i++) {
      kinds[i].sum += h.kinds[i].sum, kinds[i].n += h.kinds[i].n;
      kinds[i].x.n += h.kinds[i].x.n, kinds[i].x.bytes_out += h.kinds[i].x.bytes_out;
      kinds[i].x.bytes_in += h.kinds[i].x.bytes_in;
      kinds[i].x.bytes_max += h.kinds[i].x.bytes_max;
      kinds[i].x.blocked += h.kinds[i].x.blocked, kinds[i].x.halves += h.kinds[i].x.halves;
    }
  }
  same_timing(&t->sum, &sum);
  assert_int_equal(t->sum.steps, (int64_t)STEPS * P);
  for (int i = 0; i < LP_EXEC_NKINDS * PP; i++) same_kind(&t->kinds[i], &kinds[i]);
  /* every F of every rank: M per step */
  int64_t nf = 0;
  for (int s = 0; s < PP; s++) nf += t->kinds[LP_EXEC_K_F * PP + s].n;
  assert_int_equal(nf, (int64_t)P * MB * STEPS);
  /* tracing on, real messages between pipeline ranks: a latency measured */
  assert_true(PP == 1 ? t->latency_messages == 0 : t->latency_messages > 0);
  assert_true(t->latency_ms >= 0);
  lp_exec_job_times_free(t);
  /* after a reset no rank keeps a step: none gathered */
  lp_exec_timing_reset(e);
  assert_int_equal(lp_exec_job_timing(e, &t), LP_OK);
  assert_int_equal(t->kept, 0);
  assert_int_equal(t->sum.steps, 0);
  lp_exec_job_times_free(t);
  lp_exec_free(e);
}

/* ---- planted trace events ---- */

static void add(lp_exec *e, int kind, int index, int peer, int tag, int64_t step, double start,
                double dur) {
  lp_trace_event ev;
  lp_trace_event_init(&ev);
  ev.rank = R;
  ev.kind = kind;
  ev.index = index;
  ev.peer = peer;
  ev.tag = tag;
  ev.step = step;
  ev.start_us = start;
  ev.dur_us = dur;
  assert_int_equal(lp_trace_add_event(lp_exec_trace(e), &ev, NULL), LP_OK);
}

/* Rank r's planted events: three steps of compute slices (optimizer
 * slices: index -1), and messages to r + 1 / from r - 1 (ring): one
 * waited-for receive (tag 3), a key sent twice (the later send counts), a
 * receive without a send, a receive that did not wait, a receive that
 * ended before its send started, a slice of no message (peer -1). */
static void plant(lp_exec *e) {
  int next = (R + 1) % P, prev = (R + P - 1) % P;
  assert_int_equal(lp_exec_trace_clear(e), LP_OK);
  add(e, LP_TRACE_COMPUTE, 0, -1, -1, 1, 1, 1);
  add(e, LP_TRACE_COMPUTE, -1, -1, -1, 1, 2, 1);
  add(e, LP_TRACE_COMPUTE, 1, -1, -1, 2, 10 * R + 3, 0.5 + R);
  add(e, LP_TRACE_SEND, 1, next, 3, 1, 1 + 10 * R, 7);
  add(e, LP_TRACE_RECV, 0, prev, 3, 1, 95 + 10 * R, 30 + R);
  add(e, LP_TRACE_SEND, 1, next, 5, 2, 10, 1);
  add(e, LP_TRACE_SEND, 1, next, 5, 2, 50, 1);
  add(e, LP_TRACE_RECV, 0, prev, 5, 2, 0, 100);
  add(e, LP_TRACE_RECV, 0, prev, 9, 1, 0, 10);
  add(e, LP_TRACE_RECV, 0, prev, 3, 1, 5, 0);
  add(e, LP_TRACE_SEND, 1, next, 4, 1, 1000, 1);
  add(e, LP_TRACE_RECV, 0, prev, 4, 1, 0, 10);
  add(e, LP_TRACE_SEND, 1, -1, -1, 2, 0, 5);
  add(e, LP_TRACE_COMPUTE, 2, -1, -1, 2, 10 * R + 4, 0.25);
  add(e, LP_TRACE_COMPUTE, -1, -1, -1, 2, 10 * R + 5, 2);
}

static void test_planted_trace(void **state) {
  (void)state;
  lp_exec *e = trained();
  plant(e);
  lp_exec_job_times *t = NULL;
  if (lp_exec_job_timing(e, &t) != LP_OK) fail_msg("job timing: %s", lp_exec_last_error(e));
  /* per rank r: the tag-3 receive waited from its start (after the send's,
   * with up to 9 ranks) to its end; the tag-5 one from the later send (50)
   * to its end (100) */
  double sum = 0;
  for (int r = 0; r < P; r++) {
    sum += 30 + r;
    sum += 50;
  }
  assert_int_equal(t->latency_messages, 2 * P);
  assert_true(t->latency_ms == sum / (double)(2 * P) / 1000);
  for (int r = 0; r < P; r++) {
    const lp_exec_rank_times *rt = &t->rank[r];
    assert_int_equal(rt->nslices, 3); /* after the next-to-last optimizer */
    assert_int_equal(rt->slices[0].index, 1);
    assert_true(rt->slices[0].start_us == 10 * r + 3 && rt->slices[0].dur_us == 0.5 + r);
    assert_int_equal(rt->slices[1].index, 2);
    assert_true(rt->slices[1].start_us == 10 * r + 4 && rt->slices[1].dur_us == 0.25);
    assert_int_equal(rt->slices[2].index, -1);
    assert_true(rt->slices[2].start_us == 10 * r + 5 && rt->slices[2].dur_us == 2);
  }
  lp_exec_job_times_free(t);
  lp_exec_free(e);
}

/* ---- one process: every allocation of the gather may fail ---- */

static lp_exec *oom_exec;

static lp_status gather_once(void) {
  lp_exec_job_times *t = NULL;
  lp_status st = lp_exec_job_timing(oom_exec, &t);
  if (st == LP_OK) assert_non_null(t);
  else assert_null(t);
  lp_exec_job_times_free(t);
  return st;
}

static void test_out_of_memory(void **state) {
  (void)state;
  if (P > 1) skip(); /* a rank failing alone leaves the others to the watchdog */
  oom_exec = trained();
  plant(oom_exec);
  int points = lp_test_oom_points(gather_once, 200);
  assert_true(points >= 8);
  assert_int_equal(gather_once(), LP_OK);
  lp_exec_free(oom_exec);
}

int main(int argc, char **argv) {
  if (lp_comm_mpi_init(&argc, &argv) != LP_OK) return 1;
  W = lp_comm_world();
  P = lp_comm_size(W);
  R = lp_comm_rank(W);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_allgather),
      cmocka_unit_test(test_job_timing),
      cmocka_unit_test(test_planted_trace),
      cmocka_unit_test(test_out_of_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
