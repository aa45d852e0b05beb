/* lp_nn.h — neural-network layers for pipeline training: every layer has a
 * forward, an input-grad (I) and a weight-grad (W) call so zero-bubble
 * schedules can split backward; per-micro-batch contexts hold what backward
 * needs; a chunk (sequential container) is what one model stage holds;
 * losses; SGD and AdamW. Built on lp_tensor: runs on whichever backend
 * holds the parameters (CPU, or CUDA after lp_nn_layer_to); no Lua.
 *
 * The life of one micro-batch on one layer (or chunk) `l`:
 *
 *   lp_nn_ctx *c;  lp_nn_ctx_new(&c);         caller owns c; keep many
 *   lp_nn_forward(l, c, x, &y);               c: FORWARD (stashes x, ...)
 *   lp_nn_input_grad(l, c, dy, &dx);          c: INPUT_GRAD (keeps W's needs)
 *   ... any number of other micro-batches' F / I / W on their own ctxs ...
 *   lp_nn_weight_grad(l, c, NULL);            grads += ...; c: EMPTY again
 *   lp_nn_ctx_free(c);                        (or reuse it for the next mb)
 *
 * lp_nn_backward(l, c, dy, &dx) is I then W in one call. W without a prior I
 * is allowed (pass dy); it does the internal part of I that W needs.
 * F and I can also run in phases between expert-parallel exchanges
 * (lp_nn_forward_begin / lp_nn_advance, below), which is how an executor
 * overlaps one micro-batch's all-to-all with another's compute; the MoE
 * layer and its expert parallelism (lp_nn_ep, placements) are at the end.
 *
 * Stashing is by reference: forward keeps views of x and input_grad keeps
 * views of dy (storage refcounts keep them alive after the caller frees its
 * headers). The caller must not WRITE into x's or dy's storage until the
 * ctx is back to EMPTY (after W, or lp_nn_ctx_clear). Outputs (y, dx) are
 * new tensors owned by the caller; layers never write to them afterwards.
 *
 * Token ids and class targets are float tensors holding integral values
 * (exact up to 2^24); an id outside [0, vocab) is LP_ERR_ARG.
 *
 * Gradients accumulate (+=) into each parameter's grad over micro-batches
 * until lp_nn_zero_grad / lp_nn_optim_zero_grad. For a fixed sequence of
 * calls, every result is bitwise reproducible (single-threaded BLAS).
 * A layer and its contexts are used from one thread at a time.
 *
 * Errors: every call returns an lp_status; the text for the last failure of
 * a micro-batch is lp_nn_ctx_last_error(ctx) ("layer blocks.0.attn
 * (attention): input must be [batch, seq, 64], got [8, 64]"). On failure
 * the outputs are NULL and the ctx is cleared (back to EMPTY), except for a
 * call out of order (wrong stage / other layer's ctx: LP_ERR_ARG), which
 * leaves the ctx untouched. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "lp_base.h"
#include "lp_tensor.h"

/* ======================================================================
 * Layers
 * ====================================================================== */

typedef struct lp_nn_layer lp_nn_layer; /* opaque, refcounted */
typedef struct lp_nn_ctx lp_nn_ctx;     /* opaque, one per micro-batch */

typedef enum lp_nn_init_kind {
  LP_NN_INIT_ZEROS = 0,
  LP_NN_INIT_ONES = 1,
  LP_NN_INIT_NORMAL = 2 /* N(0, init_std) from the (seed, name) stream */
} lp_nn_init_kind;

/* One trainable tensor. Owned by its layer; pointers stay valid while the
 * layer (or a chunk holding it) is alive. */
typedef struct lp_nn_param {
  const char *name; /* full dotted name, e.g. "blocks.3.attn.wq" */
  lp_tensor *value; /* dense */
  lp_tensor *grad;  /* same shape; weight_grad accumulates into it */
  lp_nn_init_kind init;
  float init_std;
} lp_nn_param;

/* ---- constructors ------------------------------------------------------
 * All: LP_OK and *out = a layer with one reference (release it with
 * lp_nn_layer_release), or a status and *out = NULL. `name` is copied; it
 * prefixes parameter names ("<name>.weight"). Parameters are initialised
 * from (seed, parameter name) — see lp_nn_init — so building stage k of a
 * split model with the same names gives the same numbers as the full
 * model. LP_ERR_ARG for bad sizes, LP_ERR_NOMEM on allocation failure. */

/* y = x W^T + b over the last dim: x [..., in] -> y [..., out].
 * Params: <name>.weight [out, in] ~ N(0, 1/sqrt(in)); <name>.bias [out] = 0
 * (only when bias != 0). */
lp_status lp_nn_linear_new(const char *name, int64_t in, int64_t out, int bias,
                           uint64_t seed, lp_nn_layer **layer);

/* ids [...] (float, integral) -> y [..., dim] (ids may have up to 3 dims).
 * Param: <name>.weight [vocab, dim] ~ N(0, 1). Has no input gradient:
 * input_grad sets *dx = NULL. */
lp_status lp_nn_embedding_new(const char *name, int64_t vocab, int64_t dim,
                              uint64_t seed, lp_nn_layer **layer);

/* Elementwise activation (GELU tanh approximation, or SiLU); no params. */
lp_status lp_nn_act_new(const char *name, lp_tensor_act_kind kind,
                        lp_nn_layer **layer);

/* y = x / sqrt(mean(x^2 over the last dim) + eps) * w; x [..., dim].
 * Param: <name>.weight [dim] = 1. */
lp_status lp_nn_rmsnorm_new(const char *name, int64_t dim, float eps,
                            lp_nn_layer **layer);

