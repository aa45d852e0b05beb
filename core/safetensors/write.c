/* write.c — the writer: checks every name, shape and metadata key first,
 * then builds the header (no spaces; padded with spaces so the data
 * starts at a multiple of 8, as the format allows) and streams the data
 * through lp_file (a temporary renamed over the path), so a failure
 * leaves nothing half-written. BF16 is rounded to nearest even in chunks;
 * memory beyond the caller's data is the header and one chunk. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lp_safetensors.h"

#define WR_CHUNK 65536 /* BF16 values converted per lp_file_put */

static int entry_by_name(const void *a, const void *b) {
  return strcmp((*(const lp_safetensors_entry *const *)a)->name,
                (*(const lp_safetensors_entry *const *)b)->name);
}

/* Checks one entry; its byte count into *bytes. */
static lp_status check_entry(const char *path, const lp_safetensors_entry *e, size_t es,
                             uint64_t *bytes, char *err) {
  if (!e->name || !e->name[0]) {
    lp_errf(err, "%s: a tensor has no name", path);
    return LP_ERR_ARG;
  }
  if (strcmp(e->name, "__metadata__") == 0) {
    lp_errf(err, "%s: '__metadata__' cannot name a tensor (the format keeps it for metadata)",
            path);
    return LP_ERR_ARG;
  }
  if (e->ndim < 0 || e->ndim > LP_SAFETENSORS_MAXDIM || (e->ndim > 0 && !e->shape)) {
    lp_errf(err, "%s: tensor '%s': %d dims (0 to %d allowed)", path, e->name, e->ndim,
            LP_SAFETENSORS_MAXDIM);
    return LP_ERR_ARG;
  }
  uint64_t numel = 1;
  for (int d = 0; d < e->ndim; d++) {
    if (e->shape[d] < 0) {
      lp_errf(err, "%s: tensor '%s': dim %d is negative (%lld)", path, e->name, d,
              (long long)e->shape[d]);
      return LP_ERR_ARG;
    }
    if (__builtin_mul_overflow(numel, (uint64_t)e->shape[d], &numel) || numel > INT64_MAX) {
      lp_errf(err, "%s: tensor '%s': the shape is too large", path, e->name);
      return LP_ERR_ARG;
    }
  }
  if (numel > 0 && !e->data) {
    lp_errf(err, "%s: tensor '%s' has no data", path, e->name);
    return LP_ERR_ARG;
  }
  *bytes = numel * es;
  return LP_OK;
}

