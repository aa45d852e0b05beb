/* test_nn.c — lp_nn: finite-difference gradient checks for every layer,
 * both losses, composites and a whole model; the I/W split (I then W ==
 * full backward == W alone; W deferred past other micro-batches gives the
 * same bits); split-model initialisation; optimizers against hand-computed
 * numbers; error text; out-of-memory paths.
 *
 * Gradient checks: float32 forward, loss accumulated in double, central
 * differences (f(x+eps) - f(x-eps)) / 2eps with eps = 1e-2. An analytic
 * value a passes against the numerical n when
 *     |a - n| <= RTOL * |n| + ATOL * max(1, max_i |n_i|)
 * with RTOL = 1e-2 and ATOL = 1e-3 (float32 rounding in the forward is
 * ~1e-7 relative; divided by 2eps it is ~1e-5 of the loss scale). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_nn.h"
#include "lp_test_oom.h"

#define SH(...) ((int64_t[]){__VA_ARGS__})
#include "nn_gradcheck.h"

/* Integral ids in [0, vocab). */
static lp_tensor *ids(int ndim, const int64_t *shape, int64_t vocab,
                      uint64_t seed) {
  lp_tensor *t = NULL;
  assert_int_equal(lp_tensor_empty(NULL, ndim, shape, &t), LP_OK);
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, seed);
  for (int64_t i = 0; i < lp_tensor_numel(t); i++)
    t->data[i] = (float)(lp_tensor_rng_next(&r) % (uint64_t)vocab);
  return t;
}


/* ---- one test per layer ---- */

static void test_grad_linear(void **state) {
  (void)state;
  probe p = {0};
  assert_int_equal(lp_nn_linear_new("fc", 5, 4, 1, 1, &p.l), LP_OK);
  p.x = randn(3, SH(2, 3, 5), 11);
  gradcheck("linear", &p, 1);
  probe_done(&p);
  probe q = {0};
  assert_int_equal(lp_nn_linear_new("fc_nobias", 6, 3, 0, 1, &q.l), LP_OK);
  size_t n;
  lp_nn_params(q.l, &n);
  assert_int_equal(n, 1);
  q.x = randn(2, SH(4, 6), 12);
  gradcheck("linear (no bias)", &q, 1);
  probe_done(&q);
}

static void test_grad_embedding(void **state) {
  (void)state;
  probe p = {0};
  assert_int_equal(lp_nn_embedding_new("tok", 7, 5, 1, &p.l), LP_OK);
  p.x = ids(2, SH(2, 4), 7, 13);
  p.x->data[1] = p.x->data[0]; /* a repeated id accumulates twice */
  gradcheck("embedding", &p, 0);
  probe_done(&p);
}

static void test_grad_gelu_silu(void **state) {
  (void)state;
  probe p = {0};
  assert_int_equal(lp_nn_act_new("act", LP_TENSOR_ACT_GELU, &p.l), LP_OK);
  assert_string_equal(lp_nn_layer_kind(p.l), "gelu");
  p.x = randn(2, SH(4, 6), 14);
  gradcheck("gelu", &p, 1);
  probe_done(&p);
  probe q = {0};
  assert_int_equal(lp_nn_act_new("act", LP_TENSOR_ACT_SILU, &q.l), LP_OK);
  assert_string_equal(lp_nn_layer_kind(q.l), "silu");
  q.x = randn(2, SH(4, 6), 15);
  gradcheck("silu", &q, 1);
  probe_done(&q);
}

static void test_grad_rmsnorm(void **state) {
  (void)state;
  probe p = {0};
  assert_int_equal(lp_nn_rmsnorm_new("norm", 6, 1e-5f, &p.l), LP_OK);
  /* non-trivial weight so its gradient path is exercised */
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, 3);
  assert_int_equal(
      lp_tensor_fill_uniform(lp_nn_params(p.l, NULL)[0].value, &r, 0.5f, 1.5f),
      LP_OK);
  p.x = randn(3, SH(2, 3, 6), 16);
  gradcheck("rmsnorm", &p, 1);
  probe_done(&p);
}

static void test_grad_attention(void **state) {
  (void)state;
  probe p = {0};
  assert_int_equal(lp_nn_attention_new("attn", 8, 2, 5, &p.l), LP_OK);
  p.x = randn(3, SH(2, 4, 8), 17);
  gradcheck("attention", &p, 1);
  probe_done(&p);
  /* one head, longer sequence */
  probe q = {0};
  assert_int_equal(lp_nn_attention_new("attn1", 4, 1, 6, &q.l), LP_OK);
  q.x = randn(3, SH(1, 7, 4), 18);
  gradcheck("attention (1 head)", &q, 1);
  probe_done(&q);
}

static void test_attention_causal(void **state) {
  (void)state;
  lp_nn_layer *l = NULL;
  assert_int_equal(lp_nn_attention_new("attn", 8, 4, 7, &l), LP_OK);
  lp_tensor *x = randn(3, SH(2, 5, 8), 19), *y0 = NULL, *y1 = NULL;
  assert_int_equal(lp_nn_forward(l, NULL, x, &y0), LP_OK);
  for (int c = 0; c < 8; c++)
    x->data[(0 * 5 + 3) * 8 + c] += 1.0f; /* b 0, t 3 */
  assert_int_equal(lp_nn_forward(l, NULL, x, &y1), LP_OK);
  for (int t = 0; t < 5; t++)
    for (int c = 0; c < 8; c++) {
      int i = (0 * 5 + t) * 8 + c, j = (1 * 5 + t) * 8 + c;
      if (t < 3)
        assert_true(y0->data[i] == y1->data[i]); /* the past is blind */
      assert_true(y0->data[j] == y1->data[j]);   /* other batch row */
    }
  double d;
  assert_int_equal(lp_tensor_max_abs_diff(y0, y1, &d), LP_OK);
  assert_true(d > 1e-3);
  lp_tensor_free(x), lp_tensor_free(y0), lp_tensor_free(y1);
  lp_nn_layer_release(l);
}

static void test_grad_mlp_block(void **state) {
  (void)state;
  probe p = {0};
  assert_int_equal(
      lp_nn_mlp_block_new("mlp", 6, 10, LP_TENSOR_ACT_SILU, 8, &p.l), LP_OK);
  assert_string_equal(lp_nn_layer_kind(p.l), "residual");
  size_t n;
  const lp_nn_param *ps = lp_nn_params(p.l, &n);
  assert_int_equal(n, 5);
  assert_string_equal(ps[0].name, "mlp.norm.weight");
  assert_string_equal(ps[1].name, "mlp.fc1.weight");
  assert_string_equal(ps[4].name, "mlp.fc2.bias");
  p.x = randn(3, SH(2, 3, 6), 20);
  gradcheck("mlp block", &p, 1);
  probe_done(&p);
}

static void test_grad_transformer_block(void **state) {
  (void)state;
  probe p = {0};
  assert_int_equal(
      lp_nn_transformer_block_new("blk", 8, 2, 16, LP_TENSOR_ACT_GELU, 9, &p.l),
      LP_OK);
  assert_int_equal(lp_nn_param_numel(p.l),
                   8 + 4 * 64 + 8 + 16 * 8 + 16 + 8 * 16 + 8);
  p.x = randn(3, SH(2, 4, 8), 21);
  gradcheck("transformer block", &p, 1);
  probe_done(&p);
}

static void test_grad_chunk(void **state) {
  (void)state;
  lp_nn_layer *ls[5] = {NULL};
  assert_int_equal(lp_nn_linear_new("c.fc1", 5, 8, 1, 1, &ls[0]), LP_OK);
  assert_int_equal(lp_nn_act_new("c.act", LP_TENSOR_ACT_GELU, &ls[1]), LP_OK);
  assert_int_equal(lp_nn_rmsnorm_new("c.norm", 8, 1e-5f, &ls[2]), LP_OK);
  assert_int_equal(lp_nn_linear_new("c.fc2", 8, 4, 0, 1, &ls[3]), LP_OK);
  assert_int_equal(lp_nn_act_new("c.act2", LP_TENSOR_ACT_SILU, &ls[4]), LP_OK);
  probe p = {0};
  assert_int_equal(lp_nn_chunk_new("c", ls, 5, &p.l), LP_OK);
  for (int i = 0; i < 5; i++)
    lp_nn_layer_release(ls[i]); /* chunk holds refs */
  assert_int_equal(lp_nn_layer_children(p.l), 5);
  assert_string_equal(lp_nn_layer_name(lp_nn_layer_child(p.l, 3)), "c.fc2");
  p.x = randn(2, SH(3, 5), 22);
  gradcheck("chunk", &p, 1);
  probe_done(&p);

  /* one layer used twice (tied weights): listed once, grads from both uses */
  lp_nn_layer *fc = NULL, *act = NULL;
  assert_int_equal(lp_nn_linear_new("tied", 4, 4, 1, 2, &fc), LP_OK);
  assert_int_equal(lp_nn_act_new("act", LP_TENSOR_ACT_SILU, &act), LP_OK);
  lp_nn_layer *tied[3] = {fc, act, fc};
  probe q = {0};
  assert_int_equal(lp_nn_chunk_new("t", tied, 3, &q.l), LP_OK);
  lp_nn_layer_release(fc), lp_nn_layer_release(act);
  size_t n;
  lp_nn_params(q.l, &n);
  assert_int_equal(n, 2);
  q.x = randn(2, SH(3, 4), 23);
  gradcheck("chunk (tied layer)", &q, 1);
  probe_done(&q);
}

/* A small language model as one chunk: embedding, 2 transformer blocks,
 * final norm, head. Names follow the global layer index so any split of
 * blocks[lo, hi) builds the same parameters. */
static lp_nn_layer *build_lm(int64_t vocab, int64_t d, int64_t heads, int first,
                             int last, int with_embed, int with_head,
                             uint64_t seed) {
  lp_nn_layer *ls[16] = {NULL};
  size_t n = 0;
  char name[64];
  if (with_embed)
    assert_int_equal(lp_nn_embedding_new("embed", vocab, d, seed, &ls[n++]),
                     LP_OK);
  for (int b = first; b < last; b++) {
    snprintf(name, sizeof name, "blocks.%d", b);
    assert_int_equal(lp_nn_transformer_block_new(name, d, heads, 2 * d,
                                                 LP_TENSOR_ACT_GELU, seed,
                                                 &ls[n++]),
                     LP_OK);
  }
  if (with_head) {
    assert_int_equal(lp_nn_rmsnorm_new("final_norm", d, 1e-5f, &ls[n++]),
                     LP_OK);
    assert_int_equal(lp_nn_linear_new("head", d, vocab, 0, seed, &ls[n++]),
                     LP_OK);
  }
  lp_nn_layer *c = NULL;
  assert_int_equal(lp_nn_chunk_new("stage", ls, n, &c), LP_OK);
  for (size_t i = 0; i < n; i++)
    lp_nn_layer_release(ls[i]);
  return c;
}

static void test_grad_model_cross_entropy(void **state) {
  (void)state;
  probe p = {0};
  p.l = build_lm(11, 8, 2, 0, 2, 1, 1, 31);
  p.x = ids(2, SH(2, 4), 11, 32);
  p.targets = ids(2, SH(2, 4), 11, 33);
  p.loss = 1;
  gradcheck("lm + cross-entropy", &p, 0);
  probe_done(&p);
}

/* ---- losses ---- */

typedef struct {
  lp_tensor *pred, *target;
  int ce;
} lossprobe;

static double loss_eval(void *ud) {
  lossprobe *p = ud;
  double v;
  if (p->ce)
    assert_int_equal(
        lp_nn_loss_cross_entropy(p->pred, p->target, 1.0f, &v, NULL), LP_OK);
  else
    assert_int_equal(lp_nn_loss_mse(p->pred, p->target, 1.0f, &v, NULL), LP_OK);
  return v;
}

