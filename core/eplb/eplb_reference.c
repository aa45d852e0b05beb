/* eplb_reference.c — DeepSeek's EPLB (eplb.py) on one layer, with its
 * float32 arithmetic and tie rules: stable descending sorts, the lightest
 * non-full pack with the lowest index, the heaviest load/count with the
 * lowest expert index. */
#include "eplb_internal.h"

/* balanced_packing: n items of weight w into m packs of n/m items each.
 * Writes pack[i] and rank[i] (position inside the pack, in assignment
 * order). With one item per pack, item i goes to pack i. */
static void ref_pack(const float *w, int n, int m, int *pack, int *rank,
                     eplb_ws *ws) {
  int per = n / m;
  if (per == 1) {
    for (int i = 0; i < n; i++) {
      pack[i] = i;
      rank[i] = 0;
    }
    return;
  }
  double *key = ws->dkey;
  int *order = ws->idx;
  for (int i = 0; i < n; i++) {
    key[i] = (double)w[i]; /* exact: sorting on float values */
    order[i] = i;
  }
  eplb_sort_desc(key, order, n, ws->tmp);
  float *pw = ws->fb;
  int *cnt = ws->ic;
  eplb_heap h = {ws->hkey, ws->hid, 0};
  for (int p = 0; p < m; p++) {
    pw[p] = 0.0f;
    cnt[p] = 0;
    eplb_heap_push(&h, 0.0, p);
  }
  for (int t = 0; t < n; t++) {
    int i = order[t], p;
    double k;
    eplb_heap_pop(&h, &k, &p); /* lightest non-full pack, lowest index */
    pack[i] = p;
    rank[i] = cnt[p]++;
    pw[p] = pw[p] + w[i]; /* float32 accumulation, as the reference */
    if (cnt[p] < per) eplb_heap_push(&h, (double)pw[p], p);
  }
}

/* replicate_experts: n logical experts (weights w) into num_phy physical
 * slots. Slot i < n holds expert i; each further slot goes to the expert
 * with the largest w / count (lowest index on ties). */
static void ref_replicate(const float *w, int n, int num_phy, int *phy2log,
                          int *rank, int *cnt, eplb_ws *ws) {
  eplb_heap h = {ws->hkey, ws->hid, 0};
  for (int e = 0; e < n; e++) {
    phy2log[e] = e;
    rank[e] = 0;
    cnt[e] = 1;
    /* max-heap through negated keys; ties still go to the lower id */
    eplb_heap_push(&h, -(double)w[e], e);
  }
  for (int i = n; i < num_phy; i++) {
    double k;
    int e;
    eplb_heap_pop(&h, &k, &e);
    phy2log[i] = e;
    rank[i] = cnt[e]++;
    float v = w[e] / (float)cnt[e];
    eplb_heap_push(&h, -(double)v, e);
  }
}

void eplb_reference_layer(const eplb_dims *d, const double *load,
                          eplb_ws *ws, int *phy2log, int *phyrank,
                          int *home) {
  const int E = d->E, R = d->R, ng = d->ng, nn = d->nn;
  const int gs = E / ng, gpn = ng / nn, epn = E / nn, ppn = R / nn;
  const int packs = d->G / nn, per_gpu = d->k;
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
  ref_pack(gw, ng, nn, gpack, grank, ws);
  /* node n's block of "mlog" ids lists its groups in packing order */
  int *mlog2log = ws->r_mlog2log;
  for (int g = 0; g < ng; g++)
    for (int j = 0; j < gs; j++)
      mlog2log[(gpack[g] * gpn + grank[g]) * gs + j] = g * gs + j;
  for (int e = 0; e < E; e++) home[e] = d->hier ? gpack[e / gs] : -1;

  /* steps 2 and 3, node by node */
  float *wm = ws->fa; /* the group sums are no longer needed */
  float *tokens = (float *)ws->dkey2; /* ppn floats fit in n doubles */
  int *phy2mlog = ws->r_phy2mlog, *prank = ws->r_prank, *mcnt = ws->r_mcnt;
  int *pack = ws->id, *rank = ws->ie, *inv = ws->r_inv;
  for (int node = 0; node < nn; node++) {
    for (int m = 0; m < epn; m++) wm[m] = w[mlog2log[node * epn + m]];
    ref_replicate(wm, epn, ppn, phy2mlog, prank, mcnt, ws);
    for (int p = 0; p < ppn; p++) {
      int m = phy2mlog[p];
      tokens[p] = wm[m] / (float)mcnt[m];
    }
    ref_pack(tokens, ppn, packs, pack, rank, ws);
    for (int p = 0; p < ppn; p++) inv[pack[p] * per_gpu + rank[p]] = p;
    for (int q = 0; q < ppn; q++) {
      int p = inv[q];
      phy2log[node * ppn + q] = mlog2log[node * epn + phy2mlog[p]];
      phyrank[node * ppn + q] = prank[p];
    }
  }
}
