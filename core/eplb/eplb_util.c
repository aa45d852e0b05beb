/* eplb_util.c — sorting, a small heap and the scratch-space allocator used
 * by the EPLB steps. */
#include <stdint.h>
#include <string.h>

#include "eplb_internal.h"

/* Radix key of a non-negative double: its bits order like the values
 * (-0.0 counts as 0); complemented so that ascending keys mean descending
 * values. */
static uint64_t desc_key(double v) {
  uint64_t u;
  if (v == 0) v = 0; /* -0.0 -> +0.0 */
  memcpy(&u, &v, sizeof u);
  return ~u;
}

/* Stable sort of idx by key descending: insertion sort for short arrays,
 * else an LSD radix sort on the key bits that skips bytes all keys share
 * (integer-valued loads leave most low bytes equal). */
void eplb_sort_desc(const double *key, int *idx, int n, eplb_ws *ws) {
  if (n < 2) return;
  if (n <= 24) {
    for (int i = 1; i < n; i++) {
      int v = idx[i], j = i - 1;
      while (j >= 0 && key[idx[j]] < key[v]) {
        idx[j + 1] = idx[j];
        j--;
      }
      idx[j + 1] = v;
    }
    return;
  }
  uint64_t *a = ws->s_k1, *b = ws->s_k2, all_or = 0, all_and = ~(uint64_t)0;
  int *ia = idx, *ib = ws->tmp;
  for (int i = 0; i < n; i++) {
    a[i] = desc_key(key[idx[i]]);
    all_or |= a[i];
    all_and &= a[i];
  }
  uint64_t vary = all_or ^ all_and;
  int count[256];
  for (int shift = 0; shift < 64; shift += 8) {
    if (((vary >> shift) & 0xff) == 0) continue;
    memset(count, 0, sizeof count);
    for (int i = 0; i < n; i++) count[(a[i] >> shift) & 0xff]++;
    int sum = 0;
    for (int c = 0; c < 256; c++) {
      int t = count[c];
      count[c] = sum;
      sum += t;
    }
    for (int i = 0; i < n; i++) {
      int pos = count[(a[i] >> shift) & 0xff]++;
      b[pos] = a[i];
      ib[pos] = ia[i];
    }
    uint64_t *tk = a;
    a = b;
    b = tk;
    int *ti = ia;
    ia = ib;
    ib = ti;
  }
  if (ia != idx) memcpy(idx, ia, (size_t)n * sizeof *idx);
}

static void sort_int_rec(int *a, int n, int *tmp) {
  if (n <= 16) {
    for (int i = 1; i < n; i++) {
      int v = a[i], j = i - 1;
      while (j >= 0 && a[j] > v) {
        a[j + 1] = a[j];
        j--;
      }
      a[j + 1] = v;
    }
    return;
  }
  int h = n / 2;
  sort_int_rec(a, h, tmp);
  sort_int_rec(a + h, n - h, tmp);
  int i = 0, j = h, o = 0;
  while (i < h && j < n) tmp[o++] = a[j] < a[i] ? a[j++] : a[i++];
  while (i < h) tmp[o++] = a[i++];
  while (j < n) tmp[o++] = a[j++];
  memcpy(a, tmp, (size_t)n * sizeof *a);
}

void eplb_sort_int(int *a, int n) {
  int buf[64];
  if (n <= 16) {
    sort_int_rec(a, n, buf);
    return;
  }
  /* rare large packs: a heap sort needs no scratch */
  for (int start = n / 2 - 1; start >= 0; start--) {
    int r = start;
    for (;;) {
      int c = 2 * r + 1;
      if (c >= n) break;
      if (c + 1 < n && a[c + 1] > a[c]) c++;
      if (a[c] <= a[r]) break;
      int t = a[c]; a[c] = a[r]; a[r] = t;
      r = c;
    }
  }
  for (int end = n - 1; end > 0; end--) {
    int t = a[0]; a[0] = a[end]; a[end] = t;
    int r = 0;
    for (;;) {
      int c = 2 * r + 1;
      if (c >= end) break;
      if (c + 1 < end && a[c + 1] > a[c]) c++;
      if (a[c] <= a[r]) break;
      t = a[c]; a[c] = a[r]; a[r] = t;
      r = c;
    }
  }
}

static int heap_less(const eplb_heap *h, int a, int b) {
  return h->key[a] < h->key[b] || (h->key[a] == h->key[b] && h->id[a] < h->id[b]);
}

static void heap_swap(eplb_heap *h, int a, int b) {
  double k = h->key[a];
  int i = h->id[a];
  h->key[a] = h->key[b];
  h->id[a] = h->id[b];
  h->key[b] = k;
  h->id[b] = i;
}

void eplb_heap_push(eplb_heap *h, double key, int id) {
  int i = h->n++;
  h->key[i] = key;
  h->id[i] = id;
  while (i > 0) {
    int p = (i - 1) / 2;
    if (!heap_less(h, i, p)) break;
    heap_swap(h, i, p);
    i = p;
  }
}

static void sift_down(eplb_heap *h, int i) {
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && heap_less(h, l, m)) m = l;
    if (r < h->n && heap_less(h, r, m)) m = r;
    if (m == i) break;
    heap_swap(h, i, m);
    i = m;
  }
}

void eplb_heap_pop(eplb_heap *h, double *key, int *id) {
  *key = h->key[0];
  *id = h->id[0];
  h->n--;
  if (h->n == 0) return;
  h->key[0] = h->key[h->n];
  h->id[0] = h->id[h->n];
  sift_down(h, 0);
}

