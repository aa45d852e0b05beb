/* test_backend_routing.c — a whole model runs through the backend table
 * alone, on the "fake:0" backend of lp_test_fake_backend.h (memory the
 * host cannot dereference, not host_accessible, like a GPU). Any host loop
 * left in the tensor, nn, loss or optimizer code that touches device memory
 * crashes this test. Results must equal the CPU run bit for bit (the same
 * functions do the math). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "lp_nn.h"
#include "lp_test_fake_backend.h"

/* bitwise equal after bringing `got` to the host */
static void assert_same(const lp_tensor *got, const lp_tensor *want) {
  lp_tensor *h = NULL;
  assert_int_equal(lp_tensor_to_host(got, &h), LP_OK);
  assert_true(lp_tensor_equal(h, want));
  lp_tensor_free(h);
}

enum { V = 29, D = 16, H = 2, B = 2, T = 9 };

static lp_nn_layer *build_lm(void) {
  lp_nn_layer *l[4] = {NULL}, *chunk = NULL;
  assert_int_equal(lp_nn_embedding_new("emb", V, D, 5, &l[0]), LP_OK);
  assert_int_equal(lp_nn_transformer_block_new("blk", D, H, 2 * D,
                                               LP_TENSOR_ACT_GELU, 5, &l[1]),
                   LP_OK);
  assert_int_equal(lp_nn_rmsnorm_new("norm", D, 1e-5f, &l[2]), LP_OK);
  assert_int_equal(lp_nn_linear_new("head", D, V, 1, 5, &l[3]), LP_OK);
  assert_int_equal(lp_nn_chunk_new("lm", l, 4, &chunk), LP_OK);
  for (int i = 0; i < 4; i++) lp_nn_layer_release(l[i]);
  return chunk;
}

/* MoE layer: sigmoid router, expert groups, a shared expert, the balance
 * loss, a route scale: every part of the router's backward runs */
static lp_nn_layer *build_moe(void) {
  lp_nn_layer *l[3] = {NULL}, *chunk = NULL;
  lp_nn_moe_opts o = {0};
  o.dim = 12, o.hidden = 10, o.experts = 6, o.topk = 2, o.groups = 3;
  o.topk_groups = 2, o.shared = 1, o.route_scale = 1.5f;
  o.balance_alpha = 0.01f;
  assert_int_equal(lp_nn_linear_new("in", 6, 12, 1, 9, &l[0]), LP_OK);
  assert_int_equal(lp_nn_moe_new("moe", &o, 9, &l[1]), LP_OK);
  assert_int_equal(lp_nn_linear_new("out", 12, 3, 1, 9, &l[2]), LP_OK);
  assert_int_equal(lp_nn_chunk_new("moe_net", l, 3, &chunk), LP_OK);
  for (int i = 0; i < 3; i++) lp_nn_layer_release(l[i]);
  return chunk;
}

/* MoE transformer block (softmax router) inside the LM */
static lp_nn_layer *build_moe_lm(void) {
  lp_nn_layer *l[4] = {NULL}, *chunk = NULL;
  lp_nn_moe_opts o = {0};
  o.dim = D, o.hidden = 12, o.experts = 4, o.topk = 2;
  o.router = LP_NN_ROUTER_SOFTMAX;
  assert_int_equal(lp_nn_embedding_new("emb", V, D, 5, &l[0]), LP_OK);
  assert_int_equal(lp_nn_moe_block_new("blk", H, &o, 5, &l[1]), LP_OK);
  assert_int_equal(lp_nn_rmsnorm_new("norm", D, 1e-5f, &l[2]), LP_OK);
  assert_int_equal(lp_nn_linear_new("head", D, V, 1, 5, &l[3]), LP_OK);
  assert_int_equal(lp_nn_chunk_new("moe_lm", l, 4, &chunk), LP_OK);
  for (int i = 0; i < 4; i++) lp_nn_layer_release(l[i]);
  return chunk;
}

