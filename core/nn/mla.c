/* mla.c — DeepSeek-V3's Multi-head Latent Attention as one layer (kind
 * "mla"), with model.py's parameter names, its RoPE layout (adjacent pairs
 * as complex numbers) and its YaRN frequencies; lp_nn.h has the math.
 *
 * Layout: N = batch*seq rows. q [N, H*dq] (head h: columns h*dq.., its
 * last dr rotated in place), c [N, kv_lora_rank] and k_pe [N, dr] (the
 * two row blocks of wkv_a, so no split copy), kv [N, H*(dn+dv)] (head h:
 * dn key columns then dv value columns), P [B, H, T, T], o [N, H*dv].
 * Per-head GEMMs run in place on these with strided batches over heads;
 * the shared k_pe is a batch operand of stride 0.
 *
 * ctx slots (mla_slot): forward keeps everything backward reads; input_grad
 * drops q, kv, k_pe, the rotation table and P, and keeps the gradients W
 * needs (dy, dq, dkv, d(kv_norm out), dc, dk_pe, and with q LoRA d(q_norm
 * out), d(wq_a out)). The rotation table (cos, sin per position and pair)
 * is made on the host, copied to the input's backend and kept by the layer
 * (rows for the longest seq seen so far); a call keeps a view of its first
 * seq rows, and the backend's rope op applies it. */
#include "nn_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef enum mla_slot {
  M_X, M_QA, M_QN, M_RQ, M_Q, M_C, M_RKV, M_CN, M_KV, M_KPE, M_CS, M_P, M_O,
  M_DY, M_DQ, M_DQN, M_DQA, M_DKV, M_DCN, M_DC, M_DKPE, M__N
} mla_slot;

typedef struct mla_priv {
  lp_nn_mla_opts o;
  float *freqs; /* qk_rope_head_dim / 2 */
  float scale;  /* softmax scale */
  lp_tensor *cs; /* the rotation table of the longest seq so far, or NULL:
                  * a layer runs on one thread at a time, as its grads do */
} mla_priv;

/* ---- configuration ---- */

lp_nn_mla_opts lp_nn_mla_defaults(void) {
  lp_nn_mla_opts o;
  memset(&o, 0, sizeof o);
  o.dim = 2048, o.n_heads = 16, o.q_lora_rank = 0, o.kv_lora_rank = 512;
  o.qk_nope_head_dim = 128, o.qk_rope_head_dim = 64, o.v_head_dim = 128;
  o.max_seq_len = 4096 * 4, o.original_seq_len = 4096;
  o.rope_theta = 10000.0, o.rope_factor = 40.0, o.beta_fast = 32.0;
  o.beta_slow = 1.0, o.mscale = 1.0, o.eps = 1e-6f;
  return o;
}

static int yarn_on(const lp_nn_mla_opts *o) {
  return o->max_seq_len > o->original_seq_len;
}

lp_status lp_nn_mla_check(const lp_nn_mla_opts *o, const char **why) {
  const char *w = NULL;
  if (!o) w = "no options";
  else if (o->dim < 1) w = "dim must be >= 1";
  else if (o->n_heads < 1) w = "n_heads must be >= 1";
  else if (o->q_lora_rank < 0) w = "q_lora_rank must be >= 0";
  else if (o->kv_lora_rank < 1) w = "kv_lora_rank must be >= 1";
  else if (o->qk_nope_head_dim < 1) w = "qk_nope_head_dim must be >= 1";
  else if (o->qk_rope_head_dim < 2 || o->qk_rope_head_dim % 2)
    w = "qk_rope_head_dim must be even and >= 2";
  else if (o->v_head_dim < 1) w = "v_head_dim must be >= 1";
  else if (o->max_seq_len < 1) w = "max_seq_len must be >= 1";
  else if (!(o->rope_theta > 1.0)) w = "rope_theta must be > 1";
  else if (!(o->eps >= 0.0f)) w = "eps must be >= 0";
  else if (yarn_on(o) && o->original_seq_len < 1)
    w = "original_seq_len must be >= 1";
  else if (yarn_on(o) && !(o->rope_factor > 0.0))
    w = "rope_factor must be > 0 (YaRN applies: max_seq_len > original_seq_len)";
  else if (yarn_on(o) && !(o->beta_fast > 0.0 && o->beta_slow > 0.0))
    w = "beta_fast and beta_slow must be > 0 (YaRN applies)";
  if (why) *why = w;
  return w ? LP_ERR_ARG : LP_OK;
}

/* model.py's precompute_freqs_cis, the frequencies part, in its float32
 * steps: f_i = 1 / theta^(2i/d); with YaRN, the correction range [low,
 * high] (in double, as Python computes it) and a linear ramp over the
 * pairs blend f / factor (below low) into f (above high). */
