/* eplb_reference.c — DeepSeek's EPLB (eplb.py) on one layer, with its
 * float32 arithmetic and tie rules: stable descending sorts, the lightest
 * non-full pack with the lowest index, the heaviest load/count with the
 * lowest expert index.
 *
 * Orders are kept as 64-bit keys that sort ascending exactly like the
 * reference's (value descending, index ascending) pairs: the complemented
 * float bits above, the index below (a non-negative float's bits order
 * like its value). A node's experts are sorted once; that order gives the
 * only experts replication can choose, and, merged with the few replicated
 * experts' divided tokens, the order in which the packer takes the slots. */
#include <stdint.h>
#include <string.h>

#include "eplb_internal.h"

#define LOW32 0xffffffffu

static uint32_t fbits(float v) {
  uint32_t u;
  v = v + 0.0f; /* -0.0 -> +0.0; every other value unchanged */
  memcpy(&u, &v, sizeof u);
  return u;
}

/* a when pick is 0, b when it is 1, without a branch. */
static inline uint64_t pick64(int pick, uint64_t a, uint64_t b) {
  return a ^ ((a ^ b) & ((uint64_t)0 - (uint64_t)pick));
}

/* (value descending, index ascending) as one ascending key. */
static uint64_t desc_key(float v, int i) {
  return (uint64_t)(uint32_t)~fbits(v) << 32 | (uint64_t)(uint32_t)i;
}

/* Sorts distinct keys ascending without data-dependent branches: runs of 4
 * by a sorting network, then bottom-up merges through tmp. */
#define CE(x, y)                                                               \
  do {                                                                         \
    uint64_t lo_ = x < y ? x : y, hi_ = x < y ? y : x;                         \
    x = lo_;                                                                   \
    y = hi_;                                                                   \
  } while (0)
static void merge_sort(uint64_t *a, int n, uint64_t *tmp) {
  int b = 0;
  for (; b + 4 <= n; b += 4) {
    uint64_t x0 = a[b], x1 = a[b + 1], x2 = a[b + 2], x3 = a[b + 3];
    CE(x0, x1);
    CE(x2, x3);
    CE(x0, x2);
    CE(x1, x3);
    CE(x1, x2);
    a[b] = x0, a[b + 1] = x1, a[b + 2] = x2, a[b + 3] = x3;
  }
  for (int i = b + 1; i < n; i++) { /* the last < 4 */
    uint64_t v = a[i];
    int j = i - 1;
    while (j >= b && a[j] > v) {
      a[j + 1] = a[j];
      j--;
    }
    a[j + 1] = v;
  }
  uint64_t *src = a, *dst = tmp;
  for (int width = 4; width < n; width *= 2) {
    for (int lo = 0; lo < n; lo += 2 * width) {
      int mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
      const uint64_t *x = src + lo, *xe = src + mid, *y = src + mid, *ye = src + hi;
      uint64_t *o = dst + lo;
      if (y < ye) {
        /* the run whose last key is smaller ends first; the other one
         * cannot run out before it */
        if (xe[-1] < ye[-1]) {
          while (x < xe) {
            uint64_t u = *x, v = *y;
            int take_y = v < u;
            *o++ = pick64(take_y, u, v);
            x += !take_y;
            y += take_y;
          }
        } else {
          while (y < ye) {
            uint64_t u = *x, v = *y;
            int take_y = v < u;
            *o++ = pick64(take_y, u, v);
            x += !take_y;
            y += take_y;
          }
        }
      }
      while (x < xe) *o++ = *x++;
      while (y < ye) *o++ = *y++;
    }
    uint64_t *t = src;
    src = dst;
    dst = t;
  }
  if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
}
#undef CE

/* One stable counting pass on byte sh / 8 of the keys' high halves,
 * *src -> *dst (then swapped). The digits lie between the bits every key
 * has (and_) and the bits any key has (or_). */