static void test_grad_losses(void **state) {
  (void)state;
  for (int ce = 0; ce < 2; ce++) {
    lossprobe p = {randn(3, SH(2, 3, 7), 40),
                   ce ? ids(2, SH(2, 3), 7, 41) : randn(3, SH(2, 3, 7), 42),
                   ce};
    lp_tensor *g = NULL, *g2 = NULL;
    double v, v2;
    if (ce) {
      assert_int_equal(lp_nn_loss_cross_entropy(p.pred, p.target, 1.0f, &v, &g),
                       LP_OK);
      assert_int_equal(
          lp_nn_loss_cross_entropy(p.pred, p.target, 0.25f, &v2, &g2), LP_OK);
      /* hand check of row 0 */
      double m = -1e30, s = 0;
      for (int j = 0; j < 7; j++)
        m = fmax(m, p.pred->data[j]);
      for (int j = 0; j < 7; j++)
        s += exp(p.pred->data[j] - m);
      double row0 = m + log(s) - p.pred->data[(int)p.target->data[0]];
      double tot = 0;
      for (int r = 0; r < 6; r++) {
        const float *lr = p.pred->data + r * 7;
        double mr = -1e30, sr = 0;
        for (int j = 0; j < 7; j++)
          mr = fmax(mr, lr[j]);
        for (int j = 0; j < 7; j++)
          sr += exp(lr[j] - mr);
        tot += mr + log(sr) - lr[(int)p.target->data[r]];
      }
      assert_true(fabs(v - tot / 6) < 1e-9);
      assert_true(row0 > 0);
    } else {
      assert_int_equal(lp_nn_loss_mse(p.pred, p.target, 1.0f, &v, &g), LP_OK);
      assert_int_equal(lp_nn_loss_mse(p.pred, p.target, 0.25f, &v2, &g2),
                       LP_OK);
      double tot = 0;
      for (int i = 0; i < 42; i++) {
        double d = (double)p.pred->data[i] - p.target->data[i];
        tot += d * d;
      }
      assert_true(fabs(v - tot / 42) < 1e-9);
    }
    assert_true(v == v2);
    for (int64_t i = 0; i < lp_tensor_numel(g); i++)
      assert_true(fabs(g2->data[i] - 0.25 * g->data[i]) <=
                  1e-7 * fabs(g->data[i]) + 1e-12);
    double *num = numgrad(loss_eval, &p, p.pred);
    compare(ce ? "cross-entropy d(logits)" : "mse d(pred)", g->data, num,
            lp_tensor_numel(g));
    free(num);
    lp_tensor_free(p.pred), lp_tensor_free(p.target), lp_tensor_free(g),
        lp_tensor_free(g2);
  }
}

/* ---- the I/W split under a pipeline-like order ---- */

typedef struct {
  lp_tensor *ids, *targets, *y, *dy, *dx;
  lp_nn_ctx *ctx;
} mb;

static void test_deferred_weight_grad(void **state) {
  (void)state;
  enum { M = 3 };
  lp_nn_layer *l = build_lm(13, 8, 2, 0, 2, 1, 1, 50);
  mb b[M];
  for (int i = 0; i < M; i++) {
    memset(&b[i], 0, sizeof b[i]);
    b[i].ids = ids(2, SH(2, 5), 13, 60 + i);
    b[i].targets = ids(2, SH(2, 5), 13, 70 + i);
    assert_int_equal(lp_nn_ctx_new(&b[i].ctx), LP_OK);
  }
  size_t np;
  const lp_nn_param *ps = lp_nn_params(l, &np);
  double loss;

  /* reference: F B per micro-batch (grads averaged with grad_scale 1/M) */
  assert_int_equal(lp_nn_zero_grad(l), LP_OK);
  for (int i = 0; i < M; i++) {
    assert_int_equal(lp_nn_forward(l, b[i].ctx, b[i].ids, &b[i].y), LP_OK);
    assert_int_equal(lp_nn_loss_cross_entropy(b[i].y, b[i].targets, 1.0f / M,
                                              &loss, &b[i].dy),
                     LP_OK);
    assert_int_equal(lp_nn_backward(l, b[i].ctx, b[i].dy, NULL), LP_OK);
    lp_tensor_free(b[i].y), lp_tensor_free(b[i].dy);
  }
  lp_tensor **ref = calloc(np, sizeof *ref);
  for (size_t i = 0; i < np; i++)
    ref[i] = like(ps[i].grad);

  /* zero-bubble order: F0 F1 I0 F2 I1 I2 W0 W1 W2, inputs/dys freed by the
   * caller as soon as each call returns (the ctxs keep what they need) */
  assert_int_equal(lp_nn_zero_grad(l), LP_OK);
  int order[][2] = {{'F', 0}, {'F', 1}, {'I', 0}, {'F', 2}, {'I', 1},
                    {'I', 2}, {'W', 0}, {'W', 1}, {'W', 2}};
  size_t peak = 0;
  for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
    mb *m = &b[order[k][1]];
    if (order[k][0] == 'F') {
      lp_tensor *x = like(m->ids);
      assert_int_equal(lp_nn_forward(l, m->ctx, x, &m->y), LP_OK);
      lp_tensor_free(x);
      assert_int_equal(
          lp_nn_loss_cross_entropy(m->y, m->targets, 1.0f / M, &loss, &m->dy),
          LP_OK);
      lp_tensor_free(m->y);
    } else if (order[k][0] == 'I') {
      size_t before = lp_nn_ctx_bytes(m->ctx);
      assert_int_equal(lp_nn_input_grad(l, m->ctx, m->dy, NULL), LP_OK);
      lp_tensor_free(m->dy);
      assert_true(lp_nn_ctx_bytes(m->ctx) > 0);
      (void)before;
    } else {
      assert_int_equal(lp_nn_weight_grad(l, m->ctx, NULL), LP_OK);
      assert_int_equal(lp_nn_ctx_bytes(m->ctx), 0);
    }
    size_t live = 0;
    for (int i = 0; i < M; i++)
      live += lp_nn_ctx_bytes(b[i].ctx);
    if (live > peak) peak = live;
  }
  printf("# deferred W: peak stash %zu bytes over %d micro-batches\n", peak, M);
  for (size_t i = 0; i < np; i++)
    assert_true(lp_tensor_equal(ref[i], ps[i].grad));

  for (size_t i = 0; i < np; i++)
    lp_tensor_free(ref[i]);
  free(ref);
  for (int i = 0; i < M; i++) {
    lp_tensor_free(b[i].ids), lp_tensor_free(b[i].targets);
    lp_nn_ctx_free(b[i].ctx);
  }
  lp_nn_layer_release(l);
}

/* ---- split model == unsplit model ---- */

static void test_split_init_and_compute(void **state) {
  (void)state;
  lp_nn_layer *full = build_lm(17, 8, 2, 0, 4, 1, 1, 77);
  lp_nn_layer *s0 = build_lm(17, 8, 2, 0, 2, 1, 0, 77);
  lp_nn_layer *s1 = build_lm(17, 8, 2, 2, 4, 0, 1, 77);
  size_t nf, n0, n1;
  const lp_nn_param *pf = lp_nn_params(full, &nf);
  const lp_nn_param *p0 = lp_nn_params(s0, &n0);
  const lp_nn_param *p1 = lp_nn_params(s1, &n1);
  assert_int_equal(nf, n0 + n1);
  for (size_t i = 0; i < nf; i++) {
    const lp_nn_param *q = i < n0 ? &p0[i] : &p1[i - n0];
    assert_string_equal(pf[i].name, q->name);
    assert_true(lp_tensor_equal(pf[i].value, q->value));
  }
  /* different layers do get different numbers */
  assert_string_equal(pf[2].name, "blocks.0.attn.wq");
  assert_string_equal(pf[2 + 10].name, "blocks.1.attn.wq");
  assert_false(lp_tensor_equal(pf[2].value, pf[2 + 10].value));
  /* another seed differs; re-init with the same seed restores the bits */
  lp_tensor *keep = like(pf[2].value);
  assert_int_equal(lp_nn_init(full, 78), LP_OK);
  assert_false(lp_tensor_equal(pf[2].value, keep));
  assert_int_equal(lp_nn_init(full, 77), LP_OK);
  assert_true(lp_tensor_equal(pf[2].value, keep));
  lp_tensor_free(keep);

  /* stage 0 then stage 1 computes exactly what the full model computes,
   * forward and backward */
  lp_tensor *x = ids(2, SH(2, 6), 17, 80), *t = ids(2, SH(2, 6), 17, 81);
  lp_tensor *yf = NULL, *h = NULL, *y1 = NULL, *df = NULL, *d1 = NULL,
            *dh = NULL;
  lp_nn_ctx *cf, *c0, *c1;
  double lf, l1;
  assert_int_equal(lp_nn_ctx_new(&cf), LP_OK);
  assert_int_equal(lp_nn_ctx_new(&c0), LP_OK);
  assert_int_equal(lp_nn_ctx_new(&c1), LP_OK);
  assert_int_equal(lp_nn_forward(full, cf, x, &yf), LP_OK);
  assert_int_equal(lp_nn_forward(s0, c0, x, &h), LP_OK);
  assert_int_equal(lp_nn_forward(s1, c1, h, &y1), LP_OK);
  assert_true(lp_tensor_equal(yf, y1));
  assert_int_equal(lp_nn_loss_cross_entropy(yf, t, 1.0f, &lf, &df), LP_OK);
  assert_int_equal(lp_nn_loss_cross_entropy(y1, t, 1.0f, &l1, &d1), LP_OK);
  assert_true(lf == l1);
  assert_int_equal(lp_nn_backward(full, cf, df, NULL), LP_OK);
  assert_int_equal(lp_nn_backward(s1, c1, d1, &dh), LP_OK);
  assert_int_equal(lp_nn_backward(s0, c0, dh, NULL), LP_OK);
  for (size_t i = 0; i < nf; i++) {
    const lp_nn_param *q = i < n0 ? &p0[i] : &p1[i - n0];
    assert_true(lp_tensor_equal(pf[i].grad, q->grad));
  }
  lp_tensor_free(x), lp_tensor_free(t), lp_tensor_free(yf), lp_tensor_free(h);
  lp_tensor_free(y1), lp_tensor_free(df), lp_tensor_free(d1),
      lp_tensor_free(dh);
  lp_nn_ctx_free(cf), lp_nn_ctx_free(c0), lp_nn_ctx_free(c1);
  lp_nn_layer_release(full), lp_nn_layer_release(s0), lp_nn_layer_release(s1);
}

/* ---- optimizers ---- */

static lp_nn_param make_param(const char *name, float p0, float p1, float g0,
                              float g1) {
  lp_nn_param p = {name, NULL, NULL, LP_NN_INIT_ZEROS, 0};
  float v[2] = {p0, p1}, g[2] = {g0, g1};
  assert_int_equal(lp_tensor_from_data(NULL, 1, SH(2), v, &p.value), LP_OK);
  assert_int_equal(lp_tensor_from_data(NULL, 1, SH(2), g, &p.grad), LP_OK);
  return p;
}

#define NEAR(a, b)                                                             \
  assert_true(fabs((double)(a) - (double)(b)) <= 1e-6 * (1 + fabs((double)(b))))

static void test_sgd(void **state) {
  (void)state;
  lp_nn_param p = make_param("w", 1.0f, -2.0f, 0.5f, 0.25f);
  lp_nn_sgd_opts o = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
  lp_nn_optim *opt = NULL;
  assert_int_equal(lp_nn_optim_sgd_new(&p, 1, &o, &opt), LP_OK);
  /* step 1: g = grad + 0.01 p = [0.51, 0.23]; buf = g; p -= 0.1 buf */
  assert_int_equal(lp_nn_optim_step(opt), LP_OK);
  NEAR(p.value->data[0], 0.949);
  NEAR(p.value->data[1], -2.023);
  /* step 2: g = [0.5 + 0.00949, 0.25 - 0.02023]; buf = 0.9 buf + g =
   * [0.96849, 0.43677]; p = [0.949 - 0.096849, -2.023 - 0.043677] */
  assert_int_equal(lp_nn_optim_step(opt), LP_OK);
  NEAR(p.value->data[0], 0.852151);
  NEAR(p.value->data[1], -2.066677);
  assert_int_equal(lp_nn_optim_steps(opt), 2);
  assert_int_equal(lp_nn_optim_zero_grad(opt), LP_OK);
  assert_true(p.grad->data[0] == 0.0f && p.grad->data[1] == 0.0f);
  lp_nn_optim_free(opt);
  /* plain SGD without momentum or decay: p -= lr * g */
  p.grad->data[0] = 1.0f;
  lp_nn_sgd_opts plain = {.lr = 0.5f};
  assert_int_equal(lp_nn_optim_sgd_new(&p, 1, &plain, &opt), LP_OK);
  assert_int_equal(lp_nn_optim_step(opt), LP_OK);
  NEAR(p.value->data[0], 0.352151);
  lp_nn_optim_free(opt);
  lp_tensor_free(p.value), lp_tensor_free(p.grad);
}

