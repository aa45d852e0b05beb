/* gemm_bf16.c — the CPU backend's mixed-precision GEMM (bf16 inputs,
 * float32 accumulation and output) and oneDNN's float32 matmul.
 *
 * Two engines give the same numbers up to summation order:
 *  - oneDNN (built with LP_TENSOR_WITH_ONEDNN, run when the CPU has
 *    AVX512-BF16 or AMX, asked of oneDNN at run time): float operands are
 *    rounded to bf16 copies (round to nearest even, as oneDNN's own
 *    reorder does), operands in bf16 already (gemm_bf16h: a weight's kept
 *    copy, a packed activation; see lp_tensor.h) go as they are, with
 *    their own strides (a transposed use is a memory format, not a copy),
 *    and a oneDNN matmul multiplies them;
 *  - the float32 fallback: the operands are rounded to (or widened from)
 *    bf16 values held in floats and OpenBLAS sgemm multiplies them. A
 *    product of two bf16 values is exact in float32, so only the order of
 *    the sums differs.
 * Which one runs is fixed per process (lp_tensor_bf16_engine says which;
 * products under 64^3 multiply-adds take the fallback even there, a rule
 * of the shape), so every rank of a run on one kind of machine makes the
 * same choice.
 *
 * oneDNN primitives are cached by shape (a table under a mutex; a shape
 * with one dim off a multiple of 16 is split into a fixed-shape part and
 * a zero-padded 16-wide tail, dnnl_split; shapes with more ragged dims
 * share one primitive made for run-time dims, use_rt);
 * oneDNN runs on one OpenMP thread per rank unless OMP_NUM_THREADS says
 * otherwise, so results do not depend on how many cores a rank sees. */
#include "tensor_internal.h"

#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LP_TENSOR_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#endif

/* ---- bf16 rounding ---------------------------------------------------- */

uint16_t lp_tensor_bf16_from_float(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
    return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

float lp_tensor_bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

float lp_tensor_bf16_round(float x) {
  return lp_tensor_bf16_to_float(lp_tensor_bf16_from_float(x));
}

/* The loops below are lp_tensor_bf16_from_float / _to_float without
 * branches, so that the compiler vectorizes them; each has an AVX-512BW
 * twin, run where the CPU has it (integer operations: the same bits either
 * way). */
#define ROUND_BODY                                                         \
  for (int64_t i = 0; i < n; i++) {                                        \
    uint32_t u;                                                            \
    memcpy(&u, &src[i], sizeof u);                                         \
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;                   \
    uint32_t q = (u >> 16) | 0x0040u; /* NaN: a quiet NaN */               \
    dst[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);          \
  }
#define ROUNDF_BODY                                                        \
  for (int64_t i = 0; i < n; i++) {                                        \
    uint32_t u;                                                            \
    memcpy(&u, &src[i], sizeof u);                                         \
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;           \
    uint32_t q = (u & 0xffff0000u) | 0x00400000u;                          \
    u = (u & 0x7fffffffu) > 0x7f800000u ? q : r;                           \
    memcpy(&dst[i], &u, sizeof u);                                         \
  }
#define WIDEN_BODY                                                         \
  for (int64_t i = 0; i < n; i++) {                                        \
    uint32_t u = (uint32_t)src[i] << 16;                                   \
    memcpy(&dst[i], &u, sizeof u);                                         \
  }

static void round_to_c(int64_t n, const float *src, uint16_t *dst) { ROUND_BODY }
static void round_floats_c(int64_t n, const float *src, float *dst) { ROUNDF_BODY }
static void widen_c(int64_t n, const uint16_t *src, float *dst) { WIDEN_BODY }

#if defined(__x86_64__) && defined(__GNUC__)
#define AVX512 __attribute__((target("avx512f,avx512bw")))
AVX512 static void round_to_512(int64_t n, const float *src, uint16_t *dst) { ROUND_BODY }
AVX512 static void round_floats_512(int64_t n, const float *src, float *dst) { ROUNDF_BODY }
AVX512 static void widen_512(int64_t n, const uint16_t *src, float *dst) { WIDEN_BODY }
static int have_512(void) {
  static int v = -1; /* a rule of the machine, asked once */
  if (v < 0) {
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx512bw") ? 1 : 0;
  }
  return v;
}
#else
#define round_to_512 round_to_c
#define round_floats_512 round_floats_c
#define widen_512 widen_c
static int have_512(void) { return 0; }
#endif

void tensor_bf16_round_to(int64_t n, const float *src, uint16_t *dst) {
  (have_512() ? round_to_512 : round_to_c)(n, src, dst);
}

void tensor_bf16_round_floats(int64_t n, const float *src, float *dst) {
  (have_512() ? round_floats_512 : round_floats_c)(n, src, dst);
}

void tensor_bf16_widen(int64_t n, const uint16_t *src, float *dst) {
  (have_512() ? widen_512 : widen_c)(n, src, dst);
}

const char *lp_tensor_precision_name(lp_tensor_precision p) {
  return p == LP_TENSOR_BF16 ? "bf16" : "f32";
}

int lp_tensor_precision_parse(const char *s, lp_tensor_precision *out) {
  if (!s) return 0;
  if (!strcmp(s, "f32") || !strcmp(s, "float32")) {
    *out = LP_TENSOR_F32;
    return 1;
  }
  if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) {
    *out = LP_TENSOR_BF16;
    return 1;
  }
  return 0;
}