/* Causal multi-head self-attention: x [batch, seq, d_model] -> y, same
 * shape. q,k,v = x Wq^T, x Wk^T, x Wv^T split into n_heads heads of
 * d_model/n_heads; position t attends to positions <= t; scores scaled by
 * 1/sqrt(head dim); y = concat(heads) Wo^T. No biases.
 * Params: <name>.wq, .wk, .wv, .wo, each [d_model, d_model] ~
 * N(0, 1/sqrt(d_model)). d_model % n_heads must be 0. */
lp_status lp_nn_attention_new(const char *name, int64_t d_model,
                              int64_t n_heads, uint64_t seed,
                              lp_nn_layer **layer);

/* y = x + inner(x). Takes a new reference to inner (the caller keeps its
 * own). Params: inner's. */
lp_status lp_nn_residual_new(const char *name, lp_nn_layer *inner,
                             lp_nn_layer **layer);

/* A chunk: layers[0..n) applied in order (what one model stage holds).
 * Takes a new reference to each layer; the caller keeps its own and may
 * release them at once. Params: the layers' params in order, each tensor
 * listed once (a layer that appears twice shares its params). n >= 1. */
lp_status lp_nn_chunk_new(const char *name, lp_nn_layer *const *layers,
                          size_t n, lp_nn_layer **layer);
/* The precision of the activations between a chunk's layers and of the
 * gradients flowing back between them (LP_TENSOR_F32 at creation):
 * LP_TENSOR_BF16 rounds each layer's output but the last (forward) and
 * each input-grad but the first layer's (backward) to bf16 values, in
 * place, before the next layer sees it: the layer boundaries where a
 * pipeline stage may end, whose messages then carry bf16 losslessly (the
 * executor rounds at its stage boundaries alike). Not inherited by layers
 * inside (a block's own inner steps stay float32). LP_ERR_ARG when l is
 * not a chunk or prec unknown. */
lp_status lp_nn_chunk_set_boundary(lp_nn_layer *l, lp_tensor_precision prec);
lp_tensor_precision lp_nn_chunk_boundary(const lp_nn_layer *l);

/* Residual MLP block: x + fc2(act(fc1(rmsnorm(x)))), with children
 * <name>.norm, <name>.fc1 [d_hidden, d_model] (+bias), <name>.act,
 * <name>.fc2 [d_model, d_hidden] (+bias). RMSNorm eps = 1e-5. */
lp_status lp_nn_mlp_block_new(const char *name, int64_t d_model,
                              int64_t d_hidden, lp_tensor_act_kind act,
                              uint64_t seed, lp_nn_layer **layer);

/* Pre-norm transformer block: x + attn(rmsnorm(x)), then the MLP block.
 * Children: <name>.attn_norm, <name>.attn, <name>.mlp (see above).
 * x [batch, seq, d_model]. */
lp_status lp_nn_transformer_block_new(const char *name, int64_t d_model,
                                      int64_t n_heads, int64_t d_hidden,
                                      lp_tensor_act_kind act, uint64_t seed,
                                      lp_nn_layer **layer);

/* ---- lifetime and introspection ---- */

/* Adds a reference; returns l. */
lp_nn_layer *lp_nn_layer_retain(lp_nn_layer *l);
/* Drops a reference; the last one frees the layer, its params and its
 * references to children. NULL is a no-op. Contexts that still hold a
 * forward of this layer must be cleared or freed first. */
void lp_nn_layer_release(lp_nn_layer *l);
/* The name given at construction, and the kind: "linear", "embedding",
 * "gelu", "silu", "rmsnorm", "attention", "residual", "chunk", "moe". Static or
 * layer-owned strings. */
const char *lp_nn_layer_name(const lp_nn_layer *l);
const char *lp_nn_layer_kind(const lp_nn_layer *l);
/* Children of a chunk or residual (0 / NULL for leaves); borrowed. */
size_t lp_nn_layer_children(const lp_nn_layer *l);
lp_nn_layer *lp_nn_layer_child(const lp_nn_layer *l, size_t i);

/* The layer's parameters (for a chunk: all of them, in layer order). The
 * array and everything it points to are owned by the layer (borrowed;
 * valid while l lives). *n = count; NULL when there are none. */
const lp_nn_param *lp_nn_params(const lp_nn_layer *l, size_t *n);
/* Total number of parameter elements. */
int64_t lp_nn_param_numel(const lp_nn_layer *l);
/* Re-initialises every parameter from (seed, its name) according to its
 * init kind. Grads are left alone. */
lp_status lp_nn_init(lp_nn_layer *l, uint64_t seed);
/* Sets every parameter grad to zero. */
lp_status lp_nn_zero_grad(lp_nn_layer *l);
/* Moves every parameter (value and grad) of l to backend `be` (NULL: the
 * CPU), e.g. lp_tensor_backend_cuda(0) from lp_kernels.h. Build optimizers
 * after the move (their state is made on the parameters' backend). Inputs
 * must then be on the same backend (token ids and loss targets may stay
 * on the host). On failure the parameters are back where they were. */
lp_status lp_nn_layer_to(lp_nn_layer *l, const lp_tensor_backend *be);
/* Sets the precision of the GEMMs of l and every layer inside it: Linear,
 * attention's projections and score / value matmuls, MoE experts (routed
 * and shared) run at `prec` (LP_TENSOR_BF16: inputs rounded to bf16,
 * float32 sums); embeddings, norms, softmax, losses, MoE routers and the
 * optimizer stay float32, as do parameters (the GEMMs read a bf16 copy of
 * each weight, made again after it changes: lp_tensor_keep_bf16). At bf16
 * on the CPU, activations that only GEMMs read are kept for backward as
 * packed bf16 (a Linear's x, attention's x, o, dy, dq, dk, dv, the
 * SwiGLU / experts' x, h, dy, da1, da3): the same results at half their
 * bytes; the rest stays float32. New layers are LP_TENSOR_F32.
 * LP_ERR_ARG for an unknown precision. */