static void test_adamw(void **state) {
  (void)state;
  lp_nn_param p = make_param("w", 1.0f, -2.0f, 0.5f, 0.25f);
  lp_nn_adamw_opts o = {.lr = 0.1f,
                        .beta1 = 0.9f,
                        .beta2 = 0.999f,
                        .eps = 1e-8f,
                        .weight_decay = 0.01f};
  lp_nn_optim *opt = NULL;
  assert_int_equal(lp_nn_optim_adamw_new(&p, 1, &o, &opt), LP_OK);
  /* step 1: p *= 1 - 0.001; m = 0.1 g; v = 0.001 g^2; bias-corrected
   * m/(1-0.9) = g, v/(1-0.999) = g^2, so p -= 0.1 * g / (|g| + 1e-8) */
  assert_int_equal(lp_nn_optim_step(opt), LP_OK);
  NEAR(p.value->data[0], 0.999 - 0.1 * 0.5 / (0.5 + 1e-8));
  NEAR(p.value->data[1], -1.998 - 0.1 * 0.25 / (0.25 + 1e-8));
  /* step 2, same grad: p0 = 0.899 * 0.999 = 0.898101; m = 0.095,
   * v = 0.00049975; m / 0.19 = 0.5; v / 0.001999 = 0.25 -> sqrt 0.5;
   * p0 -= 0.1 * 0.5 / (0.5 + 1e-8) */
  assert_int_equal(lp_nn_optim_step(opt), LP_OK);
  NEAR(p.value->data[0], 0.898101 - 0.1 * 0.5 / (0.5 + 1e-8));
  NEAR(p.value->data[1], -2.098 * 0.999 - 0.1);
  lp_nn_optim_set_lr(opt, 0.0f);
  float keep = p.value->data[0];
  assert_int_equal(lp_nn_optim_step(opt), LP_OK); /* lr 0: nothing moves */
  assert_true(p.value->data[0] == keep);
  lp_nn_optim_free(opt);
  lp_nn_adamw_opts bad = o;
  bad.beta1 = 1.0f;
  assert_int_equal(lp_nn_optim_adamw_new(&p, 1, &bad, &opt), LP_ERR_ARG);
  assert_null(opt);
  lp_tensor_free(p.value), lp_tensor_free(p.grad);
}

/* A masked step leaves a param alone as torch.optim.AdamW does a param
 * whose grad is None: no decay, no moments, its own step count (the bias
 * corrections of its next update are those of its first), while the
 * others go on; unmasked steps are bitwise the plain ones. */
static void test_adamw_masked(void **state) {
  (void)state;
  lp_nn_param p[2] = {make_param("a", 1.0f, -2.0f, 0.5f, 0.25f),
                      make_param("b", 1.0f, -2.0f, 0.5f, 0.25f)};
  lp_nn_param q = make_param("c", 1.0f, -2.0f, 0.5f, 0.25f);
  lp_nn_adamw_opts o = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                        .weight_decay = 0.01f};
  lp_nn_optim *opt = NULL, *plain = NULL;
  assert_int_equal(lp_nn_optim_adamw_new(p, 2, &o, &opt), LP_OK);
  assert_int_equal(lp_nn_optim_adamw_new(&q, 1, &o, &plain), LP_OK);
  const unsigned char skip_b[2] = {0, 1};
  assert_int_equal(lp_nn_optim_step_masked(opt, skip_b), LP_OK); /* b: no grad */
  assert_int_equal(lp_nn_optim_step(plain), LP_OK);
  assert_true(p[0].value->data[0] == q.value->data[0]); /* a: a plain step */
  assert_true(p[1].value->data[0] == 1.0f && p[1].value->data[1] == -2.0f); /* b: untouched */
  int64_t ts[2];
  assert_int_equal(lp_nn_optim_param_steps(opt, ts, 2), LP_OK);
  assert_true(ts[0] == 1 && ts[1] == 0);
  assert_int_equal(lp_nn_optim_steps(opt), 1);
  /* step 2 for both: b's first update (bias corrections of t = 1, like
   * step 1 of test_adamw), a's second */
  assert_int_equal(lp_nn_optim_step_masked(opt, NULL), LP_OK);
  assert_int_equal(lp_nn_optim_step(plain), LP_OK);
  NEAR(p[1].value->data[0], 0.999 - 0.1 * 0.5 / (0.5 + 1e-8));
  NEAR(p[1].value->data[1], -1.998 - 0.1 * 0.25 / (0.25 + 1e-8));
  assert_true(p[0].value->data[0] == q.value->data[0]);
  NEAR(p[0].value->data[0], 0.898101 - 0.1 * 0.5 / (0.5 + 1e-8));
  assert_int_equal(lp_nn_optim_param_steps(opt, ts, 2), LP_OK);
  assert_true(ts[0] == 2 && ts[1] == 1);
  /* set: each within the optimizer's steps */
  int64_t bad[2] = {3, 0};
  assert_int_equal(lp_nn_optim_set_param_steps(opt, bad, 2), LP_ERR_ARG);
  assert_int_equal(lp_nn_optim_param_steps(opt, ts, 1), LP_ERR_ARG);
  lp_nn_optim_free(opt), lp_nn_optim_free(plain);
  for (int i = 0; i < 2; i++) lp_tensor_free(p[i].value), lp_tensor_free(p[i].grad);
  lp_tensor_free(q.value), lp_tensor_free(q.grad);
}

/* Training actually learns: a tiny LM memorises one batch. */
static void test_training_converges(void **state) {
  (void)state;
  lp_nn_layer *l = build_lm(9, 16, 2, 0, 1, 1, 1, 5);
  size_t np;
  const lp_nn_param *ps = lp_nn_params(l, &np);
  lp_nn_adamw_opts o = {.lr = 1e-2f,
                        .beta1 = 0.9f,
                        .beta2 = 0.999f,
                        .eps = 1e-8f,
                        .weight_decay = 0.0f};
  lp_nn_optim *opt = NULL;
  assert_int_equal(lp_nn_optim_adamw_new(ps, np, &o, &opt), LP_OK);
  lp_tensor *x = ids(2, SH(2, 6), 9, 90), *t = ids(2, SH(2, 6), 9, 91);
  lp_nn_ctx *c;
  assert_int_equal(lp_nn_ctx_new(&c), LP_OK);
  double first = 0, loss = 0;
  for (int step = 0; step < 60; step++) {
    lp_tensor *y = NULL, *dy = NULL;
    assert_int_equal(lp_nn_optim_zero_grad(opt), LP_OK);
    assert_int_equal(lp_nn_forward(l, c, x, &y), LP_OK);
    assert_int_equal(lp_nn_loss_cross_entropy(y, t, 1.0f, &loss, &dy), LP_OK);
    assert_int_equal(lp_nn_backward(l, c, dy, NULL), LP_OK);
    assert_int_equal(lp_nn_optim_step(opt), LP_OK);
    if (step == 0) first = loss;
    lp_tensor_free(y), lp_tensor_free(dy);
  }
  printf("# training: loss %.4f -> %.4f in 60 AdamW steps\n", first, loss);
  assert_true(loss < 0.2 * first);
  lp_nn_ctx_free(c);
  lp_nn_optim_free(opt);
  lp_tensor_free(x), lp_tensor_free(t);
  lp_nn_layer_release(l);
}

/* ---- errors ---- */

static void test_errors(void **state) {
  (void)state;
  lp_nn_layer *attn = NULL, *l = NULL, *ls[2] = {NULL}, *emb = NULL;
  lp_nn_ctx *c = NULL;
  lp_tensor *y = NULL, *dx = NULL;
  assert_int_equal(lp_nn_ctx_new(&c), LP_OK);
  assert_string_equal(lp_nn_ctx_last_error(c), "");

  assert_int_equal(lp_nn_attention_new("blocks.0.attn", 8, 3, 1, &attn),
                   LP_ERR_ARG);
  assert_null(attn);
  assert_int_equal(lp_nn_attention_new("blocks.0.attn", 8, 2, 1, &attn), LP_OK);
  lp_tensor *x2 = randn(2, SH(3, 8), 1);
  assert_int_equal(lp_nn_forward(attn, c, x2, &y), LP_ERR_ARG);
  assert_null(y);
  assert_string_equal(lp_nn_ctx_last_error(c),
                      "layer blocks.0.attn (attention): input must be [batch, "
                      "seq, 8], got [3, 8]");
  assert_int_equal(lp_nn_ctx_stage_of(c), LP_NN_CTX_EMPTY);

  /* the message names the inner layer of a chunk */
  assert_int_equal(lp_nn_linear_new("c.fc1", 5, 8, 1, 1, &ls[0]), LP_OK);
  assert_int_equal(lp_nn_linear_new("c.fc2", 7, 2, 1, 1, &ls[1]), LP_OK);
  assert_int_equal(lp_nn_chunk_new("c", ls, 2, &l), LP_OK);
  lp_tensor *x = randn(2, SH(3, 5), 2);
  assert_int_equal(lp_nn_forward(l, c, x, &y), LP_ERR_ARG);
  assert_string_equal(
      lp_nn_ctx_last_error(c),
      "layer c.fc2 (linear): input [3, 8] must have 7 features");
  lp_nn_layer_release(l);

  /* state machine misuse leaves the ctx as it was */
  assert_int_equal(lp_nn_forward(ls[0], c, x, &y), LP_OK);
  lp_tensor *y2 = NULL;
  assert_int_equal(lp_nn_forward(ls[0], c, x, &y2), LP_ERR_ARG);
  assert_null(y2);
  assert_int_equal(lp_nn_ctx_stage_of(c), LP_NN_CTX_FORWARD);
  assert_int_equal(lp_nn_weight_grad(ls[0], c, NULL), LP_ERR_ARG);
  assert_string_equal(lp_nn_ctx_last_error(c),
                      "layer c.fc1 (linear): weight_grad: dy is required when "
                      "input_grad did not run");
  assert_int_equal(lp_nn_input_grad(ls[1], c, y, &dx),
                   LP_ERR_ARG); /* other layer */
  lp_tensor *bad = randn(2, SH(3, 7), 3);
  assert_int_equal(lp_nn_input_grad(ls[0], c, bad, &dx), LP_ERR_ARG);
  assert_non_null(strstr(lp_nn_ctx_last_error(c), "dy has shape [3, 7]"));
  assert_int_equal(lp_nn_ctx_stage_of(c),
                   LP_NN_CTX_EMPTY); /* cleared by the failure */
  assert_int_equal(lp_nn_forward(ls[0], c, x, &y2), LP_OK);
  assert_int_equal(lp_nn_input_grad(ls[0], c, y, &dx), LP_OK);
  lp_tensor_free(dx);
  assert_int_equal(lp_nn_input_grad(ls[0], c, y, &dx), LP_ERR_ARG);
  assert_non_null(strstr(lp_nn_ctx_last_error(c), "input_grad already ran"));
  assert_int_equal(lp_nn_weight_grad(ls[0], c, NULL), LP_OK);
  assert_int_equal(lp_nn_weight_grad(ls[0], c, NULL), LP_ERR_ARG);
  lp_tensor_free(y), lp_tensor_free(y2);

  /* ids must be integral and in range */
  assert_int_equal(lp_nn_embedding_new("embed", 10, 4, 1, &emb), LP_OK);
  lp_tensor *tok = ids(1, SH(4), 10, 4);
  tok->data[2] = 10.0f;
  assert_int_equal(lp_nn_forward(emb, c, tok, &y), LP_ERR_ARG);
  assert_string_equal(lp_nn_ctx_last_error(c),
                      "layer embed (embedding): token id 10 at position 2 is "
                      "not an integer in [0, 10)");
  tok->data[2] = 1.5f;
  assert_int_equal(lp_nn_forward(emb, c, tok, &y), LP_ERR_ARG);
  lp_tensor *logits = randn(2, SH(4, 10), 5);
  double loss;
  assert_int_equal(lp_nn_loss_cross_entropy(logits, tok, 1.0f, &loss, &dx),
                   LP_ERR_ARG);
  assert_null(dx);
  lp_tensor *three = ids(1, SH(3), 10, 6);
  assert_int_equal(lp_nn_loss_cross_entropy(logits, three, 1.0f, &loss, NULL),
                   LP_ERR_ARG);
  assert_int_equal(lp_nn_loss_mse(logits, x, 1.0f, &loss, NULL), LP_ERR_ARG);

  lp_tensor_free(x2), lp_tensor_free(x), lp_tensor_free(bad),
      lp_tensor_free(tok);
  lp_tensor_free(logits), lp_tensor_free(three);
  lp_nn_layer_release(attn), lp_nn_layer_release(ls[0]),
      lp_nn_layer_release(ls[1]);
  lp_nn_layer_release(emb);
  lp_nn_ctx_free(c);
}