void eplb_heap_replace_top(eplb_heap *h, double key, int id) {
  h->key[0] = key;
  h->id[0] = id;
  sift_down(h, 0);
}

void eplb_heap_build(eplb_heap *h, int n) {
  h->n = n;
  for (int i = n / 2 - 1; i >= 0; i--) sift_down(h, i);
}

/* ---- scratch space ---- */

/* Every array lives in one arena: a first pass over the layout measures
 * it (ws->arena NULL), a second one hands out the places. Each array gets
 * 16 bytes of slack and starts on a 64-byte line. */
static void *take(eplb_ws *ws, size_t n, size_t size) {
  const size_t at = ws->used;
  ws->used += (n * size + 16 + 63) & ~(size_t)63;
  return ws->arena ? (char *)ws->arena + at : NULL;
}

void eplb_ws_free(eplb_ws *ws) {
  lp_free(ws->arena);
  ws->arena = NULL;
}

static void ws_layout(eplb_ws *ws, const eplb_dims *d, int relabel) {
  int n = d->E;
  if (d->R > n) n = d->R;
  if (d->G > n) n = d->G;
  if (d->groups > n) n = d->groups;
  n += 1;
  ws->n = n;
  size_t nn = (size_t)n;
  size_t gn = (size_t)(d->G > d->N ? d->G : d->N);
#define I(f) ws->f = take(ws, nn, sizeof(int))
#define D(f) ws->f = take(ws, nn, sizeof(double))
#define F(f) ws->f = take(ws, nn, sizeof(float))
  D(dkey2);
  ws->s_k1 = take(ws, nn, sizeof(uint64_t));
  ws->s_k2 = take(ws, nn, sizeof(uint64_t));
  I(idx); I(tmp); I(ia); I(ib); I(ic); I(id); I(ie); I(if_);
  I(slot_gpu); I(slot_node);
  D(hkey); I(hid);
  F(fw); F(fa); F(fb);
  D(da); D(db); D(dc);
  I(r_mlog2log); I(r_phy2mlog); I(r_prank); I(r_mcnt);
  I(r_pack); I(r_rank); I(r_inv);
  ws->r_tree = take(ws, 4 * nn, sizeof(uint64_t));
  I(p_items); I(p_items2); I(p_cnt); I(p_next); I(p_head); I(p_tail);
  I(p_part); I(p_sort);
  D(p_load); D(p_load2); D(p_sum);
  I(p_buf);
  I(c_phy2log); I(c_phyrank); I(c_home); I(c_gnode); I(c_cnt); I(c_items);
  I(m_cnt); I(m_list); I(m_list2);
  I(b_cur); I(b_start); I(b_list); I(b_tstart); I(b_tlist); I(b_diff);
  I(b_done); I(b_stamp); I(b_order);
  D(b_load); D(b_delta);
#undef I
#undef D
#undef F
  if (relabel) { /* G x G overlaps and the Hungarian method */
    ws->h_score = take(ws, (size_t)d->G * (size_t)d->G, sizeof(int));
    ws->h_cost = take(ws, gn * gn, sizeof(long long));
    ws->h_u = take(ws, gn + 1, sizeof(long long));
    ws->h_v = take(ws, gn + 1, sizeof(long long));
    ws->h_minv = take(ws, gn + 1, sizeof(long long));
    ws->h_p = take(ws, gn + 1, sizeof(int));
    ws->h_way = take(ws, gn + 1, sizeof(int));
    ws->h_used = take(ws, gn + 1, sizeof(int));
    ws->h_ans = take(ws, gn + 1, sizeof(int));
    ws->h_perm = take(ws, gn + 1, sizeof(int));
    ws->h_vnode = take(ws, (size_t)d->N * (size_t)d->N, sizeof(int));
    size_t c = 2 * (size_t)d->G + 1, gg = (size_t)d->G * (size_t)d->G;
    ws->s_v = take(ws, c, sizeof(long long));
    ws->s_d = take(ws, c, sizeof(long long));
    ws->s_pcost = take(ws, c, sizeof(long long));
    ws->s_rcost = take(ws, c, sizeof(long long));
    ws->s_pred = take(ws, c, sizeof(int));
    ws->s_done = take(ws, c, sizeof(int));
    ws->s_seen = take(ws, c, sizeof(int));
    ws->s_final = take(ws, c, sizeof(int));
    ws->s_cmatch = take(ws, c, sizeof(int));
    ws->s_rmatch = take(ws, c, sizeof(int));
    ws->s_start = take(ws, c, sizeof(int));
    ws->s_adj = take(ws, gg, sizeof(int));
    ws->s_w = take(ws, gg, sizeof(int));
    ws->s_hkey = take(ws, gg + c, sizeof(double));
    ws->s_hid = take(ws, gg + c, sizeof(int));
  }
}

lp_status eplb_ws_alloc(eplb_ws *ws, const eplb_dims *d, int relabel) {
  memset(ws, 0, sizeof *ws);
  ws_layout(ws, d, relabel); /* measures */
  void *arena = lp_malloc(ws->used);
  if (!arena) return LP_ERR_NOMEM;
  memset(ws, 0, sizeof *ws);
  ws->arena = arena;
  ws_layout(ws, d, relabel); /* places */
  const int per_node = d->R / d->N;
  for (int s = 0, g = 0, at_g = 0, node = 0, at_node = 0; s < d->R; s++) { /* no divisions */
    ws->slot_gpu[s] = g;
    ws->slot_node[s] = node;
    if (++at_g == d->k) at_g = 0, g++;
    if (++at_node == per_node) at_node = 0, node++;
  }
  return LP_OK;
}
