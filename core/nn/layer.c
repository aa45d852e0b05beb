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

lp_status nn_keep_view(lp_nn_ctx *ctx, int i, const lp_tensor *t) {
  if (!ctx) return LP_OK;
  lp_tensor *v;
  LP_CHECK(lp_tensor_view(t, &v));
  nn_keep(ctx, i, v);
  return LP_OK;
}

void nn_drop(lp_nn_ctx *ctx, int i) {
  if (!ctx) return;
  lp_tensor_free(ctx->saved[i]);
  ctx->saved[i] = NULL;
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

void lp_nn_ctx_clear(lp_nn_ctx *ctx) {
  if (!ctx) return;
  for (int i = 0; i < NN_SLOTS; i++)
    nn_drop(ctx, i);
  for (size_t i = 0; i < ctx->nchild; i++)
    lp_nn_ctx_clear(ctx->child[i]);
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
      b += (size_t)lp_tensor_numel(ctx->saved[i]) * sizeof(float);
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

lp_status lp_nn_forward(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *x,
                        lp_tensor **y) {
  if (y) *y = NULL;
  if (!l || !y) return LP_ERR_ARG;
  err_begin(ctx);
  if (!x) return nn_fail(ctx, l, LP_ERR_ARG, "forward: input is NULL");
  if (ctx && ctx->stage != LP_NN_CTX_EMPTY)
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "forward: the context still holds a micro-batch of layer "
                   "%s (run weight_grad or clear it first)",
                   ctx->layer ? ctx->layer->name : "?");
  lp_status st = l->ops->forward(l, ctx, x, y);
  if (st != LP_OK) {
    lp_tensor_free(*y);
    *y = NULL;
    lp_nn_ctx_clear(ctx);
    return err_end(ctx, l, st, "forward");
  }
  if (ctx) {
    ctx->layer = l;
    ctx->stage = LP_NN_CTX_FORWARD;
  }
  return LP_OK;
}

/* Checks that dy matches what the layer's forward produced: the caller
 * passes the shape through y's shape, which layers verify themselves. */
lp_status lp_nn_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx, const lp_tensor *dy,
                           lp_tensor **dx) {
  if (dx) *dx = NULL;
  if (!l || !ctx) return LP_ERR_ARG;
  err_begin(ctx);
  if (ctx->stage != LP_NN_CTX_FORWARD || ctx->layer != l)
    return nn_fail(
        ctx, l, LP_ERR_ARG,
        "input_grad: the context holds no forward of this layer%s",
        ctx->stage == LP_NN_CTX_INPUT_GRAD ? " (input_grad already ran)" : "");
  if (!dy) return nn_fail(ctx, l, LP_ERR_ARG, "input_grad: dy is NULL");
  lp_status st = l->ops->input_grad(l, ctx, dy, dx);
  if (st != LP_OK) {
    if (dx) {
      lp_tensor_free(*dx);
      *dx = NULL;
    }
    lp_nn_ctx_clear(ctx);
    return err_end(ctx, l, st, "input_grad");
  }
  ctx->stage = LP_NN_CTX_INPUT_GRAD;
  return LP_OK;
}

lp_status lp_nn_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                            const lp_tensor *dy) {
  if (!l || !ctx) return LP_ERR_ARG;
  err_begin(ctx);
  if (ctx->layer != l || ctx->stage == LP_NN_CTX_EMPTY)
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "weight_grad: the context holds no forward of this layer");
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
  if (l->owns_params) {
    for (size_t i = 0; i < l->nparams; i++) {
      lp_free((char *)l->params[i].name);
      lp_tensor_free(l->params[i].value);
      lp_tensor_free(l->params[i].grad);
    }
  }
  lp_free(l->params);
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

lp_status nn_add_param(lp_nn_layer *l, const char *suffix, int ndim,
                       const int64_t *shape, lp_nn_init_kind init,
                       float init_std, uint64_t seed) {
  lp_nn_param *ps = lp_realloc(l->params, (l->nparams + 1) * sizeof *ps);
  if (!ps) return LP_ERR_NOMEM;
  l->params = ps;
  l->owns_params = 1;
  lp_nn_param *p = &ps[l->nparams];
  memset(p, 0, sizeof *p);
  size_t n = strlen(l->name) + strlen(suffix) + 2;
  char *name = lp_malloc(n);
  if (!name) return LP_ERR_NOMEM;
  snprintf(name, n, "%s%s%s", l->name, l->name[0] ? "." : "", suffix);
  p->name = name;
  p->init = init;
  p->init_std = init_std;
  l->nparams++; /* from here on, release frees whatever is set */
  LP_CHECK(lp_tensor_empty(NULL, ndim, shape, &p->value));
  LP_CHECK(lp_tensor_zeros(NULL, ndim, shape, &p->grad));
  return init_param(p, seed);
}

const lp_nn_param *lp_nn_params(const lp_nn_layer *l, size_t *n) {
  if (n) *n = l ? l->nparams : 0;
  return l && l->nparams ? l->params : NULL;
}

int64_t lp_nn_param_numel(const lp_nn_layer *l) {
  int64_t n = 0;
  for (size_t i = 0; l && i < l->nparams; i++)
    n += lp_tensor_numel(l->params[i].value);
  return n;
}

lp_status lp_nn_init(lp_nn_layer *l, uint64_t seed) {
  if (!l) return LP_ERR_ARG;
  for (size_t i = 0; i < l->nparams; i++)
    LP_CHECK(init_param(&l->params[i], seed));
  return LP_OK;
}

