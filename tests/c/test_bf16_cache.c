/* test_bf16_cache.c — what bf16 training keeps in bf16 and must never
 * serve stale or different:
 *  1. weights' rounded copies (lp_tensor_keep_bf16): after a forward at
 *     bf16 has made them, every route that writes parameter values makes
 *     the next forward use the new values, checked bitwise against a fresh
 *     layer given the same values (a Linear; MLA, whose GEMMs take
 *     pointers into its weights, with SwiGLU): SGD and AdamW steps, lp_tensor_write
 *     (ZeRO-1's all-gather, checkpoint load, EPLB's placement writes),
 *     lp_tensor_copy (set_params, models.load, a new expert slot's copy),
 *     fill / scale / axpy / RNG fills, a raw write followed by
 *     lp_tensor_touch, and EPLB placements of an MoE layer (slots moved
 *     and replicated) with optimizer steps between them. The control: a
 *     raw write without lp_tensor_touch is NOT seen (the copy is used);
 *  2. packed activations (nn_pack): Linear (with and without bias),
 *     attention, SwiGLU, an MoE layer with a shared expert, MLA and a
 *     transformer block give bitwise the same output, input gradient and
 *     parameter gradients at bf16 with packing on and off, and keep fewer
 *     bytes for backward (a bias-free Linear: x and dy exactly half);
 *  3. lp_tensor_new_bf16 itself: values rounded as lp_tensor_bf16_round,
 *     copies out widen exactly, other ops refuse a packed tensor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lp_nn.h"
#include "lp_tensor.h"

#define SH(...) ((int64_t[]){__VA_ARGS__})

static void fill(float *x, int64_t n, uint64_t seed) {
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, seed);
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)(lp_tensor_rng_uniform(&r) * 2.0 - 1.0);
}

typedef lp_nn_layer *(*maker)(void);

static lp_nn_layer *bf16(lp_nn_layer *l) {
  assert_non_null(l);
  assert_int_equal(lp_nn_layer_set_precision(l, LP_TENSOR_BF16), LP_OK);
  return l;
}

static lp_nn_layer *make_linear(void) {
  lp_nn_layer *l = NULL;
  assert_int_equal(lp_nn_linear_new("lin", 32, 48, 1, 1, &l), LP_OK);
  return bf16(l);
}

static lp_nn_layer *make_linear_nobias(void) {
  lp_nn_layer *l = NULL;
  assert_int_equal(lp_nn_linear_new("lin", 32, 48, 0, 1, &l), LP_OK);
  return bf16(l);
}

static lp_nn_moe_opts moe_opts(void) {
  lp_nn_moe_opts o;
  memset(&o, 0, sizeof o);
  o.dim = 32, o.hidden = 32, o.experts = 4, o.topk = 2, o.shared = 1;
  o.router = LP_NN_ROUTER_SOFTMAX;
  return o;
}

static lp_nn_layer *make_moe(void) {
  lp_nn_layer *l = NULL;
  lp_nn_moe_opts o = moe_opts();
  assert_int_equal(lp_nn_moe_new("moe", &o, 2, &l), LP_OK);
  return bf16(l);
}

/* MLA (its GEMMs take weights as pointers into them) with SwiGLU. */
static lp_nn_layer *make_mla(void) {
  lp_nn_mla_opts o = lp_nn_mla_defaults();
  o.dim = 32, o.n_heads = 2, o.q_lora_rank = 8, o.kv_lora_rank = 16;
  o.qk_nope_head_dim = 8, o.qk_rope_head_dim = 4, o.v_head_dim = 8;
  lp_nn_layer *k[2], *l = NULL;
  assert_int_equal(lp_nn_mla_new("mla", &o, 3, &k[0]), LP_OK);
  assert_int_equal(lp_nn_swiglu_new("ffn", 32, 48, 4, &k[1]), LP_OK);
  assert_int_equal(lp_nn_chunk_new("c", k, 2, &l), LP_OK);
  lp_nn_layer_release(k[0]), lp_nn_layer_release(k[1]);
  return bf16(l);
}

/* y = l(x) (no ctx). */
static lp_tensor *fwd(lp_nn_layer *l, const lp_tensor *x) {
  lp_tensor *y = NULL;
  assert_int_equal(lp_nn_forward(l, NULL, x, &y), LP_OK);
  return y;
}

/* A fresh layer from make (no bf16 copy made yet) with l's parameter
 * values (and MoE placement) gives bitwise l's output; returns l's
 * output. */