static inline __attribute__((always_inline)) void radix_pass(uint64_t **src, uint64_t **dst, int n,
                                                             uint32_t *c, uint32_t and_,
                                                             uint32_t or_, const int sh) {
  const uint32_t lo = (and_ >> sh) & 0xff, hi = (or_ >> sh) & 0xff;
  uint32_t sum = 0;
  for (uint32_t d = lo; d <= hi; d++) {
    uint32_t x = c[d];
    c[d] = sum;
    sum += x;
  }
  const uint64_t *s = *src;
  uint64_t *o = *dst;
  for (int i = 0; i < n; i++) {
    uint64_t v = s[i];
    o[c[(uint32_t)(v >> (32 + sh)) & 0xff]++] = v;
  }
  *dst = *src;
  *src = o;
}

/* LSD radix sort of keys on the bytes of their high halves that vary;
 * a[] must list equal high halves in ascending low halves (indices filled
 * in order), which it keeps (it is stable). */
static void radix_sort(uint64_t *a, int n, uint64_t *tmp) {
  uint32_t cnt[4][256], all_or = 0, all_and = ~0u;
  memset(cnt, 0, sizeof cnt);
  for (int i = 0; i < n; i++) {
    uint32_t h = (uint32_t)(a[i] >> 32);
    all_or |= h;
    all_and &= h;
    cnt[0][h & 0xff]++;
    cnt[1][(h >> 8) & 0xff]++;
    cnt[2][(h >> 16) & 0xff]++;
    cnt[3][h >> 24]++;
  }
  uint64_t *src = a, *dst = tmp;
  const uint32_t vary = all_or ^ all_and;
  if (vary & 0xffu) radix_pass(&src, &dst, n, cnt[0], all_and, all_or, 0);
  if (vary & 0xff00u) radix_pass(&src, &dst, n, cnt[1], all_and, all_or, 8);
  if (vary & 0xff0000u) radix_pass(&src, &dst, n, cnt[2], all_and, all_or, 16);
  if (vary & 0xff000000u) radix_pass(&src, &dst, n, cnt[3], all_and, all_or, 24);
  if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
}

/* Sorts distinct keys ascending. Short arrays: merge sort. Longer ones:
 * one counting pass that spreads the high halves' range evenly over about
 * 2n buckets (at most 2048), then insertion sort, in which elements move
 * only inside their bucket; when a bucket is crowded (insertion could cost
 * up to the square of its size), an LSD radix sort (a[] must then list
 * equal high halves in ascending low halves). */
static void sort_keys(uint64_t *a, int n, uint64_t *tmp) {
  if (n <= 32) {
    merge_sort(a, n, tmp);
    return;
  }
  uint32_t lo = UINT32_MAX, hi = 0;
  for (int i = 0; i < n; i++) {
    uint32_t h = (uint32_t)(a[i] >> 32);
    lo = h < lo ? h : lo;
    hi = h > hi ? h : hi;
  }
  int bits = 5;
  while ((1 << bits) < 2 * n && bits < 11) bits++; /* about 2n buckets */
  const uint32_t span = hi - lo;
  const int width = span ? 32 - __builtin_clz(span) : 0; /* bits in span */
  const int sh = width > bits ? width - bits : 0;
  uint32_t cnt[1 << 11];
  const int B = (int)(span >> sh) + 1;
  memset(cnt, 0, (size_t)B * sizeof *cnt);
  for (int i = 0; i < n; i++) cnt[((uint32_t)(a[i] >> 32) - lo) >> sh]++;
  uint32_t sum = 0, most = 0;
  for (int c = 0; c < B; c++) {
    uint32_t x = cnt[c];
    most = x > most ? x : most;
    cnt[c] = sum;
    sum += x;
  }
  if (most > 24) {
    radix_sort(a, n, tmp);
    return;
  }
  for (int i = 0; i < n; i++) {
    uint64_t v = a[i];
    tmp[cnt[((uint32_t)(v >> 32) - lo) >> sh]++] = v;
  }
  for (int i = 1; i < n; i++) {
    uint64_t v = tmp[i];
    int j = i - 1;
    while (j >= 0 && tmp[j] > v) {
      tmp[j + 1] = tmp[j];
      j--;
    }
    tmp[j + 1] = v;
  }
  memcpy(a, tmp, (size_t)n * sizeof *a);
}

