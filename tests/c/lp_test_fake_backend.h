/* lp_test_fake_backend.h — a "fake:0" tensor backend for CI tests of
 * device code paths: it hands out pointers the host cannot dereference
 * (shifted by 2^47, outside the canonical address space) and runs the CPU
 * backend's functions after shifting them back; not host_accessible, like
 * a GPU. Any host loop that touches its memory crashes the test. Call
 * fake_backend_init() first. */
#pragma once

#include <stdint.h>

#include "lp_tensor.h"

#define OFF ((uintptr_t)1 << 47)
#define U(p) ((p) ? (void *)((uintptr_t)(p) - OFF) : NULL)

static const lp_tensor_backend *cpu;

static void fake_backend_init(void) { cpu = lp_tensor_backend_cpu(); }

static void *f_alloc(const lp_tensor_backend *be, size_t bytes) {
  (void)be;
  void *p = lp_malloc(bytes);
  return p ? (void *)((uintptr_t)p + OFF) : NULL;
}
static void f_free(const lp_tensor_backend *be, void *p) {
  (void)be;
  lp_free(U(p));
}
static lp_status f_to_host(const lp_tensor_backend *be, void *dst,
                           const void *src, size_t n) {
  (void)be;
  return cpu->to_host(cpu, dst, U(src), n);
}
static lp_status f_from_host(const lp_tensor_backend *be, void *dst,
                             const void *src, size_t n) {
  (void)be;
  return cpu->from_host(cpu, U(dst), src, n);
}
static lp_status f_gemm(const lp_tensor_backend *be, int ta, int tb, int64_t m,
                        int64_t n, int64_t k, float alpha, const float *a,
                        int64_t lda, int64_t sa, const float *b, int64_t ldb,
                        int64_t sb, float beta, float *c, int64_t ldc,
                        int64_t sc, int64_t batch) {
  (void)be;
  return cpu->gemm(cpu, ta, tb, m, n, k, alpha, U(a), lda, sa, U(b), ldb, sb,
                   beta, U(c), ldc, sc, batch);
}
static lp_status f_fill(const lp_tensor_backend *be, int64_t n, float v,
                        float *x) {
  (void)be;
  return cpu->fill(cpu, n, v, U(x));
}
static lp_status f_copy(const lp_tensor_backend *be, int64_t n, const float *x,
                        float *o) {
  (void)be;
  return cpu->copy(cpu, n, U(x), U(o));
}
static lp_status f_axpy(const lp_tensor_backend *be, int64_t n, float a,
                        const float *x, float *y) {
  (void)be;
  return cpu->axpy(cpu, n, a, U(x), U(y));
}
static lp_status f_scale(const lp_tensor_backend *be, int64_t n, float a,
                         float *x) {
  (void)be;
  return cpu->scale(cpu, n, a, U(x));
}
static lp_status f_add(const lp_tensor_backend *be, int64_t n, const float *a,
                       const float *b, float *o) {
  (void)be;
  return cpu->add(cpu, n, U(a), U(b), U(o));
}
static lp_status f_mul(const lp_tensor_backend *be, int64_t n, const float *a,
                       const float *b, float *o) {
  (void)be;
  return cpu->mul(cpu, n, U(a), U(b), U(o));
}
static lp_status f_act(const lp_tensor_backend *be, lp_tensor_act_kind k,
                       int64_t n, const float *x, float *y) {
  (void)be;
  return cpu->act(cpu, k, n, U(x), U(y));
}
static lp_status f_act_bwd(const lp_tensor_backend *be, lp_tensor_act_kind k,
                           int64_t n, const float *x, const float *dy,
                           float *dx) {
  (void)be;
  return cpu->act_backward(cpu, k, n, U(x), U(dy), U(dx));
}
static lp_status f_softmax(const lp_tensor_backend *be, int64_t r, int64_t c,
                           const float *x, float *y) {
  (void)be;
  return cpu->softmax_rows(cpu, r, c, U(x), U(y));
}
static lp_status f_sum_rows(const lp_tensor_backend *be, int64_t r, int64_t c,
                            const float *x, float beta, float *o) {
  (void)be;
  return cpu->sum_rows(cpu, r, c, U(x), beta, U(o));
}
static lp_status f_gather(const lp_tensor_backend *be, int64_t n, int64_t c,
                         const float *x, const int64_t *idx, const float *scale,
                         float *o) {
  (void)be; /* idx and scale are host arrays */
  return cpu->gather_rows(cpu, n, c, U(x), idx, scale, U(o));
}
static lp_status f_scatter(const lp_tensor_backend *be, int64_t n, int64_t c,
                          const float *x, const int64_t *idx,
                          const float *scale, float *o) {
  (void)be;
  return cpu->scatter_add_rows(cpu, n, c, U(x), idx, scale, U(o));
}
static lp_status f_add_rowvec(const lp_tensor_backend *be, int64_t r,
                              int64_t c, const float *v, float *t) {
  (void)be;
  return cpu->add_rowvec(cpu, r, c, U(v), U(t));
}
static lp_status f_rmsnorm(const lp_tensor_backend *be, int64_t r, int64_t d,
                           float eps, const float *x, const float *w, float *y,
                           float *rstd) {
  (void)be;
  return cpu->rmsnorm(cpu, r, d, eps, U(x), U(w), U(y), U(rstd));
}
static lp_status f_rmsnorm_bwd(const lp_tensor_backend *be, int64_t r,
                               int64_t d, const float *x, const float *w,
                               const float *rstd, const float *dy, float *dx,
                               float *gw) {
  (void)be;
  return cpu->rmsnorm_backward(cpu, r, d, U(x), U(w), U(rstd), U(dy), U(dx),
                               U(gw));
}
static lp_status f_embedding(const lp_tensor_backend *be, int64_t n,
                             int64_t dim, const float *ids, const float *w,
                             float *y) {
  (void)be;
  return cpu->embedding(cpu, n, dim, U(ids), U(w), U(y));
}
static lp_status f_embedding_bwd(const lp_tensor_backend *be, int64_t n,
                                 int64_t dim, int64_t vocab, const float *ids,
                                 const float *dy, float *gw) {
  (void)be;
  return cpu->embedding_backward(cpu, n, dim, vocab, U(ids), U(dy), U(gw));
}
static lp_status f_causal(const lp_tensor_backend *be, int64_t r, int64_t t,
                          float *s) {
  (void)be;
  return cpu->causal_mask(cpu, r, t, U(s));
}
static lp_status f_softmax_bwd(const lp_tensor_backend *be, int64_t r,
                               int64_t c, const float *p, float *ds) {
  (void)be;
  return cpu->softmax_backward_rows(cpu, r, c, U(p), U(ds));
}
static lp_status f_ce(const lp_tensor_backend *be, int64_t r, int64_t c,
                      const float *l, const float *t, double gs, double *loss,
                      float *dl) {
  (void)be;
  return cpu->cross_entropy(cpu, r, c, U(l), U(t), gs, U(loss), U(dl));
}
static lp_status f_sq(const lp_tensor_backend *be, int64_t n, const float *p,
                      const float *t, double gs, double *sq, float *dp) {
  (void)be;
  return cpu->sq_error(cpu, n, U(p), U(t), gs, U(sq), U(dp));
}
static lp_status f_sgd(const lp_tensor_backend *be, int64_t n, double lr,
                       double mu, double wd, float *p, const float *g,
                       float *m) {
  (void)be;
  return cpu->sgd_step(cpu, n, lr, mu, wd, U(p), U(g), U(m));
}
static lp_status f_adamw(const lp_tensor_backend *be, int64_t n, double lr,
                         double b1, double b2, double eps, double decay,
                         double bc1, double bc2, float *p, const float *g,
                         float *m, float *v) {
  (void)be;
  return cpu->adamw_step(cpu, n, lr, b1, b2, eps, decay, bc1, bc2, U(p), U(g),
                         U(m), U(v));
}

