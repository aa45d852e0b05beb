/* layer.c — the layer object, contexts and their state machine, parameter
 * lists and initialisation, and the two composites: chunk (sequential) and
 * residual. */
#include "nn_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- helpers ---- */

const char *nn_shape_str(const lp_tensor *t, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
  if (!t) {
    snprintf(buf, n, "(none)");
    return buf;
  }
  len += (size_t)snprintf(buf + len, n - len, "[");
  for (int i = 0; i < t->ndim && len < n; i++)
    len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "",
                            (long long)t->shape[i]);
  if (len < n) snprintf(buf + len, n - len, "]");
  return buf;
}

void nn_shape_last(const lp_tensor *t, int64_t last, int64_t *shape) {
  for (int i = 0; i < t->ndim; i++)
    shape[i] = t->shape[i];
  shape[t->ndim - 1] = last;
}

lp_status nn_fail(lp_nn_ctx *ctx, const lp_nn_layer *l, lp_status st,
                  const char *fmt, ...) {
  char msg[LP_ERRLEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ctx)
    lp_errf(ctx->root->err, "layer %s (%s): %s", l ? l->name : "?",
            l ? l->ops->kind : "?", msg);
  lp_log(LP_LOG_DEBUG, "nn: layer %s: %s (%s)", l ? l->name : "?", msg,
         lp_strerror(st));
  return st;
}

void nn_keep(lp_nn_ctx *ctx, int i, lp_tensor *t) {
  if (!ctx) {
    lp_tensor_free(t);
    return;
  }
  lp_tensor_free(ctx->saved[i]);
  ctx->saved[i] = t;
}

void nn_drop(lp_nn_ctx *ctx, int i) {
  if (!ctx) return;
  lp_tensor_free(ctx->saved[i]);
  ctx->saved[i] = NULL;
}

static int pack_off; /* lp_nn_bf16_pack_force_off */

void lp_nn_bf16_pack_force_off(int on) { pack_off = !!on; }

lp_status nn_pack(lp_tensor_precision prec, lp_tensor **t) {
  const lp_tensor_backend *be = lp_tensor_backend_of(*t);
  if (prec != LP_TENSOR_BF16 || pack_off || !be->gemm_bf16h || !be->host_accessible ||
      lp_tensor_is_bf16(*t) || !lp_tensor_is_contiguous(*t))
    return LP_OK;
  lp_tensor *p;
  LP_CHECK(lp_tensor_new_bf16(*t, &p));
  lp_tensor_free(*t);
  *t = p;
  return LP_OK;
}

lp_status nn_pack_slot(lp_nn_ctx *ctx, lp_tensor_precision prec, int i) {
  if (!ctx || !ctx->saved[i]) return LP_OK;
  return nn_pack(prec, &ctx->saved[i]);
}

lp_status nn_dense(const lp_tensor *x, lp_tensor **out) {
  if (lp_tensor_is_contiguous(x)) return lp_tensor_view(x, out);
  return lp_tensor_clone(x, out);
}

lp_status nn_host(const lp_tensor *x, lp_tensor **out) {
  if (lp_tensor_backend_of(x)->host_accessible) return nn_dense(x, out);
  return lp_tensor_to_host(x, out);
}

lp_status nn_check_device(lp_nn_ctx *ctx, const lp_nn_layer *l,
                          const char *what, const lp_tensor *t) {
  const lp_tensor_backend *a = lp_tensor_backend_of(t),
                          *b = lp_tensor_backend_of(l->params[0].value);
  if (a == b) return LP_OK;
  return nn_fail(ctx, l, LP_ERR_ARG,
                 "%s is on %s but the parameters are on %s (move one of "
                 "them: lp_nn_layer_to / model:to)",
                 what, a->name, b->name);
}

lp_status nn_on(const lp_tensor *x, const lp_tensor_backend *be,
                lp_tensor **out) {
  if (lp_tensor_backend_of(x) == be) return nn_dense(x, out);
  lp_tensor *d = NULL;
  LP_CHECK(nn_dense(x, &d));
  lp_status st = lp_tensor_empty(be, d->ndim, d->shape, out);
  if (st == LP_OK) st = lp_tensor_copy(*out, d);
  if (st != LP_OK) {
    lp_tensor_free(*out);
    *out = NULL;
  }
  lp_tensor_free(d);
  return st;
}

lp_status nn_child_ctx(lp_nn_ctx *ctx, size_t i, lp_nn_ctx **out) {
  *out = NULL;
  if (!ctx) return LP_OK;
  if (i >= ctx->nchild) {
    lp_nn_ctx **c = lp_realloc(ctx->child, (i + 1) * sizeof *c);
    if (!c) return LP_ERR_NOMEM;
    for (size_t k = ctx->nchild; k <= i; k++)
      c[k] = NULL;
    ctx->child = c;
    ctx->nchild = i + 1;
  }
  if (!ctx->child[i]) {
    LP_CHECK(lp_nn_ctx_new(&ctx->child[i]));
    ctx->child[i]->root = ctx->root;
  }
  *out = ctx->child[i];
  return LP_OK;
}

