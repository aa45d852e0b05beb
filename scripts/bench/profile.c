/* profile.c — bench_profile: the profile trace reader's throughput and
 * memory. Generates a synthetic PyTorch-profiler trace of about MB
 * megabytes (the DeepSeek trace's layout: per kernel a cpu_op, its
 * cuda_runtime launch with a correlation id, the ac2g flow pair and the
 * kernel on one of 3 streams; a user annotation every 40 kernels; DeepEP
 * dispatch/combine kernels on the communication stream), reads and
 * analyses it (lp_profile_read + lp_profile_analyze, one thread), and
 * prints MB/s, GPU operations, and peak RSS (getrusage) over the RSS
 * before reading, per GPU operation.
 *
 *   bench_profile [--mb MB] [--keep] [--dir DIR] [--read FILE]
 *
 * The file goes to DIR (default $TMPDIR or /tmp) and is deleted after
 * (unless --keep). --read FILE times an existing trace instead. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "lp_profile.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long rss_kb(void) { /* current resident set, from /proc */
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, res = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
    fclose(f);
  }
  return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static long peak_kb(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

static const char *const kernels[] = {
    "void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>"
    "(dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel::Params)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3>)",
    "void flash::compute_attn_ws<Flash_fwd_kernel_traits<192, 128, 128, 12, 2, false, 1, "
    "cutlass::bfloat16_t, 128>, true, flash::SingleTileScheduler, flash::SeqLenTraits<true> >"
    "(flash::Params)",
    "void cuda::per_token_cast_to_fp8_with_channels<__nv_bfloat16, 128, false, 128, false>"
    "(__nv_bfloat16 const*, int, unsigned char*, float*, int, int, int, int, bool, float, "
    "__nv_fp8_interpretation_t)",
};

/* Writes the synthetic trace; returns the kernels written. */
static long generate(const char *path, double mb) {
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(1);
  }
  setvbuf(f, NULL, _IOFBF, 1 << 20);
  fprintf(f,
          "{\n  \"schemaVersion\": 1,\n  \"distributedInfo\": {\"backend\": \"nccl\", \"rank\": 0, "
          "\"world_size\": 64},\n  \"traceEvents\": [\n");
  long long target = (long long)(mb * 1e6), ts = 1740461679470000LL, gpu = ts + 500;
  long n = 0;
  long long ann_end = 0;
  int first = 1;
  while (ftell(f) < target) {
    if (n % 40 == 0) { /* a phase */
      ann_end = ts + 40 * 12;
      fprintf(f,
              "%s  {\n    \"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"%s(%c)\", "
              "\"pid\": 1166, \"tid\": 1166,\n    \"ts\": %lld, \"dur\": %lld,\n    \"args\": {\n"
              "      \"External id\": %ld,\"Ev Idx\": %ld\n    }\n  }",
              first ? "" : ",\n", (n / 40) % 2 ? "mlp" : "attn", "FBW"[(n / 80) % 3], ts,
              ann_end - ts, n, n);
      first = 0;
    }
    long corr = 44000 + n;
    int comm = n % 10 == 9;
    int stream = comm ? 27 : (n % 7 == 3 ? 23 : 7);
    const char *kname =
        comm ? (n % 20 == 9 ? "void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, "
                              "float*, long*, float*, dpsk::ep::internode::SourceMeta*, int4 "
                              "const*, float const*, long const*)"
                            : "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, "
                              "16, 24>(int4*, float*, int4 const*, float const*)")
             : kernels[n % 4];
    long long kdur = comm ? 300 : 5 + n % 50;
    fprintf(f,
            ",\n  {\n    \"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::mm\", "
            "\"pid\": 1166, \"tid\": 1166,\n    \"ts\": %lld, \"dur\": 8,\n    \"args\": {\n      "
            "\"External id\": %ld,\"Record function id\": 0, \"Ev Idx\": %ld, "
            "\"Sequence number\": %ld, \"Fwd thread id\": 0\n    }\n  }",
            ts, corr, n, n);
    fprintf(f,
            ",\n  {\n    \"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaLaunchKernel\", "
            "\"pid\": 1166, \"tid\": %d,\n    \"ts\": %lld, \"dur\": 4,\n    \"args\": {\n      "
            "\"External id\": %ld,\n      \"cbid\": 211, \"correlation\": %ld\n    }\n  }",
            n % 5 == 4 ? 2571 : 1166, ts + 2, corr, corr);
    fprintf(f,
            ",\n  {\n    \"ph\": \"s\", \"id\": %ld, \"pid\": 1166, \"tid\": 1166, \"ts\": %lld,\n"
            "    \"cat\": \"ac2g\", \"name\": \"ac2g\"\n  }",
            corr, ts + 2);
    if (gpu < ts + 10) gpu = ts + 10;
    long long kstart = comm ? ts + 20 : gpu;
    fprintf(f,
            ",\n  {\n    \"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"%s\", \"pid\": 0, "
            "\"tid\": %d,\n"
            "    \"ts\": %lld, \"dur\": %lld,\n    \"args\": {\n      \"External id\": %ld,\n      "
            "\"queued\": 0, \"device\": 0, \"context\": 1,\n      \"stream\": %d, "
            "\"correlation\": %ld,\n"
            "      \"registers per thread\": 110,\n      \"shared memory\": 0,\n      "
            "\"blocks per SM\": 0.15151516,\n      \"warps per SM\": 2.4242425,\n      "
            "\"grid\": [20, 1, 1],\n      "
            "\"block\": [512, 1, 1],\n      \"est. achieved occupancy %%\": 4\n    }\n  }",
            kname, stream, kstart, kdur, corr, stream, corr);
    fprintf(f,
            ",\n  {\n    \"ph\": \"f\", \"id\": %ld, \"pid\": 0, \"tid\": %d, \"ts\": %lld,\n"
            "    \"cat\": \"ac2g\", \"name\": \"ac2g\", \"bp\": \"e\"\n  }",
            corr, stream, kstart);
    if (!comm) gpu = kstart + kdur + 1;
    ts += 12;
    n++;
  }
  fprintf(f, "\n  ],\n  \"traceName\": \"synthetic\"\n}\n");
  if (fclose(f) != 0) {
    perror(path);
    exit(1);
  }
  return n;
}