static lp_tensor *check_fresh(lp_nn_layer *l, maker make, const lp_tensor *x) {
  lp_nn_layer *f = make();
  if (!strcmp(lp_nn_layer_kind(l), "moe")) {
    int p2l[16], spr = lp_nn_moe_slots_per_rank(l);
    assert_int_equal(lp_nn_moe_placement(l, p2l), LP_OK);
    assert_int_equal(lp_nn_moe_set_placement(f, spr, p2l), LP_OK);
  }
  size_t n, nf;
  const lp_nn_param *p = lp_nn_params(l, &n), *pf = lp_nn_params(f, &nf);
  assert_int_equal(n, nf);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(lp_tensor_copy(pf[i].value, p[i].value), LP_OK);
  lp_tensor *y = fwd(l, x), *yf = fwd(f, x);
  assert_true(lp_tensor_equal(y, yf));
  lp_tensor_free(yf);
  lp_nn_layer_release(f);
  return y;
}
#define fwd(l) fwd(l, x)

/* *prev = y, asserting y differs from the previous output. */
static void changed(lp_tensor **prev, lp_tensor *y) {
  assert_false(lp_tensor_equal(*prev, y));
  lp_tensor_free(*prev);
  *prev = y;
}

static void set_grads(lp_nn_layer *l, float v) {
  size_t n;
  const lp_nn_param *p = lp_nn_params(l, &n);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(lp_tensor_fill(p[i].grad, v), LP_OK);
}

/* Every writing route on a Linear's weight. */
static void test_weight_routes(void **state) {
  (void)state;
  lp_nn_layer *l = make_linear();
  lp_tensor *x;
  assert_int_equal(lp_tensor_empty(NULL, 2, SH(16, 32), &x), LP_OK);
  fill(x->data, 16 * 32, 3);
  lp_tensor *y = check_fresh(l, make_linear, x);
  size_t n;
  const lp_nn_param *p = lp_nn_params(l, &n);
  lp_tensor *w = p[0].value;
  int64_t nw = lp_tensor_numel(w);

  /* optimizer steps */
  lp_nn_optim *o;
  lp_nn_sgd_opts sgd = {0.05f, 0.9f, 0.0f};
  assert_int_equal(lp_nn_optim_sgd_new(p, n, &sgd, &o), LP_OK);
  set_grads(l, 0.25f);
  assert_int_equal(lp_nn_optim_step(o), LP_OK);
  changed(&y, check_fresh(l, make_linear, x));
  lp_nn_optim_free(o);
  lp_nn_adamw_opts adam = {0.01f, 0.9f, 0.95f, 1e-8f, 0.1f};
  assert_int_equal(lp_nn_optim_adamw_new(p, n, &adam, &o), LP_OK);
  set_grads(l, -0.5f);
  assert_int_equal(lp_nn_optim_step(o), LP_OK);
  changed(&y, check_fresh(l, make_linear, x));
  lp_nn_optim_free(o);

  /* lp_tensor_write: ZeRO-1's all-gather, checkpoint load, placements */
  float *buf = malloc((size_t)nw * sizeof *buf);
  assert_non_null(buf);
  fill(buf, nw, 11);
  assert_int_equal(lp_tensor_write(w, buf), LP_OK);
  changed(&y, check_fresh(l, make_linear, x));
  /* lp_tensor_copy: set_params, models.load, a new slot's copy */
  lp_tensor *src;
  fill(buf, nw, 12);
  assert_int_equal(lp_tensor_from_data(NULL, 2, SH(48, 32), buf, &src), LP_OK);
  assert_int_equal(lp_tensor_copy(w, src), LP_OK);
  lp_tensor_free(src);
  changed(&y, check_fresh(l, make_linear, x));
  /* a row of it through a view (the storage is what changes) */
  lp_tensor *row;
  assert_int_equal(lp_tensor_rows(w, 5, 1, &row), LP_OK);
  assert_int_equal(lp_tensor_fill(row, 0.75f), LP_OK);
  lp_tensor_free(row);
  changed(&y, check_fresh(l, make_linear, x));
  assert_int_equal(lp_tensor_scale(w, 1.5f), LP_OK);
  changed(&y, check_fresh(l, make_linear, x));
  assert_int_equal(lp_tensor_axpy(w, 0.5f, w), LP_OK); /* w += w / 2 */
  changed(&y, check_fresh(l, make_linear, x));
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, 99);
  assert_int_equal(lp_tensor_fill_normal(w, &r, 0.0f, 0.2f), LP_OK);
  changed(&y, check_fresh(l, make_linear, x));
  /* a raw write, then lp_tensor_touch */
  for (int64_t i = 0; i < nw; i++)
    w->data[i] = -w->data[i];
  lp_tensor_touch(w);
  changed(&y, check_fresh(l, make_linear, x));

  /* the control: a raw write without lp_tensor_touch is not seen (the
   * forward reads the kept copy), a fresh layer sees it */
  for (int64_t i = 0; i < nw; i++)
    w->data[i] *= 2.0f;
  lp_tensor *stale = fwd(l);
  assert_true(lp_tensor_equal(stale, y));
  lp_tensor_free(stale);
  lp_tensor_touch(w);
  changed(&y, check_fresh(l, make_linear, x));

  free(buf);
  lp_tensor_free(x), lp_tensor_free(y);
  lp_nn_layer_release(l);
}

