/* eplb_reference.c — DeepSeek's EPLB (eplb.py) on one layer, with its
 * float32 arithmetic and tie rules: stable descending sorts, the lightest
 * non-full pack with the lowest index, the heaviest load/count with the
 * lowest expert index. */
#include <stdint.h>
#include <string.h>

#include "eplb_internal.h"

/* Heap entries pack a non-negative float and an id into one integer that
 * orders like (value, id): the float's bits order like its values. */
static uint64_t fbits(float v) {
  uint32_t u;
  if (v == 0) v = 0; /* -0.0 -> +0.0 */
  memcpy(&u, &v, sizeof u);
  return u;
}

static void sift(uint64_t *h, int n, int i) {
  uint64_t v = h[i];
  for (;;) {
    int c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && h[c + 1] < h[c]) c++;
    if (h[c] >= v) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = v;
}

/* Sorts distinct integers ascending without data-dependent branches:
 * runs of 4 by a sorting network, then bottom-up merges through tmp. */
#define CE(x, y)                                                               \
  do {                                                                         \
    uint64_t lo_ = x < y ? x : y, hi_ = x < y ? y : x;                         \
    x = lo_;                                                                   \
    y = hi_;                                                                   \
  } while (0)
static void sort_u64(uint64_t *a, int n, uint64_t *tmp) {
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
      int i = lo, j = mid, o = lo;
      while (i < mid && j < hi) {
        uint64_t x = src[i], y = src[j];
        int take_y = y < x;
        dst[o++] = take_y ? y : x;
        j += take_y;
        i += !take_y;
      }
      while (i < mid) dst[o++] = src[i++];
      while (j < hi) dst[o++] = src[j++];
    }
    uint64_t *x = src;
    src = dst;
    dst = x;
  }
  if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
}
#undef CE

/* Stable sort of 0..n-1 by w descending: the (complemented float bits,
 * index) pairs are distinct integers that order exactly so. Short arrays:
 * merge sort. Longer ones: one counting pass on the 8 highest bits in
 * which the values differ, then insertion sort inside the buckets while
 * that costs at most about one move per element; otherwise an LSD radix
 * sort on the key bytes that differ. */
static void sort_desc_f32(const float *w, int n, int *order, eplb_ws *ws) {
  uint64_t *a = ws->s_k1;
  uint32_t all_or = 0, all_and = ~0u;
  for (int i = 0; i < n; i++) {
    uint32_t hi = ~fbits(w[i]);
    a[i] = (uint64_t)hi << 32 | (uint64_t)i;
    all_or |= hi;
    all_and &= hi;
  }
  uint32_t vary = all_or ^ all_and;
  if (vary == 0) { /* equal values: index order */
    for (int i = 0; i < n; i++) order[i] = i;
    return;
  }
  if (n < 48) {
    sort_u64(a, n, ws->s_k2);
  } else {
    int top = 31;
    while (!(vary >> top & 1u)) top--;
    const int shift = top >= 7 ? top - 7 : 0;
    int count[256], work = 0;
    memset(count, 0, sizeof count);
    for (int i = 0; i < n; i++) count[(a[i] >> (32 + shift)) & 0xff]++;
    for (int c = 0; c < 256; c++) work += count[c] * (count[c] - 1) / 2;
    uint64_t *b = ws->s_k2;
    if (work <= n) { /* at most about one move per element */
      int sum = 0;
      for (int c = 0; c < 256; c++) {
        int x = count[c];
        count[c] = sum;
        sum += x;
      }
      for (int i = 0; i < n; i++) b[count[(a[i] >> (32 + shift)) & 0xff]++] = a[i];
      for (int i = 1; i < n; i++) { /* elements move only inside their bucket */
        uint64_t v = b[i];
        int j = i - 1;
        while (j >= 0 && b[j] > v) {
          b[j + 1] = b[j];
          j--;
        }
        b[j + 1] = v;
      }
      a = b;
    } else {
      /* LSD radix on the four key bytes (stable, so the index order of
       * equal keys holds); bytes all keys share are skipped */
      static const int shifts[4] = {32, 40, 48, 56};
      int cnt[4][256];
      memset(cnt, 0, sizeof cnt);
      for (int i = 0; i < n; i++)
        for (int q = 0; q < 4; q++) cnt[q][(a[i] >> shifts[q]) & 0xff]++;
      uint64_t *src = a, *dst = b;
      for (int q = 0; q < 4; q++) {
        if (!((vary >> (shifts[q] - 32)) & 0xffu)) continue;
        int sum = 0;
        for (int c = 0; c < 256; c++) {
          int x = cnt[q][c];
          cnt[q][c] = sum;
          sum += x;
        }
        for (int i = 0; i < n; i++) dst[cnt[q][(src[i] >> shifts[q]) & 0xff]++] = src[i];
        uint64_t *x = src;
        src = dst;
        dst = x;
      }
      a = src;
    }
  }
  for (int i = 0; i < n; i++) order[i] = (int)(a[i] & 0xffffffffu);
}

