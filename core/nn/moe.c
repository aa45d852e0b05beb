/* moe.c — the mixture-of-experts layer (work in progress: API only). */
#include "nn_internal.h"

void nn_moe_free(struct nn_moe *m) { (void)m; }

lp_status lp_nn_moe_new(const char *name, const lp_nn_moe_opts *o,
                        uint64_t seed, lp_nn_layer **layer) {
  (void)name, (void)o, (void)seed;
  if (layer) *layer = NULL;
  return LP_ERR_UNSUPPORTED;
}
lp_status lp_nn_moe_block_new(const char *name, int64_t n_heads,
                              const lp_nn_moe_opts *o, uint64_t seed,
                              lp_nn_layer **layer) {
  (void)name, (void)n_heads, (void)o, (void)seed;
  if (layer) *layer = NULL;
  return LP_ERR_UNSUPPORTED;
}
lp_status lp_nn_set_ep(lp_nn_layer *l, const lp_nn_ep *ep) {
  (void)l, (void)ep;
  return LP_OK;
}
lp_status lp_nn_moe_set_placement(lp_nn_layer *moe, int slots_per_rank,
                                  const int *phys_to_log) {
  (void)moe, (void)slots_per_rank, (void)phys_to_log;
  return LP_ERR_UNSUPPORTED;
}
lp_status lp_nn_moe_slot_params(lp_nn_layer *moe, int slot,
                                const lp_nn_param **out, int *n) {
  (void)moe, (void)slot, (void)out, (void)n;
  return LP_ERR_UNSUPPORTED;
}
int lp_nn_moe_slots_per_rank(const lp_nn_layer *moe) { (void)moe; return 0; }
lp_status lp_nn_moe_placement(const lp_nn_layer *moe, int *phys_to_log) {
  (void)moe, (void)phys_to_log;
  return LP_ERR_UNSUPPORTED;
}
const lp_nn_moe_opts *lp_nn_moe_get_opts(const lp_nn_layer *moe) {
  (void)moe;
  return NULL;
}
lp_status lp_nn_moe_expert_load(const lp_nn_layer *moe, int64_t *counts) {
  (void)moe, (void)counts;
  return LP_ERR_UNSUPPORTED;
}
void lp_nn_moe_load_reset(lp_nn_layer *moe) { (void)moe; }
lp_status lp_nn_moe_update_bias(lp_nn_layer *moe, const int64_t *c) {
  (void)moe, (void)c;
  return LP_ERR_UNSUPPORTED;
}
lp_status lp_nn_moe_get_bias(const lp_nn_layer *moe, float *bias) {
  (void)moe, (void)bias;
  return LP_ERR_UNSUPPORTED;
}
lp_status lp_nn_moe_set_bias(lp_nn_layer *moe, const float *bias) {
  (void)moe, (void)bias;
  return LP_ERR_UNSUPPORTED;
}
double lp_nn_moe_aux_loss(const lp_nn_layer *moe) { (void)moe; return 0; }
int lp_nn_moe_count(const lp_nn_layer *l) { (void)l; return 0; }
lp_nn_layer *lp_nn_moe_find(const lp_nn_layer *l, int i) {
  (void)l, (void)i;
  return NULL;
}
