/* test_cuda_mla.c — DeepSeek-V3's dense layers on the GPU: the rope
 * kernel against the CPU loop (forward and conj, strided heads), then MLA
 * (with and without the query LoRA, with YaRN) and SwiGLU built twice
 * with one seed, one moved to cuda:0: output, input gradient and every
 * parameter gradient compared by relative error. Exits 77 without CUDA or
 * a device. */
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

static void test_rope(void) {
  const lp_tensor_backend *C = lp_tensor_backend_cpu();
  enum { R = 37, SEQ = 13, HEADS = 3, D = 8, HS = 11, LD = 40 };
  float *cs = twin_rand(SEQ * D, -1, 1), *x = twin_rand(R * LD, -2, 2);
  for (int conj = 0; conj < 2; conj++) {
    float *want = twin_copy(x, R * LD);
    twin_status("cpu rope", C->rope(C, R, SEQ, HEADS, D, LD, HS, cs, conj, want));
    float *dcs = twin_up(G, cs, sizeof(float) * SEQ * D);
    float *dx = twin_up(G, x, sizeof(float) * R * LD);
    twin_status("gpu rope", G->rope(G, R, SEQ, HEADS, D, LD, HS, dcs, conj, dx));
    float *got = twin_down(G, dx, sizeof(float) * R * LD);
    twin_check(conj ? "rope (conj)" : "rope", got, want, R * LD, 1e-6);
    G->free(G, dcs), G->free(G, dx);
    lp_free(want), lp_free(got);
  }
  lp_free(cs), lp_free(x);
}

static void twin_layer(const char *tag, lp_nn_layer *cpu, lp_nn_layer *gpu,
                       const int64_t *shape) {
  twin_status("layer_to", lp_nn_layer_to(gpu, G));
  int64_t n = shape[0] * shape[1] * shape[2];
  float *xh = twin_rand((size_t)n, -1, 1), *dyh = twin_rand((size_t)n, -1, 1);
  lp_tensor *x = NULL, *dy = NULL, *xg = NULL, *dyg = NULL;
  twin_status("x", lp_tensor_from_data(NULL, 3, shape, xh, &x));
  twin_status("dy", lp_tensor_from_data(NULL, 3, shape, dyh, &dy));
  twin_status("xg", lp_tensor_from_data(G, 3, shape, xh, &xg));
  twin_status("dyg", lp_tensor_from_data(G, 3, shape, dyh, &dyg));
  lp_nn_layer *ls[2] = {cpu, gpu};
  lp_tensor *xs[2] = {x, xg}, *dys[2] = {dy, dyg}, *y[2] = {0}, *dx[2] = {0};
  for (int k = 0; k < 2; k++) {
    lp_nn_ctx *c = NULL;
    twin_status("ctx", lp_nn_ctx_new(&c));
    twin_status("forward", lp_nn_forward(ls[k], c, xs[k], &y[k]));
    twin_status("input_grad", lp_nn_input_grad(ls[k], c, dys[k], &dx[k]));
    twin_status("weight_grad", lp_nn_weight_grad(ls[k], c, NULL));
    if (lp_nn_ctx_last_error(c)[0]) printf("     %s\n", lp_nn_ctx_last_error(c));
    lp_nn_ctx_free(c);
  }
  char what[128];
  snprintf(what, sizeof what, "%s output", tag);
  if (y[0] && y[1]) check_tensor(what, y[1], y[0], 1e-5);
  snprintf(what, sizeof what, "%s dx", tag);
  if (dx[0] && dx[1]) check_tensor(what, dx[1], dx[0], 1e-4);
  size_t nc, ng;
  const lp_nn_param *pc = lp_nn_params(cpu, &nc), *pg = lp_nn_params(gpu, &ng);
  for (size_t i = 0; i < nc && i < ng; i++) {
    snprintf(what, sizeof what, "%s %s.grad", tag, pc[i].name);
    check_tensor(what, pg[i].grad, pc[i].grad, 1e-4);
  }
  for (int k = 0; k < 2; k++) lp_tensor_free(y[k]), lp_tensor_free(dx[k]);
  lp_tensor_free(x), lp_tensor_free(dy), lp_tensor_free(xg), lp_tensor_free(dyg);
  lp_free(xh), lp_free(dyh);
}

int main(void) {
  G = twin_device_or_skip();
  lp_tensor_rng_seed(&twin_rng, 78);
  test_rope();
  for (int lora = 0; lora < 2; lora++) {
    lp_nn_mla_opts o = lp_nn_mla_defaults();
    o.dim = 64, o.n_heads = 4, o.q_lora_rank = lora ? 48 : 0;
    o.kv_lora_rank = 32, o.qk_nope_head_dim = 16, o.qk_rope_head_dim = 8;
    o.v_head_dim = 16, o.max_seq_len = 8192, o.original_seq_len = 4096;
    o.rope_factor = 40, o.mscale = 0.707;
    lp_nn_layer *a = NULL, *b = NULL;
    twin_status("mla", lp_nn_mla_new("attn", &o, 3, &a));
    twin_status("mla", lp_nn_mla_new("attn", &o, 3, &b));
    if (a && b)
      twin_layer(lora ? "mla (q lora, yarn)" : "mla (wq, yarn)", a, b,
                 (int64_t[]){3, 29, 64});
    lp_nn_layer_release(a), lp_nn_layer_release(b);
  }
  lp_nn_layer *a = NULL, *b = NULL;
  twin_status("swiglu", lp_nn_swiglu_new("ffn", 64, 96, 3, &a));
  twin_status("swiglu", lp_nn_swiglu_new("ffn", 64, 96, 3, &b));
  if (a && b) twin_layer("swiglu", a, b, (int64_t[]){3, 29, 64});
  lp_nn_layer_release(a), lp_nn_layer_release(b);
  printf("%d failure(s)\n", twin_failures);
  return twin_failures ? 1 : 0;
}
