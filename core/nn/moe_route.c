/* moe_route.c — the MoE layer's routing math (see lp_nn.h): affinities
 * from the router's logits, the selection and combine weights of DeepSeek's
 * Gate (correction bias for selection only, group-limited top-k), the
 * sequence-wise balance loss, the orders the dispatch needs (send order by
 * destination slot, expert order on the receiving rank), and the router's
 * backward. It holds no exchange and no expert: the phased pass (moe.c)
 * calls it; the decisions it makes live in the ctx's moe_route, the loads
 * it counts in the layer's nn_moe.
 *
 * The logits are computed on the layer's backend; the decisions are made
 * on the host from the [tokens, E] affinities read back, and the router's
 * backward from the [pairs] weight grads of dot_rows: only those cross. */
#include "moe_internal.h"

#include <math.h>
#include <string.h>

void moe_route_free(void *p) {
  moe_route *rt = p;
  if (!rt) return;
  lp_free(rt->sel), lp_free(rt->w), lp_free(rt->tok), lp_free(rt->perm);
  lp_free(rt->wsend), lp_free(rt->cnt_send), lp_free(rt->cnt_recv);
  lp_free(rt->sc), lp_free(rt->rc), lp_free(rt->cs);
  lp_free(rt->emap), lp_free(rt->rmap), lp_free(rt->soff);
  lp_free(rt->s);
  lp_free(rt);
}

lp_status moe_route_check(const lp_nn_moe_opts *o) {
  int G = o->groups > 1 ? o->groups : 1;
  int TG = o->topk_groups > 0 ? o->topk_groups : G;
  if (o->groups < 0 || o->topk_groups < 0 || o->experts % G || G > 256 ||
      TG > G || (int64_t)TG * (o->experts / G) < o->topk ||
      !(o->route_scale >= 0.0f) || !(o->bias_speed >= 0.0f) ||
      (o->no_bias && o->bias_speed > 0.0f) ||
      (o->router != LP_NN_ROUTER_SIGMOID && o->router != LP_NN_ROUTER_SOFTMAX))
    return LP_ERR_ARG;
  return LP_OK;
}

lp_status moe_scores(const lp_nn_layer *l, const lp_tensor *x2, int64_t n,
                     float *s) {
  const nn_moe *m = moe_of(l);
  int E = m->o.experts;
  lp_tensor *t = NULL;
  LP_CHECK(lp_tensor_empty(lp_tensor_backend_of(x2), 2, (int64_t[]){n, E}, &t));
  lp_status st = lp_tensor_gemm(t, 1.0f, x2, 0, P_ROUTER(l), 1, 0.0f);
  if (st == LP_OK && m->o.router == LP_NN_ROUTER_SOFTMAX)
    st = lp_tensor_softmax_rows(t, t);
  if (st == LP_OK) st = lp_tensor_read(t, s);
  lp_tensor_free(t);
  if (st == LP_OK && m->o.router != LP_NN_ROUTER_SOFTMAX)
    for (int64_t i = 0; i < n * E; i++)
      s[i] = 1.0f / (1.0f + expf(-s[i]));
  return st;
}

/* The Gate for one token: affinities s [E] -> sel[k], w[k]. Selection on
 * v = s + bias (s alone with no_bias); with groups, a group's score is the
 * sum of its two best v (its best s with no_bias), the topk_groups best
 * groups are eligible; then the topk best eligible experts, best first
 * (ties to the lower index). Weights from the unbiased s: route_scale * s
 * / (sum of the selected s), or route_scale * s with no_norm_topk.
 * scratch: v, ok [E]. */
