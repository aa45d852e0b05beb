/* safetensors.c — the reader: the header read once and checked whole
 * (yajl's event parser, then the format's rules over every tensor), and
 * one tensor at a time read by positioned reads of its own bytes and
 * converted to float32 in the caller's buffer. The writer is write.c's;
 * the dtype table and the conversions live here and serve both. */
#define _XOPEN_SOURCE 700 /* pread */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yajl/yajl_parse.h>

#include "lp_safetensors.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the safetensors reader assumes a little-endian host (the format's byte order)"
#endif

#define ST_MAX_HEADER (100u * 1000u * 1000u) /* the reference crate's limit */
#define ST_CHUNK (256u * 1024u)               /* staging bytes per read */

/* ---- dtypes ------------------------------------------------------------ */

static const struct {
  const char *name;
  size_t size;
  int is_float;
} dtypes[LP_SAFETENSORS_NDTYPE] = {
    [LP_SAFETENSORS_F32] = {"F32", 4, 1},         [LP_SAFETENSORS_F16] = {"F16", 2, 1},
    [LP_SAFETENSORS_BF16] = {"BF16", 2, 1},       [LP_SAFETENSORS_F8_E4M3] = {"F8_E4M3", 1, 1},
    [LP_SAFETENSORS_F8_E5M2] = {"F8_E5M2", 1, 1}, [LP_SAFETENSORS_F64] = {"F64", 8, 1},
    [LP_SAFETENSORS_BOOL] = {"BOOL", 1, 0},       [LP_SAFETENSORS_U8] = {"U8", 1, 0},
    [LP_SAFETENSORS_I8] = {"I8", 1, 0},           [LP_SAFETENSORS_I16] = {"I16", 2, 0},
    [LP_SAFETENSORS_U16] = {"U16", 2, 0},         [LP_SAFETENSORS_I32] = {"I32", 4, 0},
    [LP_SAFETENSORS_U32] = {"U32", 4, 0},         [LP_SAFETENSORS_I64] = {"I64", 8, 0},
    [LP_SAFETENSORS_U64] = {"U64", 8, 0},
};

const char *lp_safetensors_dtype_name(lp_safetensors_dtype d) {
  return (unsigned)d < LP_SAFETENSORS_NDTYPE ? dtypes[d].name : "?";
}

size_t lp_safetensors_dtype_size(lp_safetensors_dtype d) {
  return (unsigned)d < LP_SAFETENSORS_NDTYPE ? dtypes[d].size : 0;
}

lp_status lp_safetensors_dtype_parse(const char *s, lp_safetensors_dtype *out) {
  for (int d = 0; d < LP_SAFETENSORS_NDTYPE; d++)
    if (strcmp(s, dtypes[d].name) == 0) {
      *out = (lp_safetensors_dtype)d;
      return LP_OK;
    }
  return LP_ERR_ARG;
}

/* ---- conversions -------------------------------------------------------- */

static inline float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint32_t to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

uint16_t lp_safetensors_f32_to_bf16(float x) {
  uint32_t u = to_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN, as PyTorch */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float lp_safetensors_bf16_to_f32(uint16_t h) { return from_bits((uint32_t)h << 16); }

/* The 15 magnitude bits moved into float32's place are the right value
 * times 2^-112 for normal and subnormal halves alike (float32 keeps the
 * subnormals); exponent 31 is infinity or NaN. */
float lp_safetensors_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  uint32_t u = em >= 0x7c00u ? (em << 13) | 0x7f800000u : to_bits(from_bits(em << 13) * 0x1p112f);
  return from_bits(u | sign);
}

float lp_safetensors_e4m3_to_f32(uint8_t b) {
  int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) v = from_bits(0x7fc00000u);
  else if (e == 0) v = (float)m * 0x1p-9f;
  else v = (1.0f + (float)m / 8.0f) * from_bits((uint32_t)(e - 7 + 127) << 23);
  return (b & 0x80) ? -v : v;
}

static float e5m2_to_f32(uint8_t b) { return lp_safetensors_f16_to_f32((uint16_t)(b << 8)); }

/* n elements of dtype d at src to float32 at dst; table: the 256 values of
 * an FP8 dtype. */
