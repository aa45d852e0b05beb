/* test_cuda_nn.c — layer gradient checks on the GPU: the same models (same
 * seeds) on the CPU and, after lp_nn_layer_to, on cuda:0; losses, logits,
 * input and parameter gradients and optimizer steps compared by relative
 * error (a dense LM, an LM with an MoE block, an MLP); a directional
 * finite-difference check of the GPU gradients; the
 * device-mismatch error text. Exits 77 without CUDA or a device. */
#include "gpu_twin.h"
#include "lp_nn.h"

static const lp_tensor_backend *G;

static void check_tensor(const char *what, const lp_tensor *got,
                         const lp_tensor *want, double tol) {
  lp_tensor *g = NULL, *w = NULL;
  twin_status("to_host", lp_tensor_to_host(got, &g));
  twin_status("to_host", lp_tensor_to_host(want, &w));
  if (g && w) twin_check(what, g->data, w->data, (size_t)lp_tensor_numel(w), tol);
  lp_tensor_free(g), lp_tensor_free(w);
}

static void check_params(const char *tag, lp_nn_layer *gpu, lp_nn_layer *cpu,
                         int grads, double tol) {
  size_t ng, nc;
  const lp_nn_param *pg = lp_nn_params(gpu, &ng), *pc = lp_nn_params(cpu, &nc);
  for (size_t i = 0; i < nc && i < ng; i++) {
    char what[128];
    snprintf(what, sizeof what, "%s %s%s", tag, pc[i].name, grads ? ".grad" : "");
    check_tensor(what, grads ? pg[i].grad : pg[i].value,
                 grads ? pc[i].grad : pc[i].value, tol);
  }
}

/* One forward + backward: *loss and, when out != NULL, the output. */
static lp_status step(lp_nn_layer *m, int ce, const lp_tensor *x,
                      const lp_tensor *target, double *loss, lp_tensor **out,
                      int backward) {
  lp_nn_ctx *ctx = NULL;
  lp_tensor *y = NULL, *dy = NULL, *dx = NULL;
  LP_CHECK(lp_nn_ctx_new(&ctx));
  lp_status st = lp_nn_forward(m, ctx, x, &y);
  if (st == LP_OK)
    st = ce ? lp_nn_loss_cross_entropy(y, target, 1.0f, loss, backward ? &dy : NULL)
            : lp_nn_loss_mse(y, target, 1.0f, loss, backward ? &dy : NULL);
  if (st == LP_OK && backward) st = lp_nn_backward(m, ctx, dy, &dx);
  if (st != LP_OK) printf("     step: %s\n", lp_nn_ctx_last_error(ctx));
  if (out) *out = y;
  else lp_tensor_free(y);
  lp_tensor_free(dy), lp_tensor_free(dx);
  lp_nn_ctx_free(ctx);
  return st;
}

/* loss(θ + e d) - loss(θ - e d) over 2e against Σ grad · d, with d a
 * random N(0, 1) direction over every parameter (made on the GPU) and
 * e = 1e-3: the loss difference is then ~1e-3 of the loss, far above its
 * float32 rounding (~1e-6), and the curvature term is negligible. */
static void fd_check(const char *tag, lp_nn_layer *m, int ce, const lp_tensor *x,
                     const lp_tensor *target) {
  size_t n;
  const lp_nn_param *p = lp_nn_params(m, &n);
  lp_tensor **dir = lp_calloc(n, sizeof *dir);
  lp_tensor_rng r;
  lp_tensor_rng_seed(&r, 99);
  double gd = 0.0, lp_plus = 0, lp_minus = 0, e = 1e-3;
  for (size_t i = 0; i < n; i++) {
    twin_status("dir", lp_tensor_empty_like(p[i].value, &dir[i]));
    twin_status("dir", lp_tensor_fill_normal(dir[i], &r, 0.0f, 1.0f));
    lp_tensor *hg = NULL, *hd = NULL;
    lp_tensor_to_host(p[i].grad, &hg);
    lp_tensor_to_host(dir[i], &hd);
    double dot = 0;
    lp_tensor_dot(hg, hd, &dot);
    gd += dot;
    lp_tensor_free(hg), lp_tensor_free(hd);
  }
  for (size_t i = 0; i < n; i++) lp_tensor_axpy(p[i].value, (float)e, dir[i]);
  twin_status("fd +", step(m, ce, x, target, &lp_plus, NULL, 0));
  for (size_t i = 0; i < n; i++) lp_tensor_axpy(p[i].value, (float)(-2 * e), dir[i]);
  twin_status("fd -", step(m, ce, x, target, &lp_minus, NULL, 0));
  for (size_t i = 0; i < n; i++) {
    lp_tensor_axpy(p[i].value, (float)e, dir[i]);
    lp_tensor_free(dir[i]);
  }
  lp_free(dir);
  double fd = (lp_plus - lp_minus) / (2 * e);
  double rel = fabs(fd - gd) / fmax(fabs(gd), 1e-12);
  int ok = rel < 2e-2 && !isnan(fd);
  printf("%-4s %s directional derivative: finite difference %.6g, grad.d %.6g (rel %.2g)\n",
         ok ? "ok" : "FAIL", tag, fd, gd, rel);
  if (!ok) twin_failures++;
}