/* Rounds the stored rows x cols matrix at a (row stride lda; floats, or
 * bf16 values when h, widened exactly) to bf16 values held in floats,
 * dense (row stride cols) into dst. */
static void round_matrix(int64_t rows, int64_t cols, const void *a, int h,
                         int64_t lda, float *dst) {
  if (lda == cols) /* dense: one run */
    cols *= rows, rows = 1;
  for (int64_t r = 0; r < rows; r++)
    if (h)
      tensor_bf16_widen(cols, (const uint16_t *)a + r * lda, dst + r * cols);
    else
      tensor_bf16_round_floats(cols, (const float *)a + r * lda, dst + r * cols);
}

/* ---- engine choice ---------------------------------------------------- */

static int force_fallback; /* tests and benchmarks */
#ifdef LP_TENSOR_WITH_ONEDNN
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int env_fallback; /* LUAPIPE_BF16_FALLBACK=1 */

static void read_env(void) {
  env_fallback = lp_env_int("LUAPIPE_BF16_FALLBACK", 0) == 1;
}
#endif

void lp_tensor_bf16_force_fallback(int on) { force_fallback = !!on; }

int lp_tensor_have_onednn(void) {
#ifdef LP_TENSOR_WITH_ONEDNN
  return 1;
#else
  return 0;
#endif
}

#ifdef LP_TENSOR_WITH_ONEDNN

static pthread_once_t dnnl_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t dnnl_eng;
static dnnl_stream_t dnnl_strm;
static int dnnl_ok;      /* engine and stream made */
static int dnnl_bf16_ok; /* ... and the CPU has AVX512-BF16 or AMX */
static const char *dnnl_isa = "";

static void dnnl_init(void) {
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  /* the enum values are nested bit sets: bf16 needs all of its bits */
  dnnl_bf16_ok = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) ==
                 (unsigned)dnnl_cpu_isa_avx512_core_bf16;
  dnnl_isa = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_amx) ==
                     (unsigned)dnnl_cpu_isa_avx512_core_amx
                 ? "avx512_core_amx"
             : dnnl_bf16_ok ? "avx512_core_bf16"
                            : "no bf16 ISA";
  if (dnnl_engine_create(&dnnl_eng, dnnl_cpu, 0) != dnnl_success) return;
  if (dnnl_stream_create(&dnnl_strm, dnnl_eng, dnnl_stream_default_flags) !=
      dnnl_success) {
    dnnl_engine_destroy(dnnl_eng);
    return;
  }
  dnnl_ok = 1;
}

/* One OpenMP thread per rank unless the user set OMP_NUM_THREADS (the
 * setting is per thread, so every calling thread makes it once). */
static void dnnl_threads(void) {
  static _Thread_local int done;
  if (done) return;
  done = 1;
  if (!getenv("OMP_NUM_THREADS")) omp_set_num_threads(1);
}

/* Which primitive a shape gets, a rule of the shape alone (so every rank
 * and the one-process reference choose alike): one made for the exact
 * shape when m, n and k are multiples of 16 (the dense layers' shapes; the
 * fastest kernels), else one with the dims given at run time (shared by
 * every shape: MoE experts see a new token count at nearly every call,
 * and making a primitive per count costs more than the GEMM). */