static void select_token(const nn_moe *m, const float *s, int *sel, float *w,
                         float *v, int *ok) {
  int E = m->o.experts, K = m->o.topk, G = m->o.groups > 1 ? m->o.groups : 1;
  int gs = E / G, TG = m->o.topk_groups > 0 ? m->o.topk_groups : G;
  int biased = !m->o.no_bias;
  for (int e = 0; e < E; e++) {
    v[e] = biased ? s[e] + m->bias[e] : s[e];
    ok[e] = G == 1;
  }
  if (G > 1) {
    float gscore[256];
    int taken[256];
    for (int g = 0; g < G; g++) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int e = g * gs; e < (g + 1) * gs; e++) {
        if (v[e] > b1) {
          b2 = b1;
          b1 = v[e];
        } else if (v[e] > b2) {
          b2 = v[e];
        }
      }
      gscore[g] = biased && gs > 1 ? b1 + b2 : b1;
      taken[g] = 0;
    }
    for (int t = 0; t < TG; t++) {
      int best = -1;
      for (int g = 0; g < G; g++)
        if (!taken[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      taken[best] = 1;
      for (int e = best * gs; e < (best + 1) * gs; e++)
        ok[e] = 1;
    }
  }
  double sum = 0.0;
  for (int k = 0; k < K; k++) {
    int best = -1;
    for (int e = 0; e < E; e++)
      if (ok[e] && (best < 0 || v[e] > v[best])) best = e;
    ok[best] = 0;
    sel[k] = best;
    sum += s[best];
  }
  if (m->o.no_norm_topk) {
    for (int k = 0; k < K; k++)
      w[k] = m->scale * s[sel[k]];
    return;
  }
  float denom = (float)sum + 1e-20f;
  for (int k = 0; k < K; k++)
    w[k] = m->scale * s[sel[k]] / denom;
}

/* d(weights) -> d(affinities): dg [pairs] of the token-major pairs, added
 * into dl [n, E]. Normalised, w_k = c s_k / S: ds_j = (c dg_j - sum_k dg_k
 * w_k) / S; else w_k = c s_k: ds_j = c dg_j. */
static void weights_bwd(const nn_moe *m, const moe_route *rt, const float *dg,
                        float *dl) {
  int E = m->o.experts, K = m->o.topk;
  for (int64_t t = 0; t < rt->n; t++) {
    const int *sel = rt->sel + t * K;
    if (m->o.no_norm_topk) {
      for (int k = 0; k < K; k++)
        dl[t * E + sel[k]] += m->scale * dg[t * K + k];
      continue;
    }
    double sum = 0.0, gw = 0.0;
    for (int k = 0; k < K; k++) {
      sum += rt->s[t * E + sel[k]];
      gw += (double)dg[t * K + k] * rt->w[t * K + k];
    }
    float denom = (float)sum + 1e-20f;
    for (int k = 0; k < K; k++)
      dl[t * E + sel[k]] += (m->scale * dg[t * K + k] - (float)gw) / denom;
  }
}

/* The balance loss of the micro-batch and (dg != NULL) its gradient with
 * respect to the affinities, added into dg [N, E]. f: E doubles scratch. */
static double balance(const nn_moe *m, const moe_route *rt, const float *s,
                      float *dg, double *f) {
  int E = m->o.experts, K = m->o.topk;
  /* the mean over this share's sequences, at the loop's loss scale */
  double alpha = (double)m->o.balance_alpha * m->loss_scale /
                 (double)(rt->seqs > 0 ? rt->seqs : 1),
         total = 0.0;
  int64_t T = rt->seqlen;
  for (int64_t q = 0; q < rt->seqs; q++) {
    for (int e = 0; e < E; e++)
      f[e] = 0.0;
    for (int64_t t = q * T; t < (q + 1) * T; t++)
      for (int k = 0; k < K; k++)
        f[rt->sel[t * K + k]] += (double)E / ((double)K * (double)T);
    for (int64_t t = q * T; t < (q + 1) * T; t++) {
      const float *st = s + t * E;
      double z = 0.0, gs = 0.0;
      for (int e = 0; e < E; e++)
        z += st[e];
      z += 1e-20;
      for (int e = 0; e < E; e++) {
        total += alpha * f[e] * (st[e] / z) / (double)T;
        gs += alpha * f[e] / (double)T * (st[e] / z);
      }
      if (!dg) continue;
      /* d/ds_j of sum_i g_i s_i / z = (g_j - sum_i g_i s_i / z) / z */
      for (int e = 0; e < E; e++)
        dg[t * E + e] += (float)((alpha * f[e] / (double)T - gs) / z);
    }
  }
  return total;
}

lp_status moe_balance_forward(nn_moe *m, const moe_route *rt) {
  if (!(m->o.balance_alpha > 0.0f)) return LP_OK;
  double *f = lp_malloc((size_t)m->o.experts * sizeof *f);
  if (!f) return LP_ERR_NOMEM;
  m->aux = balance(m, rt, rt->s, NULL, f);
  lp_free(f);
  return LP_OK;
}

