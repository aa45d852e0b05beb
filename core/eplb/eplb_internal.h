/* eplb_internal.h — private pieces of the EPLB module: the plan struct, the
 * per-call dimensions and scratch space, and the per-layer steps (reference
 * algorithm, packers, balanced mode, relabelling, copy budget, metrics). */
#pragma once

#include <stdint.h>

#include "lp_eplb.h"

struct lp_eplb_plan {
  int layers, experts, replicas, groups, nodes, gpus, width;
  int hierarchical;
  lp_eplb_mode mode;
  int has_previous;
  int *phy2log;    /* [L][R] */
  int *phyrank;    /* [L][R] replica rank of the slot (creation order) */
  int *log2phy;    /* [L][E][width] */
  int *logcnt;     /* [L][E] */
  int *home;       /* [L][E] node of the expert's group, -1 global policy */
  double *gpu_load; /* [L][G] */
  int *gpu_copies;  /* [L][G] copies each GPU receives; NULL without previous */
  lp_eplb_layer_stats *layer; /* [L] */
  lp_eplb_stats total;
};

typedef struct eplb_dims {
  int E, R, G, N; /* experts, replicas (slots), gpus, nodes as given */
  int groups;     /* as given */
  int hier;       /* hierarchical policy (groups % nodes == 0) */
  int ng, nn;     /* groups and nodes the policy uses (1, 1 for global) */
  int k;          /* slots per GPU, R / G */
} eplb_dims;

/* ---- scratch space ------------------------------------------------------
 * Every array a call needs, in one arena allocated once per call through
 * lp_malloc. */
typedef struct eplb_ws eplb_ws;
struct eplb_ws {
  int n;           /* max(E, R, G, groups) + 1: size of the "n" arrays */
  int *slot_gpu, *slot_node; /* [n]: GPU and node of each slot (no division
                                in the per-slot loops) */
  /* generic */
  double *dkey2;              /* [n] */
  uint64_t *s_k1, *s_k2; /* radix sort keys [n] */
  int *idx, *tmp, *ia, *ib, *ic, *id, *ie, *if_; /* [n] */
  double *hkey;               /* heap keys [n] */
  int *hid;                   /* heap ids [n] */
  float *fw, *fa, *fb;        /* [n] */
  double *da, *db, *dc;       /* [n] */
  /* reference mode */
  int *r_mlog2log, *r_phy2mlog, *r_prank, *r_mcnt, *r_pack,
      *r_rank, *r_inv;        /* [n] */
  uint64_t *r_tree;           /* [4n]: tournament trees, sort scratch */
  /* packers (items <= n, packs <= n) */
  int *p_items, *p_items2, *p_cnt, *p_next, *p_head, *p_tail, *p_part,
      *p_sort;                /* [n] */
  double *p_load, *p_load2, *p_sum; /* [n] */
  int *p_buf;                 /* [n] */
  /* balanced mode candidates */
  int *c_phy2log, *c_phyrank, *c_home, *c_gnode, *c_cnt; /* [n] */
  int *c_items;               /* [n] */
  /* metrics */
  int *m_cnt, *m_list, *m_list2; /* [n] */
  /* relabelling: G*G and small Hungarian arrays */
  int *h_score;               /* [G*G] */
  long long *h_cost;          /* [max(G,N)^2] */
  long long *h_u, *h_v, *h_minv; /* [max(G,N)+1] */
  int *h_p, *h_way, *h_used, *h_ans, *h_perm; /* [max(G,N)+1] */
  int *h_vnode;               /* [N*N] */
  /* sparse assignment (global relabelling): C = 2G columns with dummies */
  long long *s_v, *s_d, *s_pcost, *s_rcost; /* [2G+1] */
  int *s_pred, *s_done, *s_seen, *s_final, *s_cmatch, *s_rmatch, *s_start; /* [2G+1] */
  int *s_adj, *s_w;           /* [G*G] */
  double *s_hkey;             /* [G*G + 2G + 1] */
  int *s_hid;                 /* [G*G + 2G + 1] */
  /* copy budget */
  int *b_cur, *b_start, *b_list, *b_tstart, *b_tlist, *b_diff, *b_done,
      *b_stamp, *b_order;     /* [n] */
  double *b_load, *b_delta;   /* [n] */
  /* refinement accounting (eplb_pack.c), summed over the call */
  long refine_steps;          /* swaps applied by improve and dedup */
  long refine_work;           /* budget units spent */
  long refine_left;           /* budget units left in this layer */
  long refine_cut;            /* passes the work budget stopped */
  void *arena;                /* every array, one allocation */
  size_t used;                /* bytes of it laid out */
};

/* Allocates every array for dims d (the G x G relabelling arrays only
 * with `relabel`); LP_ERR_NOMEM (and nothing held) on failure.
 * eplb_ws_free releases them (idempotent). */
lp_status eplb_ws_alloc(eplb_ws *ws, const eplb_dims *d, int relabel);
void eplb_ws_free(eplb_ws *ws);

