/* fuzz_profile.c — the profile trace reader, lp_profile_read and
 * lp_profile_analyze, on the input written to a file. Input: one flag
 * byte, then the file. Flag bit 0 set: the file is written gzip-compressed
 * under a name ending in .json.gz, so that mutations reach the JSON reader
 * behind zlib; bit 1: every odd-numbered distinct name is classified as
 * communication, every third as memory (the analysis's other paths).
 * Contract: LP_OK, or an error status with one line of text that names the
 * file; after a successful analysis, every figure is consistent (unions
 * within the span, overlap within both classes, idle and exposed not
 * negative, phase times not negative). Memory stays bounded by the input
 * (libFuzzer's -rss_limit_mb). */
#include <zlib.h>

#include "fuzz.h"
#include "lp_profile.h"

static void check_rank(const lp_profile_rank *r) {
  const int64_t *b = r->busy_ns;
  if (r->span_ns < 0 || r->idle_ns < 0 || r->idle_ns > r->span_ns)
    FUZZ_FAIL("rank %d: span %lld, idle %lld", r->rank, (long long)r->span_ns,
              (long long)r->idle_ns);
  for (int c = 0; c < LP_PROFILE_NBUSY; c++)
    if (b[c] < 0 || b[c] > r->span_ns)
      FUZZ_FAIL("rank %d: busy[%d] %lld outside the span %lld", r->rank, c, (long long)b[c],
                (long long)r->span_ns);
  if (r->overlap_ns < 0 || r->overlap_ns > b[LP_PROFILE_COMM] || r->overlap_ns > b[LP_PROFILE_COMPUTE])
    FUZZ_FAIL("rank %d: overlap %lld", r->rank, (long long)r->overlap_ns);
  if (r->exposed_ns != b[LP_PROFILE_COMM] - r->overlap_ns)
    FUZZ_FAIL("rank %d: exposed %lld", r->rank, (long long)r->exposed_ns);
  if (r->comm_ops_overlap_ns < 0 || r->comm_ops_overlap_ns > r->comm_ops_ns ||
      r->comm_ops_ns < b[LP_PROFILE_COMM])
    FUZZ_FAIL("rank %d: per-operation communication", r->rank);
  for (int s = 0; s < r->nstreams; s++)
    for (int c = 0; c < LP_PROFILE_NBUSY; c++)
      if (r->streams[s].busy_ns[c] < 0 || r->streams[s].busy_ns[c] > b[c] + (c ? 0 : r->span_ns))
        FUZZ_FAIL("rank %d: stream %d busy[%d]", r->rank, s, c);
  for (int k = 0; k < r->nphases; k++)
    if (r->phases[k].gpu_ns < 0 || r->phases[k].cpu_dur_ns < 0 || r->phases[k].ops < 0)
      FUZZ_FAIL("rank %d: phase %d", r->rank, k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int flag = data[0];
  data++;
  size--;
  char path[600];
  snprintf(path, sizeof path, "%s/trace%s", fuzz_tmpdir(), (flag & 1) ? ".json.gz" : ".json");
  if (flag & 1) {
    gzFile gz = gzopen(path, "wb1");
    if (!gz) abort();
    if (size && gzwrite(gz, data, (unsigned)size) != (int)size) abort();
    gzclose(gz);
  } else {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
  }
  lp_profile *p = lp_profile_new();
  if (!p) abort();
  lp_status st = lp_profile_read(p, path);
  if (st == LP_OK) {
    if (flag & 2)
      for (int i = 0; i < lp_profile_name_count(p); i++)
        lp_profile_set_class(p, i, i % 3 == 2 ? LP_PROFILE_MEMORY
                                   : i % 2    ? LP_PROFILE_COMM
                                              : LP_PROFILE_COMPUTE);
    st = lp_profile_analyze(p);
    if (st == LP_OK) {
      for (int i = 0; i < lp_profile_rank_count(p); i++) check_rank(lp_profile_rank_at(p, i));
    }
  }
  if (st != LP_OK) {
    const char *msg = lp_profile_last_error(p);
    if (!msg[0]) FUZZ_FAIL("status %d without a message", (int)st);
    if (!strstr(msg, path)) FUZZ_FAIL("the message does not name the file: %s", msg);
    if (strchr(msg, '\n')) FUZZ_FAIL("more than one line: %s", msg);
    fuzz_check_message(msg, data, size);
  }
  lp_profile_free(p);
  remove(path);
  return 0;
}