/* ---- contexts ---- */

lp_status lp_nn_ctx_new(lp_nn_ctx **out) {
  if (!out) return LP_ERR_ARG;
  lp_nn_ctx *c = lp_calloc(1, sizeof *c);
  *out = c;
  if (!c) return LP_ERR_NOMEM;
  c->root = c;
  return LP_OK;
}

/* Waits for an exchange this ctx started and nobody finished (a failure
 * or a clear in the middle of a pass): the buffers it writes are about to
 * be freed. Its status no longer matters. */
static void drain_exchange(lp_nn_ctx *ctx) {
  if (!ctx->xchg) return;
  (void)ctx->xchg_ep->wait(ctx->xchg_ep->ud, ctx->xchg);
  ctx->xchg = NULL;
  ctx->xchg_ep = NULL;
}

void lp_nn_ctx_clear(lp_nn_ctx *ctx) {
  if (!ctx) return;
  drain_exchange(ctx);
  for (int i = 0; i < NN_SLOTS; i++)
    nn_drop(ctx, i);
  for (size_t i = 0; i < ctx->nchild; i++)
    lp_nn_ctx_clear(ctx->child[i]);
  lp_tensor_free(ctx->in);
  lp_tensor_free(ctx->cur);
  ctx->in = ctx->cur = NULL;
  if (ctx->ext_free) ctx->ext_free(ctx->ext);
  ctx->ext = NULL;
  ctx->ext_free = NULL;
  ctx->pass = NN_PASS_NONE;
  ctx->phase = LP_NN_PHASE_DONE;
  ctx->pos = 0;
  ctx->wdone = 0;
  ctx->layer = NULL;
  ctx->stage = LP_NN_CTX_EMPTY;
}

void lp_nn_ctx_free(lp_nn_ctx *ctx) {
  if (!ctx) return;
  lp_nn_ctx_clear(ctx);
  for (size_t i = 0; i < ctx->nchild; i++)
    lp_nn_ctx_free(ctx->child[i]);
  lp_free(ctx->child);
  lp_free(ctx);
}

lp_nn_ctx_stage lp_nn_ctx_stage_of(const lp_nn_ctx *ctx) {
  return ctx ? ctx->stage : LP_NN_CTX_EMPTY;
}

size_t lp_nn_ctx_bytes(const lp_nn_ctx *ctx) {
  if (!ctx) return 0;
  size_t b = 0;
  for (int i = 0; i < NN_SLOTS; i++)
    if (ctx->saved[i])
      b += (size_t)lp_tensor_numel(ctx->saved[i]) * lp_tensor_elem_bytes(ctx->saved[i]);
  for (size_t i = 0; i < ctx->nchild; i++)
    b += lp_nn_ctx_bytes(ctx->child[i]);
  return b;
}

const char *lp_nn_ctx_last_error(const lp_nn_ctx *ctx) {
  return ctx ? ctx->root->err : "";
}

/* ---- the state machine ---- */

/* A top-level call starts with empty error text; a failure that left none
 * gets a generic line naming the layer and the step. */
static void err_begin(lp_nn_ctx *ctx) {
  if (ctx && ctx->root == ctx) ctx->err[0] = 0;
}

static lp_status err_end(lp_nn_ctx *ctx, const lp_nn_layer *l, lp_status st,
                         const char *step) {
  if (st != LP_OK && ctx && !ctx->root->err[0])
    nn_fail(ctx, l, st, "%s: %s", step, lp_strerror(st));
  return st;
}

/* ---- phased passes ---- */

/* Marks a checked pass as begun with input `in` (a view is kept). On
 * failure the ctx is cleared (a failed input-grad loses its forward, like
 * any failure of a pass). */
static lp_status start_pass(lp_nn_layer *l, lp_nn_ctx *ctx,
                            const lp_tensor *in, int pass, int want_dx) {
  lp_status st = lp_tensor_view(in, &ctx->in);
  if (st != LP_OK) {
    lp_nn_ctx_clear(ctx);
    return err_end(ctx, l, st,
                   pass == NN_PASS_FORWARD ? "forward" : "input_grad");
  }
  ctx->layer = l;
  ctx->pass = pass;
  ctx->want_dx = want_dx;
  ctx->phase = LP_NN_PHASE_DENSE;
  ctx->stopped = 0;
  ctx->pos = 0;
  ctx->wdone = 0;
  return LP_OK;
}

