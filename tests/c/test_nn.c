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
#define RTOL 1e-2
#define ATOL 1e-3
#define EPS 1e-2f

static lp_tensor *randn(int ndim, const int64_t *shape, uint64_t seed) {
  lp_tensor *t = NULL;
  assert_int_equal(lp_tensor_empty(NULL, ndim, shape, &t), LP_OK);
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, seed);
  assert_int_equal(lp_tensor_fill_normal(t, &r, 0.0f, 1.0f), LP_OK);
  return t;
}

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

static lp_tensor *like(const lp_tensor *t) {
  lp_tensor *c = NULL;
  assert_int_equal(lp_tensor_clone(t, &c), LP_OK);
  return c;
}

/* Checks analytic against numerical gradients; prints the worst error. */
static void compare(const char *what, const float *ana, const double *num,
                    int64_t n) {
  double mx = 0, worst = 0;
  for (int64_t i = 0; i < n; i++)
    mx = fmax(mx, fabs(num[i]));
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(ana[i] - num[i]);
    double tol = RTOL * fabs(num[i]) + ATOL * fmax(1.0, mx);
    if (d > tol) {
      if (bad < 5)
        printf("  %s[%lld]: analytic %.6g numerical %.6g\n", what, (long long)i,
               (double)ana[i], num[i]);
      bad++;
    }
    worst = fmax(
        worst, d / fmax(1e-12, fmax(fabs(num[i]), ATOL * fmax(1, mx) / RTOL)));
  }
  printf("# gradcheck %-34s n=%-5lld max|g|=%-9.3g worst rel err %.2e\n", what,
         (long long)n, mx, worst);
  assert_int_equal(bad, 0);
}

/* A scalar function of a tensor being perturbed. */
typedef double (*objective)(void *ud);

/* Central differences of f with respect to every element of t. */
static double *numgrad(objective f, void *ud, lp_tensor *t) {
  int64_t n = lp_tensor_numel(t);
  double *g = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    float save = t->data[i];
    t->data[i] = save + EPS;
    double fp = f(ud);
    t->data[i] = save - EPS;
    double fm = f(ud);
    t->data[i] = save;
    g[i] = (fp - fm) / (2.0 * (double)EPS);
  }
  return g;
}

/* ---- the layer probe: L = sum(layer(x) * r) ---- */

typedef struct {
  lp_nn_layer *l;
  lp_tensor *x, *r, *targets;
  int loss; /* 0: dot with r; 1: cross-entropy against targets */
} probe;

static double probe_eval(void *ud) {
  probe *p = ud;
  lp_tensor *y = NULL;
  assert_int_equal(lp_nn_forward(p->l, NULL, p->x, &y), LP_OK);
  double v;
  if (p->loss)
    assert_int_equal(lp_nn_loss_cross_entropy(y, p->targets, 1.0f, &v, NULL),
                     LP_OK);
  else
    assert_int_equal(lp_tensor_dot(y, p->r, &v), LP_OK);
  lp_tensor_free(y);
  return v;
}

/* dL/dy for the probe (a new tensor). */
static lp_tensor *probe_dy(probe *p, const lp_tensor *y) {
  if (!p->loss) return like(p->r);
  lp_tensor *dy = NULL;
  double v;
  assert_int_equal(lp_nn_loss_cross_entropy(y, p->targets, 1.0f, &v, &dy),
                   LP_OK);
  return dy;
}

/* Full gradient check of a layer: input grad (when has_dx) and every
 * parameter grad against central differences; then the I/W split: I then W,
 * one-call backward, and W alone (with dy) must give identical bits. */
