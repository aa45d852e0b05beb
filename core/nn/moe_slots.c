/* moe_slots.c — the MoE layer's slots (see lp_nn.h): its constructor and
 * parameter list (router, shared expert, then w1, w3, w2 of each expert
 * slot this rank holds), placements (which slot holds which logical
 * expert, the replica lists the dispatch reads), the EP group, the bias and
 * load API and the parameters' roles. A placement is decided by identity:
 * the placement in force says which expert each old slot held, and a slot
 * that keeps its expert keeps its tensors. */
#include "moe_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void moe_free(void *p) {
  nn_moe *m = p;
  if (!m) return;
  lp_free(m->bias), lp_free(m->load), lp_free(m->p2l);
  lp_free(m->rep_start), lp_free(m->rep_slots);
  lp_free(m);
}

/* ---- parameters and placement ---- */

/* A new owned [r, c] param "<layer>.<suffix>" ~ N(0, std) from (seed,
 * name), zero grad. */
static lp_status make_param(const lp_nn_layer *l, const char *suffix,
                            int64_t r, int64_t c, float std, uint64_t seed,
                            lp_nn_param *p) {
  return nn_param_make(l, suffix, 2, (int64_t[]){r, c}, LP_NN_INIT_NORMAL, std,
                       seed, p);
}

/* The three params of expert e for a new slot: fresh (from seed), or a
 * copy of `from` (values; zero grads). */
static lp_status make_slot(const lp_nn_layer *l, int e, const lp_nn_param *from,
                           lp_nn_param *out) {
  const nn_moe *m = moe_of(l);
  int64_t D = m->o.dim, H = m->o.hidden;
  static const char *const w[3] = {"w1", "w3", "w2"};
  for (int i = 0; i < 3; i++) {
    char suffix[64];
    snprintf(suffix, sizeof suffix, "experts.%d.%s", e, w[i]);
    int64_t r = i < 2 ? H : D, c = i < 2 ? D : H;
    float std = (float)(1.0 / sqrt((double)c));
    LP_CHECK(make_param(l, suffix, r, c, std, m->seed, &out[i]));
    /* where the layer's parameters live (a device after lp_nn_layer_to) */
    const lp_tensor_backend *be = lp_tensor_backend_of(l->params[0].value);
    if (be != lp_tensor_backend_of(out[i].value)) {
      LP_CHECK(lp_tensor_move(out[i].value, be));
      LP_CHECK(lp_tensor_move(out[i].grad, be));
    }
    if (from) LP_CHECK(lp_tensor_copy(out[i].value, from[i].value));
  }
  return LP_OK;
}

/* Installs a placement: new param list (kept / copied / fresh slots),
 * replica lists. All or nothing. */
static lp_status apply_placement(lp_nn_layer *l, int size, int rank, int spr,
                                 const int *p2l) {
  nn_moe *m = moe_of(l);
  int E = m->o.experts, S = size * spr;
  size_t old_n = l->nparams, n = m->slot0 + 3 * (size_t)spr;
  int old_spr = l->params ? (int)((old_n - m->slot0) / 3) : 0;
  lp_status st = LP_ERR_NOMEM;
  lp_nn_param *np = lp_calloc(n, sizeof *np);
  int *src = lp_malloc((size_t)spr * sizeof *src); /* old slot moved, or -1 */
  int *taken = lp_calloc((size_t)(old_spr ? old_spr : 1), sizeof *taken);
  int *p2 = lp_malloc((size_t)S * sizeof *p2);
  int *rs = lp_calloc((size_t)E + 1, sizeof *rs);
  int *rsl = lp_malloc((size_t)S * sizeof *rsl);
  if (!np || !src || !taken || !p2 || !rs || !rsl) goto fail;
  memcpy(p2, p2l, (size_t)S * sizeof *p2);
  for (int s = 0; s < S; s++)
    rs[p2[s] + 1]++;
  for (int e = 0; e < E; e++)
    rs[e + 1] += rs[e];
  {
    int *fill = lp_malloc((size_t)E * sizeof *fill);
    if (!fill) goto fail;
    memcpy(fill, rs, (size_t)E * sizeof *fill);
    for (int s = 0; s < S; s++)
      rsl[fill[p2[s]]++] = s;
    lp_free(fill);
  }
  /* new slot j: move an old local slot with the same expert (the
   * placement in force says which: old local slot k is global slot
   * m->rank * old_spr + k), else copy an earlier new slot of it, else
   * fresh */
  for (int j = 0; j < spr; j++) {
    int e = p2[rank * spr + j];
    src[j] = -1;
    for (int k = 0; k < old_spr && src[j] < 0; k++) {
      if (!taken[k] && m->p2l[m->rank * old_spr + k] == e) {
        taken[k] = 1;
        src[j] = k;
      }
    }
    if (src[j] >= 0) continue;
    const lp_nn_param *from = NULL; /* an earlier new slot of e */
    for (int k = 0; k < j && !from; k++) {
      if (p2[rank * spr + k] != e) continue;
      from = src[k] >= 0 ? &l->params[m->slot0 + 3 * (size_t)src[k]]
                         : &np[m->slot0 + 3 * (size_t)k];
    }
    st = make_slot(l, e, from, &np[m->slot0 + 3 * (size_t)j]);
    if (st != LP_OK) goto fail;
  }
  /* commit (nothing fails from here) */
  for (size_t i = 0; i < m->slot0; i++)
    np[i] = l->params[i];
  for (int j = 0; j < spr; j++) {
    if (src[j] < 0) continue;
    for (int i = 0; i < 3; i++) {
      lp_nn_param *p = &l->params[m->slot0 + 3 * (size_t)src[j] + i];
      np[m->slot0 + 3 * (size_t)j + i] = *p;
      lp_tensor_fill(p->grad, 0.0f);
      memset(p, 0, sizeof *p);
    }
  }
  for (size_t i = m->slot0; i < old_n; i++)
    nn_param_free(&l->params[i]);
  lp_free(l->params);
  l->params = np;
  l->nparams = n;
  lp_free(m->p2l), lp_free(m->rep_start), lp_free(m->rep_slots);
  m->p2l = p2, m->rep_start = rs, m->rep_slots = rsl;
  m->size = size, m->rank = rank, m->spr = spr;
  lp_free(src), lp_free(taken);
  nn_params_changed();
  return LP_OK;
fail:
  if (np)
    for (size_t i = m->slot0; i < n; i++)
      nn_param_free(&np[i]);
  lp_free(np), lp_free(src), lp_free(taken), lp_free(p2), lp_free(rs);
  lp_free(rsl);
  return st;
}

