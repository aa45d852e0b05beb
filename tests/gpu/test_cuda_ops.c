/* test_cuda_ops.c — every op of the CUDA backend table against its CPU
 * twin on random inputs: outputs poisoned with NaN before the run, compared
 * by relative error; accumulating outputs start from the same random
 * values on both sides. Also the tensor layer on the device (move, copy,
 * mixing devices). Exits 77 without CUDA or a device. */
#include "gpu_twin.h"

static const lp_tensor_backend *G, *C;

/* Runs a unary-output op on both backends: `in` are host inputs (n_in
 * arrays of sizes[i] floats), out is `out_n` floats starting as `init`
 * (NULL: poisoned on the device, garbage-free zeros on the host). */
#define UP(h, n) ((float *)twin_up(G, (h), (size_t)(n) * sizeof(float)))

static void check_out(const char *what, float *dev, const float *want,
                      size_t n, double tol) {
  float *got = twin_down(G, dev, n * sizeof(float));
  twin_check(what, got, want, n, tol);
  lp_free(got);
  G->free(G, dev);
}

static void test_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k,
                      int64_t batch, float beta, int bf16) {
  int64_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
  int64_t sa = m * k, sb = k * n, sc = m * n;
  float *a = twin_rand((size_t)(sa * batch), -1, 1);
  float *b = twin_rand((size_t)(sb * batch), -1, 1);
  float *c = twin_rand((size_t)(sc * batch), -1, 1);
  float *want = twin_copy(c, (size_t)(sc * batch));
  twin_status("cpu gemm", (bf16 ? C->gemm_bf16 : C->gemm)(
                              C, ta, tb, m, n, k, 0.75f, a, lda, sa, b, ldb,
                              sb, beta, want, ldc, sc, batch));
  float *da = UP(a, sa * batch), *db = UP(b, sb * batch);
  float *dc = beta == 0.0f ? twin_poison(G, (size_t)(sc * batch))
                           : UP(c, sc * batch);
  twin_status("cuda gemm", (bf16 ? G->gemm_bf16 : G->gemm)(
                               G, ta, tb, m, n, k, 0.75f, da, lda, sa, db,
                               ldb, sb, beta, dc, ldc, sc, batch));
  char what[96];
  snprintf(what, sizeof what, "gemm%s %c%c %lldx%lldx%lld b%lld beta %g",
           bf16 ? " bf16" : "",
           ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n,
           (long long)k, (long long)batch, (double)beta);
  check_out(what, dc, want, (size_t)(sc * batch), k ? 1e-5 : 0);
  G->free(G, da);
  G->free(G, db);
  lp_free(a), lp_free(b), lp_free(c), lp_free(want);
}

