/* schedule.c — bench_schedule: validation and lowering speed on large
 * hand-built 1F1B schedules (the tests check the results; this prints the
 * times). Rows: 1F1B P=64 with M = 512 and 1024 (validate), and the same
 * with the backward split into I and W (validate, lower, validate lowered).
 * The last column is the time per action in microseconds; the footer gives
 * the M=1024 / M=512 ratio, about 2 when the work is linear in actions.
 * Usage: bench_schedule [--check]: --check exits 1 when a target is missed
 * (lowering P=64, M=512 split under 2 s; validate under 1 s), naming it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../tests/c/schedule_fixtures.h"
#include "lp_base.h"

static long total_actions(const lp_schedule *s) {
  long t = 0;
  for (int r = 0; r < lp_schedule_ranks(s); r++) {
    int n;
    lp_schedule_actions(s, r, &n);
    t += n;
  }
  return t;
}

typedef struct {
  double validate, lower, validate_low;
  long actions;
} figures;

static figures run(int P, int M, int split) {
  figures f = {0, 0, 0, 0};
  lp_schedule *s = fx_1f1b(P, M, split), *low = NULL;
  f.actions = total_actions(s);
  double t0 = lp_now();
  if (lp_schedule_validate(s) != LP_OK) {
    fprintf(stderr, "bench_schedule: %s\n", lp_schedule_last_error(s));
    exit(2);
  }
  f.validate = lp_now() - t0;
  if (split) {
    t0 = lp_now();
    if (lp_schedule_lower(s, &low) != LP_OK) exit(2);
    f.lower = lp_now() - t0;
    t0 = lp_now();
    if (lp_schedule_validate(low) != LP_OK) exit(2);
    f.validate_low = lp_now() - t0;
  }
  printf("%-22s %5d %5d %9ld %10.3f %8.3f %10.3f %8.2f\n", split ? "1F1B, B split in I+W" : "1F1B",
         P, M, f.actions, f.validate, f.lower, f.validate_low,
         (f.validate + f.lower + f.validate_low) / (double)f.actions * 1e6);
  lp_schedule_free(low);
  lp_schedule_free(s);
  return f;
}

int main(int argc, char **argv) {
  int check = argc > 1 && !strcmp(argv[1], "--check");
  printf("%-22s %5s %5s %9s %10s %8s %10s %8s\n", "schedule", "P", "M", "actions",
         "validate s", "lower s", "val.low s", "us/act");
  figures a = run(64, 512, 0), b = run(64, 1024, 0);
  figures c = run(64, 512, 1), d = run(64, 1024, 1);
  printf("M=1024 / M=512 time ratio: validate %.2f, split validate+lower %.2f "
         "(2.00 = linear)\n", b.validate / (a.validate > 0 ? a.validate : 1e-9),
         (d.validate + d.lower + d.validate_low) /
             (c.validate + c.lower + c.validate_low > 0 ? c.validate + c.lower + c.validate_low
                                                       : 1e-9));
  int missed = 0;
  if (b.validate >= 1.0) {
    printf("target missed: validate 1F1B P=64 M=1024 took %.3f s (target < 1 s)\n", b.validate);
    missed = 1;
  }
  if (c.lower >= 2.0) {
    printf("target missed: lower split 1F1B P=64 M=512 took %.3f s (target < 2 s)\n", c.lower);
    missed = 1;
  }
  if (!missed) printf("targets met: validate < 1 s, lower < 2 s\n");
  return check && missed ? 1 : 0;
}
