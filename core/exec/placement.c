/* placement.c — applying a new expert placement (EPLB) at a step boundary:
 * expert weights and their optimizer state move between the ranks of the
 * EP group point to point, the MoE layer takes the new slots, the
 * optimizer of the stage is rebuilt over the new parameter list with the
 * moved state. Replicas of one expert start equal and, their gradients
 * being summed over the holders, stay equal: training goes on as before. */
#include "exec_internal.h"

#include <stdio.h>
#include <string.h>

/* One logical expert's numbers: values of w1, w3, w2 then, per optimizer
 * state part (k of them: SGD momentum; AdamW m, v), the same three, then
 * the steps that updated it (lp_nn_optim_param_steps; one float, exact up
 * to 2^24 steps: an expert no token reached in a step was not updated). */
typedef struct expert_pack {
  int expert;
  float *data;
} expert_pack;

/* Global MoE layer `layer` -> (model stage, index among the stage's MoE
 * layers); -1 when out of range. */
static int layer_stage(const lp_exec *e, int layer, int *idx) {
  for (int s = 0, l = 0; s < e->S; s++) {
    size_t n = e->moe.off[s + 1] - e->moe.off[s];
    if (!n) continue;
    int per = (int)(n / (size_t)e->moe.experts[l]);
    if (layer < l + per) {
      *idx = layer - l;
      return s;
    }
    l += per;
  }
  return -1;
}

/* Floats of one expert in a pack (values, k state parts, its steps). */
static size_t pack_numel(const lp_nn_param *sp, int k) {
  size_t q = 0;
  for (int j = 0; j < 3; j++) q += (size_t)lp_tensor_numel(sp[j].value);
  return q * (size_t)(1 + k) + 1;
}