/* ---- mixture of experts ---- */

static lp_nn_moe_opts moe_opts(int64_t d, int64_t h, int e, int k) {
  lp_nn_moe_opts o = {0};
  o.dim = d, o.hidden = h, o.experts = e, o.topk = k;
  return o;
}

/* Gradient checks of the MoE layer: sigmoid router with group-limited
 * top-k, bias, route scale and a shared expert; softmax router with the
 * balance loss (part of L through probe.aux); top-1 without shared. */
static void test_grad_moe(void **state) {
  (void)state;
  g_eps = 2e-3f;
  for (int variant = 0; variant < 3; variant++) {
    lp_nn_moe_opts o = moe_opts(6, 5, 8, 2);
    if (variant == 0) {
      o.groups = 4, o.topk_groups = 2, o.shared = 1, o.route_scale = 2.5f;
    } else if (variant == 1) {
      o.router = LP_NN_ROUTER_SOFTMAX, o.balance_alpha = 0.3f;
    } else {
      o.topk = 1, o.experts = 4;
    }
    probe p = {0};
    assert_int_equal(lp_nn_moe_new("moe", &o, 11, &p.l), LP_OK);
    float bias[8] = {0.05f, -0.1f, 0.0f, 0.2f, -0.05f, 0.1f, 0.0f, -0.2f};
    assert_int_equal(lp_nn_moe_set_bias(p.l, bias), LP_OK);
    p.x = randn(3, SH(2, 3, 6), 21 + (uint64_t)variant);
    if (variant == 1) {
      p.aux = p.l;
      assert_int_equal(lp_nn_set_loss_scale(p.l, 0.5f), LP_OK); /* scaled with the loss */
    }
    const char *labels[3] = {"moe sigmoid+groups+shared",
                             "moe softmax+balance loss", "moe top-1"};
    gradcheck(labels[variant], &p, 1);
    if (variant == 1) assert_true(lp_nn_moe_aux_loss(p.l) > 0.0);
    size_t np;
    lp_nn_params(p.l, &np);
    assert_int_equal(np, (size_t)(1 + (o.shared ? 3 : 0) + 3 * o.experts));
    probe_done(&p);
  }
  g_eps = EPS;
}

/* The balance loss is the mean over the batch's sequences times the loss
 * scale: a 2-sequence batch gives the mean of the two sequences' losses,
 * and lp_nn_set_loss_scale scales it; bad scales are refused. */
static double moe_aux_of(lp_nn_layer *l, const lp_tensor *x) {
  lp_nn_ctx *c;
  lp_tensor *y = NULL;
  assert_int_equal(lp_nn_ctx_new(&c), LP_OK);
  assert_int_equal(lp_nn_forward(l, c, x, &y), LP_OK);
  double a = lp_nn_moe_aux_loss(l);
  lp_tensor_free(y);
  lp_nn_ctx_free(c);
  return a;
}

/* lp_nn_unrouted_mask: exactly the w1 / w3 / w2 of the slots whose
 * logical expert has load 0 (every slot of it: a redundant copy too);
 * router and shared expert never; wrong sizes refused. */
static void test_moe_unrouted_mask(void **state) {
  (void)state;
  lp_nn_moe_opts o = moe_opts(6, 5, 4, 2);
  o.shared = 1;
  lp_nn_layer *l;
  assert_int_equal(lp_nn_moe_new("moe", &o, 11, &l), LP_OK);
  const int p2l[6] = {0, 1, 2, 3, 1, 3}; /* experts 1 and 3 twice */
  assert_int_equal(lp_nn_moe_set_placement(l, 6, p2l), LP_OK);
  size_t np;
  const lp_nn_param *ps = lp_nn_params(l, &np);
  lp_nn_param_role roles[64];
  assert_true(np <= 64);
  assert_int_equal(lp_nn_param_roles(l, roles, np), LP_OK);
  const int64_t loads[4] = {3, 0, 1, 0};
  unsigned char skip[64];
  assert_int_equal(lp_nn_unrouted_mask(l, loads, skip, np), LP_OK);
  int skipped = 0;
  for (size_t i = 0; i < np; i++) {
    int want = roles[i].slot >= 0 && (roles[i].expert == 1 || roles[i].expert == 3);
    if (skip[i] != want) fail_msg("%s: skip %d, want %d", ps[i].name, skip[i], want);
    skipped += skip[i];
  }
  assert_int_equal(skipped, 4 * 3); /* slots 1, 3, 4, 5 */
  assert_int_equal(lp_nn_unrouted_mask(l, loads, skip, np - 1), LP_ERR_ARG);
  assert_int_equal(lp_nn_unrouted_mask(l, NULL, skip, np), LP_ERR_ARG);
  lp_nn_layer_release(l);
}

static void test_moe_balance_scale(void **state) {
  (void)state;
  lp_nn_moe_opts o = moe_opts(6, 5, 8, 2);
  o.router = LP_NN_ROUTER_SOFTMAX, o.balance_alpha = 0.3f;
  lp_nn_layer *l;
  assert_int_equal(lp_nn_moe_new("moe", &o, 11, &l), LP_OK);
  lp_tensor *x = randn(3, SH(2, 3, 6), 31), *xa, *xb;
  assert_int_equal(lp_tensor_rows(x, 0, 1, &xa), LP_OK);
  assert_int_equal(lp_tensor_rows(x, 1, 1, &xb), LP_OK);
  double both = moe_aux_of(l, x), a = moe_aux_of(l, xa), b = moe_aux_of(l, xb);
  assert_true(a > 0 && b > 0);
  assert_true(fabs(both - (a + b) / 2) <= 1e-6 * both);
  assert_int_equal(lp_nn_set_loss_scale(l, 0.25f), LP_OK);
  assert_true(fabs(moe_aux_of(l, x) - 0.25 * both) <= 1e-6 * both);
  assert_int_equal(lp_nn_set_loss_scale(l, 0.0f), LP_ERR_ARG);
  assert_int_equal(lp_nn_set_loss_scale(l, NAN), LP_ERR_ARG);
  assert_int_equal(lp_nn_set_loss_scale(NULL, 1.0f), LP_ERR_ARG);
  lp_tensor_free(xa), lp_tensor_free(xb), lp_tensor_free(x);
  lp_nn_layer_release(l);
}

/* Gradient checks of DeepSeek's Gate modes (model.py): without a
 * correction bias (groups scored by their best affinity), softmax weights
 * not normalised (with and without a bias), sigmoid weights not
 * normalised; with groups, route scales, the balance loss. */
static void test_grad_moe_gate(void **state) {
  (void)state;
  g_eps = 2e-3f;
  for (int variant = 0; variant < 4; variant++) {
    lp_nn_moe_opts o = moe_opts(6, 5, 8, 2);
    o.groups = 4, o.topk_groups = 2;
    if (variant == 0) { /* sigmoid Gate without a bias */
      o.no_bias = 1, o.shared = 1, o.route_scale = 2.5f;
    } else if (variant == 1) { /* softmax Gate without a bias (V2) */
      o.router = LP_NN_ROUTER_SOFTMAX, o.no_bias = 1, o.no_norm_topk = 1;
      o.route_scale = 16.0f, o.balance_alpha = 0.3f;
    } else if (variant == 2) { /* softmax Gate with a bias */
      o.router = LP_NN_ROUTER_SOFTMAX, o.no_norm_topk = 1, o.topk_groups = 3;
    } else { /* sigmoid, raw weights */
      o.no_norm_topk = 1, o.groups = 0, o.topk_groups = 0, o.route_scale = 1.5f;
    }
    probe p = {0};
    assert_int_equal(lp_nn_moe_new("moe", &o, 13, &p.l), LP_OK);
    if (!o.no_bias) {
      float bias[8] = {0.05f, -0.1f, 0.0f, 0.2f, -0.05f, 0.1f, 0.0f, -0.2f};
      assert_int_equal(lp_nn_moe_set_bias(p.l, bias), LP_OK);
    }
    p.x = randn(3, SH(2, 3, 6), 41 + (uint64_t)variant);
    if (o.balance_alpha > 0.0f) p.aux = p.l;
    const char *labels[4] = {"gate sigmoid, no bias, groups", "gate softmax, no bias, raw w",
                             "gate softmax, bias, raw w", "gate sigmoid, raw w"};
    gradcheck(labels[variant], &p, 1);
    probe_done(&p);
  }
  g_eps = EPS;
}

/* An MoE layer whose router gives logits = x (dim = experts, router
 * weight the identity). */
static lp_nn_layer *gate_layer(const lp_nn_moe_opts *o) {
  lp_nn_layer *l = NULL;
  assert_int_equal(lp_nn_moe_new("gate", o, 1, &l), LP_OK);
  const lp_nn_param *ps = lp_nn_params(l, NULL);
  lp_tensor *w = ps[0].value;
  assert_int_equal(lp_tensor_fill(w, 0.0f), LP_OK);
  for (int e = 0; e < o->experts; e++)
    w->data[e * o->experts + e] = 1.0f;
  return l;
}

/* The Gate's selection computed by hand. Six experts in three groups of
 * two, one eligible group, top-2, sigmoid affinities
 *   group 0: 0.9 0.1   best 0.9, two best 1.0
 *   group 1: 0.8 0.7   best 0.8, two best 1.5
 *   group 2: 0.2 0.3   best 0.3, two best 0.5
 * Without a bias a group scores its best: group 0, experts 0, 1, weights
 * 0.9, 0.1 (/ 1.0). With a (zero) bias it scores its two best: group 1,
 * experts 2, 3, weights 0.8/1.5, 0.7/1.5. A bias of 0.7 on group 2 makes
 * it 0.9 + 1.0: experts 5 then 4 (best biased first), weights from the
 * unbiased affinities 0.3/0.5, 0.2/0.5. The forward routes the same way
 * (its loads). Softmax weights without normalisation are the chosen
 * affinities times route_scale. */
static void test_moe_gate_selection(void **state) {
  (void)state;
  const double p[6] = {0.9, 0.1, 0.8, 0.7, 0.2, 0.3};
  lp_tensor *x = NULL;
  assert_int_equal(lp_tensor_empty(NULL, 2, SH(1, 6), &x), LP_OK);
  for (int e = 0; e < 6; e++)
    x->data[e] = (float)log(p[e] / (1.0 - p[e])); /* sigmoid(x) = p */
  lp_nn_moe_opts o = moe_opts(6, 3, 6, 2);
  o.groups = 3, o.topk_groups = 1, o.route_scale = 2.0f;
  struct {
    int no_bias;
    float bias4;
    int want[2];
    double w[2];
  } cases[3] = {
      {1, 0.0f, {0, 1}, {0.9 / 1.0, 0.1 / 1.0}},
      {0, 0.0f, {2, 3}, {0.8 / 1.5, 0.7 / 1.5}},
      {0, 0.7f, {5, 4}, {0.3 / 0.5, 0.2 / 0.5}},
  };
  for (int c = 0; c < 3; c++) {
    o.no_bias = cases[c].no_bias;
    lp_nn_layer *l = gate_layer(&o);
    const float bias[6] = {0, 0, 0, 0, cases[c].bias4, cases[c].bias4};
    assert_int_equal(lp_nn_moe_set_bias(l, bias), LP_OK);
    int ex[2];
    float w[2], sc[6];
    assert_int_equal(lp_nn_moe_route(l, x, ex, w, sc), LP_OK);
    for (int e = 0; e < 6; e++)
      assert_float_equal(sc[e], p[e], 1e-6);
    for (int k = 0; k < 2; k++) {
      assert_int_equal(ex[k], cases[c].want[k]);
      assert_float_equal(w[k], 2.0 * cases[c].w[k], 1e-5);
    }
    lp_tensor *y = NULL;
    int64_t load[6];
    assert_int_equal(lp_nn_forward(l, NULL, x, &y), LP_OK);
    assert_int_equal(lp_nn_moe_expert_load(l, load), LP_OK);
    for (int e = 0; e < 6; e++)
      assert_int_equal(load[e], e == cases[c].want[0] || e == cases[c].want[1]);
    lp_tensor_free(y);
    lp_nn_layer_release(l);
  }
  /* softmax, raw weights: route_scale * the chosen affinities */
  o.no_bias = 1, o.router = LP_NN_ROUTER_SOFTMAX, o.no_norm_topk = 1;
  o.groups = 0, o.topk_groups = 0;
  lp_nn_layer *l = gate_layer(&o);
  int ex[2];
  float w[2], sc[6];
  assert_int_equal(lp_nn_moe_route(l, x, ex, w, sc), LP_OK);
  double z = 0.0, sm[6];
  for (int e = 0; e < 6; e++)
    z += exp((double)x->data[e]);
  for (int e = 0; e < 6; e++)
    sm[e] = exp((double)x->data[e]) / z;
  assert_int_equal(ex[0], 0); /* logits 2.20, 0.85, 1.39 (e2) ... */
  assert_int_equal(ex[1], 2);
  assert_float_equal(w[0], 2.0 * sm[0], 1e-6);
  assert_float_equal(w[1], 2.0 * sm[2], 1e-6);
  lp_nn_layer_release(l);
  lp_tensor_free(x);
}

