/* moe.c — the DeepSeek-V3-style mixture-of-experts layer (see lp_nn.h):
 * router (sigmoid or softmax affinities, selection bias, group-limited
 * top-k, normalised weights), SwiGLU experts in physical slots placed over
 * the EP ranks, shared experts, the optional sequence-wise balance loss,
 * and the phased passes that run the dispatch / combine exchanges.
 *
 * Forward on EP rank r (size P, spr slots per rank):
 *   phase ROUTER   route every token, order the (token, expert) pairs by
 *                  destination slot ("send order"), gather their rows;
 *                  P > 1: start the count exchange (pairs per slot)
 *   phase COUNTS   finish it, start the token-row exchange
 *   phase EXPERTS  finish it, put the received rows in slot order ("expert
 *                  order"), run each local slot's SwiGLU and the shared
 *                  expert, start the combine (outputs back in receive order)
 *   phase COMBINE  finish it, y = shared + sum of weight * expert output
 * Input-grad reverses it: DENSE (shared and router backward, weighted dy
 * rows start back to the experts), BEXPERTS (expert backward, dx rows
 * start back), BDISPATCH (dx += the returned rows). With P == 1 there is
 * no exchange and a pass is one advance.
 *
 * On any backend: the routing decisions are made on the host from the
 * [tokens, E] affinities read back (and the router's backward from the
 * [pairs] combine-weight grads of dot_rows); GEMMs, SwiGLU, gather/scatter
 * run on the backend; off the host the row exchanges go to the lp_nn_ep as
 * device buffers when it moves device memory (lp_nn_ep.device: the
 * executor's EP group, staged or NCCL through the comm layer), else they
 * are staged through host buffers here.
 *
 * Params: [0] router, then shared w1, w3, w2 (when shared > 0), then w1,
 * w3, w2 of each local slot. */
#include "nn_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

struct nn_moe {
  lp_nn_moe_opts o;
  uint64_t seed;
  int64_t hs;    /* shared hidden size */
  float scale;   /* route scale */
  float *bias;   /* [E] */
  int64_t *load; /* [E] */
  double aux;
  float loss_scale; /* lp_nn_set_loss_scale (1 by default) */
  lp_nn_ep ep; /* valid when size > 1 */
  int size, rank, spr;
  int *p2l;       /* [size * spr] */
  int *rep_start; /* [E + 1]: replicas of e are rep_slots[rep_start[e]..) */
  int *rep_slots; /* [size * spr] */
  size_t slot0;   /* index in params of the first local slot's w1 */
};

/* ctx tensor slots */
enum {
  M_X,      /* x as [N, D] */
  M_S,      /* affinities [N, E] */
  M_SEND,   /* rows sent for dispatch [Pairs, D] */
  M_RECV,   /* rows received [R, D] */
  M_XIN,    /* expert inputs, expert order [R, D] */
  M_A1,     /* x W1^T, expert order [R, H] */
  M_A3,     /* x W3^T */
  M_H,      /* silu(a1) * a3 */
  M_OUTR,   /* expert outputs, receive order [R, D] */
  M_COMB,   /* expert outputs, send order [Pairs, D] */
  M_SHA1,   /* shared expert [N, HS] */
  M_SHA3,   /* */
  M_SHH,    /* */
  M_SHOUT,  /* shared output [N, D] */
  M_DY,     /* dy as [N, D] */
  M_DLOG,   /* d logits [N, E] */
  M_SHDA1,  /* shared da1 [N, HS] */
  M_SHDA3,  /* */
  M_DCOMB,  /* weighted dy rows, send order [Pairs, D] */
  M_DOUTR,  /* the same received, receive order [R, D] */
  M_DOUT,   /* expert order [R, D] */
  M_DA1,    /* expert order [R, H] */
  M_DA3,    /* */
  M_DXR,    /* expert dx, receive order [R, D] */
  M_DXS,    /* expert dx, send order [Pairs, D] */
  M_DX,     /* dx as [N, D] */
  M_NSLOTS
};

_Static_assert(M_NSLOTS <= NN_SLOTS, "moe needs more ctx slots");

enum {
  PH_ROUTER = 0,
  PH_COUNTS,
  PH_EXPERTS,
  PH_COMBINE,
  PH_DENSE = 0, /* input-grad */
  PH_BEXPERTS = 1,
  PH_BDISPATCH = 2
};

/* Routing of one micro-batch (ctx->ext). */
typedef struct route {
  int64_t n, pairs, seqs, seqlen; /* tokens, n*K, sequences, tokens each */
  int xndim;
  int64_t xshape[LP_TENSOR_MAXDIM];
  int *sel;        /* [pairs] logical expert of pair t*K + k */
  float *w;        /* [pairs] its weight */
  int64_t *tok;    /* [pairs] send order -> token */
  int64_t *perm;   /* [pairs] send order -> pair */
  float *wsend;    /* [pairs] send order -> weight */
  float *cnt_send; /* [size*spr] pairs per destination slot */
  float *cnt_recv; /* [size*spr] pairs per (source, local slot) */
  size_t *sc, *rc; /* [size] floats sent to / received from each rank */
  size_t *cs;      /* [size] spr each: count exchange sizes */
  int64_t r;       /* rows received */
  int64_t *emap;   /* [r] expert order -> receive row */
  int64_t *rmap;   /* [r] receive row -> expert order */
  int64_t *soff;   /* [spr + 1] expert-order offsets of the local slots */
  const lp_tensor_backend *be; /* where the micro-batch's tensors live */
  float *s;        /* [n * E] affinities, host copy (routing, router bwd) */
  /* host staging of an exchange when be is not host_accessible: send and
   * receive buffers, and the tensor the received floats go to at finish */
  float *stage_send, *stage_recv;
  lp_tensor *stage_dst;
  int experts_w_done; /* the routed experts' weight-grads already ran */
  lp_nn_xkind xkind;  /* the exchange in flight (ctx->xchg) */
} route;

static void route_free(void *p) {
  route *rt = p;
  if (!rt) return;
  lp_free(rt->sel), lp_free(rt->w), lp_free(rt->tok), lp_free(rt->perm);
  lp_free(rt->wsend), lp_free(rt->cnt_send), lp_free(rt->cnt_recv);
  lp_free(rt->sc), lp_free(rt->rc), lp_free(rt->cs);
  lp_free(rt->emap), lp_free(rt->rmap), lp_free(rt->soff);
  lp_free(rt->s), lp_free(rt->stage_send), lp_free(rt->stage_recv);
  lp_tensor_free(rt->stage_dst);
  lp_free(rt);
}