static void twin_model(const char *tag, lp_nn_layer *(*build)(void), int ce,
                       lp_tensor *x, lp_tensor *target, int adamw) {
  lp_nn_layer *cpu = build(), *gpu = build();
  twin_status("layer_to", lp_nn_layer_to(gpu, G));
  size_t np;
  const lp_nn_param *pp = lp_nn_params(gpu, &np);
  int moved = np && lp_tensor_backend_of(pp[0].value) == G &&
              lp_tensor_backend_of(pp[np - 1].grad) == G;
  printf("%-4s %s: %zu parameters on %s\n", moved ? "ok" : "FAIL", tag, np,
         np ? lp_tensor_backend_of(pp[0].value)->name : "?");
  if (!moved) twin_failures++;
  /* x on the device unless it is token ids (those may stay on the host) */
  lp_tensor *xg = NULL;
  if (ce) {
    twin_status("view", lp_tensor_view(x, &xg));
  } else {
    twin_status("x", lp_tensor_empty(G, x->ndim, x->shape, &xg));
    twin_status("x", lp_tensor_copy(xg, x));
  }
  double lc = 0, lg = 0;
  lp_tensor *yc = NULL, *yg = NULL;
  twin_status("cpu step", step(cpu, ce, x, target, &lc, &yc, 1));
  twin_status("gpu step", step(gpu, ce, xg, target, &lg, &yg, 1));
  char what[96];
  snprintf(what, sizeof what, "%s output", tag);
  if (yc && yg) check_tensor(what, yg, yc, 1e-4);
  snprintf(what, sizeof what, "%s loss", tag);
  twin_check_d(what, &lg, &lc, 1, 1e-5);
  check_params(tag, gpu, cpu, 1, 1e-3);
  fd_check(tag, gpu, ce, xg, target);
  /* three optimizer steps on both */
  size_t nc;
  const lp_nn_param *pc = lp_nn_params(cpu, &nc);
  lp_nn_optim *oc = NULL, *og = NULL;
  if (adamw) {
    lp_nn_adamw_opts a = {1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f};
    twin_status("adamw", lp_nn_optim_adamw_new(pc, nc, &a, &oc));
    twin_status("adamw", lp_nn_optim_adamw_new(pp, np, &a, &og));
  } else {
    lp_nn_sgd_opts s = {0.05f, 0.9f, 1e-4f};
    twin_status("sgd", lp_nn_optim_sgd_new(pc, nc, &s, &oc));
    twin_status("sgd", lp_nn_optim_sgd_new(pp, np, &s, &og));
  }
  for (int it = 0; it < 3 && oc && og; it++) {
    if (it) {
      lp_nn_optim_zero_grad(oc), lp_nn_optim_zero_grad(og);
      twin_status("cpu step", step(cpu, ce, x, target, &lc, NULL, 1));
      twin_status("gpu step", step(gpu, ce, xg, target, &lg, NULL, 1));
    }
    twin_status("cpu optim", lp_nn_optim_step(oc));
    twin_status("gpu optim", lp_nn_optim_step(og));
  }
  snprintf(what, sizeof what, "%s after 3 %s steps", tag, adamw ? "AdamW" : "SGD");
  /* AdamW's first steps move each weight by ~lr * sign(grad): a grad
   * within rounding of 0 may take the other sign on the GPU, hence 1e-3 */
  check_params(what, gpu, cpu, 0, adamw ? 1e-3 : 1e-4);
  /* optimizer state export goes through the device copies */
  size_t ns = lp_nn_optim_state_numel(og);
  float *sg = lp_malloc(ns * sizeof *sg), *sc = lp_malloc(ns * sizeof *sc);
  twin_status("export", lp_nn_optim_state_export(og, sg, ns, NULL));
  twin_status("export", lp_nn_optim_state_export(oc, sc, ns, NULL));
  snprintf(what, sizeof what, "%s optimizer state", tag);
  twin_check(what, sg, sc, ns, 1e-3);
  lp_free(sg), lp_free(sc);
  lp_nn_optim_free(oc), lp_nn_optim_free(og);
  lp_tensor_free(yc), lp_tensor_free(yg), lp_tensor_free(xg);
  lp_nn_layer_release(cpu), lp_nn_layer_release(gpu);
}

enum { V = 37, D = 32, H = 4, B = 3, T = 11 };

