/* test_data.c — lp_data: raw and llm.c token files, windows and the seeded
 * per-epoch order, (step, micro-batch, DP rank) -> sequences, and every bad
 * file's message. */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lp_data.h"

static char dir[64];

static int setup(void **state) {
  (void)state;
  strcpy(dir, "/tmp/lp_test_data_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd);
}

static const char *write_file(const char *name, const void *bytes, size_t n) {
  static char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  if (n) assert_int_equal(fwrite(bytes, 1, n, f), n);
  fclose(f);
  return path;
}

/* n tokens 0, 1, 2, ... as uint16 (or uint32), with an llm.c header when
 * version > 0 (count: the header's token count). */
static const char *token_file(const char *name, int n, int bytes, int version, int count) {
  size_t hdr = version ? 1024 : 0, len = hdr + (size_t)n * bytes;
  unsigned char *b = calloc(1, len);
  if (version) {
    int32_t h[3] = {20240520, version, count};
    memcpy(b, h, sizeof h);
  }
  for (int i = 0; i < n; i++) {
    uint32_t v = (uint32_t)i;
    memcpy(b + hdr + (size_t)i * bytes, &v, (size_t)bytes); /* little-endian host */
  }
  const char *p = write_file(name, b, len);
  free(b);
  return p;
}

static void test_raw_windows(void **state) {
  (void)state;
  const char *p = token_file("raw.bin", 21, 2, 0, 0);
  lp_data_opts o = {.seq_len = 4};
  lp_data *d = NULL;
  char err[LP_ERRLEN];
  assert_int_equal(lp_data_open(p, &o, &d, err), LP_OK);
  lp_data_info in;
  lp_data_info_of(d, &in);
  assert_string_equal(in.format, "raw");
  assert_int_equal(in.token_bytes, 2);
  assert_int_equal(in.tokens, 21);
  assert_int_equal(in.windows, 5); /* (21 - 1) / 4 */
  float x[4], y[4];
  /* sequence 7 = epoch 1, window 2: tokens 8..12 */
  assert_int_equal(lp_data_sequence(d, 7, x, y, err), LP_OK);
  for (int t = 0; t < 4; t++) {
    assert_true(x[t] == (float)(8 + t));
    assert_true(y[t] == (float)(9 + t));
  }
  lp_data_close(d);
}

static void test_llmc_uint32(void **state) {
  (void)state;
  const char *p = token_file("shard.bin", 70000 / 1000 + 30, 4, 2, 100);
  lp_data_opts o = {.seq_len = 9};
  lp_data *d = NULL;
  char err[LP_ERRLEN];
  assert_int_equal(lp_data_open(p, &o, &d, err), LP_OK);
  lp_data_info in;
  lp_data_info_of(d, &in);
  assert_string_equal(in.format, "llm.c");
  assert_int_equal(in.token_bytes, 4);
  assert_int_equal(in.data_offset, 1024);
  assert_int_equal(in.windows, 11);
  float x[9], y[9];
  assert_int_equal(lp_data_sequence(d, 3, x, y, err), LP_OK);
  assert_true(x[0] == 27.0f && y[8] == 36.0f);
  lp_data_close(d);
}

/* Shuffled: each epoch is a permutation of the windows, epochs differ,
 * the same seed gives the same order and another seed another. */
static void test_shuffle_permutation(void **state) {
  (void)state;
  const char *p = token_file("perm.bin", 1001, 2, 0, 0);
  lp_data_opts o = {.seq_len = 10, .shuffle = 1, .seed = 7};
  lp_data *d = NULL, *d2 = NULL, *d3 = NULL;
  char err[LP_ERRLEN];
  assert_int_equal(lp_data_open(p, &o, &d, err), LP_OK);
  assert_int_equal(lp_data_open(p, &o, &d2, err), LP_OK);
  o.seed = 8;
  assert_int_equal(lp_data_open(p, &o, &d3, err), LP_OK);
  int seen[100];
  int same_epoch = 1, same_seed = 1, other_seed = 1, identity = 1;
  for (int e = 0; e < 2; e++) {
    memset(seen, 0, sizeof seen);
    for (int w = 0; w < 100; w++) {
      int64_t v = lp_data_window(d, e * 100 + w);
      assert_true(v >= 0 && v < 100);
      seen[v]++;
      if (v != w) identity = 0;
      if (e == 1 && v != lp_data_window(d, w)) same_epoch = 0;
      if (v != lp_data_window(d2, e * 100 + w)) same_seed = 0;
      if (v != lp_data_window(d3, e * 100 + w)) other_seed = 0;
    }
    for (int w = 0; w < 100; w++) assert_int_equal(seen[w], 1);
  }
  assert_false(identity);
  assert_false(same_epoch);
  assert_true(same_seed);
  assert_false(other_seed);
  lp_data_close(d);
  lp_data_close(d2);
  lp_data_close(d3);
}

/* Data parallelism: the DP ranks' rows of a micro-batch are disjoint and,
 * together, the rows of dp = 1; consecutive steps continue the stream. */
static void test_batch_dp(void **state) {
  (void)state;
  const char *p = token_file("dp.bin", 4001, 2, 0, 0);
  lp_data_opts o = {.seq_len = 5};
  lp_data *d = NULL;
  char err[LP_ERRLEN];
  assert_int_equal(lp_data_open(p, &o, &d, err), LP_OK);
  float all_x[4 * 5], all_y[4 * 5], x[2 * 5], y[2 * 5];
  /* step 3, mb 1 of 2, 4 rows: sequences (2 * 2 + 1) * 4 = 20 .. 23 */
  assert_int_equal(lp_data_batch(d, 3, 1, 2, 4, 1, 0, all_x, all_y, err), LP_OK);
  assert_true(all_x[0] == 100.0f);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(lp_data_batch(d, 3, 1, 2, 4, 2, r, x, y, err), LP_OK);
    assert_memory_equal(x, all_x + r * 10, sizeof x);
    assert_memory_equal(y, all_y + r * 10, sizeof y);
  }
  assert_int_equal(lp_data_position(3, 2, 4), 16);
  assert_int_equal(lp_data_batch(d, 3, 1, 2, 4, 3, 0, x, y, err), LP_ERR_ARG);
  assert_non_null(strstr(err, "4 rows per micro-batch do not divide over 3 data-parallel ranks"));
  lp_data_close(d);
}

