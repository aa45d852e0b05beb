/* test_safetensors.c — core/safetensors: the writer and the reader round
 * trip F32 bitwise; BF16 rounds to nearest even (hand-computed bit
 * patterns); F16, BF16 and F8_E4M3 decode to the values their formats
 * define; FP8 block scales multiply per block, partial blocks included;
 * a read touches only the bytes of the tensor asked for (and its scale);
 * every broken file is refused with one line naming the file and tensor;
 * the writer refuses bad input and leaves nothing behind; every
 * allocation failure returns LP_ERR_NOMEM without a leak. Small files are
 * written by hand into a temporary folder. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "lp_safetensors.h"
#include "lp_test_oom.h"

static char dir[64], path[128];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/lp_test_st_XXXXXX");
  if (!mkdtemp(dir)) return -1;
  snprintf(path, sizeof path, "%s/m.safetensors", dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char p[384];
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
    closedir(d);
  }
  rmdir(dir);
  return 0;
}

/* Writes a file: the 8-byte length `len` (the header's own length when
 * len < 0), the header text and data bytes. */
static void put_file(long long len, const char *header, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  uint64_t l = len < 0 ? strlen(header) : (uint64_t)len;
  for (int i = 0; i < 8; i++) fputc((int)((l >> (8 * i)) & 255), f);
  fputs(header, f);
  if (n) fwrite(data, 1, n, f);
  fclose(f);
}

/* Opens path and expects status st and the message "<path>: <tail>". */
static void expect_open_error(lp_status st, const char *tail) {
  lp_safetensors_file *f = (void *)1;
  char err[LP_ERRLEN] = "", want[LP_ERRLEN];
  lp_status got = lp_safetensors_open(path, &f, err);
  snprintf(want, sizeof want, "%s: %s", path, tail);
  if (strcmp(err, want) != 0) printf("  got:  %s\n  want: %s\n", err, want);
  assert_int_equal(got, st);
  assert_null(f);
  assert_string_equal(err, want);
}