/* MLA's weights after optimizer steps and a write. */
static void test_mla_routes(void **state) {
  (void)state;
  lp_nn_layer *l = make_mla();
  lp_tensor *x;
  assert_int_equal(lp_tensor_empty(NULL, 3, SH(2, 8, 32), &x), LP_OK);
  fill(x->data, 2 * 8 * 32, 4);
  lp_tensor *y = check_fresh(l, make_mla, x);
  size_t n;
  const lp_nn_param *p = lp_nn_params(l, &n);
  lp_nn_optim *o;
  lp_nn_adamw_opts adam = {0.01f, 0.9f, 0.95f, 1e-8f, 0.1f};
  assert_int_equal(lp_nn_optim_adamw_new(p, n, &adam, &o), LP_OK);
  for (int s = 0; s < 2; s++) {
    set_grads(l, s ? -0.5f : 0.25f);
    assert_int_equal(lp_nn_optim_step(o), LP_OK);
    changed(&y, check_fresh(l, make_mla, x));
  }
  lp_nn_optim_free(o);
  assert_int_equal(lp_tensor_scale(p[0].value, -1.0f), LP_OK);
  changed(&y, check_fresh(l, make_mla, x));
  lp_tensor_free(x), lp_tensor_free(y);
  lp_nn_layer_release(l);
}

/* EPLB placements of an MoE layer: experts moved between slots and
 * replicated (copies), optimizer steps between placements. */
static void test_eplb_routes(void **state) {
  (void)state;
  lp_nn_layer *l = make_moe();
  lp_tensor *x;
  assert_int_equal(lp_tensor_empty(NULL, 2, SH(24, 32), &x), LP_OK);
  fill(x->data, 24 * 32, 5);
  lp_tensor *y = check_fresh(l, make_moe, x);
  /* a redundant slot holding a copy of expert 2, then steps */
  static const int a[5] = {2, 0, 1, 3, 2};
  assert_int_equal(lp_nn_moe_set_placement(l, 5, a), LP_OK);
  lp_tensor *y2 = check_fresh(l, make_moe, x);
  lp_tensor_free(y2);
  size_t n;
  const lp_nn_param *p = lp_nn_params(l, &n);
  lp_nn_optim *o;
  lp_nn_sgd_opts sgd = {0.05f, 0.0f, 0.0f};
  assert_int_equal(lp_nn_optim_sgd_new(p, n, &sgd, &o), LP_OK);
  set_grads(l, 0.125f);
  assert_int_equal(lp_nn_optim_step(o), LP_OK);
  lp_nn_optim_free(o);
  changed(&y, check_fresh(l, make_moe, x));
  /* experts moved to other slots */
  static const int b[4] = {3, 2, 1, 0};
  assert_int_equal(lp_nn_moe_set_placement(l, 4, b), LP_OK);
  y2 = check_fresh(l, make_moe, x);
  lp_tensor_free(y2);
  p = lp_nn_params(l, &n);
  assert_int_equal(lp_nn_optim_sgd_new(p, n, &sgd, &o), LP_OK);
  set_grads(l, -0.25f);
  assert_int_equal(lp_nn_optim_step(o), LP_OK);
  lp_nn_optim_free(o);
  changed(&y, check_fresh(l, make_moe, x));
  lp_tensor_free(x), lp_tensor_free(y);
  lp_nn_layer_release(l);
}

/* ---- packed activations ---- */

typedef struct pass {
  lp_tensor *y, *dx;
  lp_tensor **g; /* parameter gradients */
  size_t n;
  size_t stash; /* lp_nn_ctx_bytes after forward */
  size_t stash_i; /* ... after input_grad */
} pass;

/* Forward, input-grad, weight-grad of l at x (dy from seed 77), from zero
 * gradients. */
