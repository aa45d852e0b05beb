/* nn_gradcheck.h — the layer gradient check the nn test files share
 * (test_nn.c, test_mla.c): random tensors, central differences, and
 * gradcheck(): a layer's input and parameter gradients against numerical
 * ones through the probe L = sum(layer(x) * r) (or a cross-entropy), then
 * the I/W split, the one-call backward and W alone giving identical bits.
 * Include after cmocka.h and lp_nn.h. */
#pragma once

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define NNG_UNUSED __attribute__((unused))

#define RTOL 1e-2
#define ATOL 1e-3
#define EPS 1e-2f

/* The finite-difference step (MoE tests use a smaller one so that no
 * perturbation changes which experts a token selects). */
static float g_eps = EPS;

NNG_UNUSED static lp_tensor *randn(int ndim, const int64_t *shape, uint64_t seed) {
  lp_tensor *t = NULL;
  assert_int_equal(lp_tensor_empty(NULL, ndim, shape, &t), LP_OK);
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, seed);
  assert_int_equal(lp_tensor_fill_normal(t, &r, 0.0f, 1.0f), LP_OK);
  return t;
}

NNG_UNUSED static lp_tensor *like(const lp_tensor *t) {
  lp_tensor *c = NULL;
  assert_int_equal(lp_tensor_clone(t, &c), LP_OK);
  return c;
}

/* Checks analytic against numerical gradients; prints the worst error. */
NNG_UNUSED static void compare(const char *what, const float *ana, const double *num,
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
NNG_UNUSED static double *numgrad(objective f, void *ud, lp_tensor *t) {
  int64_t n = lp_tensor_numel(t);
  double *g = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    float save = t->data[i];
    t->data[i] = save + g_eps;
    double fp = f(ud);
    t->data[i] = save - g_eps;
    double fm = f(ud);
    t->data[i] = save;
    g[i] = (fp - fm) / (2.0 * (double)g_eps);
  }
  return g;
}

/* ---- the layer probe: L = sum(layer(x) * r) ---- */

typedef struct {
  lp_nn_layer *l;
  lp_tensor *x, *r, *targets;
  int loss;            /* 0: dot with r; 1: cross-entropy against targets */
  lp_nn_layer *aux;    /* an MoE whose balance loss is part of L, or NULL */
} probe;

NNG_UNUSED static double probe_eval(void *ud) {
  probe *p = ud;
  lp_tensor *y = NULL;
  assert_int_equal(lp_nn_forward(p->l, NULL, p->x, &y), LP_OK);
  double v;
  if (p->loss)
    assert_int_equal(lp_nn_loss_cross_entropy(y, p->targets, 1.0f, &v, NULL),
                     LP_OK);
  else
    assert_int_equal(lp_tensor_dot(y, p->r, &v), LP_OK);
  if (p->aux) v += lp_nn_moe_aux_loss(p->aux);
  lp_tensor_free(y);
  return v;
}

/* dL/dy for the probe (a new tensor). */
NNG_UNUSED static lp_tensor *probe_dy(probe *p, const lp_tensor *y) {
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
NNG_UNUSED static void gradcheck(const char *label, probe *p, int has_dx) {
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

NNG_UNUSED static void probe_done(probe *p) {
  lp_nn_layer_release(p->l);
  lp_tensor_free(p->x), lp_tensor_free(p->r), lp_tensor_free(p->targets);
}