/* Merges two ascending key arrays (keys distinct), writing the low
 * halves (ids) to out[na + nb] without data-dependent branches: the array
 * whose last key is smaller runs out first, so only it needs a bound. */
static void merge_ids(const uint64_t *a, int na, const uint64_t *b, int nb, int *out) {
  const uint64_t *ae = a + na, *be = b + nb;
  if (na > 0 && nb > 0) {
    if (ae[-1] < be[-1]) {
      while (a < ae) {
        uint64_t u = *a, v = *b;
        int take_b = v < u;
        *out++ = (int)(pick64(take_b, u, v) & LOW32);
        a += !take_b;
        b += take_b;
      }
    } else {
      while (b < be) {
        uint64_t u = *a, v = *b;
        int take_b = v < u;
        *out++ = (int)(pick64(take_b, u, v) & LOW32);
        a += !take_b;
        b += take_b;
      }
    }
  }
  while (a < ae) *out++ = (int)(*a++ & LOW32);
  while (b < be) *out++ = (int)(*b++ & LOW32);
}

/* ---- tournament tree: the least of `leaves` keys at t[1] ----
 * Leaves at t[P .. P + leaves), P a power of two; padding holds the
 * largest key. */
static int tree_size(int leaves) {
  int P = 1;
  while (P < leaves) P *= 2;
  return P;
}

static void tree_build(uint64_t *t, int P) {
  for (int i = P - 1; i >= 1; i--) t[i] = t[2 * i] < t[2 * i + 1] ? t[2 * i] : t[2 * i + 1];
}

static inline __attribute__((always_inline)) uint64_t tree_set(uint64_t *t, int P, int leaf,
                                                               uint64_t key) {
  int i = P + leaf;
  t[i] = key;
#pragma GCC unroll 16
  for (int level = P; level > 1; level >>= 1, i >>= 1) { /* the least key on the way up */
    uint64_t s = t[i ^ 1];
    key = s < key ? s : key;
    t[i >> 1] = key;
  }
  return key; /* the new top */
}

/* ---- balanced_packing ----
 * n items (weights w, taken in `order`: w descending, index ascending)
 * into m packs of per = n/m items: item inv[p * per + r] is the r-th item
 * pack p received. A job is one such packing; the jobs of a layer's nodes
 * are independent, and running them in step lets their (latency-bound)
 * picks overlap. */
typedef struct pack_job {
  const float *w;
  const int *order;
  int *inv;
  int *next;    /* [m] where pack p's next item goes in inv */
  uint64_t *tr; /* the tree: 2P keys */
  uint64_t top; /* its least key */
  int t;        /* the next item in order */
} pack_job;

/* The first m positive items go to packs 0, 1, ...: each finds the empty
 * packs lightest and takes the lowest-indexed one. With two items per pack
 * the rest follows directly; otherwise builds the tree of (weight bits,
 * pack) keys (full packs hold the largest key) for pack_steps. pw: [m]
 * scratch. */
static void pack_begin(pack_job *j, int n, int m, int P, float *pw) {
  const int per = n / m;
  const float *w = j->w;
  const int *order = j->order;
  int *inv = j->inv, *next = j->next;
  int t = 0;
  for (; t < m && w[order[t]] > 0; t++) {
    inv[t * per] = order[t];
    pw[t] = w[order[t]];
    next[t] = t * per + 1;
  }
  for (int p = t; p < m; p++) {
    pw[p] = 0.0f;
    next[p] = p * per;
  }
  if (per == 2 && t == m) {
    /* Every pack holds one item and the next one fills it, so the packs
     * are picked once each, by (weight, index): the reverse of the first
     * round, keeping ascending index inside runs of equal weight. */
    int hi = m;
    while (hi > 0) {
      int lo = hi - 1;
      while (lo > 0 && pw[lo - 1] == pw[hi - 1]) lo--;
      for (int p = lo; p < hi; p++, t++) inv[p * 2 + 1] = order[t];
      hi = lo;
    }
  } else {
    uint64_t *tr = j->tr;
    for (int p = 0; p < P; p++)
      tr[P + p] = p < m ? (uint64_t)fbits(pw[p]) << 32 | (uint64_t)p : UINT64_MAX;
    tree_build(tr, P);
    j->top = tr[1];
  }
  j->t = t;
}