lp_status lp_nn_mla_rope_freqs(const lp_nn_mla_opts *o, float *freqs) {
  LP_CHECK(lp_nn_mla_check(o, NULL));
  if (!freqs) return LP_ERR_ARG;
  int64_t d = o->qk_rope_head_dim, half = d / 2;
  float base = (float)o->rope_theta;
  for (int64_t i = 0; i < half; i++) {
    float e = (float)(2 * i) / (float)d;
    freqs[i] = 1.0f / powf(base, e);
  }
  if (!yarn_on(o)) return LP_OK;
  const double pi = 3.14159265358979323846;
  double lb = log(o->rope_theta), L = (double)o->original_seq_len;
  double lo_d = (double)d * log(L / (o->beta_fast * 2.0 * pi)) / (2.0 * lb);
  double hi_d = (double)d * log(L / (o->beta_slow * 2.0 * pi)) / (2.0 * lb);
  double lo = floor(lo_d), hi = ceil(hi_d);
  if (lo < 0) lo = 0;
  if (hi > (double)(d - 1)) hi = (double)(d - 1);
  if (lo == hi) hi += 0.001;
  float span = (float)(hi - lo), factor = (float)o->rope_factor;
  for (int64_t i = 0; i < half; i++) {
    float ramp = ((float)i - (float)lo) / span;
    ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
    float smooth = 1.0f - ramp, f = freqs[i];
    freqs[i] = f / factor * (1.0f - smooth) + f * smooth;
  }
  return LP_OK;
}

double lp_nn_mla_softmax_scale(const lp_nn_mla_opts *o) {
  double s = pow((double)(o->qk_nope_head_dim + o->qk_rope_head_dim), -0.5);
  if (yarn_on(o)) {
    double m = 0.1 * o->mscale * log(o->rope_factor) + 1.0;
    s = s * m * m;
  }
  return s;
}

/* ---- helpers ---- */

/* Parameter values / grads by role (q LoRA shifts the rest by two). */
enum { W_Q, W_QA, W_QN, W_QB, W_KVA, W_KVN, W_KVB, W_O };
static lp_nn_param *par(lp_nn_layer *l, int role) {
  int lora = ((mla_priv *)l->sub)->o.q_lora_rank > 0;
  int base = lora ? 3 : 1;
  switch (role) {
  case W_Q: case W_QA: return &l->params[0];
  case W_QN: return &l->params[1];
  case W_QB: return &l->params[2];
  case W_KVA: return &l->params[base];
  case W_KVN: return &l->params[base + 1];
  case W_KVB: return &l->params[base + 2];
  default: return &l->params[base + 3];
  }
}
#define VAL(role) (par(l, role)->value->data)
#define GRAD(role) (par(l, role)->grad->data)

/* At bf16, an operand that points into one of l's weights is read from
 * the weight's kept bf16 copy (lp_tensor_bf16_data: made once per change,
 * not rounded per call); *h = 1 then. Anything else stays as it is. */
static const void *operand(const lp_nn_layer *l, const lp_tensor_backend *be,
                           const float *p, int *h) {
  *h = 0;
  if (l->precision != LP_TENSOR_BF16 || !be->gemm_bf16h) return p;
  for (size_t i = 0; i < l->nparams; i++) {
    const lp_tensor *w = l->params[i].value;
    uintptr_t lo = (uintptr_t)w->data, at = (uintptr_t)p;
    if (w->ndim == 2 && at >= lo && at < lo + (uintptr_t)lp_tensor_numel(w) * sizeof(float)) {
      const uint16_t *c = lp_tensor_bf16_data(w);
      if (!c) return p;
      *h = 1;
      return c + (p - w->data);
    }
  }
  return p;
}

/* C = alpha op(A) op(B) + beta C over `h` items (operand i of item j at
 * x + j * s_x), at the layer's precision (bf16: the backend's gemm_bf16,
 * weights from their kept copies). */
static lp_status hm(const lp_nn_layer *l, const lp_tensor_backend *be,
                    int ta, int tb, int64_t m, int64_t n, int64_t k,
                    float alpha, const float *a, int64_t lda, int64_t sa,
                    const float *b, int64_t ldb, int64_t sb, float beta,
                    float *c, int64_t ldc, int64_t sc, int64_t h) {
  lp_tensor_precision prec = l->precision;
  if (prec == LP_TENSOR_BF16 && !be->gemm_bf16) return LP_ERR_UNSUPPORTED;
  int ah, bh;
  const void *pa = operand(l, be, a, &ah), *pb = operand(l, be, b, &bh);
  if (ah || bh)
    return be->gemm_bf16h(be, ta, tb, m, n, k, alpha, pa, ah, lda, sa, pb, bh, ldb,
                          sb, beta, c, ldc, sc, h);
  return (prec == LP_TENSOR_BF16 ? be->gemm_bf16 : be->gemm)(
      be, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, h);
}

