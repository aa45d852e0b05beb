/* lp_tensor.h — float32 tensors (up to 4 dims, strided, refcounted storage
 * so views are safe), CPU ops on OpenBLAS, a seeded deterministic RNG, and
 * the compute-backend vtable (CPU now; CUDA plugs in behind the same table).
 * Depends on lp_base only. No Lua, no CUDA headers. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "lp_base.h"

/* ======================================================================
 * Compute backend
 *
 * A backend is a table of functions plus a name (the Redis "engine"
 * pattern). Every tensor's storage records the backend that allocated it,
 * and ops dispatch through that backend. The table works on raw, dense
 * buffers of the backend's memory; the tensor layer above handles shapes
 * and strides. The table also holds the per-row kernels of the nn layers,
 * losses and optimizers, so a whole model runs on one backend. Strided
 * copies and the host reductions (lp_tensor_sum, _dot, ...) run on the host
 * and answer LP_ERR_UNSUPPORTED for storage that is not host_accessible.
 * The CUDA backend is lp_tensor_backend_cuda (kernels/lp_kernels.h).
 *
 * Every function returns LP_OK or a status; none aborts. Buffers never
 * alias unless the op says so.
 * ====================================================================== */

typedef enum lp_tensor_act_kind {
  LP_TENSOR_ACT_GELU = 0, /* tanh approximation */
  LP_TENSOR_ACT_SILU = 1  /* x * sigmoid(x) */
} lp_tensor_act_kind;

typedef struct lp_tensor_backend lp_tensor_backend;
struct lp_tensor_backend {
  const char *name;    /* the device in user terms: "cpu", "cuda:0" */
  int host_accessible; /* 1 when data pointers can be dereferenced by the CPU */
  void *ud;            /* backend private data (device handle, stream, ...) */

  /* Memory: alloc returns NULL on failure; free(NULL) is a no-op. */
  void *(*alloc)(const lp_tensor_backend *be, size_t bytes);
  void (*free)(const lp_tensor_backend *be, void *p);
  /* Copies between this backend's memory and host memory (CPU: memcpy). */
  lp_status (*to_host)(const lp_tensor_backend *be, void *host_dst,
                       const void *src, size_t bytes);
  lp_status (*from_host)(const lp_tensor_backend *be, void *dst,
                         const void *host_src, size_t bytes);

  /* Row-major, strided-batched GEMM:
   *   for i < batch: C_i = alpha * op(A_i) * op(B_i) + beta * C_i
   * with op(A_i) m x k, op(B_i) k x n, A_i = a + i*stride_a, etc.
   * lda/ldb/ldc are row strides of the stored (untransposed) matrices.
   * batch == 1 is a plain GEMM; strides are then ignored. */
  lp_status (*gemm)(const lp_tensor_backend *be, int trans_a, int trans_b,
                    int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, int64_t stride_a,
                    const float *b, int64_t ldb, int64_t stride_b, float beta,
                    float *c, int64_t ldc, int64_t stride_c, int64_t batch);