/* Items t..n of the jobs (all at the same t), each to its lightest
 * non-full pack: the top key, which carries the pack's weight in its high
 * half, so a pick waits only for one float addition and the walk up (the
 * loads depend on the pack alone). */
static inline __attribute__((always_inline)) void pack_steps(pack_job *jobs, int nj, int n,
                                                             int per, const int P) {
  for (int t = jobs[0].t; t < n; t++)
#pragma GCC unroll 4
    for (int v = 0; v < nj; v++) {
      pack_job *j = &jobs[v];
      const int i = j->order[t], p = (int)(j->top & LOW32);
      const int at = j->next[p]++;
      j->inv[at] = i;
      uint32_t b = (uint32_t)(j->top >> 32);
      float f;
      memcpy(&f, &b, sizeof f);
      f = f + j->w[i]; /* float32 accumulation, as the reference; never -0.0 */
      memcpy(&b, &f, sizeof b);
      uint64_t key = at + 1 < (p + 1) * per ? (uint64_t)b << 32 | (uint64_t)p : UINT64_MAX;
      j->top = tree_set(j->tr, P, p, key);
    }
}

/* Runs nj jobs of n items into m packs. */
static void pack_jobs(pack_job *jobs, int nj, int n, int m, float *pw) {
  const int P = tree_size(m), per = n / m;
  int same = 1;
  for (int v = 0; v < nj; v++) {
    pack_begin(&jobs[v], n, m, P, pw);
    same &= jobs[v].t == jobs[0].t;
  }
  if (!same) { /* zero weights left some first rounds short: one by one */
    for (int v = 0; v < nj; v++) pack_jobs(&jobs[v], 1, n, m, pw); /* same == 1 there */
    return;
  }
  if (jobs[0].t >= n) return;
  int v0 = 0;
  for (; v0 + 4 <= nj; v0 += 4) /* four at a time: constant counts unroll */
    switch (P) {
    case 4: pack_steps(jobs + v0, 4, n, per, 4); break;
    case 8: pack_steps(jobs + v0, 4, n, per, 8); break;
    case 16: pack_steps(jobs + v0, 4, n, per, 16); break;
    default: pack_steps(jobs + v0, 4, n, per, P); break;
    }
  for (; v0 < nj; v0++)
    switch (P) {
    case 2: pack_steps(jobs + v0, 1, n, per, 2); break;
    case 4: pack_steps(jobs + v0, 1, n, per, 4); break;
    case 8: pack_steps(jobs + v0, 1, n, per, 8); break;
    case 16: pack_steps(jobs + v0, 1, n, per, 16); break;
    default: pack_steps(jobs + v0, 1, n, per, P); break;
    }
}

/* balanced_packing of arbitrary items (n = m * per): sorts them, then
 * packs; with one item per pack, item i goes to pack i. */
static void pack_items(const float *w, int n, int m, int *inv, eplb_ws *ws) {
  if (n == m) {
    for (int i = 0; i < n; i++) inv[i] = i;
    return;
  }
  uint64_t *a = ws->s_k1;
  int *order = ws->idx;
  for (int i = 0; i < n; i++) a[i] = desc_key(w[i], i);
  sort_keys(a, n, ws->s_k2);
  for (int i = 0; i < n; i++) order[i] = (int)(a[i] & LOW32);
  pack_job j = {w, order, inv, ws->ic, ws->r_tree, 0, 0};
  pack_jobs(&j, 1, n, m, ws->fb);
}