static lp_nn_layer *build_mlp(void) {
  lp_nn_layer *l[3] = {NULL}, *chunk = NULL;
  assert_int_equal(lp_nn_linear_new("in", 6, 12, 1, 9, &l[0]), LP_OK);
  assert_int_equal(
      lp_nn_mlp_block_new("mlp", 12, 24, LP_TENSOR_ACT_SILU, 9, &l[1]), LP_OK);
  assert_int_equal(lp_nn_linear_new("out", 12, 3, 1, 9, &l[2]), LP_OK);
  assert_int_equal(lp_nn_chunk_new("mlp_net", l, 3, &chunk), LP_OK);
  for (int i = 0; i < 3; i++) lp_nn_layer_release(l[i]);
  return chunk;
}

/* Trains m for 3 steps on (x, target); returns the last loss; *out gets the
 * last output (on m's backend). */
static double train3(lp_nn_layer *m, int ce, const lp_tensor *x,
                     const lp_tensor *target, lp_tensor **out,
                     lp_tensor **dxout) {
  size_t np;
  const lp_nn_param *p = lp_nn_params(m, &np);
  lp_nn_optim *o = NULL;
  if (ce) {
    lp_nn_adamw_opts a = {1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f};
    assert_int_equal(lp_nn_optim_adamw_new(p, np, &a, &o), LP_OK);
  } else {
    lp_nn_sgd_opts s = {0.05f, 0.9f, 1e-3f};
    assert_int_equal(lp_nn_optim_sgd_new(p, np, &s, &o), LP_OK);
  }
  double loss = 0;
  for (int it = 0; it < 3; it++) {
    lp_nn_ctx *ctx = NULL;
    lp_tensor *y = NULL, *dy = NULL, *dx = NULL;
    assert_int_equal(lp_nn_ctx_new(&ctx), LP_OK);
    assert_int_equal(lp_nn_optim_zero_grad(o), LP_OK);
    assert_int_equal(lp_nn_forward(m, ctx, x, &y), LP_OK);
    assert_int_equal(ce ? lp_nn_loss_cross_entropy(y, target, 0.5f, &loss, &dy)
                        : lp_nn_loss_mse(y, target, 0.5f, &loss, &dy),
                     LP_OK);
    /* I and W split, as the zero-bubble schedules run them */
    assert_int_equal(lp_nn_input_grad(m, ctx, dy, &dx), LP_OK);
    assert_int_equal(lp_nn_weight_grad(m, ctx, NULL), LP_OK);
    assert_int_equal(lp_nn_optim_step(o), LP_OK);
    if (it == 2) *out = y, *dxout = dx;
    else lp_tensor_free(y), lp_tensor_free(dx);
    lp_tensor_free(dy);
    lp_nn_ctx_free(ctx);
  }
  size_t ns = lp_nn_optim_state_numel(o);
  float *st = lp_malloc(ns * sizeof *st);
  assert_int_equal(lp_nn_optim_state_export(o, st, ns, NULL), LP_OK);
  assert_int_equal(lp_nn_optim_state_import(o, st, ns, 3), LP_OK);
  lp_free(st);
  lp_nn_optim_free(o);
  return loss;
}