static void expect_open_error(const char *path, const lp_data_opts *o, lp_status want,
                              const char *text) {
  lp_data *d = (lp_data *)1;
  char err[LP_ERRLEN];
  assert_int_equal(lp_data_open(path, o, &d, err), want);
  assert_null(d);
  char full[512];
  snprintf(full, sizeof full, text, path);
  assert_string_equal(err, full);
}

static void test_bad_files(void **state) {
  (void)state;
  lp_data_opts o = {.seq_len = 8};
  char missing[128];
  snprintf(missing, sizeof missing, "%s/none.bin", dir);
  expect_open_error(missing, &o, LP_ERR_IO, "cannot open %s: No such file or directory");
  expect_open_error(write_file("odd.bin", "abc", 3), &o, LP_ERR_PARSE,
                    "%s: 3 bytes is not a whole number of 2-byte tokens");
  expect_open_error(token_file("short.bin", 8, 2, 0, 0), &o, LP_ERR_INVALID,
                    "%s: 8 tokens, too short for one sequence of 8 (it takes 9 tokens: the "
                    "inputs and the next token)");
  expect_open_error(token_file("hdr.bin", 50, 2, 1, 60), &o, LP_ERR_PARSE,
                    "%s: the llm.c header at byte offset 8 says 60 tokens (1144 bytes with the "
                    "header), the file has 1124 bytes");
  expect_open_error(token_file("ver.bin", 50, 2, 3, 50), &o, LP_ERR_PARSE,
                    "%s: llm.c shard version 3 at byte offset 4 (1 = uint16 tokens, 2 = uint32 "
                    "tokens)");
  int32_t magic = 20240520;
  expect_open_error(write_file("trunc.bin", &magic, 4), &o, LP_ERR_PARSE,
                    "%s: an llm.c shard header is 1024 bytes, the file has 4 bytes");
  o.token_bytes = 3;
  expect_open_error(missing, &o, LP_ERR_ARG, "%s: token size 3 bytes: it takes 2 (uint16) or 4 "
                                             "(uint32)");
}

static void test_token_beyond_vocab(void **state) {
  (void)state;
  const char *p = token_file("vocab.bin", 100, 2, 1, 100);
  lp_data_opts o = {.seq_len = 4, .vocab = 50};
  lp_data *d = NULL;
  char err[LP_ERRLEN], want[256];
  assert_int_equal(lp_data_open(p, &o, &d, err), LP_OK);
  float x[4], y[4];
  assert_int_equal(lp_data_sequence(d, 11, x, y, err), LP_OK); /* tokens 44..48 */
  assert_int_equal(lp_data_sequence(d, 12, x, y, err), LP_ERR_INVALID); /* 48..52 */
  snprintf(want, sizeof want, "%s: token 50 at byte offset %d is not below the vocabulary "
           "size 50", p, 1024 + 50 * 2);
  assert_string_equal(err, want);
  lp_data_close(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_raw_windows),        cmocka_unit_test(test_llmc_uint32),
      cmocka_unit_test(test_shuffle_permutation), cmocka_unit_test(test_batch_dp),
      cmocka_unit_test(test_bad_files),          cmocka_unit_test(test_token_beyond_vocab),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
