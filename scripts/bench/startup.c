/* startup.c — bench_startup: the start-up cost of a program, measured from
 * outside. Runs PROG ARGS... --runs times (after one untimed warm-up run),
 * each with stdin, stdout and stderr on /dev/null, and prints one line:
 *
 *   runs=N median_ms=M min_ms=A max_ms=B median_rss_mb=R max_rss_mb=X rc=C
 *
 * where ms is the wall time from fork to the child's exit (CLOCK_MONOTONIC)
 * and rss the child's maximum resident set (wait4's ru_maxrss). rc is the
 * last run's exit status (a run that fails or is killed is reported, the
 * figures are still printed; exit 1 then). scripts/bench/startup runs it.
 * Usage: bench_startup [--runs N] PROG [ARGS...] */
#define _DEFAULT_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One run of argv: wall ms and max RSS in MB; the wait status in *status.
 * -1 when fork fails. */
static int run_once(char **argv, double *ms, double *rss_mb, int *status) {
  double t0 = now_ms();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, 0), dup2(null, 1), dup2(null, 2);
      if (null > 2) close(null);
    }
    execvp(argv[0], argv);
    _exit(127);
  }
  struct rusage ru;
  memset(&ru, 0, sizeof ru);
  if (wait4(pid, status, 0, &ru) != pid) return -1;
  *ms = now_ms() - t0;
  *rss_mb = ru.ru_maxrss / 1024.0; /* KiB on Linux */
  return 0;
}

int main(int argc, char **argv) {
  int runs = 15, i = 1;
  if (i + 1 < argc && !strcmp(argv[i], "--runs")) {
    runs = atoi(argv[i + 1]);
    i += 2;
  }
  if (i >= argc || runs < 1) {
    fprintf(stderr, "usage: bench_startup [--runs N] PROG [ARGS...]\n");
    return 2;
  }
  char **cmd = argv + i;
  double *ms = calloc((size_t)runs, sizeof *ms), *rss = calloc((size_t)runs, sizeof *rss);
  if (!ms || !rss) return 2;
  double w_ms, w_rss;
  int status = 0, failed = 0;
  if (run_once(cmd, &w_ms, &w_rss, &status) != 0) { /* warm-up: page cache */
    perror("bench_startup: fork");
    return 2;
  }
  for (int r = 0; r < runs; r++) {
    if (run_once(cmd, &ms[r], &rss[r], &status) != 0) {
      perror("bench_startup: fork");
      return 2;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  double lo = ms[0], hi = ms[0], rmax = rss[0];
  for (int r = 1; r < runs; r++) {
    if (ms[r] < lo) lo = ms[r];
    if (ms[r] > hi) hi = ms[r];
    if (rss[r] > rmax) rmax = rss[r];
  }
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  printf("runs=%d median_ms=%.2f min_ms=%.2f max_ms=%.2f median_rss_mb=%.1f "
         "max_rss_mb=%.1f rc=%d\n",
         runs, median(ms, runs), lo, hi, median(rss, runs), rmax, rc);
  free(ms), free(rss);
  return failed;
}