/* m * n * k up to which the fallback runs (see lp_tensor_cpu_gemm_bf16):
 * at 64^3 the char-LM's bf16 step went from 1.27x float32's (OpenBLAS
 * AVX-512) to even with it; at 2e6, 1.2x again. 64^3 itself stays on the
 * fallback: oneDNN 2.6 gives it its gemm:jit kernel, not AMX (33 us a
 * call on the MoE LM's attention heads, DNNL_VERBOSE) */
#define SMALL_GEMM ((int64_t)64 * 64 * 64)
static int use_rt(int64_t m, int64_t n, int64_t k) {
  return (m | n | k) % 16 != 0;
}

typedef struct pkey {
  int rt; /* dims and strides at run time (then m..ldc are 0 in the key) */
  int bf16, ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  int64_t batch, sa, sb, sc; /* batch > 1: a batched matmul (strides of
                              * A, B, C between items); else 0 */
} pkey;

typedef struct pent {
  int used;
  pkey key;
  dnnl_primitive_t prim; /* NULL: oneDNN refused the shape */
  dnnl_memory_desc_t a, b, c;
} pent;

#define NCACHE 512
static pent cache[NCACHE];
static int cache_next;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

static int key_eq(const pkey *x, const pkey *y) {
  return x->rt == y->rt && x->bf16 == y->bf16 && x->ta == y->ta && x->tb == y->tb &&
         x->m == y->m && x->n == y->n && x->k == y->k && x->lda == y->lda &&
         x->ldb == y->ldb && x->ldc == y->ldc && x->alpha == y->alpha &&
         x->beta == y->beta && x->batch == y->batch && x->sa == y->sa &&
         x->sb == y->sb && x->sc == y->sc;
}

/* The memory descriptors of A (m x k; ta: stored k x m), B (k x n; tb:
 * stored n x k) and C (m x n) with row strides lda / ldb / ldc; with rt,
 * every dim and stride is left to run time. */
static int make_descs(const pkey *key, int rt, dnnl_memory_desc_t *a,
                      dnnl_memory_desc_t *b, dnnl_memory_desc_t *c) {
  dnnl_data_type_t dt = key->bf16 ? dnnl_bf16 : dnnl_f32;
  if (key->batch > 1) { /* fixed dims, a leading batch dim */
    dnnl_dims_t ad = {key->batch, key->m, key->k}, bd = {key->batch, key->k, key->n},
                cd = {key->batch, key->m, key->n};
    dnnl_dims_t as = {key->sa, key->ta ? 1 : key->lda, key->ta ? key->lda : 1};
    dnnl_dims_t bs = {key->sb, key->tb ? 1 : key->ldb, key->tb ? key->ldb : 1};
    dnnl_dims_t cs = {key->sc, key->ldc, 1};
    return dnnl_memory_desc_init_by_strides(a, 3, ad, dt, as) == dnnl_success &&
           dnnl_memory_desc_init_by_strides(b, 3, bd, dt, bs) == dnnl_success &&
           dnnl_memory_desc_init_by_strides(c, 3, cd, dnnl_f32, cs) == dnnl_success;
  }
  const int64_t R = DNNL_RUNTIME_DIM_VAL;
  dnnl_dims_t ad = {rt ? R : key->m, rt ? R : key->k};
  dnnl_dims_t bd = {rt ? R : key->k, rt ? R : key->n};
  dnnl_dims_t cd = {rt ? R : key->m, rt ? R : key->n};
  int64_t la = rt ? R : key->lda, lb = rt ? R : key->ldb, lc = rt ? R : key->ldc;
  dnnl_dims_t as = {key->ta ? 1 : la, key->ta ? la : 1};
  dnnl_dims_t bs = {key->tb ? 1 : lb, key->tb ? lb : 1};
  dnnl_dims_t cs = {lc, 1};
  return dnnl_memory_desc_init_by_strides(a, 2, ad, dt, as) == dnnl_success &&
         dnnl_memory_desc_init_by_strides(b, 2, bd, dt, bs) == dnnl_success &&
         dnnl_memory_desc_init_by_strides(c, 2, cd, dnnl_f32, cs) ==
             dnnl_success;
}

/* Makes the matmul for key: dst = alpha A B + beta dst (key->rt: for any
 * shape, the dims given at run time). Fills e (prim NULL when oneDNN has
 * no implementation). */