static void twin(lp_nn_layer *(*build)(void), int ce, lp_tensor *x,
                 lp_tensor *xf, lp_tensor *target) {
  lp_nn_layer *a = build(), *b = build();
  assert_int_equal(lp_nn_layer_to(b, &fake), LP_OK);
  size_t na, nb;
  const lp_nn_param *pa = lp_nn_params(a, &na), *pb = lp_nn_params(b, &nb);
  assert_int_equal(na, nb);
  for (size_t i = 0; i < nb; i++) {
    assert_ptr_equal(lp_tensor_backend_of(pb[i].value), &fake);
    assert_ptr_equal(lp_tensor_backend_of(pb[i].grad), &fake);
  }
  lp_tensor *ya = NULL, *yb = NULL, *dxa = NULL, *dxb = NULL;
  double la = train3(a, ce, x, target, &ya, &dxa);
  double lb = train3(b, ce, xf, target, &yb, &dxb);
  assert_memory_equal(&la, &lb, sizeof la);
  assert_ptr_equal(lp_tensor_backend_of(yb), &fake);
  assert_same(yb, ya);
  assert_int_equal(dxa == NULL, dxb == NULL);
  if (dxa) assert_same(dxb, dxa);
  lp_tensor_free(dxa), lp_tensor_free(dxb);
  for (size_t i = 0; i < nb; i++) {
    assert_same(pb[i].value, pa[i].value);
    assert_same(pb[i].grad, pa[i].grad);
  }
  /* and back to the host */
  assert_int_equal(lp_nn_layer_to(b, NULL), LP_OK);
  assert_true(lp_tensor_equal(pb[0].value, pa[0].value));
  lp_tensor_free(ya), lp_tensor_free(yb);
  lp_nn_layer_release(a), lp_nn_layer_release(b);
}

static void test_lm_on_device(void **state) {
  (void)state;
  float ids[B * T], tg[B * T];
  for (int i = 0; i < B * T; i++) ids[i] = (float)((i * 7) % V), tg[i] = (float)((i * 5 + 3) % V);
  lp_tensor *x = NULL, *t = NULL;
  assert_int_equal(lp_tensor_from_data(NULL, 2, (int64_t[]){B, T}, ids, &x), LP_OK);
  assert_int_equal(lp_tensor_from_data(NULL, 1, (int64_t[]){B * T}, tg, &t), LP_OK);
  /* token ids and targets stay on the host */
  twin(build_lm, 1, x, x, t);
  lp_tensor_free(x), lp_tensor_free(t);
}

static void test_mlp_on_device(void **state) {
  (void)state;
  lp_tensor *x = NULL, *xf = NULL, *t = NULL;
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, 4);
  assert_int_equal(lp_tensor_empty(NULL, 2, (int64_t[]){10, 6}, &x), LP_OK);
  assert_int_equal(lp_tensor_fill_normal(x, &r, 0, 1), LP_OK);
  assert_int_equal(lp_tensor_empty(NULL, 2, (int64_t[]){10, 3}, &t), LP_OK);
  assert_int_equal(lp_tensor_fill_normal(t, &r, 0, 1), LP_OK);
  assert_int_equal(lp_tensor_empty(&fake, 2, (int64_t[]){10, 6}, &xf), LP_OK);
  assert_int_equal(lp_tensor_copy(xf, x), LP_OK);
  twin(build_mlp, 0, x, xf, t);
  lp_tensor_free(x), lp_tensor_free(xf), lp_tensor_free(t);
}

static void test_moe_on_device(void **state) {
  (void)state;
  lp_tensor *x = NULL, *xf = NULL, *t = NULL;
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, 6);
  assert_int_equal(lp_tensor_empty(NULL, 2, (int64_t[]){14, 6}, &x), LP_OK);
  assert_int_equal(lp_tensor_fill_normal(x, &r, 0, 1), LP_OK);
  assert_int_equal(lp_tensor_empty(NULL, 2, (int64_t[]){14, 3}, &t), LP_OK);
  assert_int_equal(lp_tensor_fill_normal(t, &r, 0, 1), LP_OK);
  assert_int_equal(lp_tensor_empty(&fake, 2, (int64_t[]){14, 6}, &xf), LP_OK);
  assert_int_equal(lp_tensor_copy(xf, x), LP_OK);
  twin(build_moe, 0, x, xf, t);
  lp_tensor_free(x), lp_tensor_free(xf), lp_tensor_free(t);
}

static void test_moe_lm_on_device(void **state) {
  (void)state;
  float ids[B * T], tg[B * T];
  for (int i = 0; i < B * T; i++) ids[i] = (float)((i * 11) % V), tg[i] = (float)((i * 3 + 1) % V);
  lp_tensor *x = NULL, *t = NULL;
  assert_int_equal(lp_tensor_from_data(NULL, 2, (int64_t[]){B, T}, ids, &x), LP_OK);
  assert_int_equal(lp_tensor_from_data(NULL, 1, (int64_t[]){B * T}, tg, &t), LP_OK);
  twin(build_moe_lm, 1, x, x, t);
  lp_tensor_free(x), lp_tensor_free(t);
}