  /* Dense elementwise ops over n floats. out may alias an input. */
  lp_status (*fill)(const lp_tensor_backend *be, int64_t n, float v, float *x);
  lp_status (*copy)(const lp_tensor_backend *be, int64_t n, const float *x,
                    float *out);
  lp_status (*axpy)(const lp_tensor_backend *be, int64_t n, float alpha,
                    const float *x, float *y); /* y += alpha * x */
  lp_status (*scale)(const lp_tensor_backend *be, int64_t n, float alpha,
                     float *x); /* x *= alpha */
  lp_status (*add)(const lp_tensor_backend *be, int64_t n, const float *a,
                   const float *b, float *out); /* out = a + b */
  lp_status (*mul)(const lp_tensor_backend *be, int64_t n, const float *a,
                   const float *b, float *out); /* out = a * b */
  /* y = act(x); dx = dy * act'(x) (dx may alias dy). */
  lp_status (*act)(const lp_tensor_backend *be, lp_tensor_act_kind kind,
                   int64_t n, const float *x, float *y);
  lp_status (*act_backward)(const lp_tensor_backend *be,
                            lp_tensor_act_kind kind, int64_t n, const float *x,
                            const float *dy, float *dx);
  /* Softmax of each of `rows` rows of `cols` floats (y may alias x). */
  lp_status (*softmax_rows)(const lp_tensor_backend *be, int64_t rows,
                            int64_t cols, const float *x, float *y);
  /* out[c] = beta * out[c] + sum_r x[r*cols + c] (sums in row order). */
  lp_status (*sum_rows)(const lp_tensor_backend *be, int64_t rows, int64_t cols,
                        const float *x, float beta, float *out);
  /* Row gather / scatter-add over rows of `cols` floats (MoE dispatch and
   * combine). idx and scale are HOST arrays of n entries (scale NULL: 1);
   * out and x do not alias.
   *   gather_rows:      out[i] = scale[i] * x[idx[i]]        for i < n
   *   scatter_add_rows: out[idx[i]] += scale[i] * x[i]       in order of i */
  lp_status (*gather_rows)(const lp_tensor_backend *be, int64_t n,
                           int64_t cols, const float *x, const int64_t *idx,
                           const float *scale, float *out);
  lp_status (*scatter_add_rows)(const lp_tensor_backend *be, int64_t n,
                                int64_t cols, const float *x,
                                const int64_t *idx, const float *scale,
                                float *out);

