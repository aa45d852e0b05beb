/* ops.c — tensor ops: shape checks, then the backend fast path for dense
 * operands; strided operands go through dense temporaries (gathered and
 * scattered by lp_tensor_copy's host loop). */
#include "tensor_internal.h"

#include <math.h>
#include <string.h>

static const lp_tensor_backend *BE(const lp_tensor *t) {
  return t->storage->be;
}

static int one_backend(const lp_tensor *a, const lp_tensor *b) {
  return !a || !b || BE(a) == BE(b);
}

/* ---- fill / copy (the only ops with a strided host loop) ---- */

lp_status lp_tensor_fill(lp_tensor *t, float v) {
  if (!t || tensor_bf16(t)) return LP_ERR_ARG;
  tensor_touch(t);
  int64_t n = lp_tensor_numel(t);
  if (lp_tensor_is_contiguous(t)) return BE(t)->fill(BE(t), n, v, t->data);
  if (!tensor_host(t)) return LP_ERR_UNSUPPORTED;
  int64_t sh[4], st[4];
  tensor_pad4(t, sh, st);
  for (int64_t i = 0; i < n; i++)
    t->data[tensor_offset4(sh, st, i)] = v;
  return LP_OK;
}

lp_status lp_tensor_copy(lp_tensor *dst, const lp_tensor *src) {
  if (!dst || !src || lp_tensor_numel(dst) != lp_tensor_numel(src) ||
      !lp_tensor_same_shape(dst, src) || tensor_bf16(dst))
    return LP_ERR_ARG;
  tensor_touch(dst);
  int64_t n = lp_tensor_numel(src);
  int dd = lp_tensor_is_contiguous(dst), sd = lp_tensor_is_contiguous(src);
  if (tensor_bf16(src)) { /* packed bf16 values, widened (exact) */
    if (!dd || !sd) return LP_ERR_ARG;
    if (!tensor_host(dst)) return LP_ERR_UNSUPPORTED;
    return lp_tensor_read(src, dst->data);
  }
  size_t bytes = (size_t)n * sizeof(float);
  if (dd && sd) {
    if (BE(dst) == BE(src))
      return BE(dst)->copy(BE(dst), n, src->data, dst->data);
    if (tensor_host(src))
      return BE(dst)->from_host(BE(dst), dst->data, src->data, bytes);
    if (tensor_host(dst))
      return BE(src)->to_host(BE(src), dst->data, src->data, bytes);
    return LP_ERR_UNSUPPORTED;
  }
  if (!tensor_host(dst) || !tensor_host(src)) return LP_ERR_UNSUPPORTED;
  int64_t dsh[4], dst4[4], ssh[4], sst[4];
  tensor_pad4(dst, dsh, dst4);
  tensor_pad4(src, ssh, sst);
  for (int64_t i = 0; i < n; i++)
    dst->data[tensor_offset4(dsh, dst4, i)] =
        src->data[tensor_offset4(ssh, sst, i)];
  return LP_OK;
}

/* ---- dense temporaries for strided operands ---- */

/* *dense = t itself when t is dense, else a dense clone (owned: *tmp). */
static lp_status densify(const lp_tensor *t, const lp_tensor **dense,
                         lp_tensor **tmp) {
  *tmp = NULL;
  if (!t || lp_tensor_is_contiguous(t)) {
    *dense = t;
    return LP_OK;
  }
  LP_CHECK(lp_tensor_clone(t, tmp));
  *dense = *tmp;
  return LP_OK;
}

/* *dense = out when out is dense, else a dense scratch (owned: *tmp) whose
 * contents must be scattered back with finish_out. */
static lp_status dense_out(lp_tensor *out, lp_tensor **dense, lp_tensor **tmp,
                           int keep_contents) {
  *tmp = NULL;
  if (lp_tensor_is_contiguous(out)) {
    *dense = out;
    return LP_OK;
  }
  LP_CHECK(keep_contents ? lp_tensor_clone(out, tmp)
                         : lp_tensor_empty_like(out, tmp));
  *dense = *tmp;
  return LP_OK;
}