/* lp_nn_moe_route on a layer whose memory the host cannot touch: the
 * CPU's decisions, weights and affinities, bitwise. */
static void test_moe_route_on_device(void **state) {
  (void)state;
  lp_nn_moe_opts o = {0};
  o.dim = 12, o.hidden = 10, o.experts = 6, o.topk = 2, o.groups = 3;
  o.topk_groups = 2, o.route_scale = 1.5f;
  lp_nn_layer *a = NULL, *b = NULL;
  assert_int_equal(lp_nn_moe_new("moe", &o, 9, &a), LP_OK);
  assert_int_equal(lp_nn_moe_new("moe", &o, 9, &b), LP_OK);
  assert_int_equal(lp_nn_layer_to(b, &fake), LP_OK);
  float bias[6] = {0.1f, -0.2f, 0.0f, 0.3f, 0.0f, -0.1f};
  assert_int_equal(lp_nn_moe_set_bias(a, bias), LP_OK);
  assert_int_equal(lp_nn_moe_set_bias(b, bias), LP_OK);
  lp_tensor *x = NULL, *xf = NULL;
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, 8);
  assert_int_equal(lp_tensor_empty(NULL, 3, (int64_t[]){2, 5, 12}, &x), LP_OK);
  assert_int_equal(lp_tensor_fill_normal(x, &r, 0, 1), LP_OK);
  assert_int_equal(lp_tensor_empty(&fake, 3, (int64_t[]){2, 5, 12}, &xf), LP_OK);
  assert_int_equal(lp_tensor_copy(xf, x), LP_OK);
  int ea[20], eb[20];
  float wa[20], wb[20], sa[60], sb[60];
  assert_int_equal(lp_nn_moe_route(a, x, ea, wa, sa), LP_OK);
  assert_int_equal(lp_nn_moe_route(b, xf, eb, wb, sb), LP_OK);
  assert_memory_equal(ea, eb, sizeof ea);
  assert_memory_equal(wa, wb, sizeof wa);
  assert_memory_equal(sa, sb, sizeof sa);
  for (int t = 0; t < 10; t++) {
    assert_true(ea[2 * t] != ea[2 * t + 1]);
    assert_true(ea[2 * t] >= 0 && ea[2 * t] < 6);
    assert_float_equal(wa[2 * t] + wa[2 * t + 1], 1.5f, 1e-5f);
  }
  /* a wrong shape is refused */
  lp_tensor *bad = NULL;
  assert_int_equal(lp_tensor_empty(NULL, 2, (int64_t[]){3, 5}, &bad), LP_OK);
  assert_int_equal(lp_nn_moe_route(a, bad, ea, wa, sa), LP_ERR_ARG);
  lp_tensor_free(bad), lp_tensor_free(x), lp_tensor_free(xf);
  lp_nn_layer_release(a), lp_nn_layer_release(b);
}

/* Two EP ranks in one process: an exchange runs when both have started it
 * (rank r's n-th start pairs with the other rank's n-th). */
enum { XMAX = 16 };
typedef struct xchg {
  const lp_tensor_backend *be; /* where the rows live (NULL: host) */
  const float *send[2];
  float *recv[2];
  const size_t *sc[2], *rc[2];
  int joined;
} xchg;
typedef struct xworld {
  int started[2];
  xchg x[XMAX];
} xworld;
typedef struct xrank {
  xworld *w;
  int rank;
} xrank;

static int device_rows; /* exchange starts handed device memory */