/* The same, one matrix. */
static lp_status mm(const lp_nn_layer *l, const lp_tensor_backend *be,
                    int ta, int tb, int64_t m, int64_t n, int64_t k,
                    float alpha, const float *a, int64_t lda, const float *b,
                    int64_t ldb, float beta, float *c, int64_t ldc) {
  return hm(l, be, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

/* The rotation table for positions 0..T-1 on backend be: [T, dr], (cos,
 * sin) of the float32 angle t * f_i for each pair, as torch.polar of
 * torch.outer(t, freqs) gives them. */
static lp_status rope_table_make(const mla_priv *m, int64_t T, const lp_tensor_backend *be,
                                 lp_tensor **out) {
  int64_t d = m->o.qk_rope_head_dim;
  float *h = lp_malloc(sizeof(float) * (size_t)(T * d));
  if (!h) return LP_ERR_NOMEM;
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < d / 2; i++) {
      float ang = (float)t * m->freqs[i];
      h[t * d + 2 * i] = (float)cos((double)ang);
      h[t * d + 2 * i + 1] = (float)sin((double)ang);
    }
  lp_status st = lp_tensor_from_data(be, 2, (int64_t[]){T, d}, h, out);
  lp_free(h);
  return st;
}

/* *out: a new view of the first T rows of the layer's table on be (an
 * entry depends only on its position and pair, so the rows of a longer
 * table are the same bits), made anew only for a longer T or another
 * backend. */
static lp_status rope_table(mla_priv *m, int64_t T, const lp_tensor_backend *be, lp_tensor **out) {
  if (!m->cs || m->cs->shape[0] < T || lp_tensor_backend_of(m->cs) != be) {
    lp_tensor *t = NULL;
    LP_CHECK(rope_table_make(m, T, be, &t));
    lp_tensor_free(m->cs); /* views that calls keep hold its storage */
    m->cs = t;
  }
  return lp_tensor_rows(m->cs, 0, T, out);
}

static lp_status new2(const lp_tensor_backend *be, int64_t r, int64_t c,
                      lp_tensor **out) {
  return lp_tensor_empty(be, 2, (int64_t[]){r, c}, out);
}

/* ---- forward ---- */

static lp_status mla_forward(lp_nn_layer *l, lp_nn_ctx *ctx,
                             const lp_tensor *x, lp_tensor **y) {
  mla_priv *m = l->sub;
  const lp_nn_mla_opts *o = &m->o;
  int64_t D = o->dim;
  if (x->ndim != 3 || x->shape[2] != D) {
    char a[64];
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "input must be [batch, seq, %lld], got %s", (long long)D,
                   nn_shape_str(x, a, sizeof a));
  }
  if (x->shape[1] > o->max_seq_len)
    return nn_fail(ctx, l, LP_ERR_ARG,
                   "sequence length %lld is more than max_seq_len %lld",
                   (long long)x->shape[1], (long long)o->max_seq_len);
  LP_CHECK(nn_check_device(ctx, l, "input", x));
  int64_t B = x->shape[0], T = x->shape[1], N = B * T, H = o->n_heads;
  int64_t dn = o->qk_nope_head_dim, dr = o->qk_rope_head_dim, dq = dn + dr;
  int64_t dv = o->v_head_dim, kvr = o->kv_lora_rank, qr = o->q_lora_rank;
  int64_t HQ = H * dq, HKV = H * (dn + dv), HV = H * dv;
  const lp_tensor_backend *be = lp_tensor_backend_of(x);
  lp_tensor *s[M__N] = {0};
  lp_status st;
  LP_CHECK(nn_dense(x, &s[M_X]));
  const float *xp = s[M_X]->data;
  /* query: wq, or wq_a -> q_norm -> wq_b */
  LP_CHECK_GOTO(new2(be, N, HQ, &s[M_Q]), st, fail);
  if (qr > 0) {
    LP_CHECK_GOTO(new2(be, N, qr, &s[M_QA]), st, fail);
    LP_CHECK_GOTO(new2(be, N, qr, &s[M_QN]), st, fail);
    LP_CHECK_GOTO(lp_tensor_empty(be, 1, (int64_t[]){N}, &s[M_RQ]), st, fail);
    LP_CHECK_GOTO(mm(l, be, 0, 1, N, qr, D, 1.0f, xp, D, VAL(W_QA), D, 0.0f,
                     s[M_QA]->data, qr), st, fail);
    LP_CHECK_GOTO(be->rmsnorm(be, N, qr, o->eps, s[M_QA]->data, VAL(W_QN),
                              s[M_QN]->data, s[M_RQ]->data), st, fail);
    LP_CHECK_GOTO(mm(l, be, 0, 1, N, HQ, qr, 1.0f, s[M_QN]->data, qr, VAL(W_QB),
                     qr, 0.0f, s[M_Q]->data, HQ), st, fail);
  } else {
    LP_CHECK_GOTO(mm(l, be, 0, 1, N, HQ, D, 1.0f, xp, D, VAL(W_Q), D, 0.0f,
                     s[M_Q]->data, HQ), st, fail);
  }
  /* wkv_a's two row blocks: the latent c and the shared rope key */
  LP_CHECK_GOTO(new2(be, N, kvr, &s[M_C]), st, fail);
  LP_CHECK_GOTO(new2(be, N, dr, &s[M_KPE]), st, fail);
  LP_CHECK_GOTO(mm(l, be, 0, 1, N, kvr, D, 1.0f, xp, D, VAL(W_KVA), D, 0.0f,
                   s[M_C]->data, kvr), st, fail);
  LP_CHECK_GOTO(mm(l, be, 0, 1, N, dr, D, 1.0f, xp, D, VAL(W_KVA) + kvr * D, D,
                   0.0f, s[M_KPE]->data, dr), st, fail);
  /* kv_norm -> wkv_b: per-head nope keys and values */
  LP_CHECK_GOTO(new2(be, N, kvr, &s[M_CN]), st, fail);
  LP_CHECK_GOTO(lp_tensor_empty(be, 1, (int64_t[]){N}, &s[M_RKV]), st, fail);
  LP_CHECK_GOTO(be->rmsnorm(be, N, kvr, o->eps, s[M_C]->data, VAL(W_KVN),
                            s[M_CN]->data, s[M_RKV]->data), st, fail);
  LP_CHECK_GOTO(new2(be, N, HKV, &s[M_KV]), st, fail);
  LP_CHECK_GOTO(mm(l, be, 0, 1, N, HKV, kvr, 1.0f, s[M_CN]->data, kvr,
                   VAL(W_KVB), kvr, 0.0f, s[M_KV]->data, HKV), st, fail);
  /* decoupled RoPE: every head's query rope part, the one shared key */
  LP_CHECK_GOTO(rope_table(m, T, be, &s[M_CS]), st, fail);
  LP_CHECK_GOTO(be->rope(be, N, T, H, dr, HQ, dq, s[M_CS]->data, 0,
                         s[M_Q]->data + dn), st, fail);
  LP_CHECK_GOTO(be->rope(be, N, T, 1, dr, dr, 0, s[M_CS]->data, 0,
                         s[M_KPE]->data), st, fail);
  /* S = (q_nope k_nope^T + q_pe k_pe^T) * scale, causal softmax -> P */
  LP_CHECK_GOTO(lp_tensor_empty(be, 4, (int64_t[]){B, H, T, T}, &s[M_P]), st,
                fail);
  float *q = s[M_Q]->data, *kv = s[M_KV]->data, *kpe = s[M_KPE]->data;
  float *p = s[M_P]->data;
  for (int64_t b = 0; b < B; b++) {
    float *pb = p + b * H * T * T;
    LP_CHECK_GOTO(hm(l, be, 0, 1, T, T, dn, m->scale, q + b * T * HQ, HQ, dq,
                     kv + b * T * HKV, HKV, dn + dv, 0.0f, pb, T, T * T, H),
                  st, fail);
    LP_CHECK_GOTO(hm(l, be, 0, 1, T, T, dr, m->scale, q + b * T * HQ + dn, HQ, dq,
                     kpe + b * T * dr, dr, 0, 1.0f, pb, T, T * T, H),
                  st, fail);
  }
  if (be->causal_softmax_rows) { /* fused: skips the masked triangle */
    LP_CHECK_GOTO(be->causal_softmax_rows(be, B * H * T, T, p, p), st, fail);
  } else {
    LP_CHECK_GOTO(be->causal_mask(be, B * H * T, T, p), st, fail);
    LP_CHECK_GOTO(be->softmax_rows(be, B * H * T, T, p, p), st, fail);
  }
  /* o_h = P_h v_h;  y = o Wo^T */
  LP_CHECK_GOTO(new2(be, N, HV, &s[M_O]), st, fail);
  for (int64_t b = 0; b < B; b++)
    LP_CHECK_GOTO(hm(l, be, 0, 0, T, dv, T, 1.0f, p + b * H * T * T, T, T * T,
                     kv + b * T * HKV + dn, HKV, dn + dv, 0.0f,
                     s[M_O]->data + b * T * HV, HV, dv, H),
                  st, fail);
  LP_CHECK_GOTO(lp_tensor_empty_like(s[M_X], y), st, fail);
  LP_CHECK_GOTO(mm(l, be, 0, 1, N, D, HV, 1.0f, s[M_O]->data, HV, VAL(W_O), HV,
                   0.0f, (*y)->data, D), st, fail);
  for (int i = 0; i < M__N; i++)
    if (s[i]) nn_keep(ctx, i, s[i]);
  return LP_OK;
fail:
  lp_tensor_free(*y);
  *y = NULL;
  for (int i = 0; i < M__N; i++) lp_tensor_free(s[i]);
  return nn_fail(ctx, l, st, "forward: %s", lp_strerror(st));
}