lp_status lp_nn_layer_set_precision(lp_nn_layer *l, lp_tensor_precision prec);
lp_tensor_precision lp_nn_layer_precision(const lp_nn_layer *l);
/* Tests and benchmarks: 1 keeps every activation float32 at bf16 too (the
 * same results, more memory); 0 (the default) packs them as above. */
void lp_nn_bf16_pack_force_off(int on);

/* ======================================================================
 * Per-micro-batch contexts
 * ====================================================================== */

typedef enum lp_nn_ctx_stage {
  LP_NN_CTX_EMPTY = 0,     /* nothing stashed */
  LP_NN_CTX_FORWARD = 1,   /* forward done; I or W (or B) may follow */
  LP_NN_CTX_INPUT_GRAD = 2 /* input-grad done; W must follow */
} lp_nn_ctx_stage;

/* A new, empty context (caller owns; lp_nn_ctx_free). */
lp_status lp_nn_ctx_new(lp_nn_ctx **out);
/* Releases everything stashed and the ctx itself. NULL is a no-op. */
void lp_nn_ctx_free(lp_nn_ctx *ctx);
/* Releases everything stashed; the ctx is EMPTY and reusable. */
void lp_nn_ctx_clear(lp_nn_ctx *ctx);
lp_nn_ctx_stage lp_nn_ctx_stage_of(const lp_nn_ctx *ctx);
/* Bytes of tensor data the ctx (and its sub-contexts) keeps alive, counted
 * per stashed view (numel * 4, or * 2 for a packed bf16 one) — the
 * activation memory of this mb. */
size_t lp_nn_ctx_bytes(const lp_nn_ctx *ctx);
/* Text of the last failure recorded in this ctx ("" when none). */
const char *lp_nn_ctx_last_error(const lp_nn_ctx *ctx);

/* ======================================================================
 * Compute. x, dy are borrowed (and stashed by reference, see the top);
 * *y, *dx are new tensors owned by the caller.
 * ====================================================================== */

/* y = l(x). ctx must be EMPTY (it becomes FORWARD), or NULL for
 * inference (nothing stashed; no backward possible). */
lp_status lp_nn_forward(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *x,
                        lp_tensor **y);
/* dx = dL/dx given dy = dL/dy (shape of y). ctx must be FORWARD of this
 * layer; it becomes INPUT_GRAD and keeps what weight_grad needs (input_grad
 * frees only what W does not need). dx == NULL: skip computing the input
 * gradient (e.g. on the first stage) but still prepare for W. For an
 * embedding (first layer) *dx is set to NULL. */
lp_status lp_nn_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *dy,
                           lp_tensor **dx);
/* Accumulates this micro-batch's parameter gradients (grad += ...). ctx
 * must be INPUT_GRAD of this layer (dy is then ignored and may be NULL) or
 * FORWARD (dy required). Afterwards the ctx is EMPTY (all stash released). */
lp_status lp_nn_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                            const lp_tensor *dy);
/* Full backward: input_grad then weight_grad. dx may be NULL. */
lp_status lp_nn_backward(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *dy,
                         lp_tensor **dx);

/* ======================================================================
 * Phased execution. A pass (forward or input-grad) of any layer or chunk
 * can be run in pieces between expert-parallel exchanges, so that an
 * executor can interleave two micro-batches and keep one's all-to-all in
 * flight while the other computes:
 *
 *   lp_nn_forward_begin(l, c, x);                 c must be EMPTY
 *   do lp_nn_advance(l, c, &done, &y); while (!done);   c: FORWARD
 *   lp_nn_input_grad_begin(l, c, dy);             c must be FORWARD
 *   do lp_nn_advance(l, c, &done, &dx); while (!done);  c: INPUT_GRAD
 *
 * Each advance runs compute until it has STARTED the next exchange (then
 * *done = 0, *out = NULL) or to the end of the pass (*done = 1, *out = y or
 * dx, owned by the caller; out may be NULL to drop it). The next advance
 * first waits for the exchange that is in flight. A layer without MoE (or
 * with EP off) finishes in one advance. lp_nn_forward / lp_nn_input_grad /
 * lp_nn_backward are begin + advance until done: bitwise the same results.
 * On failure the ctx is cleared (an exchange in flight is waited for first)
 * and *out is NULL. x / dy are stashed by reference as for lp_nn_forward.
 * ====================================================================== */

lp_status lp_nn_forward_begin(lp_nn_layer *l, lp_nn_ctx *ctx,
                              const lp_tensor *x);
lp_status lp_nn_input_grad_begin(lp_nn_layer *l, lp_nn_ctx *ctx,
                                 const lp_tensor *dy);
lp_status lp_nn_advance(lp_nn_layer *l, lp_nn_ctx *ctx, int *done,
                        lp_tensor **out);
/* One piece of a layer's weight-grad ahead of time, during (or after) its
 * input-grad pass: for a chunk (lp_nn_chunk_new), the weight-grad of the
 * next child whose input-grad has finished and whose weight-grad has not
 * run (children go n-1, n-2, ..., as backward finishes them), else a piece
 * of the child running now (descending through chunks and residuals); for
 * an MoE layer, its routed experts' weight-grads once their backward ran
 * (while dispatch-backward is in flight). *did = 1 when a piece ran, 0
 * when none is ready (or the layer has no pieces). lp_nn_weight_grad later
 * runs only the rest; each parameter gets the same updates in the same
 * order as without pieces, so the gradients are bitwise the same. An
 * executor runs pieces while both halves of an overlapped pair wait for
 * exchanges. */