void nn_moe_free(struct nn_moe *m) {
  if (!m) return;
  lp_free(m->bias), lp_free(m->load), lp_free(m->p2l);
  lp_free(m->rep_start), lp_free(m->rep_slots);
  lp_free(m);
}

#define P_ROUTER(l) ((l)->params[0].value)
#define P_SH(l, i) ((l)->params[1 + (i)])
#define P_SLOT(l, j, i) ((l)->params[(l)->moe->slot0 + 3 * (size_t)(j) + (i)])

/* ---- small helpers ---- */

static lp_status new2(const route *rt, int64_t r, int64_t c, lp_tensor **out) {
  return lp_tensor_empty(rt->be, 2, (int64_t[]){r, c}, out);
}

/* An allocation count of at least 1 for n elements. */
static size_t at_least1(int64_t n) { return (size_t)(n > 0 ? n : 1); }

/* Rows [a, a+n) of t (a new view). */
static lp_status rows_of(const lp_tensor *t, int64_t a, int64_t n,
                         lp_tensor **out) {
  return lp_tensor_rows(t, a, n, out);
}

const char *lp_nn_xkind_text(lp_nn_xkind k) {
  static const char *const t[LP_NN_X__N] = {"dispatch count", "dispatch", "combine",
                                            "combine backward", "dispatch backward"};
  return k >= 0 && k < LP_NN_X__N ? t[k] : "exchange";
}

/* Starts an exchange of ctx; the ctx remembers it until finish. */
static lp_status xstart(lp_nn_layer *l, lp_nn_ctx *ctx, const float *send,
                        const size_t *sc, float *recv, const size_t *rc,
                        lp_nn_xkind kind, const lp_tensor_backend *be) {
  const lp_nn_ep *ep = &l->moe->ep;
  route *rt = ctx->ext;
  void *h = NULL;
  lp_nn_xinfo xi = {kind, l->name, lp_nn_ctx_tag(ctx), be};
  lp_status st = ep->start(ep->ud, &xi, send, sc, recv, rc, &h);
  if (st != LP_OK)
    return nn_fail(ctx, l, st, "starting the %s exchange failed: %s",
                   lp_nn_xkind_text(kind), lp_strerror(st));
  ctx->xchg = h;
  ctx->xchg_ep = ep;
  rt->xkind = kind;
  return LP_OK;
}

/* Starts the exchange of the rows of tensor `send` into tensor `recv` (both
 * dense, on the micro-batch's backend). Host rows, and device rows when
 * the lp_nn_ep moves device memory itself (an executor, through the comm
 * layer), go as they are; otherwise off the host they go through host
 * staging buffers: read before the start, written at xfinish. */
static lp_status xstart_rows(lp_nn_layer *l, lp_nn_ctx *ctx,
                             const lp_tensor *send, const size_t *sc,
                             lp_tensor *recv, const size_t *rc,
                             lp_nn_xkind kind) {
  route *rt = ctx->ext;
  if (rt->be->host_accessible)
    return xstart(l, ctx, send->data, sc, recv->data, rc, kind, NULL);
  if (l->moe->ep.device)
    return xstart(l, ctx, send->data, sc, recv->data, rc, kind, rt->be);
  int64_t ns = lp_tensor_numel(send), nr = lp_tensor_numel(recv);
  lp_free(rt->stage_send), lp_free(rt->stage_recv);
  lp_tensor_free(rt->stage_dst);
  rt->stage_dst = NULL;
  rt->stage_send = lp_malloc((size_t)(ns ? ns : 1) * sizeof(float));
  rt->stage_recv = lp_malloc((size_t)(nr ? nr : 1) * sizeof(float));
  if (!rt->stage_send || !rt->stage_recv) return LP_ERR_NOMEM;
  lp_status st = lp_tensor_read(send, rt->stage_send);
  if (st == LP_OK) st = lp_tensor_view(recv, &rt->stage_dst);
  if (st != LP_OK)
    return nn_fail(ctx, l, st, "staging the %s exchange on the host failed: %s",
                   lp_nn_xkind_text(kind), lp_strerror(st));
  return xstart(l, ctx, rt->stage_send, sc, rt->stage_recv, rc, kind, NULL);
}

/* Finishes the exchange in flight (none: nothing). */
static lp_status xfinish(lp_nn_layer *l, lp_nn_ctx *ctx) {
  if (!ctx->xchg) return LP_OK;
  void *h = ctx->xchg;
  route *rt = ctx->ext;
  const char *what = lp_nn_xkind_text(rt->xkind);
  ctx->xchg = NULL;
  ctx->xchg_ep = NULL;
  lp_status st = l->moe->ep.wait(l->moe->ep.ud, h);
  if (st != LP_OK)
    return nn_fail(ctx, l, st, "the %s exchange failed: %s", what,
                   lp_strerror(st));
  if (rt->stage_dst) { /* a staged exchange: the rows go to the device */
    st = lp_tensor_write(rt->stage_dst, rt->stage_recv);
    lp_tensor_free(rt->stage_dst);
    rt->stage_dst = NULL;
    lp_free(rt->stage_send), lp_free(rt->stage_recv);
    rt->stage_send = rt->stage_recv = NULL;
    if (st != LP_OK)
      return nn_fail(ctx, l, st, "copying the %s exchange to %s failed: %s",
                     what, rt->be->name, lp_strerror(st));
  }
  return LP_OK;
}

/* SwiGLU forward on rows x [n, D]: a1 = x W1^T, a3 = x W3^T,
 * h = silu(a1) * a3, out = h W2^T. */
static lp_status swiglu_fwd(const lp_tensor *x, const lp_tensor *w1,
                            const lp_tensor *w3, const lp_tensor *w2,
                            lp_tensor *a1, lp_tensor *a3, lp_tensor *h,
                            lp_tensor *out) {
  LP_CHECK(lp_tensor_gemm(a1, 1.0f, x, 0, w1, 1, 0.0f));
  LP_CHECK(lp_tensor_gemm(a3, 1.0f, x, 0, w3, 1, 0.0f));
  LP_CHECK(lp_tensor_act(h, LP_TENSOR_ACT_SILU, a1));
  LP_CHECK(lp_tensor_mul(h, h, a3));
  return lp_tensor_gemm(out, 1.0f, h, 0, w2, 1, 0.0f);
}