/* A layer without a correction bias: bias_speed refused, its bias reads
 * zeros, takes only zeros, and the balancing step leaves it at zero. */
static void test_moe_no_bias(void **state) {
  (void)state;
  lp_nn_moe_opts o = moe_opts(6, 3, 4, 2);
  o.no_bias = 1, o.bias_speed = 0.01f;
  lp_nn_layer *l = NULL;
  assert_int_equal(lp_nn_moe_new("m", &o, 1, &l), LP_ERR_ARG);
  assert_null(l);
  o.bias_speed = 0.0f;
  assert_int_equal(lp_nn_moe_new("m", &o, 1, &l), LP_OK);
  const float zero[4] = {0}, some[4] = {0, 0.5f, 0, 0};
  float b[4] = {1, 1, 1, 1};
  assert_int_equal(lp_nn_moe_set_bias(l, some), LP_ERR_ARG);
  assert_int_equal(lp_nn_moe_set_bias(l, zero), LP_OK);
  const int64_t counts[4] = {10, 2, 5, 5};
  assert_int_equal(lp_nn_moe_update_bias(l, counts), LP_OK);
  assert_int_equal(lp_nn_moe_get_bias(l, b), LP_OK);
  assert_memory_equal(b, zero, sizeof b);
  lp_nn_layer_release(l);
}

/* The MoE transformer block (attention + MoE, pre-norm residuals). */
static void test_grad_moe_block(void **state) {
  (void)state;
  g_eps = 2e-3f;
  lp_nn_moe_opts o = moe_opts(8, 6, 4, 2);
  o.shared = 1;
  probe p = {0};
  assert_int_equal(lp_nn_moe_block_new("blocks.0", 2, &o, 3, &p.l), LP_OK);
  p.x = randn(3, SH(2, 3, 8), 31);
  gradcheck("moe block", &p, 1);
  size_t np;
  const lp_nn_param *ps = lp_nn_params(p.l, &np);
  assert_string_equal(ps[0].name, "blocks.0.attn_norm.weight");
  assert_string_equal(ps[5].name, "blocks.0.moe_norm.weight");
  assert_string_equal(ps[6].name, "blocks.0.moe.router.weight");
  assert_string_equal(ps[10].name, "blocks.0.moe.experts.0.w1");
  assert_int_equal(lp_nn_moe_count(p.l), 1);
  assert_string_equal(lp_nn_layer_name(lp_nn_moe_find(p.l, 0)),
                      "blocks.0.moe");
  assert_null(lp_nn_moe_find(p.l, 1));
  probe_done(&p);
  g_eps = EPS;
}

/* ---- expert parallelism without MPI: k "ranks" in one process ----
 * A collective completes when the last rank starts it: every rank's send
 * blocks are copied into every rank's receive buffers. Waiting on one that
 * not all ranks have started is a deadlock in real life: an error here. */

#define FAKE_MAX 8
#define FAKE_COLLS 64

typedef struct fake_coll {
  const float *send[FAKE_MAX];
  const size_t *sc[FAKE_MAX], *rc[FAKE_MAX];
  float *recv[FAKE_MAX];
  int joined;
} fake_coll;

typedef struct fake_world {
  int k;
  int started[FAKE_MAX];
  fake_coll coll[FAKE_COLLS];
  long floats_moved;
  lp_nn_xkind kind[FAKE_MAX][FAKE_COLLS]; /* each rank's exchanges, in order */
  void *tag[FAKE_MAX][FAKE_COLLS];
} fake_world;

typedef struct fake_rank {
  fake_world *w;
  int rank;
} fake_rank;

static size_t displ(const size_t *counts, int upto) {
  size_t d = 0;
  for (int i = 0; i < upto; i++)
    d += counts[i];
  return d;
}

static lp_status fake_start(void *ud, const lp_nn_xinfo *xi, const float *send,
                            const size_t *sc, float *recv, const size_t *rc,
                            void **handle) {
  fake_rank *fr = ud;
  fake_world *w = fr->w;
  int n = w->started[fr->rank]++;
  assert_true(n < FAKE_COLLS);
  assert_non_null(xi->layer);
  w->kind[fr->rank][n] = xi->kind;
  w->tag[fr->rank][n] = xi->tag;
  fake_coll *c = &w->coll[n];
  c->send[fr->rank] = send, c->sc[fr->rank] = sc;
  c->recv[fr->rank] = recv, c->rc[fr->rank] = rc;
  if (++c->joined == w->k) {
    for (int s = 0; s < w->k; s++)
      for (int r = 0; r < w->k; r++) {
        assert_int_equal(c->sc[s][r], c->rc[r][s]);
        if (c->sc[s][r])
          memcpy(c->recv[r] + displ(c->rc[r], s),
                 c->send[s] + displ(c->sc[s], r), c->sc[s][r] * sizeof(float));
        w->floats_moved += (long)c->sc[s][r];
      }
  }
  *handle = (void *)(intptr_t)(n + 1);
  return LP_OK;
}

static lp_status fake_wait(void *ud, void *handle) {
  fake_rank *fr = ud;
  fake_coll *c = &fr->w->coll[(intptr_t)handle - 1];
  return c->joined == fr->w->k ? LP_OK : LP_ERR_ARG;
}

/* Runs the begun passes of k ranks round-robin to the end; rank 0's phase
 * names along the way into names (when given). */
static void drive(lp_nn_layer **ls, lp_nn_ctx **cs, int k, lp_tensor **outs,
                  char *names, size_t n) {
  int done[FAKE_MAX] = {0}, left = k;
  if (names) snprintf(names, n, "%s", lp_nn_phase_name(cs[0]));
  while (left) {
    for (int r = 0; r < k; r++) {
      if (done[r]) continue;
      int d = 0;
      assert_int_equal(lp_nn_advance(ls[r], cs[r], &d, &outs[r]), LP_OK);
      if (r == 0 && names) {
        size_t len = strlen(names);
        snprintf(names + len, n - len, " %s%s", lp_nn_phase_name(cs[0]),
                 lp_nn_ctx_exchange_pending(cs[0]) ? "*" : "");
      }
      if (d) done[r] = 1, left--;
    }
  }
}

/* max |a - b| / max |b| over the rows [r0, r0 + a's rows) of b. */
static double rel_rows(const lp_tensor *a, const lp_tensor *b, int64_t r0) {
  int64_t rows, cols;
  lp_tensor_rows_cols(a, &rows, &cols);
  double mx = 0, d = 0;
  for (int64_t i = 0; i < lp_tensor_numel(b); i++)
    mx = fmax(mx, fabs(b->data[i]));
  for (int64_t i = 0; i < rows * cols; i++)
    d = fmax(d, fabs(a->data[i] - b->data[r0 * cols + i]));
  return d / fmax(mx, 1e-30);
}

/* Compares the EP = k run of `build` (placement phys_to_log with spr
 * slots per rank, or the default when NULL) against EP = 1: outputs, input
 * grads, summed param grads by name, expert loads. Returns the fake
 * world's moved floats. block: the layer is an MoE block (else an MoE). */
static long ep_check(int k, int block, int spr, const int *p2l,
                     const char *fwd_names, const char *bwd_names) {
  lp_nn_moe_opts o = moe_opts(8, 6, 6, 2);
  o.shared = 1, o.groups = 3, o.topk_groups = 2, o.route_scale = 1.5f;
  int64_t B = 6, T = 4, D = 8, Bk = B / k;
  lp_nn_layer *ref = NULL, *ls[FAKE_MAX] = {NULL};
  if (block)
    assert_int_equal(lp_nn_moe_block_new("b", 2, &o, 5, &ref), LP_OK);
  else
    assert_int_equal(lp_nn_moe_new("b.moe", &o, 5, &ref), LP_OK);
  lp_tensor *x = randn(3, SH(B, T, D), 41), *dy = randn(3, SH(B, T, D), 42);
  lp_nn_ctx *c0 = NULL, *cs[FAKE_MAX] = {NULL};
  lp_tensor *y0 = NULL, *dx0 = NULL, *ys[FAKE_MAX] = {NULL},
            *dxs[FAKE_MAX] = {NULL}, *xs[FAKE_MAX], *dys[FAKE_MAX];
  assert_int_equal(lp_nn_ctx_new(&c0), LP_OK);
  assert_int_equal(lp_nn_forward(ref, c0, x, &y0), LP_OK);
  assert_int_equal(lp_nn_backward(ref, c0, dy, &dx0), LP_OK);

  fake_world w = {0};
  fake_rank fr[FAKE_MAX];
  w.k = k;
  for (int r = 0; r < k; r++) {
    fr[r] = (fake_rank){&w, r};
    lp_nn_ep ep = {k, r, &fr[r], fake_start, fake_wait};
    if (block)
      assert_int_equal(lp_nn_moe_block_new("b", 2, &o, 5, &ls[r]), LP_OK);
    else
      assert_int_equal(lp_nn_moe_new("b.moe", &o, 5, &ls[r]), LP_OK);
    assert_int_equal(lp_nn_set_ep(ls[r], &ep), LP_OK);
    if (p2l)
      assert_int_equal(
          lp_nn_moe_set_placement(lp_nn_moe_find(ls[r], 0), spr, p2l), LP_OK);
    assert_int_equal(lp_nn_ctx_new(&cs[r]), LP_OK);
    lp_nn_ctx_set_tag(cs[r], &fr[r]); /* every exchange carries it */
    assert_int_equal(lp_tensor_rows(x, r * Bk, Bk, &xs[r]), LP_OK);
    assert_int_equal(lp_tensor_rows(dy, r * Bk, Bk, &dys[r]), LP_OK);
    assert_int_equal(lp_nn_forward_begin(ls[r], cs[r], xs[r]), LP_OK);
  }
  char names[256];
  drive(ls, cs, k, ys, names, sizeof names);
  printf("# ep=%d forward phases: %s\n", k, names);
  if (fwd_names) assert_string_equal(names, fwd_names);
  for (int r = 0; r < k; r++) {
    double e = rel_rows(ys[r], y0, r * Bk * T);
    printf("# ep=%d rank %d: y rel err %.2e\n", k, r, e);
    assert_true(e <= 1e-5);
    assert_int_equal(lp_nn_input_grad_begin(ls[r], cs[r], dys[r]), LP_OK);
  }
  drive(ls, cs, k, dxs, names, sizeof names);
  printf("# ep=%d input-grad phases: %s\n", k, names);
  if (bwd_names) assert_string_equal(names, bwd_names);
  /* one MoE layer: its five exchanges in pass order, each with the tag */
  for (int r = 0; r < k && k > 1; r++) {
    assert_int_equal(w.started[r], LP_NN_X__N);
    for (int i = 0; i < LP_NN_X__N; i++) {
      assert_int_equal(w.kind[r][i], (lp_nn_xkind)i);
      assert_ptr_equal(w.tag[r][i], &fr[r]);
    }
  }
  assert_string_equal(lp_nn_xkind_text(LP_NN_X_COMBINE_BACKWARD), "combine backward");
  for (int r = 0; r < k; r++) {
    double e = rel_rows(dxs[r], dx0, r * Bk * T);
    assert_true(e <= 1e-5);
    assert_int_equal(lp_nn_weight_grad(ls[r], cs[r], NULL), LP_OK);
  }
  /* every reference grad = the sum of the same-named grads on all ranks */
  size_t n0;
  const lp_nn_param *p0 = lp_nn_params(ref, &n0);
  double worst = 0;
  for (size_t i = 0; i < n0; i++) {
    lp_tensor *sum = NULL;
    assert_int_equal(lp_tensor_zeros_like(p0[i].grad, &sum), LP_OK);
    int holders = 0;
    for (int r = 0; r < k; r++) {
      size_t n;
      const lp_nn_param *ps = lp_nn_params(ls[r], &n);
      for (size_t j = 0; j < n; j++)
        if (strcmp(ps[j].name, p0[i].name) == 0) {
          assert_int_equal(lp_tensor_axpy(sum, 1.0f, ps[j].grad), LP_OK);
          holders++;
        }
    }
    assert_true(holders >= 1);
    double e = rel_rows(sum, p0[i].grad, 0);
    if (e > 1e-5) printf("  grad %s: rel err %.2e\n", p0[i].name, e);
    assert_true(e <= 1e-5);
    worst = fmax(worst, e);
    lp_tensor_free(sum);
  }
  printf("# ep=%d: %zu param grads, worst rel err %.2e\n", k, n0, worst);
  /* roles name the routed experts' params and nothing else */
  for (int r = 0; r < k; r++) {
    size_t n;
    const lp_nn_param *ps = lp_nn_params(ls[r], &n);
    lp_nn_param_role *roles = calloc(n, sizeof *roles);
    assert_int_equal(lp_nn_param_roles(ls[r], roles, n), LP_OK);
    int experts = 0, holders = lp_nn_moe_slots_per_rank(lp_nn_moe_find(ls[r], 0));
    for (size_t j = 0; j < n; j++) {
      char want[64];
      snprintf(want, sizeof want, ".experts.%d.", roles[j].expert);
      assert_int_equal(roles[j].expert >= 0, strstr(ps[j].name, ".experts.") != NULL);
      if (roles[j].expert >= 0) assert_non_null(strstr(ps[j].name, want)), experts++;
      assert_int_equal(roles[j].moe >= 0, strstr(ps[j].name, ".moe.") != NULL);
    }
    assert_int_equal(experts, 3 * holders);
    free(roles);
  }
  /* loads: the ranks' counts add up to the reference's */
  int64_t l0[8], lr[8], tot[8] = {0};
  assert_int_equal(lp_nn_moe_expert_load(lp_nn_moe_find(ref, 0), l0), LP_OK);
  for (int r = 0; r < k; r++) {
    assert_int_equal(lp_nn_moe_expert_load(lp_nn_moe_find(ls[r], 0), lr),
                     LP_OK);
    for (int e = 0; e < o.experts; e++)
      tot[e] += lr[e];
  }
  for (int e = 0; e < o.experts; e++)
    assert_int_equal(tot[e], l0[e]);
  for (int r = 0; r < k; r++) {
    lp_nn_ctx_free(cs[r]);
    lp_nn_layer_release(ls[r]);
    lp_tensor_free(ys[r]), lp_tensor_free(dxs[r]);
    lp_tensor_free(xs[r]), lp_tensor_free(dys[r]);
  }
  lp_nn_ctx_free(c0);
  lp_nn_layer_release(ref);
  lp_tensor_free(x), lp_tensor_free(dy), lp_tensor_free(y0),
      lp_tensor_free(dx0);
  return w.floats_moved;
}