static void make_prim(const pkey *key, pent *e) {
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_matmul_desc_t md;
  e->prim = NULL;
  if (!make_descs(key, key->rt, &e->a, &e->b, &e->c) ||
      dnnl_matmul_desc_init(&md, &e->a, &e->b, NULL, &e->c) != dnnl_success ||
      dnnl_primitive_attr_create(&attr) != dnnl_success)
    return;
  if (key->alpha != 1.0f)
    dnnl_primitive_attr_set_output_scales(attr, 1, 0, &key->alpha);
  if (key->beta != 0.0f && dnnl_post_ops_create(&po) == dnnl_success) {
    dnnl_post_ops_append_sum(po, key->beta);
    dnnl_primitive_attr_set_post_ops(attr, po);
    dnnl_post_ops_destroy(po);
  }
  if (dnnl_primitive_desc_create(&pd, &md, attr, dnnl_eng, NULL) ==
      dnnl_success) {
    if (dnnl_primitive_create(&e->prim, pd) != dnnl_success) e->prim = NULL;
    dnnl_primitive_desc_destroy(pd);
  }
  dnnl_primitive_attr_destroy(attr);
}

/* The cache entry for key (its primitive made on first use; NULL when
 * oneDNN has none). Needs cache_mu held. */
static const pent *get_prim(const pkey *key) {
  pent *e = NULL;
  for (int i = 0; i < NCACHE && cache[i].used; i++)
    if (key_eq(&cache[i].key, key)) {
      e = &cache[i];
      break;
    }
  if (!e) {
    e = &cache[cache_next];
    cache_next = (cache_next + 1) % NCACHE;
    if (e->used && e->prim) dnnl_primitive_destroy(e->prim);
    e->used = 1;
    e->key = *key;
    make_prim(key, e);
  }
  return e;
}

/* Runs one matmul with the buffers given; LP_ERR_UNSUPPORTED when oneDNN
 * has no implementation for the shape, LP_ERR_INTERNAL when it fails. The
 * lock is held through the run (a rank computes on one thread; this keeps
 * an entry from being replaced while another thread runs it). */
static lp_status dnnl_run(const pkey *shape, int rt, const void *a,
                          const void *b, float *c) {
  pkey key = *shape;
  dnnl_memory_desc_t ad, bd, cd;
  if (rt) {
    key.rt = 1;
    key.m = key.n = key.k = key.lda = key.ldb = key.ldc = 0;
    if (!make_descs(shape, 0, &ad, &bd, &cd)) return LP_ERR_INTERNAL;
  }
  pthread_mutex_lock(&cache_mu);
  const pent *e = get_prim(&key);
  if (!e->prim) {
    pthread_mutex_unlock(&cache_mu);
    return LP_ERR_UNSUPPORTED;
  }
  if (!rt) ad = e->a, bd = e->b, cd = e->c;
  dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
  lp_status st = LP_ERR_INTERNAL;
  if (dnnl_memory_create(&ma, &ad, dnnl_eng, (void *)a) == dnnl_success &&
      dnnl_memory_create(&mb, &bd, dnnl_eng, (void *)b) == dnnl_success &&
      dnnl_memory_create(&mc, &cd, dnnl_eng, c) == dnnl_success) {
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    if (dnnl_primitive_execute(e->prim, dnnl_strm, 3, args) == dnnl_success &&
        dnnl_stream_wait(dnnl_strm) == dnnl_success)
      st = LP_OK;
  }
  pthread_mutex_unlock(&cache_mu);
  if (ma) dnnl_memory_destroy(ma);
  if (mb) dnnl_memory_destroy(mb);
  if (mc) dnnl_memory_destroy(mc);
  return st;
}

/* Rounds the stored rows x cols matrix at a (row stride lda) to a dense
 * bf16 copy. */
static void to_bf16(int64_t rows, int64_t cols, const float *a, int64_t lda,
                    uint16_t *dst) {
  if (lda == cols) /* dense: one run */
    cols *= rows, rows = 1;
  for (int64_t r = 0; r < rows; r++)
    tensor_bf16_round_to(cols, a + r * lda, dst + r * cols);
}

#endif /* LP_TENSOR_WITH_ONEDNN */

int lp_tensor_bf16_native(void) {
#ifdef LP_TENSOR_WITH_ONEDNN
  pthread_once(&dnnl_once, dnnl_init);
  pthread_once(&env_once, read_env);
  return dnnl_ok && dnnl_bf16_ok && !force_fallback && !env_fallback;
#else
  return 0;
#endif
}