  /* ---- nn kernels: what layers, losses and optimizers run per element or
   * per row (the CPU versions are the reference loops; every backend gives
   * the same results within float rounding). Buffers are dense, row-major,
   * in this backend's memory; `rows` rows of `cols` (or `d`) floats. ---- */
  /* t[r, :] += v for every row r. */
  lp_status (*add_rowvec)(const lp_tensor_backend *be, int64_t rows,
                          int64_t cols, const float *v, float *t);
  /* RMSNorm: rstd[r] = 1 / sqrt(mean_c x[r,c]^2 + eps) (sum in double);
   * y[r,c] = x[r,c] * rstd[r] * w[c]. */
  lp_status (*rmsnorm)(const lp_tensor_backend *be, int64_t rows, int64_t d,
                       float eps, const float *x, const float *w, float *y,
                       float *rstd);
  /* RMSNorm backward: with xh = x * rstd, dx = rstd * (dy * w - xh *
   * mean_c(dy * w * xh)) when dx != NULL; gw[c] += sum_r dy * xh (rows in
   * order) when gw != NULL. */
  lp_status (*rmsnorm_backward)(const lp_tensor_backend *be, int64_t rows,
                                int64_t d, const float *x, const float *w,
                                const float *rstd, const float *dy, float *dx,
                                float *gw);
  /* Embedding lookup: y[r, :] = w[ids[r], :] for r < n; ids are integral
   * floats the caller checked to lie in [0, vocab). */
  lp_status (*embedding)(const lp_tensor_backend *be, int64_t n, int64_t dim,
                         const float *ids, const float *w, float *y);
  /* Embedding backward: gw[ids[r], :] += dy[r, :] for r = 0..n-1 in order;
   * gw is vocab x dim. */
  lp_status (*embedding_backward)(const lp_tensor_backend *be, int64_t n,
                                  int64_t dim, int64_t vocab, const float *ids,
                                  const float *dy, float *gw);
  /* Causal mask over rows of t floats: row r gets -inf at columns
   * j > r % t (rows are [.., T, T] score blocks). */
  lp_status (*causal_mask)(const lp_tensor_backend *be, int64_t rows,
                           int64_t t, float *s);
  /* Softmax backward in place: ds = p * (ds - sum_j ds[j] p[j]) per row. */
  lp_status (*softmax_backward_rows)(const lp_tensor_backend *be,
                                     int64_t rows, int64_t cols,
                                     const float *p, float *ds);
  /* Cross-entropy per row from logits and integral-float targets (checked
   * by the caller): loss[r] = logsumexp(l[r]) - l[r, t_r] in double (loss
   * is `rows` doubles of this backend's memory); dl = gs * (softmax -
   * onehot) when dl != NULL. */
  lp_status (*cross_entropy)(const lp_tensor_backend *be, int64_t rows,
                             int64_t cols, const float *logits,
                             const float *targets, double gs, double *loss,
                             float *dl);
  /* Squared error: sq[i] = (p[i] - t[i])^2 in double (n doubles of this
   * backend's memory); dp = gs * (p - t) when dp != NULL. */
  lp_status (*sq_error)(const lp_tensor_backend *be, int64_t n, const float *p,
                        const float *t, double gs, double *sq, float *dp);
  /* SGD with momentum, per element in double: g' = g + wd p; m = mu m + g';
   * p -= lr m. */
  lp_status (*sgd_step)(const lp_tensor_backend *be, int64_t n, double lr,
                        double mu, double wd, float *p, const float *g,
                        float *m);
  /* AdamW, per element in double: p *= decay; m = b1 m + (1-b1) g;
   * v = b2 v + (1-b2) g^2; p -= lr (m / bc1) / (sqrt(v / bc2) + eps). */
  lp_status (*adamw_step)(const lp_tensor_backend *be, int64_t n, double lr,
                          double b1, double b2, double eps, double decay,
                          double bc1, double bc2, float *p, const float *g,
                          float *m, float *v);
  /* Row dots (the MoE combine weights' gradient): out[i] = sum_c
   * a[idx[i], c] * b[i, c] over c < cols in order, in double, rounded to
   * float, for i < n. idx is a HOST array (NULL: row i of a). */
  lp_status (*dot_rows)(const lp_tensor_backend *be, int64_t n, int64_t cols,
                        const float *a, const int64_t *idx, const float *b,
                        float *out);
  /* Rotary embedding in DeepSeek's layout (adjacent pairs are complex
   * numbers, not the rotate-half split), in place: for row r < rows (at
   * position r % seq), head h < heads and pair i < d/2, z = x[r*ld + h*hs
   * + 2i] + i x[r*ld + h*hs + 2i + 1] becomes z * (c + i s), or z * (c - i
   * s) when conj (the backward), with c = cs[(r % seq)*d + 2i] and s =
   * cs[(r % seq)*d + 2i + 1] (cs: seq x d floats of this backend). Real
   * part x0 c - x1 s, imaginary part x0 s + x1 c, each in float. */
  lp_status (*rope)(const lp_tensor_backend *be, int64_t rows, int64_t seq,
                    int64_t heads, int64_t d, int64_t ld, int64_t hs,
                    const float *cs, int conj, float *x);
  /* Causal softmax over [.., T, T] score blocks: row r (position i = r %
   * t) becomes the softmax of its first i + 1 entries and zeros after (x's
   * entries after i do not matter; y may alias x): what causal_mask then
   * softmax_rows give, to the bit. Its backward in place: ds = p * (ds -
   * sum_{j<=i} ds[j] p[j]) on the first i + 1 entries, zeros after. NULL:
   * callers run causal_mask + softmax_rows (softmax_backward_rows). */
  lp_status (*causal_softmax_rows)(const lp_tensor_backend *be, int64_t rows, int64_t t,
                                   const float *x, float *y);
  lp_status (*causal_softmax_backward_rows)(const lp_tensor_backend *be, int64_t rows, int64_t t,
                                            const float *p, float *ds);

  /* Mixed-precision GEMM, as gemm but with every element of A and B
   * rounded to bf16 (nearest even) before the products, which are summed
   * in float32; C stays float32. NULL: the backend has none (callers answer
   * LP_ERR_UNSUPPORTED). */
  lp_status (*gemm_bf16)(const lp_tensor_backend *be, int trans_a,
                         int trans_b, int64_t m, int64_t n, int64_t k,
                         float alpha, const float *a, int64_t lda,
                         int64_t stride_a, const float *b, int64_t ldb,
                         int64_t stride_b, float beta, float *c, int64_t ldc,
                         int64_t stride_c, int64_t batch);
  /* The same with operands that may be bf16 already: a_h (b_h) = 1 when a
   * (b) points at bf16 values (uint16 bits, host memory; lda and stride_a
   * in elements), which are used as they are; 0 when it points at floats,
   * rounded as gemm_bf16 does. NULL: the backend has none (then a bf16
   * operand answers LP_ERR_UNSUPPORTED and a kept copy is not used). */
  lp_status (*gemm_bf16h)(const lp_tensor_backend *be, int trans_a,
                          int trans_b, int64_t m, int64_t n, int64_t k,
                          float alpha, const void *a, int a_h, int64_t lda,
                          int64_t stride_a, const void *b, int b_h,
                          int64_t ldb, int64_t stride_b, float beta, float *c,
                          int64_t ldc, int64_t stride_c, int64_t batch);
};