static void test_moe_ep_equivalence(void **state) {
  (void)state;
  /* k = 2, default placement (3 experts per rank) */
  long moved = ep_check(2, 0, 0, NULL,
                        "attn/dense dispatch* experts* combine* done",
                        "attn/dense experts* dispatch* done");
  assert_true(moved > 0);
  /* k = 2 with redundant replicas of experts 0 and 4 */
  const int r2[] = {0, 1, 2, 4, 3, 4, 5, 0};
  ep_check(2, 0, 4, r2, NULL, NULL);
  /* k = 3: default, then replicas (expert 1 on every rank) */
  ep_check(3, 0, 0, NULL, NULL, NULL);
  const int r3[] = {5, 1, 0, 1, 2, 3, 4, 1, 3};
  ep_check(3, 0, 3, r3, NULL, NULL);
  /* the MoE block (attention before the exchanges) on 2 and 3 ranks */
  ep_check(2, 1, 4, r2,
           "attn/dense dispatch* experts* combine* done",
           "attn/dense experts* dispatch* done");
  ep_check(3, 1, 3, r3, NULL, NULL);
}

/* A rank whose experts get no tokens (the bias sends every token to
 * experts 0 and 1, both on rank 0) receives and returns empty blocks; the
 * results still match EP = 1. */
static void test_moe_ep_idle_rank(void **state) {
  (void)state;
  enum { K = 2 };
  lp_nn_moe_opts o = moe_opts(8, 6, 4, 2);
  const float bias[4] = {5, 5, 0, 0};
  lp_tensor *x = randn(2, SH(6, 8), 81), *dy = randn(2, SH(6, 8), 82);
  lp_nn_layer *ref = NULL, *ls[K];
  lp_nn_ctx *c0 = NULL, *cs[K];
  lp_tensor *y0 = NULL, *dx0 = NULL, *ys[K] = {NULL}, *dxs[K] = {NULL},
            *xs[K], *dys[K];
  assert_int_equal(lp_nn_moe_new("m", &o, 2, &ref), LP_OK);
  assert_int_equal(lp_nn_moe_set_bias(ref, bias), LP_OK);
  assert_int_equal(lp_nn_ctx_new(&c0), LP_OK);
  assert_int_equal(lp_nn_forward(ref, c0, x, &y0), LP_OK);
  assert_int_equal(lp_nn_backward(ref, c0, dy, &dx0), LP_OK);
  fake_world w = {0};
  fake_rank fr[K];
  w.k = K;
  for (int r = 0; r < K; r++) {
    fr[r] = (fake_rank){&w, r};
    lp_nn_ep ep = {K, r, &fr[r], fake_start, fake_wait};
    assert_int_equal(lp_nn_moe_new("m", &o, 2, &ls[r]), LP_OK);
    assert_int_equal(lp_nn_moe_set_bias(ls[r], bias), LP_OK);
    assert_int_equal(lp_nn_set_ep(ls[r], &ep), LP_OK);
    assert_int_equal(lp_nn_ctx_new(&cs[r]), LP_OK);
    assert_int_equal(lp_tensor_rows(x, r * 3, 3, &xs[r]), LP_OK);
    assert_int_equal(lp_tensor_rows(dy, r * 3, 3, &dys[r]), LP_OK);
    assert_int_equal(lp_nn_forward_begin(ls[r], cs[r], xs[r]), LP_OK);
  }
  drive(ls, cs, K, ys, NULL, 0);
  for (int r = 0; r < K; r++)
    assert_int_equal(lp_nn_input_grad_begin(ls[r], cs[r], dys[r]), LP_OK);
  drive(ls, cs, K, dxs, NULL, 0);
  for (int r = 0; r < K; r++) {
    assert_true(rel_rows(ys[r], y0, r * 3) <= 1e-5);
    assert_true(rel_rows(dxs[r], dx0, r * 3) <= 1e-5);
    assert_int_equal(lp_nn_weight_grad(ls[r], cs[r], NULL), LP_OK);
  }
  /* rank 1's experts (2, 3) saw nothing: zero grads; rank 0's match */
  const lp_nn_param *p0 = lp_nn_params(ref, NULL);
  const lp_nn_param *p1 = lp_nn_params(ls[1], NULL);
  double g;
  for (int i = 1; i < 7; i++) {
    assert_int_equal(lp_tensor_dot(p1[i].grad, p1[i].grad, &g), LP_OK);
    assert_true(g == 0.0);
    assert_true(rel_rows(lp_nn_params(ls[0], NULL)[i].grad, p0[i].grad, 0) <=
                1e-5);
  }
  for (int r = 0; r < K; r++) {
    lp_nn_ctx_free(cs[r]);
    lp_nn_layer_release(ls[r]);
    lp_tensor_free(ys[r]), lp_tensor_free(dxs[r]);
    lp_tensor_free(xs[r]), lp_tensor_free(dys[r]);
  }
  lp_nn_ctx_free(c0);
  lp_nn_layer_release(ref);
  lp_tensor_free(x), lp_tensor_free(dy), lp_tensor_free(y0),
      lp_tensor_free(dx0);
}

/* An overlapped F&B pair on 2 EP ranks: the forward of micro-batch 1 and
 * the input-grad of micro-batch 0 advanced alternately (each one's
 * exchange in flight while the other computes) give the same bits as
 * running them one after the other. */
static void test_moe_overlapped_pair(void **state) {
  (void)state;
  enum { K = 2 };
  lp_nn_moe_opts o = moe_opts(8, 6, 4, 2);
  o.shared = 1;
  lp_tensor *x0 = randn(3, SH(2, 3, 8), 71), *x1 = randn(3, SH(2, 3, 8), 72),
            *dy = randn(3, SH(2, 3, 8), 73);
  lp_tensor *y[2][K] = {{NULL}}, *dx[2][K] = {{NULL}}, *y0[K] = {NULL};
  lp_tensor *g[2][64] = {{NULL}};
  size_t ng = 0;
  for (int mode = 0; mode < 2; mode++) { /* 0: sequential, 1: interleaved */
    fake_world w = {0};
    fake_rank fr[K];
    lp_nn_layer *ls[K];
    lp_nn_ctx *c0[K], *c1[K];
    w.k = K;
    for (int r = 0; r < K; r++) {
      fr[r] = (fake_rank){&w, r};
      lp_nn_ep ep = {K, r, &fr[r], fake_start, fake_wait};
      assert_int_equal(lp_nn_moe_block_new("b", 2, &o, 5, &ls[r]), LP_OK);
      assert_int_equal(lp_nn_set_ep(ls[r], &ep), LP_OK);
      assert_int_equal(lp_nn_ctx_new(&c0[r]), LP_OK);
      assert_int_equal(lp_nn_ctx_new(&c1[r]), LP_OK);
      assert_int_equal(lp_nn_forward_begin(ls[r], c0[r], x0), LP_OK);
    }
    drive(ls, c0, K, y0, NULL, 0);
    for (int r = 0; r < K; r++) {
      lp_tensor_free(y0[r]);
      assert_int_equal(lp_nn_forward_begin(ls[r], c1[r], x1), LP_OK);
      assert_int_equal(lp_nn_input_grad_begin(ls[r], c0[r], dy), LP_OK);
    }
    if (mode == 0) {
      drive(ls, c1, K, y[mode], NULL, 0);
      drive(ls, c0, K, dx[mode], NULL, 0);
    } else {
      int fd = 0, bd = 0, overlapped = 0;
      while (!fd || !bd) {
        for (int half = 0; half < 2; half++) {
          int *d = half ? &bd : &fd;
          if (*d) continue;
          for (int r = 0; r < K; r++) {
            int dd = 0;
            lp_nn_ctx *c = half ? c0[r] : c1[r];
            lp_tensor **out = half ? &dx[mode][r] : &y[mode][r];
            assert_int_equal(lp_nn_advance(ls[r], c, &dd, out), LP_OK);
            if (lp_nn_ctx_exchange_pending(c0[r]) &&
                lp_nn_ctx_exchange_pending(c1[r]))
              overlapped++;
            if (r == K - 1) *d = dd;
          }
        }
      }
      assert_true(overlapped > 0); /* both exchanges in flight at once */
    }
    for (int r = 0; r < K; r++) {
      assert_int_equal(lp_nn_weight_grad(ls[r], c0[r], NULL), LP_OK);
      size_t n;
      const lp_nn_param *ps = lp_nn_params(ls[r], &n);
      for (size_t i = 0; i < n; i++)
        g[mode][r * 32 + i] = like(ps[i].grad);
      ng = n;
      lp_nn_ctx_free(c0[r]), lp_nn_ctx_free(c1[r]);
      lp_nn_layer_release(ls[r]);
    }
  }
  for (int r = 0; r < K; r++) {
    assert_true(lp_tensor_equal(y[0][r], y[1][r]));
    assert_true(lp_tensor_equal(dx[0][r], dx[1][r]));
    for (size_t i = 0; i < ng; i++) {
      assert_true(lp_tensor_equal(g[0][r * 32 + i], g[1][r * 32 + i]));
      lp_tensor_free(g[0][r * 32 + i]), lp_tensor_free(g[1][r * 32 + i]);
    }
    for (int m = 0; m < 2; m++)
      lp_tensor_free(y[m][r]), lp_tensor_free(dx[m][r]);
  }
  lp_tensor_free(x0), lp_tensor_free(x1), lp_tensor_free(dy);
}

/* Weight-grad pieces ahead of time (lp_nn_weight_grad_part): a chunk of
 * two MoE blocks on K fake EP ranks runs its input-grad in phases; mode 1
 * runs every ready piece after each advance (the experts' while their
 * dispatch-backward is in flight, a block's once it finished), then
 * lp_nn_weight_grad does the rest. Gradients are bitwise
 * those of mode 0 (one weight-grad at the end); a dense chunk after its
 * pass, a FORWARD context and a non-chunk layer have no pieces / none. */
