/* optim.c — SGD with momentum and AdamW over a list of (param, grad).
 * Per-element math in double, stored as float; fixed order. */
#include "nn_internal.h"

#include <math.h>
#include <string.h>

enum { OPT_SGD, OPT_ADAMW };

struct lp_nn_optim {
  int kind;
  lp_nn_sgd_opts sgd;
  lp_nn_adamw_opts adam;
  lp_nn_param *params; /* copies of the entries (tensors borrowed) */
  size_t n;
  lp_tensor **m; /* momentum buffer / first moment, one per param */
  lp_tensor **v; /* second moment (AdamW only) */
  int64_t t;     /* steps taken (lp_nn_optim_steps) */
  int64_t *ts;   /* per param: the steps that updated it (AdamW's bias
                  * corrections), t unless a masked step skipped it */
};

void lp_nn_optim_free(lp_nn_optim *o) {
  if (!o) return;
  for (size_t i = 0; i < o->n; i++) {
    if (o->m) lp_tensor_free(o->m[i]);
    if (o->v) lp_tensor_free(o->v[i]);
  }
  lp_free(o->m);
  lp_free(o->v);
  lp_free(o->ts);
  lp_free(o->params);
  lp_free(o);
}

static lp_status optim_new(int kind, const lp_nn_param *params, size_t n,
                           lp_nn_optim **out) {
  *out = NULL;
  if (n && !params) return LP_ERR_ARG;
  for (size_t i = 0; i < n; i++) {
    const lp_nn_param *p = &params[i];
    if (!p->value || !p->grad || !lp_tensor_same_shape(p->value, p->grad) ||
        !lp_tensor_is_contiguous(p->value) || !lp_tensor_is_contiguous(p->grad))
      return LP_ERR_ARG;
    if (lp_tensor_backend_of(p->value) != lp_tensor_backend_of(p->grad))
      return LP_ERR_ARG;
  }
  lp_nn_optim *o = lp_calloc(1, sizeof *o);
  if (!o) return LP_ERR_NOMEM;
  o->kind = kind;
  size_t cnt = n ? n : 1;
  o->params = lp_malloc(cnt * sizeof *o->params);
  o->m = lp_calloc(cnt, sizeof *o->m);
  o->ts = lp_calloc(cnt, sizeof *o->ts);
  if (kind == OPT_ADAMW) o->v = lp_calloc(cnt, sizeof *o->v);
  if (!o->params || !o->m || !o->ts || (kind == OPT_ADAMW && !o->v)) {
    lp_nn_optim_free(o);
    return LP_ERR_NOMEM;
  }
  if (n) memcpy(o->params, params, n * sizeof *params);
  o->n = n;
  for (size_t i = 0; i < n; i++) {
    lp_status st = lp_tensor_zeros_like(params[i].value, &o->m[i]);
    if (st == LP_OK && o->v)
      st = lp_tensor_zeros_like(params[i].value, &o->v[i]);
    if (st != LP_OK) {
      lp_nn_optim_free(o);
      return st;
    }
  }
  *out = o;
  return LP_OK;
}

lp_status lp_nn_optim_sgd_new(const lp_nn_param *params, size_t n,
                              const lp_nn_sgd_opts *opts, lp_nn_optim **out) {
  if (!out) return LP_ERR_ARG;
  *out = NULL;
  if (!opts) return LP_ERR_ARG;
  LP_CHECK(optim_new(OPT_SGD, params, n, out));
  (*out)->sgd = *opts;
  return LP_OK;
}

lp_status lp_nn_optim_adamw_new(const lp_nn_param *params, size_t n,
                                const lp_nn_adamw_opts *opts,
                                lp_nn_optim **out) {
  if (!out) return LP_ERR_ARG;
  *out = NULL;
  if (!opts || !(opts->beta1 >= 0.0f && opts->beta1 < 1.0f) ||
      !(opts->beta2 >= 0.0f && opts->beta2 < 1.0f))
    return LP_ERR_ARG;
  LP_CHECK(optim_new(OPT_ADAMW, params, n, out));
  (*out)->adam = *opts;
  return LP_OK;
}

lp_status lp_nn_optim_step(lp_nn_optim *o) { return lp_nn_optim_step_masked(o, NULL); }

