/* eplb_incremental.c — re-planning against the placement in force:
 * relabelling GPUs (and nodes) by maximum-overlap assignment (Hungarian
 * method), slot alignment inside GPUs, and the copy budget (a local search
 * from the placement in force that spends the budget where it lowers the
 * heaviest GPU most). */
#include <limits.h>
#include <string.h>

#include "eplb_internal.h"

/* Minimum-cost perfect assignment of the n x n matrix a (row-major):
 * ans[i] = column of row i. O(n^3) worst case, about O(n^2) when most
 * rows' best columns differ, as when a plan changes little. */
static long long hungarian(int n, const long long *a, eplb_ws *ws, int *ans) {
  long long *u = ws->h_u, *v = ws->h_v, *minv = ws->h_minv;
  int *p = ws->h_p, *way = ws->h_way, *used = ws->h_used;
  const long long INF = LLONG_MAX / 4;
  for (int j = 0; j <= n; j++) {
    u[j] = v[j] = 0;
    p[j] = way[j] = 0;
  }
  for (int i = 1; i <= n; i++) {
    p[0] = i;
    int j0 = 0;
    for (int j = 0; j <= n; j++) {
      minv[j] = INF;
      used[j] = 0;
    }
    do {
      used[j0] = 1;
      int i0 = p[j0], j1 = 0;
      long long delta = INF;
      for (int j = 1; j <= n; j++) {
        if (used[j]) continue;
        long long cur = a[(size_t)(i0 - 1) * n + (j - 1)] - u[i0] - v[j];
        if (cur < minv[j]) {
          minv[j] = cur;
          way[j] = j0;
        }
        if (minv[j] < delta) {
          delta = minv[j];
          j1 = j;
        }
      }
      for (int j = 0; j <= n; j++) {
        if (used[j]) {
          u[p[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (p[j0] != 0);
    do {
      int j1 = way[j0];
      p[j0] = p[j1];
      j0 = j1;
    } while (j0);
  }
  long long total = 0;
  for (int j = 1; j <= n; j++) {
    ans[p[j] - 1] = j - 1;
    total += a[(size_t)(p[j] - 1) * n + (j - 1)];
  }
  return total;
}

/* Maximum-overlap assignment of n new GPUs to n old GPUs from the sparse
 * nonzero overlaps (ws->h_score, n x n): shortest augmenting paths with
 * Dijkstra on reduced costs (Jonker-Volgenant style), costs -overlap; each
 * row also owns a zero-cost dummy column, so rows without a useful match
 * stay free and take the columns left over, in ascending order. Optimal,
 * and fast when most overlaps are zero. ans[i] = old GPU of new GPU i. */
static void sparse_assign(int n, eplb_ws *ws, int *ans) {
  const int C = 2 * n; /* real columns 0..n-1, dummy of row i: n + i */
  long long *v = ws->s_v, *d = ws->s_d, *pcost = ws->s_pcost, *rcost = ws->s_rcost;
  int *pred = ws->s_pred, *done = ws->s_done, *seen = ws->s_seen, *fin = ws->s_final;
  int *cm = ws->s_cmatch, *rm = ws->s_rmatch;
  int *start = ws->s_start, *adj = ws->s_adj, *w = ws->s_w;
  int nnz = 0;
  for (int i = 0; i < n; i++) {
    start[i] = nnz;
    for (int j = 0; j < n; j++) {
      int s = ws->h_score[(size_t)i * n + j];
      if (s > 0) {
        adj[nnz] = j;
        w[nnz++] = s;
      }
    }
  }
  start[n] = nnz;
  for (int j = 0; j < C; j++) {
    v[j] = 0;
    cm[j] = -1;
    done[j] = seen[j] = -1;
  }
  for (int i = 0; i < n; i++) rm[i] = -1;
  eplb_heap h = {ws->s_hkey, ws->s_hid, 0};
  for (int src = 0; src < n; src++) {
    /* u of the new row: the least reduced cost over its edges and dummy */
    long long u = -v[n + src];
    for (int e = start[src]; e < start[src + 1]; e++)
      if (-(long long)w[e] - v[adj[e]] < u) u = -(long long)w[e] - v[adj[e]];
    h.n = 0;
    int row = src, target = -1, nfin = 0;
    long long base = 0, best = 0; /* distance of `row`; of the best free column */
    for (;;) {
      /* relax row's edges (reduced costs >= 0), its dummy last; free
       * columns only improve the bound, matched ones go to the heap */
      long long ur = row == src ? u : rcost[row] - v[rm[row]];
      for (int e = start[row]; e <= start[row + 1]; e++) {
        int j = e < start[row + 1] ? adj[e] : n + row;
        long long c = e < start[row + 1] ? -(long long)w[e] : 0;
        if (done[j] == src) continue;
        long long nd = base + c - ur - v[j];
        if (target >= 0 && nd >= best) continue;
        if (seen[j] == src && nd >= d[j]) continue;
        seen[j] = src;
        d[j] = nd;
        pred[j] = row;
        pcost[j] = c;
        if (cm[j] < 0) {
          target = j;
          best = nd;
        } else {
          eplb_heap_push(&h, (double)nd, j);
        }
      }
      /* the closest matched column, unless the best free one is closer */
      int j = -1;
      while (h.n > 0) {
        double k;
        eplb_heap_pop(&h, &k, &j);
        if (done[j] != src && (long long)k == d[j]) break;
        j = -1;
      }
      if (j < 0 || d[j] >= best) break;
      done[j] = src;
      fin[nfin++] = j;
      row = cm[j];
      base = d[j];
    }
    /* potentials of the finalised columns, then augment */
    for (int q = 0; q < nfin; q++) v[fin[q]] -= best - d[fin[q]];
    for (int j = target;;) {
      int i = pred[j], prev = rm[i];
      cm[j] = i;
      rm[i] = j;
      rcost[i] = pcost[j];
      if (i == src) break;
      j = prev;
    }
  }
  int next = 0;
  for (int i = 0; i < n; i++) ans[i] = rm[i] < n ? rm[i] : -1;
  for (int i = 0; i < n; i++) {
    if (ans[i] >= 0) continue;
    while (cm[next] >= 0) next++;
    cm[next] = i;
    ans[i] = next;
  }
}

/* Best assignment of new node a's GPUs to old node b's GPUs; returns the
 * number of experts kept, the assignment in ans. */
static int match_gpus(const eplb_dims *d, int a, int b, eplb_ws *ws, int *ans) {
  const int G = d->G, gpn = G / d->nn;
  long long *c = ws->h_cost;
  for (int i = 0; i < gpn; i++)
    for (int j = 0; j < gpn; j++)
      c[i * gpn + j] = -(long long)ws->h_score[(size_t)(a * gpn + i) * G + (b * gpn + j)];
  return (int)-hungarian(gpn, c, ws, ans);
}

void eplb_relabel_layer(const eplb_dims *d, const int *prev, eplb_ws *ws,
                        int *phy2log, int *phyrank, int *home) {
  const int G = d->G, R = d->R, k = d->k, nn = d->nn, gpn = G / nn;
  int *ns = ws->m_list, *os = ws->m_list2, *pos = ws->h_perm;
  memcpy(ns, phy2log, (size_t)R * sizeof *ns);
  memcpy(os, prev, (size_t)R * sizeof *os);
  for (int g = 0; g < G; g++) {
    eplb_sort_int(ns + (size_t)g * k, k);
    eplb_sort_int(os + (size_t)g * k, k);
  }
  /* overlaps through the experts: old GPUs (with counts) per expert, then
   * every distinct expert of a new GPU adds min(counts) to its old GPUs */
  int *score = ws->h_score, *start = ws->b_tstart, *ogpu = ws->b_tlist, *ocnt = ws->b_diff;
  memset(score, 0, (size_t)G * G * sizeof *score);
  memset(start, 0, (size_t)(d->E + 1) * sizeof *start);
  for (int g = 0; g < G; g++)
    for (int t = 0; t < k; t++) {
      const int *o = os + (size_t)g * k;
      if (t == 0 || o[t] != o[t - 1]) start[o[t] + 1]++;
    }
  for (int e = 0; e < d->E; e++) start[e + 1] += start[e];
  int *fill = ws->ic;
  memcpy(fill, start, (size_t)d->E * sizeof *fill);
  for (int g = 0; g < G; g++) {
    const int *o = os + (size_t)g * k;
    for (int t = 0; t < k; t++) {
      if (t > 0 && o[t] == o[t - 1]) {
        ocnt[fill[o[t]] - 1]++;
      } else {
        ogpu[fill[o[t]]] = g;
        ocnt[fill[o[t]]++] = 1;
      }
    }
  }
  for (int i = 0; i < G; i++) {
    const int *x = ns + (size_t)i * k;
    for (int t = 0; t < k;) {
      int e = x[t], a = 1;
      while (t + a < k && x[t + a] == e) a++;
      for (int q = start[e]; q < start[e + 1]; q++)
        score[(size_t)i * G + ogpu[q]] += a < ocnt[q] ? a : ocnt[q];
      t += a;
    }
  }

  int *sigma = ws->b_order; /* new node -> old node */
  int *ans = ws->h_ans;
  if (nn > 1) {
    int *v = ws->h_vnode;
    for (int a = 0; a < nn; a++)
      for (int b = 0; b < nn; b++) v[a * nn + b] = match_gpus(d, a, b, ws, ans);
    long long *c = ws->h_cost;
    for (int i = 0; i < nn * nn; i++) c[i] = -(long long)v[i];
    hungarian(nn, c, ws, ans);
    memcpy(sigma, ans, (size_t)nn * sizeof *sigma);
    for (int a = 0; a < nn; a++) {
      match_gpus(d, a, sigma[a], ws, ans);
      for (int i = 0; i < gpn; i++) pos[a * gpn + i] = sigma[a] * gpn + ans[i];
    }
  } else {
    sparse_assign(G, ws, pos);
    sigma[0] = 0;
  }

  /* move GPU i's slots to position pos[i], keeping kept experts in their
   * old slot */
  int *out = ws->c_phy2log, *orank = ws->c_phyrank;
  int *taken = ws->b_done, *placed = ws->b_stamp;
  for (int i = 0; i < G; i++) {
    const int j = pos[i];
    const int *old = prev + (size_t)j * k, *nw = phy2log + (size_t)i * k;
    const int *nr = phyrank + (size_t)i * k;
    int *o = out + (size_t)j * k, *orr = orank + (size_t)j * k;
    for (int t = 0; t < k; t++) taken[t] = placed[t] = 0;
    for (int t = 0; t < k; t++)
      for (int u = 0; u < k; u++)
        if (!taken[u] && old[u] == nw[t]) {
          o[u] = nw[t];
          orr[u] = nr[t];
          taken[u] = placed[t] = 1;
          break;
        }
    int u = 0;
    for (int t = 0; t < k; t++) {
      if (placed[t]) continue;
      while (taken[u]) u++;
      o[u] = nw[t];
      orr[u] = nr[t];
      taken[u] = 1;
    }
  }
  memcpy(phy2log, out, (size_t)R * sizeof *out);
  memcpy(phyrank, orank, (size_t)R * sizeof *orank);
  if (d->hier && nn > 1)
    for (int e = 0; e < d->E; e++)
      if (home[e] >= 0) home[e] = sigma[home[e]];
}

/* ---- copy budget ---- */

typedef struct budget {
  const eplb_dims *d;
  const double *w;
  int *cur, *cnt, *start, *list; /* current map, counts, expert -> slots */
  double *load, *delta;
  int *order, *stamp, *touched;
  int stampv;
  double max, sq;
  const int *home, *slot_node; /* home: NULL when experts may leave their node */
} budget;

/* May slot s hold expert e? Off its group's node only when home is NULL. */
static int at_home(const budget *b, int e, int s) {
  return !b->home || b->home[e] < 0 || b->slot_node[s] == b->home[e];
}

static void budget_refresh(budget *b, eplb_ws *ws) {
  const int E = b->d->E, R = b->d->R, G = b->d->G, k = b->d->k;
  memset(b->cnt, 0, (size_t)E * sizeof *b->cnt);
  for (int s = 0; s < R; s++) b->cnt[b->cur[s]]++;
  b->start[0] = 0;
  for (int e = 0; e < E; e++) b->start[e + 1] = b->start[e] + b->cnt[e];
  int *fill = ws->m_list;
  memcpy(fill, b->start, (size_t)E * sizeof *fill);
  for (int s = 0; s < R; s++) b->list[fill[b->cur[s]]++] = s;
  b->sq = 0;
  for (int g = 0; g < G; g++) {
    double s = 0;
    for (int j = 0; j < k; j++) {
      int e = b->cur[g * k + j];
      s += b->w[e] / b->cnt[e];
    }
    b->load[g] = s;
    b->sq += s * s;
    b->order[g] = g;
  }
  eplb_sort_desc(b->load, b->order, G, ws);
  b->max = b->load[b->order[0]];
}

static void touch(budget *b, int g, int *nt, double add) {
  if (b->stamp[g] != b->stampv) {
    b->stamp[g] = b->stampv;
    b->delta[g] = 0;
    b->touched[(*nt)++] = g;
  }
  b->delta[g] += add;
}

/* Max GPU load and sum of squares after setting cur[s[i]] = to[i] (nch
 * changes, at most 4). */
static void budget_eval(budget *b, const int *s, const int *to, int nch,
                        double *nmax, double *nsq) {
  const int k = b->d->k;
  /* the experts the changes touch (ex), their copy-count change (dc), and
   * where to[i] is among them (to_x) */
  int ex[8], dc[8], to_x[4], nx = 0, nt = 0;
  b->stampv++;
  for (int i = 0; i < nch; i++) {
    int from = b->cur[s[i]], pair[2] = {from, to[i]}, sign[2] = {-1, 1};
    for (int q = 0; q < 2; q++) {
      int x = 0;
      while (x < nx && ex[x] != pair[q]) x++;
      if (x == nx) {
        ex[nx] = pair[q];
        dc[nx++] = 0;
      }
      dc[x] += sign[q];
      if (q == 1) to_x[i] = x;
    }
  }
  for (int x = 0; x < nx; x++) {
    int e = ex[x], c = b->cnt[e], nc = c + dc[x];
    double w = b->w[e];
    for (int t = b->start[e]; t < b->start[e + 1]; t++) {
      int slot = b->list[t], changed = 0;
      for (int i = 0; i < nch; i++) changed |= s[i] == slot;
      touch(b, slot / k, &nt, changed ? -w / c : w / nc - w / c);
    }
  }
  for (int i = 0; i < nch; i++)
    touch(b, s[i] / k, &nt, b->w[to[i]] / (b->cnt[to[i]] + dc[to_x[i]]));
  double mx = 0, sq = b->sq;
  for (int t = 0; t < nt; t++) {
    int g = b->touched[t];
    double nl = b->load[g] + b->delta[g];
    if (nl > mx) mx = nl;
    sq += nl * nl - b->load[g] * b->load[g];
  }
  for (int t = 0; t < b->d->G; t++) {
    int g = b->order[t];
    if (b->stamp[g] == b->stampv) continue;
    if (b->load[g] > mx) mx = b->load[g];
    break;
  }
  *nmax = mx;
  *nsq = sq;
}

/* Slots of cur that differ from prev. */
static int changed_slots(const int *prev, const int *cur, int R) {
  int n = 0;
  for (int s = 0; s < R; s++) n += cur[s] != prev[s];
  return n;
}

/* A candidate change of one or two slots and what it costs and gives. */
typedef struct cand {
  int n, s[2], to[2];
  double m, q, gain; /* new max, new sum of squares, gain per copy */
  int cost;
} cand;

/* Scores change c against the best so far (max first, then sum of
 * squares, each per slot of the budget it uses). */
static void consider(budget *b, const int *prev, int used, int limit, int known, cand *c,
                     cand *best) {
  int cost = 0;
  for (int i = 0; i < c->n; i++)
    cost += (c->to[i] != prev[c->s[i]]) - (b->cur[c->s[i]] != prev[c->s[i]]);
  if (used + cost > limit) return;
  if (!known) budget_eval(b, c->s, c->to, c->n, &c->m, &c->q);
  double per = cost > 0 ? cost : 1;
  if (c->m < b->max * (1 - 1e-12)) {
    c->gain = (b->max - c->m) / per + 1e-300;
  } else if (c->m <= b->max * (1 + 1e-12) && c->q < b->sq * (1 - 1e-12)) {
    c->gain = -1.0 / ((b->sq - c->q) / per); /* < 0: below every max gain */
  } else {
    return;
  }
  c->cost = cost;
  if (best->n == 0 || c->gain > best->gain) *best = *c;
}

/* Local search from b->cur under the copy budget (slots differing from
 * prev <= limit): each step takes, among the changes that unload the
 * heaviest GPU, the one that lowers the max GPU load most per slot it
 * uses (else the sum of squares): give one of its slots to another
 * expert, give one of its experts another slot elsewhere, or swap one of
 * its slots with a slot of another GPU. Every expert keeps a replica. */
static void polish(budget *b, const int *prev, int limit, eplb_ws *ws) {
  const eplb_dims *d = b->d;
  const int E = d->E, R = d->R, G = d->G, k = d->k;
  enum { NCOLD = 16, NLIGHT = 32 };
  int *cur = b->cur, cold[NCOLD];
  int *ong = ws->p_next, *hasa = ws->p_head; /* flags: expert on g; GPU holds a */
  double *xslot = ws->p_sum;                  /* load of each slot */
  memset(ong, 0, (size_t)E * sizeof *ong);
  memset(hasa, 0, (size_t)G * sizeof *hasa);
  double unit[NCOLD];
  for (int step = 0; step < 2 * limit + 16; step++) {
    budget_refresh(b, ws);
    int used = changed_slots(prev, cur, R), g = b->order[0];
    /* the NCOLD experts one more replica would load least, lightest first */
    int ncold = 0;
    for (int e = 0; e < E; e++) {
      double u = b->w[e] / (b->cnt[e] + 1);
      if (ncold == NCOLD && u >= unit[NCOLD - 1]) continue;
      int i = ncold < NCOLD ? ncold++ : NCOLD - 1;
      while (i > 0 && unit[i - 1] > u) {
        unit[i] = unit[i - 1];
        cold[i] = cold[i - 1];
        i--;
      }
      unit[i] = u;
      cold[i] = e;
    }
    cand best = {0}, c = {0};
    const double top = b->max;
    /* the heaviest GPU other than h, for swaps */
    const int g2 = G > 1 ? b->order[1] : g, g3 = G > 2 ? b->order[2] : g2;
    for (int j = 0; j < k; j++) ong[cur[g * k + j]] = 1;
    for (int t = 0; t < R; t++) xslot[t] = b->w[cur[t]] / b->cnt[cur[t]];
    for (int j = 0; j < k; j++) {
      int s = g * k + j, a = cur[s];
      if (j > 0 && a == cur[s - 1]) continue;
      for (int q = b->start[a]; q < b->start[a + 1]; q++) hasa[b->list[q] / k] = 1;
      double xs = b->w[a] / b->cnt[a], xa = b->w[a] / (b->cnt[a] + 1);
      /* s holds another expert: the few lightest ones not on g */
      if (b->cnt[a] >= 2)
        for (int i = 0, tried = 0; i < ncold && tried < 4; i++) {
          int e = cold[i];
          if (e == a || ong[e] || !at_home(b, e, s)) continue;
          if (top - xs + unit[i] >= top) break;
          tried++;
          c.n = 1, c.s[0] = s, c.to[0] = e;
          consider(b, prev, used, limit, 0, &c, &best);
        }
      /* on the NLIGHT lightest GPUs h without a: a gets slot t of an expert
       * x that keeps a replica elsewhere, or s and t swap (then only g and
       * h change) */
      for (int r = G - 1, seen = 0; r > 0 && seen < NLIGHT; r--) {
        int h = b->order[r];
        if (h == g || hasa[h] || !at_home(b, a, h * k)) continue;
        seen++;
        double lh = b->load[h];
        for (int t = h * k; t < (h + 1) * k; t++) {
          int x = cur[t];
          if (x == a) continue;
          double xt = xslot[t];
          if (b->cnt[x] >= 2 && lh - xt + xa < top) {
            c.n = 1, c.s[0] = t, c.to[0] = a;
            consider(b, prev, used, limit, 0, &c, &best);
          }
          double ng = top - xs + xt, nh = lh + xs - xt;
          if (!(xt < xs) || nh >= top || ong[x] || !at_home(b, x, s)) continue;
          double rest = G > 1 ? b->load[h != g2 ? g2 : g3] : 0;
          c.m = ng > nh ? ng : nh;
          if (rest > c.m) c.m = rest;
          c.q = b->sq - top * top - lh * lh + ng * ng + nh * nh;
          c.n = 2, c.s[0] = s, c.to[0] = x, c.s[1] = t, c.to[1] = a;
          consider(b, prev, used, limit, 1, &c, &best);
        }
      }
      for (int q = b->start[a]; q < b->start[a + 1]; q++) hasa[b->list[q] / k] = 0;
    }
    for (int j = 0; j < k; j++) ong[cur[g * k + j]] = 0;
    if (best.n == 0) return;
    for (int i = 0; i < best.n; i++) cur[best.s[i]] = best.to[i];
  }
}

void eplb_prev_homes(const eplb_dims *d, const double *load, const int *prev,
                     eplb_ws *ws, int *home) {
  const int E = d->E, R = d->R, nn = d->nn, gs = E / d->ng;
  if (!d->hier) {
    for (int e = 0; e < E; e++) home[e] = -1;
    return;
  }
  int *cnt = ws->id, *nslots = ws->ie;
  double *share = ws->dkey2;
  memset(cnt, 0, (size_t)E * sizeof *cnt);
  for (int s = 0; s < R; s++) cnt[prev[s]]++;
  for (int g = 0; g < d->ng; g++) {
    for (int n = 0; n < nn; n++) share[n] = 0, nslots[n] = 0;
    for (int s = 0; s < R; s++) {
      int e = prev[s];
      if (e / gs != g) continue;
      share[ws->slot_node[s]] += load[e] / cnt[e];
      nslots[ws->slot_node[s]]++;
    }
    int best = 0;
    for (int n = 1; n < nn; n++)
      if (share[n] > share[best] || (share[n] == share[best] && nslots[n] > nslots[best])) best = n;
    for (int e = g * gs; e < (g + 1) * gs; e++) home[e] = best;
  }
}

void eplb_budget_layer(const eplb_dims *d, const double *load, const int *prev,
                       int max_moves, const int *home, eplb_ws *ws, int *out) {
  const int R = d->R;
  budget b = {d, load, out, ws->b_cur, ws->b_start, ws->b_list, ws->b_load,
              ws->b_delta, ws->b_order, ws->b_stamp, ws->ia, 0, 0, 0,
              home, ws->slot_node};
  memset(b.stamp, 0, (size_t)d->G * sizeof *b.stamp);
  /* from prev, the changes that unload the heaviest GPU most per copy */
  memcpy(out, prev, (size_t)R * sizeof *out);
  polish(&b, prev, max_moves, ws);
}