static void test_weight_grad_parts(void **state) {
  (void)state;
  enum { K = 2 };
  lp_nn_moe_opts o = moe_opts(8, 6, 4, 2);
  o.shared = 1;
  lp_tensor *x = randn(3, SH(2, 3, 8), 81), *dy = randn(3, SH(2, 3, 8), 82);
  lp_tensor *g[2][K][64] = {{{NULL}}};
  size_t ng = 0;
  for (int mode = 0; mode < 2; mode++) {
    fake_world w = {0};
    fake_rank fr[K];
    lp_nn_layer *ls[K];
    lp_nn_ctx *c[K];
    lp_tensor *out[K] = {NULL};
    w.k = K;
    for (int r = 0; r < K; r++) {
      fr[r] = (fake_rank){&w, r};
      lp_nn_ep ep = {K, r, &fr[r], fake_start, fake_wait};
      lp_nn_layer *b[2];
      assert_int_equal(lp_nn_moe_block_new("b0", 2, &o, 5, &b[0]), LP_OK);
      assert_int_equal(lp_nn_moe_block_new("b1", 2, &o, 6, &b[1]), LP_OK);
      assert_int_equal(lp_nn_chunk_new("stage", b, 2, &ls[r]), LP_OK);
      lp_nn_layer_release(b[0]), lp_nn_layer_release(b[1]);
      assert_int_equal(lp_nn_set_ep(ls[r], &ep), LP_OK);
      assert_int_equal(lp_nn_ctx_new(&c[r]), LP_OK);
      assert_int_equal(lp_nn_forward_begin(ls[r], c[r], x), LP_OK);
    }
    drive(ls, c, K, out, NULL, 0);
    for (int r = 0; r < K; r++) {
      int did = 1;
      assert_int_equal(lp_nn_weight_grad_part(ls[r], c[r], &did), LP_OK);
      assert_int_equal(did, 0); /* FORWARD: nothing to do yet */
      lp_tensor_free(out[r]);
      out[r] = NULL;
      assert_int_equal(lp_nn_input_grad_begin(ls[r], c[r], dy), LP_OK);
    }
    int done[K] = {0}, left = K, early = 0, parts = 0;
    while (left) {
      for (int r = 0; r < K; r++) {
        if (done[r]) continue;
        int d = 0, did = 0;
        assert_int_equal(lp_nn_advance(ls[r], c[r], &d, &out[r]), LP_OK);
        if (d) done[r] = 1, left--;
        if (mode == 1) {
          do {
            assert_int_equal(lp_nn_weight_grad_part(ls[r], c[r], &did), LP_OK);
            parts += did;
            if (did && !d) early++;
          } while (did);
        }
      }
    }
    if (mode == 1) {
      assert_true(early > 0);       /* a piece ran while the pass was running */
      /* per rank: each MoE layer's experts while its dispatch-backward
       * flies, then each block's remaining weight-grads once it finished */
      assert_int_equal(parts, 4 * K);
    }
    for (int r = 0; r < K; r++) {
      assert_int_equal(lp_nn_weight_grad(ls[r], c[r], NULL), LP_OK);
      size_t n;
      const lp_nn_param *ps = lp_nn_params(ls[r], &n);
      assert_true(n <= 64);
      for (size_t i = 0; i < n; i++)
        g[mode][r][i] = like(ps[i].grad);
      ng = n;
      lp_tensor_free(out[r]);
      lp_nn_ctx_free(c[r]);
      lp_nn_layer_release(ls[r]);
    }
  }
  for (int r = 0; r < K; r++)
    for (size_t i = 0; i < ng; i++) {
      assert_true(lp_tensor_equal(g[0][r][i], g[1][r][i]));
      lp_tensor_free(g[0][r][i]), lp_tensor_free(g[1][r][i]);
    }

  /* a dense chunk: all pieces after its pass, then nothing left for W */
  lp_nn_layer *l = build_lm(13, 8, 2, 0, 2, 1, 1, 90);
  lp_tensor *ids_in = ids(2, SH(2, 5), 13, 91), *tg = ids(2, SH(2, 5), 13, 92);
  lp_nn_ctx *ctx;
  lp_tensor *y, *d;
  double loss;
  assert_int_equal(lp_nn_ctx_new(&ctx), LP_OK);
  assert_int_equal(lp_nn_zero_grad(l), LP_OK);
  assert_int_equal(lp_nn_forward(l, ctx, ids_in, &y), LP_OK);
  assert_int_equal(lp_nn_loss_cross_entropy(y, tg, 1.0f, &loss, &d), LP_OK);
  assert_int_equal(lp_nn_backward(l, ctx, d, NULL), LP_OK);
  size_t np;
  const lp_nn_param *ps = lp_nn_params(l, &np);
  lp_tensor **ref = calloc(np, sizeof *ref);
  for (size_t i = 0; i < np; i++)
    ref[i] = like(ps[i].grad);
  assert_int_equal(lp_nn_zero_grad(l), LP_OK);
  lp_tensor_free(y);
  assert_int_equal(lp_nn_forward(l, ctx, ids_in, &y), LP_OK);
  assert_int_equal(lp_nn_input_grad(l, ctx, d, NULL), LP_OK);
  int did, pieces = 0;
  do {
    assert_int_equal(lp_nn_weight_grad_part(l, ctx, &did), LP_OK);
    pieces += did;
  } while (did);
  assert_int_equal(pieces, (int)lp_nn_layer_children(l)); /* embed, 2 blocks, norm, head */
  assert_int_equal(lp_nn_weight_grad(l, ctx, NULL), LP_OK);
  for (size_t i = 0; i < np; i++) {
    assert_true(lp_tensor_equal(ref[i], ps[i].grad));
    lp_tensor_free(ref[i]);
  }
  free(ref);
  /* not a chunk: no pieces */
  lp_nn_layer *lin;
  assert_int_equal(lp_nn_linear_new("lin", 4, 3, 1, 7, &lin), LP_OK);
  assert_int_equal(lp_nn_weight_grad_part(lin, ctx, &did), LP_OK);
  assert_int_equal(did, 0);
  assert_int_equal(lp_nn_weight_grad_part(l, ctx, NULL), LP_ERR_ARG);
  lp_nn_layer_release(lin);
  lp_tensor_free(y), lp_tensor_free(d), lp_tensor_free(ids_in), lp_tensor_free(tg);
  lp_nn_ctx_free(ctx);
  lp_nn_layer_release(l);
  lp_tensor_free(x), lp_tensor_free(dy);
}

/* Moving expert weights to a new placement: export every slot's values
 * by logical expert, apply the new placement, import into the slots this
 * rank did not hold before; the outputs are unchanged. */
static void test_moe_placement_move(void **state) {
  (void)state;
  enum { K = 2 };
  lp_nn_moe_opts o = moe_opts(8, 6, 4, 2);
  fake_world w = {0};
  fake_rank fr[K];
  w.k = K;
  lp_nn_layer *ls[K];
  lp_nn_ctx *cs[K];
  lp_tensor *xs[K], *y1[K] = {NULL}, *y2[K] = {NULL};
  const int p1[] = {0, 1, 2, 3}, p2[] = {3, 0, 2, 1, 0, 3};
  lp_tensor *saved[4][3] = {{NULL}};
  for (int r = 0; r < K; r++) {
    fr[r] = (fake_rank){&w, r};
    lp_nn_ep ep = {K, r, &fr[r], fake_start, fake_wait};
    assert_int_equal(lp_nn_moe_new("moe", &o, 9, &ls[r]), LP_OK);
    assert_int_equal(lp_nn_set_ep(ls[r], &ep), LP_OK);
    assert_int_equal(lp_nn_moe_set_placement(ls[r], 2, p1), LP_OK);
    /* "trained" weights: not what a fresh slot would get */
    size_t n;
    const lp_nn_param *ps = lp_nn_params(ls[r], &n);
    for (size_t i = 1; i < n; i++) {
      lp_tensor *d = randn(2, ps[i].value->shape, 100 + i);
      assert_int_equal(lp_tensor_axpy(ps[i].value, 0.5f, d), LP_OK);
      lp_tensor_free(d);
    }
    /* export by logical expert */
    for (int s = r * 2; s < r * 2 + 2; s++) {
      const lp_nn_param *sp;
      int m;
      assert_int_equal(lp_nn_moe_slot_params(ls[r], s, &sp, &m), LP_OK);
      assert_int_equal(m, 3);
      for (int i = 0; i < 3; i++)
        saved[p1[s]][i] = like(sp[i].value);
    }
    const lp_nn_param *sp;
    int m;
    assert_int_equal(lp_nn_moe_slot_params(ls[r], (r + 1) % K * 2, &sp, &m),
                     LP_ERR_ARG);
    assert_int_equal(lp_nn_ctx_new(&cs[r]), LP_OK);
    xs[r] = randn(2, SH(10, 8), 60 + (uint64_t)r);
  }
  /* the router is replicated: both ranks use rank 0's */
  assert_int_equal(lp_tensor_copy(lp_nn_params(ls[1], NULL)[0].value,
                                  lp_nn_params(ls[0], NULL)[0].value),
                   LP_OK);
  for (int r = 0; r < K; r++)
    assert_int_equal(lp_nn_forward_begin(ls[r], cs[r], xs[r]), LP_OK);
  drive(ls, cs, K, y1, NULL, 0);
  for (int r = 0; r < K; r++) {
    lp_nn_ctx_clear(cs[r]);
    assert_int_equal(lp_nn_moe_set_placement(ls[r], 3, p2), LP_OK);
    int got[6];
    assert_int_equal(lp_nn_moe_slots_per_rank(ls[r]), 3);
    assert_int_equal(lp_nn_moe_placement(ls[r], got), LP_OK);
    assert_memory_equal(got, p2, sizeof got);
    for (int s = r * 3; s < r * 3 + 3; s++) {
      const lp_nn_param *sp;
      int m;
      assert_int_equal(lp_nn_moe_slot_params(ls[r], s, &sp, &m), LP_OK);
      char want[64];
      snprintf(want, sizeof want, "moe.experts.%d.w1", p2[s]);
      assert_string_equal(sp[0].name, want);
      /* an expert this rank held keeps its values without an import */
      int held = p2[s] / 2 == r;
      if (s == r * 3) { /* roles: router dense, slots by slot and expert */
        lp_nn_param_role roles[1 + 9];
        assert_int_equal(lp_nn_param_roles(ls[r], roles, 10), LP_OK);
        assert_true(roles[0].moe == 0 && roles[0].slot == -1 &&
                    roles[0].expert == -1);
        for (int i = 1; i < 10; i++)
          assert_true(roles[i].moe == 0 && roles[i].slot == r * 3 + (i - 1) / 3 &&
                      roles[i].expert == p2[r * 3 + (i - 1) / 3]);
        assert_int_equal(lp_nn_param_roles(ls[r], roles, 9), LP_ERR_ARG);
      }
      if (held) assert_true(lp_tensor_equal(sp[0].value, saved[p2[s]][0]));
      for (int i = 0; i < 3; i++)
        assert_int_equal(lp_tensor_copy(sp[i].value, saved[p2[s]][i]), LP_OK);
    }
    assert_int_equal(lp_nn_forward_begin(ls[r], cs[r], xs[r]), LP_OK);
  }
  drive(ls, cs, K, y2, NULL, 0);
  for (int r = 0; r < K; r++) {
    double e = rel_rows(y2[r], y1[r], 0);
    printf("# placement move: rank %d y rel err %.2e\n", r, e);
    assert_true(e <= 1e-6);
  }
  for (int r = 0; r < K; r++) {
    lp_nn_ctx_free(cs[r]);
    lp_nn_layer_release(ls[r]);
    lp_tensor_free(xs[r]), lp_tensor_free(y1[r]), lp_tensor_free(y2[r]);
  }
  for (int e = 0; e < 4; e++)
    for (int i = 0; i < 3; i++)
      lp_tensor_free(saved[e][i]);
}