static pass run_pass(lp_nn_layer *l, const lp_tensor *x) {
  pass r;
  memset(&r, 0, sizeof r);
  const lp_nn_param *p = lp_nn_params(l, &r.n);
  for (size_t i = 0; i < r.n; i++)
    assert_int_equal(lp_tensor_fill(p[i].grad, 0.0f), LP_OK);
  lp_nn_ctx *ctx;
  assert_int_equal(lp_nn_ctx_new(&ctx), LP_OK);
  assert_int_equal(lp_nn_forward(l, ctx, x, &r.y), LP_OK);
  r.stash = lp_nn_ctx_bytes(ctx);
  lp_tensor *dy;
  assert_int_equal(lp_tensor_empty_like(r.y, &dy), LP_OK);
  fill(dy->data, lp_tensor_numel(dy), 77);
  assert_int_equal(lp_nn_input_grad(l, ctx, dy, &r.dx), LP_OK);
  r.stash_i = lp_nn_ctx_bytes(ctx);
  assert_int_equal(lp_nn_weight_grad(l, ctx, NULL), LP_OK);
  lp_nn_ctx_free(ctx);
  lp_tensor_free(dy);
  r.g = calloc(r.n, sizeof *r.g);
  for (size_t i = 0; i < r.n; i++)
    assert_int_equal(lp_tensor_clone(p[i].grad, &r.g[i]), LP_OK);
  return r;
}

static void pass_free(pass *r) {
  lp_tensor_free(r->y), lp_tensor_free(r->dx);
  for (size_t i = 0; i < r->n; i++)
    lp_tensor_free(r->g[i]);
  free(r->g);
}

/* Packing on and off: bitwise equal results, fewer bytes kept. */
static void same_with_packing(lp_nn_layer *l, const lp_tensor *x, size_t *on_bytes,
                              size_t *off_bytes) {
  lp_nn_bf16_pack_force_off(1);
  pass off = run_pass(l, x);
  lp_nn_bf16_pack_force_off(0);
  pass on = run_pass(l, x);
  assert_true(lp_tensor_equal(on.y, off.y));
  if (off.dx) assert_true(lp_tensor_equal(on.dx, off.dx));
  assert_int_equal(on.n, off.n);
  for (size_t i = 0; i < on.n; i++)
    assert_true(lp_tensor_equal(on.g[i], off.g[i]));
  assert_true(on.stash < off.stash);
  assert_true(on.stash_i < off.stash_i);
  if (on_bytes) *on_bytes = on.stash, off_bytes[0] = off.stash;
  if (on_bytes) on_bytes[1] = on.stash_i, off_bytes[1] = off.stash_i;
  pass_free(&on), pass_free(&off);
}

static void test_packed_layers(void **state) {
  (void)state;
  lp_tensor *x;
  assert_int_equal(lp_tensor_empty(NULL, 3, SH(2, 16, 32), &x), LP_OK);
  fill(x->data, 2 * 16 * 32, 9);
  /* bias-free Linear: x [2,16,32] and dy [2,16,48] kept at half */
  lp_nn_layer *l = make_linear_nobias();
  size_t on[2], off[2];
  same_with_packing(l, x, on, off);
  assert_int_equal(off[0], 2 * 16 * 32 * 4);
  assert_int_equal(on[0], 2 * 16 * 32 * 2);
  assert_int_equal(off[1], (2 * 16 * 32 + 2 * 16 * 48) * 4);
  assert_int_equal(on[1], (2 * 16 * 32 + 2 * 16 * 48) * 2);
  lp_nn_layer_release(l);
  /* with a bias: x packed, dy float32 (its sum is the bias gradient) */
  l = make_linear();
  same_with_packing(l, x, on, off);
  assert_int_equal(on[1], 2 * 16 * 32 * 2 + 2 * 16 * 48 * 4);
  lp_nn_layer_release(l);

  lp_nn_layer *kids[3];
  assert_int_equal(lp_nn_attention_new("att", 32, 4, 3, &kids[0]), LP_OK);
  assert_int_equal(lp_nn_swiglu_new("ffn", 32, 64, 4, &kids[1]), LP_OK);
  assert_int_equal(lp_nn_transformer_block_new("blk", 32, 4, 128, LP_TENSOR_ACT_GELU, 5,
                                               &kids[2]),
                   LP_OK);
  for (int i = 0; i < 3; i++) {
    same_with_packing(bf16(kids[i]), x, NULL, NULL);
    lp_nn_layer_release(kids[i]);
  }
  lp_nn_mla_opts o = lp_nn_mla_defaults();
  o.dim = 32, o.n_heads = 2, o.q_lora_rank = 0, o.kv_lora_rank = 16;
  o.qk_nope_head_dim = 8, o.qk_rope_head_dim = 4, o.v_head_dim = 8;
  assert_int_equal(lp_nn_mla_new("mla", &o, 3, &l), LP_OK);
  lp_nn_bf16_pack_force_off(1);
  pass a = run_pass(bf16(l), x);
  lp_nn_bf16_pack_force_off(0);
  pass b = run_pass(l, x);
  assert_true(lp_tensor_equal(a.y, b.y) && lp_tensor_equal(a.dx, b.dx));
  for (size_t i = 0; i < a.n; i++)
    assert_true(lp_tensor_equal(a.g[i], b.g[i]));
  pass_free(&a), pass_free(&b);
  lp_nn_layer_release(l);
  /* MoE (one rank): the experts' and shared expert's activations */
  lp_tensor *x2;
  assert_int_equal(lp_tensor_reshape(x, 2, SH(32, 32), &x2), LP_OK);
  l = make_moe();
  same_with_packing(l, x2, NULL, NULL);
  lp_nn_layer_release(l);
  lp_tensor_free(x2);
  lp_tensor_free(x);
}

