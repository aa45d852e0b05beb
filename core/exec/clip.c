/* clip.c — global gradient-norm clipping at the end of a step (as
 * torch.nn.utils.clip_grad_norm_ over the whole model): the norm over every
 * parameter of the model, each counted once however many ranks hold it,
 * then every gradient scaled by min(1, clip / (norm + 1e-6)) (ZeRO-1's
 * gradient shards too). It owns
 * e->cl. Runs after every gradient sum of the step (replicated stages,
 * the EP group, expert replicas), so copies hold equal gradients. */
#include "exec_internal.h"

#include <math.h>
#include <stdio.h>

/* 1 when vstage li's model stage has no copy with a smaller vstage id:
 * that copy counts the stage's parameters. */
static int first_copy(const lp_exec *e, int li) {
  const vst *vs = &e->vs[li];
  for (int u = 0; u < vs->id; u++)
    if (e->vstage[u] == vs->stage) return 0;
  return 1;
}

/* Sum of squares of the gradients this rank counts. Dense parameters
 * (routers and shared experts included) count on DP index 0 (the DP
 * group holds them summed, equal); a routed expert's on the first global
 * slot that holds that expert, in the first EP group of the DP group.
 * With ZeRO-1 the summed gradients of sharded parameters are this rank's
 * shards: each rank counts its own part (ex_dp_shard_sumsq), the same
 * parameters counted once. */
static lp_status local_sumsq(lp_exec *e, double *out) {
  lp_nn_param_role *roles = NULL;
  int *p2l = NULL;
  char *counts = NULL;
  size_t rcap = 0, pcap = 0;
  lp_status st = LP_OK;
  double sum = 0;
  for (int li = 0; li < e->nloc && st == LP_OK; li++) {
    if (!first_copy(e, li)) continue;
    lp_nn_layer *chunk = e->vs[li].chunk;
    size_t np;
    const lp_nn_param *p = lp_nn_params(chunk, &np);
    if (np > rcap) {
      lp_nn_param_role *nr = lp_realloc(roles, np * sizeof *nr);
      char *nc = lp_realloc(counts, np);
      if (nr) roles = nr;
      if (nc) counts = nc;
      if (!nr || !nc) { st = LP_ERR_NOMEM; break; }
      rcap = np;
    }
    if (np && (st = lp_nn_param_roles(chunk, roles, np)) != LP_OK) break;
    int cur_moe = -1;
    for (size_t i = 0; i < np && st == LP_OK; i++) {
      const lp_nn_param_role *r = &roles[i];
      counts[i] = 0;
      if (r->slot < 0) {
        if (e->dp_rank != 0 && !e->o.zero) continue;
      } else {
        if (r->moe != cur_moe) {
          lp_nn_layer *moe = lp_nn_moe_find(chunk, r->moe);
          size_t ns = (size_t)lp_nn_moe_slots_per_rank(moe) * (size_t)e->ep;
          if (ns > pcap) {
            int *np_ = lp_realloc(p2l, ns * sizeof *np_);
            if (!np_) { st = LP_ERR_NOMEM; break; }
            p2l = np_;
            pcap = ns;
          }
          if ((st = lp_nn_moe_placement(moe, p2l)) != LP_OK) break;
          cur_moe = r->moe;
        }
        int first = r->slot;
        for (int s = 0; s < r->slot; s++)
          if (p2l[s] == r->expert) { first = s; break; }
        if (first != r->slot) continue;
      }
      counts[i] = 1;
    }
    if (st != LP_OK) break;
    double shard = 0;
    if ((st = ex_dp_shard_sumsq(e, &e->vs[li], counts, &shard)) != LP_OK) break;
    sum += shard;
    for (size_t i = 0; i < np && st == LP_OK; i++) {
      /* a sharded parameter counted above; an expert's only in EP group 0
       * when not sharded (the other groups hold the same sums) */
      if (!counts[i] || counts[i] == 2) continue;
      if (roles[i].slot < 0 ? e->dp_rank != 0 : e->dp_rank >= e->ep) continue;
      double d = 0;
      if ((st = lp_tensor_dot(p[i].grad, p[i].grad, &d)) != LP_OK) break;
      sum += d;
    }
  }
  lp_free(roles);
  lp_free(counts);
  lp_free(p2l);
  *out = sum;
  return st;
}

lp_status ex_clip(lp_exec *e) {
  e->cl.norm = -1;
  if (!(e->o.clip > 0)) return LP_OK;
  double s = 0;
  lp_status st = local_sumsq(e, &s);
  if (st != LP_OK) {
    lp_errf(e->err, "rank %d: step %lld: the gradient norm: %s", e->rank, (long long)e->step,
            lp_strerror(st));
    return st;
  }
  char what[96];
  snprintf(what, sizeof what, "rank %d: the gradient-norm all-reduce of step %lld", e->rank,
           (long long)e->step);
  double tw = lp_now();
  st = lp_comm_allreduce_sum_double(e->world, &s, 1, what);
  ex_time_wait(e, lp_now() - tw);
  if (st != LP_OK) return ex_comm_fail(e, e->world, st, what);
  e->cl.norm = sqrt(s);
  double coef = (double)e->o.clip / (e->cl.norm + 1e-6);
  if (coef >= 1.0) return LP_OK;
  for (int li = 0; li < e->nloc; li++) {
    size_t np;
    const lp_nn_param *p = lp_nn_params(e->vs[li].chunk, &np);
    for (size_t i = 0; i < np; i++) LP_CHECK(lp_tensor_scale(p[i].grad, (float)coef));
    LP_CHECK(ex_dp_shard_scale(e, &e->vs[li], (float)coef));
  }
  return LP_OK;
}

double lp_exec_grad_norm(const lp_exec *e) { return e->o.clip > 0 ? e->cl.norm : -1; }

void lp_exec_set_lr(lp_exec *e, float lr) {
  e->o.sgd.lr = lr; /* an optimizer rebuilt later (a new expert placement) takes it too */
  e->o.adamw.lr = lr;
  for (int li = 0; li < e->nloc; li++) lp_nn_optim_set_lr(e->vs[li].optim, lr);
}
