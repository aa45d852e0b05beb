/* comm.c — bench_comm: does communication progress while a rank computes?
 * Run under mpirun with 2 ranks (scripts/bench/comm does). Each rank
 * starts an all-to-all-v that sends --mb MB (default 4) to the other rank,
 * then either waits at once ("alone": the transfer time) or first computes
 * for --compute-ms ms (default 50) without calling into MPI and then waits
 * ("overlapped"). With progress (the comm thread) the overlapped wait is
 * close to 0; without it the transfer only moves inside the wait. Prints
 * medians over --reps runs (rank 0) and checks the data (exit 1 if wrong).
 * Also prints the CPU the process uses while a receive is pending and the
 * rank sleeps for 1 s (the progress thread's cost; 0 without it).
 * --link SPEC sets an emulated link (lp_link_parse syntax).
 * Usage: bench_comm [--mb N] [--compute-ms N] [--reps N] [--link SPEC] */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lp_comm.h"

#define CHECK(call)                                                            \
  do {                                                                         \
    lp_status st_ = (call);                                                    \
    if (st_ != LP_OK) {                                                        \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__,                  \
              lp_strerror(st_), lp_comm_last_error(lp_comm_world()));         \
      lp_comm_abort(NULL, 2);                                                  \
    }                                                                          \
  } while (0)

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Arithmetic (no MPI, no sleeping) for about `secs` seconds. */
static volatile double sink;
static void compute(double secs) {
  double t0 = lp_now(), x = 1.0;
  while (lp_now() - t0 < secs)
    for (int i = 0; i < 20000; i++) x = x * 1.0000001 + 1e-9;
  sink = x;
}

int main(int argc, char **argv) {
  if (lp_comm_mpi_init(&argc, &argv) != LP_OK) return 2;
  double mb = 4, compute_ms = 50;
  int reps = 7;
  const char *link = NULL;
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && strcmp(argv[i], "--mb") == 0) mb = atof(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--compute-ms") == 0)
      compute_ms = atof(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--reps") == 0) reps = atoi(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--link") == 0) link = argv[++i];
    else {
      fprintf(stderr, "bench_comm: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (reps < 1 || reps > 1000 || mb <= 0) {
    fprintf(stderr, "bench_comm: bad --reps or --mb\n");
    return 2;
  }
  lp_comm *c = lp_comm_world();
  int n = lp_comm_size(c), me = lp_comm_rank(c);
  if (n != 2) {
    fprintf(stderr, "bench_comm: run it on 2 ranks (got %d)\n", n);
    return 2;
  }
  if (link) {
    lp_link l;
    char err[LP_ERRLEN];
    if (lp_link_parse(link, &l, err) != LP_OK) {
      fprintf(stderr, "bench_comm: --link: %s\n", err);
      return 2;
    }
    lp_comm_set_link(c, &l);
  }
  size_t count = (size_t)(mb * 1e6 / sizeof(float));
  float *send = malloc(count * sizeof(float)), *recv = malloc(count * sizeof(float));
  double *alone = malloc((size_t)reps * sizeof(double));
  double *wait = malloc((size_t)reps * sizeof(double));
  if (!send || !recv || !alone || !wait) return 2;
  int other = 1 - me;
  size_t sc[2], sd[2] = {0, 0}, rc[2], rd[2] = {0, 0};
  sc[me] = rc[me] = 0;
  sc[other] = rc[other] = count;
  int bad = 0;
  for (int rep = 0; rep < reps; rep++) {
    for (int mode = 0; mode < 2; mode++) {
      for (size_t i = 0; i < count; i++) send[i] = (float)(me * 7 + rep + mode + (int)(i % 1000));
      memset(recv, 0, count * sizeof(float));
      CHECK(lp_comm_barrier(c, "bench"));
      lp_comm_req *r;
      double t0 = lp_now();
      CHECK(lp_comm_ialltoallv(c, send, sc, sd, recv, rc, rd, &r));
      if (mode == 1) compute(compute_ms * 1e-3);
      double t1 = lp_now();
      CHECK(lp_comm_wait(c, &r, "bench all-to-all-v"));
      double t2 = lp_now();
      if (mode == 0) alone[rep] = t2 - t0;
      else wait[rep] = t2 - t1;
      for (size_t i = 0; i < count; i += 997)
        if (recv[i] != (float)(other * 7 + rep + mode + (int)(i % 1000))) bad = 1;
    }
  }
  /* the progress thread's CPU while one receive is pending for 1 s */
  CHECK(lp_comm_barrier(c, "bench"));
  lp_comm_req *idle;
  CHECK(lp_comm_irecv(c, recv, 1, other, 99, &idle));
  struct timespec c0, c1;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  double w0 = lp_now();
  lp_sleep_until(w0 + 1.0);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  double idle_cpu = ((double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec)) /
                    (lp_now() - w0);
  CHECK(lp_comm_send(c, send, 1, other, 99, "bench"));
  CHECK(lp_comm_wait(c, &idle, "bench"));
  double a = median(alone, reps), w = median(wait, reps);
  if (me == 0) {
    char text[64];
    lp_link_format(lp_comm_link(c), text, sizeof text);
    printf("all-to-all-v %.1f MB each way, 2 ranks, link %s, progress thread %s\n",
           mb, text, lp_comm_progress_thread() ? "on" : "off");
    printf("  transfer alone:                 %8.2f ms\n", a * 1e3);
    printf("  wait after %.0f ms of compute:   %8.2f ms\n", compute_ms, w * 1e3);
    printf("  hidden under compute:           %8.1f %%\n",
           a > 0 ? 100.0 * (1.0 - (w < a ? w : a) / a) : 0.0);
    printf("  CPU while a receive is pending: %8.1f %% of a core\n", 100.0 * idle_cpu);
  }
  free(send);
  free(recv);
  free(alone);
  free(wait);
  if (bad) fprintf(stderr, "bench_comm: rank %d received wrong data\n", me);
  lp_comm_mpi_finalize();
  return bad;
}
