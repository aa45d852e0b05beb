/* reference.c — lp_exec_reference_step: the single-process, no-pipeline
 * training step the executor is checked against (see lp_exec.h). */
#include "lp_exec.h"

#include <math.h>

/* torch.nn.utils.clip_grad_norm_ over every parameter of model: *norm the
 * norm before clipping; gradients scaled by min(1, clip / (norm + 1e-6)). */
static lp_status clip_grads(lp_nn_layer *model, float clip, double *norm) {
  size_t np;
  const lp_nn_param *p = lp_nn_params(model, &np);
  double sum = 0;
  for (size_t i = 0; i < np; i++) {
    double d = 0;
    LP_CHECK(lp_tensor_dot(p[i].grad, p[i].grad, &d));
    sum += d;
  }
  *norm = sqrt(sum);
  double coef = (double)clip / (*norm + 1e-6);
  if (coef < 1.0)
    for (size_t i = 0; i < np; i++) LP_CHECK(lp_tensor_scale(p[i].grad, (float)coef));
  return LP_OK;
}

lp_status lp_exec_reference_step(lp_nn_layer *model, lp_nn_optim *optim,
                                 lp_nn_loss_kind loss_kind, int M,
                                 lp_exec_data_fn data, void *ud, int64_t step,
                                 double *loss, char *err) {
  return lp_exec_reference_step_clip(model, optim, loss_kind, M, data, ud, step, 0, loss,
                                     NULL, err);
}

lp_status lp_exec_reference_step_clip(lp_nn_layer *model, lp_nn_optim *optim,
                                      lp_nn_loss_kind loss_kind, int M,
                                      lp_exec_data_fn data, void *ud, int64_t step,
                                      float clip, double *loss, double *gnorm,
                                      char *err) {
  if (gnorm) *gnorm = -1;
  if (!(clip >= 0) || isinf(clip)) {
    lp_errf(err, "gradient clipping at %g: it takes a positive finite norm (0: off)",
            (double)clip);
    return LP_ERR_ARG;
  }
  if (!model || !optim || !data || M < 1) {
    lp_errf(err, "reference step: model, optimizer, data and M >= 1 are required");
    return LP_ERR_ARG;
  }
  lp_status st = lp_nn_optim_zero_grad(optim);
  if (st != LP_OK) return st;
  LP_CHECK(lp_nn_set_loss_scale(model, 1.0f / (float)M)); /* balance losses: means too */
  lp_nn_ctx *ctx = NULL;
  LP_CHECK(lp_nn_ctx_new(&ctx));
  double sum = 0;
  for (int mb = 0; mb < M; mb++) {
    lp_tensor *x = NULL, *tg = NULL, *y = NULL, *dy = NULL;
    char derr[LP_ERRLEN] = "";
    st = data(ud, step, mb, &x, &tg, derr);
    if (st != LP_OK || !x || !tg) {
      lp_errf(err, "reference step: data for micro-batch %d of step %lld: %s", mb,
              (long long)step, *derr ? derr : lp_strerror(st ? st : LP_ERR_ARG));
      if (st == LP_OK) st = LP_ERR_ARG;
      goto next;
    }
    st = lp_nn_forward(model, ctx, x, &y);
    if (st != LP_OK) {
      lp_errf(err, "reference step: forward of micro-batch %d: %s", mb,
              lp_nn_ctx_last_error(ctx));
      goto next;
    }
    double l = 0;
    st = lp_nn_loss(loss_kind, y, tg, 1.0f / (float)M, &l, &dy);
    if (st != LP_OK) {
      lp_errf(err, "reference step: loss of micro-batch %d failed (%s)", mb, lp_strerror(st));
      goto next;
    }
    sum += l;
    st = lp_nn_backward(model, ctx, dy, NULL);
    if (st != LP_OK)
      lp_errf(err, "reference step: backward of micro-batch %d: %s", mb,
              lp_nn_ctx_last_error(ctx));
  next:
    lp_nn_ctx_clear(ctx);
    lp_tensor_free(x);
    lp_tensor_free(tg);
    lp_tensor_free(y);
    lp_tensor_free(dy);
    if (st != LP_OK) {
      lp_nn_ctx_free(ctx);
      return st;
    }
  }
  lp_nn_ctx_free(ctx);
  if (clip > 0) {
    double n = 0;
    LP_CHECK(clip_grads(model, clip, &n));
    if (gnorm) *gnorm = n;
  }
  /* this step's expert loads: an expert no token reached has no
   * gradient (grad None in torch), and the optimizer leaves it alone */
  int nm = lp_nn_moe_count(model);
  size_t nl = 0, np = 0;
  lp_nn_params(model, &np);
  for (int i = 0; i < nm; i++) nl += (size_t)lp_nn_moe_get_opts(lp_nn_moe_find(model, i))->experts;
  int64_t *loads = lp_malloc((nl ? nl : 1) * sizeof *loads);
  unsigned char *skip = lp_malloc(np ? np : 1);
  st = loads && skip ? LP_OK : LP_ERR_NOMEM;
  for (int i = 0, off = 0; i < nm && st == LP_OK; i++) {
    lp_nn_layer *m = lp_nn_moe_find(model, i);
    st = lp_nn_moe_expert_load(m, loads + off);
    off += lp_nn_moe_get_opts(m)->experts;
  }
  /* (an optimizer over another list than the model's: no mask) */
  int masked = nm > 0 && lp_nn_optim_count(optim) == np;
  if (st == LP_OK && masked) st = lp_nn_unrouted_mask(model, loads, skip, np);
  if (st == LP_OK) st = lp_nn_optim_step_masked(optim, masked ? skip : NULL);
  /* MoE router biases from this step's expert loads (as the executor does
   * with the loads summed over the ranks) */
  for (int i = 0, off = 0; i < nm && st == LP_OK; i++) {
    lp_nn_layer *m = lp_nn_moe_find(model, i);
    st = lp_nn_moe_update_bias(m, loads + off);
    lp_nn_moe_load_reset(m);
    off += lp_nn_moe_get_opts(m)->experts;
  }
  lp_free(loads);
  lp_free(skip);
  if (st != LP_OK) return st;
  if (loss) *loss = sum / M;
  return LP_OK;
}