/* d(affinities) -> d(logits) into dlog (dlog holds ds on entry). */
static void score_bwd(const nn_moe *m, const float *s, float *dlog,
                      int64_t n) {
  int E = m->o.experts;
  for (int64_t t = 0; t < n; t++) {
    const float *st = s + t * E;
    float *d = dlog + t * E;
    if (m->o.router == LP_NN_ROUTER_SOFTMAX) {
      double dot = 0.0;
      for (int e = 0; e < E; e++)
        dot += (double)d[e] * st[e];
      for (int e = 0; e < E; e++)
        d[e] = st[e] * (d[e] - (float)dot);
    } else {
      for (int e = 0; e < E; e++)
        d[e] *= st[e] * (1.0f - st[e]);
    }
  }
}

lp_status moe_make_route(nn_moe *m, moe_route *rt) {
  int E = m->o.experts, K = m->o.topk, S = m->size * m->spr;
  int64_t n = rt->n, np = rt->pairs;
  size_t np1 = moe_at_least1(np);
  lp_status st = LP_ERR_NOMEM;
  float *v = lp_malloc((size_t)E * sizeof *v);
  int *ok = lp_malloc((size_t)E * sizeof *ok);
  int *used = lp_calloc((size_t)E, sizeof *used);
  int64_t *slot = lp_malloc(np1 * sizeof *slot);
  int64_t *off = lp_calloc((size_t)S + 1, sizeof *off);
  rt->sel = lp_malloc(np1 * sizeof *rt->sel);
  rt->w = lp_malloc(np1 * sizeof *rt->w);
  rt->tok = lp_malloc(np1 * sizeof *rt->tok);
  rt->perm = lp_malloc(np1 * sizeof *rt->perm);
  rt->wsend = lp_malloc(np1 * sizeof *rt->wsend);
  rt->cnt_send = lp_calloc((size_t)S, sizeof *rt->cnt_send);
  rt->cnt_recv = lp_calloc((size_t)S, sizeof *rt->cnt_recv);
  rt->sc = lp_calloc((size_t)m->size, sizeof *rt->sc);
  rt->rc = lp_calloc((size_t)m->size, sizeof *rt->rc);
  rt->cs = lp_malloc((size_t)m->size * sizeof *rt->cs);
  rt->soff = lp_calloc((size_t)m->spr + 1, sizeof *rt->soff);
  if (!v || !ok || !used || !slot || !off || !rt->sel || !rt->w || !rt->tok ||
      !rt->perm || !rt->wsend || !rt->cnt_send || !rt->cnt_recv || !rt->sc ||
      !rt->rc || !rt->cs || !rt->soff)
    goto done;
  for (int r = 0; r < m->size; r++)
    rt->cs[r] = (size_t)m->spr;
  for (int64_t t = 0; t < n; t++)
    select_token(m, rt->s + t * E, rt->sel + t * K, rt->w + t * K, v, ok);
  /* replicas: the j-th pair of expert e goes to replica (j + rank) % reps */
  for (int64_t p = 0; p < np; p++) {
    int e = rt->sel[p];
    m->load[e]++;
    int reps = m->rep_start[e + 1] - m->rep_start[e];
    slot[p] = m->rep_slots[m->rep_start[e] + (used[e]++ + m->rank) % reps];
    off[slot[p] + 1]++;
  }
  for (int i = 0; i < S; i++) {
    rt->cnt_send[i] = (float)off[i + 1];
    rt->sc[i / m->spr] += (size_t)off[i + 1] * (size_t)m->o.dim;
    off[i + 1] += off[i];
  }
  for (int64_t p = 0; p < np; p++) { /* stable counting sort by slot */
    int64_t i = off[slot[p]]++;
    rt->perm[i] = p;
    rt->tok[i] = p / K;
    rt->wsend[i] = rt->w[p];
  }
  st = LP_OK;
done:
  lp_free(v), lp_free(ok), lp_free(used), lp_free(slot), lp_free(off);
  return st;
}