static lp_status default_placement(lp_nn_layer *l, int size, int rank) {
  int E = moe_of(l)->o.experts, spr = (E + size - 1) / size;
  int *p2l = lp_malloc((size_t)(size * spr) * sizeof *p2l);
  if (!p2l) return LP_ERR_NOMEM;
  for (int s = 0; s < size * spr; s++)
    p2l[s] = s % E;
  lp_status st = apply_placement(l, size, rank, spr, p2l);
  lp_free(p2l);
  return st;
}

lp_status lp_nn_moe_new(const char *name, const lp_nn_moe_opts *o,
                        uint64_t seed, lp_nn_layer **layer) {
  return lp_nn_moe_new_placed(name, o, seed, 1, 0, layer);
}

lp_status lp_nn_moe_new_placed(const char *name, const lp_nn_moe_opts *o, uint64_t seed,
                               int ep_size, int ep_rank, lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  if (ep_size < 1 || ep_rank < 0 || ep_rank >= ep_size) return LP_ERR_ARG;
  if (!o || o->dim < 1 || o->hidden < 1 || o->experts < 1 ||
      o->experts > 65536 || o->topk < 1 || o->topk > o->experts ||
      o->shared < 0 || !(o->balance_alpha >= 0.0f) ||
      moe_route_check(o) != LP_OK)
    return LP_ERR_ARG;
  lp_nn_layer *l;
  LP_CHECK(nn_layer_alloc(&nn_moe_ops, name, &l));
  l->phased = &nn_moe_phased;
  l->owns_params = 1;
  lp_status st = LP_ERR_NOMEM;
  nn_moe *m = lp_calloc(1, sizeof *m);
  if (!m) goto fail;
  l->sub = m;
  l->sub_free = moe_free;
  m->o = *o;
  m->seed = seed;
  m->loss_scale = 1.0f;
  m->hs = (int64_t)o->shared * o->hidden;
  m->scale = o->route_scale > 0.0f ? o->route_scale : 1.0f;
  m->bias = lp_calloc((size_t)o->experts, sizeof *m->bias);
  m->load = lp_calloc((size_t)o->experts, sizeof *m->load);
  m->size = 1;
  size_t fixed = o->shared > 0 ? 4 : 1;
  l->params = lp_calloc(fixed, sizeof *l->params);
  if (!m->bias || !m->load || !l->params) goto fail;
  float sd = (float)(1.0 / sqrt((double)o->dim));
  st = make_param(l, "router.weight", o->experts, o->dim, sd, seed,
                  &l->params[l->nparams++]);
  if (st == LP_OK && o->shared > 0) {
    st = make_param(l, "shared.w1", m->hs, o->dim, sd, seed,
                    &l->params[l->nparams++]);
    if (st == LP_OK)
      st = make_param(l, "shared.w3", m->hs, o->dim, sd, seed,
                      &l->params[l->nparams++]);
    if (st == LP_OK)
      st = make_param(l, "shared.w2", o->dim, m->hs,
                      (float)(1.0 / sqrt((double)m->hs)), seed,
                      &l->params[l->nparams++]);
  }
  if (st != LP_OK) goto fail;
  m->slot0 = fixed;
  /* only this EP rank's slots are ever made: a slot's values come from
   * (seed, its name), so they equal those of a layer placed later */
  st = default_placement(l, ep_size, ep_rank);
  if (st != LP_OK) goto fail;
  *layer = l;
  return LP_OK;
fail:
  lp_nn_layer_release(l);
  return st;
}