lp_status lp_nn_weight_grad_part(lp_nn_layer *l, lp_nn_ctx *ctx, int *did);
/* What the next advance of ctx's pass runs: LP_NN_PHASE_DENSE (dense
 * compute up to the next MoE dispatch or the end), _DISPATCH (finish the
 * count exchange, start the token exchange), _EXPERTS (finish the tokens'
 * exchange, run the local experts, start the next exchange), _COMBINE
 * (finish the combine, go on with dense compute); in backward the order is
 * DENSE, EXPERTS, DISPATCH. _DONE when no pass is running. An advance
 * also computes, after starting its exchange, what of the layer does not
 * depend on it (the shared expert, the router's backward): see moe.c. */
typedef enum lp_nn_phase {
  LP_NN_PHASE_DONE = 0,
  LP_NN_PHASE_DENSE,
  LP_NN_PHASE_DISPATCH,
  LP_NN_PHASE_EXPERTS,
  LP_NN_PHASE_COMBINE,
  LP_NN_PHASE_ATTN /* a stop before an attention (lp_nn_set_phase_stop) */
} lp_nn_phase;
lp_nn_phase lp_nn_phase_of(const lp_nn_ctx *ctx);
/* Its text: "done", "attn/dense", "dispatch", "experts", "combine", "attn"
 * (static strings, for hooks and traces; decide on the enum). */
const char *lp_nn_phase_text(lp_nn_phase p);
/* A phase stop before layer l: a phased pass (lp_nn_advance) that reaches
 * l stops there, the advance returning (not done, nothing in flight), and
 * the next advance runs l; meanwhile lp_nn_phase_of reports fwd (in a
 * forward) or bwd (in an input-grad), LP_NN_PHASE_DONE being no stop in
 * that pass. Splits a chunk's advances finer (DeepSeek-V3's pair: the
 * attention forward, backward and weight-grad as phases of their own,
 * lp_nn_mla_block_new) without changing any result: only where an advance
 * returns moves. Call before l goes into a composite (composites note
 * their children's stops when built: lp_nn_has_phase_stops). */
lp_status lp_nn_set_phase_stop(lp_nn_layer *l, lp_nn_phase fwd, lp_nn_phase bwd);
int lp_nn_has_phase_stops(const lp_nn_layer *l);
/* lp_nn_phase_text(lp_nn_phase_of(ctx)). */
const char *lp_nn_phase_name(const lp_nn_ctx *ctx);
/* An opaque tag of ctx (and its sub-contexts), set by whoever runs the
 * pass (an executor: which of its halves the micro-batch is); every
 * exchange the pass starts carries it (lp_nn_xinfo). NULL by default; a
 * clear keeps it. */
void lp_nn_ctx_set_tag(lp_nn_ctx *ctx, void *tag);
void *lp_nn_ctx_tag(const lp_nn_ctx *ctx);
/* 1 when an exchange started by this ctx (or a sub-context) is in flight. */
int lp_nn_ctx_exchange_pending(const lp_nn_ctx *ctx);

/* ======================================================================
 * Mixture of experts (DeepSeek-V3 style) and expert parallelism (EP).
 *
 * y = shared(x) + sum over the token's top-k experts e of g_e * FFN_e(x),
 * every FFN a SwiGLU: FFN(x) = (silu(x W1^T) * (x W3^T)) W2^T, W1, W3
 * [hidden, dim], W2 [dim, hidden]. Router: logits = x Wr^T (Wr [experts,
 * dim]); affinities s = sigmoid(logits) (or softmax over the experts).
 * Selection uses s + bias (bias: per expert, not trained by gradients,
 * nudged by lp_nn_moe_update_bias — auxiliary-loss-free balancing): with
 * groups > 1 the experts form `groups` equal groups, each scored by the sum
 * of its two best (s + bias), and only the topk_groups best groups are
 * eligible; then the topk best eligible experts. Weights: g_e =
 * route_scale * s_e / sum of the selected s. Shared experts: one SwiGLU of
 * hidden size shared * hidden applied to every token.
 *
 * That is DeepSeek's Gate (DeepSeek-V3 inference/model.py) with a bias,
 * except that softmax weights are normalised too. Two options give the
 * rest of the Gate: no_bias (a Gate without a bias, as DeepSeek-V2's):
 * selection on s alone and each group scored by its best s; no_norm_topk:
 * g_e = route_scale * s_e, not divided by the selected sum (the Gate's
 * softmax weights; HF's norm_topk_prob = false). The Gate's names:
 * score_func = router, n_groups = groups, topk_groups, route_scale.
 *
 * balance_alpha > 0 adds DeepSeek-V3's sequence-wise balance loss
 * alpha * sum_i f_i P_i for every sequence (x [batch, seq, dim]: each
 * batch row is a sequence; x [tokens, dim]: one sequence), f_i = E/(K T) *
 * (tokens of the sequence that selected i), P_i = mean over the
 * sequence's tokens of s_i / sum_j s_j; the mean over the batch's
 * sequences, times the loss scale (lp_nn_set_loss_scale: a training loop
 * gives the scale of its loss, 1/M over M micro-batches, 1/(M ep) when
 * every EP rank takes 1/ep of each, so the balance loss is the mean over
 * the step's sequences however the batch is split). Its gradient is added
 * in input_grad as if it were part of the loss; lp_nn_moe_aux_loss gives
 * its value (not included in the loss the loop reports).
 *
 * Params (in this order): <name>.router.weight [experts, dim];
 * <name>.shared.w1, .w3 [shared*hidden, dim], .w2 [dim, shared*hidden];
 * then for every expert slot this rank holds, in slot order,
 * <name>.experts.<e>.w1, .w3, .w2 named by LOGICAL expert e (replicas of
 * one expert have the same names and initial values). w1, w3, router ~
 * N(0, 1/sqrt(dim)), w2 ~ N(0, 1/sqrt(hidden)).
 * ====================================================================== */