/* One node: its experts' weights tokens[0..epn) (ids in the node's "mlog"
 * order) into ppn slots. replicate_experts: slot i < epn holds expert i,
 * each further slot goes to the expert with the largest w / count (lowest
 * index on ties). Only the extra = ppn - epn best experts by (w desc,
 * index asc) can be chosen: an expert outside them is behind each of them
 * until that one has been chosen, which takes all `extra` choices. Writes
 * each slot's expert phy2mlog[ppn], replica rank prank[ppn] and token
 * (w / count, over tokens[0..ppn)); with `sorted`, order[ppn]: the slots
 * by (token desc, slot asc), for the packing. */
static void node_replicate(float *tokens, int epn, int ppn, int sorted, eplb_ws *ws,
                           int *phy2mlog, int *prank, int *order) {
  int *mcnt = ws->r_mcnt, *pos = ws->ib;
  uint64_t *ka = ws->s_k1, *kb = ws->s_k2, *tmp = ws->r_tree;
  const int extra = ppn - epn;
  for (int m = 0; m < epn; m++) {
    phy2mlog[m] = m;
    prank[m] = 0;
    mcnt[m] = 1;
    ka[m] = desc_key(tokens[m], m);
  }
  if (extra == 0 && !sorted) return;
  sort_keys(ka, epn, tmp);
  int nb = 0; /* replicated slots: keys in kb */
  if (extra > 0) {
    const int k = extra < epn ? extra : epn, P = tree_size(k);
    uint64_t *tr = ws->r_tree;
    for (int j = 0; j < P; j++) tr[P + j] = j < k ? ka[j] : UINT64_MAX;
    for (int j = 0; j < k; j++) pos[(int)(ka[j] & LOW32)] = j;
    tree_build(tr, P);
    uint64_t top = tr[1];
    for (int i = epn; i < ppn; i++) {
      int m = (int)(top & LOW32);
      phy2mlog[i] = m;
      prank[i] = mcnt[m]++;
      top = tree_set(tr, P, pos[m], desc_key(tokens[m] / (float)mcnt[m], m));
    }
    /* the replicated experts' slots in key order: the experts by (token
     * desc, index asc), each followed by its further slots (their indices
     * are larger and ascending in the order they were chosen), unless two
     * of these experts have equal tokens (their slots interleave): then
     * a sort */
    uint64_t *kr = tmp, *tmp2 = tmp + ppn;
    int nr = 0, ties = 0;
    for (int j = 0; j < k; j++) {
      int m = (int)(ka[j] & LOW32);
      if (mcnt[m] > 1) {
        tokens[m] = tokens[m] / (float)mcnt[m];
        kr[nr++] = desc_key(tokens[m], m);
      }
    }
    merge_sort(kr, nr, tmp2);
    for (int j = 1; j < nr; j++) ties |= kr[j] >> 32 == kr[j - 1] >> 32;
    if (!ties) {
      for (int j = 0; j < nr; j++) { /* pos[m]: where m's next slot goes */
        int m = (int)(kr[j] & LOW32);
        kb[nb] = kr[j];
        pos[m] = nb + 1;
        nb += mcnt[m];
      }
      for (int i = epn; i < ppn; i++) {
        int m = phy2mlog[i];
        tokens[i] = tokens[m];
        kb[pos[m]++] = desc_key(tokens[i], i);
      }
    } else {
      for (int j = 0; j < nr; j++) kb[nb++] = kr[j];
      for (int i = epn; i < ppn; i++) {
        tokens[i] = tokens[phy2mlog[i]];
        kb[nb++] = desc_key(tokens[i], i);
      }
      merge_sort(kb, nb, tmp);
    }
  }
  if (!sorted) return;
  /* the unreplicated experts in their sorted order merged with the
   * replicated slots */
  int na = 0;
  for (int ia = 0; ia < epn; ia++) { /* branch-free compaction */
    uint64_t x = ka[ia];
    ka[na] = x;
    na += mcnt[x & LOW32] == 1;
  }
  merge_ids(ka, na, kb, nb, order);
}