lp_status lp_nn_optim_step_masked(lp_nn_optim *o, const unsigned char *skip) {
  if (!o) return LP_ERR_ARG;
  o->t++;
  for (size_t i = 0; i < o->n; i++) {
    if (skip && skip[i]) continue; /* as torch does for a grad of None */
    lp_tensor *pt = o->params[i].value;
    const lp_tensor_backend *be = lp_tensor_backend_of(pt);
    /* parameters moved (lp_nn_layer_to) after the optimizer was made */
    if (lp_tensor_backend_of(o->m[i]) != be ||
        lp_tensor_backend_of(o->params[i].grad) != be) {
      lp_log(LP_LOG_WARN, "optimizer step: %s is on %s but its optimizer state on %s "
             "(build the optimizer after moving the model)", o->params[i].name,
             be->name, lp_tensor_backend_of(o->m[i])->name);
      if (i == 0) o->t--; /* nothing was updated */
      return LP_ERR_ARG;
    }
    o->ts[i]++;
    float *p = pt->data, *m = o->m[i]->data;
    const float *g = o->params[i].grad->data;
    int64_t n = lp_tensor_numel(pt);
    if (o->kind == OPT_SGD) {
      LP_CHECK(be->sgd_step(be, n, o->sgd.lr, o->sgd.momentum,
                            o->sgd.weight_decay, p, g, m));
    } else {
      const lp_nn_adamw_opts *a = &o->adam;
      double b1 = a->beta1, b2 = a->beta2;
      double bc1 = 1.0 - pow(b1, (double)o->ts[i]),
             bc2 = 1.0 - pow(b2, (double)o->ts[i]);
      double decay = 1.0 - (double)a->lr * (double)a->weight_decay;
      LP_CHECK(be->adamw_step(be, n, a->lr, b1, b2, a->eps, decay, bc1, bc2, p,
                              g, m, o->v[i]->data));
    }
    lp_tensor_touch(pt); /* written through its data: bf16 copies are stale */
  }
  return LP_OK;
}

lp_status lp_nn_optim_zero_grad(lp_nn_optim *o) {
  if (!o) return LP_ERR_ARG;
  for (size_t i = 0; i < o->n; i++)
    LP_CHECK(lp_tensor_fill(o->params[i].grad, 0.0f));
  return LP_OK;
}

void lp_nn_optim_set_lr(lp_nn_optim *o, float lr) {
  if (!o) return;
  if (o->kind == OPT_SGD)
    o->sgd.lr = lr;
  else
    o->adam.lr = lr;
}

int64_t lp_nn_optim_steps(const lp_nn_optim *o) { return o ? o->t : 0; }

size_t lp_nn_optim_count(const lp_nn_optim *o) { return o ? o->n : 0; }

lp_status lp_nn_optim_param_steps(const lp_nn_optim *o, int64_t *steps, size_t n) {
  if (!o || n != o->n || (n && !steps)) return LP_ERR_ARG;
  if (n) memcpy(steps, o->ts, n * sizeof *steps);
  return LP_OK;
}

lp_status lp_nn_optim_set_param_steps(lp_nn_optim *o, const int64_t *steps, size_t n) {
  if (!o || n != o->n || (n && !steps)) return LP_ERR_ARG;
  for (size_t i = 0; i < n; i++)
    if (steps[i] < 0 || steps[i] > o->t) return LP_ERR_ARG;
  if (n) memcpy(o->ts, steps, n * sizeof *steps);
  return LP_OK;
}

/* ---- state export / import (checkpoints) ---- */

const char *lp_nn_optim_kind(const lp_nn_optim *o) {
  return o && o->kind == OPT_ADAMW ? "adamw" : "sgd";
}

size_t lp_nn_optim_state_numel(const lp_nn_optim *o) {
  if (!o) return 0;
  size_t n = 0;
  for (size_t i = 0; i < o->n; i++) n += (size_t)lp_tensor_numel(o->params[i].value);
  return o->kind == OPT_ADAMW ? 2 * n : n;
}

lp_status lp_nn_optim_state_export(const lp_nn_optim *o, float *buf, size_t n,
                                   int64_t *steps) {
  if (!o || n != lp_nn_optim_state_numel(o) || (n && !buf)) return LP_ERR_ARG;
  size_t off = 0;
  for (int pass = 0; pass < (o->kind == OPT_ADAMW ? 2 : 1); pass++) {
    lp_tensor *const *st = pass ? o->v : o->m;
    for (size_t i = 0; i < o->n; i++) {
      size_t c = (size_t)lp_tensor_numel(st[i]);
      const lp_tensor_backend *be = lp_tensor_backend_of(st[i]);
      if (c) LP_CHECK(be->to_host(be, buf + off, st[i]->data, c * sizeof(float)));
      off += c;
    }
  }
  if (steps) *steps = o->t;
  return LP_OK;
}

lp_status lp_nn_optim_state_import(lp_nn_optim *o, const float *buf, size_t n,
                                   int64_t steps) {
  if (!o || steps < 0 || n != lp_nn_optim_state_numel(o) || (n && !buf)) return LP_ERR_ARG;
  size_t off = 0;
  for (int pass = 0; pass < (o->kind == OPT_ADAMW ? 2 : 1); pass++) {
    lp_tensor **st = pass ? o->v : o->m;
    for (size_t i = 0; i < o->n; i++) {
      size_t c = (size_t)lp_tensor_numel(st[i]);
      const lp_tensor_backend *be = lp_tensor_backend_of(st[i]);
      if (c) LP_CHECK(be->from_host(be, st[i]->data, buf + off, c * sizeof(float)));
      off += c;
    }
  }
  o->t = steps;
  for (size_t i = 0; i < o->n; i++) o->ts[i] = steps;
  return LP_OK;
}
