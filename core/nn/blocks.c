/* blocks.c — composite builders: the residual MLP block and the pre-norm
 * transformer blocks (dense MLP or MoE), made of the public layers. */
#include "nn_internal.h"

#include <stdio.h>

/* "<name>.<suffix>" into buf. */
static const char *sub(char *buf, size_t n, const char *name,
                       const char *suffix) {
  snprintf(buf, n, "%s%s%s", name ? name : "", name && name[0] ? "." : "",
           suffix);
  return buf;
}

/* Releases n layers (NULLs allowed). */
static void release_all(lp_nn_layer **ls, size_t n) {
  for (size_t i = 0; i < n; i++)
    lp_nn_layer_release(ls[i]);
}

lp_status lp_nn_mlp_block_new(const char *name, int64_t d_model,
                              int64_t d_hidden, lp_tensor_act_kind act,
                              uint64_t seed, lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  if (d_model < 1 || d_hidden < 1) return LP_ERR_ARG;
  char buf[LP_ERRLEN];
  lp_nn_layer *ls[4] = {NULL, NULL, NULL, NULL}, *seq = NULL;
  lp_status st;
  LP_CHECK_GOTO(lp_nn_rmsnorm_new(sub(buf, sizeof buf, name, "norm"), d_model,
                                  1e-5f, &ls[0]),
                st, done);
  LP_CHECK_GOTO(lp_nn_linear_new(sub(buf, sizeof buf, name, "fc1"), d_model,
                                 d_hidden, 1, seed, &ls[1]),
                st, done);
  LP_CHECK_GOTO(lp_nn_act_new(sub(buf, sizeof buf, name, "act"), act, &ls[2]),
                st, done);
  LP_CHECK_GOTO(lp_nn_linear_new(sub(buf, sizeof buf, name, "fc2"), d_hidden,
                                 d_model, 1, seed, &ls[3]),
                st, done);
  LP_CHECK_GOTO(
      lp_nn_chunk_new(sub(buf, sizeof buf, name, "inner"), ls, 4, &seq), st,
      done);
  st = lp_nn_residual_new(name, seq, layer);
done:
  release_all(ls, 4);
  lp_nn_layer_release(seq);
  return st;
}

/* x + inner(rmsnorm(x)) as "<name>.<res>" with the norm "<name>.<norm>"
 * and the chunk "<name>.<res_inner>". Takes a new reference to inner. */
static lp_status prenorm_residual(const char *name, const char *norm,
                                  const char *inner_name, const char *res,
                                  int64_t d_model, lp_nn_layer *inner,
                                  lp_nn_layer **out) {
  char buf[LP_ERRLEN];
  lp_nn_layer *a[2] = {NULL, lp_nn_layer_retain(inner)}, *seq = NULL;
  lp_status st;
  LP_CHECK_GOTO(
      lp_nn_rmsnorm_new(sub(buf, sizeof buf, name, norm), d_model, 1e-5f, &a[0]),
      st, done);
  LP_CHECK_GOTO(
      lp_nn_chunk_new(sub(buf, sizeof buf, name, inner_name), a, 2, &seq), st,
      done);
  st = lp_nn_residual_new(sub(buf, sizeof buf, name, res), seq, out);
done:
  release_all(a, 2);
  lp_nn_layer_release(seq);
  return st;
}

/* The attention half of a pre-norm block: x + attn(rmsnorm(x)). */
static lp_status attn_residual(const char *name, int64_t d_model,
                               int64_t n_heads, uint64_t seed,
                               lp_nn_layer **out) {
  char buf[LP_ERRLEN];
  lp_nn_layer *attn = NULL;
  LP_CHECK(lp_nn_attention_new(sub(buf, sizeof buf, name, "attn"), d_model,
                               n_heads, seed, &attn));
  lp_status st = prenorm_residual(name, "attn_norm", "attn_inner", "attn_res",
                                  d_model, attn, out);
  lp_nn_layer_release(attn);
  return st;
}

lp_status lp_nn_transformer_block_new(const char *name, int64_t d_model,
                                      int64_t n_heads, int64_t d_hidden,
                                      lp_tensor_act_kind act, uint64_t seed,
                                      lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  char buf[LP_ERRLEN];
  lp_nn_layer *b[2] = {NULL, NULL};
  lp_status st;
  LP_CHECK_GOTO(attn_residual(name, d_model, n_heads, seed, &b[0]), st, done);
  LP_CHECK_GOTO(lp_nn_mlp_block_new(sub(buf, sizeof buf, name, "mlp"), d_model,
                                    d_hidden, act, seed, &b[1]),
                st, done);
  st = lp_nn_chunk_new(name, b, 2, layer);
done:
  release_all(b, 2);
  return st;
}

lp_status lp_nn_moe_block_new(const char *name, int64_t n_heads,
                              const lp_nn_moe_opts *o, uint64_t seed,
                              lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  if (!o) return LP_ERR_ARG;
  char buf[LP_ERRLEN];
  lp_nn_layer *b[2] = {NULL, NULL}, *moe = NULL;
  lp_status st;
  LP_CHECK_GOTO(attn_residual(name, o->dim, n_heads, seed, &b[0]), st, done);
  LP_CHECK_GOTO(lp_nn_moe_new(sub(buf, sizeof buf, name, "moe"), o, seed, &moe),
                st, done);
  LP_CHECK_GOTO(prenorm_residual(name, "moe_norm", "moe_inner", "moe_res",
                                 o->dim, moe, &b[1]),
                st, done);
  st = lp_nn_chunk_new(name, b, 2, layer);
done:
  release_all(b, 2);
  lp_nn_layer_release(moe);
  return st;
}