void eplb_reference_layer(const eplb_dims *d, const double *load,
                          eplb_ws *ws, int *phy2log, int *phyrank,
                          int *home) {
  const int E = d->E, ng = d->ng, nn = d->nn;
  const int gs = E / ng, gpn = ng / nn, epn = E / nn, ppn = d->R / nn;
  const int packs = d->G / nn, per = ppn / packs;
  float *tokens = ws->fa; /* [R]: node n's at n * ppn */
  int *mlog2log = ws->r_mlog2log;
  if (ng == 1) { /* one group, one node: mlog ids are the experts' */
    const int h = d->hier ? 0 : -1;
    for (int e = 0; e < E; e++) {
      tokens[e] = (float)load[e];
      home[e] = h;
    }
  } else {
    /* step 1: groups onto nodes; node n's block of "mlog" ids lists its
     * groups in packing order */
    /* each group's float32 loads summed in order in double (exact for
     * counts), rounded once to float32; the groups' sums advance together
     * (independent additions overlap) */
    float *gw = (float *)ws->dkey2; /* ng floats fit in n doubles */
    double *acc = ws->da;
    for (int g = 0; g < ng; g++) acc[g] = 0;
    for (int j = 0; j < gs; j++)
      for (int g = 0; g < ng; g++) acc[g] += (double)(float)load[g * gs + j];
    for (int g = 0; g < ng; g++) gw[g] = (float)acc[g];
    int *ginv = ws->r_pack;
    pack_items(gw, ng, nn, ginv, ws);
    for (int q = 0; q < ng; q++) { /* node q / gpn, place q % gpn */
      const int g = ginv[q], h = d->hier ? q / gpn : -1;
      for (int j = 0; j < gs; j++) {
        mlog2log[q * gs + j] = g * gs + j;
        home[g * gs + j] = h;
      }
    }
  }
  /* step 2 node by node, step 3 for all nodes in step */
  int *phy2mlog = ws->r_phy2mlog, *prank = ws->r_prank, *order = ws->idx, *inv = ws->r_inv;
  for (int node = 0; node < nn; node++) {
    float *tk = tokens + node * ppn;
    if (ng > 1)
      for (int m = 0; m < epn; m++) tk[m] = (float)load[mlog2log[node * epn + m]];
    node_replicate(tk, epn, ppn, per > 1, ws, phy2mlog + node * ppn, prank + node * ppn,
                   order + node * ppn);
  }
  if (per > 1) {
    pack_job jobs[64];
    const int P = tree_size(packs);
    for (int n0 = 0; n0 < nn; n0 += 64) {
      const int c = nn - n0 < 64 ? nn - n0 : 64;
      for (int v = 0; v < c; v++) {
        const int o = (n0 + v) * ppn;
        pack_job j = {tokens + o, order + o, inv + o, ws->ic + (n0 + v) * packs,
                      ws->r_tree + (size_t)(n0 + v) * 2 * P, 0, 0};
        jobs[v] = j;
      }
      pack_jobs(jobs, c, ppn, packs, ws->fb);
    }
  }
  for (int node = 0; node < nn; node++) { /* slot order within the node */
    const int o = node * ppn, *ml = ng > 1 ? mlog2log + node * epn : NULL;
    const int *pm = phy2mlog + o, *pr = prank + o, *at = inv + o;
    int *outm = phy2log + o, *outr = phyrank + o;
    if (per == 1)
      for (int q = 0; q < ppn; q++) {
        outm[q] = ml ? ml[pm[q]] : pm[q];
        outr[q] = pr[q];
      }
    else if (ml)
      for (int q = 0; q < ppn; q++) {
        outm[q] = ml[pm[at[q]]];
        outr[q] = pr[at[q]];
      }
    else
      for (int q = 0; q < ppn; q++) {
        outm[q] = pm[at[q]];
        outr[q] = pr[at[q]];
      }
  }
}