/* SwiGLU input-grad: dh = dout W2; da3 = dh * silu(a1); da1 = dh * a3 *
 * silu'(a1); dx (+)= da1 W1 + da3 W3 (beta: 0 overwrite, 1 accumulate). */
static lp_status swiglu_bwd(const lp_tensor *dout, const lp_tensor *a1,
                            const lp_tensor *a3, const lp_tensor *w1,
                            const lp_tensor *w3, const lp_tensor *w2,
                            lp_tensor *da1, lp_tensor *da3, lp_tensor *dx,
                            float beta) {
  LP_CHECK(lp_tensor_gemm(da1, 1.0f, dout, 0, w2, 0, 0.0f)); /* dh */
  LP_CHECK(lp_tensor_act(da3, LP_TENSOR_ACT_SILU, a1));
  LP_CHECK(lp_tensor_mul(da3, da3, da1));
  LP_CHECK(lp_tensor_mul(da1, da1, a3));
  LP_CHECK(lp_tensor_act_backward(da1, LP_TENSOR_ACT_SILU, a1, da1));
  LP_CHECK(lp_tensor_gemm(dx, 1.0f, da1, 0, w1, 0, beta));
  return lp_tensor_gemm(dx, 1.0f, da3, 0, w3, 0, 1.0f);
}

/* SwiGLU weight-grad: dW1 += da1^T x, dW3 += da3^T x, dW2 += dout^T h. */
static lp_status swiglu_wgrad(const lp_tensor *x, const lp_tensor *h,
                              const lp_tensor *dout, const lp_tensor *da1,
                              const lp_tensor *da3, lp_tensor *g1,
                              lp_tensor *g3, lp_tensor *g2) {
  LP_CHECK(lp_tensor_gemm(g1, 1.0f, da1, 1, x, 0, 1.0f));
  LP_CHECK(lp_tensor_gemm(g3, 1.0f, da3, 1, x, 0, 1.0f));
  return lp_tensor_gemm(g2, 1.0f, dout, 1, h, 0, 1.0f);
}

/* ---- routing ---- */

/* Picks the token's experts from affinities s [E] and the bias: eligible
 * groups first (group score = sum of its two best s + bias), then the top
 * k eligible experts (ties to the lower index). sel[k], w[k]. scratch: E
 * floats + E ints. */