static lp_status finish_out(lp_tensor *out, lp_tensor *tmp, lp_status st) {
  if (tmp && st == LP_OK) st = lp_tensor_copy(out, tmp);
  lp_tensor_free(tmp);
  return st;
}

enum ew_kind { EW_ADD, EW_MUL, EW_AXPY, EW_SCALE, EW_ACT, EW_ACT_BWD };

/* The one elementwise driver: checks shapes and backends, densifies, calls
 * the backend. `a`/`b` are the inputs the kind uses (NULL otherwise). */
static lp_status elementwise(enum ew_kind kind, lp_tensor *out,
                             const lp_tensor *a, const lp_tensor *b,
                             float alpha, lp_tensor_act_kind act) {
  if (!out) return LP_ERR_ARG;
  if ((a && !lp_tensor_same_shape(out, a)) ||
      (b && !lp_tensor_same_shape(out, b)))
    return LP_ERR_ARG;
  if (!one_backend(out, a) || !one_backend(out, b)) return LP_ERR_ARG;
  if (tensor_bf16(out) || tensor_bf16(a) || tensor_bf16(b)) return LP_ERR_ARG;
  tensor_touch(out);
  const lp_tensor_backend *be = BE(out);
  int64_t n = lp_tensor_numel(out);
  const lp_tensor *da = a, *db = b;
  lp_tensor *ta = NULL, *tb = NULL, *to = NULL, *dout = out;
  lp_status st = LP_OK;
  LP_CHECK_GOTO(densify(a, &da, &ta), st, done);
  LP_CHECK_GOTO(densify(b, &db, &tb), st, done);
  int keep = kind == EW_AXPY || kind == EW_SCALE;
  LP_CHECK_GOTO(dense_out(out, &dout, &to, keep), st, done);
  switch (kind) {
  case EW_ADD:
    st = be->add(be, n, da->data, db->data, dout->data);
    break;
  case EW_MUL:
    st = be->mul(be, n, da->data, db->data, dout->data);
    break;
  case EW_AXPY:
    st = be->axpy(be, n, alpha, da->data, dout->data);
    break;
  case EW_SCALE:
    st = be->scale(be, n, alpha, dout->data);
    break;
  case EW_ACT:
    st = be->act(be, act, n, da->data, dout->data);
    break;
  case EW_ACT_BWD:
    st = be->act_backward(be, act, n, da->data, db->data, dout->data);
    break;
  }
  st = finish_out(out, to, st);
  to = NULL;
done:
  lp_tensor_free(ta);
  lp_tensor_free(tb);
  lp_tensor_free(to);
  return st;
}

lp_status lp_tensor_add(lp_tensor *out, const lp_tensor *a,
                        const lp_tensor *b) {
  if (!a || !b) return LP_ERR_ARG;
  return elementwise(EW_ADD, out, a, b, 0.0f, LP_TENSOR_ACT_GELU);
}

lp_status lp_tensor_mul(lp_tensor *out, const lp_tensor *a,
                        const lp_tensor *b) {
  if (!a || !b) return LP_ERR_ARG;
  return elementwise(EW_MUL, out, a, b, 0.0f, LP_TENSOR_ACT_GELU);
}

lp_status lp_tensor_scale(lp_tensor *t, float alpha) {
  return elementwise(EW_SCALE, t, NULL, NULL, alpha, LP_TENSOR_ACT_GELU);
}

lp_status lp_tensor_axpy(lp_tensor *y, float alpha, const lp_tensor *x) {
  if (!x) return LP_ERR_ARG;
  return elementwise(EW_AXPY, y, x, NULL, alpha, LP_TENSOR_ACT_GELU);
}

lp_status lp_tensor_act(lp_tensor *y, lp_tensor_act_kind kind,
                        const lp_tensor *x) {
  if (!x || (kind != LP_TENSOR_ACT_GELU && kind != LP_TENSOR_ACT_SILU))
    return LP_ERR_ARG;
  return elementwise(EW_ACT, y, x, NULL, 0.0f, kind);
}