/* ---- input-grad ---- */

static lp_status mla_input_grad(lp_nn_layer *l, lp_nn_ctx *ctx,
                                const lp_tensor *dy, lp_tensor **dx) {
  const mla_priv *m = l->sub;
  const lp_nn_mla_opts *o = &m->o;
  lp_tensor *const *sv = ctx->saved;
  const lp_tensor *x = sv[M_X];
  LP_CHECK(nn_check_dy_shape(l, ctx, x, dy));
  LP_CHECK(nn_check_device(ctx, l, "dy", dy));
  int64_t D = o->dim, B = x->shape[0], T = x->shape[1], N = B * T;
  int64_t H = o->n_heads, dn = o->qk_nope_head_dim, dr = o->qk_rope_head_dim;
  int64_t dq = dn + dr, dv = o->v_head_dim, kvr = o->kv_lora_rank;
  int64_t qr = o->q_lora_rank, HQ = H * dq, HKV = H * (dn + dv), HV = H * dv;
  const lp_tensor_backend *be = lp_tensor_backend_of(x);
  const float *q = sv[M_Q]->data, *kv = sv[M_KV]->data,
              *kpe = sv[M_KPE]->data, *p = sv[M_P]->data;
  lp_tensor *s[M__N] = {0}, *dout = NULL, *ds = NULL;
  lp_status st;
  LP_CHECK(nn_dense(dy, &s[M_DY]));
  /* dO = dY Wo */
  LP_CHECK_GOTO(new2(be, N, HV, &dout), st, fail);
  LP_CHECK_GOTO(mm(l, be, 0, 0, N, HV, D, 1.0f, s[M_DY]->data, D, VAL(W_O), HV,
                   0.0f, dout->data, HV), st, fail);
  /* dP_h = dO_h v_h^T;  dv_h = P_h^T dO_h (into dkv's value columns) */
  LP_CHECK_GOTO(lp_tensor_empty(be, 4, (int64_t[]){B, H, T, T}, &ds), st,
                fail);
  LP_CHECK_GOTO(new2(be, N, HKV, &s[M_DKV]), st, fail);
  float *dkv = s[M_DKV]->data;
  for (int64_t b = 0; b < B; b++) {
    const float *dob = dout->data + b * T * HV;
    LP_CHECK_GOTO(hm(l, be, 0, 1, T, T, dv, 1.0f, dob, HV, dv,
                     kv + b * T * HKV + dn, HKV, dn + dv, 0.0f,
                     ds->data + b * H * T * T, T, T * T, H),
                  st, fail);
    LP_CHECK_GOTO(hm(l, be, 1, 0, T, dv, T, 1.0f, p + b * H * T * T, T, T * T,
                     dob, HV, dv, 0.0f, dkv + b * T * HKV + dn, HKV, dn + dv,
                     H),
                  st, fail);
  }
  /* dS = P * (dP - rowsum(dP * P)) (in place) */
  LP_CHECK_GOTO((be->causal_softmax_backward_rows
                     ? be->causal_softmax_backward_rows
                     : be->softmax_backward_rows)(be, B * H * T, T, p, ds->data),
                st, fail);
  /* dq_nope = dS k_nope, dq_pe = dS k_pe, dk_nope = dS^T q_nope (all times
   * the scale); dk_pe = sum over heads of dS_h^T q_pe_h */
  LP_CHECK_GOTO(new2(be, N, HQ, &s[M_DQ]), st, fail);
  LP_CHECK_GOTO(new2(be, N, dr, &s[M_DKPE]), st, fail);
  float *dq_ = s[M_DQ]->data, *dkpe = s[M_DKPE]->data, sc = m->scale;
  for (int64_t b = 0; b < B; b++) {
    const float *dsb = ds->data + b * H * T * T, *qb = q + b * T * HQ;
    float *dqb = dq_ + b * T * HQ;
    LP_CHECK_GOTO(hm(l, be, 0, 0, T, dn, T, sc, dsb, T, T * T, kv + b * T * HKV,
                     HKV, dn + dv, 0.0f, dqb, HQ, dq, H),
                  st, fail);
    LP_CHECK_GOTO(hm(l, be, 0, 0, T, dr, T, sc, dsb, T, T * T, kpe + b * T * dr,
                     dr, 0, 0.0f, dqb + dn, HQ, dq, H),
                  st, fail);
    LP_CHECK_GOTO(hm(l, be, 1, 0, T, dn, T, sc, dsb, T, T * T, qb, HQ, dq, 0.0f,
                     dkv + b * T * HKV, HKV, dn + dv, H),
                  st, fail);
    for (int64_t h = 0; h < H; h++)
      LP_CHECK_GOTO(mm(l, be, 1, 0, T, dr, T, sc, dsb + h * T * T, T,
                       qb + h * dq + dn, HQ, h ? 1.0f : 0.0f,
                       dkpe + b * T * dr, dr),
                    st, fail);
  }
  /* RoPE backward: rotate back */
  LP_CHECK_GOTO(be->rope(be, N, T, H, dr, HQ, dq, sv[M_CS]->data, 1, dq_ + dn),
                st, fail);
  LP_CHECK_GOTO(be->rope(be, N, T, 1, dr, dr, 0, sv[M_CS]->data, 1, dkpe), st,
                fail);
  /* through wkv_b and kv_norm */
  LP_CHECK_GOTO(new2(be, N, kvr, &s[M_DCN]), st, fail);
  LP_CHECK_GOTO(new2(be, N, kvr, &s[M_DC]), st, fail);
  LP_CHECK_GOTO(mm(l, be, 0, 0, N, kvr, HKV, 1.0f, dkv, HKV, VAL(W_KVB), kvr,
                   0.0f, s[M_DCN]->data, kvr), st, fail);
  LP_CHECK_GOTO(be->rmsnorm_backward(be, N, kvr, sv[M_C]->data, VAL(W_KVN),
                                     sv[M_RKV]->data, s[M_DCN]->data,
                                     s[M_DC]->data, NULL), st, fail);
  /* through wq_b and q_norm */
  if (qr > 0) {
    LP_CHECK_GOTO(new2(be, N, qr, &s[M_DQN]), st, fail);
    LP_CHECK_GOTO(new2(be, N, qr, &s[M_DQA]), st, fail);
    LP_CHECK_GOTO(mm(l, be, 0, 0, N, qr, HQ, 1.0f, dq_, HQ, VAL(W_QB), qr, 0.0f,
                     s[M_DQN]->data, qr), st, fail);
    LP_CHECK_GOTO(be->rmsnorm_backward(be, N, qr, sv[M_QA]->data, VAL(W_QN),
                                       sv[M_RQ]->data, s[M_DQN]->data,
                                       s[M_DQA]->data, NULL), st, fail);
  }
  /* dx = d(query input) Wq(_a) + dc Wkv_a[:kvr] + dk_pe Wkv_a[kvr:] */
  if (dx) {
    LP_CHECK_GOTO(lp_tensor_empty_like(x, dx), st, fail);
    float *dxp = (*dx)->data;
    if (qr > 0)
      LP_CHECK_GOTO(mm(l, be, 0, 0, N, D, qr, 1.0f, s[M_DQA]->data, qr,
                       VAL(W_QA), D, 0.0f, dxp, D), st, fail);
    else
      LP_CHECK_GOTO(mm(l, be, 0, 0, N, D, HQ, 1.0f, dq_, HQ, VAL(W_Q), D, 0.0f,
                       dxp, D), st, fail);
    LP_CHECK_GOTO(mm(l, be, 0, 0, N, D, kvr, 1.0f, s[M_DC]->data, kvr,
                     VAL(W_KVA), D, 1.0f, dxp, D), st, fail);
    LP_CHECK_GOTO(mm(l, be, 0, 0, N, D, dr, 1.0f, dkpe, dr, VAL(W_KVA) + kvr * D,
                     D, 1.0f, dxp, D), st, fail);
  }
  lp_tensor_free(dout);
  lp_tensor_free(ds);
  static const mla_slot unneeded[] = {M_Q, M_KV, M_KPE, M_CS, M_P};
  for (size_t i = 0; i < sizeof unneeded / sizeof *unneeded; i++)
    nn_drop(ctx, unneeded[i]);
  for (int i = 0; i < M__N; i++)
    if (s[i]) nn_keep(ctx, i, s[i]);
  return LP_OK;
fail:
  if (dx) {
    lp_tensor_free(*dx);
    *dx = NULL;
  }
  lp_tensor_free(dout);
  lp_tensor_free(ds);
  for (int i = 0; i < M__N; i++) lp_tensor_free(s[i]);
  return nn_fail(ctx, l, st, "input_grad: %s", lp_strerror(st));
}