lp_status lp_nn_forward_begin(lp_nn_layer *l, lp_nn_ctx *ctx,
                              const lp_tensor *x) {
  if (!l || !ctx) return LP_ERR_ARG;
  err_begin(ctx);
  if (!x) return nn_fail(ctx, l, LP_ERR_ARG, "forward: input is NULL");
  if (ctx->pass != NN_PASS_NONE)
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "forward: a pass of layer %s is still running on this "
                   "context (advance it to the end first)",
                   ctx->layer ? ctx->layer->name : "?");
  if (ctx->stage != LP_NN_CTX_EMPTY)
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "forward: the context still holds a micro-batch of layer "
                   "%s (run weight_grad or clear it first)",
                   ctx->layer ? ctx->layer->name : "?");
  return start_pass(l, ctx, x, NN_PASS_FORWARD, 1);
}

lp_status nn_input_grad_begin(lp_nn_layer *l, lp_nn_ctx *ctx,
                              const lp_tensor *dy, int want_dx) {
  if (!l || !ctx) return LP_ERR_ARG;
  err_begin(ctx);
  if (ctx->pass != NN_PASS_NONE)
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "input_grad: a pass of layer %s is still running on this "
                   "context (advance it to the end first)",
                   ctx->layer ? ctx->layer->name : "?");
  if (ctx->stage != LP_NN_CTX_FORWARD || ctx->layer != l)
    return nn_fail(
        ctx, l, LP_ERR_ARG,
        "input_grad: the context holds no forward of this layer%s",
        ctx->stage == LP_NN_CTX_INPUT_GRAD ? " (input_grad already ran)" : "");
  if (!dy) return nn_fail(ctx, l, LP_ERR_ARG, "input_grad: dy is NULL");
  return start_pass(l, ctx, dy, NN_PASS_INPUT_GRAD, want_dx);
}

lp_status lp_nn_input_grad_begin(lp_nn_layer *l, lp_nn_ctx *ctx,
                                 const lp_tensor *dy) {
  return nn_input_grad_begin(l, ctx, dy, 1);
}

/* One call of a layer without phases. */
static lp_status leaf_advance(lp_nn_layer *l, lp_nn_ctx *ctx, int *done,
                              lp_tensor **out) {
  *done = 1;
  if (ctx->pass == NN_PASS_FORWARD)
    return l->ops->forward(l, ctx, ctx->in, out);
  return l->ops->input_grad(l, ctx, ctx->in, ctx->want_dx ? out : NULL);
}

lp_status lp_nn_advance(lp_nn_layer *l, lp_nn_ctx *ctx, int *done,
                        lp_tensor **out) {
  lp_tensor *res = NULL;
  if (out) *out = NULL;
  if (!l || !ctx || !done) return LP_ERR_ARG;
  *done = 0;
  if (ctx->pass == NN_PASS_NONE || ctx->layer != l)
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "advance: no pass of this layer was begun on the context");
  int fwd = ctx->pass == NN_PASS_FORWARD;
  if (l->stop[fwd ? 0 : 1] != LP_NN_PHASE_DONE && ctx->stopped == 0) {
    ctx->stopped = 1; /* a phase stop: this advance ends before the layer */
    return LP_OK;
  }
  ctx->stopped = 2;
  lp_status st = l->phased ? l->phased->advance(l, ctx, done, &res)
                           : leaf_advance(l, ctx, done, &res);
  if (st != LP_OK) {
    lp_tensor_free(res);
    *done = 0;
    lp_nn_ctx_clear(ctx);
    return err_end(ctx, l, st, fwd ? "forward" : "input_grad");
  }
  if (!*done) {
    lp_tensor_free(res);
    return LP_OK;
  }
  lp_tensor_free(ctx->in);
  lp_tensor_free(ctx->cur);
  ctx->in = ctx->cur = NULL;
  ctx->pass = NN_PASS_NONE;
  ctx->stage = fwd ? LP_NN_CTX_FORWARD : LP_NN_CTX_INPUT_GRAD;
  if (out)
    *out = res;
  else
    lp_tensor_free(res);
  return LP_OK;
}

lp_nn_phase lp_nn_phase_of(const lp_nn_ctx *ctx) {
  if (!ctx || ctx->pass == NN_PASS_NONE || !ctx->layer) return LP_NN_PHASE_DONE;
  const lp_nn_layer *l = ctx->layer;
  if (ctx->stopped == 1) return l->stop[ctx->pass == NN_PASS_FORWARD ? 0 : 1];
  return l->phased && l->phased->phase ? l->phased->phase(l, ctx)
                                       : LP_NN_PHASE_DENSE;
}