/* ---- small helpers (eplb_util.c) --------------------------------------- */
/* Stable sort of idx[0..n) by key[idx] descending (equal keys keep their
 * order); keys must be >= 0. Uses ws->tmp, ws->s_k1, ws->s_k2. */
void eplb_sort_desc(const double *key, int *idx, int n, eplb_ws *ws);
/* Sorts ints ascending in place. */
void eplb_sort_int(int *a, int n);
/* Binary min-heap of (key, id), ties broken by the lower id. */
typedef struct eplb_heap {
  double *key;
  int *id;
  int n;
} eplb_heap;
void eplb_heap_push(eplb_heap *h, double key, int id);
void eplb_heap_pop(eplb_heap *h, double *key, int *id);
/* Replaces the top (pop + push in one sift). */
void eplb_heap_replace_top(eplb_heap *h, double key, int id);
/* Orders key[0..n) / id[0..n) filled by the caller into a heap. */
void eplb_heap_build(eplb_heap *h, int n);

/* ---- reference (eplb_reference.c) --------------------------------------
 * DeepSeek's algorithm on one layer (float32). Writes phy2log[R],
 * phyrank[R] and home[E] (node of the expert's group, -1 global). */
void eplb_reference_layer(const eplb_dims *d, const double *load,
                          eplb_ws *ws, int *phy2log, int *phyrank,
                          int *home);

/* ---- packers (eplb_pack.c) ---------------------------------------------
 * n = m * k weighted items into m packs of exactly k. tag (may be NULL):
 * items with equal tags should not share a pack when that costs nothing.
 * items[p*k .. p*k+k-1] receive pack p's items; load[p] its sum. Best of
 * LPT and Karmarkar-Karp (balanced differencing), each followed by pairwise
 * swaps between packs and a duplicate-removing pass. */
void eplb_pack_best(int n, int m, int k, const double *w, const int *tag,
                    eplb_ws *ws, int *items, double *load);
/* Refinement work budget of one layer of `slots` slots (lp_eplb.h), shared
 * by its passes (improve and dedup of every packing): each takes it from
 * ws->refine_left. */
long eplb_refine_budget(long slots);

/* ---- balanced mode (eplb_balanced.c) -----------------------------------
 * Replaces the layer's placement (reference on entry) when a better one is
 * found: lower max GPU load, then fewer duplicates, then lower node max.
 * With spill, accepts cross-node replicas only when they lower the max. */
void eplb_balanced_layer(const eplb_dims *d, const double *load, int spill,
                         eplb_ws *ws, int *phy2log, int *phyrank, int *home);

/* Writes replica ranks: for each expert, its slots on its home node first,
 * then the others, each in ascending slot order. */
void eplb_rank_slots(const eplb_dims *d, const int *phy2log, const int *home,
                     int *cursor, int *phyrank);

/* ---- metrics (eplb_plan.c) ---------------------------------------------
 * Canonical per-GPU loads (summed in expert order, so slot order inside a
 * GPU does not change them), max GPU load, max node load and duplicates. */
typedef struct eplb_eval {
  double max, node_max, total;
  int dups;
} eplb_eval;
void eplb_layer_eval(const eplb_dims *d, const double *load,
                     const int *phy2log, eplb_ws *ws, double *gpu_load,
                     eplb_eval *out);
/* 1 when a is strictly better than b (max, then dups, then node max). */
int eplb_better(const eplb_eval *a, const eplb_eval *b);
/* Expert copies GPUs need to go from prev to cur (multiset difference);
 * per GPU into per_gpu[G] when not NULL. */
int eplb_copies(const eplb_dims *d, const int *prev, const int *cur,
                eplb_ws *ws, int *per_gpu);

/* ---- incremental (eplb_incremental.c) ----------------------------------
 * Relabels the GPUs (nodes and GPUs within nodes for the hierarchical
 * policy) of the layer plan (phy2log, phyrank, home) in place so that as
 * many experts as possible stay where prev has them; also aligns slots
 * inside each GPU. */
void eplb_relabel_layer(const eplb_dims *d, const int *prev, eplb_ws *ws,
                        int *phy2log, int *phyrank, int *home);
/* Budgeted plan: a local search from prev (which must hold every expert)
 * changing at most max_moves slots of it. Each step unloads the heaviest
 * GPU by the change that lowers the max GPU load most per slot of budget
 * it uses (then the sum of squared GPU loads): one of its slots given to
 * an expert that loads it less, one of its experts given a slot of an
 * expert with replicas to spare elsewhere, or one of its slots swapped with
 * a lighter one of another GPU. Every expert keeps a replica. With home (the
 * hierarchical policy without spill), a slot given to an expert lies on
 * its home node (groups stay whole on their node). Writes the result into
 * out[R]. */
void eplb_budget_layer(const eplb_dims *d, const double *load, const int *prev,
                       int max_moves, const int *home, eplb_ws *ws, int *out);
/* The hierarchical policy's node of each expert's group in prev: the node
 * holding the largest share of the group's load (its slot count on ties,
 * then the lower node). Writes home[E]; -1 everywhere for the global
 * policy. */
void eplb_prev_homes(const eplb_dims *d, const double *load, const int *prev,
                     eplb_ws *ws, int *home);