lp_status lp_tensor_act_backward(lp_tensor *dx, lp_tensor_act_kind kind,
                                 const lp_tensor *x, const lp_tensor *dy) {
  if (!x || !dy || (kind != LP_TENSOR_ACT_GELU && kind != LP_TENSOR_ACT_SILU))
    return LP_ERR_ARG;
  return elementwise(EW_ACT_BWD, dx, x, dy, 0.0f, kind);
}

lp_status lp_tensor_sum_rows(lp_tensor *out, const lp_tensor *x, float beta) {
  if (!out || !x || !one_backend(out, x)) return LP_ERR_ARG;
  if (!lp_tensor_is_contiguous(x) || !lp_tensor_is_contiguous(out))
    return LP_ERR_ARG;
  int64_t rows, cols;
  lp_tensor_rows_cols(x, &rows, &cols);
  if (lp_tensor_numel(out) != cols || tensor_bf16(x) || tensor_bf16(out))
    return LP_ERR_ARG;
  tensor_touch(out);
  return BE(x)->sum_rows(BE(x), rows, cols, x->data, beta, out->data);
}

lp_status lp_tensor_add_rowvec(lp_tensor *t, const lp_tensor *v) {
  if (!t || !v || !one_backend(t, v)) return LP_ERR_ARG;
  if (!lp_tensor_is_contiguous(t) || !lp_tensor_is_contiguous(v))
    return LP_ERR_ARG;
  int64_t rows, cols;
  lp_tensor_rows_cols(t, &rows, &cols);
  if (lp_tensor_numel(v) != cols || tensor_bf16(t) || tensor_bf16(v))
    return LP_ERR_ARG;
  tensor_touch(t);
  return BE(t)->add_rowvec(BE(t), rows, cols, v->data, t->data);
}

lp_status lp_tensor_softmax_rows(lp_tensor *y, const lp_tensor *x) {
  if (!y || !x || !one_backend(y, x) || !lp_tensor_same_shape(y, x))
    return LP_ERR_ARG;
  if (!lp_tensor_is_contiguous(x) || !lp_tensor_is_contiguous(y))
    return LP_ERR_ARG;
  int64_t rows, cols;
  if (tensor_bf16(x) || tensor_bf16(y)) return LP_ERR_ARG;
  tensor_touch(y);
  lp_tensor_rows_cols(x, &rows, &cols);
  return BE(x)->softmax_rows(BE(x), rows, cols, x->data, y->data);
}

/* ---- row gather / index-add ---- */

/* gather (scatter = 0): out[i] = scale[i] * x[idx[i]] over out's rows;
 * scatter: out[idx[i]] += scale[i] * x[i] over x's rows. */
static lp_status rows_op(int scatter, lp_tensor *out, const lp_tensor *x,
                         const int64_t *idx, const float *scale) {
  int64_t orows, oc, xrows, xc;
  if (!out || !x || !one_backend(out, x)) return LP_ERR_ARG;
  if (!lp_tensor_is_contiguous(out) || !lp_tensor_is_contiguous(x))
    return LP_ERR_ARG;
  lp_tensor_rows_cols(out, &orows, &oc);
  lp_tensor_rows_cols(x, &xrows, &xc);
  int64_t n = scatter ? xrows : orows, bound = scatter ? orows : xrows;
  if (oc != xc || (n && !idx)) return LP_ERR_ARG;
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= bound) return LP_ERR_ARG;
  if (tensor_bf16(out) || tensor_bf16(x)) return LP_ERR_ARG;
  tensor_touch(out);
  const lp_tensor_backend *be = BE(out);
  return scatter ? be->scatter_add_rows(be, n, oc, x->data, idx, scale,
                                        out->data)
                 : be->gather_rows(be, n, oc, x->data, idx, scale, out->data);
}

lp_status lp_tensor_gather_rows(lp_tensor *out, const lp_tensor *x,
                                const int64_t *idx, const float *scale) {
  return rows_op(0, out, x, idx, scale);
}

lp_status lp_tensor_index_add_rows(lp_tensor *out, const lp_tensor *x,
                                   const int64_t *idx, const float *scale) {
  return rows_op(1, out, x, idx, scale);
}