const char *lp_tensor_bf16_engine(void) {
#ifdef LP_TENSOR_WITH_ONEDNN
  static char buf[96];
  if (lp_tensor_bf16_native()) {
    snprintf(buf, sizeof buf, "oneDNN bf16 matmul (%s)", dnnl_isa);
    return buf;
  }
  if (force_fallback) return "float32 fallback (bf16-rounded inputs; forced)";
  if (env_fallback)
    return "float32 fallback (bf16-rounded inputs; LUAPIPE_BF16_FALLBACK=1)";
  if (!dnnl_ok) return "float32 fallback (bf16-rounded inputs; oneDNN failed to start)";
  return "float32 fallback (bf16-rounded inputs; this CPU has no AVX512-BF16 or AMX)";
#else
  return "float32 fallback (bf16-rounded inputs; this build has no oneDNN)";
#endif
}

/* ---- float32: OpenBLAS, or oneDNN's matmul when asked ------------------
 * OpenBLAS picks its kernels by CPU model at load time; on a CPU it does
 * not know (a new model, or a VM that hides the model) it falls back to a
 * generic SSE3 core ("Prescott"), several times slower than oneDNN's
 * float32 matmul on the same AVX-512 hardware. LUAPIPE_F32_GEMM=onednn
 * sends float32 GEMMs to oneDNN, =auto only where OpenBLAS is generic and
 * oneDNN has AVX2 or better: a rule of the machine, so every rank of a job
 * on one kind of machine makes it alike (as OpenBLAS's own kernel choice
 * already does). The default stays OpenBLAS: oneDNN's sums differ in the
 * last bits, more so between the shapes that pipeline and EP splits give
 * (tests/mpi/test_train_recipe.sh's AdamW + clipping runs then exceed
 * their 1e-5 parameter tolerance by a little). */

static int force_openblas; /* tests and benchmarks */

void lp_tensor_f32_force_openblas(int on) { force_openblas = !!on; }

#ifdef LP_TENSOR_WITH_ONEDNN
/* 1 when OpenBLAS runs one of its AVX2 / AVX-512 kernels. */
static int blas_has_fast_core(void) {
  static const char *const fast[] = {"Haswell",    "Zen",        "SkylakeX",
                                     "Cooperlake", "SapphireRapids",
                                     "Sandybridge"};
  const char *core = openblas_get_corename();
  for (size_t i = 0; core && i < sizeof fast / sizeof fast[0]; i++)
    if (!strcmp(core, fast[i])) return 1;
  return 0;
}

static pthread_once_t f32_once = PTHREAD_ONCE_INIT;
static int f32_dnnl; /* LUAPIPE_F32_GEMM chose oneDNN (see above) */

static void f32_init(void) {
  pthread_once(&dnnl_once, dnnl_init);
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  const char *knob = getenv("LUAPIPE_F32_GEMM");
  if (!knob || !strcmp(knob, "openblas") || !*knob) return;
  if (!strcmp(knob, "onednn")) {
    f32_dnnl = dnnl_ok;
    return;
  }
  f32_dnnl = !strcmp(knob, "auto") && dnnl_ok && !blas_has_fast_core() &&
             ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx2) ==
                 (unsigned)dnnl_cpu_isa_avx2;
}
#endif

int lp_tensor_f32_onednn(void) {
#ifdef LP_TENSOR_WITH_ONEDNN
  pthread_once(&f32_once, f32_init);
  return f32_dnnl && !force_openblas;
#else
  return 0;
#endif
}

const char *lp_tensor_f32_engine(void) {
  static char buf[128];
  if (lp_tensor_f32_onednn())
    snprintf(buf, sizeof buf, "oneDNN f32 matmul (LUAPIPE_F32_GEMM; OpenBLAS's core here: %s)",
             openblas_get_corename());
  else
    snprintf(buf, sizeof buf, "OpenBLAS sgemm (%s)", openblas_get_corename());
  return buf;
}

/* ---- the GEMMs -------------------------------------------------------- */

static lp_status check_dims(int64_t m, int64_t n, int64_t k, int64_t lda,
                            int64_t ldb, int64_t ldc, int64_t batch) {
  if (m < 0 || n < 0 || k < 0 || batch < 0) return LP_ERR_ARG;
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX ||
      ldb > INT_MAX || ldc > INT_MAX)
    return LP_ERR_ARG;
  return LP_OK;
}