static void measure(const char *path) {
  long rss0 = rss_kb();
  double t0 = now();
  lp_profile *p = lp_profile_new();
  if (!p || lp_profile_read(p, path) != LP_OK) {
    fprintf(stderr, "bench_profile: %s\n", p ? lp_profile_last_error(p) : "out of memory");
    exit(1);
  }
  double t1 = now();
  for (int i = 0; i < lp_profile_name_count(p); i++) {
    const char *name = lp_profile_name(p, i, NULL, NULL, NULL);
    if (strstr(name, "::internode::")) lp_profile_set_class(p, i, LP_PROFILE_COMM);
  }
  if (lp_profile_analyze(p) != LP_OK) {
    fprintf(stderr, "bench_profile: %s\n", lp_profile_last_error(p));
    exit(1);
  }
  double t2 = now();
  int64_t bytes, events;
  lp_profile_stats(p, &bytes, &events);
  const lp_profile_rank *r = lp_profile_rank_at(p, 0);
  long peak = peak_kb();
  double mbs = (double)bytes / 1e6;
  printf("trace: %.1f MB, %lld events, %lld GPU operations, %d phases\n", mbs, (long long)events,
         (long long)r->ops, r->nphases);
  printf("read: %.2f s, %.1f MB/s (one thread); analyse: %.2f s; total %.1f MB/s\n", t1 - t0,
         mbs / (t1 - t0), t2 - t1, mbs / (t2 - t0));
  printf("peak RSS %.1f MB (%.1f MB before reading): %.1f bytes per GPU operation\n",
         (double)peak / 1024, (double)rss0 / 1024,
         r->ops ? (double)(peak - rss0) * 1024 / (double)r->ops : 0.0);
  printf("figures: span %.3f ms, communication %.3f ms, overlapped %.1f%%\n",
         (double)r->span_ns / 1e6, (double)r->busy_ns[LP_PROFILE_COMM] / 1e6,
         r->busy_ns[LP_PROFILE_COMM]
             ? 100.0 * (double)r->overlap_ns / (double)r->busy_ns[LP_PROFILE_COMM]
             : 0.0);
  lp_profile_free(p);
}

int main(int argc, char **argv) {
  double mb = 1000;
  int keep = 0;
  const char *dir = getenv("TMPDIR"), *read_path = NULL;
  if (!dir || !*dir) dir = "/tmp";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc) mb = atof(argv[++i]);
    else if (strcmp(argv[i], "--keep") == 0) keep = 1;
    else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) dir = argv[++i];
    else if (strcmp(argv[i], "--read") == 0 && i + 1 < argc) read_path = argv[++i];
    else {
      fprintf(stderr, "usage: bench_profile [--mb MB] [--keep] [--dir DIR] [--read FILE]\n");
      return 2;
    }
  }
  if (read_path) {
    measure(read_path);
    return 0;
  }
  if (!(mb > 0)) {
    fprintf(stderr, "bench_profile: --mb must be positive\n");
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/luapipe_bench_profile_%ld.json", dir, (long)getpid());
  double t0 = now();
  long n = generate(path, mb);
  printf("generated %s: %ld kernels in %.1f s\n", path, n, now() - t0);
  measure(path);
  if (!keep) remove(path);
  return 0;
}
