/* eplb_pack.c — packing n = m*k weighted items into m packs of exactly k
 * (balanced mode): LPT, Karmarkar-Karp's differencing in its balanced
 * (cardinality-constrained) form, pairwise swap local search, and a pass
 * that separates replicas of one expert sharing a pack when the max load
 * allows it. Double precision throughout. The searches after the first
 * packings draw on the layer's work budget (ws->refine_left, lp_eplb.h). */
#include <string.h>

#include "eplb_internal.h"

static int has_tag(const int *it, int cnt, const int *tag, int t, int skip) {
  for (int j = 0; j < cnt; j++)
    if (j != skip && tag[it[j]] == t) return 1;
  return 0;
}

static double pack_sum(const int *it, int k, const double *w) {
  double s = 0;
  for (int j = 0; j < k; j++) s += w[it[j]];
  return s;
}

/* Charges work to the layer's budget. */
static void spend(eplb_ws *ws, long work) {
  ws->refine_work += work;
  ws->refine_left = work < ws->refine_left ? ws->refine_left - work : 0;
}

/* Largest Processing Time first: items by weight descending (order), each
 * to the lightest non-full pack (lowest index on ties, preferring a pack
 * without the item's tag among equally light ones). */
static void lpt(int m, int k, const double *w, const int *tag, const int *order,
                int n, eplb_ws *ws, int *it, double *load) {
  int *cnt = ws->p_cnt, *buf = ws->p_buf;
  /* the tag search (a pack's items, then each equally light pack's) is
   * paid from the layer's refinement budget; once it is spent, items go to
   * the lightest pack whatever its tags */
  const long left = ws->refine_left;
  long work = 0;
  eplb_heap h = {ws->hkey, ws->hid, 0};
  for (int p = 0; p < m; p++) {
    cnt[p] = 0;
    load[p] = 0;
    eplb_heap_push(&h, 0.0, p);
  }
  for (int t = 0; t < n; t++) {
    int i = order[t], p;
    double key;
    eplb_heap_pop(&h, &key, &p);
    if (tag && work + k + 1 <= left &&
        (work += cnt[p] + 1, has_tag(it + (size_t)p * k, cnt[p], tag, tag[i], -1))) {
      int nb = 0, chosen = -1;
      while (h.n > 0 && h.key[0] == key && work + k + 2 <= left) {
        int q;
        double kq;
        eplb_heap_pop(&h, &kq, &q);
        work += cnt[q] + 2;
        if (!has_tag(it + (size_t)q * k, cnt[q], tag, tag[i], -1)) {
          chosen = q;
          break;
        }
        buf[nb++] = q;
      }
      for (int b = 0; b < nb; b++) eplb_heap_push(&h, key, buf[b]);
      if (chosen >= 0) {
        eplb_heap_push(&h, key, p);
        p = chosen;
      }
    }
    it[(size_t)p * k + cnt[p]++] = i;
    load[p] += w[i];
    if (cnt[p] < k) eplb_heap_push(&h, load[p], p);
  }
  spend(ws, work);
}

/* Balanced largest differencing (Karmarkar-Karp for m packs of k items):
 * round r of the sorted items is a partial solution with one item per pack;
 * repeatedly the two partial solutions with the largest spread are merged,
 * heaviest tuple of one with the lightest of the other. */
static void kk(int m, int k, const double *w, const int *order, eplb_ws *ws,
               int *it, double *load) {
  double *sum = ws->p_sum;
  int *head = ws->p_head, *tail = ws->p_tail, *next = ws->p_next;
  int *part = ws->p_part, *srt = ws->p_sort;
  const int n = m * k;
  for (int t = 0; t < n; t++) {
    int i = order[t];
    sum[t] = w[i];
    head[t] = tail[t] = i;
    next[i] = -1;
    part[t] = t; /* partial r holds tuples r*m .. r*m+m-1, heaviest first */
  }
  eplb_heap h = {ws->hkey, ws->hid, 0};
  for (int r = 0; r < k; r++)
    eplb_heap_push(&h, -(sum[r * m] - sum[r * m + m - 1]), r);
  while (h.n > 1) {
    int a, b;
    double ka;
    eplb_heap_pop(&h, &ka, &a);
    eplb_heap_pop(&h, &ka, &b);
    int *pa = part + (size_t)a * m, *pb = part + (size_t)b * m;
    eplb_sort_desc(sum, pa, m, ws);
    eplb_sort_desc(sum, pb, m, ws);
    for (int j = 0; j < m; j++) srt[j] = pb[m - 1 - j]; /* lightest first */
    double hi = 0, lo = 0;
    for (int j = 0; j < m; j++) {
      int ta = pa[j], tb = srt[j];
      sum[ta] += sum[tb];
      next[tail[ta]] = head[tb];
      tail[ta] = tail[tb];
      if (j == 0 || sum[ta] > hi) hi = sum[ta];
      if (j == 0 || sum[ta] < lo) lo = sum[ta];
    }
    eplb_heap_push(&h, -(hi - lo), a);
  }
  int r = h.id[0];
  for (int p = 0; p < m; p++) {
    int c = 0;
    for (int i = head[part[(size_t)r * m + p]]; i >= 0; i = next[i])
      it[(size_t)p * k + c++] = i;
    load[p] = pack_sum(it + (size_t)p * k, k, w);
  }
}