static lp_status x_start(void *ud, const lp_nn_xinfo *xi, const float *send,
                         const size_t *sc, float *recv, const size_t *rc,
                         void **handle) {
  xrank *me = ud;
  int n = me->w->started[me->rank]++;
  assert_true(n < XMAX);
  xworld *w = me->w;
  /* the layer hands over rows where they live: device rows name their
   * backend, which moves them (as the executor's comm context would) */
  if (w->x[n].joined) assert_ptr_equal(w->x[n].be, xi->be);
  w->x[n].be = xi->be;
  if (xi->be) device_rows++;
  w->x[n].send[me->rank] = send, w->x[n].sc[me->rank] = sc;
  w->x[n].recv[me->rank] = recv, w->x[n].rc[me->rank] = rc;
  if (++w->x[n].joined == 2)
    for (int a = 0; a < 2; a++)
      for (int b = 0; b < 2; b++) { /* a sends to b */
        size_t so = 0, ro = 0;
        for (int i = 0; i < b; i++) so += w->x[n].sc[a][i];
        for (int i = 0; i < a; i++) ro += w->x[n].rc[b][i];
        assert_int_equal(w->x[n].sc[a][b], w->x[n].rc[b][a]);
        if (xi->be)
          assert_int_equal(xi->be->copy(xi->be, (int64_t)w->x[n].sc[a][b],
                                        w->x[n].send[a] + so,
                                        w->x[n].recv[b] + ro),
                           LP_OK);
        else
          memcpy(w->x[n].recv[b] + ro, w->x[n].send[a] + so,
                 w->x[n].sc[a][b] * sizeof(float));
      }
  *handle = &w->x[n];
  return LP_OK;
}

static lp_status x_wait(void *ud, void *handle) {
  (void)ud;
  /* both ranks started it before either waits (the driver's order) */
  assert_int_equal(((const xchg *)handle)->joined, 2);
  return LP_OK;
}

/* Runs forward, input-grad and weight-grad of an MoE block over two EP
 * ranks with the layers on `be` (NULL: CPU); y, dx: [2] outputs per rank;
 * the layers come back for their grads. */
static void ep2_run(const lp_tensor_backend *be, const lp_tensor *x,
                    const lp_tensor *dy, lp_nn_layer **ls, lp_tensor **y,
                    lp_tensor **dx) {
  lp_nn_moe_opts o = {0};
  o.dim = D, o.hidden = 10, o.experts = 6, o.topk = 2, o.groups = 3;
  o.topk_groups = 2, o.shared = 1, o.route_scale = 1.5f;
  o.balance_alpha = 0.01f;
  static xworld w;
  static xrank xr[2];
  memset(&w, 0, sizeof w);
  lp_nn_ctx *cs[2] = {NULL};
  lp_tensor *xs[2] = {NULL}, *dys[2] = {NULL};
  for (int r = 0; r < 2; r++) {
    xr[r] = (xrank){&w, r};
    lp_nn_ep ep = {2, r, &xr[r], x_start, x_wait};
    assert_int_equal(lp_nn_moe_block_new("b", H, &o, 5, &ls[r]), LP_OK);
    assert_int_equal(lp_nn_set_ep(ls[r], &ep), LP_OK);
    if (be) assert_int_equal(lp_nn_layer_to(ls[r], be), LP_OK);
    assert_int_equal(lp_nn_ctx_new(&cs[r]), LP_OK);
    lp_tensor *xv = NULL, *dv = NULL;
    assert_int_equal(lp_tensor_rows(x, r, 1, &xv), LP_OK);
    assert_int_equal(lp_tensor_rows(dy, r, 1, &dv), LP_OK);
    assert_int_equal(lp_tensor_empty(be, 3, xv->shape, &xs[r]), LP_OK);
    assert_int_equal(lp_tensor_empty(be, 3, dv->shape, &dys[r]), LP_OK);
    assert_int_equal(lp_tensor_copy(xs[r], xv), LP_OK);
    assert_int_equal(lp_tensor_copy(dys[r], dv), LP_OK);
    lp_tensor_free(xv), lp_tensor_free(dv);
  }
  for (int pass = 0; pass < 2; pass++) {
    int done[2] = {0, 0};
    lp_tensor **out = pass ? dx : y;
    for (int r = 0; r < 2; r++)
      assert_int_equal(pass ? lp_nn_input_grad_begin(ls[r], cs[r], dys[r])
                            : lp_nn_forward_begin(ls[r], cs[r], xs[r]),
                       LP_OK);
    while (!done[0] || !done[1])
      for (int r = 0; r < 2; r++)
        if (!done[r])
          assert_int_equal(lp_nn_advance(ls[r], cs[r], &done[r], &out[r]),
                           LP_OK);
  }
  for (int r = 0; r < 2; r++) {
    assert_int_equal(lp_nn_weight_grad(ls[r], cs[r], NULL), LP_OK);
    lp_nn_ctx_free(cs[r]);
    lp_tensor_free(xs[r]), lp_tensor_free(dys[r]);
  }
}

