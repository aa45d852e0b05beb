/* eplb_balanced.c — balanced mode for one layer: the reference placement
 * competes with candidates built under the same constraints (groups packed
 * onto nodes, experts replicated inside their node, R/G slots per GPU) but
 * with a better packer, and, with spill, candidates whose redundant
 * replicas may sit on another node. The best by (max GPU load,
 * duplicates, max node load) wins, so a layer is never worse than the reference. */
#include <string.h>

#include "eplb_internal.h"

/* Greedy replication in double: n experts (weights w) get cnt[j] replicas
 * summing to slots; each extra replica goes to the largest w / cnt (lowest
 * index on ties). Minimises the largest replica load. */
static void replicate(const double *w, int n, int slots, int *cnt, eplb_ws *ws) {
  eplb_heap h = {ws->hkey, ws->hid, 0};
  for (int j = 0; j < n; j++) {
    cnt[j] = 1;
    h.key[j] = -w[j];
    h.id[j] = j;
  }
  eplb_heap_build(&h, n);
  for (int i = n; i < slots; i++) {
    int j = h.id[0];
    cnt[j]++;
    eplb_heap_replace_top(&h, -(w[j] / cnt[j]), j);
  }
}

/* Packs one node's items (tags = expert ids, weights) onto its GPUs and
 * writes the slots, each GPU's experts in ascending id order. */
static void pack_node(const eplb_dims *d, int node, int nitems, const double *iw,
                      const int *itag, eplb_ws *ws, int *map) {
  const int packs = d->G / d->nn, k = d->k;
  int *items = ws->c_items;
  eplb_pack_best(nitems, packs, k, iw, itag, ws, items, ws->db);
  for (int p = 0; p < packs; p++) {
    int *slot = map + (size_t)(node * packs + p) * k;
    for (int j = 0; j < k; j++) slot[j] = itag[items[(size_t)p * k + j]];
    eplb_sort_int(slot, k);
  }
}

/* Candidate without spill for the group -> node assignment gnode. */
static void build_local(const eplb_dims *d, const double *load, const int *gnode,
                        eplb_ws *ws, int *map, int *home) {
  const int E = d->E, gs = E / d->ng, ppn = d->R / d->nn;
  int *list = ws->ia, *cnt = ws->c_cnt, *itag = ws->ib;
  double *lw = ws->dkey2, *iw = ws->da;
  for (int node = 0; node < d->nn; node++) {
    int n = 0;
    for (int e = 0; e < E; e++)
      if (gnode[e / gs] == node) {
        list[n] = e;
        lw[n++] = load[e];
        home[e] = d->hier ? node : -1;
      }
    replicate(lw, n, ppn, cnt, ws);
    int ni = 0;
    for (int j = 0; j < n; j++)
      for (int c = 0; c < cnt[j]; c++) {
        iw[ni] = lw[j] / cnt[j];
        itag[ni++] = list[j];
      }
    pack_node(d, node, ni, iw, itag, ws, map);
  }
}

/* Candidate with spill: replicas are counted over the whole layer; each
 * expert keeps one replica on its group's node and the redundant replicas
 * go (heaviest first) to the lightest node with a free slot, its own node
 * first among equals. */
static void build_spill(const eplb_dims *d, const double *load, const int *gnode,
                        eplb_ws *ws, int *map, int *home) {
  const int E = d->E, R = d->R, nn = d->nn, gs = E / d->ng;
  const int ppn = R / nn, epn = E / nn;
  int *cnt = ws->c_cnt, *extra = ws->ic, *enode = ws->id, *order = ws->ie;
  int *free_ = ws->if_, *itag = ws->ib;
  double *ew = ws->dkey2, *nl = ws->db, *iw = ws->da;
  replicate(load, E, R, cnt, ws);
  for (int n = 0; n < nn; n++) {
    free_[n] = ppn - epn;
    nl[n] = 0;
  }
  int nx = 0;
  for (int e = 0; e < E; e++) {
    home[e] = gnode[e / gs];
    nl[home[e]] += load[e] / cnt[e];
    for (int c = 1; c < cnt[e]; c++) {
      extra[nx] = e;
      ew[nx] = load[e] / cnt[e];
      order[nx] = nx;
      nx++;
    }
  }
  eplb_sort_desc(ew, order, nx, ws);
  for (int t = 0; t < nx; t++) {
    int x = order[t], e = extra[x], best = -1;
    for (int n = 0; n < nn; n++) {
      if (free_[n] == 0) continue;
      if (best < 0 || nl[n] < nl[best] ||
          (nl[n] == nl[best] && n == home[e] && best != home[e]))
        best = n;
    }
    enode[x] = best;
    free_[best]--;
    nl[best] += ew[x];
  }
  for (int node = 0; node < nn; node++) {
    int ni = 0;
    for (int e = 0; e < E; e++)
      if (home[e] == node) {
        iw[ni] = load[e] / cnt[e];
        itag[ni++] = e;
      }
    for (int x = 0; x < nx; x++)
      if (enode[x] == node) {
        iw[ni] = load[extra[x]] / cnt[extra[x]];
        itag[ni++] = extra[x];
      }
    pack_node(d, node, ni, iw, itag, ws, map);
  }
}

static void take(const eplb_dims *d, eplb_ws *ws, int *phy2log, int *phyrank,
                 int *home) {
  memcpy(phy2log, ws->c_phy2log, (size_t)d->R * sizeof *phy2log);
  memcpy(home, ws->c_home, (size_t)d->E * sizeof *home);
  eplb_rank_slots(d, phy2log, home, ws->ia, phyrank);
}

void eplb_balanced_layer(const eplb_dims *d, const double *load, int spill,
                         eplb_ws *ws, int *phy2log, int *phyrank, int *home) {
  const int ng = d->ng, nn = d->nn, gs = d->E / ng;
  eplb_eval best, cand;
  eplb_layer_eval(d, load, phy2log, ws, NULL, &best);

  /* group -> node assignments: the reference's, and a better packing */
  int *g0 = ws->c_gnode, *g1 = ws->r_inv;
  int ncand = 1;
  for (int g = 0; g < ng; g++) g0[g] = d->hier ? home[g * gs] : 0;
  if (d->hier && ng / nn > 1) {
    double *gw = ws->dc;
    int *itag = NULL;
    for (int g = 0; g < ng; g++) {
      double s = 0;
      for (int j = 0; j < gs; j++) s += load[g * gs + j];
      gw[g] = s;
    }
    int *items = ws->r_pack;
    eplb_pack_best(ng, nn, ng / nn, gw, itag, ws, items, ws->db);
    for (int n = 0; n < nn; n++)
      for (int j = 0; j < ng / nn; j++) g1[items[n * (ng / nn) + j]] = n;
    ncand = 2;
  }
  for (int c = 0; c < ncand; c++) {
    build_local(d, load, c ? g1 : g0, ws, ws->c_phy2log, ws->c_home);
    eplb_layer_eval(d, load, ws->c_phy2log, ws, NULL, &cand);
    if (eplb_better(&cand, &best)) {
      best = cand;
      take(d, ws, phy2log, phyrank, home);
    }
  }
  if (spill && d->hier && nn > 1 && d->R / nn > d->E / nn) {
    for (int c = 0; c < ncand; c++) {
      build_spill(d, load, c ? g1 : g0, ws, ws->c_phy2log, ws->c_home);
      eplb_layer_eval(d, load, ws->c_phy2log, ws, NULL, &cand);
      if (cand.max < best.max) {
        best = cand;
        take(d, ws, phy2log, phyrank, home);
      }
    }
  }
}