typedef enum lp_nn_router_kind {
  LP_NN_ROUTER_SIGMOID = 0,
  LP_NN_ROUTER_SOFTMAX = 1
} lp_nn_router_kind;

typedef struct lp_nn_moe_opts {
  int64_t dim;         /* d_model */
  int64_t hidden;      /* hidden size of each routed expert */
  int experts;         /* logical routed experts E >= 1 */
  int topk;            /* experts per token, 1..E */
  int groups;          /* expert groups (E % groups == 0); 0 or 1: none */
  int topk_groups;     /* eligible groups per token (0: all) */
  int shared;          /* shared experts (0: none) */
  float route_scale;   /* scale of the normalised weights (0 means 1) */
  float bias_speed;    /* lp_nn_moe_update_bias step (0: bias stays 0) */
  lp_nn_router_kind router;
  float balance_alpha; /* sequence-wise balance loss weight (0: off) */
  int no_bias;         /* 1: no selection bias (bias_speed must be 0): top-k
                        * on s, groups scored by their best s */
  int no_norm_topk;    /* 1: weights route_scale * s_e, not normalised */
} lp_nn_moe_opts;

/* An MoE layer with the default placement (one slot per expert, all on
 * this rank). LP_ERR_ARG for bad sizes. kind "moe". */
lp_status lp_nn_moe_new(const char *name, const lp_nn_moe_opts *o,
                        uint64_t seed, lp_nn_layer **layer);
/* The same layer already placed for EP rank ep_rank of ep_size under the
 * default placement (slot s holds expert s % experts, ceil(experts /
 * ep_size) slots per rank): only this rank's expert slots are allocated,
 * so building a model for expert parallelism never holds every expert.
 * The values equal those lp_nn_moe_new then lp_nn_set_ep gives (each from
 * seed and its name). With ep_size > 1 the layer needs lp_nn_set_ep (same
 * size and rank: it keeps every slot) before a pass (an exchange without
 * an EP group is LP_ERR_ARG with a message). lp_nn_moe_new is (1, 0). */
lp_status lp_nn_moe_new_placed(const char *name, const lp_nn_moe_opts *o, uint64_t seed,
                               int ep_size, int ep_rank, lp_nn_layer **layer);

/* Pre-norm MoE transformer block: x + attn(rmsnorm(x)), then
 * x + moe(rmsnorm(x)). Children: <name>.attn_norm, <name>.attn,
 * <name>.moe_norm, <name>.moe. x [batch, seq, d_model], o->dim = d_model. */
lp_status lp_nn_moe_block_new(const char *name, int64_t n_heads,
                              const lp_nn_moe_opts *o, uint64_t seed,
                              lp_nn_layer **layer);

/* The exchanges of an MoE layer, in the order a forward / input-grad pass
 * starts them. */
typedef enum lp_nn_xkind {
  LP_NN_X_DISPATCH_COUNT = 0, /* pairs per destination slot (a few floats) */
  LP_NN_X_DISPATCH,           /* token rows to their experts' ranks */
  LP_NN_X_COMBINE,            /* expert outputs back */
  LP_NN_X_COMBINE_BACKWARD,   /* weighted output-grad rows to the experts */
  LP_NN_X_DISPATCH_BACKWARD,  /* input-grad rows back */
  LP_NN_X__N
} lp_nn_xkind;
/* "dispatch count", "dispatch", "combine", "combine backward", "dispatch
 * backward" (static). */
const char *lp_nn_xkind_text(lp_nn_xkind k);

/* What an exchange is, for the one who moves it. */
typedef struct lp_nn_xinfo {
  lp_nn_xkind kind;
  const char *layer; /* the MoE layer's name (valid while the layer lives) */
  void *tag;         /* lp_nn_ctx_tag of the pass that starts it */
  /* where send and recv live: NULL for host memory (the count exchange,
   * or the rows of a layer on a host backend), else the rows' tensor
   * backend (device memory: the lp_nn_ep moves it there) */
  const lp_tensor_backend *be;
} lp_nn_xinfo;

/* Expert parallelism, given by the caller (nn does not depend on comm).
 * start begins an all-to-all-v among the `size` EP ranks: send_counts[r]
 * floats go to rank r (send displacements are their prefix sums),
 * recv_counts[r] floats arrive from rank r (likewise); *handle is finished
 * by wait. Every EP rank starts its exchanges of one tag in the same
 * order. The rows go where they live: on a device backend send and recv
 * are device memory (x->be says which: the executor moves them with a
 * comm context for that backend, staged or NCCL). */
typedef struct lp_nn_ep {
  int size, rank; /* EP group size and this rank's index in it */
  void *ud;
  lp_status (*start)(void *ud, const lp_nn_xinfo *x, const float *send,
                     const size_t *send_counts, float *recv,
                     const size_t *recv_counts, void **handle);
  lp_status (*wait)(void *ud, void *handle);
} lp_nn_ep;

/* Gives every MoE layer inside l the EP group (copied; NULL or size 1: no
 * exchange). Resets each one's placement to the default for that size:
 * slots_per_rank = ceil(E / size), slot s holds expert s % E. The
 * parameter lists of l and the layers inside it change (rebuild
 * optimizers). Not while a context holds a micro-batch of l. */
lp_status lp_nn_set_ep(lp_nn_layer *l, const lp_nn_ep *ep);

/* Physical slots: EP rank r holds slots [r*slots_per_rank,
 * (r+1)*slots_per_rank); phys_to_log[slot] = its logical expert
 * (ep size * slots_per_rank entries; every expert at least once). The
 * j-th (token, expert e) pair of this rank's micro-batch goes to replica
 * (j + rank) % replicas of e (replicas in slot order). Slots that keep an
 * expert this rank already held keep its values; new ones are initialised
 * from (seed, name) — import the real values (lp_nn_moe_slot_params).
 * Grads of the new list are zero. The parameter lists change. */