/* Moves one MoE layer m of vstage vs to (spr, p2l). */
static lp_status move_layer(lp_exec *e, vst *vs, int mi, int spr, const int *p2l,
                            int64_t *bytes) {
  lp_nn_layer *m = lp_nn_moe_find(vs->chunk, mi);
  int E = lp_nn_moe_get_opts(m)->experts, G = e->ep, me = e->ep_rank;
  int ospr = lp_nn_moe_slots_per_rank(m);
  int *op2l = lp_malloc((size_t)(ospr * G) * sizeof *op2l);
  int *src = lp_malloc((size_t)E * sizeof *src);       /* lowest old holder */
  expert_pack *have = lp_calloc((size_t)E, sizeof *have); /* by expert */
  float *state = NULL, *nstate = NULL;
  int64_t *ots = NULL, *nts = NULL; /* per-parameter steps, old and new list */
  lp_nn_param_role *roles = NULL;
  lp_nn_optim *no = NULL;
  lp_status st = LP_OK;
  if (!op2l || !src || !have) { st = LP_ERR_NOMEM; goto done; }
  LP_CHECK_GOTO(lp_nn_moe_placement(m, op2l), st, done);
  for (int x = 0; x < E; x++) src[x] = -1;
  for (int s = ospr * G - 1; s >= 0; s--) src[op2l[s]] = s / ospr;
  for (int x = 0; x < E; x++)
    if (src[x] < 0) {
      lp_errf(e->err, "rank %d: expert %d has no slot in the old placement", e->rank, x);
      st = LP_ERR_INTERNAL;
      goto done;
    }
  /* the optimizer's state, per parameter: k parts of the whole list */
  size_t np, tot = 0;
  const lp_nn_param *p = lp_nn_params(vs->chunk, &np);
  for (size_t i = 0; i < np; i++) tot += (size_t)lp_tensor_numel(p[i].value);
  size_t sn = lp_nn_optim_state_numel(vs->optim);
  int k = tot ? (int)(sn / tot) : 0;
  int64_t steps = 0;
  state = lp_malloc((sn ? sn : 1) * sizeof *state);
  if (!state) { st = LP_ERR_NOMEM; goto done; }
  LP_CHECK_GOTO(lp_nn_optim_state_export(vs->optim, state, sn, &steps), st, done);
  ots = lp_malloc((np ? np : 1) * sizeof *ots);
  if (!ots) { st = LP_ERR_NOMEM; goto done; }
  LP_CHECK_GOTO(lp_nn_optim_param_steps(vs->optim, ots, np), st, done);
  /* this rank's experts (first slot of each), packed */
  const lp_nn_param *sp;
  int nsp;
  LP_CHECK_GOTO(lp_nn_moe_slot_params(m, me * ospr, &sp, &nsp), st, done);
  size_t q = pack_numel(sp, k);
  for (int s = me * ospr; s < (me + 1) * ospr; s++) {
    int x = op2l[s];
    if (have[x].data) continue;
    LP_CHECK_GOTO(lp_nn_moe_slot_params(m, s, &sp, &nsp), st, done);
    have[x].data = lp_malloc(q * sizeof(float));
    if (!have[x].data) { st = LP_ERR_NOMEM; goto done; }
    float *d = have[x].data;
    for (int j = 0; j < 3; j++) {
      /* the values may live on a device: through lp_tensor_read */
      LP_CHECK_GOTO(lp_tensor_read(sp[j].value, d), st, done);
      d += (size_t)lp_tensor_numel(sp[j].value);
    }
    for (int part = 0; part < k; part++)
      for (int j = 0; j < 3; j++) {
        size_t off = 0, c = (size_t)lp_tensor_numel(sp[j].value);
        for (size_t i = 0; i < np && p[i].value != sp[j].value; i++)
          off += (size_t)lp_tensor_numel(p[i].value);
        memcpy(d, state + (size_t)part * tot + off, c * sizeof(float));
        d += c;
      }
    size_t w1 = 0; /* its steps: w1's (w1, w3, w2 are skipped together) */
    while (w1 < np && p[w1].value != sp[0].value) w1++;
    *d = w1 < np ? (float)ots[w1] : (float)steps;
  }
  /* exchange: rank d needs expert x when a new slot of d holds x that d
   * did not hold; the lowest old holder sends it (tag = new slot). */
  int nreq = 0;
  lp_comm_req **reqs = lp_calloc((size_t)(2 * spr * G + 1), sizeof *reqs);
  float **rbuf = lp_calloc((size_t)(spr + 1), sizeof *rbuf);
  if (!reqs || !rbuf) {
    lp_free(reqs);
    lp_free(rbuf);
    st = LP_ERR_NOMEM;
    goto done;
  }
  for (int d = 0; d < G; d++) {
    for (int s = d * spr; s < (d + 1) * spr; s++) {
      int x = p2l[s], held = 0;
      for (int t = d * ospr; t < (d + 1) * ospr; t++) held |= op2l[t] == x;
      int first = 1; /* one copy per (d, x) */
      for (int t = d * spr; t < s; t++) first &= p2l[t] != x;
      if (held || !first) continue;
      if (d == me) {
        rbuf[s - d * spr] = lp_malloc(q * sizeof(float));
        if (!rbuf[s - d * spr]) { st = LP_ERR_NOMEM; break; }
        st = lp_comm_irecv(e->ep_comm, rbuf[s - d * spr], q, src[x], s, &reqs[nreq++]);
      } else if (src[x] == me) {
        st = lp_comm_isend(e->ep_comm, have[x].data, q, d, s, &reqs[nreq++]);
        *bytes += (int64_t)(q * sizeof(float));
      }
      if (st != LP_OK) break;
    }
    if (st != LP_OK) break;
  }
  if (st == LP_OK && nreq > 0) {
    char what[128];
    snprintf(what, sizeof what, "rank %d moves expert weights for a new placement", e->rank);
    st = lp_comm_waitall(e->ep_comm, reqs, nreq, what);
    if (st != LP_OK) {
      ex_comm_fail(e, e->ep_comm, st, what);
      /* before the buffers go */
      for (int i = 0; i < nreq; i++) lp_comm_cancel(e->ep_comm, &reqs[i]);
      lp_free(reqs);
      for (int i = 0; i < spr; i++) lp_free(rbuf[i]);
      lp_free(rbuf);
      goto done;
    }
  }
  for (int i = 0; i < nreq; i++) lp_comm_cancel(e->ep_comm, &reqs[i]);
  lp_free(reqs);
  for (int s = me * spr; s < (me + 1) * spr && st == LP_OK; s++) {
    float *b = rbuf[s - me * spr];
    if (b && !have[p2l[s]].data) {
      have[p2l[s]].data = b;
      rbuf[s - me * spr] = NULL;
    }
  }
  for (int i = 0; i < spr; i++) lp_free(rbuf[i]);
  lp_free(rbuf);
  if (st != LP_OK) {
    lp_errf(e->err, "rank %d: moving expert weights: %s", e->rank, lp_comm_last_error(e->ep_comm));
    goto done;
  }
  /* the other parameters' state goes with their tensors (the same
   * objects in the new list), then the new slots */
  const lp_nn_param *op = p;
  size_t onp = np;
  float *dense = state; /* old list's state, still valid: read below */
  lp_nn_optim *old = vs->optim;
  /* oval[i]: the old param's value tensor, NULL for this layer's routed
   * experts (theirs travel in the packs; their tensors may be freed) */
  const lp_tensor **oval = lp_malloc((onp ? onp : 1) * sizeof *oval);
  size_t *ooff = lp_malloc((onp ? onp : 1) * sizeof *ooff);
  roles = lp_malloc((onp ? onp : 1) * sizeof *roles);
  if (!oval || !ooff || !roles) {
    st = LP_ERR_NOMEM;
    goto cleanup;
  }
  size_t otot = tot;
  st = lp_nn_param_roles(vs->chunk, roles, onp);
  for (size_t i = 0, off = 0; i < onp && st == LP_OK; i++) {
    oval[i] = roles[i].moe == mi && roles[i].slot >= 0 ? NULL : op[i].value;
    ooff[i] = off;
    off += (size_t)lp_tensor_numel(op[i].value);
  }
  if (st == LP_OK) st = lp_nn_moe_set_placement(m, spr, p2l);
  if (st != LP_OK) {
    lp_errf(e->err, "rank %d: the new expert placement of model stage %d was refused (%s)",
            e->rank, vs->stage, lp_strerror(st));
    goto cleanup;
  }
  /* new list: values of new slots, the optimizer rebuilt with the state */
  p = lp_nn_params(vs->chunk, &np);
  tot = 0;
  for (size_t i = 0; i < np; i++) tot += (size_t)lp_tensor_numel(p[i].value);
  nstate = lp_calloc((size_t)k * tot + 1, sizeof *nstate);
  nts = lp_malloc((np ? np : 1) * sizeof *nts);
  lp_free(roles);
  roles = lp_malloc((np ? np : 1) * sizeof *roles);
  if (!nstate || !nts || !roles) { st = LP_ERR_NOMEM; goto cleanup; }
  LP_CHECK_GOTO(lp_nn_param_roles(vs->chunk, roles, np), st, cleanup);
  for (size_t i = 0, off = 0; i < np; i++) {
    size_t c = (size_t)lp_tensor_numel(p[i].value);
    if (roles[i].moe == mi && roles[i].slot >= 0) {
      /* w1, w3, w2 of its expert's pack: which of the three is this? */
      const lp_nn_param *ssp;
      int n3;
      LP_CHECK_GOTO(lp_nn_moe_slot_params(lp_nn_moe_find(vs->chunk, roles[i].moe), roles[i].slot,
                                          &ssp, &n3), st, cleanup);
      int j = 0;
      while (j < 3 && ssp[j].value != p[i].value) j++;
      const float *d = have[roles[i].expert].data;
      if (j == 3 || !d) {
        lp_errf(e->err, "rank %d: expert %d of slot %d arrived nowhere in a new placement",
                e->rank, roles[i].expert, roles[i].slot);
        st = LP_ERR_INTERNAL;
        goto cleanup;
      }
      size_t vq = 0, before = 0;
      for (int t = 0; t < 3; t++) {
        if (t < j) before += (size_t)lp_tensor_numel(ssp[t].value);
        vq += (size_t)lp_tensor_numel(ssp[t].value);
      }
      LP_CHECK_GOTO(lp_tensor_write(p[i].value, d + before), st, cleanup);
      for (int part = 0; part < k; part++)
        memcpy(nstate + (size_t)part * tot + off, d + vq * (size_t)(1 + part) + before,
               c * sizeof(float));
      nts[i] = (int64_t)d[vq * (size_t)(1 + k)];
    } else {
      size_t oi = 0;
      while (oi < onp && oval[oi] != p[i].value) oi++;
      if (oi == onp) {
        lp_errf(e->err, "rank %d: parameter %s lost its optimizer state in a new placement",
                e->rank, p[i].name);
        st = LP_ERR_INTERNAL;
        goto cleanup;
      }
      for (int part = 0; part < k; part++)
        memcpy(nstate + (size_t)part * tot + off, dense + (size_t)part * otot + ooff[oi],
               c * sizeof(float));
      nts[i] = ots[oi];
    }
    off += c;
  }
  vs->optim = NULL;
  st = e->o.optim == LP_NN_OPTIM_ADAMW ? lp_nn_optim_adamw_new(p, np, &e->o.adamw, &no)
                                        : lp_nn_optim_sgd_new(p, np, &e->o.sgd, &no);
  if (st == LP_OK) st = lp_nn_optim_state_import(no, nstate, (size_t)k * tot, steps);
  if (st == LP_OK) st = lp_nn_optim_set_param_steps(no, nts, np);
  if (st != LP_OK) {
    vs->optim = old; /* over the old list: the executor is unusable now (documented) */
    lp_nn_optim_free(no);
    no = NULL;
    goto cleanup;
  }
  lp_nn_optim_free(old);
  vs->optim = no;
  st = ex_reduce_resize(e, vs);
  if (st == LP_OK) st = ex_dp_new(e, vs); /* the experts' bucket over the new list */
cleanup:
  lp_free(oval);
  lp_free(ooff);
done:
  if (have)
    for (int x = 0; x < E; x++) lp_free(have[x].data);
  lp_free(have);
  lp_free(op2l);
  lp_free(src);
  lp_free(state);
  lp_free(nstate);
  lp_free(ots);
  lp_free(nts);
  lp_free(roles);
  if (st != LP_OK && !*e->err)
    lp_errf(e->err, "rank %d: applying a new expert placement failed (%s)", e->rank,
            lp_strerror(st));
  return st;
}