/* An MoE block over two EP ranks: the exchanges take device rows where
 * they live (xinfo.be names the backend, the count exchange is host
 * memory); forward, input-grad and weight-grad equal the CPU's */
static void test_moe_ep2_on_device(void **state) {
  (void)state;
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, 8);
  lp_tensor *x = NULL, *dy = NULL;
  assert_int_equal(lp_tensor_empty(NULL, 3, (int64_t[]){2, T, D}, &x), LP_OK);
  assert_int_equal(lp_tensor_fill_normal(x, &r, 0, 1), LP_OK);
  assert_int_equal(lp_tensor_empty(NULL, 3, (int64_t[]){2, T, D}, &dy), LP_OK);
  assert_int_equal(lp_tensor_fill_normal(dy, &r, 0, 1), LP_OK);
  lp_nn_layer *la[2], *lb[2];
  lp_tensor *ya[2] = {NULL}, *yb[2] = {NULL}, *dxa[2] = {NULL},
            *dxb[2] = {NULL};
  device_rows = 0;
  ep2_run(NULL, x, dy, la, ya, dxa);
  assert_int_equal(device_rows, 0);
  ep2_run(&fake, x, dy, lb, yb, dxb);
  /* dispatch, combine, their backwards: 4 row exchanges on 2 ranks */
  assert_int_equal(device_rows, 8);
  for (int k = 0; k < 2; k++) {
    assert_ptr_equal(lp_tensor_backend_of(yb[k]), &fake);
    assert_same(yb[k], ya[k]);
    assert_same(dxb[k], dxa[k]);
    size_t na, nb;
    const lp_nn_param *pa = lp_nn_params(la[k], &na);
    const lp_nn_param *pb = lp_nn_params(lb[k], &nb);
    assert_int_equal(na, nb);
    for (size_t i = 0; i < na; i++) {
      assert_ptr_equal(lp_tensor_backend_of(pb[i].grad), &fake);
      assert_same(pb[i].grad, pa[i].grad);
    }
    lp_tensor_free(ya[k]), lp_tensor_free(yb[k]);
    lp_tensor_free(dxa[k]), lp_tensor_free(dxb[k]);
    lp_nn_layer_release(la[k]), lp_nn_layer_release(lb[k]);
  }
  lp_tensor_free(x), lp_tensor_free(dy);
}

