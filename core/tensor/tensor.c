/* tensor.c — tensor headers, refcounted storage, creation and views. */
#include "tensor_internal.h"

#include <pthread.h>
#include <stddef.h>
#include <string.h>

static const lp_tensor_backend *be_or_cpu(const lp_tensor_backend *be) {
  return be ? be : lp_tensor_backend_cpu();
}

/* numel of a shape; -1 when ndim or a dim is out of range or when the
 * product of the dims, zeros counted as 1, times 4 (bytes) would overflow
 * int64 (checked before each multiply): so the dense strides of an empty
 * tensor, [0, 2^62, 2^62], cannot overflow either. */
static int64_t shape_numel(int ndim, const int64_t *shape) {
  if (ndim < 1 || ndim > LP_TENSOR_MAXDIM || !shape) return -1;
  int64_t n = 1;
  int empty = 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    int64_t d = shape[i] ? shape[i] : 1;
    if (n > (INT64_MAX / 4) / d) return -1;
    n *= d;
    empty |= shape[i] == 0;
  }
  return empty ? 0 : n;
}

static void set_dense_strides(lp_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    t->stride[i] = s;
    s *= t->shape[i] ? t->shape[i] : 1;
  }
}

/* A header over `st` (takes one new reference). NULL on allocation failure,
 * in which case the reference is not taken. */
static lp_tensor *header_new(lp_tensor_storage *st, float *data, int ndim,
                             const int64_t *shape, const int64_t *stride) {
  lp_tensor *t = lp_malloc(sizeof *t);
  if (!t) return NULL;
  memset(t, 0, sizeof *t);
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++)
    t->shape[i] = shape[i];
  if (stride)
    for (int i = 0; i < ndim; i++)
      t->stride[i] = stride[i];
  else
    set_dense_strides(t);
  t->data = data;
  t->storage = st;
  atomic_fetch_add(&st->refs, 1);
  return t;
}

static void storage_release(lp_tensor_storage *st) {
  if (!st) return;
  if (atomic_fetch_sub(&st->refs, 1) != 1) return;
  if (st->owns) st->be->free(st->be, st->data);
  lp_free(st->h);
  lp_free(st);
}

void lp_tensor_free(lp_tensor *t) {
  if (!t) return;
  storage_release(t->storage);
  lp_free(t);
}

/* Allocates storage of n floats and one dense header. */
static lp_status tensor_alloc(const lp_tensor_backend *be, int ndim,
                              const int64_t *shape, lp_tensor **out) {
  if (!out) return LP_ERR_ARG;
  *out = NULL;
  be = be_or_cpu(be);
  int64_t n = shape_numel(ndim, shape);
  if (n < 0) return LP_ERR_ARG;
  lp_tensor_storage *st = lp_malloc(sizeof *st);
  if (!st) return LP_ERR_NOMEM;
  memset(st, 0, sizeof *st);
  atomic_init(&st->refs, 0);
  st->be = be;
  st->n = (size_t)n;
  st->owns = 1;
  st->data = be->alloc(be, (size_t)(n ? n : 1) * sizeof(float));
  if (!st->data) {
    lp_free(st);
    return LP_ERR_NOMEM;
  }
  lp_tensor *t = header_new(st, st->data, ndim, shape, NULL);
  if (!t) {
    be->free(be, st->data);
    lp_free(st);
    return LP_ERR_NOMEM;
  }
  *out = t;
  return LP_OK;
}

lp_status lp_tensor_empty(const lp_tensor_backend *be, int ndim,
                          const int64_t *shape, lp_tensor **out) {
  return tensor_alloc(be, ndim, shape, out);
}

lp_status lp_tensor_zeros(const lp_tensor_backend *be, int ndim,
                          const int64_t *shape, lp_tensor **out) {
  LP_CHECK(tensor_alloc(be, ndim, shape, out));
  lp_status st = lp_tensor_fill(*out, 0.0f);
  if (st != LP_OK) {
    lp_tensor_free(*out);
    *out = NULL;
  }
  return st;
}

lp_status lp_tensor_from_data(const lp_tensor_backend *be, int ndim,
                              const int64_t *shape, const float *src,
                              lp_tensor **out) {
  if (!src && out) *out = NULL;
  if (!src) return LP_ERR_ARG;
  LP_CHECK(tensor_alloc(be, ndim, shape, out));
  lp_tensor *t = *out;
  size_t bytes = (size_t)lp_tensor_numel(t) * sizeof(float);
  lp_status st = t->storage->be->from_host(t->storage->be, t->data, src, bytes);
  if (st != LP_OK) {
    lp_tensor_free(t);
    *out = NULL;
  }
  return st;
}