static lp_nn_layer *build_lm(void) {
  lp_nn_layer *l[4] = {NULL}, *chunk = NULL;
  lp_nn_embedding_new("emb", V, D, 7, &l[0]);
  lp_nn_transformer_block_new("blk", D, H, 2 * D, LP_TENSOR_ACT_GELU, 7, &l[1]);
  lp_nn_rmsnorm_new("norm", D, 1e-5f, &l[2]);
  lp_nn_linear_new("head", D, V, 0, 7, &l[3]);
  lp_nn_chunk_new("lm", l, 4, &chunk);
  for (int i = 0; i < 4; i++) lp_nn_layer_release(l[i]);
  return chunk;
}

/* The LM with an MoE block (sigmoid router, expert groups, a shared
 * expert, the balance loss): the routing decisions are made on the host
 * from the affinities read back, everything row-sized on the GPU. */
static lp_nn_layer *build_moe_lm(void) {
  lp_nn_layer *l[4] = {NULL}, *chunk = NULL;
  lp_nn_moe_opts o = {0};
  o.dim = D, o.hidden = 24, o.experts = 4, o.topk = 2, o.groups = 2;
  o.topk_groups = 1, o.shared = 1, o.route_scale = 1.5f, o.balance_alpha = 0.01f;
  lp_nn_embedding_new("emb", V, D, 7, &l[0]);
  lp_nn_moe_block_new("blk", H, &o, 7, &l[1]);
  lp_nn_rmsnorm_new("norm", D, 1e-5f, &l[2]);
  lp_nn_linear_new("head", D, V, 0, 7, &l[3]);
  lp_nn_chunk_new("moe_lm", l, 4, &chunk);
  for (int i = 0; i < 4; i++) lp_nn_layer_release(l[i]);
  return chunk;
}

static lp_nn_layer *build_mlp(void) {
  lp_nn_layer *l[4] = {NULL}, *chunk = NULL;
  lp_nn_linear_new("in", 8, 16, 1, 3, &l[0]);
  lp_nn_act_new("act", LP_TENSOR_ACT_SILU, &l[1]);
  lp_nn_mlp_block_new("mlp", 16, 32, LP_TENSOR_ACT_SILU, 3, &l[2]);
  lp_nn_linear_new("out", 16, 4, 1, 3, &l[3]);
  lp_nn_chunk_new("mlp_net", l, 4, &chunk);
  for (int i = 0; i < 4; i++) lp_nn_layer_release(l[i]);
  return chunk;
}

static void test_mismatch(void) {
  lp_nn_layer *lin = NULL;
  lp_nn_ctx *ctx = NULL;
  lp_tensor *x = NULL, *y = NULL;
  lp_nn_linear_new("fc", 4, 3, 1, 1, &lin);
  lp_nn_layer_to(lin, G);
  lp_nn_ctx_new(&ctx);
  lp_tensor_zeros(NULL, 2, (int64_t[]){2, 4}, &x);
  lp_status st = lp_nn_forward(lin, ctx, x, &y);
  const char *msg = lp_nn_ctx_last_error(ctx);
  int ok = st == LP_ERR_ARG && strstr(msg, "cuda:0") && strstr(msg, "cpu");
  printf("%-4s mixing devices: \"%s\"\n", ok ? "ok" : "FAIL", msg);
  if (!ok) twin_failures++;
  lp_nn_ctx_free(ctx), lp_tensor_free(x), lp_tensor_free(y);
  lp_nn_layer_release(lin);
}

int main(void) {
  G = twin_device_or_skip();
  lp_tensor_rng_seed(&twin_rng, 77);
  float ids[B * T], tg[B * T];
  for (int i = 0; i < B * T; i++) {
    ids[i] = (float)(lp_tensor_rng_next(&twin_rng) % V);
    tg[i] = (float)(lp_tensor_rng_next(&twin_rng) % V);
  }
  lp_tensor *x = NULL, *t = NULL;
  lp_tensor_from_data(NULL, 2, (int64_t[]){B, T}, ids, &x);
  lp_tensor_from_data(NULL, 1, (int64_t[]){B * T}, tg, &t);
  twin_model("lm", build_lm, 1, x, t, 1);
  twin_model("moe lm", build_moe_lm, 1, x, t, 1);
  lp_tensor_free(x), lp_tensor_free(t);

  float *xm = twin_rand(24 * 8, -1, 1), *tm = twin_rand(24 * 4, -1, 1);
  lp_tensor_from_data(NULL, 2, (int64_t[]){24, 8}, xm, &x);
  lp_tensor_from_data(NULL, 2, (int64_t[]){24, 4}, tm, &t);
  twin_model("mlp", build_mlp, 0, x, t, 0);
  lp_tensor_free(x), lp_tensor_free(t), lp_free(xm), lp_free(tm);

  test_mismatch();
  printf("%d failure(s)\n", twin_failures);
  return twin_failures ? 1 : 0;
}