lp_status lp_exec_set_placement(lp_exec *e, int layer, int slots_per_rank,
                                const int *phys_to_log, int64_t *bytes_moved) {
  e->err[0] = '\0';
  int idx = 0, s = layer >= 0 && layer < e->moe.layers ? layer_stage(e, layer, &idx) : -1;
  if (s < 0 || slots_per_rank < 1) {
    lp_errf(e->err, "set_placement: no MoE layer %d (the model has %d) or bad slots per rank %d",
            layer, e->moe.layers, slots_per_rank);
    return LP_ERR_ARG;
  }
  if (e->o.zero) {
    lp_errf(e->err, "set_placement: expert placements cannot change under ZeRO-1 (zero = 1): "
            "the experts' optimizer state is sharded over the expert-DP group");
    return LP_ERR_ARG;
  }
  int E = e->moe.experts[layer];
  for (int i = 0; i < slots_per_rank * e->ep; i++)
    if (phys_to_log[i] < 0 || phys_to_log[i] >= E) {
      lp_errf(e->err, "set_placement: slot %d of MoE layer %d names expert %d (the layer has %d)",
              i, layer, phys_to_log[i], E);
      return LP_ERR_ARG;
    }
  int64_t moved = 0;
  for (int li = 0; li < e->nloc; li++) {
    if (e->vs[li].stage != s) continue;
    LP_CHECK(move_layer(e, &e->vs[li], idx, slots_per_rank, phys_to_log, &moved));
  }
  if (bytes_moved) *bytes_moved = moved;
  return LP_OK;
}