lp_status lp_tensor_wrap(float *data, int ndim, const int64_t *shape,
                         lp_tensor **out) {
  if (!out) return LP_ERR_ARG;
  *out = NULL;
  int64_t n = shape_numel(ndim, shape);
  if (n < 0 || (!data && n > 0)) return LP_ERR_ARG;
  lp_tensor_storage *st = lp_malloc(sizeof *st);
  if (!st) return LP_ERR_NOMEM;
  memset(st, 0, sizeof *st);
  atomic_init(&st->refs, 0);
  st->be = lp_tensor_backend_cpu();
  st->n = (size_t)n;
  st->owns = 0;
  st->data = data;
  lp_tensor *t = header_new(st, data, ndim, shape, NULL);
  if (!t) {
    lp_free(st);
    return LP_ERR_NOMEM;
  }
  *out = t;
  return LP_OK;
}

lp_status lp_tensor_empty_like(const lp_tensor *t, lp_tensor **out) {
  if (!t) {
    if (out) *out = NULL;
    return LP_ERR_ARG;
  }
  return tensor_alloc(t->storage->be, t->ndim, t->shape, out);
}

lp_status lp_tensor_zeros_like(const lp_tensor *t, lp_tensor **out) {
  if (!t) {
    if (out) *out = NULL;
    return LP_ERR_ARG;
  }
  return lp_tensor_zeros(t->storage->be, t->ndim, t->shape, out);
}

lp_status lp_tensor_clone(const lp_tensor *t, lp_tensor **out) {
  LP_CHECK(lp_tensor_empty_like(t, out));
  lp_status st = lp_tensor_copy(*out, t);
  if (st != LP_OK) {
    lp_tensor_free(*out);
    *out = NULL;
  }
  return st;
}

/* ---- views ---- */

lp_status lp_tensor_view(const lp_tensor *t, lp_tensor **out) {
  if (!out) return LP_ERR_ARG;
  *out = NULL;
  if (!t) return LP_ERR_ARG;
  lp_tensor *v = header_new(t->storage, t->data, t->ndim, t->shape, t->stride);
  if (!v) return LP_ERR_NOMEM;
  *out = v;
  return LP_OK;
}

lp_status lp_tensor_rows(const lp_tensor *t, int64_t start, int64_t count,
                         lp_tensor **out) {
  if (!out) return LP_ERR_ARG;
  *out = NULL;
  if (!t || start < 0 || count < 0 || start + count > t->shape[0])
    return LP_ERR_ARG;
  int64_t shape[LP_TENSOR_MAXDIM];
  memcpy(shape, t->shape, sizeof shape);
  shape[0] = count;
  lp_tensor *v = header_new(t->storage, t->data + start * t->stride[0], t->ndim,
                            shape, t->stride);
  if (!v) return LP_ERR_NOMEM;
  *out = v;
  return LP_OK;
}

lp_status lp_tensor_reshape(const lp_tensor *t, int ndim, const int64_t *shape,
                            lp_tensor **out) {
  if (!out) return LP_ERR_ARG;
  *out = NULL;
  if (!t || !shape || ndim < 1 || ndim > LP_TENSOR_MAXDIM) return LP_ERR_ARG;
  if (!lp_tensor_is_contiguous(t)) return LP_ERR_ARG;
  int64_t sh[LP_TENSOR_MAXDIM], known = 1;
  int infer = -1;
  for (int i = 0; i < ndim; i++) {
    sh[i] = shape[i];
    if (sh[i] == -1) {
      if (infer >= 0) return LP_ERR_ARG;
      infer = i;
    } else if (sh[i] < 0) {
      return LP_ERR_ARG;
    } else {
      known *= sh[i];
    }
  }
  int64_t n = lp_tensor_numel(t);
  if (infer >= 0) {
    if (known == 0 || n % known) return LP_ERR_ARG;
    sh[infer] = n / known;
  }
  if (shape_numel(ndim, sh) != n) return LP_ERR_ARG;
  lp_tensor *v = header_new(t->storage, t->data, ndim, sh, NULL);
  if (!v) return LP_ERR_NOMEM;
  *out = v;
  return LP_OK;
}