/* balanced_packing: n items of weight w into m packs of n/m items each.
 * Writes pack[i] and rank[i] (position inside the pack, in assignment
 * order), and item inv[p * (n/m) + r] for pack p, rank r. With one item per
 * pack, item i goes to pack i. */
#define MIN64(x, y) ((x) < (y) ? (x) : (y))
#define PUT(i, p, r)                                                           \
  do {                                                                         \
    pack[i] = (p);                                                             \
    rank[i] = (r);                                                             \
    inv[(p) * per + (r)] = (i);                                                \
  } while (0)
static void ref_pack(const float *w, int n, int m, int *pack, int *rank, int *inv,
                     eplb_ws *ws) {
  int per = n / m;
  if (per == 1) {
    for (int i = 0; i < n; i++) PUT(i, i, 0);
    return;
  }
  int *order = ws->idx;
  sort_desc_f32(w, n, order, ws);
  float *pw = ws->fb;
  int *cnt = ws->ic;
  /* The first m positive items go to packs 0, 1, ...: each finds the
   * empty packs lightest and takes the lowest-indexed one. */
  int t = 0;
  for (int p = 0; p < m; p++) {
    pw[p] = 0.0f;
    cnt[p] = 0;
  }
  for (; t < m && w[order[t]] > 0; t++) {
    PUT(order[t], t, 0);
    pw[t] = w[order[t]];
    cnt[t] = 1;
  }
  if (per == 2 && t == m) {
    /* Every pack holds one item and the next one fills it, so the packs
     * are picked once each, by (weight, index): the reverse of the first
     * round, keeping ascending index inside runs of equal weight. */
    int hi = m;
    while (hi > 0) {
      int lo = hi - 1;
      while (lo > 0 && pw[lo - 1] == pw[hi - 1]) lo--;
      for (int p = lo; p < hi; p++, t++) PUT(order[t], p, 1);
      hi = lo;
    }
    return;
  }
  if (m <= 16) {
    /* few packs: the least (weight, pack) key of the non-full ones by a
     * fixed reduction tree (the key carries the pack; full packs and the
     * padding hold the largest key) */
    uint64_t key[16];
    const int width = m <= 8 ? 8 : 16;
    for (int p = 0; p < 16; p++) key[p] = p < m ? fbits(pw[p]) << 32 | (uint64_t)p : UINT64_MAX;
    for (; t < n; t++) {
      uint64_t a0 = MIN64(key[0], key[1]), a1 = MIN64(key[2], key[3]);
      uint64_t a2 = MIN64(key[4], key[5]), a3 = MIN64(key[6], key[7]);
      uint64_t best = MIN64(MIN64(a0, a1), MIN64(a2, a3));
      if (width == 16) {
        uint64_t b0 = MIN64(key[8], key[9]), b1 = MIN64(key[10], key[11]);
        uint64_t b2 = MIN64(key[12], key[13]), b3 = MIN64(key[14], key[15]);
        best = MIN64(best, MIN64(MIN64(b0, b1), MIN64(b2, b3)));
      }
      int i = order[t], p = (int)(best & 0xffffffffu);
      PUT(i, p, cnt[p]);
      cnt[p]++;
      pw[p] = pw[p] + w[i]; /* float32 accumulation, as the reference */
      key[p] = cnt[p] < per ? fbits(pw[p]) << 32 | (uint64_t)p : UINT64_MAX;
    }
    return;
  }
  /* then a heap of (weight, pack): the lightest non-full pack, lowest
   * index on ties, is on top */
  uint64_t *h = ws->s_k1;
  for (int p = 0; p < m; p++) h[p] = fbits(pw[p]) << 32 | (uint64_t)p;
  int hn = m;
  for (int p = hn / 2 - 1; p >= 0; p--) sift(h, hn, p);
  for (; t < n; t++) {
    int i = order[t], p = (int)(h[0] & 0xffffffffu);
    PUT(i, p, cnt[p]);
    cnt[p]++;
    pw[p] = pw[p] + w[i]; /* float32 accumulation, as the reference */
    h[0] = cnt[p] < per ? fbits(pw[p]) << 32 | (uint64_t)p : h[--hn];
    sift(h, hn, 0);
  }
}

#undef PUT
#undef MIN64