lp_status lp_safetensors_write(const char *path, const lp_safetensors_entry *t, size_t n,
                               const lp_safetensors_write_opts *opts, char *err) {
  lp_safetensors_write_opts o = {0};
  if (opts) o = *opts;
  if (o.dtype != LP_SAFETENSORS_F32 && o.dtype != LP_SAFETENSORS_BF16) {
    lp_errf(err, "%s: luapipe writes F32 or BF16, not %s", path,
            lp_safetensors_dtype_name(o.dtype));
    return LP_ERR_ARG;
  }
  size_t es = lp_safetensors_dtype_size(o.dtype);
  lp_status st = LP_OK;
  const lp_safetensors_entry **order = NULL, **sorted = NULL;
  uint64_t *bytes = NULL;
  uint16_t *chunk = NULL;
  lp_buf hdr;
  lp_buf_init(&hdr);
  lp_file *file = NULL;

  order = lp_malloc((n ? n : 1) * sizeof *order);
  sorted = lp_malloc((n ? n : 1) * sizeof *sorted);
  bytes = lp_malloc((n ? n : 1) * sizeof *bytes);
  if (!order || !sorted || !bytes) goto nomem;
  for (size_t i = 0; i < n; i++) {
    LP_CHECK_GOTO(check_entry(path, &t[i], es, &bytes[i], err), st, done);
    sorted[i] = &t[i];
  }
  /* names unique (sorted by name, neighbours differ) */
  if (n > 1) qsort(sorted, n, sizeof *sorted, entry_by_name);
  for (size_t i = 1; i < n; i++)
    if (strcmp(sorted[i]->name, sorted[i - 1]->name) == 0) {
      lp_errf(err, "%s: tensor '%s' is given twice", path, sorted[i]->name);
      st = LP_ERR_ARG;
      goto done;
    }
  for (size_t i = 0; i < o.n_metadata; i++) {
    const char *k = o.metadata[2 * i], *v = o.metadata[2 * i + 1];
    if (!k || !v) {
      lp_errf(err, "%s: __metadata__ entry %zu has no %s", path, i + 1, k ? "value" : "key");
      st = LP_ERR_ARG;
      goto done;
    }
    for (size_t j = 0; j < i; j++)
      if (strcmp(o.metadata[2 * j], k) == 0) {
        lp_errf(err, "%s: __metadata__ '%s' is given twice", path, k);
        st = LP_ERR_ARG;
        goto done;
      }
  }
  for (size_t i = 0; i < n; i++) order[i] = o.keep_order ? &t[i] : sorted[i];

  /* the header */
  lp_buf_puts(&hdr, "{");
  if (o.n_metadata) {
    lp_buf_puts(&hdr, "\"__metadata__\":{");
    for (size_t i = 0; i < o.n_metadata; i++) {
      if (i) lp_buf_puts(&hdr, ",");
      lp_buf_json_string(&hdr, o.metadata[2 * i]);
      lp_buf_puts(&hdr, ":");
      lp_buf_json_string(&hdr, o.metadata[2 * i + 1]);
    }
    lp_buf_puts(&hdr, "}");
  }
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    const lp_safetensors_entry *e = order[i];
    uint64_t b = bytes[e - t];
    if (i || o.n_metadata) lp_buf_puts(&hdr, ",");
    lp_buf_json_string(&hdr, e->name);
    lp_buf_printf(&hdr, ":{\"dtype\":\"%s\",\"shape\":[", lp_safetensors_dtype_name(o.dtype));
    for (int d = 0; d < e->ndim; d++)
      lp_buf_printf(&hdr, "%s%lld", d ? "," : "", (long long)e->shape[d]);
    lp_buf_printf(&hdr, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                  (unsigned long long)(off + b));
    off += b;
  }
  lp_buf_puts(&hdr, "}");
  while (!hdr.failed && (8 + hdr.len) % 8 != 0) lp_buf_puts(&hdr, " ");
  if (hdr.failed) goto nomem;
  if (o.dtype == LP_SAFETENSORS_BF16 && !(chunk = lp_malloc(WR_CHUNK * sizeof *chunk)))
    goto nomem;

  /* the file */
  LP_CHECK_GOTO(lp_file_begin(path, &file, err), st, done);
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
  lp_file_put(file, len8, 8);
  lp_file_put(file, hdr.data, hdr.len);
  for (size_t i = 0; i < n; i++) {
    const lp_safetensors_entry *e = order[i];
    size_t count = (size_t)(bytes[e - t] / es);
    if (o.dtype == LP_SAFETENSORS_F32) {
      lp_file_put(file, e->data, count * 4);
      continue;
    }
    for (size_t j = 0; j < count; j += WR_CHUNK) {
      size_t k = count - j < WR_CHUNK ? count - j : WR_CHUNK;
      for (size_t q = 0; q < k; q++) chunk[q] = lp_safetensors_f32_to_bf16(e->data[j + q]);
      lp_file_put(file, chunk, k * 2);
    }
  }
  st = lp_file_commit(file, err);
  file = NULL;
  goto done;
nomem:
  lp_errf(err, "%s: out of memory writing the file (nothing was written)", path);
  st = LP_ERR_NOMEM;
done:
  if (file) lp_file_abort(file);
  lp_buf_free(&hdr);
  lp_free(chunk);
  lp_free(bytes);
  lp_free(sorted);
  lp_free(order);
  return st;
}