lp_status lp_tensor_transpose(const lp_tensor *t, int d0, int d1,
                              lp_tensor **out) {
  if (!out) return LP_ERR_ARG;
  *out = NULL;
  if (!t || d0 < 0 || d1 < 0 || d0 >= t->ndim || d1 >= t->ndim)
    return LP_ERR_ARG;
  int64_t sh[LP_TENSOR_MAXDIM], sd[LP_TENSOR_MAXDIM];
  memcpy(sh, t->shape, sizeof sh);
  memcpy(sd, t->stride, sizeof sd);
  int64_t a = sh[d0];
  sh[d0] = sh[d1], sh[d1] = a;
  a = sd[d0];
  sd[d0] = sd[d1], sd[d1] = a;
  lp_tensor *v = header_new(t->storage, t->data, t->ndim, sh, sd);
  if (!v) return LP_ERR_NOMEM;
  *out = v;
  return LP_OK;
}

/* ---- queries ---- */

int64_t lp_tensor_numel(const lp_tensor *t) {
  if (!t) return 0;
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++)
    n *= t->shape[i];
  return n;
}

int lp_tensor_is_contiguous(const lp_tensor *t) {
  if (!t) return 0;
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] == 0) return 1;
    if (t->shape[i] != 1 && t->stride[i] != s) return 0;
    s *= t->shape[i];
  }
  return 1;
}