static void test_elementwise(void) {
  const int64_t n = 100003;
  float *x = twin_rand(n, -4, 4), *y = twin_rand(n, -4, 4);
  float *want = lp_malloc(n * sizeof *want);
  float *dx = UP(x, n), *dy = UP(y, n), *out;

  C->fill(C, n, 1.25f, want);
  out = twin_poison(G, n);
  twin_status("fill", G->fill(G, n, 1.25f, out));
  check_out("fill", out, want, n, 0);

  out = twin_poison(G, n);
  twin_status("copy", G->copy(G, n, dx, out));
  check_out("copy", out, x, n, 0);

  memcpy(want, y, n * sizeof *want);
  C->axpy(C, n, -0.5f, x, want);
  out = UP(y, n);
  twin_status("axpy", G->axpy(G, n, -0.5f, dx, out));
  check_out("axpy", out, want, n, 1e-6);

  memcpy(want, y, n * sizeof *want);
  C->scale(C, n, 3.0f, want);
  out = UP(y, n);
  twin_status("scale", G->scale(G, n, 3.0f, out));
  check_out("scale", out, want, n, 1e-6);

  C->add(C, n, x, y, want);
  out = twin_poison(G, n);
  twin_status("add", G->add(G, n, dx, dy, out));
  check_out("add", out, want, n, 1e-6);

  C->mul(C, n, x, y, want);
  out = twin_poison(G, n);
  twin_status("mul", G->mul(G, n, dx, dy, out));
  check_out("mul", out, want, n, 1e-6);

  for (int kind = 0; kind < 2; kind++) {
    const char *nm = kind == LP_TENSOR_ACT_GELU ? "gelu" : "silu";
    char what[64];
    C->act(C, (lp_tensor_act_kind)kind, n, x, want);
    out = twin_poison(G, n);
    twin_status(nm, G->act(G, (lp_tensor_act_kind)kind, n, dx, out));
    snprintf(what, sizeof what, "act %s", nm);
    check_out(what, out, want, n, 1e-5);
    C->act_backward(C, (lp_tensor_act_kind)kind, n, x, y, want);
    out = twin_poison(G, n);
    twin_status(nm, G->act_backward(G, (lp_tensor_act_kind)kind, n, dx, dy, out));
    snprintf(what, sizeof what, "act_backward %s", nm);
    check_out(what, out, want, n, 1e-5);
  }
  G->free(G, dx);
  G->free(G, dy);
  lp_free(x), lp_free(y), lp_free(want);
}

static void test_rows(int64_t rows, int64_t cols) {
  int64_t n = rows * cols;
  char what[96];
  float *x = twin_rand((size_t)n, -6, 6), *g = twin_rand((size_t)n, -1, 1);
  float *v = twin_rand((size_t)cols, -1, 1), *acc = twin_rand((size_t)cols, -1, 1);
  float *want = lp_malloc((size_t)n * sizeof *want);
  float *dx = UP(x, n), *dg = UP(g, n), *dv = UP(v, cols), *out;

  /* softmax with one fully masked row and masked tails */
  for (int64_t j = 0; j < cols; j++) x[j] = -INFINITY;
  for (int64_t r = 1; r < rows; r++) x[r * cols + cols - 1] = -INFINITY;
  G->free(G, dx);
  dx = UP(x, n);
  C->softmax_rows(C, rows, cols, x, want);
  out = twin_poison(G, (size_t)n);
  twin_status("softmax", G->softmax_rows(G, rows, cols, dx, out));
  snprintf(what, sizeof what, "softmax_rows %lldx%lld", (long long)rows, (long long)cols);
  check_out(what, out, want, (size_t)n, 1e-5);

  /* softmax backward from real probabilities */
  float *p = twin_copy(want, (size_t)n);
  float *dp = UP(p, n);
  memcpy(want, g, (size_t)n * sizeof *want);
  C->softmax_backward_rows(C, rows, cols, p, want);
  out = UP(g, n);
  twin_status("softmax backward", G->softmax_backward_rows(G, rows, cols, dp, out));
  snprintf(what, sizeof what, "softmax_backward_rows %lldx%lld", (long long)rows, (long long)cols);
  check_out(what, out, want, (size_t)n, 1e-5);

  /* sum_rows with beta 0 and 1 */
  for (int beta = 0; beta < 2; beta++) {
    float *w = twin_copy(acc, (size_t)cols);
    C->sum_rows(C, rows, cols, g, (float)beta, w);
    out = beta ? UP(acc, cols) : twin_poison(G, (size_t)cols);
    twin_status("sum_rows", G->sum_rows(G, rows, cols, dg, (float)beta, out));
    snprintf(what, sizeof what, "sum_rows %lldx%lld beta %d", (long long)rows, (long long)cols,
             beta);
    check_out(what, out, w, (size_t)cols, 1e-5);
    lp_free(w);
  }

  memcpy(want, g, (size_t)n * sizeof *want);
  C->add_rowvec(C, rows, cols, v, want);
  out = UP(g, n);
  twin_status("add_rowvec", G->add_rowvec(G, rows, cols, dv, out));
  check_out("add_rowvec", out, want, (size_t)n, 1e-6);

  /* RMSNorm forward and backward (x without infinities) */
  float *xr = twin_rand((size_t)n, -3, 3), *wr = twin_rand((size_t)cols, 0.5f, 1.5f);
  float *rstd = lp_malloc((size_t)rows * sizeof *rstd);
  float *dxr = UP(xr, n), *dwr = UP(wr, cols);
  C->rmsnorm(C, rows, cols, 1e-5f, xr, wr, want, rstd);
  out = twin_poison(G, (size_t)n);
  float *drstd = twin_poison(G, (size_t)rows);
  twin_status("rmsnorm", G->rmsnorm(G, rows, cols, 1e-5f, dxr, dwr, out, drstd));
  check_out("rmsnorm y", out, want, (size_t)n, 1e-5);
  float *grstd = twin_down(G, drstd, (size_t)rows * sizeof(float));
  twin_check("rmsnorm rstd", grstd, rstd, (size_t)rows, 1e-5);
  lp_free(grstd);
  float *gw = twin_copy(acc, (size_t)cols);
  C->rmsnorm_backward(C, rows, cols, xr, wr, rstd, g, want, gw);
  out = twin_poison(G, (size_t)n);
  float *dgw = UP(acc, cols);
  twin_status("rmsnorm backward",
              G->rmsnorm_backward(G, rows, cols, dxr, dwr, drstd, dg, out, dgw));
  check_out("rmsnorm_backward dx", out, want, (size_t)n, 1e-5);
  check_out("rmsnorm_backward gw (+=)", dgw, gw, (size_t)cols, 1e-5);

  G->free(G, drstd), G->free(G, dxr), G->free(G, dwr), G->free(G, dx);
  G->free(G, dg), G->free(G, dv), G->free(G, dp);
  lp_free(x), lp_free(g), lp_free(v), lp_free(acc), lp_free(want), lp_free(p);
  lp_free(xr), lp_free(wr), lp_free(rstd), lp_free(gw);
}