long eplb_refine_budget(long slots) {
  long lg = 1;
  while ((1L << lg) < slots + 1) lg++;
  long floor = LP_EPLB_REFINE_FLOOR < LP_EPLB_REFINE_PER_SLOT * slots
                   ? LP_EPLB_REFINE_FLOOR
                   : LP_EPLB_REFINE_PER_SLOT * slots;
  long nlogn = LP_EPLB_REFINE_WORK * slots * lg;
  return floor > nlogn ? floor : nlogn;
}

/* Best swap between the heaviest pack h (load L) and pack o: the first
 * (a, b) in order whose swap brings the larger of the two lowest, below
 * *best (ties: kept unless o comes before *bo). Counts k * k. */
static void try_pack(int k, const double *w, const int *it, const double *load,
                     int h, int o, double L, double *best, int *ba, int *bb,
                     int *bo) {
  const int *ih = it + (size_t)h * k, *io = it + (size_t)o * k;
  double gap = L - load[o];
  for (int a = 0; a < k; a++) {
    double wa = w[ih[a]];
    for (int b = 0; b < k; b++) {
      double dd = wa - w[io[b]];
      if (dd <= 0 || dd >= gap) continue;
      double nh = L - dd, no = load[o] + dd, nm = nh > no ? nh : no;
      if (nm < *best || (nm == *best && *bo >= 0 && o < *bo)) {
        *best = nm;
        *ba = a;
        *bb = b;
        *bo = o;
      }
    }
  }
}

/* Pairwise swaps: while some swap between the heaviest pack and another
 * lowers the larger of the two below the current max, apply the best (the
 * first pack, then the first pair, among equals). A swap with pack o
 * leaves the larger of the two at least (L + load[o]) / 2, so once the
 * lightest pack has given a candidate, only packs that could beat or tie
 * it are searched: a step costs O(m) plus k * k per pack searched. The
 * pass stops (without a partial step) when the work budget is spent. */
static void improve(int m, int k, const double *w, int *it, double *load,
                    eplb_ws *ws) {
  int limit = 4 * m * k + 64; /* each swap lowers a pack below the max */
  const long budget = ws->refine_left, pair = (long)k * k;
  long work = 0;
  while (limit-- > 0) {
    int h = 0;
    for (int p = 1; p < m; p++)
      if (load[p] > load[h]) h = p;
    double L = load[h];
    if (L <= 0 || m < 2) break;
    int lo = h == 0 ? 1 : 0;
    for (int p = lo + 1; p < m; p++)
      if (p != h && load[p] < load[lo]) lo = p;
    double tol = 1e-12 * L, best = L - tol;
    int ba = -1, bb = -1, bo = -1;
    work += 2L * m;
    if (L - load[lo] > tol) {
      if (work + pair > budget) goto cut;
      work += pair;
      try_pack(k, w, it, load, h, lo, L, &best, &ba, &bb, &bo);
    }
    for (int o = 0; o < m; o++) {
      if (o == h || o == lo || L - load[o] <= tol) continue;
      /* max(L - dd, load[o] + dd) >= (L + load[o]) / 2, less rounding */
      if (bo >= 0 && (L + load[o]) * 0.5 - 1e-13 * L > best) continue;
      if (work + pair > budget) goto cut;
      work += pair;
      try_pack(k, w, it, load, h, o, L, &best, &ba, &bb, &bo);
    }
    if (bo < 0) break;
    ws->refine_steps++;
    int *ph = it + (size_t)h * k, *po = it + (size_t)bo * k;
    int t = ph[ba];
    ph[ba] = po[bb];
    po[bb] = t;
    load[h] = pack_sum(ph, k, w);
    load[bo] = pack_sum(po, k, w);
  }
  spend(ws, work);
  return;
cut:
  ws->refine_cut++;
  spend(ws, work);
}

