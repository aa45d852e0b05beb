/* moe_internal.h — private to the MoE layer's three files: its state
 * (struct nn_moe, owned by the layer as lp_nn_layer.sub), the routing of one
 * micro-batch (moe_route, owned by the ctx as lp_nn_ctx.ext), and what each
 * file gives the others:
 *   moe_route.c  routing math: affinities, the Gate's selection and weights,
 *                the balance loss, send and expert orders, the router's
 *                backward, lp_nn_moe_route
 *   moe.c        the phased pass: exchanges, routed and shared experts,
 *                weight-grads; the layer's ops
 *   moe_slots.c  the constructor, slots and placement, the EP group, the
 *                bias / load API, parameter roles */
#pragma once

#include "nn_internal.h"

typedef struct nn_moe {
  lp_nn_moe_opts o;
  uint64_t seed;
  int64_t hs;       /* shared hidden size */
  float scale;      /* route scale */
  float *bias;      /* [E] (all zero with o.no_bias) */
  int64_t *load;    /* [E] */
  double aux;       /* balance loss of the last forward */
  float loss_scale; /* lp_nn_set_loss_scale (1 by default) */
  lp_nn_ep ep;      /* valid when size > 1 */
  int size, rank, spr;
  int *p2l;       /* [size * spr] */
  int *rep_start; /* [E + 1]: replicas of e are rep_slots[rep_start[e]..) */
  int *rep_slots; /* [size * spr] */
  size_t slot0;   /* index in params of the first local slot's w1 */
} nn_moe;

/* Routing of one micro-batch (ctx->ext). */
typedef struct moe_route {
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
  int experts_w_done; /* the routed experts' weight-grads already ran */
  lp_nn_xkind xkind;  /* the exchange in flight (ctx->xchg) */
} moe_route;

/* The MoE layer's ops (moe.c): a layer is an MoE layer when its ops are
 * these. */
extern const nn_ops nn_moe_ops;
extern const nn_phased nn_moe_phased;

/* l's MoE state, NULL when l is not an MoE layer (or NULL). */
static inline nn_moe *moe_of(const lp_nn_layer *l) {
  return l && l->ops == &nn_moe_ops ? l->sub : NULL;
}

#define P_ROUTER(l) ((l)->params[0].value)
#define P_SH(l, i) ((l)->params[1 + (i)])
#define P_SLOT(l, j, i) \
  ((l)->params[moe_of(l)->slot0 + 3 * (size_t)(j) + (i)])

/* An allocation count of at least 1 for n elements. */
static inline size_t moe_at_least1(int64_t n) { return (size_t)(n > 0 ? n : 1); }

/* ---- moe_route.c ---- */

/* LP_OK when the router options of o are consistent (groups divide the
 * experts, at most 256 of them, enough eligible experts for topk, a
 * known score function, no bias_speed without a bias), else LP_ERR_ARG. */
lp_status moe_route_check(const lp_nn_moe_opts *o);
/* The affinities of x2 [n, dim] (on the layer's backend) into s [n * E] on
 * the host: logits on the backend, softmax there, sigmoid on the host. */
lp_status moe_scores(const lp_nn_layer *l, const lp_tensor *x2, int64_t n,
                     float *s);
/* Routes every token of rt (affinities rt->s): selection and weights, the
 * loads, the send order by destination slot and the counts per slot. */
lp_status moe_make_route(nn_moe *m, moe_route *rt);
/* After the count exchange: rows received, the expert order and its maps. */
lp_status moe_make_expert_order(const nn_moe *m, moe_route *rt);
/* The balance loss of the micro-batch into m->aux (0 when off). */
lp_status moe_balance_forward(nn_moe *m, const moe_route *rt);
/* The router's backward: d(logits) [n, E] on rt's backend (*dlog, owned)
 * from dy2 [n, dim] and the expert outputs comb [pairs, dim] (send order):
 * each pair's weight grad (dy row . output row), through the weights, the
 * balance loss and the score function. */
lp_status moe_router_backward(const lp_nn_layer *l, const moe_route *rt,
                              const lp_tensor *dy2, const lp_tensor *comb,
                              lp_tensor **dlog);
/* Frees a moe_route (ctx->ext_free). */
void moe_route_free(void *p);

/* ---- moe_slots.c ---- */

/* Frees the layer's nn_moe (lp_nn_layer.sub_free). */
void moe_free(void *m);