static void route_token(const struct nn_moe *m, const float *s, int *sel,
                        float *w, float *v, int *ok) {
  int E = m->o.experts, K = m->o.topk, G = m->o.groups > 1 ? m->o.groups : 1;
  int gs = E / G, TG = m->o.topk_groups > 0 ? m->o.topk_groups : G;
  for (int e = 0; e < E; e++) {
    v[e] = s[e] + m->bias[e];
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
      gscore[g] = gs > 1 ? b1 + b2 : b1;
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
  float denom = (float)sum + 1e-20f;
  for (int k = 0; k < K; k++)
    w[k] = m->scale * s[sel[k]] / denom;
}

/* The balance loss of the micro-batch and (dg != NULL) its gradient with
 * respect to the affinities, added into dg [N, E]. */
static double balance(const struct nn_moe *m, const route *rt, const float *s,
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

/* Routes every token of x [N, D] (affinities into s), fills rt's
 * selection, send order and counts. */
static lp_status make_route(lp_nn_layer *l, route *rt) {
  struct nn_moe *m = l->moe;
  int E = m->o.experts, K = m->o.topk, S = m->size * m->spr;
  int64_t n = rt->n, np = rt->pairs;
  lp_status st = LP_ERR_NOMEM;
  float *v = lp_malloc((size_t)E * sizeof *v);
  int *ok = lp_malloc((size_t)E * sizeof *ok);
  int *used = lp_calloc((size_t)E, sizeof *used);
  int64_t *slot = lp_malloc((size_t)(np ? np : 1) * sizeof *slot);
  int64_t *off = lp_calloc((size_t)S + 1, sizeof *off);
  rt->sel = lp_malloc((size_t)(np ? np : 1) * sizeof *rt->sel);
  rt->w = lp_malloc((size_t)(np ? np : 1) * sizeof *rt->w);
  rt->tok = lp_malloc((size_t)(np ? np : 1) * sizeof *rt->tok);
  rt->perm = lp_malloc((size_t)(np ? np : 1) * sizeof *rt->perm);
  rt->wsend = lp_malloc((size_t)(np ? np : 1) * sizeof *rt->wsend);
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
    route_token(m, rt->s + t * E, rt->sel + t * K, rt->w + t * K, v, ok);
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

/* After the count exchange: rows received, the expert order and its maps. */
static lp_status make_expert_order(struct nn_moe *m, route *rt) {
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
  rt->emap = lp_malloc((size_t)(r ? r : 1) * sizeof *rt->emap);
  rt->rmap = lp_malloc((size_t)(r ? r : 1) * sizeof *rt->rmap);
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

/* ---- forward ---- */

/* The shared expert in two pieces, each computed while an exchange of the
 * layer flies (it depends on x only): its first half (a1 = x W1^T, a3 =
 * x W3^T, h = silu(a1) * a3) after the dispatch has started, its output
 * (h W2^T) after the combine has started. The same operations on the same
 * tensors as swiglu_fwd at once: bitwise the same output. */
static lp_status shared_fwd_in(lp_nn_layer *l, lp_nn_ctx *ctx) {
  struct nn_moe *m = l->moe;
  route *rt = ctx->ext;
  if (m->o.shared <= 0) return LP_OK;
  lp_tensor *sa1, *sa3, *sh;
  LP_CHECK(new2(rt, rt->n, m->hs, &sa1));
  nn_keep(ctx, M_SHA1, sa1);
  LP_CHECK(new2(rt, rt->n, m->hs, &sa3));
  nn_keep(ctx, M_SHA3, sa3);
  LP_CHECK(new2(rt, rt->n, m->hs, &sh));
  nn_keep(ctx, M_SHH, sh);
  LP_CHECK(lp_tensor_gemm(sa1, 1.0f, ctx->saved[M_X], 0, P_SH(l, 0).value, 1, 0.0f));
  LP_CHECK(lp_tensor_gemm(sa3, 1.0f, ctx->saved[M_X], 0, P_SH(l, 1).value, 1, 0.0f));
  LP_CHECK(lp_tensor_act(sh, LP_TENSOR_ACT_SILU, sa1));
  return lp_tensor_mul(sh, sh, sa3);
}

static lp_status shared_fwd_out(lp_nn_layer *l, lp_nn_ctx *ctx) {
  struct nn_moe *m = l->moe;
  route *rt = ctx->ext;
  if (m->o.shared <= 0) return LP_OK;
  lp_tensor *so;
  LP_CHECK(new2(rt, rt->n, m->o.dim, &so));
  nn_keep(ctx, M_SHOUT, so);
  return lp_tensor_gemm(so, 1.0f, ctx->saved[M_SHH], 0, P_SH(l, 2).value, 1, 0.0f);
}

static lp_status fwd_router(lp_nn_layer *l, lp_nn_ctx *ctx, int *waiting) {
  struct nn_moe *m = l->moe;
  const lp_tensor *x = ctx->in;
  int64_t D = m->o.dim;
  int E = m->o.experts;
  *waiting = 0;
  if (x->shape[x->ndim - 1] != D || (x->ndim != 2 && x->ndim != 3)) {
    char a[64];
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "input must be [tokens, %lld] or [batch, seq, %lld], got %s",
                   (long long)D, (long long)D, nn_shape_str(x, a, sizeof a));
  }
  route *rt = lp_calloc(1, sizeof *rt);
  if (!rt) return LP_ERR_NOMEM;
  ctx->ext = rt;
  ctx->ext_free = route_free;
  rt->be = lp_tensor_backend_of(x);
  rt->xndim = x->ndim;
  for (int i = 0; i < x->ndim; i++)
    rt->xshape[i] = x->shape[i];
  lp_tensor_rows_cols(x, &rt->n, NULL);
  rt->pairs = rt->n * m->o.topk;
  rt->seqs = x->ndim == 3 ? x->shape[0] : 1;
  rt->seqlen = x->ndim == 3 ? x->shape[1] : rt->n;

  lp_tensor *xd = NULL, *x2 = NULL, *s = NULL, *send = NULL;
  LP_CHECK(nn_dense(x, &xd));
  lp_status st = lp_tensor_reshape(xd, 2, (int64_t[]){rt->n, D}, &x2);
  lp_tensor_free(xd);
  LP_CHECK(st);
  nn_keep(ctx, M_X, x2);
  /* the logits on the backend, the routing decisions on the host: only
   * the [tokens, E] affinities come back */
  LP_CHECK(new2(rt, rt->n, E, &s));
  nn_keep(ctx, M_S, s);
  LP_CHECK(lp_tensor_gemm(s, 1.0f, x2, 0, P_ROUTER(l), 1, 0.0f));
  if (m->o.router == LP_NN_ROUTER_SOFTMAX)
    LP_CHECK(lp_tensor_softmax_rows(s, s));
  rt->s = lp_malloc(at_least1(rt->n * E) * sizeof *rt->s);
  if (!rt->s) return LP_ERR_NOMEM;
  LP_CHECK(lp_tensor_read(s, rt->s));
  nn_drop(ctx, M_S);
  if (m->o.router != LP_NN_ROUTER_SOFTMAX)
    for (int64_t i = 0; i < rt->n * E; i++)
      rt->s[i] = 1.0f / (1.0f + expf(-rt->s[i]));
  LP_CHECK(make_route(l, rt));
  if (m->o.balance_alpha > 0.0f) {
    double *f = lp_malloc((size_t)E * sizeof *f);
    if (!f) return LP_ERR_NOMEM;
    m->aux = balance(m, rt, rt->s, NULL, f);
    lp_free(f);
  }
  if (m->size == 1) {
    memcpy(rt->cnt_recv, rt->cnt_send, (size_t)m->spr * sizeof(float));
  } else { /* the counts fly while the rows are gathered */
    *waiting = 1;
    LP_CHECK(xstart(l, ctx, rt->cnt_send, rt->cs, rt->cnt_recv, rt->cs,
                    LP_NN_X_DISPATCH_COUNT, NULL));
  }
  LP_CHECK(new2(rt, rt->pairs, D, &send));
  nn_keep(ctx, M_SEND, send);
  return lp_tensor_gather_rows(send, x2, rt->tok, NULL);
}

static lp_status fwd_counts(lp_nn_layer *l, lp_nn_ctx *ctx, int *waiting) {
  struct nn_moe *m = l->moe;
  route *rt = ctx->ext;
  *waiting = 0;
  LP_CHECK(xfinish(l, ctx));
  LP_CHECK(make_expert_order(m, rt));
  if (m->size == 1) {
    LP_CHECK(lp_tensor_view(ctx->saved[M_SEND], &ctx->saved[M_RECV]));
    return shared_fwd_in(l, ctx);
  }
  lp_tensor *recv;
  LP_CHECK(new2(rt, rt->r, m->o.dim, &recv));
  nn_keep(ctx, M_RECV, recv);
  *waiting = 1;
  LP_CHECK(xstart_rows(l, ctx, ctx->saved[M_SEND], rt->sc, recv, rt->rc,
                       LP_NN_X_DISPATCH));
  return shared_fwd_in(l, ctx); /* while the rows travel */
}

static lp_status fwd_experts(lp_nn_layer *l, lp_nn_ctx *ctx, int *waiting) {
  struct nn_moe *m = l->moe;
  route *rt = ctx->ext;
  int64_t D = m->o.dim, H = m->o.hidden, R = rt->r;
  *waiting = 0;
  LP_CHECK(xfinish(l, ctx));
  nn_drop(ctx, M_SEND);
  lp_tensor *xin, *a1, *a3, *h, *oute = NULL, *outr;
  LP_CHECK(new2(rt, R, D, &xin));
  nn_keep(ctx, M_XIN, xin);
  LP_CHECK(lp_tensor_gather_rows(xin, ctx->saved[M_RECV], rt->emap, NULL));
  nn_drop(ctx, M_RECV);
  LP_CHECK(new2(rt, R, H, &a1));
  nn_keep(ctx, M_A1, a1);
  LP_CHECK(new2(rt, R, H, &a3));
  nn_keep(ctx, M_A3, a3);
  LP_CHECK(new2(rt, R, H, &h));
  nn_keep(ctx, M_H, h);
  LP_CHECK(new2(rt, R, D, &outr));
  nn_keep(ctx, M_OUTR, outr);
  lp_status st = new2(rt, R, D, &oute);
  for (int j = 0; j < m->spr && st == LP_OK; j++) {
    int64_t a = rt->soff[j], n = rt->soff[j + 1] - a;
    if (n == 0) continue;
    lp_tensor *v[5] = {NULL};
    st = rows_of(xin, a, n, &v[0]);
    if (st == LP_OK) st = rows_of(a1, a, n, &v[1]);
    if (st == LP_OK) st = rows_of(a3, a, n, &v[2]);
    if (st == LP_OK) st = rows_of(h, a, n, &v[3]);
    if (st == LP_OK) st = rows_of(oute, a, n, &v[4]);
    if (st == LP_OK)
      st = swiglu_fwd(v[0], P_SLOT(l, j, 0).value, P_SLOT(l, j, 1).value,
                      P_SLOT(l, j, 2).value, v[1], v[2], v[3], v[4]);
    for (int i = 0; i < 5; i++)
      lp_tensor_free(v[i]);
  }
  if (st == LP_OK) st = lp_tensor_gather_rows(outr, oute, rt->rmap, NULL);
  lp_tensor_free(oute);
  LP_CHECK(st);
  if (m->size == 1) {
    LP_CHECK(lp_tensor_view(outr, &ctx->saved[M_COMB]));
  } else {
    lp_tensor *comb;
    LP_CHECK(new2(rt, rt->pairs, D, &comb));
    nn_keep(ctx, M_COMB, comb);
    *waiting = 1;
    LP_CHECK(xstart_rows(l, ctx, outr, rt->rc, comb, rt->sc, LP_NN_X_COMBINE));
  }
  return shared_fwd_out(l, ctx); /* while the outputs travel back */
}

static lp_status fwd_combine(lp_nn_layer *l, lp_nn_ctx *ctx, lp_tensor **y) {
  struct nn_moe *m = l->moe;
  route *rt = ctx->ext;
  LP_CHECK(xfinish(l, ctx));
  nn_drop(ctx, M_OUTR);
  lp_tensor *y2 = NULL;
  if (m->o.shared > 0) {
    y2 = ctx->saved[M_SHOUT];
    ctx->saved[M_SHOUT] = NULL;
  } else {
    LP_CHECK(lp_tensor_zeros(rt->be, 2, (int64_t[]){rt->n, m->o.dim}, &y2));
  }
  lp_status st =
      lp_tensor_index_add_rows(y2, ctx->saved[M_COMB], rt->tok, rt->wsend);
  if (st == LP_OK) st = lp_tensor_reshape(y2, rt->xndim, rt->xshape, y);
  lp_tensor_free(y2);
  return st;
}

/* ---- input-grad ---- */

/* d(affinities) -> d(logits) into dlog (dlog holds ds on entry). */
static void router_act_bwd(const struct nn_moe *m, const float *s,
                           float *dlog, int64_t n) {
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

static lp_status bwd_dense(lp_nn_layer *l, lp_nn_ctx *ctx, int *waiting) {
  struct nn_moe *m = l->moe;
  route *rt = ctx->ext;
  int E = m->o.experts, K = m->o.topk;
  int64_t D = m->o.dim, n = rt->n;
  const lp_tensor *dy = ctx->in;
  *waiting = 0;
  int ok = dy->ndim == rt->xndim;
  for (int i = 0; ok && i < dy->ndim; i++)
    ok = dy->shape[i] == rt->xshape[i];
  if (!ok) {
    char a[64];
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "dy has shape %s, forward output had %lld tokens of %lld",
                   nn_shape_str(dy, a, sizeof a), (long long)n, (long long)D);
  }
  lp_tensor *dyd = NULL, *dy2 = NULL, *dlog, *dx, *dcomb;
  LP_CHECK(nn_dense(dy, &dyd));
  lp_status st = lp_tensor_reshape(dyd, 2, (int64_t[]){n, D}, &dy2);
  lp_tensor_free(dyd);
  LP_CHECK(st);
  nn_keep(ctx, M_DY, dy2);
  /* the weighted dy rows go back to the experts first: the router's and
   * the shared expert's backward (they need dy only) run while they fly */
  LP_CHECK(new2(rt, rt->pairs, D, &dcomb));
  nn_keep(ctx, M_DCOMB, dcomb);
  LP_CHECK(lp_tensor_gather_rows(dcomb, dy2, rt->tok, rt->wsend));
  if (m->size == 1) {
    LP_CHECK(lp_tensor_view(dcomb, &ctx->saved[M_DOUTR]));
  } else {
    lp_tensor *doutr;
    LP_CHECK(new2(rt, rt->r, D, &doutr));
    nn_keep(ctx, M_DOUTR, doutr);
    *waiting = 1;
    LP_CHECK(xstart_rows(l, ctx, dcomb, rt->sc, doutr, rt->rc,
                         LP_NN_X_COMBINE_BACKWARD));
  }
  const lp_tensor *comb = ctx->saved[M_COMB];

  /* router: dg of each pair (dy row . expert output row, in double, on
   * the backend: dot_rows), then d(affinities), d(logits) on the host;
   * only [pairs] and [tokens, E] cross between them */
  float *dl = lp_calloc(at_least1(n * E), sizeof *dl);
  float *dgs = lp_malloc(at_least1(rt->pairs) * sizeof *dgs);
  float *dg = lp_malloc(at_least1(rt->pairs) * sizeof *dg);
  lp_tensor *dgt = NULL;
  lp_status st2 = dl && dgs && dg ? LP_OK : LP_ERR_NOMEM;
  if (st2 == LP_OK)
    st2 = lp_tensor_empty(rt->be, 1, (int64_t[]){rt->pairs}, &dgt);
  if (st2 == LP_OK) st2 = lp_tensor_dot_rows(dgt, dy2, rt->tok, comb);
  if (st2 == LP_OK) st2 = lp_tensor_read(dgt, dgs);
  lp_tensor_free(dgt);
  for (int64_t i = 0; st2 == LP_OK && i < rt->pairs; i++)
    dg[rt->perm[i]] = dgs[i];
  lp_free(dgs);
  for (int64_t t = 0; st2 == LP_OK && t < n; t++) {
    double sum = 0.0, gw = 0.0;
    for (int k = 0; k < K; k++) {
      sum += rt->s[t * E + rt->sel[t * K + k]];
      gw += (double)dg[t * K + k] * rt->w[t * K + k];
    }
    float denom = (float)sum + 1e-20f;
    /* w_k = c s_k / S: ds_j = (c dg_j - sum_k dg_k w_k) / S */
    for (int k = 0; k < K; k++)
      dl[t * E + rt->sel[t * K + k]] +=
          (m->scale * dg[t * K + k] - (float)gw) / denom;
  }
  lp_free(dg);
  if (st2 == LP_OK && m->o.balance_alpha > 0.0f) {
    double *f = lp_malloc((size_t)E * sizeof *f);
    if (f)
      balance(m, rt, rt->s, dl, f);
    else
      st2 = LP_ERR_NOMEM;
    lp_free(f);
  }
  if (st2 == LP_OK) {
    router_act_bwd(m, rt->s, dl, n);
    st2 = lp_tensor_from_data(rt->be, 2, (int64_t[]){n, E}, dl, &dlog);
  }
  lp_free(dl);
  LP_CHECK(st2);
  nn_keep(ctx, M_DLOG, dlog);
  LP_CHECK(new2(rt, n, D, &dx));
  nn_keep(ctx, M_DX, dx);
  LP_CHECK(lp_tensor_gemm(dx, 1.0f, dlog, 0, P_ROUTER(l), 0, 0.0f));

  if (m->o.shared > 0) {
    lp_tensor *da1, *da3;
    LP_CHECK(new2(rt, n, m->hs, &da1));
    nn_keep(ctx, M_SHDA1, da1);
    LP_CHECK(new2(rt, n, m->hs, &da3));
    nn_keep(ctx, M_SHDA3, da3);
    LP_CHECK(swiglu_bwd(dy2, ctx->saved[M_SHA1], ctx->saved[M_SHA3],
                        P_SH(l, 0).value, P_SH(l, 1).value, P_SH(l, 2).value,
                        da1, da3, dx, 1.0f));
    nn_drop(ctx, M_SHA1);
    nn_drop(ctx, M_SHA3);
  }
  nn_drop(ctx, M_COMB);
  return LP_OK;
}

static lp_status bwd_experts(lp_nn_layer *l, lp_nn_ctx *ctx, int *waiting) {
  struct nn_moe *m = l->moe;
  route *rt = ctx->ext;
  int64_t D = m->o.dim, H = m->o.hidden, R = rt->r;
  *waiting = 0;
  LP_CHECK(xfinish(l, ctx));
  nn_drop(ctx, M_DCOMB);
  lp_tensor *dout, *da1, *da3, *dxe = NULL, *dxr;
  LP_CHECK(new2(rt, R, D, &dout));
  nn_keep(ctx, M_DOUT, dout);
  LP_CHECK(lp_tensor_gather_rows(dout, ctx->saved[M_DOUTR], rt->emap, NULL));
  nn_drop(ctx, M_DOUTR);
  LP_CHECK(new2(rt, R, H, &da1));
  nn_keep(ctx, M_DA1, da1);
  LP_CHECK(new2(rt, R, H, &da3));
  nn_keep(ctx, M_DA3, da3);
  LP_CHECK(new2(rt, R, D, &dxr));
  nn_keep(ctx, M_DXR, dxr);
  lp_status st = new2(rt, R, D, &dxe);
  for (int j = 0; j < m->spr && st == LP_OK; j++) {
    int64_t a = rt->soff[j], n = rt->soff[j + 1] - a;
    if (n == 0) continue;
    lp_tensor *v[6] = {NULL};
    st = rows_of(dout, a, n, &v[0]);
    if (st == LP_OK) st = rows_of(ctx->saved[M_A1], a, n, &v[1]);
    if (st == LP_OK) st = rows_of(ctx->saved[M_A3], a, n, &v[2]);
    if (st == LP_OK) st = rows_of(da1, a, n, &v[3]);
    if (st == LP_OK) st = rows_of(da3, a, n, &v[4]);
    if (st == LP_OK) st = rows_of(dxe, a, n, &v[5]);
    if (st == LP_OK)
      st = swiglu_bwd(v[0], v[1], v[2], P_SLOT(l, j, 0).value,
                      P_SLOT(l, j, 1).value, P_SLOT(l, j, 2).value, v[3], v[4],
                      v[5], 0.0f);
    for (int i = 0; i < 6; i++)
      lp_tensor_free(v[i]);
  }
  if (st == LP_OK) st = lp_tensor_gather_rows(dxr, dxe, rt->rmap, NULL);
  lp_tensor_free(dxe);
  LP_CHECK(st);
  nn_drop(ctx, M_A1);
  nn_drop(ctx, M_A3);
  if (m->size == 1) return lp_tensor_view(dxr, &ctx->saved[M_DXS]);
  lp_tensor *dxs;
  LP_CHECK(new2(rt, rt->pairs, D, &dxs));
  nn_keep(ctx, M_DXS, dxs);
  *waiting = 1;
  return xstart_rows(l, ctx, dxr, rt->rc, dxs, rt->sc, LP_NN_X_DISPATCH_BACKWARD);
}

static lp_status bwd_dispatch(lp_nn_layer *l, lp_nn_ctx *ctx, lp_tensor **dx) {
  route *rt = ctx->ext;
  LP_CHECK(xfinish(l, ctx));
  nn_drop(ctx, M_DXR);
  lp_tensor *d2 = ctx->saved[M_DX];
  LP_CHECK(lp_tensor_index_add_rows(d2, ctx->saved[M_DXS], rt->tok, NULL));
  nn_drop(ctx, M_DXS);
  nn_drop(ctx, M_S);
  if (ctx->want_dx) LP_CHECK(lp_tensor_reshape(d2, rt->xndim, rt->xshape, dx));
  nn_drop(ctx, M_DX);
  return LP_OK;
}

/* ---- the phased pass ---- */

static lp_status moe_advance(lp_nn_layer *l, lp_nn_ctx *ctx, int *done,
                             lp_tensor **out) {
  int wait = 0;
  if (ctx->pass == NN_PASS_FORWARD) {
    switch (ctx->phase) {
    case PH_ROUTER:
      LP_CHECK(fwd_router(l, ctx, &wait));
      ctx->phase = PH_COUNTS;
      if (wait) return LP_OK;
      /* fall through */
    case PH_COUNTS:
      LP_CHECK(fwd_counts(l, ctx, &wait));
      ctx->phase = PH_EXPERTS;
      if (wait) return LP_OK;
      /* fall through */
    case PH_EXPERTS:
      LP_CHECK(fwd_experts(l, ctx, &wait));
      ctx->phase = PH_COMBINE;
      if (wait) return LP_OK;
      /* fall through */
    default:
      LP_CHECK(fwd_combine(l, ctx, out));
      *done = 1;
      return LP_OK;
    }
  }
  switch (ctx->phase) {
  case PH_DENSE:
    LP_CHECK(bwd_dense(l, ctx, &wait));
    ctx->phase = PH_BEXPERTS;
    if (wait) return LP_OK;
    /* fall through */
  case PH_BEXPERTS:
    LP_CHECK(bwd_experts(l, ctx, &wait));
    ctx->phase = PH_BDISPATCH;
    if (wait) return LP_OK;
    /* fall through */
  default:
    LP_CHECK(bwd_dispatch(l, ctx, out));
    *done = 1;
    return LP_OK;
  }
}

static lp_nn_phase moe_phase(const lp_nn_layer *l, const lp_nn_ctx *ctx) {
  (void)l;
  if (ctx->pass == NN_PASS_FORWARD) {
    static const lp_nn_phase f[] = {LP_NN_PHASE_DENSE, LP_NN_PHASE_DISPATCH,
                                    LP_NN_PHASE_EXPERTS, LP_NN_PHASE_COMBINE};
    return f[ctx->phase];
  }
  static const lp_nn_phase b[] = {LP_NN_PHASE_DENSE, LP_NN_PHASE_EXPERTS,
                                  LP_NN_PHASE_DISPATCH};
  return b[ctx->phase];
}

/* The routed experts' weight-grads (this rank's slots, on the rows they
 * received), then what only they needed is released. */
static lp_status experts_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  struct nn_moe *m = l->moe;
  route *rt = ctx->ext;
  for (int j = 0; j < m->spr; j++) {
    int64_t a = rt->soff[j], n = rt->soff[j + 1] - a;
    if (n == 0) continue;
    lp_tensor *v[5] = {NULL};
    const int src[5] = {M_XIN, M_H, M_DOUT, M_DA1, M_DA3};
    lp_status st = LP_OK;
    for (int i = 0; i < 5 && st == LP_OK; i++)
      st = rows_of(ctx->saved[src[i]], a, n, &v[i]);
    if (st == LP_OK)
      st = swiglu_wgrad(v[0], v[1], v[2], v[3], v[4], P_SLOT(l, j, 0).grad,
                        P_SLOT(l, j, 1).grad, P_SLOT(l, j, 2).grad);
    for (int i = 0; i < 5; i++)
      lp_tensor_free(v[i]);
    LP_CHECK(st);
  }
  rt->experts_w_done = 1;
  nn_drop(ctx, M_XIN), nn_drop(ctx, M_H), nn_drop(ctx, M_DOUT);
  nn_drop(ctx, M_DA1), nn_drop(ctx, M_DA3);
  return LP_OK;
}

static lp_status moe_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  struct nn_moe *m = l->moe;
  route *rt = ctx->ext;
  const lp_tensor *x = ctx->saved[M_X];
  LP_CHECK(lp_tensor_gemm(l->params[0].grad, 1.0f, ctx->saved[M_DLOG], 1, x, 0,
                          1.0f));
  if (m->o.shared > 0)
    LP_CHECK(swiglu_wgrad(x, ctx->saved[M_SHH], ctx->saved[M_DY],
                          ctx->saved[M_SHDA1], ctx->saved[M_SHDA3],
                          P_SH(l, 0).grad, P_SH(l, 1).grad, P_SH(l, 2).grad));
  return rt->experts_w_done ? LP_OK : experts_weight_grad(l, ctx);
}

/* The experts' weight-grads ahead of the rest, once the input-grad pass
 * has run their backward (while dispatch-backward is in flight: DeepSeek's
 * MLP(W) right after MLP(B)). Different parameters from the router's and
 * shared expert's: the gradients are bitwise those of weight_grad alone. */
static lp_status moe_weight_grad_part(lp_nn_layer *l, lp_nn_ctx *ctx, int *did) {
  route *rt = ctx->ext;
  int ready = ctx->pass == NN_PASS_INPUT_GRAD ? ctx->phase == PH_BDISPATCH
              : ctx->pass == NN_PASS_NONE && ctx->stage == LP_NN_CTX_INPUT_GRAD;
  if (!rt || rt->experts_w_done || !ready) return LP_OK;
  lp_status st = experts_weight_grad(l, ctx);
  if (st != LP_OK) return nn_fail(ctx, l, st, "weight_grad: %s", lp_strerror(st));
  *did = 1;
  return LP_OK;
}

static const nn_ops moe_ops = {"moe", nn_no_call, nn_no_call,
                               moe_weight_grad};
static const nn_phased moe_phased = {moe_advance, moe_phase, moe_weight_grad_part};

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
  const struct nn_moe *m = l->moe;
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
  struct nn_moe *m = l->moe;
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
  /* new slot j: move an old local slot with the same expert, else copy an
   * earlier new slot of it, else fresh */
  for (int j = 0; j < spr; j++) {
    int e = p2[rank * spr + j];
    src[j] = -1;
    for (int k = 0; k < old_spr && src[j] < 0; k++) {
      const char *nm = l->params[m->slot0 + 3 * (size_t)k].name;
      char want[64];
      snprintf(want, sizeof want, ".experts.%d.w1", e);
      size_t a = strlen(nm), b = strlen(want);
      if (!taken[k] && a >= b && strcmp(nm + a - b, want) == 0) {
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
  int E = l->moe->o.experts, spr = (E + size - 1) / size;
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
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  if (!o || o->dim < 1 || o->hidden < 1 || o->experts < 1 ||
      o->experts > 65536 || o->topk < 1 || o->topk > o->experts ||
      o->shared < 0 || o->groups < 0 || o->topk_groups < 0 ||
      !(o->route_scale >= 0.0f) || !(o->bias_speed >= 0.0f) ||
      !(o->balance_alpha >= 0.0f) ||
      (o->router != LP_NN_ROUTER_SIGMOID && o->router != LP_NN_ROUTER_SOFTMAX))
    return LP_ERR_ARG;
  int G = o->groups > 1 ? o->groups : 1;
  int TG = o->topk_groups > 0 ? o->topk_groups : G;
  if (o->experts % G || G > 256 || TG > G ||
      (int64_t)TG * (o->experts / G) < o->topk)
    return LP_ERR_ARG;
  lp_nn_layer *l;
  LP_CHECK(nn_layer_alloc(&moe_ops, name, &l));
  l->phased = &moe_phased;
  l->owns_params = 1;
  lp_status st = LP_ERR_NOMEM;
  struct nn_moe *m = lp_calloc(1, sizeof *m);
  if (!m) goto fail;
  l->moe = m;
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
  st = default_placement(l, 1, 0);
  if (st != LP_OK) goto fail;
  *layer = l;
  return LP_OK;
fail:
  lp_nn_layer_release(l);
  return st;
}

/* ---- EP, placement, loads, bias ---- */

static struct nn_moe *moe_of(const lp_nn_layer *l) { return l ? l->moe : NULL; }

static lp_status set_ep_rec(lp_nn_layer *l, const lp_nn_ep *ep) {
  for (size_t i = 0; i < l->nchild; i++)
    LP_CHECK(set_ep_rec(l->child[i], ep));
  if (!l->moe) return LP_OK;
  int size = ep ? ep->size : 1, rank = ep ? ep->rank : 0;
  LP_CHECK(default_placement(l, size, rank));
  if (size > 1) l->moe->ep = *ep;
  return LP_OK;
}

lp_status lp_nn_set_loss_scale(lp_nn_layer *l, float scale) {
  if (!l || !(scale > 0.0f) || !isfinite(scale)) return LP_ERR_ARG;
  for (size_t i = 0; i < l->nchild; i++)
    LP_CHECK(lp_nn_set_loss_scale(l->child[i], scale));
  if (l->moe) l->moe->loss_scale = scale;
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
  struct nn_moe *m = moe_of(moe);
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
  struct nn_moe *m = moe_of(moe);
  if (out) *out = NULL;
  if (n) *n = 0;
  if (!m || !out || slot < m->rank * m->spr || slot >= (m->rank + 1) * m->spr)
    return LP_ERR_ARG;
  *out = &P_SLOT(moe, slot - m->rank * m->spr, 0);
  if (n) *n = 3;
  return LP_OK;
}

int lp_nn_moe_slots_per_rank(const lp_nn_layer *moe) {
  return moe_of(moe) ? moe->moe->spr : 0;
}

lp_status lp_nn_moe_placement(const lp_nn_layer *moe, int *phys_to_log) {
  struct nn_moe *m = moe_of(moe);
  if (!m) return LP_ERR_ARG;
  if (phys_to_log)
    memcpy(phys_to_log, m->p2l, (size_t)(m->size * m->spr) * sizeof(int));
  return LP_OK;
}

const lp_nn_moe_opts *lp_nn_moe_get_opts(const lp_nn_layer *moe) {
  return moe_of(moe) ? &moe->moe->o : NULL;
}

lp_status lp_nn_moe_expert_load(const lp_nn_layer *moe, int64_t *counts) {
  struct nn_moe *m = moe_of(moe);
  if (!m || !counts) return LP_ERR_ARG;
  memcpy(counts, m->load, (size_t)m->o.experts * sizeof *counts);
  return LP_OK;
}

void lp_nn_moe_load_reset(lp_nn_layer *moe) {
  struct nn_moe *m = moe_of(moe);
  if (m) memset(m->load, 0, (size_t)m->o.experts * sizeof *m->load);
}

lp_status lp_nn_moe_update_bias(lp_nn_layer *moe,
                                const int64_t *global_counts) {
  struct nn_moe *m = moe_of(moe);
  if (!m || !global_counts) return LP_ERR_ARG;
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
  struct nn_moe *m = moe_of(moe);
  if (!m || !bias) return LP_ERR_ARG;
  memcpy(bias, m->bias, (size_t)m->o.experts * sizeof *bias);
  return LP_OK;
}

lp_status lp_nn_moe_set_bias(lp_nn_layer *moe, const float *bias) {
  struct nn_moe *m = moe_of(moe);
  if (!m || !bias) return LP_ERR_ARG;
  memcpy(m->bias, bias, (size_t)m->o.experts * sizeof *bias);
  return LP_OK;
}

lp_status lp_nn_moe_route(const lp_nn_layer *moe, const lp_tensor *x, int *experts,
                          float *weights, float *scores) {
  struct nn_moe *m = moe_of(moe);
  if (!m || !x || !experts || !weights || !scores) return LP_ERR_ARG;
  int64_t D = m->o.dim, n;
  int E = m->o.experts, K = m->o.topk;
  if ((x->ndim != 2 && x->ndim != 3) || x->shape[x->ndim - 1] != D) return LP_ERR_ARG;
  lp_tensor_rows_cols(x, &n, NULL);
  if (n == 0) return LP_OK;
  /* the affinities as fwd_router makes them: logits on the backend,
   * softmax there, sigmoid on the host copy */
  lp_tensor *xd = NULL, *x2 = NULL, *s = NULL;
  float *v = lp_malloc((size_t)E * sizeof *v);
  int *ok = lp_malloc((size_t)E * sizeof *ok);
  lp_status st = v && ok ? nn_dense(x, &xd) : LP_ERR_NOMEM;
  if (st == LP_OK) st = lp_tensor_reshape(xd, 2, (int64_t[]){n, D}, &x2);
  if (st == LP_OK)
    st = lp_tensor_empty(lp_tensor_backend_of(x), 2, (int64_t[]){n, E}, &s);
  if (st == LP_OK) st = lp_tensor_gemm(s, 1.0f, x2, 0, P_ROUTER(moe), 1, 0.0f);
  if (st == LP_OK && m->o.router == LP_NN_ROUTER_SOFTMAX) st = lp_tensor_softmax_rows(s, s);
  if (st == LP_OK) st = lp_tensor_read(s, scores);
  if (st == LP_OK) {
    if (m->o.router != LP_NN_ROUTER_SOFTMAX)
      for (int64_t i = 0; i < n * E; i++) scores[i] = 1.0f / (1.0f + expf(-scores[i]));
    for (int64_t t = 0; t < n; t++)
      route_token(m, scores + t * E, experts + t * K, weights + t * K, v, ok);
  }
  lp_tensor_free(s);
  lp_tensor_free(x2);
  lp_tensor_free(xd);
  lp_free(v);
  lp_free(ok);
  return st;
}

double lp_nn_moe_aux_loss(const lp_nn_layer *moe) {
  return moe_of(moe) ? moe->moe->aux : 0.0;
}

int lp_nn_moe_count(const lp_nn_layer *l) {
  if (!l) return 0;
  int n = l->moe ? 1 : 0;
  for (size_t i = 0; i < l->nchild; i++)
    n += lp_nn_moe_count(l->child[i]);
  return n;
}

lp_nn_layer *lp_nn_moe_find(const lp_nn_layer *l, int i) {
  if (!l || i < 0) return NULL;
  if (l->moe) {
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
    const struct nn_moe *mm = m->moe;
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
