/* fuzz_safetensors.c — the safetensors reader (core/safetensors). Input:
 * the file's bytes. Contract: open succeeds, or fails with LP_ERR_PARSE /
 * LP_ERR_NOMEM and one line that names the file. An opened file's
 * tensors cover its data section exactly, open read the header only, and
 * each read adds exactly its tensor's bytes (and its scale's) to
 * bytes_read; float tensors read, integer ones are refused with
 * LP_ERR_UNSUPPORTED; a block-scaled read of a 2-D tensor with any other
 * tensor as its scale succeeds or refuses (LP_ERR_ARG), never more. Then
 * every float tensor is written back as F32 and read again: bitwise the
 * same. Seeds in tests/fuzz/corpus/safetensors/ (small files made by
 * luapipe's writer and by hand, broken in the ways the C tests name). */
#include <stdint.h>

#include "fuzz.h"
#include "lp_safetensors.h"

static char path[512], back[512];

static const uint8_t *cur_in;
static size_t cur_size;

static void check_message(lp_status st, const char *msg, const char *file) {
  if (st == LP_ERR_NOMEM) return;
  if (strncmp(msg, file, strlen(file)) != 0 && !strstr(msg, file))
    FUZZ_FAIL("status %d, message does not name %s: '%s'", (int)st, file, msg);
  if (strchr(msg, '\n')) FUZZ_FAIL("message is more than one line: '%s'", msg);
  fuzz_check_message(msg, cur_in, cur_size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  cur_in = data;
  cur_size = size;
  if (!path[0]) {
    snprintf(path, sizeof path, "%s/in.safetensors", fuzz_tmpdir());
    snprintf(back, sizeof back, "%s/back.safetensors", fuzz_tmpdir());
  }
  FILE *fp = fopen(path, "wb");
  if (!fp || (size && fwrite(data, 1, size, fp) != size) || fclose(fp) != 0) abort();

  lp_safetensors_file *f = NULL;
  char err[LP_ERRLEN] = "";
  lp_status st = lp_safetensors_open(path, &f, err);
  if (st != LP_OK) {
    if (f) FUZZ_FAIL("a failed open returned a file");
    if (st != LP_ERR_PARSE && st != LP_ERR_NOMEM) FUZZ_FAIL("open: status %d: %s", (int)st, err);
    check_message(st, err, path);
    return 0;
  }
  uint64_t off = lp_safetensors_data_offset(f), covered = 0;
  if (lp_safetensors_bytes_read(f) != off) FUZZ_FAIL("open read more than the header");
  size_t n = lp_safetensors_count(f);
  for (size_t i = 0; i < n; i++) {
    const lp_safetensors_info *t = lp_safetensors_at(f, i);
    if (t->begin != covered) FUZZ_FAIL("tensor '%s' does not start where the last ended", t->name);
    covered = t->end;
    if (lp_safetensors_find(f, t->name) != t) FUZZ_FAIL("find('%s') is another tensor", t->name);
  }
  if (off + covered != size) FUZZ_FAIL("tensors cover %llu of %llu data bytes",
                                       (unsigned long long)covered,
                                       (unsigned long long)(size - off));

  /* every tensor converted; the float ones kept for the write-back */
  float **vals = calloc(n ? n : 1, sizeof *vals);
  lp_safetensors_entry *e = calloc(n ? n : 1, sizeof *e);
  if (!vals || !e) abort();
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) {
    const lp_safetensors_info *t = lp_safetensors_at(f, i);
    float *v = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *v);
    if (!v) abort();
    uint64_t before = lp_safetensors_bytes_read(f);
    st = lp_safetensors_read(f, t->name, NULL, v, t->numel);
    if (st == LP_ERR_UNSUPPORTED) {
      check_message(st, lp_safetensors_last_error(f), path);
      free(v);
      continue;
    }
    if (st != LP_OK) FUZZ_FAIL("read '%s': %s", t->name, lp_safetensors_last_error(f));
    if (lp_safetensors_bytes_read(f) - before != t->end - t->begin)
      FUZZ_FAIL("reading '%s' read %llu bytes, it has %llu", t->name,
                (unsigned long long)(lp_safetensors_bytes_read(f) - before),
                (unsigned long long)(t->end - t->begin));
    vals[kept] = v;
    e[kept] = (lp_safetensors_entry){t->name, t->ndim, t->shape, v};
    kept++;
  }
  /* block scales: the first 2-D tensors, with each of the first tensors as scale */
  int64_t block = 1 + (int64_t)(size % 3);
  for (size_t i = 0; i < n && i < 4; i++) {
    const lp_safetensors_info *t = lp_safetensors_at(f, i);
    if (t->ndim != 2) continue;
    float *v = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *v);
    if (!v) abort();
    for (size_t j = 0; j < n && j < 4; j++) {
      lp_safetensors_read_opts o = {lp_safetensors_at(f, j)->name, block, NULL};
      st = lp_safetensors_read(f, t->name, &o, v, t->numel);
      if (st != LP_OK && st != LP_ERR_ARG && st != LP_ERR_UNSUPPORTED)
        FUZZ_FAIL("scaled read '%s': %s", t->name, lp_safetensors_last_error(f));
      if (st != LP_OK) check_message(st, lp_safetensors_last_error(f), path);
    }
    free(v);
  }

  /* written back as F32 (in the file's order), read again bitwise */
  lp_safetensors_write_opts wo = {LP_SAFETENSORS_F32, 1, NULL, 0};
  st = lp_safetensors_write(back, e, kept, &wo, err);
  if (st != LP_OK) FUZZ_FAIL("writing back: %s", err);
  lp_safetensors_file *g = NULL;
  if (lp_safetensors_open(back, &g, err) != LP_OK) FUZZ_FAIL("own file does not open: %s", err);
  if (lp_safetensors_count(g) != kept) FUZZ_FAIL("own file has another tensor count");
  for (size_t i = 0; i < kept; i++) {
    const lp_safetensors_info *t = lp_safetensors_at(g, i);
    if (strcmp(t->name, e[i].name) != 0) FUZZ_FAIL("own file reorders '%s'", e[i].name);
    float *v = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *v);
    if (!v) abort();
    if (lp_safetensors_read(g, t->name, NULL, v, t->numel) != LP_OK)
      FUZZ_FAIL("own file: %s", lp_safetensors_last_error(g));
    if (memcmp(v, vals[i], (size_t)t->numel * sizeof *v) != 0)
      FUZZ_FAIL("tensor '%s' differs after writing back", t->name);
    free(v);
  }
  lp_safetensors_close(g);
  for (size_t i = 0; i < kept; i++) free(vals[i]);
  free(vals);
  free(e);
  lp_safetensors_close(f);
  return 0;
}