/* C = beta * C for the k == 0 case (no product to round). */
static void scale_c(int64_t m, int64_t n, float beta, float *c, int64_t ldc) {
  for (int64_t r = 0; r < m; r++)
    for (int64_t j = 0; j < n; j++)
      c[r * ldc + j] = beta == 0.0f ? 0.0f : beta * c[r * ldc + j];
}

/* The float32 fallback: round, then sgemm on the dense rounded copies. */
static lp_status gemm_bf16_fallback(int ta, int tb, int64_t m, int64_t n,
                                    int64_t k, float alpha, const void *a,
                                    int a_h, int64_t lda, int64_t stride_a,
                                    const void *b, int b_h, int64_t ldb,
                                    int64_t stride_b, float beta, float *c,
                                    int64_t ldc, int64_t stride_c,
                                    int64_t batch) {
  size_t ea = a_h ? sizeof(uint16_t) : sizeof(float);
  size_t eb = b_h ? sizeof(uint16_t) : sizeof(float);
  int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  float *ra = lp_malloc((size_t)(ar * ac + br * bc) * sizeof(float));
  if (!ra) return LP_ERR_NOMEM;
  float *rb = ra + ar * ac;
  for (int64_t i = 0; i < batch; i++) {
    round_matrix(ar, ac, (const char *)a + (size_t)(i * stride_a) * ea, a_h,
                 lda, ra);
    round_matrix(br, bc, (const char *)b + (size_t)(i * stride_b) * eb, b_h,
                 ldb, rb);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha,
                ra, (int)ac, rb, (int)bc, beta, c + i * stride_c, (int)ldc);
  }
  lp_free(ra);
  return LP_OK;
}

#ifdef LP_TENSOR_WITH_ONEDNN
/* One oneDNN matmul per batch item: operands in bf16 already go as they
 * are (their own row strides), float ones are rounded to dense copies. */
static lp_status matmul_bf16(int ta, int tb, int64_t m, int64_t n, int64_t k,
                           float alpha, const void *a, int a_h, int64_t lda,
                           int64_t stride_a, const void *b, int b_h,
                           int64_t ldb, int64_t stride_b, float beta,
                           float *c, int64_t ldc, int64_t stride_c,
                           int64_t batch) {
  dnnl_threads();
  int64_t ar = ta ? k : m, ac = ta ? m : k;
  int64_t br = tb ? n : k, bc = tb ? k : n;
  pkey key = {0, 1, ta, tb, m, n, k, a_h ? lda : ac, b_h ? ldb : bc, ldc,
              alpha, beta, 0, 0, 0, 0};
  int rt = use_rt(m, n, k);
  size_t na = a_h ? 0 : (size_t)(ar * ac), nb = b_h ? 0 : (size_t)(br * bc);
  uint16_t *tmp = NULL;
  if (na + nb && !(tmp = lp_malloc((na + nb) * sizeof(uint16_t))))
    return LP_ERR_NOMEM;
  lp_status st = LP_OK;
  for (int64_t i = 0; i < batch && st == LP_OK; i++) {
    const uint16_t *pa, *pb;
    if (a_h) {
      pa = (const uint16_t *)a + i * stride_a;
    } else {
      to_bf16(ar, ac, (const float *)a + i * stride_a, lda, tmp);
      pa = tmp;
    }
    if (b_h) {
      pb = (const uint16_t *)b + i * stride_b;
    } else {
      to_bf16(br, bc, (const float *)b + i * stride_b, ldb, tmp + na);
      pb = tmp + na;
    }
    st = dnnl_run(&key, rt, pa, pb, c + i * stride_c);
  }
  lp_free(tmp);
  return st;
}

/* dst (rows_p x cols_p, dense bf16) = the logical block [r0, r0 + rows) x
 * [c0, c0 + cols) of op(P) (op: transposed when t; P floats, rounded, or
 * bf16 values when h; row stride ld), zeros around it. */
static void gather_block(const void *p, int h, int t, int64_t ld, int64_t r0,
                         int64_t rows, int64_t c0, int64_t cols,
                         int64_t rows_p, int64_t cols_p, uint16_t *dst) {
  memset(dst, 0, (size_t)(rows_p * cols_p) * sizeof *dst);
  if (!t) { /* rows of P: whole runs */
    for (int64_t i = 0; i < rows; i++) {
      int64_t at = (r0 + i) * ld + c0;
      if (h)
        memcpy(dst + i * cols_p, (const uint16_t *)p + at, (size_t)cols * sizeof *dst);
      else
        tensor_bf16_round_to(cols, (const float *)p + at, dst + i * cols_p);
    }
    return;
  }
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) {
      int64_t at = t ? (c0 + j) * ld + (r0 + i) : (r0 + i) * ld + (c0 + j);
      dst[i * cols_p + j] = h ? ((const uint16_t *)p)[at]
                              : lp_tensor_bf16_from_float(((const float *)p)[at]);
    }
}