static lp_status f_dot_rows(const lp_tensor_backend *be, int64_t n,
                            int64_t c, const float *a, const int64_t *idx,
                            const float *b, float *o) {
  (void)be; /* idx is a host array */
  return cpu->dot_rows(cpu, n, c, U(a), idx, U(b), U(o));
}

static lp_status f_rope(const lp_tensor_backend *be, int64_t rows,
                        int64_t seq, int64_t heads, int64_t d, int64_t ld,
                        int64_t hs, const float *cs, int conj, float *x) {
  (void)be;
  return cpu->rope(cpu, rows, seq, heads, d, ld, hs, U(cs), conj, U(x));
}

static const lp_tensor_backend fake = {
    .name = "fake:0",
    .host_accessible = 0,
    .alloc = f_alloc,
    .free = f_free,
    .to_host = f_to_host,
    .from_host = f_from_host,
    .gemm = f_gemm,
    .fill = f_fill,
    .copy = f_copy,
    .axpy = f_axpy,
    .scale = f_scale,
    .add = f_add,
    .mul = f_mul,
    .act = f_act,
    .act_backward = f_act_bwd,
    .softmax_rows = f_softmax,
    .sum_rows = f_sum_rows,
    .gather_rows = f_gather,
    .scatter_add_rows = f_scatter,
    .add_rowvec = f_add_rowvec,
    .rmsnorm = f_rmsnorm,
    .rmsnorm_backward = f_rmsnorm_bwd,
    .embedding = f_embedding,
    .embedding_backward = f_embedding_bwd,
    .causal_mask = f_causal,
    .softmax_backward_rows = f_softmax_bwd,
    .cross_entropy = f_ce,
    .sq_error = f_sq,
    .sgd_step = f_sgd,
    .adamw_step = f_adamw,
    .dot_rows = f_dot_rows,
    .rope = f_rope,
};