static void gradcheck(const char *label, probe *p, int has_dx) {
  lp_nn_layer *l = p->l;
  lp_nn_ctx *ctx = NULL;
  lp_tensor *y = NULL, *dx = NULL;
  assert_int_equal(lp_nn_ctx_new(&ctx), LP_OK);
  assert_int_equal(lp_nn_zero_grad(l), LP_OK);
  assert_int_equal(lp_nn_forward(l, ctx, p->x, &y), LP_OK);
  lp_tensor *y0 = NULL; /* inference (no ctx) computes the same bits */
  assert_int_equal(lp_nn_forward(l, NULL, p->x, &y0), LP_OK);
  assert_true(lp_tensor_equal(y, y0));
  lp_tensor_free(y0);
  if (!p->loss && !p->r) p->r = randn(y->ndim, y->shape, 4242);
  lp_tensor *dy = probe_dy(p, y);
  assert_int_equal(lp_nn_ctx_stage_of(ctx), LP_NN_CTX_FORWARD);
  assert_true(lp_nn_ctx_bytes(ctx) > 0);
  assert_int_equal(lp_nn_input_grad(l, ctx, dy, &dx), LP_OK);
  assert_int_equal(lp_nn_ctx_stage_of(ctx), LP_NN_CTX_INPUT_GRAD);
  assert_int_equal(lp_nn_weight_grad(l, ctx, NULL), LP_OK);
  assert_int_equal(lp_nn_ctx_stage_of(ctx), LP_NN_CTX_EMPTY);
  assert_int_equal(lp_nn_ctx_bytes(ctx), 0);

  char what[128];
  if (has_dx) {
    assert_non_null(dx);
    assert_true(lp_tensor_same_shape(dx, p->x));
    double *num = numgrad(probe_eval, p, p->x);
    snprintf(what, sizeof what, "%s d(input)", label);
    compare(what, dx->data, num, lp_tensor_numel(dx));
    free(num);
  } else {
    assert_null(dx);
  }
  size_t np;
  const lp_nn_param *ps = lp_nn_params(l, &np);
  lp_tensor **g1 = calloc(np + 1, sizeof *g1);
  for (size_t i = 0; i < np; i++) {
    double *num = numgrad(probe_eval, p, ps[i].value);
    snprintf(what, sizeof what, "%s d(%s)", label, ps[i].name);
    compare(what, ps[i].grad->data, num, lp_tensor_numel(ps[i].grad));
    free(num);
    g1[i] = like(ps[i].grad);
  }

  /* one-call backward gives the same bits */
  lp_tensor *y2 = NULL, *dx2 = NULL;
  assert_int_equal(lp_nn_zero_grad(l), LP_OK);
  assert_int_equal(lp_nn_forward(l, ctx, p->x, &y2), LP_OK);
  assert_true(lp_tensor_equal(y, y2));
  assert_int_equal(lp_nn_backward(l, ctx, dy, has_dx ? &dx2 : NULL), LP_OK);
  if (has_dx) assert_true(lp_tensor_equal(dx, dx2));
  for (size_t i = 0; i < np; i++)
    assert_true(lp_tensor_equal(g1[i], ps[i].grad));
  /* W alone (it runs the part of I that W needs) gives the same bits */
  assert_int_equal(lp_nn_zero_grad(l), LP_OK);
  lp_tensor_free(y2);
  assert_int_equal(lp_nn_forward(l, ctx, p->x, &y2), LP_OK);
  assert_int_equal(lp_nn_weight_grad(l, ctx, dy), LP_OK);
  for (size_t i = 0; i < np; i++)
    assert_true(lp_tensor_equal(g1[i], ps[i].grad));

  for (size_t i = 0; i < np; i++)
    lp_tensor_free(g1[i]);
  free(g1);
  lp_tensor_free(y), lp_tensor_free(y2), lp_tensor_free(dx),
      lp_tensor_free(dx2);
  lp_tensor_free(dy);
  lp_nn_ctx_free(ctx);
}

static void probe_done(probe *p) {
  lp_nn_layer_release(p->l);
  lp_tensor_free(p->x), lp_tensor_free(p->r), lp_tensor_free(p->targets);
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
      cmocka_unit_test(test_training_converges),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_oom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
