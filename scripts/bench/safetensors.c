/* safetensors.c — bench_safetensors: the safetensors reader's conversion
 * speed on one thread (one rank). Writes a BF16 file of about MB megabytes
 * with luapipe's writer (TENSORS tensors of [rows, 4096], like a model's
 * weights), then opens it and reads every tensor, one at a time into one
 * float32 buffer (the per-rank loader's pattern: memory is one tensor),
 * and prints GB/s of file bytes converted (1 GB = 1e9 bytes), the bytes
 * read, and the peak RSS growth over the buffer. The file is read right
 * after it was written, so it comes from the page cache: the figure is the
 * reader's (pread + conversion), not the disk's; the CPU time beside the
 * wall time tells what it costs where other processes share the cores.
 * Values are checked
 * against the writer's rounding of the source (a #wrong column).
 *
 *   bench_safetensors [--mb MB] [--tensors N] [--dir DIR] [--keep]
 *
 * The file goes to DIR (default $TMPDIR or /tmp) and is deleted after
 * (unless --keep). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "lp_safetensors.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void) { /* this process's CPU time: the cost on a shared machine */
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long peak_rss_kb(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

int main(int argc, char **argv) {
  double mb = 1000;
  int ntensors = 64, keep = 0;
  const char *dir = getenv("TMPDIR");
  if (!dir || !*dir) dir = "/tmp";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc) mb = atof(argv[++i]);
    else if (strcmp(argv[i], "--tensors") == 0 && i + 1 < argc) ntensors = atoi(argv[++i]);
    else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) dir = argv[++i];
    else if (strcmp(argv[i], "--keep") == 0) keep = 1;
    else {
      fprintf(stderr, "usage: bench_safetensors [--mb MB] [--tensors N] [--dir DIR] [--keep]\n");
      return 2;
    }
  }
  if (mb <= 0 || ntensors < 1) {
    fprintf(stderr, "bench_safetensors: --mb and --tensors must be positive\n");
    return 2;
  }
  const int64_t cols = 4096;
  int64_t rows = (int64_t)(mb * 1e6 / ntensors / 2 / (double)cols);
  if (rows < 1) rows = 1;
  size_t numel = (size_t)(rows * cols);
  char path[4096];
  snprintf(path, sizeof path, "%s/luapipe_bench_%ld.safetensors", dir, (long)getpid());

  /* one source tensor, written under every name */
  float *src = malloc(numel * sizeof *src);
  if (!src) return 1;
  uint64_t x = 88172645463325252ULL;
  for (size_t i = 0; i < numel; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    src[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * 0.08f;
  }
  lp_safetensors_entry *e = calloc((size_t)ntensors, sizeof *e);
  char (*names)[64] = calloc((size_t)ntensors, sizeof *names);
  int64_t shape[2] = {rows, cols};
  for (int i = 0; i < ntensors; i++) {
    snprintf(names[i], sizeof names[i], "layers.%d.ffn.experts.%d.w1.weight", i / 8, i % 8);
    e[i] = (lp_safetensors_entry){names[i], 2, shape, src};
  }
  char err[LP_ERRLEN];
  lp_safetensors_write_opts wo = {LP_SAFETENSORS_BF16, 1, NULL, 0};
  double t0 = now();
  if (lp_safetensors_write(path, e, (size_t)ntensors, &wo, err) != LP_OK) {
    fprintf(stderr, "bench_safetensors: %s\n", err);
    return 1;
  }
  double tw = now() - t0;

  /* the expected values: the source rounded to BF16 */
  float *want = malloc(numel * sizeof *want);
  float *buf = malloc(numel * sizeof *buf);
  if (!want || !buf) return 1;
  for (size_t i = 0; i < numel; i++) want[i] = lp_safetensors_bf16_to_f32(lp_safetensors_f32_to_bf16(src[i]));
  free(src);
  memset(buf, 0, numel * sizeof *buf); /* touch it before measuring RSS */
  long rss0 = peak_rss_kb();

  lp_safetensors_file *f = NULL;
  double best = 1e30, best_cpu = 1e30;
  long wrong = 0;
  uint64_t file_bytes = 0, read_bytes = 0;
  for (int rep = 0; rep < 3; rep++) {
    t0 = now();
    double c0 = cpu_now();
    if (lp_safetensors_open(path, &f, err) != LP_OK) {
      fprintf(stderr, "bench_safetensors: %s\n", err);
      return 1;
    }
    for (size_t i = 0; i < lp_safetensors_count(f); i++) {
      const lp_safetensors_info *t = lp_safetensors_at(f, i);
      if (lp_safetensors_read(f, t->name, NULL, buf, t->numel) != LP_OK) {
        fprintf(stderr, "bench_safetensors: %s\n", lp_safetensors_last_error(f));
        return 1;
      }
      if (rep == 0 && memcmp(buf, want, numel * sizeof *buf) != 0)
        for (size_t k = 0; k < numel; k++) wrong += buf[k] != want[k];
    }
    double tr = now() - t0, tc = cpu_now() - c0;
    if (tr < best) best = tr;
    if (tc < best_cpu) best_cpu = tc;
    file_bytes = lp_safetensors_file_size(f);
    read_bytes = lp_safetensors_bytes_read(f);
    lp_safetensors_close(f);
  }
  long rss1 = peak_rss_kb();
  if (!keep) unlink(path);
  printf("file: %s, %.3f GB BF16, %d tensors of [%lld, %lld] (%.1f MB float32 each)%s\n", path,
         (double)file_bytes / 1e9, ntensors, (long long)rows, (long long)cols,
         (double)numel * 4 / 1e6, keep ? "" : " (deleted)");
  printf("write: %.3f s, %.2f GB/s (float32 in, BF16 out, fsync included)\n", tw,
         (double)file_bytes / 1e9 / tw);
  printf("read: %.3f s, %.2f GB/s BF16 in, %.2f GB/s float32 out (best of 3, page cache)\n",
         best, (double)file_bytes / 1e9 / best, 2.0 * (double)file_bytes / 1e9 / best);
  printf("read CPU time: %.3f s, %.2f GB/s BF16 in per CPU second (what one rank costs on an "
         "idle core)\n", best_cpu, (double)file_bytes / 1e9 / best_cpu);
  printf("bytes read: %llu of %llu; peak RSS growth while reading: %.1f MB; #wrong %ld\n",
         (unsigned long long)read_bytes, (unsigned long long)file_bytes,
         (double)(rss1 - rss0) / 1e3, wrong);
  free(want);
  free(buf);
  free(e);
  free(names);
  return wrong ? 1 : 0;
}