/* ---- weight-grad ---- */

static lp_status mla_weight_grad(lp_nn_layer *l, lp_nn_ctx *ctx) {
  const lp_nn_mla_opts *o = &((const mla_priv *)l->sub)->o;
  lp_tensor *const *sv = ctx->saved;
  const lp_tensor *x = sv[M_X];
  int64_t D = o->dim, N = x->shape[0] * x->shape[1], H = o->n_heads;
  int64_t dn = o->qk_nope_head_dim, dr = o->qk_rope_head_dim;
  int64_t dq = dn + dr, dv = o->v_head_dim, kvr = o->kv_lora_rank;
  int64_t qr = o->q_lora_rank, HQ = H * dq, HKV = H * (dn + dv), HV = H * dv;
  const lp_tensor_backend *be = lp_tensor_backend_of(x);
  const float *xp = x->data;
  if (qr > 0) {
    LP_CHECK(mm(l, be, 1, 0, HQ, qr, N, 1.0f, sv[M_DQ]->data, HQ, sv[M_QN]->data,
                qr, 1.0f, GRAD(W_QB), qr));
    LP_CHECK(be->rmsnorm_backward(be, N, qr, sv[M_QA]->data, VAL(W_QN),
                                  sv[M_RQ]->data, sv[M_DQN]->data, NULL,
                                  GRAD(W_QN)));
    LP_CHECK(mm(l, be, 1, 0, qr, D, N, 1.0f, sv[M_DQA]->data, qr, xp, D, 1.0f,
                GRAD(W_QA), D));
  } else {
    LP_CHECK(mm(l, be, 1, 0, HQ, D, N, 1.0f, sv[M_DQ]->data, HQ, xp, D, 1.0f,
                GRAD(W_Q), D));
  }
  LP_CHECK(mm(l, be, 1, 0, kvr, D, N, 1.0f, sv[M_DC]->data, kvr, xp, D, 1.0f,
              GRAD(W_KVA), D));
  LP_CHECK(mm(l, be, 1, 0, dr, D, N, 1.0f, sv[M_DKPE]->data, dr, xp, D, 1.0f,
              GRAD(W_KVA) + kvr * D, D));
  LP_CHECK(be->rmsnorm_backward(be, N, kvr, sv[M_C]->data, VAL(W_KVN),
                                sv[M_RKV]->data, sv[M_DCN]->data, NULL,
                                GRAD(W_KVN)));
  LP_CHECK(mm(l, be, 1, 0, HKV, kvr, N, 1.0f, sv[M_DKV]->data, HKV,
              sv[M_CN]->data, kvr, 1.0f, GRAD(W_KVB), kvr));
  return mm(l, be, 1, 0, D, HV, N, 1.0f, sv[M_DY]->data, D, sv[M_O]->data, HV,
            1.0f, GRAD(W_O), HV);
}