int lp_tensor_same_shape(const lp_tensor *a, const lp_tensor *b) {
  if (!a || !b || a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

void lp_tensor_rows_cols(const lp_tensor *t, int64_t *rows, int64_t *cols) {
  int64_t r = 1;
  for (int i = 0; i < t->ndim - 1; i++)
    r *= t->shape[i];
  if (rows) *rows = r;
  if (cols) *cols = t->shape[t->ndim - 1];
}

const lp_tensor_backend *lp_tensor_backend_of(const lp_tensor *t) {
  return t ? t->storage->be : NULL;
}

int lp_tensor_storage_refs(const lp_tensor *t) {
  return t ? atomic_load(&t->storage->refs) : 0;
}

size_t lp_tensor_storage_bytes(const lp_tensor *t) {
  return t ? t->storage->n * lp_tensor_elem_bytes(t) : 0;
}

size_t lp_tensor_elem_bytes(const lp_tensor *t) {
  return tensor_bf16(t) ? sizeof(uint16_t) : sizeof(float);
}

void lp_tensor_touch(lp_tensor *t) { tensor_touch(t); }

void lp_tensor_keep_bf16(lp_tensor *t) {
  if (t) t->storage->keep_bf16 = 1;
}

int lp_tensor_is_bf16(const lp_tensor *t) { return tensor_bf16(t); }

lp_status lp_tensor_new_bf16(const lp_tensor *x, lp_tensor **out) {
  if (!out) return LP_ERR_ARG;
  *out = NULL;
  if (!x || !lp_tensor_is_contiguous(x) || tensor_bf16(x)) return LP_ERR_ARG;
  if (!tensor_host(x)) return LP_ERR_UNSUPPORTED;
  int64_t n = lp_tensor_numel(x);
  lp_tensor_storage *st = lp_malloc(sizeof *st);
  if (!st) return LP_ERR_NOMEM;
  memset(st, 0, sizeof *st);
  atomic_init(&st->refs, 0);
  st->be = x->storage->be;
  st->n = (size_t)n;
  st->owns = 1;
  st->bf16 = 1;
  uint16_t *h = st->be->alloc(st->be, (size_t)(n ? n : 1) * sizeof(uint16_t));
  if (!h) {
    lp_free(st);
    return LP_ERR_NOMEM;
  }
  tensor_bf16_round_to(n, x->data, h);
  st->data = (float *)(void *)h;
  lp_tensor *t = header_new(st, st->data, x->ndim, x->shape, NULL);
  if (!t) {
    st->be->free(st->be, h);
    lp_free(st);
    return LP_ERR_NOMEM;
  }
  *out = t;
  return LP_OK;
}

const uint16_t *lp_tensor_bf16_data(const lp_tensor *t) {
  if (!t) return NULL;
  lp_tensor_storage *st = t->storage;
  ptrdiff_t off = t->data - st->data; /* elements */
  if (st->bf16) return (const uint16_t *)(const void *)st->data + off;
  if (!st->keep_bf16 || !st->be->host_accessible) return NULL;
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&mu);
  unsigned v = atomic_load(&st->ver);
  if (!st->h) st->h = lp_malloc((st->n ? st->n : 1) * sizeof(uint16_t));
  if (st->h && (!st->h_ok || st->h_ver != v)) {
    tensor_bf16_round_to((int64_t)st->n, st->data, st->h);
    st->h_ver = v;
    st->h_ok = 1;
  }
  const uint16_t *h = st->h;
  pthread_mutex_unlock(&mu);
  return h ? h + off : NULL;
}

float *lp_tensor_at(const lp_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                    int64_t i3) {
  int64_t idx[4] = {i0, i1, i2, i3}, off = 0;
  for (int i = 0; i < t->ndim; i++)
    off += idx[i] * t->stride[i];
  return t->data + off;
}

/* ---- moving between backends ---- */

lp_status lp_tensor_move(lp_tensor *t, const lp_tensor_backend *be) {
  if (!t) return LP_ERR_ARG;
  be = be_or_cpu(be);
  if (t->storage->be == be) return LP_OK;
  if (!lp_tensor_is_contiguous(t) || atomic_load(&t->storage->refs) != 1)
    return LP_ERR_ARG;
  lp_tensor *n;
  LP_CHECK(tensor_alloc(be, t->ndim, t->shape, &n));
  lp_status st = lp_tensor_copy(n, t);
  if (st != LP_OK) {
    lp_tensor_free(n);
    return st;
  }
  /* swap storages: t takes n's, n (freed next) takes t's old one */
  lp_tensor_storage *old = t->storage;
  n->storage->keep_bf16 = old->keep_bf16;
  t->storage = n->storage;
  t->data = n->data;
  memcpy(t->stride, n->stride, sizeof t->stride);
  n->storage = old;
  lp_tensor_free(n);
  return LP_OK;
}

lp_status lp_tensor_to_host(const lp_tensor *t, lp_tensor **out) {
  if (!out) return LP_ERR_ARG;
  *out = NULL;
  if (!t) return LP_ERR_ARG;
  LP_CHECK(tensor_alloc(NULL, t->ndim, t->shape, out));
  lp_status st;
  if (lp_tensor_is_contiguous(t) || t->storage->be->host_accessible) {
    st = lp_tensor_copy(*out, t);
  } else {
    /* a strided device view: bring the span it covers, then gather on the
     * host through a view with the same strides */
    int64_t span = 1;
    for (int i = 0; i < t->ndim; i++)
      if (t->shape[i] == 0) span = 0;
      else if (t->stride[i] < 0) span = -1;
      else if (span > 0) span += (t->shape[i] - 1) * t->stride[i];
    if (span < 0) {
      st = LP_ERR_UNSUPPORTED;
    } else {
      lp_tensor *buf = NULL, *v = NULL;
      st = tensor_alloc(NULL, 1, (int64_t[]){span}, &buf);
      if (st == LP_OK)
        st = t->storage->be->to_host(t->storage->be, buf->data, t->data,
                                     (size_t)span * sizeof(float));
      if (st == LP_OK) {
        v = header_new(buf->storage, buf->data, t->ndim, t->shape, t->stride);
        st = v ? lp_tensor_copy(*out, v) : LP_ERR_NOMEM;
      }
      lp_tensor_free(v);
      lp_tensor_free(buf);
    }
  }
  if (st != LP_OK) {
    lp_tensor_free(*out);
    *out = NULL;
  }
  return st;
}

lp_status lp_tensor_read(const lp_tensor *t, float *dst) {
  if (!t || !lp_tensor_is_contiguous(t)) return LP_ERR_ARG;
  size_t bytes = (size_t)lp_tensor_numel(t) * sizeof(float);
  if (bytes && !dst) return LP_ERR_ARG;
  if (tensor_bf16(t)) { /* widening is exact */
    const uint16_t *h = lp_tensor_bf16_data(t);
    for (int64_t i = 0; i < lp_tensor_numel(t); i++)
      dst[i] = lp_tensor_bf16_to_float(h[i]);
    return LP_OK;
  }
  return bytes ? t->storage->be->to_host(t->storage->be, dst, t->data, bytes) : LP_OK;
}

lp_status lp_tensor_write(lp_tensor *t, const float *src) {
  if (!t || !lp_tensor_is_contiguous(t) || tensor_bf16(t)) return LP_ERR_ARG;
  tensor_touch(t);
  size_t bytes = (size_t)lp_tensor_numel(t) * sizeof(float);
  if (bytes && !src) return LP_ERR_ARG;
  return bytes ? t->storage->be->from_host(t->storage->be, t->data, src, bytes) : LP_OK;
}