/* ---- EP, placement, loads, bias ---- */

static lp_status set_ep_rec(lp_nn_layer *l, const lp_nn_ep *ep) {
  for (size_t i = 0; i < l->nchild; i++)
    LP_CHECK(set_ep_rec(l->child[i], ep));
  nn_moe *m = moe_of(l);
  if (!m) return LP_OK;
  int size = ep ? ep->size : 1, rank = ep ? ep->rank : 0;
  LP_CHECK(default_placement(l, size, rank));
  if (size > 1) m->ep = *ep;
  return LP_OK;
}

lp_status lp_nn_set_loss_scale(lp_nn_layer *l, float scale) {
  if (!l || !(scale > 0.0f) || !isfinite(scale)) return LP_ERR_ARG;
  for (size_t i = 0; i < l->nchild; i++)
    LP_CHECK(lp_nn_set_loss_scale(l->child[i], scale));
  nn_moe *m = moe_of(l);
  if (m) m->loss_scale = scale;
  return LP_OK;
}

lp_status lp_nn_set_ep(lp_nn_layer *l, const lp_nn_ep *ep) {
  if (!l) return LP_ERR_ARG;
  if (ep && (ep->size < 1 || ep->rank < 0 || ep->rank >= ep->size ||
             (ep->size > 1 && (!ep->start || !ep->wait))))
    return LP_ERR_ARG;
  return set_ep_rec(l, ep);
}

lp_status lp_nn_moe_set_placement(lp_nn_layer *moe, int slots_per_rank,
                                  const int *phys_to_log) {
  nn_moe *m = moe_of(moe);
  if (!m || !phys_to_log || slots_per_rank < 1) return LP_ERR_ARG;
  int S = m->size * slots_per_rank, E = m->o.experts;
  char *seen = lp_calloc((size_t)E, 1);
  if (!seen) return LP_ERR_NOMEM;
  int bad = 0;
  for (int s = 0; s < S && !bad; s++) {
    bad = phys_to_log[s] < 0 || phys_to_log[s] >= E;
    if (!bad) seen[phys_to_log[s]] = 1;
  }
  for (int e = 0; e < E && !bad; e++)
    bad = !seen[e];
  lp_free(seen);
  if (bad) return LP_ERR_ARG;
  return apply_placement(moe, m->size, m->rank, slots_per_rank, phys_to_log);
}

lp_status lp_nn_moe_slot_params(lp_nn_layer *moe, int slot,
                                const lp_nn_param **out, int *n) {
  nn_moe *m = moe_of(moe);
  if (out) *out = NULL;
  if (n) *n = 0;
  if (!m || !out || slot < m->rank * m->spr || slot >= (m->rank + 1) * m->spr)
    return LP_ERR_ARG;
  *out = &P_SLOT(moe, slot - m->rank * m->spr, 0);
  if (n) *n = 3;
  return LP_OK;
}

int lp_nn_moe_slots_per_rank(const lp_nn_layer *moe) {
  nn_moe *m = moe_of(moe);
  return m ? m->spr : 0;
}

lp_status lp_nn_moe_placement(const lp_nn_layer *moe, int *phys_to_log) {
  nn_moe *m = moe_of(moe);
  if (!m) return LP_ERR_ARG;
  if (phys_to_log)
    memcpy(phys_to_log, m->p2l, (size_t)(m->size * m->spr) * sizeof(int));
  return LP_OK;
}

const lp_nn_moe_opts *lp_nn_moe_get_opts(const lp_nn_layer *moe) {
  nn_moe *m = moe_of(moe);
  return m ? &m->o : NULL;
}

lp_status lp_nn_moe_expert_load(const lp_nn_layer *moe, int64_t *counts) {
  nn_moe *m = moe_of(moe);
  if (!m || !counts) return LP_ERR_ARG;
  memcpy(counts, m->load, (size_t)m->o.experts * sizeof *counts);
  return LP_OK;
}

void lp_nn_moe_load_reset(lp_nn_layer *moe) {
  nn_moe *m = moe_of(moe);
  if (m) memset(m->load, 0, (size_t)m->o.experts * sizeof *m->load);
}