static const nn_ops mla_ops = {"mla", mla_forward, mla_input_grad,
                               mla_weight_grad};

const lp_nn_mla_opts *lp_nn_mla_get_opts(const lp_nn_layer *l) {
  if (!l || l->ops != &mla_ops) return NULL;
  return &((const mla_priv *)l->sub)->o;
}

/* ---- construction ---- */

static void mla_priv_free(void *p) {
  mla_priv *m = p;
  if (!m) return;
  lp_free(m->freqs);
  lp_tensor_free(m->cs);
  lp_free(m);
}

lp_status lp_nn_mla_new(const char *name, const lp_nn_mla_opts *o,
                        uint64_t seed, lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  LP_CHECK(lp_nn_mla_check(o, NULL));
  lp_nn_layer *l;
  LP_CHECK(nn_layer_alloc(&mla_ops, name, &l));
  mla_priv *m = lp_calloc(1, sizeof *m);
  lp_status st = LP_ERR_NOMEM;
  if (!m) goto fail;
  l->sub = m;
  l->sub_free = mla_priv_free;
  m->o = *o;
  m->freqs = lp_malloc(sizeof(float) * (size_t)(o->qk_rope_head_dim / 2));
  if (!m->freqs) goto fail;
  LP_CHECK_GOTO(lp_nn_mla_rope_freqs(o, m->freqs), st, fail);
  m->scale = (float)lp_nn_mla_softmax_scale(o);
  l->dim = o->dim;
  l->heads = o->n_heads;
  l->eps = o->eps;
  int64_t D = o->dim, H = o->n_heads, dq = o->qk_nope_head_dim +
                                           o->qk_rope_head_dim;
  int64_t kvr = o->kv_lora_rank, qr = o->q_lora_rank;
#define LIN(suffix, out, in)                                                   \
  LP_CHECK_GOTO(nn_add_param(l, suffix, 2, (int64_t[]){(out), (in)},           \
                             LP_NN_INIT_NORMAL,                                \
                             (float)(1.0 / sqrt((double)(in))), seed),         \
                st, fail)
#define NORM(suffix, n)                                                        \
  LP_CHECK_GOTO(nn_add_param(l, suffix, 1, (int64_t[]){(n)}, LP_NN_INIT_ONES,  \
                             0.0f, seed),                                      \
                st, fail)
  if (qr > 0) {
    LIN("wq_a.weight", qr, D);
    NORM("q_norm.weight", qr);
    LIN("wq_b.weight", H * dq, qr);
  } else {
    LIN("wq.weight", H * dq, D);
  }
  LIN("wkv_a.weight", kvr + o->qk_rope_head_dim, D);
  NORM("kv_norm.weight", kvr);
  LIN("wkv_b.weight", H * (o->qk_nope_head_dim + o->v_head_dim), kvr);
  LIN("wo.weight", D, H * o->v_head_dim);
#undef LIN
#undef NORM
  *layer = l;
  return LP_OK;
fail:
  lp_nn_layer_release(l);
  return st;
}