static void test_embedding(int64_t n, int64_t vocab, int64_t dim) {
  float *ids = lp_malloc((size_t)n * sizeof *ids);
  for (int64_t r = 0; r < n; r++) /* repeats on purpose */
    ids[r] = (float)(lp_tensor_rng_next(&twin_rng) % (uint64_t)(vocab / 2 + 1));
  float *w = twin_rand((size_t)(vocab * dim), -1, 1);
  float *dy = twin_rand((size_t)(n * dim), -1, 1);
  float *gw = twin_rand((size_t)(vocab * dim), -1, 1);
  float *want = lp_malloc((size_t)(n * dim) * sizeof *want);
  float *did = UP(ids, n), *dw = UP(w, vocab * dim), *ddy = UP(dy, n * dim);
  C->embedding(C, n, dim, ids, w, want);
  float *out = twin_poison(G, (size_t)(n * dim));
  twin_status("embedding", G->embedding(G, n, dim, did, dw, out));
  check_out("embedding", out, want, (size_t)(n * dim), 0);
  float *wg = twin_copy(gw, (size_t)(vocab * dim));
  C->embedding_backward(C, n, dim, vocab, ids, dy, wg);
  out = UP(gw, vocab * dim);
  twin_status("embedding backward", G->embedding_backward(G, n, dim, vocab, did, ddy, out));
  char what[96];
  snprintf(what, sizeof what, "embedding_backward n%lld v%lld d%lld", (long long)n,
           (long long)vocab, (long long)dim);
  check_out(what, out, wg, (size_t)(vocab * dim), 1e-5);
  G->free(G, did), G->free(G, dw), G->free(G, ddy);
  lp_free(ids), lp_free(w), lp_free(dy), lp_free(gw), lp_free(want), lp_free(wg);
}