const char *lp_nn_phase_text(lp_nn_phase p) {
  switch (p) {
  case LP_NN_PHASE_DENSE: return "attn/dense";
  case LP_NN_PHASE_DISPATCH: return "dispatch";
  case LP_NN_PHASE_EXPERTS: return "experts";
  case LP_NN_PHASE_COMBINE: return "combine";
  case LP_NN_PHASE_ATTN: return "attn";
  default: return "done";
  }
}

lp_status lp_nn_set_phase_stop(lp_nn_layer *l, lp_nn_phase fwd, lp_nn_phase bwd) {
  if (!l || fwd < LP_NN_PHASE_DONE || fwd > LP_NN_PHASE_ATTN || bwd < LP_NN_PHASE_DONE ||
      bwd > LP_NN_PHASE_ATTN)
    return LP_ERR_ARG;
  l->stop[0] = fwd, l->stop[1] = bwd;
  l->has_stops = fwd != LP_NN_PHASE_DONE || bwd != LP_NN_PHASE_DONE;
  return LP_OK;
}

int lp_nn_has_phase_stops(const lp_nn_layer *l) { return l && l->has_stops; }

const char *lp_nn_phase_name(const lp_nn_ctx *ctx) {
  return lp_nn_phase_text(lp_nn_phase_of(ctx));
}

void lp_nn_ctx_set_tag(lp_nn_ctx *ctx, void *tag) {
  if (ctx) ctx->root->tag = tag;
}

void *lp_nn_ctx_tag(const lp_nn_ctx *ctx) { return ctx ? ctx->root->tag : NULL; }

int lp_nn_ctx_exchange_pending(const lp_nn_ctx *ctx) {
  if (!ctx) return 0;
  if (ctx->xchg) return 1;
  for (size_t i = 0; i < ctx->nchild; i++)
    if (lp_nn_ctx_exchange_pending(ctx->child[i])) return 1;
  return 0;
}

/* Begin, then advance until done (an EP exchange is waited for inside). */
static lp_status run_pass(lp_nn_layer *l, lp_nn_ctx *ctx, lp_tensor **out) {
  int done = 0;
  while (!done)
    LP_CHECK(lp_nn_advance(l, ctx, &done, out));
  return LP_OK;
}

lp_status lp_nn_forward(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *x,
                        lp_tensor **y) {
  if (y) *y = NULL;
  if (!l || !y) return LP_ERR_ARG;
  if (!ctx) { /* inference: a scratch context, dropped at the end */
    lp_nn_ctx *tmp;
    LP_CHECK(lp_nn_ctx_new(&tmp));
    lp_status st = lp_nn_forward(l, tmp, x, y);
    lp_nn_ctx_free(tmp);
    return st;
  }
  LP_CHECK(lp_nn_forward_begin(l, ctx, x));
  return run_pass(l, ctx, y);
}

lp_status lp_nn_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *dy,
                           lp_tensor **dx) {
  if (dx) *dx = NULL;
  if (!l || !ctx) return LP_ERR_ARG;
  LP_CHECK(nn_input_grad_begin(l, ctx, dy, dx != NULL));
  return run_pass(l, ctx, dx);
}

lp_status lp_nn_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                            const lp_tensor *dy) {
  if (!l || !ctx) return LP_ERR_ARG;
  err_begin(ctx);
  if (ctx->layer != l || ctx->stage == LP_NN_CTX_EMPTY ||
      ctx->pass != NN_PASS_NONE)
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "weight_grad: the context holds no %s of this layer",
                   ctx->pass != NN_PASS_NONE ? "finished pass" : "forward");
  if (ctx->stage == LP_NN_CTX_FORWARD) {
    if (!dy)
      return nn_fail(ctx, l, LP_ERR_ARG,
                     "weight_grad: dy is required when input_grad did not run");
    LP_CHECK(lp_nn_input_grad(l, ctx, dy, NULL));
  }
  lp_status st = l->ops->weight_grad ? l->ops->weight_grad(l, ctx) : LP_OK;
  lp_nn_ctx_clear(ctx);
  return err_end(ctx, l, st, "weight_grad");
}

lp_status lp_nn_backward(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *dy,
                         lp_tensor **dx) {
  LP_CHECK(lp_nn_input_grad(l, ctx, dy, dx));
  lp_status st = lp_nn_weight_grad(l, ctx, NULL);
  if (st != LP_OK && dx) {
    lp_tensor_free(*dx);
    *dx = NULL;
  }
  return st;
}

/* ---- layer objects ---- */

lp_status nn_layer_alloc(const nn_ops *ops, const char *name,
                         lp_nn_layer **out) {
  *out = NULL;
  lp_nn_layer *l = lp_calloc(1, sizeof *l);
  if (!l) return LP_ERR_NOMEM;
  l->name = lp_strdup(name ? name : "");
  if (!l->name) {
    lp_free(l);
    return LP_ERR_NOMEM;
  }
  l->ops = ops;
  l->refs = 1;
  *out = l;
  return LP_OK;
}

