/* nn_internal.h — private to core/nn: the layer object and its per-kind
 * vtable, the context layout, and helpers shared by the layer files. */
#pragma once

#include "lp_nn.h"

/* Per-kind behaviour. The public lp_nn_* calls check the ctx state machine
 * and clear the ctx on failure; these only do the math.
 *   forward:     ctx may be NULL (inference). Stash into ctx->saved.
 *   input_grad:  ctx is FORWARD. dx may be NULL (prepare for W only).
 *                Keep what weight_grad needs; release the rest.
 *   weight_grad: ctx is INPUT_GRAD. Accumulate into param grads.
 *                NULL for layers without params of their own. */
typedef struct nn_ops {
  const char *kind;
  lp_status (*forward)(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *x,
                       lp_tensor **y);
  lp_status (*input_grad)(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *dy,
                          lp_tensor **dx);
  lp_status (*weight_grad)(lp_nn_layer *l, lp_nn_ctx *ctx);
} nn_ops;

/* Phased layers (composites, MoE) also have this table (lp_nn_layer.phased;
 * NULL: a pass is one call of forward / input_grad, whose ops are then not
 * used for passes).
 *   advance:    one step of the pass begun on ctx (ctx->pass, input
 *               ctx->in, ctx->want_dx); see lp_nn_advance.
 *   phase:      what the next advance runs (NULL: LP_NN_PHASE_DENSE).
 *   weight_grad_part: one piece of the weight-grad of ctx (ctx->layer ==
 *               l) that its input-grad pass has made ready, ahead of
 *               weight_grad (which then skips it); *did = 1 when one ran.
 *               NULL: none (see lp_nn_weight_grad_part). */
typedef struct nn_phased {
  lp_status (*advance)(lp_nn_layer *l, lp_nn_ctx *ctx, int *done,
                       lp_tensor **out);
  lp_nn_phase (*phase)(const lp_nn_layer *l, const lp_nn_ctx *ctx);
  lp_status (*weight_grad_part)(lp_nn_layer *l, lp_nn_ctx *ctx, int *did);
} nn_phased;

struct lp_nn_layer {
  const nn_ops *ops;
  const nn_phased *phased; /* NULL for one-call layers */
  char *name;
  int refs;
  /* params: leaves own names and tensors (owns_params = 1); composites
   * hold copies of their children's entries (borrowed). */
  lp_nn_param *params;
  size_t nparams;
  int owns_params;
  lp_nn_layer **child; /* retained */
  size_t nchild;
  /* kind config */
  int64_t in, out; /* linear: features; embedding: vocab, dim */
  int64_t dim;     /* rmsnorm, attention: d_model */
  int64_t heads;   /* attention */
  float eps;       /* rmsnorm */
  lp_tensor_act_kind act;
  /* the GEMMs' precision (lp_nn_layer_set_precision); norms, softmax,
   * losses, routers and optimizers stay float32 whatever it is */
  lp_tensor_precision precision;
  /* chunks: the precision of the values between children
   * (lp_nn_chunk_set_boundary; bf16: rounded there) */
  lp_tensor_precision boundary;
  /* state of a kind the generic layer does not know (moe: config,
   * placement, bias, load), owned: freed by sub_free on release */
  void *sub;
  void (*sub_free)(void *sub);
  /* composites: the param generation their list was collected at */
  unsigned param_gen;
  /* lp_nn_set_phase_stop: the phase a pass reports while stopped before
   * this layer ([0] forward, [1] input-grad; DONE: no stop), and whether
   * this layer or one inside it has a stop (composites: from children) */
  lp_nn_phase stop[2];
  int has_stops;
};

#define NN_SLOTS 28