/* The CPU backend: lp_malloc memory, OpenBLAS sgemm, plain loops. Static
 * storage; never freed. Deterministic for a fixed OPENBLAS_NUM_THREADS. */
const lp_tensor_backend *lp_tensor_backend_cpu(void);

/* ======================================================================
 * Precision: the compute dtype of GEMMs. Tensors stay float32; a bf16 GEMM
 * rounds its inputs to bf16 and sums in float32 (gemm_bf16.c). On the CPU
 * oneDNN runs it where the build has oneDNN and the CPU has AVX512-BF16 or
 * AMX; elsewhere a float32 fallback over the same rounded inputs does
 * (equal products, another summation order).
 * ====================================================================== */

typedef enum lp_tensor_precision {
  LP_TENSOR_F32 = 0,
  LP_TENSOR_BF16 = 1
} lp_tensor_precision;

/* "f32" / "bf16". */
const char *lp_tensor_precision_name(lp_tensor_precision p);
/* 1 and *out set for "f32" ("float32"), "bf16" ("bfloat16"); else 0. */
int lp_tensor_precision_parse(const char *s, lp_tensor_precision *out);
/* float -> bf16 bits (round to nearest even; NaN stays a quiet NaN), back,
 * and the two together. */
uint16_t lp_tensor_bf16_from_float(float x);
float lp_tensor_bf16_to_float(uint16_t h);
float lp_tensor_bf16_round(float x);
/* bf16 on the wire (bf16_wire.c): n floats to bf16 bits and back (lossless
 * for values already rounded), n floats rounded in place
 * (lp_tensor_round_bf16 rounds a tensor). */
void lp_tensor_bf16_pack(const float *src, size_t n, uint16_t *dst);
void lp_tensor_bf16_unpack(const uint16_t *src, size_t n, float *dst);
void lp_tensor_bf16_round_buf(float *x, size_t n);
/* 1 when this build links oneDNN. */
int lp_tensor_have_onednn(void);
/* 1 when the CPU's bf16 GEMMs run on oneDNN (built with it, the CPU has
 * AVX512-BF16 or AMX, not forced off); the same on every call. */
int lp_tensor_bf16_native(void);
/* Which engine runs the CPU's bf16 GEMMs, in words (for summaries):
 * "oneDNN bf16 matmul (avx512_core_amx)", "float32 fallback (...why)". */
const char *lp_tensor_bf16_engine(void);
/* Tests and benchmarks: run the float32 fallback even where oneDNN could. */
void lp_tensor_bf16_force_fallback(int on);
/* The CPU backend's gemm_bf16 entry (the vtable's, callable directly). */
lp_status lp_tensor_cpu_gemm_bf16(const lp_tensor_backend *be, int trans_a,
                                  int trans_b, int64_t m, int64_t n, int64_t k,
                                  float alpha, const float *a, int64_t lda,
                                  int64_t stride_a, const float *b,
                                  int64_t ldb, int64_t stride_b, float beta,
                                  float *c, int64_t ldc, int64_t stride_c,
                                  int64_t batch);
/* The CPU backend's gemm_bf16h entry. */
lp_status lp_tensor_cpu_gemm_bf16h(const lp_tensor_backend *be, int trans_a,
                                   int trans_b, int64_t m, int64_t n,
                                   int64_t k, float alpha, const void *a,
                                   int a_h, int64_t lda, int64_t stride_a,
                                   const void *b, int b_h, int64_t ldb,
                                   int64_t stride_b, float beta, float *c,
                                   int64_t ldc, int64_t stride_c,
                                   int64_t batch);