static void test_mixing_devices(void **state) {
  (void)state;
  lp_nn_layer *lin = NULL;
  lp_nn_ctx *ctx = NULL;
  lp_tensor *x = NULL, *y = NULL, *v = NULL;
  assert_int_equal(lp_nn_linear_new("fc", 4, 3, 1, 1, &lin), LP_OK);
  assert_int_equal(lp_nn_layer_to(lin, &fake), LP_OK);
  assert_int_equal(lp_nn_ctx_new(&ctx), LP_OK);
  assert_int_equal(lp_tensor_zeros(NULL, 2, (int64_t[]){2, 4}, &x), LP_OK);
  assert_int_equal(lp_nn_forward(lin, ctx, x, &y), LP_ERR_ARG);
  assert_null(y);
  assert_string_equal(lp_nn_ctx_last_error(ctx),
                      "layer fc (linear): input is on cpu but the parameters "
                      "are on fake:0 (move one of them: lp_nn_layer_to / "
                      "model:to)");
  /* tensor ops refuse mixed backends; a tensor with a second header
   * cannot move (the other header would dangle) */
  lp_tensor *d = NULL;
  assert_int_equal(lp_tensor_zeros(&fake, 2, (int64_t[]){2, 4}, &d), LP_OK);
  assert_int_equal(lp_tensor_add(d, d, x), LP_ERR_ARG);
  assert_int_equal(lp_tensor_view(x, &v), LP_OK);
  assert_int_equal(lp_tensor_move(x, &fake), LP_ERR_ARG);
  assert_ptr_equal(lp_tensor_backend_of(x), lp_tensor_backend_cpu());
  lp_tensor_free(v);
  assert_int_equal(lp_tensor_move(x, &fake), LP_OK);
  /* a strided (transposed) device view read back to the host */
  lp_tensor *m = NULL, *mt = NULL, *h = NULL;
  float vals[6] = {1, 2, 3, 4, 5, 6};
  assert_int_equal(lp_tensor_from_data(&fake, 2, (int64_t[]){2, 3}, vals, &m), LP_OK);
  assert_int_equal(lp_tensor_transpose(m, 0, 1, &mt), LP_OK);
  assert_int_equal(lp_tensor_to_host(mt, &h), LP_OK);
  assert_true(lp_tensor_is_contiguous(h));
  float want[6] = {1, 4, 2, 5, 3, 6};
  assert_memory_equal(h->data, want, sizeof want);
  /* read / write dense tensors through host memory */
  float back[6] = {0}, two[6] = {2, 2, 2, 2, 2, 2};
  assert_int_equal(lp_tensor_read(m, back), LP_OK);
  assert_memory_equal(back, vals, sizeof vals);
  assert_int_equal(lp_tensor_write(m, two), LP_OK);
  assert_int_equal(lp_tensor_read(m, back), LP_OK);
  assert_memory_equal(back, two, sizeof two);
  assert_int_equal(lp_tensor_read(mt, back), LP_ERR_ARG); /* strided */
  lp_tensor_free(m), lp_tensor_free(mt), lp_tensor_free(h);
  assert_ptr_equal(lp_tensor_backend_of(x), &fake);
  lp_tensor_free(d), lp_tensor_free(x);
  lp_nn_ctx_free(ctx);
  lp_nn_layer_release(lin);
}

static void test_optimizer_before_move(void **state) {
  (void)state;
  lp_nn_layer *lin = NULL;
  lp_nn_optim *o = NULL;
  size_t n;
  assert_int_equal(lp_nn_linear_new("fc", 4, 3, 1, 1, &lin), LP_OK);
  const lp_nn_param *p = lp_nn_params(lin, &n);
  lp_nn_sgd_opts s = {0.1f, 0.0f, 0.0f};
  assert_int_equal(lp_nn_optim_sgd_new(p, n, &s, &o), LP_OK);
  assert_int_equal(lp_nn_layer_to(lin, &fake), LP_OK);
  /* its state stayed on the CPU: refused, nothing touched */
  assert_int_equal(lp_nn_optim_step(o), LP_ERR_ARG);
  assert_int_equal(lp_nn_optim_steps(o), 0);
  lp_nn_optim_free(o);
  lp_nn_layer_release(lin);
}

int main(void) {
  fake_backend_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lm_on_device),
      cmocka_unit_test(test_mlp_on_device),
      cmocka_unit_test(test_moe_on_device),
      cmocka_unit_test(test_moe_lm_on_device),
      cmocka_unit_test(test_moe_route_on_device),
      cmocka_unit_test(test_moe_ep2_on_device),
      cmocka_unit_test(test_mixing_devices),
      cmocka_unit_test(test_optimizer_before_move),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