lp_status lp_nn_moe_set_placement(lp_nn_layer *moe, int slots_per_rank,
                                  const int *phys_to_log);
/* The three params (w1, w3, w2) of global slot `slot` held by this rank:
 * *out points into the layer's list (borrowed), *n = 3. LP_ERR_ARG when
 * this rank does not hold the slot. */
lp_status lp_nn_moe_slot_params(lp_nn_layer *moe, int slot,
                                const lp_nn_param **out, int *n);
/* Placement in force: slots per rank, and (optional) a copy of
 * phys_to_log (size * slots_per_rank entries). */
int lp_nn_moe_slots_per_rank(const lp_nn_layer *moe);
lp_status lp_nn_moe_placement(const lp_nn_layer *moe, int *phys_to_log);
/* The options the layer was built with (borrowed), NULL if not an MoE. */
const lp_nn_moe_opts *lp_nn_moe_get_opts(const lp_nn_layer *moe);

/* Tokens this rank routed to each logical expert (E entries: counts[e] +=
 * (token, e) pairs) since the last lp_nn_moe_load_reset. */
lp_status lp_nn_moe_expert_load(const lp_nn_layer *moe, int64_t *counts);
void lp_nn_moe_load_reset(lp_nn_layer *moe);
/* Aux-loss-free balancing, at step end with the EP-group-summed counts:
 * bias_e += bias_speed * sign(mean - counts_e) (nothing with no_bias). */
lp_status lp_nn_moe_update_bias(lp_nn_layer *moe, const int64_t *global_counts);
/* The selection bias (E floats), read / write (checkpoints, tests); a
 * layer built with no_bias reads zeros and takes only zeros (else
 * LP_ERR_ARG). */
lp_status lp_nn_moe_get_bias(const lp_nn_layer *moe, float *bias);
lp_status lp_nn_moe_set_bias(lp_nn_layer *moe, const float *bias);
/* The router's decisions for x ([tokens, dim] or [batch, seq, dim], on
 * the layer's backend) as the forward makes them, without running the
 * experts or counting loads. For token t (row-major over x's leading
 * dims): experts[t*topk + k] the k-th selected logical expert (highest
 * biased affinity first; within the eligible groups when the layer has
 * groups), weights[t*topk + k] its combine weight (route_scale * its
 * affinity / the sum of the selected affinities, or without the division
 * with no_norm_topk: the bias only selects),
 * scores[t*E + e] the affinity of expert e (sigmoid, or softmax, of the
 * router logits). The caller sizes the arrays (tokens * topk, tokens * E).
 * LP_ERR_ARG for a shape that is not [..., dim]. */
lp_status lp_nn_moe_route(const lp_nn_layer *moe, const lp_tensor *x, int *experts,
                          float *weights, float *scores);
/* The scale a training loop applies to its loss (> 0, finite; 1 by
 * default), for every MoE layer in l: their balance losses take it too.
 * LP_ERR_ARG otherwise. */
lp_status lp_nn_set_loss_scale(lp_nn_layer *l, float scale);
/* The balance loss of the last forward through this layer (0 when off). */
double lp_nn_moe_aux_loss(const lp_nn_layer *moe);

/* What each parameter of l is, for the EP group's gradient reduction and
 * weight moves: roles[i] for lp_nn_params(l)[i] (n must be its count).
 * moe: index of the MoE layer it belongs to (lp_nn_moe_find), -1 if none;
 * slot, expert: the global slot and logical expert of a routed expert's
 * w1 / w3 / w2, -1 for everything else (dense params, routers and shared
 * experts are replicated over the EP group). */
typedef struct lp_nn_param_role {
  int moe, slot, expert;
} lp_nn_param_role;
lp_status lp_nn_param_roles(const lp_nn_layer *l, lp_nn_param_role *roles,
                            size_t n);
/* The parameters of l that get no gradient in a step whose expert loads
 * are `loads` (for every MoE layer k of l in lp_nn_moe_find order, its
 * experts' token counts, consecutive; summed over whoever routes tokens to
 * those experts: every rank, micro-batch and copy): skip[i] = 1 for the
 * w1 / w3 / w2 of a slot whose logical expert has load 0, else 0 (n the
 * count of lp_nn_params(l)). The mask lp_nn_optim_step_masked takes for
 * an optimizer over lp_nn_params(l): torch gives such an expert grad None
 * (DeepSeek's model.py skips experts with no tokens). */
lp_status lp_nn_unrouted_mask(const lp_nn_layer *l, const int64_t *loads, unsigned char *skip,
                              size_t n);

/* MoE layers inside l (depth first, in execution order; l itself counts). */
int lp_nn_moe_count(const lp_nn_layer *l);
lp_nn_layer *lp_nn_moe_find(const lp_nn_layer *l, int i);

/* ======================================================================
 * Losses (no params, no ctx: one call gives the loss and its gradient).
 * *loss is the mean (double accumulation); *dgrad (optional: pass NULL to
 * skip) is grad_scale * d(loss)/d(input), a new tensor owned by the
 * caller. Use grad_scale = 1/M to average over M micro-batches.
 * ====================================================================== */

/* Cross-entropy of logits [..., V] against targets (numel = rows of
 * logits, float integral class ids in [0, V)); mean over rows. */
lp_status lp_nn_loss_cross_entropy(const lp_tensor *logits,
                                   const lp_tensor *targets, float grad_scale,
                                   double *loss, lp_tensor **dlogits);
/* Mean squared error over all elements; pred and target same shape. */
lp_status lp_nn_loss_mse(const lp_tensor *pred, const lp_tensor *target,
                         float grad_scale, double *loss, lp_tensor **dpred);