lp_status lp_nn_moe_update_bias(lp_nn_layer *moe,
                                const int64_t *global_counts) {
  nn_moe *m = moe_of(moe);
  if (!m || !global_counts) return LP_ERR_ARG;
  if (m->o.no_bias) return LP_OK;
  int E = m->o.experts;
  double mean = 0.0;
  for (int e = 0; e < E; e++)
    mean += (double)global_counts[e];
  mean /= E;
  for (int e = 0; e < E; e++) {
    double d = mean - (double)global_counts[e];
    m->bias[e] += d > 0 ? m->o.bias_speed : d < 0 ? -m->o.bias_speed : 0.0f;
  }
  return LP_OK;
}

lp_status lp_nn_moe_get_bias(const lp_nn_layer *moe, float *bias) {
  nn_moe *m = moe_of(moe);
  if (!m || !bias) return LP_ERR_ARG;
  memcpy(bias, m->bias, (size_t)m->o.experts * sizeof *bias);
  return LP_OK;
}

lp_status lp_nn_moe_set_bias(lp_nn_layer *moe, const float *bias) {
  nn_moe *m = moe_of(moe);
  if (!m || !bias) return LP_ERR_ARG;
  for (int e = 0; m->o.no_bias && e < m->o.experts; e++)
    if (bias[e] != 0.0f) return LP_ERR_ARG;
  memcpy(m->bias, bias, (size_t)m->o.experts * sizeof *bias);
  return LP_OK;
}

double lp_nn_moe_aux_loss(const lp_nn_layer *moe) {
  nn_moe *m = moe_of(moe);
  return m ? m->aux : 0.0;
}

int lp_nn_moe_count(const lp_nn_layer *l) {
  if (!l) return 0;
  int n = moe_of(l) ? 1 : 0;
  for (size_t i = 0; i < l->nchild; i++)
    n += lp_nn_moe_count(l->child[i]);
  return n;
}

lp_nn_layer *lp_nn_moe_find(const lp_nn_layer *l, int i) {
  if (!l || i < 0) return NULL;
  if (moe_of(l)) {
    if (i == 0) return (lp_nn_layer *)l;
    i--;
  }
  for (size_t k = 0; k < l->nchild; k++) {
    int c = lp_nn_moe_count(l->child[k]);
    if (i < c) return lp_nn_moe_find(l->child[k], i);
    i -= c;
  }
  return NULL;
}

lp_status lp_nn_param_roles(const lp_nn_layer *l, lp_nn_param_role *roles,
                            size_t n) {
  size_t np;
  const lp_nn_param *ps = lp_nn_params(l, &np);
  if (!l || (n && !roles) || n != np) return LP_ERR_ARG;
  for (size_t i = 0; i < np; i++)
    roles[i] = (lp_nn_param_role){-1, -1, -1};
  int count = lp_nn_moe_count(l);
  for (int k = 0; k < count; k++) {
    const lp_nn_layer *m = lp_nn_moe_find(l, k);
    const nn_moe *mm = moe_of(m);
    for (size_t j = 0; j < m->nparams; j++) {
      lp_nn_param_role r = {k, -1, -1};
      if (j >= mm->slot0) {
        r.slot = mm->rank * mm->spr + (int)((j - mm->slot0) / 3);
        r.expert = mm->p2l[r.slot];
      }
      for (size_t i = 0; i < np; i++)
        if (ps[i].value == m->params[j].value) roles[i] = r;
    }
  }
  return LP_OK;
}

lp_status lp_nn_unrouted_mask(const lp_nn_layer *l, const int64_t *loads, unsigned char *skip,
                              size_t n) {
  size_t np;
  lp_nn_params(l, &np);
  if (!l || n != np || (n && !skip)) return LP_ERR_ARG;
  int count = lp_nn_moe_count(l);
  if (count && !loads) return LP_ERR_ARG;
  lp_nn_param_role *roles = lp_malloc((n ? n : 1) * sizeof *roles);
  size_t *base = lp_malloc((size_t)(count + 1) * sizeof *base);
  lp_status st = roles && base ? lp_nn_param_roles(l, roles, n) : LP_ERR_NOMEM;
  if (st == LP_OK) {
    base[0] = 0;
    for (int k = 0; k < count; k++)
      base[k + 1] = base[k] + (size_t)lp_nn_moe_get_opts(lp_nn_moe_find(l, k))->experts;
    for (size_t i = 0; i < n; i++)
      skip[i] = roles[i].slot >= 0 && loads[base[roles[i].moe] + (size_t)roles[i].expert] == 0;
  }
  lp_free(roles);
  lp_free(base);
  return st;
}