static void convert(lp_safetensors_dtype d, const void *src, float *restrict dst, size_t n,
                    const float *table) {
  switch (d) {
  case LP_SAFETENSORS_F32: memcpy(dst, src, n * 4); break;
  case LP_SAFETENSORS_BF16: {
    const uint16_t *restrict s = src;
    for (size_t i = 0; i < n; i++) dst[i] = from_bits((uint32_t)s[i] << 16);
    break;
  }
  case LP_SAFETENSORS_F16: {
    const uint16_t *restrict s = src;
    for (size_t i = 0; i < n; i++) dst[i] = lp_safetensors_f16_to_f32(s[i]);
    break;
  }
  case LP_SAFETENSORS_F8_E4M3:
  case LP_SAFETENSORS_F8_E5M2: {
    const uint8_t *restrict s = src;
    for (size_t i = 0; i < n; i++) dst[i] = table[s[i]];
    break;
  }
  case LP_SAFETENSORS_F64: {
    const double *restrict s = src;
    for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
    break;
  }
  default: break; /* integer dtypes are refused before */
  }
}

/* ---- the open file ---------------------------------------------------------- */

typedef struct st_meta {
  char *key, *value;
} st_meta;

struct lp_safetensors_file {
  char *path;
  int fd;
  uint64_t size;        /* of the file at open */
  uint64_t data_off;    /* 8 + header length */
  uint64_t bytes_read;
  lp_safetensors_info *t; /* in data order after open */
  size_t n, cap;
  const lp_safetensors_info **by_name; /* into t, names ascending */
  st_meta *meta;
  size_t n_meta, cap_meta;
  char err[LP_ERRLEN];
};

const char *lp_safetensors_last_error(const lp_safetensors_file *f) { return f->err; }
const char *lp_safetensors_path(const lp_safetensors_file *f) { return f->path; }
size_t lp_safetensors_count(const lp_safetensors_file *f) { return f->n; }
uint64_t lp_safetensors_bytes_read(const lp_safetensors_file *f) { return f->bytes_read; }
uint64_t lp_safetensors_file_size(const lp_safetensors_file *f) { return f->size; }
uint64_t lp_safetensors_data_offset(const lp_safetensors_file *f) { return f->data_off; }
size_t lp_safetensors_metadata_count(const lp_safetensors_file *f) { return f->n_meta; }

const lp_safetensors_info *lp_safetensors_at(const lp_safetensors_file *f, size_t i) {
  return i < f->n ? &f->t[i] : NULL;
}

void lp_safetensors_metadata_at(const lp_safetensors_file *f, size_t i, const char **key,
                                const char **value) {
  *key = i < f->n_meta ? f->meta[i].key : NULL;
  *value = i < f->n_meta ? f->meta[i].value : NULL;
}

const char *lp_safetensors_metadata(const lp_safetensors_file *f, const char *key) {
  for (size_t i = 0; i < f->n_meta; i++)
    if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
  return NULL;
}

const lp_safetensors_info *lp_safetensors_find(const lp_safetensors_file *f, const char *name) {
  size_t lo = 0, hi = f->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(f->by_name[mid]->name, name);
    if (c == 0) return f->by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

void lp_safetensors_close(lp_safetensors_file *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  for (size_t i = 0; i < f->n; i++) lp_free((char *)f->t[i].name);
  for (size_t i = 0; i < f->n_meta; i++) {
    lp_free(f->meta[i].key);
    lp_free(f->meta[i].value);
  }
  lp_free(f->t);
  lp_free(f->by_name);
  lp_free(f->meta);
  lp_free(f->path);
  lp_free(f);
}

/* Reads exactly n bytes at off into buf, counting them. LP_OK, or LP_ERR_IO
 * with the reason in f->err after prefix (the file and tensor). */
static lp_status read_at(lp_safetensors_file *f, void *buf, size_t n, uint64_t off,
                         const char *what) {
  char *p = buf;
  while (n > 0) {
    ssize_t got = pread(f->fd, p, n, (off_t)off);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      lp_errf(f->err, "%s: reading %s failed: %s", f->path, what, strerror(errno));
      return LP_ERR_IO;
    }
    if (got == 0) {
      lp_errf(f->err, "%s: the file ends at byte %llu, inside %s (it was cut short after it "
              "was opened)", f->path, (unsigned long long)off, what);
      return LP_ERR_IO;
    }
    f->bytes_read += (uint64_t)got;
    p += got;
    n -= (size_t)got;
    off += (uint64_t)got;
  }
  return LP_OK;
}

/* ---- header parsing (yajl events) --------------------------------------- */

enum { S_TOP, S_ROOT, S_TENSOR, S_META, S_SHAPE, S_OFFSETS, S_DONE };
enum { F_NONE, F_DTYPE, F_SHAPE, F_OFFSETS, F_OTHER };