/* The loss kinds, and their names as users write them ("mse",
 * "cross_entropy"; lp_nn_loss_names is NULL-terminated and indexed by
 * kind): the one list of loss names. */
typedef enum lp_nn_loss_kind {
  LP_NN_LOSS_MSE = 0,           /* mean squared error against the target */
  LP_NN_LOSS_CROSS_ENTROPY = 1, /* logits [..., V] against class ids */
  LP_NN_LOSS__N
} lp_nn_loss_kind;
extern const char *const lp_nn_loss_names[LP_NN_LOSS__N + 1];
/* The loss of `kind` (lp_nn_loss_mse or lp_nn_loss_cross_entropy);
 * LP_ERR_ARG for an unknown kind. */
lp_status lp_nn_loss(lp_nn_loss_kind kind, const lp_tensor *y, const lp_tensor *target,
                     float grad_scale, double *loss, lp_tensor **dy);

/* ======================================================================
 * Optimizers over a list of (param, grad). The optimizer copies the list
 * (names and tensor pointers are borrowed: the layers must outlive it) and
 * owns its state (momentum / moments), allocated at creation.
 * ====================================================================== */

typedef struct lp_nn_optim lp_nn_optim;

/* The optimizer algorithms (names "sgd", "adamw": lp_nn_optim_kind). */
typedef enum lp_nn_optim_type {
  LP_NN_OPTIM_SGD = 0,
  LP_NN_OPTIM_ADAMW = 1
} lp_nn_optim_type;

/* PyTorch SGD (dampening 0): g = grad + weight_decay * p;
 * buf = momentum * buf + g (buf starts at 0); p -= lr * buf. */
typedef struct lp_nn_sgd_opts {
  float lr, momentum, weight_decay;
} lp_nn_sgd_opts;

/* PyTorch AdamW: p *= 1 - lr * weight_decay; m = b1 m + (1-b1) g;
 * v = b2 v + (1-b2) g^2; p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
 */
typedef struct lp_nn_adamw_opts {
  float lr, beta1, beta2, eps, weight_decay;
} lp_nn_adamw_opts;

/* LP_OK and *out, or LP_ERR_ARG (NULL opts, param without grad, shape
 * mismatch) / LP_ERR_NOMEM with *out = NULL. n may be 0. */
lp_status lp_nn_optim_sgd_new(const lp_nn_param *params, size_t n,
                              const lp_nn_sgd_opts *opts, lp_nn_optim **out);
lp_status lp_nn_optim_adamw_new(const lp_nn_param *params, size_t n,
                                const lp_nn_adamw_opts *opts,
                                lp_nn_optim **out);
/* One update of every param from its grad (grads are not zeroed). */
lp_status lp_nn_optim_step(lp_nn_optim *o);
/* The same, leaving alone every param i with skip[i] != 0 (skip NULL: none)
 * exactly as torch.optim.AdamW / SGD leave a parameter whose .grad is None
 * (a routed expert no token reached in the step): no decay, no moment
 * update, and its own step count (AdamW's bias corrections use the steps
 * that updated that parameter, lp_nn_optim_param_steps) does not advance.
 * The optimizer's step count (lp_nn_optim_steps) does. Without skips the
 * results are those of lp_nn_optim_step, bitwise. The caller decides the
 * mask, the same on every rank holding a copy of the parameter. */
lp_status lp_nn_optim_step_masked(lp_nn_optim *o, const unsigned char *skip);
/* Per param, the steps that updated it (n must be the list's length);
 * set: each <= lp_nn_optim_steps (after lp_nn_optim_state_import, which
 * sets every one to the imported step count: a checkpoint of skipped
 * params needs these too). */
lp_status lp_nn_optim_param_steps(const lp_nn_optim *o, int64_t *steps, size_t n);
lp_status lp_nn_optim_set_param_steps(lp_nn_optim *o, const int64_t *steps, size_t n);
/* Sets every grad in the list to zero. */
lp_status lp_nn_optim_zero_grad(lp_nn_optim *o);
void lp_nn_optim_set_lr(lp_nn_optim *o, float lr);
/* Steps taken so far. */
int64_t lp_nn_optim_steps(const lp_nn_optim *o);
/* Parameters in the optimizer's list (the length of a skip mask and of
 * lp_nn_optim_param_steps); 0 for NULL. */
size_t lp_nn_optim_count(const lp_nn_optim *o);
/* Frees the state (not the params). NULL is a no-op. */
void lp_nn_optim_free(lp_nn_optim *o);

/* ---- optimizer state, for checkpoints ----------------------------------
 * The state as one flat float buffer: for each param in list order its
 * momentum buffer (SGD) / first moment m (AdamW), numel floats, then (AdamW
 * only) for each param its second moment v. Together with the step count
 * (AdamW's bias correction) this is everything a later step depends on, so
 * export, then import into a fresh optimizer over equal params, continues
 * bitwise like the original. */
/* "sgd" or "adamw" (static string). */
const char *lp_nn_optim_kind(const lp_nn_optim *o);
/* Floats in the state buffer (0 for NULL). */
size_t lp_nn_optim_state_numel(const lp_nn_optim *o);
/* Copies the state into buf (n must equal lp_nn_optim_state_numel: else
 * LP_ERR_ARG) and the step count into *steps (optional). */
lp_status lp_nn_optim_state_export(const lp_nn_optim *o, float *buf, size_t n,
                                   int64_t *steps);
/* Replaces the state with buf (n floats, as export wrote them) and sets the
 * step count. LP_ERR_ARG (state untouched) when n differs or steps < 0. */
lp_status lp_nn_optim_state_import(lp_nn_optim *o, const float *buf, size_t n,
                                   int64_t steps);