/* Float32 GEMMs on the CPU run on OpenBLAS, or on oneDNN's float32 matmul
 * when LUAPIPE_F32_GEMM says: "onednn", or "auto" where OpenBLAS has only
 * its generic (pre-AVX2) kernels for this CPU and oneDNN has AVX2 or
 * better (a rule of the machine, the same on every rank of one kind of
 * machine). lp_tensor_f32_onednn says which (1: oneDNN);
 * lp_tensor_f32_engine says it in words; _force_openblas (tests,
 * benchmarks) turns oneDNN off. */
int lp_tensor_f32_onednn(void);
const char *lp_tensor_f32_engine(void);
void lp_tensor_f32_force_openblas(int on);
/* oneDNN's float32 matmul on host buffers, as the backend's gemm with
 * batch 1 (benchmarks); LP_ERR_UNSUPPORTED without oneDNN. */
lp_status lp_tensor_cpu_gemm_onednn_f32(int trans_a, int trans_b, int64_t m,
                                        int64_t n, int64_t k, float alpha,
                                        const float *a, int64_t lda,
                                        const float *b, int64_t ldb,
                                        float beta, float *c, int64_t ldc);

/* ======================================================================
 * Tensors
 *
 * An lp_tensor is a small header (shape, strides, data pointer) that holds
 * one reference to a refcounted storage. Views (lp_tensor_view, _rows,
 * _reshape, _transpose) are new headers on the same storage; the storage
 * lives until its last header is freed, so a view stays valid after the
 * tensor it came from is freed. Headers are single-owner: whoever receives
 * a `lp_tensor **out` frees it with lp_tensor_free. Storage refcounts are
 * atomic; a header itself must not be used from two threads at once.
 *
 * Strides are in elements. `data` already includes the view's offset.
 * Unless stated, an op accepts any strides (dense inputs take the backend
 * fast path; strided ones run on the host).
 * ====================================================================== */

#define LP_TENSOR_MAXDIM 4

typedef struct lp_tensor_storage lp_tensor_storage; /* opaque */

typedef struct lp_tensor {
  float *data; /* first element of this view (backend memory) */
  int ndim;    /* 1..LP_TENSOR_MAXDIM */
  int64_t shape[LP_TENSOR_MAXDIM];
  int64_t stride[LP_TENSOR_MAXDIM];
  lp_tensor_storage *storage;
} lp_tensor;

/* ---- creation (all: LP_OK and *out set, or a status and *out = NULL) ----
 * be == NULL means the CPU backend. ndim in 1..4, every dim >= 0.
 * LP_ERR_ARG for a bad shape, LP_ERR_NOMEM when allocation fails. */

/* Uninitialised contents. */
lp_status lp_tensor_empty(const lp_tensor_backend *be, int ndim,
                          const int64_t *shape, lp_tensor **out);
/* Zero-filled. */
lp_status lp_tensor_zeros(const lp_tensor_backend *be, int ndim,
                          const int64_t *shape, lp_tensor **out);
/* A dense copy of numel(shape) host floats from src. */
lp_status lp_tensor_from_data(const lp_tensor_backend *be, int ndim,
                              const int64_t *shape, const float *src,
                              lp_tensor **out);
/* A CPU tensor over caller memory (e.g. an MPI receive buffer); nothing is
 * copied and the storage never frees `data`: the caller keeps it alive and
 * unchanged for as long as any view of it (including ones stashed in nn
 * contexts) exists. */
lp_status lp_tensor_wrap(float *data, int ndim, const int64_t *shape,
                         lp_tensor **out);
/* Same shape and backend as t, dense; uninitialised / zero-filled. */
lp_status lp_tensor_empty_like(const lp_tensor *t, lp_tensor **out);
lp_status lp_tensor_zeros_like(const lp_tensor *t, lp_tensor **out);
/* A dense deep copy of t (any strides). */
lp_status lp_tensor_clone(const lp_tensor *t, lp_tensor **out);

/* Moves t's contents to backend `be` in place: new storage there, a copy
 * of the values, the old storage released; every holder of this header
 * (e.g. a chunk's parameter list) sees the move. t must be dense and the
 * only header on its storage (LP_ERR_ARG otherwise). No-op when t is
 * already there. On failure t is unchanged. */