static lp_safetensors_file *open_ok(void) {
  lp_safetensors_file *f = NULL;
  char err[LP_ERRLEN] = "";
  lp_status st = lp_safetensors_open(path, &f, err);
  if (st != LP_OK) printf("  %s\n", err);
  assert_int_equal(st, LP_OK);
  return f;
}

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static float fbits(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* ---- round trip ---------------------------------------------------------- */

static void test_round_trip_f32(void **state) {
  (void)state;
  float a[6] = {1.5f, -0.0f, 3e-41f /* subnormal */, INFINITY, -2.25f, 1e30f};
  float b[4] = {0.1f, 0.2f, 0.3f, fbits(0x7fc00001u) /* a NaN payload */};
  float c[1] = {42.0f};
  int64_t sa[2] = {2, 3}, sb[3] = {1, 2, 2};
  lp_safetensors_entry e[4] = {
      {"z.b", 3, sb, b}, {"a", 2, sa, a}, {"scalar", 0, NULL, c}, {"empty", 1, (int64_t[]){0}, NULL}};
  const char *meta[] = {"format", "pt", "note", "a \"quoted\" value"};
  lp_safetensors_write_opts o = {LP_SAFETENSORS_F32, 1, meta, 2};
  char err[LP_ERRLEN] = "";
  assert_int_equal(lp_safetensors_write(path, e, 4, &o, err), LP_OK);

  lp_safetensors_file *f = open_ok();
  assert_int_equal(lp_safetensors_count(f), 4);
  assert_int_equal(lp_safetensors_data_offset(f) % 8, 0);
  /* given order: data order follows it ("empty" has no bytes, at the end) */
  assert_string_equal(lp_safetensors_at(f, 0)->name, "z.b");
  assert_string_equal(lp_safetensors_at(f, 1)->name, "a");
  assert_string_equal(lp_safetensors_at(f, 2)->name, "scalar");
  assert_string_equal(lp_safetensors_metadata(f, "note"), "a \"quoted\" value");
  assert_string_equal(lp_safetensors_metadata(f, "format"), "pt");
  assert_null(lp_safetensors_metadata(f, "nothing"));
  assert_int_equal(lp_safetensors_metadata_count(f), 2);
  /* open read the header only */
  uint64_t hdr = lp_safetensors_data_offset(f);
  assert_int_equal(lp_safetensors_bytes_read(f), hdr);
  assert_int_equal(lp_safetensors_file_size(f), hdr + 4 * (6 + 4 + 1));

  const lp_safetensors_info *ia = lp_safetensors_find(f, "a");
  assert_non_null(ia);
  assert_int_equal(ia->dtype, LP_SAFETENSORS_F32);
  assert_int_equal(ia->ndim, 2);
  assert_int_equal(ia->shape[1], 3);
  assert_int_equal(ia->numel, 6);
  const lp_safetensors_info *is = lp_safetensors_find(f, "scalar");
  assert_int_equal(is->ndim, 0);
  assert_int_equal(is->numel, 1);

  float ra[6], rb[4], rc[1];
  assert_int_equal(lp_safetensors_read(f, "a", NULL, ra, 6), LP_OK);
  /* only a's 24 bytes were read */
  assert_int_equal(lp_safetensors_bytes_read(f), hdr + 24);
  assert_int_equal(lp_safetensors_read(f, "z.b", NULL, rb, 4), LP_OK);
  assert_int_equal(lp_safetensors_read(f, "scalar", NULL, rc, 1), LP_OK);
  assert_int_equal(lp_safetensors_read(f, "empty", NULL, NULL, 0), LP_OK);
  for (int i = 0; i < 6; i++) assert_int_equal(bits(ra[i]), bits(a[i]));
  for (int i = 0; i < 4; i++) assert_int_equal(bits(rb[i]), bits(b[i]));
  assert_int_equal(bits(rc[0]), bits(42.0f));
  assert_int_equal(lp_safetensors_bytes_read(f), hdr + 44);

  /* a tensor of the file as a luapipe tensor; a scalar becomes [1] */
  lp_tensor *t = NULL;
  assert_int_equal(lp_safetensors_read_tensor(f, "z.b", NULL, &t), LP_OK);
  assert_int_equal(t->ndim, 3);
  assert_int_equal(t->shape[2], 2);
  assert_int_equal(bits(t->data[2]), bits(0.3f));
  lp_tensor_free(t);
  assert_int_equal(lp_safetensors_read_tensor(f, "scalar", NULL, &t), LP_OK);
  assert_int_equal(t->ndim, 1);
  assert_int_equal(t->shape[0], 1);
  lp_tensor_free(t);

  /* a tensor missing, and a buffer of the wrong size */
  assert_int_equal(lp_safetensors_read(f, "layers.0.w", NULL, ra, 6), LP_ERR_ARG);
  char want[LP_ERRLEN];
  snprintf(want, sizeof want, "%s: no tensor 'layers.0.w' in the file", path);
  assert_string_equal(lp_safetensors_last_error(f), want);
  assert_int_equal(lp_safetensors_read(f, "a", NULL, ra, 5), LP_ERR_ARG);
  snprintf(want, sizeof want, "%s: tensor 'a': shape [2, 3] has 6 elements, the buffer 5", path);
  assert_string_equal(lp_safetensors_last_error(f), want);
  lp_safetensors_close(f);

  /* sorted by name without keep_order; the header is exactly the format's */
  o.keep_order = 0;
  o.n_metadata = 0;
  assert_int_equal(lp_safetensors_write(path, e, 2, &o, err), LP_OK);
  f = open_ok();
  assert_string_equal(lp_safetensors_at(f, 0)->name, "a");
  assert_string_equal(lp_safetensors_at(f, 1)->name, "z.b");
  lp_safetensors_close(f);
  FILE *fp = fopen(path, "rb");
  char buf[256] = "";
  assert_int_equal(fread(buf, 1, 8 + 128, fp), 8 + 128);
  fclose(fp);
  const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                  "\"z.b\":{\"dtype\":\"F32\",\"shape\":[1,2,2],\"data_offsets\":[24,40]}}";
  size_t hl = strlen(h), padded = (hl + 8 + 7) / 8 * 8 - 8;
  assert_int_equal((unsigned char)buf[0], padded);
  assert_memory_equal(buf + 8, h, hl);
  for (size_t i = hl; i < padded; i++) assert_int_equal(buf[8 + i], ' ');
}

/* ---- conversions ---------------------------------------------------------- */

static void test_bf16_rounding(void **state) {
  (void)state;
  /* value bits -> bf16 bits, by hand: keep the top 16 bits, add one when
   * the lower 16 are over half, or exactly half with the kept part odd */
  static const uint32_t in[] = {0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u,
                                0x3f807fffu, 0xbf80c000u, 0x7f7fffffu, 0x7f800000u,
                                0xff800000u, 0x80000000u, 0x00000001u, 0x7fc00000u,
                                0xffc12345u, 0x7f80ffffu, 0x00018000u};
  static const uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x3f80, 0xbf81, 0x7f80, 0x7f80,
                                  0xff80, 0x8000, 0x0000, 0x7fc0, 0x7fc0, 0x7fc0, 0x0002};
  size_t n = sizeof in / sizeof in[0];
  float x[16];
  for (size_t i = 0; i < n; i++) {
    x[i] = fbits(in[i]);
    if (lp_safetensors_f32_to_bf16(x[i]) != want[i])
      printf("  0x%08x -> 0x%04x, want 0x%04x\n", in[i], lp_safetensors_f32_to_bf16(x[i]), want[i]);
    assert_int_equal(lp_safetensors_f32_to_bf16(x[i]), want[i]);
  }
  /* the same through a BF16 file: its data bytes, then the values read back */
  int64_t shape[1] = {(int64_t)n};
  lp_safetensors_entry e = {"x", 1, shape, x};
  lp_safetensors_write_opts o = {LP_SAFETENSORS_BF16, 0, NULL, 0};
  char err[LP_ERRLEN];
  assert_int_equal(lp_safetensors_write(path, &e, 1, &o, err), LP_OK);
  lp_safetensors_file *f = open_ok();
  assert_int_equal(lp_safetensors_at(f, 0)->dtype, LP_SAFETENSORS_BF16);
  uint64_t off = lp_safetensors_data_offset(f);
  float back[16];
  assert_int_equal(lp_safetensors_read(f, "x", NULL, back, (int64_t)n), LP_OK);
  lp_safetensors_close(f);
  FILE *fp = fopen(path, "rb");
  unsigned char raw[64];
  fseek(fp, (long)off, SEEK_SET);
  assert_int_equal(fread(raw, 1, 2 * n, fp), 2 * n);
  fclose(fp);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(raw[2 * i] | raw[2 * i + 1] << 8, want[i]);
    assert_int_equal(bits(back[i]), (uint32_t)want[i] << 16);
  }
}