lp_nn_layer *lp_nn_layer_retain(lp_nn_layer *l) {
  if (l) l->refs++;
  return l;
}

void lp_nn_layer_release(lp_nn_layer *l) {
  if (!l || --l->refs > 0) return;
  if (l->owns_params)
    for (size_t i = 0; i < l->nparams; i++)
      nn_param_free(&l->params[i]);
  lp_free(l->params);
  if (l->sub_free) l->sub_free(l->sub);
  for (size_t i = 0; i < l->nchild; i++)
    lp_nn_layer_release(l->child[i]);
  lp_free(l->child);
  lp_free(l->name);
  lp_free(l);
}

const char *lp_nn_layer_name(const lp_nn_layer *l) { return l ? l->name : ""; }
const char *lp_nn_layer_kind(const lp_nn_layer *l) {
  return l ? l->ops->kind : "";
}
size_t lp_nn_layer_children(const lp_nn_layer *l) { return l ? l->nchild : 0; }
lp_nn_layer *lp_nn_layer_child(const lp_nn_layer *l, size_t i) {
  return l && i < l->nchild ? l->child[i] : NULL;
}

/* ---- parameters ---- */

static lp_status init_param(const lp_nn_param *p, uint64_t seed) {
  switch (p->init) {
  case LP_NN_INIT_ZEROS:
    return lp_tensor_fill(p->value, 0.0f);
  case LP_NN_INIT_ONES:
    return lp_tensor_fill(p->value, 1.0f);
  case LP_NN_INIT_NORMAL: {
    lp_tensor_rng r;
    lp_tensor_rng_seed_name(&r, seed, p->name);
    return lp_tensor_fill_normal(p->value, &r, 0.0f, p->init_std);
  }
  }
  return LP_ERR_ARG;
}

lp_status nn_param_make(const lp_nn_layer *l, const char *suffix, int ndim,
                        const int64_t *shape, lp_nn_init_kind init,
                        float init_std, uint64_t seed, lp_nn_param *p) {
  memset(p, 0, sizeof *p);
  size_t n = strlen(l->name) + strlen(suffix) + 2;
  char *name = lp_malloc(n);
  if (!name) return LP_ERR_NOMEM;
  snprintf(name, n, "%s%s%s", l->name, l->name[0] ? "." : "", suffix);
  p->name = name;
  p->init = init;
  p->init_std = init_std;
  LP_CHECK(lp_tensor_empty(NULL, ndim, shape, &p->value));
  lp_tensor_keep_bf16(p->value); /* bf16 GEMMs read a copy made once per change */
  LP_CHECK(lp_tensor_zeros(NULL, ndim, shape, &p->grad));
  return init_param(p, seed);
}

void nn_param_free(lp_nn_param *p) {
  lp_free((char *)p->name);
  lp_tensor_free(p->value);
  lp_tensor_free(p->grad);
  memset(p, 0, sizeof *p);
}

lp_status nn_add_param(lp_nn_layer *l, const char *suffix, int ndim,
                       const int64_t *shape, lp_nn_init_kind init,
                       float init_std, uint64_t seed) {
  lp_nn_param *ps = lp_realloc(l->params, (l->nparams + 1) * sizeof *ps);
  if (!ps) return LP_ERR_NOMEM;
  l->params = ps;
  l->owns_params = 1;
  /* counted first: from here on, release frees whatever is set */
  return nn_param_make(l, suffix, ndim, shape, init, init_std, seed,
                       &ps[l->nparams++]);
}

/* Bumped whenever a layer's own parameter list changes (moe placement). */
static unsigned param_gen;

void nn_params_changed(void) { param_gen++; }

/* A composite's list again when some list changed since it was collected.
 * A list whose entries did not change keeps its array (pointers callers
 * hold stay valid); on allocation failure the old list stays too. */
static void refresh_params(lp_nn_layer *l) {
  if (l->owns_params || !l->nchild || l->param_gen == param_gen) return;
  lp_nn_param *old = l->params;
  size_t nold = l->nparams;
  l->params = NULL;
  l->nparams = 0;
  lp_status st = nn_composite_collect_params(l);
  int same = st == LP_OK && l->nparams == nold;
  for (size_t i = 0; same && i < nold; i++)
    same = old[i].value == l->params[i].value && old[i].name == l->params[i].name;
  if (st != LP_OK) l->param_gen = param_gen - 1; /* try again next time */
  if (same || st != LP_OK) { /* keep the old array */
    lp_free(l->params);
    l->params = old;
    l->nparams = nold;
    return;
  }
  lp_free(old);
}

