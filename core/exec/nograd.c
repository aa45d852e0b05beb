/* nograd.c — the optimizer step of a virtual stage as torch takes it when
 * some parameters have no gradient: a routed expert that no rank routed a
 * token to in this step (in any micro-batch, on any copy of its stage, in
 * any of its slots: e->moe.counts, the world's sum, which ep.c makes
 * before the step) is left alone (lp_nn_optim_step_masked: no decay, no
 * moment update, its step count stays). It only reads e->moe; the mask is
 * built per step and freed. */
#include "exec_internal.h"

lp_status ex_optim_step(lp_exec *e, int li) {
  vst *vs = &e->vs[li];
  int nm = lp_nn_moe_count(vs->chunk);
  size_t np = 0;
  lp_nn_params(vs->chunk, &np);
  /* ZeRO-1's optimizer holds shards, not the chunk's list: no mask */
  if (nm == 0 || !e->moe.total || lp_nn_optim_count(vs->optim) != np ||
      (e->dpr.on && e->o.zero))
    return lp_nn_optim_step(vs->optim);
  size_t off = e->moe.off[vs->stage], nl = 0;
  for (int i = 0; i < nm; i++) nl += (size_t)lp_nn_moe_get_opts(lp_nn_moe_find(vs->chunk, i))->experts;
  int64_t *loads = lp_malloc((nl ? nl : 1) * sizeof *loads);
  unsigned char *skip = lp_malloc(np ? np : 1);
  lp_status st = loads && skip ? LP_OK : LP_ERR_NOMEM;
  if (st == LP_OK) {
    for (size_t x = 0; x < nl; x++) loads[x] = (int64_t)(e->moe.counts[off + x] + 0.5);
    st = lp_nn_unrouted_mask(vs->chunk, loads, skip, np);
  }
  if (st == LP_OK) st = lp_nn_optim_step_masked(vs->optim, skip);
  lp_free(loads);
  lp_free(skip);
  return st;
}
