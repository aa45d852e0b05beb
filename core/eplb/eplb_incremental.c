/* eplb_incremental.c — re-planning against the placement in force:
 * relabelling GPUs (and nodes) by maximum-overlap assignment (Hungarian
 * method), slot alignment inside GPUs, and the greedy copy budget. */
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

static int overlap(const int *x, const int *y, int k) {
  int i = 0, j = 0, same = 0;
  while (i < k && j < k) {
    if (x[i] == y[j]) {
      same++;
      i++;
      j++;
    } else if (x[i] < y[j]) {
      i++;
    } else {
      j++;
    }
  }
  return same;
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
  for (int i = 0; i < G; i++)
    for (int j = 0; j < G; j++)
      ws->h_score[(size_t)i * G + j] = overlap(ns + (size_t)i * k, os + (size_t)j * k, k);

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
    long long *c = ws->h_cost;
    for (size_t i = 0; i < (size_t)G * G; i++) c[i] = -(long long)ws->h_score[i];
    hungarian(G, c, ws, pos);
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
} budget;

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

/* Max GPU load and sum of squares after setting cur[s[i]] = to[i]. */
static void budget_eval(budget *b, const int *s, const int *to, int nch,
                        double *nmax, double *nsq) {
  const int k = b->d->k;
  int ex[8], dc[8], nx = 0, nt = 0;
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
  for (int i = 0; i < nch; i++) {
    int x = 0;
    while (ex[x] != to[i]) x++;
    touch(b, s[i] / k, &nt, b->w[to[i]] / (b->cnt[to[i]] + dc[x]));
  }
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

static int improves(double m, double q, double bm, double bq) {
  if (m < bm * (1 - 1e-12)) return 1;
  return m <= bm * (1 + 1e-12) && q < bq * (1 - 1e-12);
}

void eplb_budget_layer(const eplb_dims *d, const double *load,
                       const int *prev, const int *target, int max_moves,
                       eplb_ws *ws, int *out) {
  const int R = d->R, E = d->E;
  budget b = {d, load, out, ws->b_cur, ws->b_start, ws->b_list, ws->b_load,
              ws->b_delta, ws->b_order, ws->b_stamp, ws->ia, 0, 0, 0};
  memcpy(out, prev, (size_t)R * sizeof *out);
  memset(b.stamp, 0, (size_t)d->G * sizeof *b.stamp);
  int *diff = ws->b_diff, *done = ws->b_done, nd = 0;
  for (int s = 0; s < R; s++)
    if (target[s] != prev[s]) {
      done[nd] = 0;
      diff[nd++] = s;
    }
  /* the changes that bring each expert somewhere: expert -> diff indices */
  int *tstart = ws->b_tstart, *tlist = ws->b_tlist, *fill = ws->ic;
  memset(tstart, 0, (size_t)(E + 1) * sizeof *tstart);
  for (int x = 0; x < nd; x++) tstart[target[diff[x]] + 1]++;
  for (int e = 0; e < E; e++) tstart[e + 1] += tstart[e];
  memcpy(fill, tstart, (size_t)E * sizeof *fill);
  for (int x = 0; x < nd; x++) tlist[fill[target[diff[x]]]++] = x;

  int moves = 0;
  while (moves < max_moves) {
    budget_refresh(&b, ws);
    double bm = b.max, bq = b.sq;
    int bx = -1, by = -1;
    for (int x = 0; x < nd; x++) {
      if (done[x]) continue;
      int s = diff[x], a = out[s], to = target[s];
      double m, q;
      if (b.cnt[a] >= 2) {
        budget_eval(&b, &s, &to, 1, &m, &q);
        if (improves(m, q, bm, bq)) {
          bm = m;
          bq = q;
          bx = x;
          by = -1;
        }
      } else if (moves + 2 <= max_moves) {
        /* a's last replica leaves s: pair it with a change bringing a in */
        for (int t = tstart[a]; t < tstart[a + 1]; t++) {
          int y = tlist[t];
          if (done[y] || y == x) continue;
          int s2[2] = {s, diff[y]}, to2[2] = {to, a}, c = out[diff[y]];
          if (c != to && b.cnt[c] < 2) continue;
          budget_eval(&b, s2, to2, 2, &m, &q);
          if (improves(m, q, bm, bq)) {
            bm = m;
            bq = q;
            bx = x;
            by = y;
          }
        }
      }
    }
    if (bx < 0) break;
    out[diff[bx]] = target[diff[bx]];
    done[bx] = 1;
    moves++;
    if (by >= 0) {
      out[diff[by]] = target[diff[by]];
      done[by] = 1;
      moves++;
    }
  }
}