typedef struct hp {
  lp_safetensors_file *f;
  int state;
  int skip;            /* depth of an ignored value being skipped */
  int field;           /* the tensor field whose value comes next */
  int seen;            /* fields seen in this tensor: 1 << F_* */
  int meta_seen;
  char *key;           /* the pending key of the root or __metadata__ map */
  int n_off;
  lp_safetensors_info *cur;
  lp_status st;        /* set with f->err when a callback stops the parse */
} hp;

static int hp_fail(hp *h, lp_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int hp_fail(hp *h, lp_status st, const char *fmt, ...) {
  char what[LP_ERRLEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  lp_errf(h->f->err, "%s: %s", h->f->path, what);
  h->st = st;
  return 0;
}

static int hp_nomem(hp *h) {
  lp_errf(h->f->err, "%s: out of memory reading the header", h->f->path);
  h->st = LP_ERR_NOMEM;
  return 0;
}

/* A copy of a yajl string; NULL (with h->st set) when it holds a NUL or
 * memory runs out. */
static char *hp_str(hp *h, const unsigned char *s, size_t len, const char *what) {
  if (memchr(s, 0, len)) {
    hp_fail(h, LP_ERR_PARSE, "the header has a %s with a NUL character", what);
    return NULL;
  }
  char *c = lp_malloc(len + 1);
  if (!c) {
    hp_nomem(h);
    return NULL;
  }
  memcpy(c, s, len);
  c[len] = '\0';
  return c;
}

static const char *tname(hp *h) { return h->cur ? h->cur->name : "?"; }

static int tensor_fail(hp *h, const char *why) {
  return hp_fail(h, LP_ERR_PARSE, "tensor '%s': %s", tname(h), why);
}

/* A value where the state has no use for it (skip inside ignored fields). */
static int hp_scalar(hp *h, const char *kind) {
  if (h->skip) return 1;
  const char *an = kind[0] == 'o' ? "an" : "a";
  switch (h->state) {
  case S_TOP: return hp_fail(h, LP_ERR_PARSE, "the header is a JSON %s, not an object", kind);
  case S_ROOT:
    if (h->key && strcmp(h->key, "__metadata__") == 0 && strcmp(kind, "null") == 0) {
      lp_free(h->key);
      h->key = NULL;
      return 1;
    }
    return hp_fail(h, LP_ERR_PARSE, "the entry of '%s' is %s %s, not an object",
                   h->key ? h->key : "?", an, kind);
  case S_TENSOR:
    if (h->field == F_OTHER) return 1;
    if (h->field == F_DTYPE) return tensor_fail(h, "dtype must be a string");
    if (h->field == F_SHAPE) return tensor_fail(h, "shape must be a list of integers");
    return tensor_fail(h, "data_offsets must be a list of two integers");
  case S_META:
    return hp_fail(h, LP_ERR_PARSE, "__metadata__ '%s' is %s %s, not a string",
                   h->key ? h->key : "?", an, kind);
  case S_SHAPE: return tensor_fail(h, "shape must be a list of integers");
  case S_OFFSETS: return tensor_fail(h, "data_offsets must be a list of two integers");
  default: return hp_fail(h, LP_ERR_PARSE, "%s", "the header has content after its object");
  }
}

static int cb_null(void *ctx) { return hp_scalar(ctx, "null"); }
static int cb_bool(void *ctx, int b) {
  (void)b;
  return hp_scalar(ctx, "boolean");
}
static int cb_double(void *ctx, double d) {
  (void)d;
  return hp_scalar(ctx, "fraction");
}

static int cb_integer(void *ctx, long long v) {
  hp *h = ctx;
  if (h->skip) return 1;
  if (h->state == S_SHAPE) {
    if (v < 0) return tensor_fail(h, "a shape entry is negative");
    if (h->cur->ndim == LP_SAFETENSORS_MAXDIM) {
      char m[64];
      snprintf(m, sizeof m, "more than %d dims", LP_SAFETENSORS_MAXDIM);
      return tensor_fail(h, m);
    }
    h->cur->shape[h->cur->ndim++] = v;
    return 1;
  }
  if (h->state == S_OFFSETS) {
    if (v < 0) return tensor_fail(h, "a data offset is negative");
    if (h->n_off == 2) return tensor_fail(h, "data_offsets has more than two entries");
    if (h->n_off++ == 0) h->cur->begin = (uint64_t)v;
    else h->cur->end = (uint64_t)v;
    return 1;
  }
  return hp_scalar(h, "number");
}

static int cb_string(void *ctx, const unsigned char *s, size_t len) {
  hp *h = ctx;
  if (h->skip) return 1;
  if (h->state == S_TENSOR && h->field == F_DTYPE) {
    char name[16];
    if (len >= sizeof name || memchr(s, 0, len) ||
        (memcpy(name, s, len), name[len] = '\0',
         lp_safetensors_dtype_parse(name, &h->cur->dtype) != LP_OK)) {
      return hp_fail(h, LP_ERR_PARSE, "tensor '%s': unknown dtype \"%.*s\" (luapipe knows "
                     "F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, U32, U16, "
                     "U8, BOOL)", tname(h), len > 40 ? 40 : (int)len, (const char *)s);
    }
    return 1;
  }
  if (h->state == S_META) {
    char *v = hp_str(h, s, len, "__metadata__ value");
    if (!v) return 0;
    if (h->f->n_meta == h->f->cap_meta) {
      size_t cap = h->f->cap_meta ? 2 * h->f->cap_meta : 8;
      st_meta *m = lp_realloc(h->f->meta, cap * sizeof *m);
      if (!m) {
        lp_free(v);
        return hp_nomem(h);
      }
      h->f->meta = m;
      h->f->cap_meta = cap;
    }
    h->f->meta[h->f->n_meta++] = (st_meta){h->key, v};
    h->key = NULL;
    return 1;
  }
  return hp_scalar(h, "string");
}

static int cb_map_key(void *ctx, const unsigned char *s, size_t len) {
  hp *h = ctx;
  if (h->skip) return 1;
  if (h->state == S_TENSOR) {
    static const char *const names[] = {"dtype", "shape", "data_offsets"};
    h->field = F_OTHER;
    for (int i = 0; i < 3; i++)
      if (strlen(names[i]) == len && memcmp(names[i], s, len) == 0) h->field = F_DTYPE + i;
    if (h->field != F_OTHER) {
      if (h->seen & (1 << h->field)) {
        char m[64];
        snprintf(m, sizeof m, "field %s given twice", names[h->field - F_DTYPE]);
        return tensor_fail(h, m);
      }
      h->seen |= 1 << h->field;
    }
    return 1;
  }
  lp_free(h->key);
  h->key = hp_str(h, s, len, h->state == S_META ? "__metadata__ key" : "tensor name");
  if (!h->key) return 0;
  if (h->state == S_META)
    for (size_t i = 0; i < h->f->n_meta; i++)
      if (strcmp(h->f->meta[i].key, h->key) == 0)
        return hp_fail(h, LP_ERR_PARSE, "__metadata__ '%s' given twice", h->key);
  return 1;
}

static int cb_start_map(void *ctx) {
  hp *h = ctx;
  if (h->skip) {
    h->skip++;
    return 1;
  }
  switch (h->state) {
  case S_TOP: h->state = S_ROOT; return 1;
  case S_ROOT: {
    if (strcmp(h->key, "__metadata__") == 0) {
      if (h->meta_seen) return hp_fail(h, LP_ERR_PARSE, "%s", "__metadata__ given twice");
      h->meta_seen = 1;
      lp_free(h->key);
      h->key = NULL;
      h->state = S_META;
      return 1;
    }
    lp_safetensors_file *f = h->f;
    if (f->n == f->cap) {
      size_t cap = f->cap ? 2 * f->cap : 16;
      lp_safetensors_info *t = lp_realloc(f->t, cap * sizeof *t);
      if (!t) return hp_nomem(h);
      f->t = t;
      f->cap = cap;
    }
    h->cur = &f->t[f->n++];
    memset(h->cur, 0, sizeof *h->cur);
    h->cur->name = h->key; /* the file owns it now */
    h->cur->dtype = LP_SAFETENSORS_NDTYPE;
    h->key = NULL;
    h->seen = 0;
    h->field = F_NONE;
    h->state = S_TENSOR;
    return 1;
  }
  case S_TENSOR:
    if (h->field == F_OTHER) {
      h->skip = 1;
      return 1;
    }
    return hp_scalar(h, "object");
  default: return hp_scalar(h, "object");
  }
}

static int cb_end_map(void *ctx) {
  hp *h = ctx;
  if (h->skip) {
    h->skip--;
    return 1;
  }
  if (h->state == S_ROOT) h->state = S_DONE;
  else if (h->state == S_META) h->state = S_ROOT;
  else if (h->state == S_TENSOR) {
    static const char *const need[] = {"dtype", "shape", "data_offsets"};
    for (int i = 0; i < 3; i++)
      if (!(h->seen & (1 << (F_DTYPE + i)))) {
        char m[64];
        snprintf(m, sizeof m, "no %s", need[i]);
        return tensor_fail(h, m);
      }
    h->state = S_ROOT;
  }
  return 1;
}

static int cb_start_array(void *ctx) {
  hp *h = ctx;
  if (h->skip) {
    h->skip++;
    return 1;
  }
  if (h->state == S_TENSOR && h->field == F_OTHER) {
    h->skip = 1;
    return 1;
  }
  if (h->state == S_TENSOR && h->field == F_SHAPE) {
    h->state = S_SHAPE;
    return 1;
  }
  if (h->state == S_TENSOR && h->field == F_OFFSETS) {
    h->state = S_OFFSETS;
    h->n_off = 0;
    return 1;
  }
  return hp_scalar(h, "list");
}

static int cb_end_array(void *ctx) {
  hp *h = ctx;
  if (h->skip) {
    h->skip--;
    return 1;
  }
  if (h->state == S_OFFSETS && h->n_off != 2)
    return tensor_fail(h, "data_offsets must be a list of two integers");
  h->state = S_TENSOR;
  return 1;
}

static const yajl_callbacks hp_callbacks = {cb_null,   cb_bool,      cb_integer, cb_double,
                                            NULL,      cb_string,    cb_start_map, cb_map_key,
                                            cb_end_map, cb_start_array, cb_end_array};

/* yajl's message (several lines with a pointer into the text) as one line */
static void yajl_line(yajl_handle y, const unsigned char *buf, size_t len, char *dst,
                      size_t cap) {
  unsigned char *m = yajl_get_error(y, 0, buf, len);
  snprintf(dst, cap, "%s", m ? (const char *)m : "bad JSON");
  if (m) yajl_free_error(y, m);
  for (char *c = dst; *c; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
  size_t n = strlen(dst);
  while (n > 0 && dst[n - 1] == ' ') dst[--n] = '\0';
}

static lp_status parse_header(lp_safetensors_file *f, const unsigned char *buf, size_t len) {
  hp h = {.f = f, .state = S_TOP, .st = LP_OK};
  yajl_handle y = yajl_alloc(&hp_callbacks, NULL, &h);
  if (!y) {
    lp_errf(f->err, "%s: out of memory reading the header", f->path);
    return LP_ERR_NOMEM;
  }
  yajl_status ys = yajl_parse(y, buf, len);
  size_t at = yajl_get_bytes_consumed(y); /* where the parse stopped */
  if (ys == yajl_status_ok) {
    ys = yajl_complete_parse(y);
    at = len;
  }
  lp_status st = LP_OK;
  if (ys != yajl_status_ok) {
    if (h.st != LP_OK) st = h.st;
    else {
      char m[LP_ERRLEN / 2];
      yajl_line(y, buf, len, m, sizeof m);
      lp_errf(f->err, "%s: the header is not JSON: %s (at byte %zu of %zu)", f->path, m, at,
              len);
      st = LP_ERR_PARSE;
    }
  } else if (h.state != S_DONE) {
    lp_errf(f->err, "%s: the header is not JSON: it ends inside its object", f->path);
    st = LP_ERR_PARSE;
  }
  lp_free(h.key);
  yajl_free(y);
  return st;
}

/* ---- the format's rules ----------------------------------------------------- */

static void shape_text(const lp_safetensors_info *t, char *buf, size_t cap) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < t->ndim && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
}

static int by_offset(const void *a, const void *b) {
  const lp_safetensors_info *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static int by_name_cmp(const void *a, const void *b) {
  return strcmp((*(const lp_safetensors_info *const *)a)->name,
                (*(const lp_safetensors_info *const *)b)->name);
}

/* Each tensor's shape against its byte length and the data section; then,
 * in data order, no overlap and no gap; then names unique. */
static lp_status check_tensors(lp_safetensors_file *f) {
  uint64_t data = f->size - f->data_off;
  for (size_t i = 0; i < f->n; i++) {
    lp_safetensors_info *t = &f->t[i];
    char shape[160];
    shape_text(t, shape, sizeof shape);
    uint64_t numel = 1, bytes;
    int over = 0;
    for (int d = 0; d < t->ndim; d++)
      if (__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel)) over = 1;
    if (over || numel > INT64_MAX ||
        __builtin_mul_overflow(numel, (uint64_t)dtypes[t->dtype].size, &bytes)) {
      lp_errf(f->err, "%s: tensor '%s': shape %s is too large", f->path, t->name, shape);
      return LP_ERR_PARSE;
    }
    t->numel = (int64_t)numel;
    if (t->begin > t->end) {
      lp_errf(f->err, "%s: tensor '%s': data_offsets [%llu, %llu] run backwards", f->path,
              t->name, (unsigned long long)t->begin, (unsigned long long)t->end);
      return LP_ERR_PARSE;
    }
    if (t->end - t->begin != bytes) {
      lp_errf(f->err, "%s: tensor '%s': shape %s of %s needs %llu bytes, data_offsets "
              "[%llu, %llu] hold %llu", f->path, t->name, shape, dtypes[t->dtype].name,
              (unsigned long long)bytes, (unsigned long long)t->begin,
              (unsigned long long)t->end, (unsigned long long)(t->end - t->begin));
      return LP_ERR_PARSE;
    }
    if (t->end > data) {
      lp_errf(f->err, "%s: tensor '%s': data_offsets [%llu, %llu] run past the data section "
              "(%llu bytes after the header)", f->path, t->name,
              (unsigned long long)t->begin, (unsigned long long)t->end,
              (unsigned long long)data);
      return LP_ERR_PARSE;
    }
  }
  if (f->n > 1) qsort(f->t, f->n, sizeof *f->t, by_offset);
  uint64_t at = 0;
  for (size_t i = 0; i < f->n; i++) {
    const lp_safetensors_info *t = &f->t[i];
    if (t->begin < at) {
      const lp_safetensors_info *p = &f->t[i - 1];
      lp_errf(f->err, "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' "
              "[%llu, %llu]", f->path, t->name, (unsigned long long)t->begin,
              (unsigned long long)t->end, p->name, (unsigned long long)p->begin,
              (unsigned long long)p->end);
      return LP_ERR_PARSE;
    }
    if (t->begin > at) {
      lp_errf(f->err, "%s: bytes [%llu, %llu) of the data section belong to no tensor "
              "(before tensor '%s')", f->path, (unsigned long long)at,
              (unsigned long long)t->begin, t->name);
      return LP_ERR_PARSE;
    }
    at = t->end;
  }
  if (at != data) {
    lp_errf(f->err, "%s: bytes [%llu, %llu) of the data section belong to no tensor (after "
            "the last one)", f->path, (unsigned long long)at, (unsigned long long)data);
    return LP_ERR_PARSE;
  }
  f->by_name = lp_malloc((f->n ? f->n : 1) * sizeof *f->by_name);
  if (!f->by_name) {
    lp_errf(f->err, "%s: out of memory reading the header", f->path);
    return LP_ERR_NOMEM;
  }
  for (size_t i = 0; i < f->n; i++) f->by_name[i] = &f->t[i];
  if (f->n > 1) qsort(f->by_name, f->n, sizeof *f->by_name, by_name_cmp);
  for (size_t i = 1; i < f->n; i++)
    if (strcmp(f->by_name[i]->name, f->by_name[i - 1]->name) == 0) {
      lp_errf(f->err, "%s: tensor '%s' appears twice in the header", f->path,
              f->by_name[i]->name);
      return LP_ERR_PARSE;
    }
  return LP_OK;
}

lp_status lp_safetensors_open(const char *path, lp_safetensors_file **out, char *err) {
  *out = NULL;
  lp_status st = LP_OK;
  unsigned char *hdr = NULL;
  lp_safetensors_file *f = lp_calloc(1, sizeof *f);
  if (!f || !(f->path = lp_strdup(path))) {
    lp_errf(err, "%s: out of memory", path);
    lp_free(f);
    return LP_ERR_NOMEM;
  }
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (f->fd < 0 || fstat(f->fd, &sb) != 0) {
    lp_errf(f->err, "cannot open %s: %s", path, strerror(errno));
    st = LP_ERR_IO;
    goto fail;
  }
  if (!S_ISREG(sb.st_mode)) {
    lp_errf(f->err, "cannot read %s: %s", path,
            S_ISDIR(sb.st_mode) ? "it is a folder" : "not a regular file");
    st = LP_ERR_IO;
    goto fail;
  }
  f->size = (uint64_t)sb.st_size;
  if (f->size < 8) {
    lp_errf(f->err, "%s: the file is %llu bytes, too short for the 8-byte header length "
            "(truncated?)", path, (unsigned long long)f->size);
    st = LP_ERR_PARSE;
    goto fail;
  }
  unsigned char len8[8];
  LP_CHECK_GOTO(read_at(f, len8, 8, 0, "the header length"), st, fail);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
  if (n > f->size - 8) {
    lp_errf(f->err, "%s: the header length %llu runs beyond the file (%llu bytes; truncated, "
            "or not a safetensors file)", path, (unsigned long long)n,
            (unsigned long long)f->size);
    st = LP_ERR_PARSE;
    goto fail;
  }
  if (n > ST_MAX_HEADER) {
    lp_errf(f->err, "%s: the header length %llu is over the format's limit of 100 MB", path,
            (unsigned long long)n);
    st = LP_ERR_PARSE;
    goto fail;
  }
  if (n == 0) {
    lp_errf(f->err, "%s: the header is empty (it must be a JSON object)", path);
    st = LP_ERR_PARSE;
    goto fail;
  }
  f->data_off = 8 + n;
  hdr = lp_malloc((size_t)n);
  if (!hdr) {
    lp_errf(f->err, "%s: out of memory for the %llu-byte header", path, (unsigned long long)n);
    st = LP_ERR_NOMEM;
    goto fail;
  }
  LP_CHECK_GOTO(read_at(f, hdr, (size_t)n, 8, "the header"), st, fail);
  LP_CHECK_GOTO(parse_header(f, hdr, (size_t)n), st, fail);
  LP_CHECK_GOTO(check_tensors(f), st, fail);
  lp_free(hdr);
  f->err[0] = '\0';
  *out = f;
  return LP_OK;
fail:
  lp_errf(err, "%s", f->err);
  lp_free(hdr);
  lp_safetensors_close(f);
  return st;
}

/* ---- reading one tensor -------------------------------------------------- */

/* Reads t converted into dst (t->numel floats) in chunks through a staging
 * buffer; F32 lands in dst directly. */
static lp_status read_convert(lp_safetensors_file *f, const lp_safetensors_info *t, float *dst) {
  char what[LP_ERRLEN / 2];
  snprintf(what, sizeof what, "tensor '%s'", t->name);
  uint64_t off = f->data_off + t->begin;
  size_t es = dtypes[t->dtype].size;
  if (t->dtype == LP_SAFETENSORS_F32) return read_at(f, dst, (size_t)(t->end - t->begin), off, what);
  float table[256];
  if (t->dtype == LP_SAFETENSORS_F8_E4M3)
    for (int b = 0; b < 256; b++) table[b] = lp_safetensors_e4m3_to_f32((uint8_t)b);
  if (t->dtype == LP_SAFETENSORS_F8_E5M2)
    for (int b = 0; b < 256; b++) table[b] = e5m2_to_f32((uint8_t)b);
  size_t per = ST_CHUNK / es;
  size_t total = (size_t)t->numel;
  void *stage = lp_malloc(total < per ? (total ? total * es : 1) : ST_CHUNK);
  if (!stage) {
    lp_errf(f->err, "%s: out of memory reading tensor '%s'", f->path, t->name);
    return LP_ERR_NOMEM;
  }
  lp_status st = LP_OK;
  for (size_t i = 0; i < total && st == LP_OK; i += per) {
    size_t k = total - i < per ? total - i : per;
    st = read_at(f, stage, k * es, off + i * es, what);
    if (st == LP_OK) convert(t->dtype, stage, dst + i, k, table);
  }
  lp_free(stage);
  return st;
}

lp_status lp_safetensors_read(lp_safetensors_file *f, const char *name,
                              const lp_safetensors_read_opts *opts, float *dst, int64_t n) {
  f->err[0] = '\0';
  const lp_safetensors_info *t = lp_safetensors_find(f, name);
  if (!t) {
    lp_errf(f->err, "%s: no tensor '%s' in the file", f->path, name);
    return LP_ERR_ARG;
  }
  char shape[160];
  shape_text(t, shape, sizeof shape);
  if (n != t->numel) {
    lp_errf(f->err, "%s: tensor '%s': shape %s has %lld elements, the buffer %lld", f->path,
            name, shape, (long long)t->numel, (long long)n);
    return LP_ERR_ARG;
  }
  if (!dtypes[t->dtype].is_float) {
    lp_errf(f->err, "%s: tensor '%s' is %s; only float tensors (F64, F32, F16, BF16, F8_E4M3, "
            "F8_E5M2) convert to float32", f->path, name, dtypes[t->dtype].name);
    return LP_ERR_UNSUPPORTED;
  }
  const lp_safetensors_info *s = NULL;
  int64_t block = opts && opts->block ? opts->block : LP_SAFETENSORS_BLOCK;
  lp_safetensors_file *sf = opts && opts->scale_file ? opts->scale_file : f;
  if (opts && opts->scale) {
    s = lp_safetensors_find(sf, opts->scale);
    if (!s && sf == f) {
      lp_errf(f->err, "%s: tensor '%s': its scale tensor '%s' is not in the file", f->path,
              name, opts->scale);
      return LP_ERR_ARG;
    }
    if (!s) {
      lp_errf(f->err, "%s: tensor '%s': its scale tensor '%s' is not in %s", f->path, name,
              opts->scale, sf->path);
      return LP_ERR_ARG;
    }
    if (block <= 0) {
      lp_errf(f->err, "%s: tensor '%s': block size %lld must be positive", f->path, name,
              (long long)block);
      return LP_ERR_ARG;
    }
    if (t->ndim != 2) {
      lp_errf(f->err, "%s: tensor '%s': block scales need a 2-D weight, it has shape %s",
              f->path, name, shape);
      return LP_ERR_ARG;
    }
    int64_t br = t->shape[0] / block + (t->shape[0] % block != 0);
    int64_t bc = t->shape[1] / block + (t->shape[1] % block != 0);
    if (s->ndim != 2 || s->shape[0] != br || s->shape[1] != bc) {
      char ss[160];
      shape_text(s, ss, sizeof ss);
      lp_errf(f->err, "%s: tensor '%s': scale '%s' has shape %s; blocks of %lld over %s need "
              "[%lld, %lld]", f->path, name, s->name, ss, (long long)block, shape,
              (long long)br, (long long)bc);
      return LP_ERR_ARG;
    }
    if (!dtypes[s->dtype].is_float) {
      lp_errf(f->err, "%s: tensor '%s': scale '%s' is %s, not a float dtype", f->path, name,
              s->name, dtypes[s->dtype].name);
      return LP_ERR_ARG;
    }
  }
  float *sc = NULL;
  if (s) {
    sc = lp_malloc((size_t)(s->numel ? s->numel : 1) * sizeof *sc);
    if (!sc) {
      lp_errf(f->err, "%s: out of memory reading scale '%s'", f->path, s->name);
      return LP_ERR_NOMEM;
    }
    lp_status st = read_convert(sf, s, sc);
    if (st != LP_OK) {
      if (sf != f) lp_errf(f->err, "%s", sf->err);
      lp_free(sc);
      return st;
    }
  }
  lp_status st = read_convert(f, t, dst);
  if (st == LP_OK && sc) {
    int64_t rows = t->shape[0], cols = t->shape[1], bc = s->shape[1];
    for (int64_t r = 0; r < rows; r++) {
      const float *srow = sc + (r / block) * bc;
      float *w = dst + r * cols;
      for (int64_t c = 0; c < cols; c++) w[c] *= srow[c / block];
    }
  }
  lp_free(sc);
  return st;
}

lp_status lp_safetensors_read_tensor(lp_safetensors_file *f, const char *name,
                                     const lp_safetensors_read_opts *opts, lp_tensor **out) {
  *out = NULL;
  f->err[0] = '\0';
  const lp_safetensors_info *t = lp_safetensors_find(f, name);
  if (!t) {
    lp_errf(f->err, "%s: no tensor '%s' in the file", f->path, name);
    return LP_ERR_ARG;
  }
  if (t->ndim > LP_TENSOR_MAXDIM) {
    lp_errf(f->err, "%s: tensor '%s' has %d dims; luapipe tensors have at most %d", f->path,
            name, t->ndim, LP_TENSOR_MAXDIM);
    return LP_ERR_UNSUPPORTED;
  }
  int64_t one = 1;
  lp_tensor *x = NULL;
  lp_status st = lp_tensor_empty(NULL, t->ndim ? t->ndim : 1, t->ndim ? t->shape : &one, &x);
  if (st != LP_OK) {
    lp_errf(f->err, "%s: %s for tensor '%s' (%lld elements)", f->path,
            st == LP_ERR_NOMEM ? "out of memory" : "no luapipe tensor fits", name,
            (long long)t->numel);
    return st;
  }
  st = lp_safetensors_read(f, name, opts, x->data, t->numel);
  if (st != LP_OK) {
    lp_tensor_free(x);
    return st;
  }
  *out = x;
  return LP_OK;
}