static void test_decode(void **state) {
  (void)state;
  /* F16: ones, the smallest subnormal, the largest finite, infinities */
  assert_true(lp_safetensors_f16_to_f32(0x3c00) == 1.0f);
  assert_true(lp_safetensors_f16_to_f32(0xc000) == -2.0f);
  assert_true(lp_safetensors_f16_to_f32(0x0001) == 0x1p-24f);
  assert_true(lp_safetensors_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
  assert_true(lp_safetensors_f16_to_f32(0x0400) == 0x1p-14f);
  assert_true(lp_safetensors_f16_to_f32(0x7bff) == 65504.0f);
  assert_true(lp_safetensors_f16_to_f32(0x3555) == 0x1.554p-2f);
  assert_true(lp_safetensors_f16_to_f32(0x7c00) == INFINITY);
  assert_true(lp_safetensors_f16_to_f32(0xfc00) == -INFINITY);
  assert_true(isnan(lp_safetensors_f16_to_f32(0x7e00)));
  assert_int_equal(bits(lp_safetensors_f16_to_f32(0x8000)), 0x80000000u);
  /* F8_E4M3 (fn): bias 7, 3 mantissa bits, S.1111.111 NaN, no infinity */
  assert_true(lp_safetensors_e4m3_to_f32(0x38) == 1.0f);
  assert_true(lp_safetensors_e4m3_to_f32(0xb8) == -1.0f);
  assert_true(lp_safetensors_e4m3_to_f32(0x7e) == 448.0f);
  assert_true(lp_safetensors_e4m3_to_f32(0x78) == 256.0f);
  assert_true(lp_safetensors_e4m3_to_f32(0x01) == 0x1p-9f);
  assert_true(lp_safetensors_e4m3_to_f32(0x07) == 7 * 0x1p-9f);
  assert_true(lp_safetensors_e4m3_to_f32(0x08) == 0x1p-6f);
  assert_true(lp_safetensors_e4m3_to_f32(0x3d) == 1.625f);
  assert_true(isnan(lp_safetensors_e4m3_to_f32(0x7f)));
  assert_true(isnan(lp_safetensors_e4m3_to_f32(0xff)));
  assert_int_equal(bits(lp_safetensors_e4m3_to_f32(0x80)), 0x80000000u);

  /* the dtypes read from a file: F16, BF16, F8_E4M3, F8_E5M2, F64 */
  unsigned char data[2 * 3 + 2 * 2 + 2 + 1 + 8];
  uint16_t h16[3] = {0x3c00, 0x0001, 0xfbff}, b16[2] = {0x3f81, 0xc040};
  double d = 0.1;
  memcpy(data, h16, 6);
  memcpy(data + 6, b16, 4);
  data[10] = 0x7e;
  data[11] = 0xb8;
  data[12] = 0x3c; /* e5m2: 0 01111 00 = 1.0 */
  memcpy(data + 13, &d, 8);
  put_file(-1,
           "{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
           "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[6,10]},"
           "\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[1,2],\"data_offsets\":[10,12]},"
           "\"e\":{\"dtype\":\"F8_E5M2\",\"shape\":[1],\"data_offsets\":[12,13]},"
           "\"d\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[13,21]}}",
           data, sizeof data);
  lp_safetensors_file *f = open_ok();
  float v[3];
  assert_int_equal(lp_safetensors_read(f, "h", NULL, v, 3), LP_OK);
  assert_true(v[0] == 1.0f && v[1] == 0x1p-24f && v[2] == -65504.0f);
  assert_int_equal(lp_safetensors_read(f, "b", NULL, v, 2), LP_OK);
  assert_true(v[0] == 1.0078125f && v[1] == -3.0f);
  assert_int_equal(lp_safetensors_read(f, "q", NULL, v, 2), LP_OK);
  assert_true(v[0] == 448.0f && v[1] == -1.0f);
  assert_int_equal(lp_safetensors_read(f, "e", NULL, v, 1), LP_OK);
  assert_true(v[0] == 1.0f);
  assert_int_equal(lp_safetensors_read(f, "d", NULL, v, 1), LP_OK);
  assert_true(v[0] == 0.1f);
  lp_safetensors_close(f);
}

/* ---- FP8 block scales ----------------------------------------------------- */

/* w: F8_E4M3 [3, 5] (value (r*5+c) % 8 + 0x38 .. : 1.0 + k/8), scale F32
 * [2, 3] for blocks of 2, an unrelated F32 tensor between them. */
static void put_fp8_file(void) {
  unsigned char data[15 + 24 + 8 + 4];
  for (int i = 0; i < 15; i++) data[i] = (unsigned char)(0x38 + i % 8);
  float s[6] = {1, 2, 4, 0.5f, 0.25f, 8}, other[2] = {7, 9};
  memcpy(data + 15, s, 24);
  memcpy(data + 39, other, 8);
  float ws[1] = {3};
  memcpy(data + 47, ws, 4);
  put_file(-1,
           "{\"__metadata__\":{\"format\":\"pt\"},"
           "\"layers.0.attn.wq.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[3,5],\"data_offsets\":[0,15]},"
           "\"layers.0.attn.wq.scale\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[15,39]},"
           "\"other\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[39,47]},"
           "\"wrong.scale\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[47,51]}}",
           data, sizeof data);
}

static void test_fp8_block_scale(void **state) {
  (void)state;
  put_fp8_file();
  lp_safetensors_file *f = open_ok();
  uint64_t hdr = lp_safetensors_bytes_read(f);
  float w[15];
  lp_safetensors_read_opts o = {"layers.0.attn.wq.scale", 2, NULL};
  assert_int_equal(lp_safetensors_read(f, "layers.0.attn.wq.weight", &o, w, 15), LP_OK);
  static const float s[2][3] = {{1, 2, 4}, {0.5f, 0.25f, 8}};
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 5; c++) {
      float q = 1.0f + (float)((r * 5 + c) % 8) / 8.0f;
      assert_true(w[r * 5 + c] == q * s[r / 2][c / 2]);
    }
  /* the weight's 15 bytes and its scale's 24, nothing of "other" */
  assert_int_equal(lp_safetensors_bytes_read(f), hdr + 15 + 24);
  /* the scale in another shard (written by luapipe's writer) */
  char p2[160];
  snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
  lp_safetensors_entry se = {"layers.0.attn.wq.scale", 2, (int64_t[]){2, 3}, &s[0][0]};
  char err[LP_ERRLEN];
  assert_int_equal(lp_safetensors_write(p2, &se, 1, NULL, err), LP_OK);
  lp_safetensors_file *g = NULL;
  assert_int_equal(lp_safetensors_open(p2, &g, err), LP_OK);
  uint64_t f0 = lp_safetensors_bytes_read(f), g0 = lp_safetensors_bytes_read(g);
  float w2[15];
  lp_safetensors_read_opts o2 = {"layers.0.attn.wq.scale", 2, g};
  assert_int_equal(lp_safetensors_read(f, "layers.0.attn.wq.weight", &o2, w2, 15), LP_OK);
  assert_memory_equal(w, w2, sizeof w);
  assert_int_equal(lp_safetensors_bytes_read(f) - f0, 15);
  assert_int_equal(lp_safetensors_bytes_read(g) - g0, 24);
  o2.scale = "other";
  assert_int_equal(lp_safetensors_read(f, "layers.0.attn.wq.weight", &o2, w2, 15), LP_ERR_ARG);
  char want[LP_ERRLEN];
  snprintf(want, sizeof want, "%s: tensor 'layers.0.attn.wq.weight': its scale tensor 'other' "
           "is not in %s", path, p2);
  assert_string_equal(lp_safetensors_last_error(f), want);
  lp_safetensors_close(g);
  /* no scale: the FP8 values as they are */
  assert_int_equal(lp_safetensors_read(f, "layers.0.attn.wq.weight", NULL, w, 15), LP_OK);
  assert_true(w[14] == 1.75f);

  /* a scale of the wrong block shape (default blocks of 128 need [1, 1]) */
  o.block = 0;
  assert_int_equal(lp_safetensors_read(f, "layers.0.attn.wq.weight", &o, w, 15), LP_ERR_ARG);
  snprintf(want, sizeof want, "%s: tensor 'layers.0.attn.wq.weight': scale "
           "'layers.0.attn.wq.scale' has shape [2, 3]; blocks of 128 over [3, 5] need [1, 1]",
           path);
  assert_string_equal(lp_safetensors_last_error(f), want);
  o = (lp_safetensors_read_opts){"wrong.scale", 4, NULL};
  assert_int_equal(lp_safetensors_read(f, "layers.0.attn.wq.weight", &o, w, 15), LP_ERR_ARG);
  snprintf(want, sizeof want, "%s: tensor 'layers.0.attn.wq.weight': scale 'wrong.scale' has "
           "shape [1]; blocks of 4 over [3, 5] need [1, 2]", path);
  assert_string_equal(lp_safetensors_last_error(f), want);
  /* the scale named is missing */
  o = (lp_safetensors_read_opts){"layers.0.attn.wq.weight_scale_inv", 2, NULL};
  assert_int_equal(lp_safetensors_read(f, "layers.0.attn.wq.weight", &o, w, 15), LP_ERR_ARG);
  snprintf(want, sizeof want, "%s: tensor 'layers.0.attn.wq.weight': its scale tensor "
           "'layers.0.attn.wq.weight_scale_inv' is not in the file", path);
  assert_string_equal(lp_safetensors_last_error(f), want);
  /* a scale on a weight that is not 2-D */
  o = (lp_safetensors_read_opts){"wrong.scale", 2, NULL};
  assert_int_equal(lp_safetensors_read(f, "other", &o, w, 2), LP_ERR_ARG);
  snprintf(want, sizeof want, "%s: tensor 'other': block scales need a 2-D weight, it has "
           "shape [2]", path);
  assert_string_equal(lp_safetensors_last_error(f), want);
  lp_safetensors_close(f);
}