/* replicate_experts: n logical experts (weights w) into num_phy physical
 * slots. Slot i < n holds expert i; each further slot goes to the expert
 * with the largest w / count (lowest index on ties). Only the `extra` =
 * num_phy - n best experts by (w desc, index asc) can ever be chosen: an
 * expert outside them is behind each of them until that one has been
 * chosen, which takes all `extra` choices. So the heap holds just those. */
static void sift_max(uint64_t *h, int n, int i) {
  uint64_t v = h[i];
  for (;;) {
    int c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && h[c + 1] > h[c]) c++;
    if (h[c] <= v) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = v;
}

static void ref_replicate(const float *w, int n, int num_phy, int *phy2log,
                          int *rank, int *cnt, eplb_ws *ws) {
  /* (complemented value, expert): the largest value, lowest index, is the
   * least key */
  uint64_t *h = ws->s_k1;
  for (int e = 0; e < n; e++) {
    phy2log[e] = e;
    rank[e] = 0;
    cnt[e] = 1;
  }
  int extra = num_phy - n, k = extra < n ? extra : n;
  if (extra == 0) return;
  /* the k least keys: a max-heap of the best k so far */
  for (int e = 0; e < k; e++) h[e] = (uint64_t)(uint32_t)~fbits(w[e]) << 32 | (uint64_t)e;
  for (int i = k / 2 - 1; i >= 0; i--) sift_max(h, k, i);
  for (int e = k; e < n; e++) {
    uint64_t key = (uint64_t)(uint32_t)~fbits(w[e]) << 32 | (uint64_t)e;
    if (key < h[0]) {
      h[0] = key;
      sift_max(h, k, 0);
    }
  }
  for (int i = k / 2 - 1; i >= 0; i--) sift(h, k, i);
  for (int i = n; i < num_phy; i++) {
    int e = (int)(h[0] & 0xffffffffu);
    phy2log[i] = e;
    rank[i] = cnt[e]++;
    float v = w[e] / (float)cnt[e];
    h[0] = (uint64_t)(uint32_t)~fbits(v) << 32 | (uint64_t)e;
    sift(h, k, 0);
  }
}

void eplb_reference_layer(const eplb_dims *d, const double *load,
                          eplb_ws *ws, int *phy2log, int *phyrank,
                          int *home) {
  const int E = d->E, R = d->R, ng = d->ng, nn = d->nn;
  const int gs = E / ng, gpn = ng / nn, epn = E / nn, ppn = R / nn;
  const int packs = d->G / nn, per_gpu = d->k;
  (void)per_gpu;
  float *w = ws->fw;
  for (int e = 0; e < E; e++) w[e] = (float)load[e];

  /* step 1: groups onto nodes */
  float *gw = ws->fa;
  for (int g = 0; g < ng; g++) {
    double s = 0; /* exact for counts; rounded once to float32 */
    for (int j = 0; j < gs; j++) s += (double)w[g * gs + j];
    gw[g] = (float)s;
  }
  int *gpack = ws->r_pack, *grank = ws->r_rank;
  ref_pack(gw, ng, nn, gpack, grank, ws->r_inv, ws);
  /* node n's block of "mlog" ids lists its groups in packing order */
  int *mlog2log = ws->r_mlog2log;
  for (int g = 0; g < ng; g++)
    for (int j = 0; j < gs; j++)
      mlog2log[(gpack[g] * gpn + grank[g]) * gs + j] = g * gs + j;
  for (int g = 0; g < ng; g++)
    for (int j = 0; j < gs; j++) home[g * gs + j] = d->hier ? gpack[g] : -1;

  /* steps 2 and 3, node by node */
  float *wm = ws->fa; /* the group sums are no longer needed */
  float *tokens = (float *)ws->dkey2; /* ppn floats fit in n doubles */
  int *phy2mlog = ws->r_phy2mlog, *prank = ws->r_prank, *mcnt = ws->r_mcnt;
  int *pack = ws->id, *rank = ws->ie, *inv = ws->r_inv;
  for (int node = 0; node < nn; node++) {
    for (int m = 0; m < epn; m++) wm[m] = w[mlog2log[node * epn + m]];
    ref_replicate(wm, epn, ppn, phy2mlog, prank, mcnt, ws);
    for (int p = 0; p < ppn; p++) {
      int m = phy2mlog[p], c = mcnt[m];
      tokens[p] = c == 1 ? wm[m] : wm[m] / (float)c; /* x / 1.0f == x */
    }
    ref_pack(tokens, ppn, packs, pack, rank, inv, ws);
    for (int q = 0; q < ppn; q++) {
      int p = inv[q];
      phy2log[node * ppn + q] = mlog2log[node * epn + phy2mlog[p]];
      phyrank[node * ppn + q] = prank[p];
    }
  }
}