/* The oneDNN path with shapes kept to multiples of 16 where one dim is
 * not (MoE experts' token counts: m in their forward and dx, k in their
 * weight-grads): oneDNN's kernels for fixed shapes (AMX) instead of the
 * much slower one it has for run-time dims. The first multiple-of-16 rows
 * (or sum terms) go to a primitive of that shape; the rest, padded with
 * zeros to 16, to a 16-row (16-term) one. Two calls cost more than one
 * run-time-dims call when the ragged dim is small (the MoE LM's experts
 * of ~32 tokens: its step 0.93x; DeepSeek-V3 bench's ~256: 1.2x), so
 * under SPLIT_MIN, or with two or more ragged dims, the run-time-dims
 * primitive runs. A rule of the shape: every rank splits alike. */
#define SPLIT_MIN 64
static lp_status dnnl_split(int ta, int tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const void *a, int a_h, int64_t lda,
                            int64_t stride_a, const void *b, int b_h,
                            int64_t ldb, int64_t stride_b, float beta,
                            float *c, int64_t ldc, int64_t stride_c,
                            int64_t batch) {
  int64_t m16 = m & ~(int64_t)15, k16 = k & ~(int64_t)15;
  int split_m = m % 16 && n % 16 == 0 && k % 16 == 0 && m16 >= SPLIT_MIN;
  int split_k = !split_m && k % 16 && m % 16 == 0 && n % 16 == 0 && k16 >= SPLIT_MIN;
  if (!split_m && !split_k)
    return matmul_bf16(ta, tb, m, n, k, alpha, a, a_h, lda, stride_a, b, b_h, ldb,
                     stride_b, beta, c, ldc, stride_c, batch);
  size_t ea = a_h ? sizeof(uint16_t) : sizeof(float);
  size_t eb = b_h ? sizeof(uint16_t) : sizeof(float);
  int64_t rm = split_m ? m - m16 : m, rk = split_k ? k - k16 : k;
  /* the tail: A's rest padded (16 x k, or m x 16 with B's rest 16 x n);
   * its result (16 x n, or added into C) */
  int64_t pm = split_m ? 16 : m, pk = split_k ? 16 : k, nb = split_k ? 16 * n : 0;
  uint16_t *ta_ = lp_malloc((size_t)(pm * pk + nb) * sizeof(uint16_t));
  float *tc = split_m ? lp_malloc((size_t)(16 * n) * sizeof(float)) : NULL;
  if (!ta_ || (split_m && !tc)) {
    lp_free(ta_), lp_free(tc);
    return LP_ERR_NOMEM;
  }
  uint16_t *tb_ = ta_ + pm * pk;
  lp_status st = LP_OK;
  for (int64_t i = 0; i < batch && st == LP_OK; i++) {
    const char *ai = (const char *)a + (size_t)(i * stride_a) * ea;
    const char *bi = (const char *)b + (size_t)(i * stride_b) * eb;
    float *ci = c + i * stride_c;
    /* the multiple-of-16 part */
    st = matmul_bf16(ta, tb, split_m ? m16 : m, n, split_k ? k16 : k, alpha, ai,
                   a_h, lda, 0, bi, b_h, ldb, 0, beta, ci, ldc, 0, 1);
    if (st != LP_OK) break;
    if (split_m) { /* rows m16.. of op(A), all of B as it is */
      gather_block(ai, a_h, ta, lda, m16, rm, 0, k, 16, k, ta_);
      st = matmul_bf16(0, tb, 16, n, k, alpha, ta_, 1, k, 0, bi, b_h, ldb, 0, 0.0f,
                     tc, n, 0, 1);
      for (int64_t r = 0; r < rm && st == LP_OK; r++)
        for (int64_t j = 0; j < n; j++) {
          float *o = &ci[(m16 + r) * ldc + j];
          *o = (beta == 0.0f ? 0.0f : beta * *o) + tc[r * n + j];
        }
    } else { /* sum terms k16.. of op(A) and op(B), added to C */
      gather_block(ai, a_h, ta, lda, 0, m, k16, rk, m, 16, ta_);
      gather_block(bi, b_h, tb, ldb, k16, rk, 0, n, 16, n, tb_);
      st = matmul_bf16(0, 0, m, n, 16, alpha, ta_, 1, 16, 0, tb_, 1, n, 0, 1.0f, ci,
                     ldc, 0, 1);
    }
    /* C holds part of the result: no falling back now */
    if (st == LP_ERR_UNSUPPORTED) st = LP_ERR_INTERNAL;
  }
  lp_free(ta_), lp_free(tc);
  return st;
}
#endif

