/* lp_eplb.h — expert-parallel load balancing (DeepSeek's EPLB): a load
 * matrix [layers][experts] becomes, per layer, physical_to_logical (the
 * expert in each slot; GPU g owns slots g*R/G .. (g+1)*R/G-1),
 * logical_to_physical (each expert's slots, -1 padded) and replica counts,
 * with balance metrics. Two modes: DeepSeek's algorithm exactly, and a
 * better packing; plus spill, incremental re-planning under a copy budget
 * and evaluation of an existing placement. Uses lp_base only; never Lua. */
#pragma once

#include "lp_base.h"

typedef enum lp_eplb_mode {
  LP_EPLB_REFERENCE = 0, /* DeepSeek's eplb.py, bit for bit (float32) */
  LP_EPLB_BALANCED = 1   /* same constraints, better packing, never worse */
} lp_eplb_mode;

typedef struct lp_eplb_options {
  lp_eplb_mode mode;   /* default LP_EPLB_BALANCED */
  int spill;           /* balanced + hierarchical: redundant replicas may use
                          free slots on another node when that lowers the
                          layer's max GPU load (no effect on the global
                          policy) */
  const int *previous; /* [layers * replicas] physical_to_logical of the plan
                          in force, or NULL. GPUs (and nodes) of the new plan
                          are relabelled to keep as many experts in place as
                          possible, and copies are reported. */
  int max_moves;       /* < 0: no budget. Otherwise (needs previous, which
                          must then hold every expert): each layer changes at
                          most max_moves slots of previous. The new plan is
                          taken when it is within the budget (after
                          relabelling); otherwise a local search from
                          previous spends the budget on the slot changes and
                          swaps that lower the max GPU load most per copy. */
  int fixed_x;         /* width X of logical_to_physical; 0 = the largest
                          replica count of the plan */
} lp_eplb_options;

/* Fills defaults: balanced, no spill, no previous, no budget, X automatic. */
void lp_eplb_options_init(lp_eplb_options *o);
/* "reference" / "balanced" <-> mode; parse returns -1 for other text. */
const char *lp_eplb_mode_name(lp_eplb_mode m);
int lp_eplb_mode_parse(const char *name);

/* Per-layer figures. Loads of a GPU are the sum over its slots of
 * load(expert) / replica count(expert). */
typedef struct lp_eplb_layer_stats {
  double max_load;           /* heaviest GPU */
  double mean_load;          /* total load / gpus */
  double gpu_max_over_mean;  /* 1 when the layer has no load */
  double node_max_over_mean; /* same over nodes (sum of their GPUs) */
  double balancedness;       /* mean / max, as vLLM logs it; 1 when no load */
  double off_node_load;      /* load served by replicas on a node other than
                                the expert's group's node (spill) */
  int copies;                /* expert copies GPUs must receive relative to
                                previous; -1 without previous */
  int duplicates;            /* slots holding an expert already on their GPU */
} lp_eplb_layer_stats;

/* Whole-plan figures: ratios are means over layers, counts are sums. */
typedef struct lp_eplb_stats {
  double balancedness;
  double gpu_max_over_mean;
  double node_max_over_mean;
  double off_node_load;
  long copies;     /* -1 without previous */
  int duplicates;
  double solve_ms; /* wall time of the call that made the plan */
  /* balanced mode's search, summed over layers: swaps applied, budget
   * units spent and passes the budget stopped (below); 0 in reference mode */
  long refine_steps;
  long refine_work;
  long refine_cut;
} lp_eplb_stats;

/* Balanced mode's search after the first packings (LPT's look for a pack
 * without the item's expert, pairwise swaps, duplicate removal) shares one
 * work budget per layer of R slots: max(min(LP_EPLB_REFINE_FLOOR,
 * LP_EPLB_REFINE_PER_SLOT * R), LP_EPLB_REFINE_WORK * R * ceil(log2(R + 1)))
 * units (a unit: one candidate pair or item looked at; a swap search costs
 * at least 2 units per GPU). A pass stops between steps when the budget
 * cannot pay for the next search, so the result stays deterministic and the
 * solve is O(R log R) per layer. Today's sizes (R up to ~800: at most
 * ~650k units, ~1200 per slot) stay far inside it, so their plans are those
 * of the unbounded search; at 16384 slots on 1024 GPUs that search took
 * ~200M units per layer. */
#define LP_EPLB_REFINE_WORK 16L
#define LP_EPLB_REFINE_PER_SLOT 8192L
#define LP_EPLB_REFINE_FLOOR (1L << 22)

typedef struct lp_eplb_plan lp_eplb_plan;

