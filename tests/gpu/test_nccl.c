/* test_nccl.c — device-buffer communication on cuda:0. Alone: the NCCL
 * backend at world size 1 (lp_comm_for_backend with LUAPIPE_COMM unset picks
 * NCCL for a rank with its own GPU), then the staged MPI path. Under mpirun
 * with several ranks on the one GPU (NCCL refuses that): the choice falls
 * to the staged path. Both run all-reduce, broadcast, barrier, all-to-all-v,
 * all-gather and split on device buffers. Exits 77 without CUDA, a device or NCCL. */
#define _POSIX_C_SOURCE 200809L
#include "gpu_twin.h"
#include "lp_comm_gpu.h"

static void expect(const char *what, const float *got, const float *want,
                   size_t n) {
  twin_check(what, got, want, n, 0);
}

/* All-reduce, broadcast, barrier, all-to-all-v, all-gather and split on
 * device buffers; every rank holds the same v, so the expected values
 * follow from size. */
static void run_ops(lp_comm *c, const lp_tensor_backend *G) {
  const char *name = lp_comm_backend_name(c);
  int n = lp_comm_size(c);
  char what[96];
  float v[4] = {1.5f, -2.0f, 3.25f, 8.0f}, want[4], *got;
  float *d = twin_up(G, v, sizeof v);
  for (int i = 0; i < 4; i++) want[i] = v[i] * (float)n;
  twin_status("all-reduce", lp_comm_allreduce_sum_float(c, d, 4, "test all-reduce"));
  got = twin_down(G, d, sizeof v);
  snprintf(what, sizeof what, "%s all-reduce (%d ranks)", name, n);
  expect(what, got, want, 4);
  lp_free(got);
  twin_status("broadcast", lp_comm_bcast(c, d, sizeof v, 0, "test broadcast"));
  twin_status("barrier", lp_comm_barrier(c, "test barrier"));
  /* all-to-all-v: 4 floats to every rank (the self piece is a copy) */
  size_t *cnt = lp_malloc((size_t)n * sizeof *cnt), *disp = lp_malloc((size_t)n * sizeof *disp);
  float *sendh = lp_malloc((size_t)n * sizeof v), *wanth = lp_malloc((size_t)n * sizeof v);
  for (int p = 0; p < n; p++) {
    cnt[p] = 4, disp[p] = (size_t)p * 4;
    memcpy(sendh + 4 * p, want, sizeof v);
    memcpy(wanth + 4 * p, want, sizeof v);
  }
  float *ds = twin_up(G, sendh, (size_t)n * sizeof v), *r = twin_poison(G, (size_t)n * 4);
  twin_status("all-to-all-v", lp_comm_alltoallv(c, ds, cnt, disp, r, cnt, disp, "test a2a"));
  got = twin_down(G, r, (size_t)n * sizeof v);
  snprintf(what, sizeof what, "%s all-to-all-v", name);
  expect(what, got, wanth, (size_t)n * 4);
  lp_free(got);
  /* all-gather: every rank's 4 floats (the same v) back to back */
  float *dg = twin_poison(G, (size_t)n * 4);
  for (int p = 0; p < n; p++) memcpy(wanth + 4 * p, v, sizeof v);
  float *dv = twin_up(G, v, sizeof v);
  twin_status("all-gather", lp_comm_allgather(c, dv, sizeof v, dg, "test all-gather"));
  got = twin_down(G, dg, (size_t)n * sizeof v);
  snprintf(what, sizeof what, "%s all-gather", name);
  expect(what, got, wanth, (size_t)n * 4);
  lp_free(got);
  G->free(G, dg), G->free(G, dv);
  lp_comm *sub = NULL;
  twin_status("split", lp_comm_split(c, 0, 0, &sub));
  if (sub) {
    twin_status("split all-reduce", lp_comm_allreduce_sum_float(sub, r, 4, "sub"));
    got = twin_down(G, r, sizeof v);
    for (int i = 0; i < 4; i++) want[i] *= (float)n;
    snprintf(what, sizeof what, "%s split + all-reduce", name);
    expect(what, got, want, 4);
    lp_free(got);
    lp_comm_free(sub);
  }
  G->free(G, d), G->free(G, r), G->free(G, ds);
  lp_free(cnt), lp_free(disp), lp_free(sendh), lp_free(wanth);
}

int main(int argc, char **argv) {
  const lp_tensor_backend *G = twin_device_or_skip();
  if (!lp_comm_nccl_built()) {
    printf("skip: built without NCCL\n");
    return 77;
  }
  if (lp_comm_mpi_init(&argc, &argv) != LP_OK) return 1;
  lp_comm *w = lp_comm_world(), *c = NULL;
  int owned = 0;
  unsetenv("LUAPIPE_COMM");
  lp_status st = lp_comm_for_backend(w, G, &c, &owned);
  if (st != LP_OK) {
    printf("FAIL: NCCL did not start: %s\n", lp_comm_last_error(w));
    return 1;
  }
  /* one rank: its own GPU, so NCCL; several ranks on one GPU: staged */
  const char *expect_be = lp_comm_size(w) == 1 ? "nccl" : "mpi-staged";
  int right = !strcmp(lp_comm_backend_name(c), expect_be);
  printf("%-4s LUAPIPE_COMM unset, %d rank(s): backend %s\n", right ? "ok" : "FAIL",
         lp_comm_size(w), lp_comm_backend_name(c));
  if (!right) twin_failures++;
  run_ops(c, G);
  if (owned) lp_comm_free(c);
  /* the staged path on the same device */
  setenv("LUAPIPE_COMM", "mpi", 1);
  st = lp_comm_for_backend(w, G, &c, &owned);
  twin_status("staged", st);
  if (st == LP_OK) {
    run_ops(c, G);
    if (owned) lp_comm_free(c);
  }
  printf("%d failure(s)\n", twin_failures);
  return twin_failures ? 1 : 0;
}