lp_status lp_tensor_move(lp_tensor *t, const lp_tensor_backend *be);
/* A dense host (CPU) copy of t from any backend, any strides (tests,
 * checkpoints, reading results). */
lp_status lp_tensor_to_host(const lp_tensor *t, lp_tensor **out);
/* Copies a dense t's numel floats to / from host memory, whatever its
 * backend (memcpy on the CPU; a device copy that waits otherwise): for
 * code that packs tensors into host buffers (gradient all-reduce,
 * checkpoints, messages). LP_ERR_ARG when t is not dense. */
lp_status lp_tensor_read(const lp_tensor *t, float *dst);
lp_status lp_tensor_write(lp_tensor *t, const float *src);
/* Rounds *t's values to bf16 values in place, on any backend (device
 * memory through a host copy; bf16_wire.c). A strided *t is first replaced
 * by a dense copy (the old header freed), so every holder of a dense
 * tensor sees the rounding and the caller's header ends dense. */
lp_status lp_tensor_round_bf16(lp_tensor **t);

/* Frees the header and drops its storage reference. NULL is a no-op. */
void lp_tensor_free(lp_tensor *t);

/* ---- views: new headers on the same storage (no data copied) ---------- */

/* The same view again (a second owner of the storage). */
lp_status lp_tensor_view(const lp_tensor *t, lp_tensor **out);
/* Rows [start, start+count) of dim 0. LP_ERR_ARG when out of range. */
lp_status lp_tensor_rows(const lp_tensor *t, int64_t start, int64_t count,
                         lp_tensor **out);
/* A dense view with a new shape of the same numel. One entry may be -1
 * (inferred). Needs t dense (lp_tensor_is_contiguous); LP_ERR_ARG otherwise
 * — use lp_tensor_clone first. */
lp_status lp_tensor_reshape(const lp_tensor *t, int ndim, const int64_t *shape,
                            lp_tensor **out);
/* Swaps dims d0 and d1 (strides swapped; the result is not dense). */
lp_status lp_tensor_transpose(const lp_tensor *t, int d0, int d1,
                              lp_tensor **out);

/* ---- queries ---- */
int64_t lp_tensor_numel(const lp_tensor *t);
/* 1 when the view is dense row-major (no gaps, no reordering). */
int lp_tensor_is_contiguous(const lp_tensor *t);
/* 1 when shapes are equal (ndim and every dim). */
int lp_tensor_same_shape(const lp_tensor *a, const lp_tensor *b);
/* Rows = product of all dims but the last; cols = the last dim. */
void lp_tensor_rows_cols(const lp_tensor *t, int64_t *rows, int64_t *cols);
/* The backend that owns t's storage. */
const lp_tensor_backend *lp_tensor_backend_of(const lp_tensor *t);
/* Number of live headers on t's storage (for tests and memory accounting). */
int lp_tensor_storage_refs(const lp_tensor *t);
/* Bytes of t's storage (the whole allocation, not just this view). */
size_t lp_tensor_storage_bytes(const lp_tensor *t);
/* Bytes per element of t's storage: 4, or 2 for a packed bf16 tensor. */
size_t lp_tensor_elem_bytes(const lp_tensor *t);

/* ---- bf16 copies (gemm_bf16.c; see "Precision" above) ----------------
 * Weights: lp_tensor_keep_bf16 marks t's storage (a parameter's value) so
 * that bf16 GEMMs read a rounded copy of it made once per version instead
 * of rounding it on every call. Every write through this module (fill,
 * copy, write, the ops' outputs, the RNG fills) bumps the version; code that
 * writes a marked tensor's data any other way (an optimizer's kernel, a
 * receive into its buffer) calls lp_tensor_touch after, or the next GEMM
 * reads the old values. lp_tensor_move keeps the mark.
 *
 * Activations: lp_tensor_new_bf16 makes a new tensor of x's shape whose
 * storage holds x's values rounded to bf16 (half the bytes): what a GEMM at
 * bf16 would read of x, so keeping it for backward instead of x gives the
 * same results. A packed tensor is read only by lp_tensor_gemm_prec at
 * LP_TENSOR_BF16 and by copies out (lp_tensor_copy into a float tensor,
 * _clone, _read, _to_host: widened, exact); views of it (rows, reshape)
 * are fine; every other op answers LP_ERR_ARG. Host backends only
 * (LP_ERR_UNSUPPORTED elsewhere); x dense (LP_ERR_ARG). */