const lp_nn_param *lp_nn_params(const lp_nn_layer *l, size_t *n) {
  if (l) refresh_params((lp_nn_layer *)l);
  if (n) *n = l ? l->nparams : 0;
  return l && l->nparams ? l->params : NULL;
}

int64_t lp_nn_param_numel(const lp_nn_layer *l) {
  int64_t n = 0;
  if (l) refresh_params((lp_nn_layer *)l);
  for (size_t i = 0; l && i < l->nparams; i++)
    n += lp_tensor_numel(l->params[i].value);
  return n;
}

lp_status lp_nn_init(lp_nn_layer *l, uint64_t seed) {
  if (!l) return LP_ERR_ARG;
  refresh_params(l);
  for (size_t i = 0; i < l->nparams; i++)
    LP_CHECK(init_param(&l->params[i], seed));
  return LP_OK;
}

lp_status lp_nn_zero_grad(lp_nn_layer *l) {
  if (!l) return LP_ERR_ARG;
  refresh_params(l);
  for (size_t i = 0; i < l->nparams; i++)
    LP_CHECK(lp_tensor_fill(l->params[i].grad, 0.0f));
  return LP_OK;
}

lp_status lp_nn_layer_to(lp_nn_layer *l, const lp_tensor_backend *be) {
  if (!l) return LP_ERR_ARG;
  if (!be) be = lp_tensor_backend_cpu();
  refresh_params(l); /* e.g. after lp_nn_set_ep rebuilt an MoE's slots */
  const lp_tensor_backend *from =
      l->nparams ? lp_tensor_backend_of(l->params[0].value) : be;
  lp_status st = LP_OK;
  size_t i = 0;
  for (; i < l->nparams && st == LP_OK; i++) {
    st = lp_tensor_move(l->params[i].value, be);
    if (st == LP_OK) st = lp_tensor_move(l->params[i].grad, be);
  }
  if (st != LP_OK) /* back to where they were */
    for (size_t j = 0; j < i; j++) {
      (void)lp_tensor_move(l->params[j].value, from);
      (void)lp_tensor_move(l->params[j].grad, from);
    }
  return st;
}

lp_status lp_nn_layer_set_precision(lp_nn_layer *l, lp_tensor_precision prec) {
  if (!l || (prec != LP_TENSOR_F32 && prec != LP_TENSOR_BF16))
    return LP_ERR_ARG;
  l->precision = prec;
  for (size_t i = 0; i < l->nchild; i++)
    LP_CHECK(lp_nn_layer_set_precision(l->child[i], prec));
  return LP_OK;
}

lp_tensor_precision lp_nn_layer_precision(const lp_nn_layer *l) {
  return l ? l->precision : LP_TENSOR_F32;
}

lp_status nn_composite_collect_params(lp_nn_layer *l) {
  size_t total = 0;
  for (size_t i = 0; i < l->nchild; i++) {
    refresh_params(l->child[i]);
    total += l->child[i]->nparams;
  }
  l->owns_params = 0;
  l->param_gen = param_gen;
  if (!total) return LP_OK;
  l->params = lp_malloc(total * sizeof *l->params);
  if (!l->params) return LP_ERR_NOMEM;
  for (size_t i = 0; i < l->nchild; i++) {
    const lp_nn_layer *c = l->child[i];
    for (size_t j = 0; j < c->nparams; j++) {
      int seen = 0;
      for (size_t k = 0; k < l->nparams && !seen; k++)
        seen = l->params[k].value == c->params[j].value;
      if (!seen) l->params[l->nparams++] = c->params[j];
    }
  }
  return LP_OK;
}

/* Builds a composite over children (retained). */
static lp_status composite_new(const nn_ops *ops, const nn_phased *phased,
                               const char *name,
                               lp_nn_layer *const *children, size_t n,
                               lp_nn_layer **out) {
  *out = NULL;
  if (!children || n == 0) return LP_ERR_ARG;
  for (size_t i = 0; i < n; i++)
    if (!children[i]) return LP_ERR_ARG;
  lp_nn_layer *l;
  LP_CHECK(nn_layer_alloc(ops, name, &l));
  l->phased = phased;
  l->child = lp_malloc(n * sizeof *l->child);
  if (!l->child) {
    lp_nn_layer_release(l);
    return LP_ERR_NOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    l->child[l->nchild++] = lp_nn_layer_retain(children[i]);
    l->has_stops |= children[i]->has_stops;
  }
  lp_status st = nn_composite_collect_params(l);
  if (st != LP_OK) {
    lp_nn_layer_release(l);
    return st;
  }
  *out = l;
  return LP_OK;
}

/* ---- chunk: sequential ----
 * ctx children: one sub-context per layer. */

/* Forward: children 0..n-1 in order; input-grad: n-1..0. ctx->pos counts
 * the children finished; ctx->cur holds the activation (gradient) between
 * them. A child that stops at an exchange stops the chunk there. */