lp_status lp_tensor_dot_rows(lp_tensor *out, const lp_tensor *a,
                             const int64_t *idx, const lp_tensor *b) {
  int64_t ar, ac, br, bc;
  if (!out || !a || !b || !one_backend(out, a) || !one_backend(out, b))
    return LP_ERR_ARG;
  if (!lp_tensor_is_contiguous(out) || !lp_tensor_is_contiguous(a) ||
      !lp_tensor_is_contiguous(b))
    return LP_ERR_ARG;
  lp_tensor_rows_cols(a, &ar, &ac);
  lp_tensor_rows_cols(b, &br, &bc);
  if (ac != bc || lp_tensor_numel(out) != br || (!idx && ar != br))
    return LP_ERR_ARG;
  for (int64_t i = 0; idx && i < br; i++)
    if (idx[i] < 0 || idx[i] >= ar) return LP_ERR_ARG;
  if (tensor_bf16(out) || tensor_bf16(a) || tensor_bf16(b)) return LP_ERR_ARG;
  tensor_touch(out);
  return BE(out)->dot_rows(BE(out), br, bc, a->data, idx, b->data, out->data);
}

/* ---- GEMM ---- */

typedef struct {
  float *p;
  int64_t rows, cols; /* logical */
  int64_t ld;         /* row stride of the stored matrix */
  int stored_t;       /* 1: stored as the transpose (cols x rows) */
} mat;

static int as_matrix(const lp_tensor *t, mat *m) {
  m->p = t->data;
  m->stored_t = 0;
  if (t->ndim != 2) {
    if (!lp_tensor_is_contiguous(t)) return 0;
    lp_tensor_rows_cols(t, &m->rows, &m->cols);
    m->ld = m->cols > 1 ? m->cols : 1;
    return 1;
  }
  int64_t r = t->shape[0], c = t->shape[1], s0 = t->stride[0],
          s1 = t->stride[1];
  m->rows = r, m->cols = c;
  if ((c <= 1 || s1 == 1) && (r <= 1 || s0 >= c)) {
    m->ld = r <= 1 ? (c > 1 ? c : 1) : s0;
    if (m->ld < 1) m->ld = 1;
    return 1;
  }
  if ((r <= 1 || s0 == 1) && (c <= 1 || s1 >= r)) {
    m->stored_t = 1;
    m->ld = c <= 1 ? (r > 1 ? r : 1) : s1;
    if (m->ld < 1) m->ld = 1;
    return 1;
  }
  return 0;
}

lp_status lp_tensor_gemm(lp_tensor *c, float alpha, const lp_tensor *a,
                         int trans_a, const lp_tensor *b, int trans_b,
                         float beta) {
  return lp_tensor_gemm_prec(c, alpha, a, trans_a, b, trans_b, beta,
                             LP_TENSOR_F32);
}

lp_status lp_tensor_gemm_prec(lp_tensor *c, float alpha, const lp_tensor *a,
                              int trans_a, const lp_tensor *b, int trans_b,
                              float beta, lp_tensor_precision prec) {
  if (!c || !a || !b || !one_backend(c, a) || !one_backend(c, b))
    return LP_ERR_ARG;
  mat ma, mb, mc;
  if (!as_matrix(a, &ma) || !as_matrix(b, &mb) || !as_matrix(c, &mc) ||
      mc.stored_t)
    return LP_ERR_ARG;
  trans_a = !!trans_a, trans_b = !!trans_b;
  int64_t m = trans_a ? ma.cols : ma.rows, k = trans_a ? ma.rows : ma.cols;
  int64_t kb = trans_b ? mb.cols : mb.rows, n = trans_b ? mb.rows : mb.cols;
  if (k != kb || mc.rows != m || mc.cols != n || tensor_bf16(c)) return LP_ERR_ARG;
  const lp_tensor_backend *be = BE(c);
  tensor_touch(c);
  if (prec == LP_TENSOR_BF16) {
    /* operands in bf16 already: packed ones (lp_tensor_new_bf16) and
     * weights' kept copies (lp_tensor_keep_bf16), which go to the engine
     * as they are instead of being rounded again */
    const uint16_t *ha = be->gemm_bf16h ? lp_tensor_bf16_data(a) : NULL;
    const uint16_t *hb = be->gemm_bf16h ? lp_tensor_bf16_data(b) : NULL;
    if ((tensor_bf16(a) && !ha) || (tensor_bf16(b) && !hb))
      return LP_ERR_UNSUPPORTED;
    if (ha || hb)
      return be->gemm_bf16h(be, trans_a ^ ma.stored_t, trans_b ^ mb.stored_t,
                            m, n, k, alpha, ha ? (const void *)ha : ma.p, !!ha,
                            ma.ld, 0, hb ? (const void *)hb : mb.p, !!hb, mb.ld,
                            0, beta, mc.p, mc.ld, 0, 1);
    if (!be->gemm_bf16) return LP_ERR_UNSUPPORTED;
    return be->gemm_bf16(be, trans_a ^ ma.stored_t, trans_b ^ mb.stored_t, m,
                         n, k, alpha, ma.p, ma.ld, 0, mb.p, mb.ld, 0, beta,
                         mc.p, mc.ld, 0, 1);
  }
  if (tensor_bf16(a) || tensor_bf16(b)) return LP_ERR_ARG;
  return be->gemm(be, trans_a ^ ma.stored_t, trans_b ^ mb.stored_t, m, n, k,
                  alpha, ma.p, ma.ld, 0, mb.p, mb.ld, 0, beta, mc.p, mc.ld, 0,
                  1);
}