lp_status lp_tensor_cpu_gemm_bf16(const lp_tensor_backend *be, int trans_a,
                                  int trans_b, int64_t m, int64_t n, int64_t k,
                                  float alpha, const float *a, int64_t lda,
                                  int64_t stride_a, const float *b,
                                  int64_t ldb, int64_t stride_b, float beta,
                                  float *c, int64_t ldc, int64_t stride_c,
                                  int64_t batch) {
  return lp_tensor_cpu_gemm_bf16h(be, trans_a, trans_b, m, n, k, alpha, a, 0,
                                  lda, stride_a, b, 0, ldb, stride_b, beta, c,
                                  ldc, stride_c, batch);
}

lp_status lp_tensor_cpu_gemm_bf16h(const lp_tensor_backend *be, int trans_a,
                                   int trans_b, int64_t m, int64_t n,
                                   int64_t k, float alpha, const void *a,
                                   int a_h, int64_t lda, int64_t stride_a,
                                   const void *b, int b_h, int64_t ldb,
                                   int64_t stride_b, float beta, float *c,
                                   int64_t ldc, int64_t stride_c,
                                   int64_t batch) {
  (void)be;
  a_h = !!a_h, b_h = !!b_h;
  LP_CHECK(check_dims(m, n, k, lda, ldb, ldc, batch));
  if (m == 0 || n == 0 || batch == 0) return LP_OK;
  trans_a = !!trans_a, trans_b = !!trans_b;
  if (k == 0) {
    for (int64_t i = 0; i < batch; i++)
      scale_c(m, n, beta, c + i * stride_c, ldc);
    return LP_OK;
  }
#ifdef LP_TENSOR_WITH_ONEDNN
  /* small products (attention's per-head GEMMs) cost less on the fallback
   * than a oneDNN call's fixed price; a rule of the shape, so every rank
   * makes the same choice */
  if (lp_tensor_bf16_native() && m * n * k > SMALL_GEMM) {
    lp_status st = dnnl_split(trans_a, trans_b, m, n, k, alpha, a, a_h, lda,
                              stride_a, b, b_h, ldb, stride_b, beta, c, ldc,
                              stride_c, batch);
    if (st != LP_ERR_UNSUPPORTED) return st;
    /* no oneDNN kernel for this shape (the same on every rank): the
     * fallback gives the same products */
  }
#endif
  return gemm_bf16_fallback(trans_a, trans_b, m, n, k, alpha, a, a_h, lda,
                            stride_a, b, b_h, ldb, stride_b, beta, c, ldc,
                            stride_c, batch);
}

lp_status lp_tensor_cpu_gemm_onednn_f32(int trans_a, int trans_b, int64_t m,
                                        int64_t n, int64_t k, float alpha,
                                        const float *a, int64_t lda,
                                        const float *b, int64_t ldb,
                                        float beta, float *c, int64_t ldc) {
  LP_CHECK(check_dims(m, n, k, lda, ldb, ldc, 1));
#ifdef LP_TENSOR_WITH_ONEDNN
  pthread_once(&dnnl_once, dnnl_init);
  if (!dnnl_ok) return LP_ERR_UNSUPPORTED;
  if (m == 0 || n == 0) return LP_OK;
  if (k == 0) {
    scale_c(m, n, beta, c, ldc);
    return LP_OK;
  }
  dnnl_threads();
  pkey key = {0, 0, !!trans_a, !!trans_b, m, n, k, lda, ldb, ldc, alpha, beta, 0, 0, 0, 0};
  return dnnl_run(&key, use_rt(m, n, k), a, b, c);
#else
  (void)trans_a, (void)trans_b, (void)alpha, (void)a, (void)b, (void)beta;
  (void)c;
  return LP_ERR_UNSUPPORTED;
#endif
}
