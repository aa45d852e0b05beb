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
      cmocka_unit_test(test_mixing_devices),
      cmocka_unit_test(test_optimizer_before_move),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