/* ---- reductions (host) ---- */

lp_status lp_tensor_sum(const lp_tensor *t, double *out) {
  if (!t || !out) return LP_ERR_ARG;
  if (!tensor_host(t)) return LP_ERR_UNSUPPORTED;
  int64_t n = lp_tensor_numel(t), sh[4], st[4];
  tensor_pad4(t, sh, st);
  double s = 0.0;
  for (int64_t i = 0; i < n; i++)
    s += t->data[tensor_offset4(sh, st, i)];
  *out = s;
  return LP_OK;
}

lp_status lp_tensor_dot(const lp_tensor *a, const lp_tensor *b, double *out) {
  if (!a || !b || !out || !lp_tensor_same_shape(a, b)) return LP_ERR_ARG;
  if (!tensor_host(a) || !tensor_host(b)) return LP_ERR_UNSUPPORTED;
  int64_t n = lp_tensor_numel(a), ash[4], ast[4], bsh[4], bst[4];
  tensor_pad4(a, ash, ast);
  tensor_pad4(b, bsh, bst);
  double s = 0.0;
  for (int64_t i = 0; i < n; i++)
    s += (double)a->data[tensor_offset4(ash, ast, i)] *
         (double)b->data[tensor_offset4(bsh, bst, i)];
  *out = s;
  return LP_OK;
}

lp_status lp_tensor_max_abs_diff(const lp_tensor *a, const lp_tensor *b,
                                 double *out) {
  if (!a || !b || !out || !lp_tensor_same_shape(a, b)) return LP_ERR_ARG;
  if (!tensor_host(a) || !tensor_host(b)) return LP_ERR_UNSUPPORTED;
  int64_t n = lp_tensor_numel(a), ash[4], ast[4], bsh[4], bst[4];
  tensor_pad4(a, ash, ast);
  tensor_pad4(b, bsh, bst);
  double m = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a->data[tensor_offset4(ash, ast, i)] -
                    (double)b->data[tensor_offset4(bsh, bst, i)]);
    if (d > m || d != d) m = d;
  }
  *out = m;
  return LP_OK;
}

int lp_tensor_equal(const lp_tensor *a, const lp_tensor *b) {
  if (!a || !b || !lp_tensor_same_shape(a, b)) return 0;
  if (!tensor_host(a) || !tensor_host(b)) return 0;
  int64_t n = lp_tensor_numel(a), ash[4], ast[4], bsh[4], bst[4];
  tensor_pad4(a, ash, ast);
  tensor_pad4(b, bsh, bst);
  for (int64_t i = 0; i < n; i++)
    if (memcmp(a->data + tensor_offset4(ash, ast, i),
               b->data + tensor_offset4(bsh, bst, i), sizeof(float)))
      return 0;
  return 1;
}