/* ---- broken files ---------------------------------------------------------- */

static const char good_hdr[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";

static void test_bad_files(void **state) {
  (void)state;
  float two[2] = {1, 2};
  char m[LP_ERRLEN];

  FILE *fp = fopen(path, "wb");
  fwrite("\x10\0\0", 1, 3, fp);
  fclose(fp);
  expect_open_error(LP_ERR_PARSE, "the file is 3 bytes, too short for the 8-byte header length "
                    "(truncated?)");

  put_file(1000, good_hdr, two, 8);
  snprintf(m, sizeof m, "the header length 1000 runs beyond the file (%zu bytes; truncated, or "
           "not a safetensors file)", 8 + strlen(good_hdr) + 8);
  expect_open_error(LP_ERR_PARSE, m);
  /* the length of a huge header (1 << 60) */
  put_file(1LL << 60, good_hdr, two, 8);
  snprintf(m, sizeof m, "the header length 1152921504606846976 runs beyond the file (%zu bytes; "
           "truncated, or not a safetensors file)", 8 + strlen(good_hdr) + 8);
  expect_open_error(LP_ERR_PARSE, m);

  put_file(-1, "{\"w\": {\"dtype\": \"F32\",", NULL, 0);
  expect_open_error(LP_ERR_PARSE, "the header is not JSON: parse error: premature EOF (at byte 22 of 22)");
  put_file(-1, "not json at all", NULL, 0);
  expect_open_error(LP_ERR_PARSE, "the header is not JSON: lexical error: invalid string in "
                    "json text. (at byte 1 of 15)");
  put_file(-1, "[1, 2]", NULL, 0);
  expect_open_error(LP_ERR_PARSE, "the header is a JSON list, not an object");
  put_file(-1, "{\"w\": 3}", NULL, 0);
  expect_open_error(LP_ERR_PARSE, "the entry of 'w' is a number, not an object");
  put_file(0, "", NULL, 0);
  expect_open_error(LP_ERR_PARSE, "the header is empty (it must be a JSON object)");

  /* a truncated file: the data section shorter than the offsets say */
  put_file(-1, good_hdr, two, 6);
  expect_open_error(LP_ERR_PARSE, "tensor 'w': data_offsets [0, 8] run past the data section "
                    "(6 bytes after the header)");
  put_file(-1, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}", two, 8);
  expect_open_error(LP_ERR_PARSE, "tensor 'w': data_offsets [16, 24] run past the data section "
                    "(8 bytes after the header)");
  put_file(-1, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", two, 8);
  expect_open_error(LP_ERR_PARSE, "tensor 'w': shape [2, 3] of F32 needs 24 bytes, data_offsets "
                    "[0, 20] hold 20");
  put_file(-1, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", two, 8);
  expect_open_error(LP_ERR_PARSE, "tensor 'w': data_offsets [8, 0] run backwards");
  put_file(-1, "{\"w\":{\"dtype\":\"F12\",\"shape\":[2],\"data_offsets\":[0,8]}}", two, 8);
  expect_open_error(LP_ERR_PARSE, "tensor 'w': unknown dtype \"F12\" (luapipe knows F64, F32, "
                    "F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, U32, U16, U8, BOOL)");
  put_file(-1, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", NULL, 0);
  expect_open_error(LP_ERR_PARSE, "tensor 'w': no data_offsets");
  put_file(-1, "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", two, 8);
  expect_open_error(LP_ERR_PARSE, "tensor 'w': a shape entry is negative");
  put_file(-1, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", two, 8);
  expect_open_error(LP_ERR_PARSE, "tensor 'w': shape must be a list of integers");
  put_file(-1, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", two, 8);
  expect_open_error(LP_ERR_PARSE, "tensor 'w': data_offsets has more than two entries");
  put_file(-1, "{\"__metadata__\":{\"n\":1},\"w\":{}}", NULL, 0);
  expect_open_error(LP_ERR_PARSE, "__metadata__ 'n' is a number, not a string");
  put_file(-1, "{\"__metadata__\":{\"n\":{}}}", NULL, 0);
  expect_open_error(LP_ERR_PARSE, "__metadata__ 'n' is an object, not a string");

  /* overlapping, not covering, named twice */
  float four[4] = {1, 2, 3, 4};
  put_file(-1,
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
           four, 16);
  expect_open_error(LP_ERR_PARSE, "tensor 'b': data_offsets [8, 16] overlap tensor 'a' [0, 12]");
  put_file(-1,
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
           four, 16);
  expect_open_error(LP_ERR_PARSE, "bytes [4, 8) of the data section belong to no tensor (before "
                    "tensor 'b')");
  put_file(-1, good_hdr, four, 16);
  expect_open_error(LP_ERR_PARSE, "bytes [8, 16) of the data section belong to no tensor (after "
                    "the last one)");
  put_file(-1,
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           two, 8);
  expect_open_error(LP_ERR_PARSE, "tensor 'a' appears twice in the header");

  /* a file that is no file */
  lp_safetensors_file *f = NULL;
  char err[LP_ERRLEN], want[LP_ERRLEN];
  assert_int_equal(lp_safetensors_open(dir, &f, err), LP_ERR_IO);
  snprintf(want, sizeof want, "cannot read %s: it is a folder", dir);
  assert_string_equal(err, want);
  snprintf(want, sizeof want, "%s/none.safetensors", dir);
  assert_int_equal(lp_safetensors_open(want, &f, err), LP_ERR_IO);
  assert_non_null(strstr(err, "none.safetensors: No such file or directory"));

  /* no tensors at all: a file of the format (written, then read) */
  assert_int_equal(lp_safetensors_write(path, NULL, 0, NULL, err), LP_OK);
  f = open_ok();
  assert_int_equal(lp_safetensors_count(f), 0);
  assert_int_equal(lp_safetensors_file_size(f), 16); /* "{}" and 6 spaces */
  lp_safetensors_close(f);

  /* unknown fields are ignored (as the reference reader does); an integer
   * tensor is listed but not converted */
  put_file(-1,
           "{\"w\":{\"extra\":{\"a\":[1,{\"b\":null}]},\"dtype\":\"F32\",\"shape\":[2],"
           "\"data_offsets\":[0,8]},\"i\":{\"dtype\":\"I32\",\"shape\":[2],"
           "\"data_offsets\":[8,16]}}",
           four, 16);
  f = open_ok();
  float v[2];
  assert_int_equal(lp_safetensors_read(f, "w", NULL, v, 2), LP_OK);
  assert_true(v[1] == 2.0f);
  assert_int_equal(lp_safetensors_read(f, "i", NULL, v, 2), LP_ERR_UNSUPPORTED);
  snprintf(want, sizeof want, "%s: tensor 'i' is I32; only float tensors (F64, F32, F16, BF16, "
           "F8_E4M3, F8_E5M2) convert to float32", path);
  assert_string_equal(lp_safetensors_last_error(f), want);
  /* the file cut short after it was opened */
  assert_int_equal(truncate(path, (off_t)lp_safetensors_data_offset(f) + 4), 0);
  assert_int_equal(lp_safetensors_read(f, "w", NULL, v, 2), LP_ERR_IO);
  snprintf(want, sizeof want, "%s: the file ends at byte %llu, inside tensor 'w' (it was cut "
           "short after it was opened)", path,
           (unsigned long long)lp_safetensors_data_offset(f) + 4);
  assert_string_equal(lp_safetensors_last_error(f), want);
  lp_safetensors_close(f);
}

/* ---- writer refusals: one line, nothing left behind ------------------------ */

static int dir_entries(void) {
  int n = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static void expect_write_error(const lp_safetensors_entry *e, size_t n,
                               const lp_safetensors_write_opts *o, lp_status st,
                               const char *tail) {
  char err[LP_ERRLEN] = "", want[LP_ERRLEN];
  assert_int_equal(lp_safetensors_write(path, e, n, o, err), st);
  snprintf(want, sizeof want, "%s: %s", path, tail);
  assert_string_equal(err, want);
  assert_int_equal(dir_entries(), 0);
}

static void test_write_errors(void **state) {
  (void)state;
  float x[4] = {1, 2, 3, 4};
  int64_t s2[1] = {2}, neg[2] = {2, -1};
  lp_safetensors_entry twice[2] = {{"w", 1, s2, x}, {"w", 1, s2, x + 2}};
  expect_write_error(twice, 2, NULL, LP_ERR_ARG, "tensor 'w' is given twice");
  lp_safetensors_entry meta[1] = {{"__metadata__", 1, s2, x}};
  expect_write_error(meta, 1, NULL, LP_ERR_ARG,
                     "'__metadata__' cannot name a tensor (the format keeps it for metadata)");
  lp_safetensors_entry bad[1] = {{"w", 2, neg, x}};
  expect_write_error(bad, 1, NULL, LP_ERR_ARG, "tensor 'w': dim 1 is negative (-1)");
  lp_safetensors_entry nodata[1] = {{"w", 1, s2, NULL}};
  expect_write_error(nodata, 1, NULL, LP_ERR_ARG, "tensor 'w' has no data");
  lp_safetensors_write_opts o = {LP_SAFETENSORS_F16, 0, NULL, 0};
  expect_write_error(twice, 1, &o, LP_ERR_ARG, "luapipe writes F32 or BF16, not F16");
  const char *kv[] = {"k", "1", "k", "2"};
  o = (lp_safetensors_write_opts){LP_SAFETENSORS_F32, 0, kv, 2};
  expect_write_error(twice, 1, &o, LP_ERR_ARG, "__metadata__ 'k' is given twice");

  /* a refused write leaves an existing file as it was */
  char err[LP_ERRLEN];
  assert_int_equal(lp_safetensors_write(path, twice, 1, NULL, err), LP_OK);
  assert_int_equal(lp_safetensors_write(path, twice, 2, NULL, err), LP_ERR_ARG);
  lp_safetensors_file *f = open_ok();
  assert_int_equal(lp_safetensors_count(f), 1);
  lp_safetensors_close(f);
  unlink(path);
  /* a folder that does not exist */
  char p[256], want[LP_ERRLEN];
  snprintf(p, sizeof p, "%s/no/such/m.safetensors", dir);
  assert_int_equal(lp_safetensors_write(p, twice, 1, NULL, err), LP_ERR_IO);
  snprintf(want, sizeof want, "cannot create %s: there is no folder %s/no/such", p, dir);
  assert_string_equal(err, want);
  assert_int_equal(dir_entries(), 0);
}

/* ---- out of memory ----------------------------------------------------------- */

static lp_status oom_write(void) {
  float x[300];
  for (int i = 0; i < 300; i++) x[i] = (float)i / 7.0f;
  int64_t s[2] = {10, 30}, s1[1] = {3};
  lp_safetensors_entry e[2] = {{"b", 2, s, x}, {"a", 1, s1, x}};
  const char *kv[] = {"format", "pt"};
  lp_safetensors_write_opts o = {LP_SAFETENSORS_BF16, 0, kv, 1};
  char err[LP_ERRLEN];
  return lp_safetensors_write(path, e, 2, &o, err);
}

static lp_status oom_read(void) {
  lp_safetensors_file *f = NULL;
  char err[LP_ERRLEN];
  lp_status st = lp_safetensors_open(path, &f, err);
  if (st != LP_OK) return st;
  for (size_t i = 0; i < lp_safetensors_count(f) && st == LP_OK; i++) {
    lp_tensor *t = NULL;
    st = lp_safetensors_read_tensor(f, lp_safetensors_at(f, i)->name, NULL, &t);
    lp_tensor_free(t);
  }
  if (st == LP_OK) {
    float w[15];
    lp_safetensors_read_opts o = {"layers.0.attn.wq.scale", 2, NULL};
    st = lp_safetensors_read(f, "layers.0.attn.wq.weight", &o, w, 15);
  }
  lp_safetensors_close(f);
  return st;
}

static void test_out_of_memory(void **state) {
  (void)state;
  int points = lp_test_oom_points(oom_write, 100);
  printf("  writer: %d allocation failure points\n", points);
  assert_true(points >= 4);
  assert_int_equal(dir_entries(), 1); /* the last (successful) write only */
  put_fp8_file();
  points = lp_test_oom_points(oom_read, 200);
  printf("  reader: %d allocation failure points\n", points);
  assert_true(points >= 8);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_round_trip_f32, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bf16_rounding, setup, teardown),
      cmocka_unit_test_setup_teardown(test_decode, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fp8_block_scale, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_files, setup, teardown),
      cmocka_unit_test_setup_teardown(test_write_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_out_of_memory, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