struct lp_nn_ctx {
  lp_nn_ctx *root;          /* where error text and the tag go */
  void *tag;                /* root only: lp_nn_ctx_set_tag */
  const lp_nn_layer *layer; /* whose forward is stashed; NULL when EMPTY */
  lp_nn_ctx_stage stage;
  lp_tensor *saved[NN_SLOTS]; /* layer-specific meaning, owned */
  lp_nn_ctx **child;          /* sub-contexts of composites (kept on clear) */
  size_t nchild;
  /* a pass in progress (lp_nn_*_begin .. the advance that finishes it) */
  int pass;        /* NN_PASS_* */
  int want_dx;     /* input-grad: the caller wants dx */
  lp_nn_phase phase; /* phased leaves (moe): what the next advance runs
                      * (LP_NN_PHASE_DENSE when a pass begins) */
  int stopped;     /* 1: a pass stopped before its layer (a phase stop);
                    * the next advance runs it (2) */
  size_t pos;      /* composites: the child being advanced */
  size_t wdone;    /* chunks: children whose weight-grad already ran (the
                    * last wdone, in backward order: lp_nn_weight_grad_part) */
  lp_tensor *in;   /* x or dy of the pass (a view; owned) */
  lp_tensor *cur;  /* composites: running activation / gradient (owned) */
  /* an exchange in flight (moe) */
  const lp_nn_ep *xchg_ep;
  void *xchg;
  /* layer-specific non-tensor state (moe routing), freed on clear */
  void *ext;
  void (*ext_free)(void *ext);
  char err[LP_ERRLEN];
};

/* A layer's GEMM at its precision (lp_tensor_gemm_prec). */
static inline lp_status nn_gemm(lp_tensor_precision prec, lp_tensor *c,
                                float alpha, const lp_tensor *a, int ta,
                                const lp_tensor *b, int tb, float beta) {
  return lp_tensor_gemm_prec(c, alpha, a, ta, b, tb, beta, prec);
}

enum { NN_PASS_NONE = 0, NN_PASS_FORWARD = 1, NN_PASS_INPUT_GRAD = 2 };

/* ---- helpers (layer.c) ---- */

/* Input-grad begin with an explicit "dx wanted" flag (chunks skip their
 * first layer's dx when theirs is not wanted). */
lp_status nn_input_grad_begin(lp_nn_layer *l, lp_nn_ctx *ctx,
                              const lp_tensor *dy, int want_dx);
/* Parameter lists changed somewhere (moe placement): composites collect
 * theirs again on next use. */
void nn_params_changed(void);
/* The forward / input_grad of a phased layer's nn_ops (its passes go
 * through nn_phased.advance): an internal error if ever called. */
lp_status nn_no_call(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *in,
                     lp_tensor **out);
/* Records "layer <name> (<kind>): <message>" in ctx's root (no-op when ctx
 * is NULL) and returns st. */