/* Items whose tag an earlier item of their pack has; stamp[tag] = the
 * last pack seen with it. */
static int count_dups(int m, int k, const int *tag, const int *it, int *stamp) {
  int d = 0;
  for (int i = 0; i < m * k; i++) stamp[tag[it[i]]] = -1;
  for (int p = 0; p < m; p++)
    for (int j = 0; j < k; j++) {
      int t = tag[it[(size_t)p * k + j]];
      d += stamp[t] == p;
      stamp[t] = p;
    }
  return d;
}

/* Moves the second replica of an expert off a pack by a swap that keeps
 * every pack at or below the current max load (the lightest result, the
 * first pack and item among equals). first[t] is the first position of tag
 * t in the pack being fixed (stale for tags not there, hence the check), so
 * a search costs 2 * k per other pack; searches stop when the budget is
 * spent. */
static void dedup(int m, int k, const double *w, const int *tag, int *it,
                  double *load, eplb_ws *ws) {
  const long budget = ws->refine_left;
  const long search_cost = 2L * (m - 1) * k;
  int *first = ws->m_list;
  long work = 0;
  double M = 0;
  for (int p = 0; p < m; p++)
    if (load[p] > M) M = load[p];
  for (int p = 0; p < m; p++) {
    int *ip = it + (size_t)p * k;
    for (int j = k - 1; j >= 0; j--) first[tag[ip[j]]] = j;
    work += k;
    for (int a = 1; a < k; a++) {
      int ia = ip[a], ta = tag[ia];
      if (first[ta] >= a) continue; /* no earlier item with its tag */
      if (work + search_cost > budget) {
        ws->refine_cut++;
        spend(ws, work);
        return;
      }
      work += search_cost;
      double best = 0;
      int bo = -1, bb = -1;
      for (int o = 0; o < m; o++) {
        if (o == p) continue;
        int *io = it + (size_t)o * k;
        if (has_tag(io, k, tag, ta, -1)) continue;
        for (int b = 0; b < k; b++) {
          int ib = io[b], tb = tag[ib];
          /* tb in p other than at a (ta is there earlier too) */
          if (tb == ta || ((unsigned)first[tb] < (unsigned)k && tag[ip[first[tb]]] == tb))
            continue;
          double np = load[p] - w[ia] + w[ib], no = load[o] + w[ia] - w[ib];
          if (np > M || no > M) continue;
          double nm = np > no ? np : no;
          if (bo < 0 || nm < best) {
            best = nm;
            bo = o;
            bb = b;
          }
        }
      }
      if (bo < 0) continue;
      ws->refine_steps++;
      int *io = it + (size_t)bo * k, ib = io[bb];
      ip[a] = ib;
      io[bb] = ia;
      first[tag[ib]] = a;
      load[p] = pack_sum(ip, k, w);
      load[bo] = pack_sum(io, k, w);
      work += k;
      a = 0; /* rescan this pack */
    }
  }
  spend(ws, work);
}

static double max_of(const double *v, int m) {
  double x = 0;
  for (int p = 0; p < m; p++)
    if (v[p] > x) x = v[p];
  return x;
}

void eplb_pack_best(int n, int m, int k, const double *w, const int *tag,
                    eplb_ws *ws, int *items, double *load) {
  int *order = ws->idx;
  for (int i = 0; i < n; i++) order[i] = i;
  eplb_sort_desc(w, order, n, ws);

  int *it1 = ws->p_items, *it2 = ws->p_items2;
  double *l1 = ws->p_load, *l2 = ws->p_load2;
  lpt(m, k, w, tag, order, n, ws, it1, l1);
  improve(m, k, w, it1, l1, ws);
  if (tag) dedup(m, k, w, tag, it1, l1, ws);
  kk(m, k, w, order, ws, it2, l2);
  improve(m, k, w, it2, l2, ws);
  if (tag) dedup(m, k, w, tag, it2, l2, ws);

  double m1 = max_of(l1, m), m2 = max_of(l2, m);
  int use2 = m2 < m1;
  if (m2 == m1 && tag)
    use2 = count_dups(m, k, tag, it2, ws->m_cnt) < count_dups(m, k, tag, it1, ws->m_cnt);
  memcpy(items, use2 ? it2 : it1, (size_t)n * sizeof *items);
  memcpy(load, use2 ? l2 : l1, (size_t)m * sizeof *load);
}