void lp_tensor_keep_bf16(lp_tensor *t);
void lp_tensor_touch(lp_tensor *t);
lp_status lp_tensor_new_bf16(const lp_tensor *x, lp_tensor **out);
/* 1 when t is a packed bf16 tensor. */
int lp_tensor_is_bf16(const lp_tensor *t);
/* t's bf16 values at t's first element (row strides as t's): a packed
 * tensor's own, or a kept tensor's copy (made again first when stale);
 * NULL for any other tensor, or when the copy cannot be allocated. */
const uint16_t *lp_tensor_bf16_data(const lp_tensor *t);

/* Address of element (i0..i3) (unused trailing indices are ignored). */
float *lp_tensor_at(const lp_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                    int64_t i3);

/* ---- ops: results go into caller-provided tensors ----------------------
 * Shapes must match exactly unless stated (LP_ERR_ARG otherwise); all
 * operands must be on one backend (LP_ERR_ARG). Element order of every
 * reduction is fixed, so results are bitwise reproducible. */

/* Every element of t = v. */
lp_status lp_tensor_fill(lp_tensor *t, float v);
/* dst = src elementwise (any strides, same shape). Also copies between
 * backends (host <-> device) when both are dense. */
lp_status lp_tensor_copy(lp_tensor *dst, const lp_tensor *src);
/* out = a + b;  out = a * b  (out may be a or b). */
lp_status lp_tensor_add(lp_tensor *out, const lp_tensor *a, const lp_tensor *b);
lp_status lp_tensor_mul(lp_tensor *out, const lp_tensor *a, const lp_tensor *b);
/* t *= alpha. */
lp_status lp_tensor_scale(lp_tensor *t, float alpha);
/* y += alpha * x. */
lp_status lp_tensor_axpy(lp_tensor *y, float alpha, const lp_tensor *x);
/* out = beta * out + column sums of x viewed as rows x cols (see
 * lp_tensor_rows_cols); out has cols elements (any shape). x dense. */
lp_status lp_tensor_sum_rows(lp_tensor *out, const lp_tensor *x, float beta);
/* t[r, :] += v for every row r of t viewed as rows x cols; v has cols
 * elements (any shape). Both dense. */
lp_status lp_tensor_add_rowvec(lp_tensor *t, const lp_tensor *v);
/* y = act(x);  dx = dy * act'(x)  (dx may be dy). */
lp_status lp_tensor_act(lp_tensor *y, lp_tensor_act_kind kind,
                        const lp_tensor *x);
lp_status lp_tensor_act_backward(lp_tensor *dx, lp_tensor_act_kind kind,
                                 const lp_tensor *x, const lp_tensor *dy);
/* Softmax over the last dim (y may be x). x, y dense. */
lp_status lp_tensor_softmax_rows(lp_tensor *y, const lp_tensor *x);
/* C = alpha * op(A) * op(B) + beta * C, op = transpose when trans_* != 0.
 * Each operand must look like a matrix: a dense tensor (viewed as rows x
 * cols, see lp_tensor_rows_cols), or a 2-D view with unit stride in one dim
 * (a row-slice or a transpose view). C needs unit column stride.
 * LP_ERR_ARG on shape mismatch. beta == 0 ignores C's old contents. */
lp_status lp_tensor_gemm(lp_tensor *c, float alpha, const lp_tensor *a,
                         int trans_a, const lp_tensor *b, int trans_b,
                         float beta);
/* The same at a precision: LP_TENSOR_F32 is lp_tensor_gemm; LP_TENSOR_BF16
 * runs the backend's gemm_bf16 (LP_ERR_UNSUPPORTED when it has none). */
lp_status lp_tensor_gemm_prec(lp_tensor *c, float alpha, const lp_tensor *a,
                              int trans_a, const lp_tensor *b, int trans_b,
                              float beta, lp_tensor_precision prec);