static void test_mask_losses_optim(void) {
  /* causal mask on [2, 3, 7, 7] score blocks */
  int64_t T = 7, rows = 2 * 3 * T, n = rows * T;
  float *s = twin_rand((size_t)n, -1, 1), *want = twin_copy(s, (size_t)n);
  C->causal_mask(C, rows, T, want);
  float *out = UP(s, n);
  twin_status("causal mask", G->causal_mask(G, rows, T, out));
  check_out("causal_mask", out, want, (size_t)n, 0);
  lp_free(s), lp_free(want);

  /* cross-entropy over a large vocabulary (more columns than threads) */
  int64_t R = 37, V = 1000;
  float *lg = twin_rand((size_t)(R * V), -8, 8), *tg = lp_malloc((size_t)R * sizeof *tg);
  for (int64_t r = 0; r < R; r++) tg[r] = (float)(lp_tensor_rng_next(&twin_rng) % (uint64_t)V);
  double *lw = lp_malloc((size_t)R * sizeof *lw);
  float *dlw = lp_malloc((size_t)(R * V) * sizeof *dlw);
  C->cross_entropy(C, R, V, lg, tg, 0.25, lw, dlw);
  float *dlg = UP(lg, R * V), *dtg = UP(tg, R), *ddl = twin_poison(G, (size_t)(R * V));
  double *dloss = G->alloc(G, (size_t)R * sizeof(double));
  twin_status("cross-entropy", G->cross_entropy(G, R, V, dlg, dtg, 0.25, dloss, ddl));
  double *gl = twin_down(G, dloss, (size_t)R * sizeof(double));
  twin_check_d("cross_entropy loss", gl, lw, (size_t)R, 1e-6);
  check_out("cross_entropy dlogits", ddl, dlw, (size_t)(R * V), 1e-5);
  G->free(G, dloss), G->free(G, dlg), G->free(G, dtg);
  lp_free(lg), lp_free(tg), lp_free(lw), lp_free(dlw), lp_free(gl);

  /* squared error */
  int64_t N = 5000;
  float *p = twin_rand((size_t)N, -2, 2), *t = twin_rand((size_t)N, -2, 2);
  double *sq = lp_malloc((size_t)N * sizeof *sq);
  float *dpw = lp_malloc((size_t)N * sizeof *dpw);
  C->sq_error(C, N, p, t, 0.1, sq, dpw);
  float *dp = UP(p, N), *dt = UP(t, N), *ddp = twin_poison(G, (size_t)N);
  double *dsq = G->alloc(G, (size_t)N * sizeof(double));
  twin_status("sq_error", G->sq_error(G, N, dp, dt, 0.1, dsq, ddp));
  double *gsq = twin_down(G, dsq, (size_t)N * sizeof(double));
  twin_check_d("sq_error terms", gsq, sq, (size_t)N, 1e-7);
  check_out("sq_error dpred", ddp, dpw, (size_t)N, 1e-7);
  G->free(G, dsq), G->free(G, dp), G->free(G, dt);
  lp_free(p), lp_free(t), lp_free(sq), lp_free(dpw), lp_free(gsq);

  /* optimizer steps: three steps each from the same state */
  float *w0 = twin_rand((size_t)N, -1, 1), *m0 = twin_rand((size_t)N, -0.1f, 0.1f);
  float *v0 = twin_rand((size_t)N, 0, 0.01f), *g0 = twin_rand((size_t)N, -1, 1);
  float *hw = twin_copy(w0, (size_t)N), *hm = twin_copy(m0, (size_t)N),
        *hv = twin_copy(v0, (size_t)N);
  float *dw = UP(w0, N), *dm = UP(m0, N), *dv = UP(v0, N), *dg = UP(g0, N);
  for (int it = 0; it < 3; it++) {
    C->sgd_step(C, N, 0.05, 0.9, 0.01, hw, g0, hm);
    twin_status("sgd", G->sgd_step(G, N, 0.05, 0.9, 0.01, dw, dg, dm));
  }
  check_out("sgd_step x3 params", dw, hw, (size_t)N, 1e-6);
  check_out("sgd_step x3 momentum", dm, hm, (size_t)N, 1e-6);
  memcpy(hw, w0, (size_t)N * sizeof *hw), memcpy(hm, m0, (size_t)N * sizeof *hm);
  dw = UP(w0, N), dm = UP(m0, N);
  for (int it = 1; it <= 3; it++) {
    double bc1 = 1 - pow(0.9, it), bc2 = 1 - pow(0.999, it);
    C->adamw_step(C, N, 1e-3, 0.9, 0.999, 1e-8, 1 - 1e-5, bc1, bc2, hw, g0, hm, hv);
    twin_status("adamw",
                G->adamw_step(G, N, 1e-3, 0.9, 0.999, 1e-8, 1 - 1e-5, bc1, bc2, dw, dg, dm, dv));
  }
  check_out("adamw_step x3 params", dw, hw, (size_t)N, 1e-6);
  check_out("adamw_step x3 m", dm, hm, (size_t)N, 1e-6);
  check_out("adamw_step x3 v", dv, hv, (size_t)N, 1e-6);
  G->free(G, dg);
  lp_free(w0), lp_free(m0), lp_free(v0), lp_free(g0), lp_free(hw), lp_free(hm), lp_free(hv);
}