/* Size limits, checked before anything is allocated. Measured by
 * scripts/bench/eplb --scale (58 x 256 experts on 1024 GPUs, one core):
 * the whole `luapipe eplb` command peaks at ~115 bytes per slot (the maps,
 * and the Lua tables and JSON made from them) and takes ~0.3 us per slot
 * in reference mode, 1.3-4 us in balanced mode (16384 slots per layer: 1.7 s
 * for 58 layers). At 2^22 slots in all: ~0.7 GB, 1.9 s reference, 10 s
 * balanced (15 s as 4 layers of 2^20). Re-planning against a previous plan
 * relabels GPUs through G x G tables (~40 bytes per pair: 0.7 GB at 4096
 * GPUs), hence its GPU limit. */
#define LP_EPLB_MAX_REPLICAS (1 << 20) /* slots per layer */
#define LP_EPLB_MAX_SLOTS (1 << 22)    /* slots in all: layers x replicas */
#define LP_EPLB_MAX_RELABEL_GPUS 4096  /* gpus when a previous plan is given */

/* Checks a configuration (layers >= 1, positive counts, R % G == 0,
 * G % nodes == 0, R >= E, and E % groups == 0 when the hierarchical policy
 * applies, i.e. groups % nodes == 0) and the size limits above. LP_ERR_ARG
 * with the reason in err (LP_ERRLEN bytes, may be NULL), e.g. "58 layers x
 * 1048576 replicas = 60817408 slots: more than the limit of 4194304 slots
 * in all (layers x replicas)". */
lp_status lp_eplb_check_shape(int layers, int experts, int replicas,
                              int groups, int nodes, int gpus, char *err);

/* Plans the placement of `experts` logical experts into `replicas` slots
 * on `gpus` GPUs over `nodes` nodes, for each of `layers` rows of
 * load[layers * experts] (non-negative, finite). Hierarchical policy when
 * groups % nodes == 0, otherwise the global policy. opt may be NULL
 * (defaults). On success *out is a new plan the caller frees with
 * lp_eplb_plan_free; on failure *out is NULL and err names the reason
 * ("layer 3, expert 7: load is negative (-2)"). Deterministic. */
lp_status lp_eplb_rebalance(const double *load, int layers, int experts,
                            int replicas, int groups, int nodes, int gpus,
                            const lp_eplb_options *opt, lp_eplb_plan **out,
                            char *err);

/* Builds a plan from an existing placement phy2log[layers * replicas] (which
 * must hold every expert in every layer) to measure it under `load`; copies
 * are counted against previous when it is not NULL. Global policy (no home
 * nodes). Same ownership and errors as lp_eplb_rebalance. */
lp_status lp_eplb_evaluate(const double *load, int layers, int experts,
                           const int *phy2log, int replicas, int nodes,
                           int gpus, const int *previous, lp_eplb_plan **out,
                           char *err);

void lp_eplb_plan_free(lp_eplb_plan *p);

int lp_eplb_plan_layers(const lp_eplb_plan *p);
int lp_eplb_plan_experts(const lp_eplb_plan *p);
int lp_eplb_plan_replicas(const lp_eplb_plan *p);
int lp_eplb_plan_gpus(const lp_eplb_plan *p);
int lp_eplb_plan_nodes(const lp_eplb_plan *p);
int lp_eplb_plan_width(const lp_eplb_plan *p); /* X of logical_to_physical */
int lp_eplb_plan_hierarchical(const lp_eplb_plan *p);
lp_eplb_mode lp_eplb_plan_mode(const lp_eplb_plan *p);

/* Arrays owned by the plan, row-major, 0-based ids:
 * phy2log [layers][replicas], log2phy [layers][experts][width] (slots in
 * the order the expert's replicas were created, -1 padded), logcnt
 * [layers][experts], gpu_load [layers][gpus], layer stats [layers]. */
const int *lp_eplb_plan_phy2log(const lp_eplb_plan *p);
const int *lp_eplb_plan_log2phy(const lp_eplb_plan *p);
const int *lp_eplb_plan_logcnt(const lp_eplb_plan *p);
const double *lp_eplb_plan_gpu_load(const lp_eplb_plan *p);
/* [layers][gpus] expert copies each GPU must receive relative to previous
 * (the placement diff); NULL when the plan was made without previous. */
const int *lp_eplb_plan_gpu_copies(const lp_eplb_plan *p);
const lp_eplb_layer_stats *lp_eplb_plan_layer_stats(const lp_eplb_plan *p);
void lp_eplb_plan_stats(const lp_eplb_plan *p, lp_eplb_stats *out);