/* Row gather / index-add (rows as in lp_tensor_rows_cols; out and x dense,
 * same cols, no aliasing; idx, scale: host arrays, scale may be NULL).
 * gather: out[i] = scale[i] * x[idx[i]] for every row i of out.
 * index_add: out[idx[i]] += scale[i] * x[i] for every row i of x, in order.
 * LP_ERR_ARG when an index is outside out's / x's rows. */
lp_status lp_tensor_gather_rows(lp_tensor *out, const lp_tensor *x,
                                const int64_t *idx, const float *scale);
lp_status lp_tensor_index_add_rows(lp_tensor *out, const lp_tensor *x,
                                   const int64_t *idx, const float *scale);
/* out[i] = a[idx[i]] . b[i] (double sums, see the backend's dot_rows) for
 * every row i of b; a, b dense with the same cols, out dense with b's rows
 * elements; idx a host array (NULL: row i of a, then a and b have as many
 * rows). LP_ERR_ARG on a shape mismatch or an index outside a's rows. */
lp_status lp_tensor_dot_rows(lp_tensor *out, const lp_tensor *a,
                             const int64_t *idx, const lp_tensor *b);

/* ---- reductions and comparisons (host; double accumulation) ---- */
lp_status lp_tensor_sum(const lp_tensor *t, double *out);
lp_status lp_tensor_dot(const lp_tensor *a, const lp_tensor *b, double *out);
/* max |a - b| over elements. */
lp_status lp_tensor_max_abs_diff(const lp_tensor *a, const lp_tensor *b,
                                 double *out);
/* 1 when shapes match and every element is bitwise equal, else 0. */
int lp_tensor_equal(const lp_tensor *a, const lp_tensor *b);

/* ======================================================================
 * Deterministic RNG: xoshiro256** seeded through splitmix64, normals by
 * Box–Muller. The same seed gives the same sequence on every platform
 * (uniform draws are exact; normals use the C library's log/sqrt/cos).
 *
 * Parameter initialisation keys a stream by (seed, name) with
 * lp_tensor_rng_seed_name, so a model split into stages initialises each
 * parameter identically to the unsplit model as long as names agree.
 * ====================================================================== */

typedef struct lp_tensor_rng {
  uint64_t s[4];
  int has_spare;
  double spare;
} lp_tensor_rng;

void lp_tensor_rng_seed(lp_tensor_rng *r, uint64_t seed);
/* Seeds from (seed, FNV-1a hash of name). */
void lp_tensor_rng_seed_name(lp_tensor_rng *r, uint64_t seed, const char *name);
uint64_t lp_tensor_rng_next(lp_tensor_rng *r);
double lp_tensor_rng_uniform(lp_tensor_rng *r); /* [0, 1), 53 bits */
double lp_tensor_rng_normal(lp_tensor_rng *r);  /* N(0, 1) */
/* 64-bit FNV-1a of a NUL-terminated string. */
uint64_t lp_tensor_hash_name(const char *name);

/* Fills t (element order = row-major index order) with draws from
 * N(mean, std) / U[lo, hi). Host storage: any strides; other backends: dense
 * only (drawn on the host, then copied; LP_ERR_UNSUPPORTED if strided). */
lp_status lp_tensor_fill_normal(lp_tensor *t, lp_tensor_rng *r, float mean,
                                float std);
lp_status lp_tensor_fill_uniform(lp_tensor *t, lp_tensor_rng *r, float lo,
                                 float hi);

/* ---- the BLAS underneath (blas_core.c) ----
 * The name of the OpenBLAS kernel set in use ("SkylakeX", "Haswell",
 * "Prescott", ...). */
const char *lp_tensor_blas_core(void);
/* A kernel set for this CPU's vector units (AVX-512: "SkylakeX", AVX2 +
 * FMA: "Haswell") when OpenBLAS fell back to a generic one because it does
 * not know the CPU; NULL when the set in use is OpenBLAS's own choice or
 * there is nothing better. Takes effect only through OPENBLAS_CORETYPE in
 * a new process (the luapipe program does that: LUAPIPE_BLAS_CORE). */
const char *lp_tensor_blas_better_core(void);