lp_status lp_nn_zero_grad(lp_nn_layer *l) {
  if (!l) return LP_ERR_ARG;
  for (size_t i = 0; i < l->nparams; i++)
    LP_CHECK(lp_tensor_fill(l->params[i].grad, 0.0f));
  return LP_OK;
}

lp_status lp_nn_layer_to(lp_nn_layer *l, const lp_tensor_backend *be) {
  if (!l) return LP_ERR_ARG;
  if (!be) be = lp_tensor_backend_cpu();
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

lp_status nn_composite_collect_params(lp_nn_layer *l) {
  size_t total = 0;
  for (size_t i = 0; i < l->nchild; i++)
    total += l->child[i]->nparams;
  l->owns_params = 0;
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
static lp_status composite_new(const nn_ops *ops, const char *name,
                               lp_nn_layer *const *children, size_t n,
                               lp_nn_layer **out) {
  *out = NULL;
  if (!children || n == 0) return LP_ERR_ARG;
  for (size_t i = 0; i < n; i++)
    if (!children[i]) return LP_ERR_ARG;
  lp_nn_layer *l;
  LP_CHECK(nn_layer_alloc(ops, name, &l));
  l->child = lp_malloc(n * sizeof *l->child);
  if (!l->child) {
    lp_nn_layer_release(l);
    return LP_ERR_NOMEM;
  }
  for (size_t i = 0; i < n; i++)
    l->child[l->nchild++] = lp_nn_layer_retain(children[i]);
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

static lp_status chunk_forward(lp_nn_layer *l, lp_nn_ctx *ctx,
                               const lp_tensor *x, lp_tensor **y) {
  const lp_tensor *cur = x;
  lp_tensor *owned = NULL;
  for (size_t i = 0; i < l->nchild; i++) {
    lp_nn_ctx *c;
    lp_tensor *next = NULL;
    lp_status st = nn_child_ctx(ctx, i, &c);
    if (st == LP_OK) st = lp_nn_forward(l->child[i], c, cur, &next);
    lp_tensor_free(owned);
    if (st != LP_OK) return st;
    cur = owned = next;
  }
  *y = owned;
  return LP_OK;
}

static lp_status chunk_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                                  const lp_tensor *dy, lp_tensor **dx) {
  const lp_tensor *cur = dy;
  lp_tensor *owned = NULL;
  for (size_t k = l->nchild; k-- > 0;) {
    lp_nn_layer *c = l->child[k];
    lp_tensor *next = NULL;
    int want = k > 0 || dx;
    lp_status st = lp_nn_input_grad(c, ctx->child[k], cur, want ? &next : NULL);
    lp_tensor_free(owned);
    owned = NULL;
    if (st != LP_OK) return st;
    if (k > 0 && !next)
      return nn_fail(ctx, l, LP_ERR_ARG,
                     "layer %s has no input gradient but is not first",
                     c->name);
    cur = owned = next;
  }
  if (dx)
    *dx = owned;
  else
    lp_tensor_free(owned);
  return LP_OK;
}

static lp_status chunk_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  for (size_t k = l->nchild; k-- > 0;)
    LP_CHECK(lp_nn_weight_grad(l->child[k], ctx->child[k], NULL));
  return LP_OK;
}

static const nn_ops chunk_ops = {"chunk", chunk_forward, chunk_input_grad,
                                 chunk_weight_grad};

lp_status lp_nn_chunk_new(const char *name, lp_nn_layer *const *layers,
                          size_t n, lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  return composite_new(&chunk_ops, name, layers, n, layer);
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

static lp_status residual_forward(lp_nn_layer *l, lp_nn_ctx *ctx,
                                  const lp_tensor *x, lp_tensor **y) {
  lp_nn_ctx *c;
  lp_tensor *f = NULL;
  LP_CHECK(nn_child_ctx(ctx, 0, &c));
  LP_CHECK(lp_nn_forward(l->child[0], c, x, &f));
  if (!lp_tensor_same_shape(f, x)) {
    char a[64], b[64];
    nn_shape_str(f, a, sizeof a);
    lp_tensor_free(f);
    return nn_fail(ctx, l, LP_ERR_ARG, "inner output %s differs from input %s",
                   a, nn_shape_str(x, b, sizeof b));
  }
  lp_status st = add_into(x, f, y);
  if (st != LP_OK) lp_tensor_free(f);
  return st;
}

static lp_status residual_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                                     const lp_tensor *dy, lp_tensor **dx) {
  lp_tensor *d = NULL;
  LP_CHECK(lp_nn_input_grad(l->child[0], ctx->child[0], dy, dx ? &d : NULL));
  if (!dx) return LP_OK;
  if (!d)
    return nn_fail(ctx, l, LP_ERR_ARG, "inner layer has no input gradient");
  lp_status st = add_into(dy, d, dx);
  if (st != LP_OK) lp_tensor_free(d);
  return st;
}

static lp_status residual_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  return lp_nn_weight_grad(l->child[0], ctx->child[0], NULL);
}

static const nn_ops residual_ops = {"residual", residual_forward,
                                    residual_input_grad, residual_weight_grad};

lp_status lp_nn_residual_new(const char *name, lp_nn_layer *inner,
                             lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  return composite_new(&residual_ops, name, &inner, 1, layer);
}