lp_status lp_exec_restore_placement(lp_exec *e, int i, int moe, int slots_per_rank,
                                    const int *phys_to_log) {
  e->err[0] = '\0';
  lp_nn_layer *m = i >= 0 && i < e->nloc ? lp_nn_moe_find(e->vs[i].chunk, moe) : NULL;
  if (!m || slots_per_rank < 1) {
    lp_errf(e->err, "restore_placement: no MoE layer %d in local virtual stage %d, or bad slots "
            "per rank %d", moe, i, slots_per_rank);
    return LP_ERR_ARG;
  }
  vst *vs = &e->vs[i];
  int E = lp_nn_moe_get_opts(m)->experts;
  for (int s = 0; s < slots_per_rank * e->ep; s++)
    if (phys_to_log[s] < 0 || phys_to_log[s] >= E) {
      lp_errf(e->err, "restore_placement: slot %d names expert %d (the layer has %d)", s,
              phys_to_log[s], E);
      return LP_ERR_ARG;
    }
  lp_status st = lp_nn_moe_set_placement(m, slots_per_rank, phys_to_log);
  if (st != LP_OK) {
    lp_errf(e->err, "rank %d: the expert placement of model stage %d was refused (%s)", e->rank,
            vs->stage, lp_strerror(st));
    return st;
  }
  /* a fresh optimizer over the new list (its state is the caller's to
   * import): the buckets follow the list first (ZeRO-1's shards are
   * parameters of the optimizer) */
  st = ex_dp_new(e, vs);
  size_t np = 0;
  lp_nn_param *p = NULL;
  int own = 0;
  if (st == LP_OK) st = ex_dp_optim_params(e, vs, &p, &np, &own);
  lp_nn_optim *no = NULL;
  if (st == LP_OK)
    st = e->o.optim == LP_NN_OPTIM_ADAMW ? lp_nn_optim_adamw_new(p, np, &e->o.adamw, &no)
                                          : lp_nn_optim_sgd_new(p, np, &e->o.sgd, &no);
  if (own) lp_free(p);
  if (st == LP_OK) {
    lp_nn_optim_free(vs->optim);
    vs->optim = no;
    st = ex_reduce_resize(e, vs);
  }
  if (st != LP_OK)
    lp_errf(e->err, "rank %d: rebuilding the optimizer of model stage %d for a restored expert "
            "placement failed (%s)", e->rank, vs->stage, lp_strerror(st));
  return st;
}
