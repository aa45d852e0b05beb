/* test_backend_routing.c — a whole model runs through the backend table
 * alone. A "fake:0" backend hands out pointers that the host cannot
 * dereference (shifted by 2^47, outside the canonical address space) and
 * runs the CPU backend's functions after shifting them back; it is not
 * host_accessible, like a GPU. Any host loop left in the tensor, nn, loss or
 * optimizer code that touches device memory crashes this test. Results
 * must equal the CPU run bit for bit (the same functions do the math). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "lp_nn.h"

#define OFF ((uintptr_t)1 << 47)
#define U(p) ((p) ? (void *)((uintptr_t)(p) - OFF) : NULL)

static const lp_tensor_backend *cpu;

static void *f_alloc(const lp_tensor_backend *be, size_t bytes) {
  (void)be;
  void *p = lp_malloc(bytes);
  return p ? (void *)((uintptr_t)p + OFF) : NULL;
}
static void f_free(const lp_tensor_backend *be, void *p) {
  (void)be;
  lp_free(U(p));
}
static lp_status f_to_host(const lp_tensor_backend *be, void *dst,
                           const void *src, size_t n) {
  (void)be;
  return cpu->to_host(cpu, dst, U(src), n);
}
static lp_status f_from_host(const lp_tensor_backend *be, void *dst,
                             const void *src, size_t n) {
  (void)be;
  return cpu->from_host(cpu, U(dst), src, n);
}
static lp_status f_gemm(const lp_tensor_backend *be, int ta, int tb, int64_t m,
                        int64_t n, int64_t k, float alpha, const float *a,
                        int64_t lda, int64_t sa, const float *b, int64_t ldb,
                        int64_t sb, float beta, float *c, int64_t ldc,
                        int64_t sc, int64_t batch) {
  (void)be;
  return cpu->gemm(cpu, ta, tb, m, n, k, alpha, U(a), lda, sa, U(b), ldb, sb,
                   beta, U(c), ldc, sc, batch);
}
static lp_status f_fill(const lp_tensor_backend *be, int64_t n, float v,
                        float *x) {
  (void)be;
  return cpu->fill(cpu, n, v, U(x));
}
static lp_status f_copy(const lp_tensor_backend *be, int64_t n, const float *x,
                        float *o) {
  (void)be;
  return cpu->copy(cpu, n, U(x), U(o));
}
static lp_status f_axpy(const lp_tensor_backend *be, int64_t n, float a,
                        const float *x, float *y) {
  (void)be;
  return cpu->axpy(cpu, n, a, U(x), U(y));
}
static lp_status f_scale(const lp_tensor_backend *be, int64_t n, float a,
                         float *x) {
  (void)be;
  return cpu->scale(cpu, n, a, U(x));
}
static lp_status f_add(const lp_tensor_backend *be, int64_t n, const float *a,
                       const float *b, float *o) {
  (void)be;
  return cpu->add(cpu, n, U(a), U(b), U(o));
}
static lp_status f_mul(const lp_tensor_backend *be, int64_t n, const float *a,
                       const float *b, float *o) {
  (void)be;
  return cpu->mul(cpu, n, U(a), U(b), U(o));
}
static lp_status f_act(const lp_tensor_backend *be, lp_tensor_act_kind k,
                       int64_t n, const float *x, float *y) {
  (void)be;
  return cpu->act(cpu, k, n, U(x), U(y));
}
static lp_status f_act_bwd(const lp_tensor_backend *be, lp_tensor_act_kind k,
                           int64_t n, const float *x, const float *dy,
                           float *dx) {
  (void)be;
  return cpu->act_backward(cpu, k, n, U(x), U(dy), U(dx));
}
static lp_status f_softmax(const lp_tensor_backend *be, int64_t r, int64_t c,
                           const float *x, float *y) {
  (void)be;
  return cpu->softmax_rows(cpu, r, c, U(x), U(y));
}
static lp_status f_sum_rows(const lp_tensor_backend *be, int64_t r, int64_t c,
                            const float *x, float beta, float *o) {
  (void)be;
  return cpu->sum_rows(cpu, r, c, U(x), beta, U(o));
}
static lp_status f_add_rowvec(const lp_tensor_backend *be, int64_t r,
                              int64_t c, const float *v, float *t) {
  (void)be;
  return cpu->add_rowvec(cpu, r, c, U(v), U(t));
}
static lp_status f_rmsnorm(const lp_tensor_backend *be, int64_t r, int64_t d,
                           float eps, const float *x, const float *w, float *y,
                           float *rstd) {
  (void)be;
  return cpu->rmsnorm(cpu, r, d, eps, U(x), U(w), U(y), U(rstd));
}
static lp_status f_rmsnorm_bwd(const lp_tensor_backend *be, int64_t r,
                               int64_t d, const float *x, const float *w,
                               const float *rstd, const float *dy, float *dx,
                               float *gw) {
  (void)be;
  return cpu->rmsnorm_backward(cpu, r, d, U(x), U(w), U(rstd), U(dy), U(dx),
                               U(gw));
}
static lp_status f_embedding(const lp_tensor_backend *be, int64_t n,
                             int64_t dim, const float *ids, const float *w,
                             float *y) {
  (void)be;
  return cpu->embedding(cpu, n, dim, U(ids), U(w), U(y));
}
static lp_status f_embedding_bwd(const lp_tensor_backend *be, int64_t n,
                                 int64_t dim, int64_t vocab, const float *ids,
                                 const float *dy, float *gw) {
  (void)be;
  return cpu->embedding_backward(cpu, n, dim, vocab, U(ids), U(dy), U(gw));
}
static lp_status f_causal(const lp_tensor_backend *be, int64_t r, int64_t t,
                          float *s) {
  (void)be;
  return cpu->causal_mask(cpu, r, t, U(s));
}
static lp_status f_softmax_bwd(const lp_tensor_backend *be, int64_t r,
                               int64_t c, const float *p, float *ds) {
  (void)be;
  return cpu->softmax_backward_rows(cpu, r, c, U(p), U(ds));
}
static lp_status f_ce(const lp_tensor_backend *be, int64_t r, int64_t c,
                      const float *l, const float *t, double gs, double *loss,
                      float *dl) {
  (void)be;
  return cpu->cross_entropy(cpu, r, c, U(l), U(t), gs, U(loss), U(dl));
}
static lp_status f_sq(const lp_tensor_backend *be, int64_t n, const float *p,
                      const float *t, double gs, double *sq, float *dp) {
  (void)be;
  return cpu->sq_error(cpu, n, U(p), U(t), gs, U(sq), U(dp));
}
static lp_status f_sgd(const lp_tensor_backend *be, int64_t n, double lr,
                       double mu, double wd, float *p, const float *g,
                       float *m) {
  (void)be;
  return cpu->sgd_step(cpu, n, lr, mu, wd, U(p), U(g), U(m));
}
static lp_status f_adamw(const lp_tensor_backend *be, int64_t n, double lr,
                         double b1, double b2, double eps, double decay,
                         double bc1, double bc2, float *p, const float *g,
                         float *m, float *v) {
  (void)be;
  return cpu->adamw_step(cpu, n, lr, b1, b2, eps, decay, bc1, bc2, U(p), U(g),
                         U(m), U(v));
}

static const lp_tensor_backend fake = {
    .name = "fake:0",
    .host_accessible = 0,
    .alloc = f_alloc,
    .free = f_free,
    .to_host = f_to_host,
    .from_host = f_from_host,
    .gemm = f_gemm,
    .fill = f_fill,
    .copy = f_copy,
    .axpy = f_axpy,
    .scale = f_scale,
    .add = f_add,
    .mul = f_mul,
    .act = f_act,
    .act_backward = f_act_bwd,
    .softmax_rows = f_softmax,
    .sum_rows = f_sum_rows,
    .add_rowvec = f_add_rowvec,
    .rmsnorm = f_rmsnorm,
    .rmsnorm_backward = f_rmsnorm_bwd,
    .embedding = f_embedding,
    .embedding_backward = f_embedding_bwd,
    .causal_mask = f_causal,
    .softmax_backward_rows = f_softmax_bwd,
    .cross_entropy = f_ce,
    .sq_error = f_sq,
    .sgd_step = f_sgd,
    .adamw_step = f_adamw,
};

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
                     const lp_tensor *target, lp_tensor **out) {
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
    if (it == 2) *out = y;
    else lp_tensor_free(y);
    lp_tensor_free(dy), lp_tensor_free(dx);
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
  lp_tensor *ya = NULL, *yb = NULL;
  double la = train3(a, ce, x, target, &ya);
  double lb = train3(b, ce, xf, target, &yb);
  assert_memory_equal(&la, &lb, sizeof la);
  assert_ptr_equal(lp_tensor_backend_of(yb), &fake);
  assert_same(yb, ya);
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
  assert_ptr_equal(lp_tensor_backend_of(x), &fake);
  lp_tensor_free(d), lp_tensor_free(x);
  lp_nn_ctx_free(ctx);
  lp_nn_layer_release(lin);
}

int main(void) {
  cpu = lp_tensor_backend_cpu();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lm_on_device),
      cmocka_unit_test(test_mlp_on_device),
      cmocka_unit_test(test_mixing_devices),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