static lp_status chunk_advance(lp_nn_layer *l, lp_nn_ctx *ctx, int *done,
                               lp_tensor **out) {
  int fwd = ctx->pass == NN_PASS_FORWARD;
  while (ctx->pos < l->nchild) {
    size_t k = fwd ? ctx->pos : l->nchild - 1 - ctx->pos;
    lp_nn_layer *c = l->child[k];
    lp_nn_ctx *cc;
    LP_CHECK(nn_child_ctx(ctx, k, &cc));
    if (cc->pass == NN_PASS_NONE) {
      const lp_tensor *in = ctx->pos == 0 ? ctx->in : ctx->cur;
      LP_CHECK(fwd ? lp_nn_forward_begin(c, cc, in)
                   : nn_input_grad_begin(c, cc, in, k > 0 || ctx->want_dx));
      lp_tensor_free(ctx->cur); /* the child holds its own view */
      ctx->cur = NULL;
    }
    int d;
    lp_tensor *next = NULL;
    LP_CHECK(lp_nn_advance(c, cc, &d, &next));
    if (!d) return LP_OK;
    if (!fwd && k > 0 && !next)
      return nn_fail(ctx, l, LP_ERR_ARG,
                     "layer %s has no input gradient but is not first",
                     c->name);
    /* a layer boundary inside the chunk: bf16 values there (in place, as
     * the executor rounds at a stage boundary) */
    if (next && l->boundary == LP_TENSOR_BF16 && ctx->pos + 1 < l->nchild) {
      lp_status rs = lp_tensor_round_bf16(&next);
      if (rs != LP_OK) {
        lp_tensor_free(next);
        return nn_fail(ctx, l, rs, "rounding the output of layer %s to bf16 failed", c->name);
      }
    }
    ctx->cur = next;
    ctx->pos++;
  }
  *out = ctx->cur;
  ctx->cur = NULL;
  *done = 1;
  return LP_OK;
}

/* The running child's phase; dense between children. */
static lp_nn_phase chunk_phase(const lp_nn_layer *l, const lp_nn_ctx *ctx) {
  if (ctx->pos >= l->nchild) return LP_NN_PHASE_DENSE;
  size_t k =
      ctx->pass == NN_PASS_FORWARD ? ctx->pos : l->nchild - 1 - ctx->pos;
  if (k >= ctx->nchild || ctx->child[k]->pass == NN_PASS_NONE)
    return LP_NN_PHASE_DENSE;
  return lp_nn_phase_of(ctx->child[k]);
}

lp_status nn_no_call(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *in,
                     lp_tensor **out) {
  (void)in, (void)out;
  return nn_fail(ctx, l, LP_ERR_ARG, "internal: a phased layer run directly");
}

/* Children n-1 .. 0, less the last ctx->wdone that lp_nn_weight_grad_part
 * already ran: the same calls in the same order either way. */
static lp_status chunk_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  for (size_t k = l->nchild - ctx->wdone; k-- > 0;)
    LP_CHECK(lp_nn_weight_grad(l->child[k], ctx->child[k], NULL));
  return LP_OK;
}

/* During (or after) an input-grad pass: the weight-grad of the next child
 * the pass has finished (children finish n-1, n-2, ...: ctx->pos of them
 * so far), else a piece of the child running now. */
static lp_status chunk_weight_grad_part(lp_nn_layer *l, lp_nn_ctx *ctx, int *did) {
  int running = ctx->pass == NN_PASS_INPUT_GRAD;
  if (!running && !(ctx->pass == NN_PASS_NONE && ctx->stage == LP_NN_CTX_INPUT_GRAD))
    return LP_OK;
  size_t finished = running ? ctx->pos : l->nchild;
  if (ctx->wdone < finished) {
    size_t k = l->nchild - 1 - ctx->wdone;
    LP_CHECK(lp_nn_weight_grad(l->child[k], ctx->child[k], NULL));
    ctx->wdone++;
    *did = 1;
    return LP_OK;
  }
  size_t k = l->nchild - 1 - ctx->pos;
  if (running && ctx->pos < l->nchild && k < ctx->nchild && ctx->child[k])
    return lp_nn_weight_grad_part(l->child[k], ctx->child[k], did);
  return LP_OK;
}

static const nn_ops chunk_ops = {"chunk", nn_no_call, nn_no_call,
                                 chunk_weight_grad};
static const nn_phased chunk_phased = {chunk_advance, chunk_phase,
                                       chunk_weight_grad_part};

lp_status lp_nn_weight_grad_part(lp_nn_layer *l, lp_nn_ctx *ctx, int *did) {
  if (did) *did = 0;
  if (!l || !ctx || !did) return LP_ERR_ARG;
  if (ctx->layer != l || !l->phased || !l->phased->weight_grad_part) return LP_OK;
  return l->phased->weight_grad_part(l, ctx, did);
}