/* ---- model.py's Block around an MLA ---- */

/* x + inner(rmsnorm(x)): the norm "<name>.<norm>", the pair "<name>.<pair>",
 * the residual "<name>.<res>". Takes a new reference to inner. */
static lp_status prenorm(const char *name, const char *norm, const char *pair,
                         const char *res, int64_t dim, float eps,
                         lp_nn_layer *inner, lp_nn_layer **out) {
  char buf[LP_ERRLEN];
  lp_nn_layer *a[2] = {NULL, lp_nn_layer_retain(inner)}, *seq = NULL;
  snprintf(buf, sizeof buf, "%s.%s", name, norm);
  lp_status st = lp_nn_rmsnorm_new(buf, dim, eps, &a[0]);
  snprintf(buf, sizeof buf, "%s.%s", name, pair);
  if (st == LP_OK) st = lp_nn_chunk_new(buf, a, 2, &seq);
  snprintf(buf, sizeof buf, "%s.%s", name, res);
  if (st == LP_OK) st = lp_nn_residual_new(buf, seq, out);
  lp_nn_layer_release(a[0]), lp_nn_layer_release(a[1]);
  lp_nn_layer_release(seq);
  return st;
}

lp_status lp_nn_mla_block_new(const char *name, const lp_nn_mla_opts *o,
                              lp_nn_layer *ffn, uint64_t seed,
                              lp_nn_layer **layer) {
  if (!layer) return LP_ERR_ARG;
  *layer = NULL;
  if (!ffn || !name) return LP_ERR_ARG;
  LP_CHECK(lp_nn_mla_check(o, NULL));
  char buf[LP_ERRLEN];
  lp_nn_layer *attn = NULL, *b[2] = {NULL, NULL};
  snprintf(buf, sizeof buf, "%s.attn", name);
  lp_status st = lp_nn_mla_new(buf, o, seed, &attn);
  /* DeepSeek-V3's pair phases: the attention's forward and backward each
   * an advance of their own, and the MoE's backward starting one (its
   * combine-backward); see lp_nn_set_phase_stop */
  if (st == LP_OK) st = lp_nn_set_phase_stop(attn, LP_NN_PHASE_ATTN, LP_NN_PHASE_ATTN);
  if (st == LP_OK && ffn->phased)
    st = lp_nn_set_phase_stop(ffn, LP_NN_PHASE_DONE, LP_NN_PHASE_COMBINE);
  if (st == LP_OK)
    st = prenorm(name, "attn_norm", "attn_inner", "attn_res", o->dim, o->eps,
                 attn, &b[0]);
  if (st == LP_OK)
    st = prenorm(name, "ffn_norm", "ffn_inner", "ffn_res", o->dim, o->eps, ffn,
                 &b[1]);
  if (st == LP_OK) st = lp_nn_chunk_new(name, b, 2, layer);
  lp_nn_layer_release(attn);
  lp_nn_layer_release(b[0]), lp_nn_layer_release(b[1]);
  return st;
}