/* ======================================================================
 * DeepSeek-V3's dense layers, as inference/model.py of deepseek-ai/
 * DeepSeek-V3 defines them (parameter names and shapes are model.py's, so
 * a checkpoint loads by name: <name>.wq_a.weight, ...).
 *
 * MLA, Multi-head Latent Attention (kind "mla"): x [batch, seq, dim] ->
 * y, same shape, causal. With H heads, dn = qk_nope_head_dim, dr =
 * qk_rope_head_dim, dq = dn + dr, dv = v_head_dim:
 *   q  = x Wq^T, or (q_lora_rank > 0) q_norm(x Wq_a^T) Wq_b^T   [.., H*dq]
 *   [c | k_pe] = x Wkv_a^T, c of kv_lora_rank, k_pe of dr (one for all
 *   heads); kv = kv_norm(c) Wkv_b^T [.., H*(dn+dv)]: head h's dn key
 *   columns, then its dv value columns;
 *   RoPE (adjacent pairs as complex numbers, position = index in seq) on
 *   every head's last dr query columns and on k_pe;
 *   scores_h = q_h . [k_nope_h | k_pe] * softmax_scale, causal softmax;
 *   o_h = P_h v_h; y = concat(o_h) Wo^T. No biases; RMSNorms with eps.
 * softmax_scale = dq^-0.5, times mscale'^2 with mscale' = 0.1 * mscale *
 * ln(rope_factor) + 1 when max_seq_len > original_seq_len (YaRN: the
 * rotary frequencies are then blended between f / rope_factor and f over
 * the correction range of beta_fast / beta_slow, as model.py's
 * precompute_freqs_cis). seq must be <= max_seq_len.
 * Params, in this order: <name>.wq.weight [H*dq, dim] | <name>.wq_a.weight
 * [q_lora_rank, dim], .q_norm.weight [q_lora_rank], .wq_b.weight [H*dq,
 * q_lora_rank]; .wkv_a.weight [kv_lora_rank + dr, dim], .kv_norm.weight
 * [kv_lora_rank], .wkv_b.weight [H*(dn+dv), kv_lora_rank], .wo.weight
 * [dim, H*dv]. Linear weights ~ N(0, 1/sqrt(in)), norms = 1.
 * ====================================================================== */

typedef struct lp_nn_mla_opts {
  int64_t dim, n_heads;
  int64_t q_lora_rank; /* 0: no query LoRA (wq) */
  int64_t kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  int64_t max_seq_len, original_seq_len;
  double rope_theta, rope_factor, beta_fast, beta_slow, mscale;
  float eps; /* the RMSNorms' (model.py: 1e-6) */
} lp_nn_mla_opts;

/* model.py's ModelArgs defaults (dim 2048, 16 heads, no q LoRA, kv rank
 * 512, 128 + 64 qk, 128 v, max_seq_len 16384 > original 4096: YaRN with
 * factor 40, beta 32 / 1, mscale 1, theta 10000; eps 1e-6). */
lp_nn_mla_opts lp_nn_mla_defaults(void);

/* LP_ERR_ARG (with *why, when given, a static line naming the field) for
 * sizes < 1 (q_lora_rank < 0), an odd qk_rope_head_dim, rope_theta <= 1,
 * max_seq_len < 1, YaRN with rope_factor, beta_fast or beta_slow <= 0. */
lp_status lp_nn_mla_check(const lp_nn_mla_opts *o, const char **why);
lp_status lp_nn_mla_new(const char *name, const lp_nn_mla_opts *o,
                        uint64_t seed, lp_nn_layer **layer);
/* The options an mla layer was built with (borrowed), NULL otherwise. */
const lp_nn_mla_opts *lp_nn_mla_get_opts(const lp_nn_layer *l);
/* The rotary frequencies (qk_rope_head_dim / 2 floats, YaRN applied) and
 * the softmax scale the layer uses, computed as model.py does in float32. */
lp_status lp_nn_mla_rope_freqs(const lp_nn_mla_opts *o, float *freqs);
double lp_nn_mla_softmax_scale(const lp_nn_mla_opts *o);

/* SwiGLU MLP, model.py's MLP (kind "swiglu"): x [..., dim] ->
 * w2(silu(w1 x) * w3 x). Params <name>.w1.weight [inter_dim, dim],
 * .w2.weight [dim, inter_dim], .w3.weight [inter_dim, dim], ~ N(0,
 * 1/sqrt(in)). */
lp_status lp_nn_swiglu_new(const char *name, int64_t dim, int64_t inter_dim,
                           uint64_t seed, lp_nn_layer **layer);

/* DeepSeek-V3's Block (model.py): h = x + attn(attn_norm(x)), then
 * y = h + ffn(ffn_norm(h)); attn an MLA of options o named <name>.attn,
 * the norms <name>.attn_norm and <name>.ffn_norm (RMSNorm of o->dim,
 * o->eps), ffn the given layer (a new reference is taken; build it named
 * <name>.ffn: an lp_nn_swiglu_new for the first n_dense_layers, else an
 * lp_nn_moe_new), so the parameters are model.py's layers.<i>.* names.
 * x [batch, seq, o->dim]. Phase stops (lp_nn_set_phase_stop) before the
 * attention in both passes (LP_NN_PHASE_ATTN) and, for a phased ffn (the
 * MoE), before its input-grad (LP_NN_PHASE_COMBINE: it starts with the
 * combine-backward), so a pair's advances are DeepSeek-V3's phases: F
 * attn, dispatch, experts, combine; B combine, experts, dispatch, attn. */
lp_status lp_nn_mla_block_new(const char *name, const lp_nn_mla_opts *o,
                              lp_nn_layer *ffn, uint64_t seed,
                              lp_nn_layer **layer);