/* ---- lp_tensor_new_bf16 ---- */

static void test_pack(void **state) {
  (void)state;
  lp_tensor *x, *p, *back, *rows, *y;
  assert_int_equal(lp_tensor_empty(NULL, 2, SH(6, 10), &x), LP_OK);
  fill(x->data, 60, 21);
  x->data[7] = NAN;
  x->data[8] = 1e-40f; /* subnormal: rounded like any value */
  assert_int_equal(lp_tensor_new_bf16(x, &p), LP_OK);
  assert_true(lp_tensor_is_bf16(p) && !lp_tensor_is_bf16(x));
  assert_int_equal(lp_tensor_storage_bytes(p), 60 * 2);
  assert_int_equal(lp_tensor_clone(p, &back), LP_OK);
  assert_false(lp_tensor_is_bf16(back));
  for (int i = 0; i < 60; i++) {
    float want = lp_tensor_bf16_round(x->data[i]);
    if (i == 7) assert_true(isnan(back->data[i]));
    else assert_memory_equal(&back->data[i], &want, sizeof want);
  }
  /* a view of rows reads the right values */
  assert_int_equal(lp_tensor_rows(p, 2, 3, &rows), LP_OK);
  const uint16_t *h = lp_tensor_bf16_data(rows);
  for (int i = 0; i < 30; i++)
    assert_int_equal(h[i], lp_tensor_bf16_from_float(x->data[20 + i]));
  /* other ops refuse it */
  assert_int_equal(lp_tensor_empty_like(x, &y), LP_OK);
  assert_int_equal(lp_tensor_add(y, p, x), LP_ERR_ARG);
  assert_int_equal(lp_tensor_fill(p, 1.0f), LP_ERR_ARG);
  assert_int_equal(lp_tensor_copy(p, x), LP_ERR_ARG);
  assert_int_equal(lp_tensor_gemm(y, 1.0f, p, 0, x, 1, 0.0f), LP_ERR_ARG);
  lp_tensor_free(y);
  /* a GEMM at bf16 reads it as the rounding of x */
  lp_tensor *c1, *c2;
  assert_int_equal(lp_tensor_zeros(NULL, 2, SH(6, 6), &c1), LP_OK);
  assert_int_equal(lp_tensor_zeros(NULL, 2, SH(6, 6), &c2), LP_OK);
  x->data[7] = 0.5f;
  lp_tensor_free(p);
  assert_int_equal(lp_tensor_new_bf16(x, &p), LP_OK);
  assert_int_equal(lp_tensor_gemm_prec(c1, 1.0f, p, 0, x, 1, 0.0f, LP_TENSOR_BF16), LP_OK);
  assert_int_equal(lp_tensor_gemm_prec(c2, 1.0f, x, 0, x, 1, 0.0f, LP_TENSOR_BF16), LP_OK);
  assert_true(lp_tensor_equal(c1, c2));
  lp_tensor_free(c1), lp_tensor_free(c2);
  lp_tensor_free(x), lp_tensor_free(p), lp_tensor_free(back), lp_tensor_free(rows);
}

static int engines(void **state) {
  (void)state;
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pack),
      cmocka_unit_test(test_weight_routes),
      cmocka_unit_test(test_mla_routes),
      cmocka_unit_test(test_eplb_routes),
      cmocka_unit_test(test_packed_layers),
  };
  /* both engines: oneDNN where this build and CPU have it, the fallback */
  int fails = cmocka_run_group_tests_name("engine", tests, engines, NULL);
  lp_tensor_bf16_force_fallback(1);
  fails += cmocka_run_group_tests_name("fallback", tests, engines, NULL);
  lp_tensor_bf16_force_fallback(0);
  return fails;
}