/* MoE gather / scatter-add (the table entries of branch moe) against host
 * loops written from their definition; repeated targets on purpose. */
static void test_gather_scatter(int with_scale) {
  int64_t rows = 23, n = 61, cols = 37;
  float *x = twin_rand((size_t)(rows * cols), -1, 1), *sc = twin_rand((size_t)n, 0, 1);
  float *src = twin_rand((size_t)(n * cols), -1, 1), *acc = twin_rand((size_t)(rows * cols), -1, 1);
  int64_t *idx = lp_malloc((size_t)n * sizeof *idx);
  for (int64_t i = 0; i < n; i++)
    idx[i] = (int64_t)(lp_tensor_rng_next(&twin_rng) % (uint64_t)rows);
  const float *s = with_scale ? sc : NULL;
  float *want = lp_malloc((size_t)(n * cols) * sizeof *want);
  for (int64_t i = 0; i < n; i++)
    for (int64_t c = 0; c < cols; c++)
      want[i * cols + c] = (s ? s[i] : 1.0f) * x[idx[i] * cols + c];
  float *dx = UP(x, rows * cols), *out = twin_poison(G, (size_t)(n * cols));
  twin_status("gather", lp_kernels_cuda_gather_rows(G, n, cols, dx, idx, s, out));
  check_out(with_scale ? "gather_rows (scaled)" : "gather_rows", out, want, (size_t)(n * cols),
            1e-7);
  float *w2 = twin_copy(acc, (size_t)(rows * cols));
  for (int64_t i = 0; i < n; i++)
    for (int64_t c = 0; c < cols; c++)
      w2[idx[i] * cols + c] += (s ? s[i] : 1.0f) * src[i * cols + c];
  float *dsrc = UP(src, n * cols);
  out = UP(acc, rows * cols);
  twin_status("scatter", lp_kernels_cuda_scatter_add_rows(G, n, cols, dsrc, idx, s, out));
  check_out(with_scale ? "scatter_add_rows (scaled)" : "scatter_add_rows", out, w2,
            (size_t)(rows * cols), 1e-6);
  G->free(G, dx), G->free(G, dsrc);
  lp_free(x), lp_free(sc), lp_free(src), lp_free(acc), lp_free(idx), lp_free(want), lp_free(w2);
}

/* Row dots (the MoE combine weights' gradient) against the CPU entry, with
 * gathered rows of a (repeated on purpose) and without: the same double
 * sums in the same order, so equal but for the final rounding. */
