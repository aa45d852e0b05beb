/* rng.c — xoshiro256** seeded by splitmix64, Box–Muller normals, and the
 * random fills used for parameter initialisation. */
#include "tensor_internal.h"

#include <math.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void lp_tensor_rng_seed(lp_tensor_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++)
    r->s[i] = splitmix64(&x);
  r->has_spare = 0;
  r->spare = 0.0;
}

uint64_t lp_tensor_hash_name(const char *name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char *p = (const unsigned char *)(name ? name : ""); *p;
       p++) {
    h ^= *p;
    h *= 0x100000001b3ULL;
  }
  return h;
}

void lp_tensor_rng_seed_name(lp_tensor_rng *r, uint64_t seed,
                             const char *name) {
  /* Mix the name hash through splitmix so nearby names give unrelated
   * streams, then seed as usual. */
  uint64_t x = lp_tensor_hash_name(name);
  uint64_t h = splitmix64(&x);
  lp_tensor_rng_seed(r, seed ^ h);
}

uint64_t lp_tensor_rng_next(lp_tensor_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double lp_tensor_rng_uniform(lp_tensor_rng *r) {
  return (double)(lp_tensor_rng_next(r) >> 11) * 0x1.0p-53;
}

double lp_tensor_rng_normal(lp_tensor_rng *r) {
  if (r->has_spare) {
    r->has_spare = 0;
    return r->spare;
  }
  /* u1 in (0, 1] so log never sees 0. */
  double u1 = (double)((lp_tensor_rng_next(r) >> 11) + 1) * 0x1.0p-53;
  double u2 = lp_tensor_rng_uniform(r);
  double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
  r->spare = rad * sin(th);
  r->has_spare = 1;
  return rad * cos(th);
}

/* Fills t from draw(r) in row-major index order. Host tensors are written in
 * place (any strides); dense tensors elsewhere go through a host buffer. */
static lp_status fill_random(lp_tensor *t, lp_tensor_rng *r, int normal,
                             float a, float b) {
  if (!t || !r || tensor_bf16(t)) return LP_ERR_ARG;
  tensor_touch(t);
  int64_t n = lp_tensor_numel(t);
  float *buf = NULL;
  int host = tensor_host(t);
  if (!host) {
    if (!lp_tensor_is_contiguous(t)) return LP_ERR_UNSUPPORTED;
    buf = lp_malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!buf) return LP_ERR_NOMEM;
  }
  int64_t sh[4], st[4];
  tensor_pad4(t, sh, st);
  for (int64_t i = 0; i < n; i++) {
    float v = normal ? (float)(a + b * lp_tensor_rng_normal(r))
                     : (float)(a + (b - a) * lp_tensor_rng_uniform(r));
    if (host)
      t->data[tensor_offset4(sh, st, i)] = v;
    else
      buf[i] = v;
  }
  lp_status s = LP_OK;
  if (!host) {
    const lp_tensor_backend *be = t->storage->be;
    s = be->from_host(be, t->data, buf, (size_t)n * sizeof(float));
    lp_free(buf);
  }
  return s;
}

lp_status lp_tensor_fill_normal(lp_tensor *t, lp_tensor_rng *r, float mean,
                                float std) {
  return fill_random(t, r, 1, mean, std);
}

lp_status lp_tensor_fill_uniform(lp_tensor *t, lp_tensor_rng *r, float lo,
                                 float hi) {
  return fill_random(t, r, 0, lo, hi);
}