lp_status nn_fail(lp_nn_ctx *ctx, const lp_nn_layer *l, lp_status st,
                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Stores an owned tensor in slot i (freeing what was there). With a NULL
 * ctx the tensor is freed. */
void nn_keep(lp_nn_ctx *ctx, int i, lp_tensor *t);
/* Frees slot i. */
void nn_drop(lp_nn_ctx *ctx, int i);
/* What a layer at precision prec keeps of an activation that only GEMMs
 * read: at bf16, on a backend whose GEMMs take bf16 operands, *t is
 * replaced by a packed bf16 copy (lp_tensor_new_bf16; the old header
 * freed): the values those GEMMs would round it to, so the results are
 * bitwise the same, at half the bytes and one rounding instead of one per
 * GEMM. Otherwise (f32, a device, already packed) *t stays. On failure *t
 * is unchanged. nn_pack_slot does it to ctx slot i (no-op: NULL ctx or an
 * empty slot). */
lp_status nn_pack(lp_tensor_precision prec, lp_tensor **t);
lp_status nn_pack_slot(lp_nn_ctx *ctx, lp_tensor_precision prec, int i);
/* A dense, owned tensor with x's values: a view when x is dense, else a
 * clone. */
lp_status nn_dense(const lp_tensor *x, lp_tensor **out);
/* A dense host tensor with x's values: a view when x is dense host
 * memory, else a copy (device ids and targets are checked on the host). */
lp_status nn_host(const lp_tensor *x, lp_tensor **out);
/* LP_OK when t is on the backend of l's parameters, else LP_ERR_ARG with
 * text naming both devices ("input is on cuda:0 but the parameters are
 * on cpu"). */
/* LP_OK when dy has the shape of the forward's output (a layer whose
 * output is shaped like its input x passes x), else LP_ERR_ARG with "dy has
 * shape [..], forward output had [..]" in ctx's error. */
lp_status nn_check_dy_shape(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *x,
                            const lp_tensor *dy);
lp_status nn_check_device(lp_nn_ctx *ctx, const lp_nn_layer *l,
                          const char *what, const lp_tensor *t);
/* A dense tensor on backend `be` with x's values: nn_dense when x is
 * there already, else a copy (token ids and targets given on the host to a
 * model on a device). */
lp_status nn_on(const lp_tensor *x, const lp_tensor_backend *be,
                lp_tensor **out);
/* Sub-context i of ctx, created on first use. NULL ctx gives NULL. */
lp_status nn_child_ctx(lp_nn_ctx *ctx, size_t i, lp_nn_ctx **out);
/* Allocates a layer with one reference, a copy of name and the given ops. */
lp_status nn_layer_alloc(const nn_ops *ops, const char *name,
                         lp_nn_layer **out);
/* Adds an owned parameter "<layer name>.<suffix>" of the given shape (value
 * and zero grad), initialised from (seed, full name). */
lp_status nn_add_param(lp_nn_layer *l, const char *suffix, int ndim,
                       const int64_t *shape, lp_nn_init_kind init,
                       float init_std, uint64_t seed);
/* Fills *p with a new owned parameter "<layer name>.<suffix>" as
 * nn_add_param does; on failure *p holds what was made (nn_param_free). */
lp_status nn_param_make(const lp_nn_layer *l, const char *suffix, int ndim,
                        const int64_t *shape, lp_nn_init_kind init,
                        float init_std, uint64_t seed, lp_nn_param *p);
/* Frees an owned parameter's name and tensors; *p is zeroed. */
void nn_param_free(lp_nn_param *p);
/* Text "[a, b, c]" of t's shape into buf. */
const char *nn_shape_str(const lp_tensor *t, char *buf, size_t n);
/* Writes a copy of t's shape with the last dim replaced by last. */
void nn_shape_last(const lp_tensor *t, int64_t last, int64_t *shape);

/* Composite constructors used by blocks.c (layer.c). */
lp_status nn_composite_collect_params(lp_nn_layer *l);

/* ---- SwiGLU (swiglu.c): out = (silu(x W1^T) * (x W3^T)) W2^T on rows,
 * W1, W3 [hidden, D], W2 [D, hidden]; the swiglu layer's and the MoE
 * experts' (moe.c) math; the GEMMs at precision prec. ---- */
/* a1 = x W1^T, a3 = x W3^T, h = silu(a1) * a3, out = h W2^T. */
lp_status nn_swiglu_fwd(lp_tensor_precision prec, const lp_tensor *x, const lp_tensor *w1,
                        const lp_tensor *w3, const lp_tensor *w2,
                        lp_tensor *a1, lp_tensor *a3, lp_tensor *h,
                        lp_tensor *out);
/* dh = dout W2; da3 = dh * silu(a1); da1 = dh * a3 * silu'(a1);
 * dx = beta * dx + da1 W1 + da3 W3 (dx NULL: skip it). */
lp_status nn_swiglu_bwd(lp_tensor_precision prec, const lp_tensor *dout, const lp_tensor *a1,
                        const lp_tensor *a3, const lp_tensor *w1,
                        const lp_tensor *w3, const lp_tensor *w2,
                        lp_tensor *da1, lp_tensor *da3, lp_tensor *dx,
                        float beta);
/* g1 += da1^T x, g3 += da3^T x, g2 += dout^T h. */
lp_status nn_swiglu_wgrad(lp_tensor_precision prec, const lp_tensor *x, const lp_tensor *h,
                          const lp_tensor *dout, const lp_tensor *da1,
                          const lp_tensor *da3, lp_tensor *g1, lp_tensor *g3,
                          lp_tensor *g2);