static void test_dot_rows(int with_idx) {
  int64_t rows = 23, n = 61, cols = 37, arows = with_idx ? rows : n;
  float *a = twin_rand((size_t)(arows * cols), -1, 1), *b = twin_rand((size_t)(n * cols), -1, 1);
  int64_t *idx = lp_malloc((size_t)n * sizeof *idx);
  for (int64_t i = 0; i < n; i++)
    idx[i] = (int64_t)(lp_tensor_rng_next(&twin_rng) % (uint64_t)rows);
  const int64_t *ix = with_idx ? idx : NULL;
  float *want = lp_malloc((size_t)n * sizeof *want);
  twin_status("dot_rows cpu", C->dot_rows(C, n, cols, a, ix, b, want));
  float *da = UP(a, arows * cols), *db = UP(b, n * cols), *out = twin_poison(G, (size_t)n);
  twin_status("dot_rows", G->dot_rows(G, n, cols, da, ix, db, out));
  check_out(with_idx ? "dot_rows (gathered)" : "dot_rows", out, want, (size_t)n, 1e-7);
  G->free(G, da), G->free(G, db);
  lp_free(a), lp_free(b), lp_free(idx), lp_free(want);
}

static void test_tensor_layer(void) {
  /* a tensor knows its device; moves keep values; mixing devices fails */
  int64_t sh[2] = {33, 17};
  float *h = twin_rand(33 * 17, -1, 1);
  lp_tensor *a = NULL, *b = NULL, *back = NULL;
  twin_status("from_data", lp_tensor_from_data(NULL, 2, sh, h, &a));
  twin_status("move", lp_tensor_move(a, G));
  int on_dev = lp_tensor_backend_of(a) == G;
  printf("%-4s tensor moved to %s\n", on_dev ? "ok" : "FAIL", lp_tensor_backend_of(a)->name);
  if (!on_dev) twin_failures++;
  twin_status("from_data", lp_tensor_from_data(NULL, 2, sh, h, &b));
  lp_status st = lp_tensor_add(a, a, b);
  printf("%-4s add(cuda:0, cpu) refused: %s\n", st == LP_ERR_ARG ? "ok" : "FAIL", lp_strerror(st));
  if (st != LP_ERR_ARG) twin_failures++;
  twin_status("add", lp_tensor_add(a, a, a));
  twin_status("to_host", lp_tensor_to_host(a, &back));
  for (int i = 0; i < 33 * 17; i++) h[i] *= 2;
  if (back) twin_check("move + add + to_host", back->data, h, 33 * 17, 0);
  size_t used, cached;
  lp_kernels_cuda_memory(G, &used, &cached);
  printf("     allocator: %zu bytes in use, %zu cached\n", used, cached);
  lp_tensor_free(a), lp_tensor_free(b), lp_tensor_free(back), lp_free(h);
}

int main(void) {
  G = twin_device_or_skip();
  C = lp_tensor_backend_cpu();
  lp_tensor_rng_seed(&twin_rng, 20261201);
  /* bf16: both sides round the same inputs; the sums' order differs */
  for (int bf = 0; bf < 2; bf++) {
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        test_gemm(ta, tb, 67, 45, 129, 1, 0.0f, bf);
    test_gemm(0, 1, 128, 256, 64, 1, 1.0f, bf);
    test_gemm(1, 0, 31, 16, 16, 6, 0.0f, bf);
    test_gemm(0, 0, 9, 7, 0, 2, 0.5f, bf);
  }
  test_elementwise();
  test_rows(1, 5);
  test_rows(57, 64);
  test_rows(9, 1500); /* more columns than threads per block */
  test_embedding(513, 65, 64);
  test_embedding(40, 3, 300);
  test_mask_losses_optim();
  test_gather_scatter(0);
  test_gather_scatter(1);
  test_dot_rows(0);
  test_dot_rows(1);
  test_tensor_layer();
  lp_status st = lp_kernels_cuda_sync(G);
  twin_status("final sync", st);
  printf("%d failure(s)\n", twin_failures);
  return twin_failures ? 1 : 0;
}