lp_status moe_make_expert_order(const nn_moe *m, moe_route *rt) {
  int P = m->size, spr = m->spr;
  int64_t r = 0, D = m->o.dim;
  for (int s = 0; s < P; s++) {
    int64_t rows = 0;
    for (int j = 0; j < spr; j++)
      rows += (int64_t)rt->cnt_recv[s * spr + j];
    rt->rc[s] = (size_t)(rows * D);
    r += rows;
  }
  rt->r = r;
  rt->emap = lp_malloc(moe_at_least1(r) * sizeof *rt->emap);
  rt->rmap = lp_malloc(moe_at_least1(r) * sizeof *rt->rmap);
  if (!rt->emap || !rt->rmap) return LP_ERR_NOMEM;
  int64_t i = 0;
  for (int j = 0; j < spr; j++) {
    rt->soff[j] = i;
    int64_t base = 0; /* receive row of block (s, j) */
    for (int s = 0; s < P; s++) {
      int64_t b = base;
      for (int jj = 0; jj < j; jj++)
        b += (int64_t)rt->cnt_recv[s * spr + jj];
      int64_t c = (int64_t)rt->cnt_recv[s * spr + j];
      for (int64_t q = 0; q < c; q++) {
        rt->emap[i] = b + q;
        rt->rmap[b + q] = i;
        i++;
      }
      base += (int64_t)rt->rc[s] / D;
    }
  }
  rt->soff[spr] = i;
  return LP_OK;
}

lp_status moe_router_backward(const lp_nn_layer *l, const moe_route *rt,
                              const lp_tensor *dy2, const lp_tensor *comb,
                              lp_tensor **dlog) {
  const nn_moe *m = moe_of(l);
  int E = m->o.experts;
  int64_t n = rt->n;
  *dlog = NULL;
  /* dg of each pair (dy row . expert output row, in double, on the
   * backend: dot_rows), back in token-major pair order on the host */
  float *dl = lp_calloc(moe_at_least1(n * E), sizeof *dl);
  float *dgs = lp_malloc(moe_at_least1(rt->pairs) * sizeof *dgs);
  float *dg = lp_malloc(moe_at_least1(rt->pairs) * sizeof *dg);
  lp_tensor *dgt = NULL;
  lp_status st = dl && dgs && dg ? LP_OK : LP_ERR_NOMEM;
  if (st == LP_OK)
    st = lp_tensor_empty(rt->be, 1, (int64_t[]){rt->pairs}, &dgt);
  if (st == LP_OK) st = lp_tensor_dot_rows(dgt, dy2, rt->tok, comb);
  if (st == LP_OK) st = lp_tensor_read(dgt, dgs);
  lp_tensor_free(dgt);
  for (int64_t i = 0; st == LP_OK && i < rt->pairs; i++)
    dg[rt->perm[i]] = dgs[i];
  lp_free(dgs);
  if (st == LP_OK) weights_bwd(m, rt, dg, dl);
  lp_free(dg);
  if (st == LP_OK && m->o.balance_alpha > 0.0f) {
    double *f = lp_malloc((size_t)E * sizeof *f);
    if (f)
      balance(m, rt, rt->s, dl, f);
    else
      st = LP_ERR_NOMEM;
    lp_free(f);
  }
  if (st == LP_OK) {
    score_bwd(m, rt->s, dl, n);
    st = lp_tensor_from_data(rt->be, 2, (int64_t[]){n, E}, dl, dlog);
  }
  lp_free(dl);
  return st;
}

lp_status lp_nn_moe_route(const lp_nn_layer *moe, const lp_tensor *x,
                          int *experts, float *weights, float *scores) {
  const nn_moe *m = moe_of(moe);
  if (!m || !x || !experts || !weights || !scores) return LP_ERR_ARG;
  int64_t D = m->o.dim, n;
  int E = m->o.experts, K = m->o.topk;
  if ((x->ndim != 2 && x->ndim != 3) || x->shape[x->ndim - 1] != D)
    return LP_ERR_ARG;
  lp_tensor_rows_cols(x, &n, NULL);
  if (n == 0) return LP_OK;
  /* the affinities and decisions as the forward makes them */
  lp_tensor *xd = NULL, *x2 = NULL;
  float *v = lp_malloc((size_t)E * sizeof *v);
  int *ok = lp_malloc((size_t)E * sizeof *ok);
  lp_status st = v && ok ? nn_dense(x, &xd) : LP_ERR_NOMEM;
  if (st == LP_OK) st = lp_tensor_reshape(xd, 2, (int64_t[]){n, D}, &x2);
  if (st == LP_OK) st = moe_scores(moe, x2, n, scores);
  for (int64_t t = 0; st == LP_OK && t < n; t++)
    select_token(m, scores + t * E, experts + t * K, weights + t * K, v, ok);
  lp_tensor_free(x2);
  lp_tensor_free(xd);
  lp_free(v);
  lp_free(ok);
  return st;
}