/* Loads, the balancing bias and bad input. */
static void test_moe_bias_and_errors(void **state) {
  (void)state;
  lp_nn_moe_opts o = moe_opts(8, 4, 4, 2);
  o.bias_speed = 0.01f;
  lp_nn_layer *m = NULL;
  lp_nn_ctx *c = NULL;
  lp_tensor *y = NULL;
  assert_int_equal(lp_nn_moe_new("blocks.1.moe", &o, 1, &m), LP_OK);
  assert_string_equal(lp_nn_layer_kind(m), "moe");
  lp_tensor *x = randn(2, SH(5, 8), 3);
  assert_int_equal(lp_nn_forward(m, NULL, x, &y), LP_OK);
  int64_t load[4], total = 0;
  assert_int_equal(lp_nn_moe_expert_load(m, load), LP_OK);
  for (int e = 0; e < 4; e++)
    total += load[e];
  assert_int_equal(total, 10); /* 5 tokens x top-2 */
  lp_nn_moe_load_reset(m);
  assert_int_equal(lp_nn_moe_expert_load(m, load), LP_OK);
  assert_int_equal(load[0] + load[1] + load[2] + load[3], 0);
  const int64_t counts[4] = {10, 2, 5, 5}; /* mean 5.5 */
  assert_int_equal(lp_nn_moe_update_bias(m, counts), LP_OK);
  float b[4];
  assert_int_equal(lp_nn_moe_get_bias(m, b), LP_OK);
  assert_true(b[0] == -0.01f && b[1] == 0.01f && b[2] == 0.01f &&
              b[3] == 0.01f);
  /* a big enough bias takes every token to experts 2 and 3 */
  const float big[4] = {0, 0, 5, 5};
  assert_int_equal(lp_nn_moe_set_bias(m, big), LP_OK);
  lp_tensor_free(y);
  assert_int_equal(lp_nn_forward(m, NULL, x, &y), LP_OK);
  assert_int_equal(lp_nn_moe_expert_load(m, load), LP_OK);
  assert_true(load[0] == 0 && load[1] == 0 && load[2] == 5 && load[3] == 5);

  assert_int_equal(lp_nn_ctx_new(&c), LP_OK);
  lp_tensor *bad = randn(2, SH(3, 5), 4);
  lp_tensor_free(y);
  assert_int_equal(lp_nn_forward(m, c, bad, &y), LP_ERR_ARG);
  assert_null(y);
  assert_string_equal(lp_nn_ctx_last_error(c),
                      "layer blocks.1.moe (moe): input must be [tokens, 8] or "
                      "[batch, seq, 8], got [3, 5]");
  assert_int_equal(lp_nn_ctx_stage_of(c), LP_NN_CTX_EMPTY);
  assert_string_equal(lp_nn_phase_name(c), "done");
  /* begin twice, advance without begin */
  assert_int_equal(lp_nn_forward_begin(m, c, x), LP_OK);
  assert_string_equal(lp_nn_phase_name(c), "attn/dense");
  assert_int_equal(lp_nn_forward_begin(m, c, x), LP_ERR_ARG);
  assert_non_null(strstr(lp_nn_ctx_last_error(c), "is still running"));
  lp_nn_ctx_clear(c);
  int d;
  assert_int_equal(lp_nn_advance(m, c, &d, &y), LP_ERR_ARG);
  assert_non_null(strstr(lp_nn_ctx_last_error(c), "no pass of this layer"));

  /* bad options and placements */
  lp_nn_layer *l2 = NULL;
  lp_nn_moe_opts bo = moe_opts(8, 4, 4, 5); /* topk > experts */
  assert_int_equal(lp_nn_moe_new("x", &bo, 1, &l2), LP_ERR_ARG);
  bo = moe_opts(8, 4, 6, 2);
  bo.groups = 4; /* 6 experts in 4 groups */
  assert_int_equal(lp_nn_moe_new("x", &bo, 1, &l2), LP_ERR_ARG);
  bo.groups = 3, bo.topk_groups = 1, bo.topk = 3; /* 1 group of 2 < top-3 */
  assert_int_equal(lp_nn_moe_new("x", &bo, 1, &l2), LP_ERR_ARG);
  assert_null(l2);
  /* a placement change re-lists the chunks holding the MoE, not others */
  lp_nn_layer *lin = NULL, *other = NULL, *holder = NULL;
  assert_int_equal(lp_nn_linear_new("lin", 8, 8, 1, 1, &lin), LP_OK);
  assert_int_equal(lp_nn_chunk_new("other", &lin, 1, &other), LP_OK);
  lp_nn_layer *pair[2] = {lin, m};
  assert_int_equal(lp_nn_chunk_new("holder", pair, 2, &holder), LP_OK);
  size_t n_other, n_holder;
  const lp_nn_param *po = lp_nn_params(other, &n_other);
  lp_nn_params(holder, &n_holder);
  assert_int_equal(n_holder, 2 + 1 + 3 * 4);
  const int two_each[] = {0, 1, 2, 3, 0, 1}; /* one rank, 6 slots */
  assert_int_equal(lp_nn_moe_set_placement(m, 6, two_each), LP_OK);
  assert_ptr_equal(lp_nn_params(other, NULL), po);
  lp_nn_params(holder, &n_holder);
  assert_int_equal(n_holder, 2 + 1 + 3 * 6);
  assert_int_equal(lp_nn_param_numel(holder),
                   8 * 8 + 8 + 4 * 8 + 6 * 3 * 4 * 8);
  lp_nn_layer_release(lin), lp_nn_layer_release(other);
  lp_nn_layer_release(holder);
  const int missing[] = {0, 1, 1, 3}; /* expert 2 nowhere */
  assert_int_equal(lp_nn_moe_set_placement(m, 4, missing), LP_ERR_ARG);
  const int out_of_range[] = {0, 1, 2, 4};
  assert_int_equal(lp_nn_moe_set_placement(m, 4, out_of_range), LP_ERR_ARG);
  lp_nn_ep ep = {2, 2, NULL, fake_start, fake_wait}; /* rank >= size */
  assert_int_equal(lp_nn_set_ep(m, &ep), LP_ERR_ARG);
  assert_null(lp_nn_moe_get_opts(NULL));
  assert_int_equal(lp_nn_moe_get_opts(m)->experts, 4);

  lp_tensor_free(x), lp_tensor_free(bad);
  lp_nn_ctx_free(c);
  lp_nn_layer_release(m);
}

/* F, I, W of an MoE block with a shared expert, every allocation failing
 * in turn: LP_ERR_NOMEM, nothing leaked, the ctx left EMPTY. */
static lp_status moe_scenario(void) {
  lp_nn_layer *l = NULL;
  lp_nn_ctx *c = NULL;
  lp_tensor *x = NULL, *y = NULL, *dx = NULL;
  lp_nn_moe_opts o = moe_opts(4, 3, 4, 2);
  o.shared = 1, o.groups = 2, o.topk_groups = 1;
  lp_status st;
  LP_CHECK_GOTO(lp_nn_moe_block_new("b", 2, &o, 1, &l), st, done);
  LP_CHECK_GOTO(lp_nn_ctx_new(&c), st, done);
  LP_CHECK_GOTO(lp_tensor_zeros(NULL, 3, SH(2, 3, 4), &x), st, done);
  LP_CHECK_GOTO(lp_tensor_fill(x, 0.5f), st, done);
  st = lp_nn_forward(l, c, x, &y);
  if (st == LP_OK) st = lp_nn_input_grad(l, c, y, &dx);
  if (st == LP_OK) st = lp_nn_weight_grad(l, c, NULL);
  if (st != LP_OK) assert_int_equal(lp_nn_ctx_stage_of(c), LP_NN_CTX_EMPTY);
done:
  lp_nn_layer_release(l);
  lp_nn_ctx_free(c);
  lp_tensor_free(x), lp_tensor_free(y), lp_tensor_free(dx);
  return st;
}

static void test_moe_oom(void **state) {
  (void)state;
  int failures = lp_test_oom_points(moe_scenario, 100000);
  printf("# moe oom: %d failure points, all LP_ERR_NOMEM, no leaks\n",
         failures);
  assert_true(failures > 50);
}

/* ---- out of memory ---- */

/* Build a 1-block LM, run F, loss, I, W for two micro-batches and one
 * AdamW step; every object is freed on every path. A failed forward or
 * input_grad must leave the ctx EMPTY. */
static lp_status nn_scenario(void) {
  lp_nn_layer *ls[4] = {NULL}, *l = NULL;
  lp_nn_ctx *c = NULL;
  lp_nn_optim *opt = NULL;
  lp_tensor *x = NULL, *t = NULL, *y = NULL, *dy = NULL;
  lp_status st;
  LP_CHECK_GOTO(lp_nn_embedding_new("embed", 7, 8, 1, &ls[0]), st, done);
  LP_CHECK_GOTO(lp_nn_transformer_block_new("blocks.0", 8, 2, 16,
                                            LP_TENSOR_ACT_GELU, 1, &ls[1]),
                st, done);
  LP_CHECK_GOTO(lp_nn_rmsnorm_new("final_norm", 8, 1e-5f, &ls[2]), st, done);
  LP_CHECK_GOTO(lp_nn_linear_new("head", 8, 7, 0, 1, &ls[3]), st, done);
  LP_CHECK_GOTO(lp_nn_chunk_new("stage", ls, 4, &l), st, done);
  LP_CHECK_GOTO(lp_nn_ctx_new(&c), st, done);
  LP_CHECK_GOTO(lp_tensor_zeros(NULL, 2, SH(2, 3), &x), st, done);
  LP_CHECK_GOTO(lp_tensor_fill(x, 3.0f), st, done);
  LP_CHECK_GOTO(lp_tensor_zeros(NULL, 2, SH(2, 3), &t), st, done);
  size_t np;
  const lp_nn_param *ps = lp_nn_params(l, &np);
  lp_nn_adamw_opts o = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  LP_CHECK_GOTO(lp_nn_optim_adamw_new(ps, np, &o, &opt), st, done);
  for (int m = 0; m < 2; m++) {
    double loss;
    st = lp_nn_forward(l, c, x, &y);
    if (st != LP_OK) {
      assert_int_equal(lp_nn_ctx_stage_of(c), LP_NN_CTX_EMPTY);
      assert_int_equal(lp_nn_ctx_bytes(c), 0);
      goto done;
    }
    LP_CHECK_GOTO(lp_nn_loss_cross_entropy(y, t, 0.5f, &loss, &dy), st, done);
    st = lp_nn_input_grad(l, c, dy, NULL);
    if (st != LP_OK) {
      assert_int_equal(lp_nn_ctx_stage_of(c), LP_NN_CTX_EMPTY);
      goto done;
    }
    LP_CHECK_GOTO(lp_nn_weight_grad(l, c, NULL), st, done);
    lp_tensor_free(y), lp_tensor_free(dy);
    y = dy = NULL;
  }
  LP_CHECK_GOTO(lp_nn_optim_step(opt), st, done);
done:
  for (int i = 0; i < 4; i++)
    lp_nn_layer_release(ls[i]);
  lp_nn_layer_release(l);
  lp_nn_ctx_free(c);
  lp_nn_optim_free(opt);
  lp_tensor_free(x), lp_tensor_free(t), lp_tensor_free(y), lp_tensor_free(dy);
  return st;
}

static void test_oom(void **state) {
  (void)state;
  int failures = lp_test_oom_points(nn_scenario, 100000);
  printf("# nn oom: %d failure points, all LP_ERR_NOMEM, no leaks\n", failures);
  assert_true(failures > 50);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grad_linear),
      cmocka_unit_test(test_grad_embedding),
      cmocka_unit_test(test_grad_gelu_silu),
      cmocka_unit_test(test_grad_rmsnorm),
      cmocka_unit_test(test_grad_attention),
      cmocka_unit_test(test_attention_causal),
      cmocka_unit_test(test_grad_mlp_block),
      cmocka_unit_test(test_grad_transformer_block),
      cmocka_unit_test(test_grad_chunk),
      cmocka_unit_test(test_grad_model_cross_entropy),
      cmocka_unit_test(test_grad_losses),
      cmocka_unit_test(test_deferred_weight_grad),
      cmocka_unit_test(test_split_init_and_compute),
      cmocka_unit_test(test_sgd),
      cmocka_unit_test(test_adamw),
      cmocka_unit_test(test_adamw_masked),
      cmocka_unit_test(test_moe_unrouted_mask),
      cmocka_unit_test(test_training_converges),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_oom),
      cmocka_unit_test(test_grad_moe),
      cmocka_unit_test(test_grad_moe_block),
      cmocka_unit_test(test_grad_moe_gate),
      cmocka_unit_test(test_moe_gate_selection),
      cmocka_unit_test(test_moe_no_bias),
      cmocka_unit_test(test_moe_ep_equivalence),
      cmocka_unit_test(test_moe_ep_idle_rank),
      cmocka_unit_test(test_moe_overlapped_pair),
      cmocka_unit_test(test_weight_grad_parts),
      cmocka_unit_test(test_moe_balance_scale),
      cmocka_unit_test(test_moe_placement_move),
      cmocka_unit_test(test_moe_bias_and_errors),
      cmocka_unit_test(test_moe_oom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