lp_status lp_nn_chunk_new(const char *name, lp_nn_layer *const *layers,
                          size_t n, lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  return composite_new(&chunk_ops, &chunk_phased, name, layers, n, layer);
}

lp_status lp_nn_chunk_set_boundary(lp_nn_layer *l, lp_tensor_precision prec) {
  if (!l || l->ops != &chunk_ops || (prec != LP_TENSOR_F32 && prec != LP_TENSOR_BF16))
    return LP_ERR_ARG;
  l->boundary = prec;
  return LP_OK;
}

lp_tensor_precision lp_nn_chunk_boundary(const lp_nn_layer *l) {
  return l && l->ops == &chunk_ops ? l->boundary : LP_TENSOR_F32;
}

/* ---- residual: y = x + inner(x) ---- */

/* out = a + b into b's storage when b is dense and ours alone, else new. */
static lp_status add_into(const lp_tensor *a, lp_tensor *b, lp_tensor **out) {
  *out = NULL;
  if (lp_tensor_is_contiguous(b) && lp_tensor_storage_refs(b) == 1) {
    LP_CHECK(lp_tensor_add(b, a, b));
    *out = b;
    return LP_OK;
  }
  lp_tensor *s;
  LP_CHECK(lp_tensor_empty_like(a, &s));
  lp_status st = lp_tensor_add(s, a, b);
  if (st != LP_OK) {
    lp_tensor_free(s);
    return st;
  }
  lp_tensor_free(b);
  *out = s;
  return LP_OK;
}

/* y = x + inner(x); dx = dy + inner's dx. The inner layer's pass runs in
 * sub-context 0 and may stop at exchanges. */
static lp_status residual_advance(lp_nn_layer *l, lp_nn_ctx *ctx, int *done,
                                  lp_tensor **out) {
  int fwd = ctx->pass == NN_PASS_FORWARD;
  lp_nn_ctx *c;
  LP_CHECK(nn_child_ctx(ctx, 0, &c));
  if (c->pass == NN_PASS_NONE)
    LP_CHECK(fwd ? lp_nn_forward_begin(l->child[0], c, ctx->in)
                 : nn_input_grad_begin(l->child[0], c, ctx->in, ctx->want_dx));
  int d;
  lp_tensor *f = NULL;
  LP_CHECK(lp_nn_advance(l->child[0], c, &d, &f));
  if (!d) return LP_OK;
  *done = 1;
  if (!fwd && !ctx->want_dx) {
    lp_tensor_free(f);
    return LP_OK;
  }
  if (!f)
    return nn_fail(ctx, l, LP_ERR_ARG, "inner layer has no input gradient");
  if (fwd && !lp_tensor_same_shape(f, ctx->in)) {
    char a[64], b[64];
    nn_shape_str(f, a, sizeof a);
    lp_tensor_free(f);
    return nn_fail(ctx, l, LP_ERR_ARG, "inner output %s differs from input %s",
                   a, nn_shape_str(ctx->in, b, sizeof b));
  }
  lp_status st = add_into(ctx->in, f, out);
  if (st != LP_OK) lp_tensor_free(f);
  return st;
}

static lp_nn_phase residual_phase(const lp_nn_layer *l, const lp_nn_ctx *ctx) {
  (void)l;
  if (!ctx->nchild || ctx->child[0]->pass == NN_PASS_NONE) return LP_NN_PHASE_DENSE;
  return lp_nn_phase_of(ctx->child[0]);
}

static lp_status residual_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  return lp_nn_weight_grad(l->child[0], ctx->child[0], NULL);
}

static const nn_ops residual_ops = {"residual", nn_no_call, nn_no_call,
                                    residual_weight_grad};
static lp_status residual_weight_grad_part(lp_nn_layer *l, lp_nn_ctx *ctx, int *did) {
  if (!ctx->nchild || !ctx->child[0]) return LP_OK;
  return lp_nn_weight_grad_part(l->child[0], ctx->child[0], did);
}

static const nn_phased residual_phased = {residual_advance, residual_phase,
                                          residual_weight_grad_part};

lp_status lp_nn_residual_new(const char *name, lp_nn_layer *inner,
                             lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  return composite_new(&residual_ops, &residual_phased, name, &inner, 1,
                       layer);
}

lp_status nn_check_dy_shape(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *x,
                            const lp_tensor *dy) {
  if (lp_tensor_same_shape(x, dy)) return LP_OK;
  char a[64], b[64];
  return nn_fail(ctx, l, LP_ERR_ARG, "dy has shape %s, forward output had %s",
                 nn_shape_str(dy, a, sizeof a), nn_shape_str(x, b, sizeof b));
}
