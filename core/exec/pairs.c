/* pairs.c — the overlapped F&B pair (DualPipe's point): the two halves'
 * phases interleaved so one micro-batch's expert-parallel exchange flies
 * while the other computes (run_fb_phases: chunks of DeepSeek-V3's blocks,
 * whose attention is a phase of its own, in the 10-phase order of
 * DeepSeek's training profile on every backend; run_fb_any: whichever
 * half can go on, on backends that let two contexts finish in any order;
 * run_fb_fixed: DeepSeek-V3's fixed alternation, one order on every rank;
 * each advance a "phase" slice of the trace), the pair's
 * waits (pair_wait), and the weight-grad work that fills them: pieces of
 * the running backward (ex_bw_parts) and the weight-grad a pair's full
 * backward leaves to the next pair (the carry, ex_carry_w), which lone
 * forwards and other stages' lone backwards also use to fill their
 * exchanges' waits (ex_fill_with_carry). The halves themselves (begin,
 * advance, finish) are exec.c's. */
#include "exec_internal.h"

/* While half `which`'s exchange flies, pieces of a weight-grad carried
 * from an overlapped pair run (another stage's: see run_action). */
lp_status ex_fill_with_carry(lp_exec *e, int which) {
  for (int ready = 0, did = 1; e->pr.carry_v >= 0 && did;) {
    LP_CHECK(ex_half_ready(e, which, 0, &ready));
    if (ready) break;
    LP_CHECK(ex_carry_w(e, &did));
  }
  return LP_OK;
}

/* Weight-grad pieces the running full-backward half's input-grad has made
 * ready (lp_nn_weight_grad_part): all of them, or just one when ran !=
 * NULL (*ran = 1 when it ran one). Nothing for an I half or none. */
lp_status ex_bw_parts(lp_exec *e, int *ran) {
  half *b = &e->pr.hf[1];
  if (ran) *ran = 0;
  if (!b->active || b->type != LP_ACT_B) return LP_OK;
  vst *vs = &e->vs[e->loc[b->v]];
  slot *sl = &vs->slots[b->mb];
  for (int did = 1; did;) {
    lp_status st = lp_nn_weight_grad_part(vs->chunk, sl->ctx, &did);
    if (st != LP_OK) return ex_nnfail(e, sl, "weight-grad", st);
    if (ran) {
      *ran = did;
      break;
    }
  }
  return LP_OK;
}

/* The weight-grad an overlapped pair's full backward leaves to the next
 * pair (run_fb): its pieces fill that pair's waits (often the first ones,
 * for an EP partner that starts the pair late) before the pair's own.
 * Per parameter the order of accumulation stays that of finishing each
 * weight-grad at once: the carry ends before any action but messages and
 * the executor's own pairs (a REDUCE_GRAD finds complete gradients),
 * before the next backward of its stage, when the next pair leaves its own
 * and at step end. One piece (*ran = 1) or, with ran NULL, all that is
 * left (the carry ends). */
lp_status ex_carry_w(lp_exec *e, int *ran) {
  if (ran) *ran = 0;
  if (e->pr.carry_v < 0) return LP_OK;
  vst *vs = &e->vs[e->loc[e->pr.carry_v]];
  slot *sl = &vs->slots[e->pr.carry_mb];
  lp_status st;
  if (ran) {
    st = lp_nn_weight_grad_part(vs->chunk, sl->ctx, ran);
    if (st == LP_OK && *ran) return LP_OK;
  }
  st = lp_nn_weight_grad(vs->chunk, sl->ctx, NULL);
  e->pr.carry_v = -1;
  if (ran) *ran = st == LP_OK;
  return st == LP_OK ? LP_OK : ex_nnfail(e, sl, "weight-grad", st);
}

/* ---- phase slices: each advance of a pair's halves (and the weight-grad
 * pieces run between them) as a slice of category "phase" in the trace,
 * named as DeepSeek's profile names its pair's phases (attn(F),
 * dispatch(F), mlp(F), combine(F); combine(B), mlp(B), dispatch(B),
 * attn(B); mlp(W), attn(W)); "dense(F)" / "dense(B)" for an advance that
 * reaches no exchange and no attention first (a stage's embedding, its
 * head and loss) ---- */

static const char *phase_slice_name(int which, lp_nn_phase p) {
  static const char *const f[] = {"dense(F)", "dense(F)", "dispatch(F)", "mlp(F)", "combine(F)",
                                  "attn(F)"};
  static const char *const b[] = {"dense(B)", "dense(B)", "dispatch(B)", "mlp(B)", "combine(B)",
                                  "attn(B)"};
  if (p < LP_NN_PHASE_DONE || p > LP_NN_PHASE_ATTN) p = LP_NN_PHASE_DENSE;
  return which ? b[p] : f[p];
}

/* ex_half_advance, traced as one phase slice. */
static lp_status pair_advance(lp_exec *e, int which, int *done) {
  half *h = &e->pr.hf[which];
  int v = h->v, mb = h->mb;
  const char *name = phase_slice_name(which, ex_half_phase(e, which));
  double t0 = lp_now();
  lp_status st = ex_half_advance(e, which, done);
  if (st == LP_OK)
    ex_trace_add(e, LP_TRACE_COMPUTE, name, "phase", t0, lp_now(), v, mb, e->cur, -1, -1);
  return st;
}

/* The weight-grad pieces the backward half's last advance (of phase p)
 * made ready, traced as one slice: mlp(W) after dispatch(B) (the experts',
 * then the rest of the feed-forward's), attn(W) after attn(B). */
static lp_status pair_parts(lp_exec *e, lp_nn_phase p) {
  half *b = &e->pr.hf[1];
  int v = b->v, mb = b->mb;
  double t0 = lp_now();
  int did = 0;
  for (int one = 1; one;) {
    LP_CHECK(ex_bw_parts(e, &one));
    did |= one;
  }
  if (did)
    ex_trace_add(e, LP_TRACE_COMPUTE, p == LP_NN_PHASE_ATTN ? "attn(W)" : "mlp(W)", "phase", t0,
                 lp_now(), v, mb, e->cur, -1, -1);
  return LP_OK;
}

/* The pair of a chunk with phase stops (DeepSeek-V3's blocks,
 * lp_nn_mla_block_new) in DeepSeek's order, on every backend: the
 * halves' advances alternate backward first, and the weight-grad pieces
 * run after dispatch(B) and attn(B), so that one layer of the pair is
 * combine(B), attn(F), mlp(B), dispatch(F), dispatch(B), mlp(W), mlp(F),
 * attn(B), attn(W), combine(F) — the 10 phases of DeepSeek's training
 * profile, in its order (that is the order in which DeepSeek's pair
 * launches its kernels; here each advance first waits for the exchange
 * its half started before, so an exchange flies under the other half's
 * next advance only). Every rank of the EP group takes this order
 * (decided by phase names only). */
static lp_status run_fb_phases(lp_exec *e) {
  int fd = 0, bd = 0;
  while (!fd || !bd) {
    if (!bd) {
      lp_nn_phase p = ex_half_phase(e, 1);
      LP_CHECK(pair_advance(e, 1, &bd));
      if (!bd && (p == LP_NN_PHASE_DISPATCH || p == LP_NN_PHASE_ATTN)) LP_CHECK(pair_parts(e, p));
    }
    if (!fd) LP_CHECK(pair_advance(e, 0, &fd));
  }
  return LP_OK;
}

/* The overlapped pair in a fixed order, DeepSeek-V3's: both halves begun
 * (inputs in hand), then their phases alternate, backward first, so each
 * advance starts the next all-to-all of its half and returns while the
 * other half computes: per MoE layer, backward's combine-backward flies
 * under forward's attention, forward's dispatch under backward's experts,
 * backward's dispatch-backward under forward's experts, forward's combine
 * under backward's attention. The forward's count exchange (a few numbers
 * per expert, only the link's latency) is waited for at once, glued to the
 * attention phase that started it: the advance after it does no compute,
 * so giving the turn to the backward half there would leave the
 * backward's row exchange (started one advance before) with nothing to
 * fly under. After each backward advance, the weight-grads of the blocks
 * its input-grad has finished run at once (DeepSeek's MLP(W) and ATTN(W)
 * right after their B: more compute under the exchanges in flight). Every
 * rank of the EP group starts its exchanges in this same order (decided
 * by the halves' phases, lp_nn_phase values, only), as a backend without
 * any_order (NCCL) needs; it
 * also runs every pair without EP exchanges. */
static lp_status run_fb_fixed(lp_exec *e) {
  int fd = 0, bd = 0;
  while (!fd || !bd) {
    if (!bd) LP_CHECK(pair_advance(e, 1, &bd));
    LP_CHECK(ex_bw_parts(e, NULL));
    if (!fd) LP_CHECK(pair_advance(e, 0, &fd));
    if (!fd && ex_half_phase(e, 0) == LP_NN_PHASE_DISPATCH)
      LP_CHECK(pair_advance(e, 0, &fd));
  }
  return LP_OK;
}

/* Polls both running halves' exchanges until one has finished (*rf / *rb
 * say which), sleeping a little longer the longer it takes; the time is
 * the pair's exposed all-to-all time. After a second with neither, it
 * returns anyway: the next advance then blocks in its own wait, which has
 * the watchdog and the error text. */
static lp_status pair_wait(lp_exec *e, int fd, int bd, int *rf, int *rb) {
  double t0 = lp_now(), now = t0;
  lp_status st = LP_OK;
  for (unsigned polls = 0; st == LP_OK && now - t0 < 1.0; polls++) {
    lp_comm_backoff(polls);
    if (!bd) st = ex_half_ready(e, 1, 1, rb);
    if (st == LP_OK && !fd) st = ex_half_ready(e, 0, 1, rf);
    now = lp_now();
    if (*rb || *rf) break;
  }
  ex_a2a_blocked(e, t0, now);
  return st;
}

/* The overlapped pair where the EP group's backend lets the halves'
 * exchanges finish in any order (MPI; backward halves exchange over a
 * context of their own, so every context still sees one order on every
 * rank): whichever half can go on runs its next phase, the forward when
 * both can. The forward is the longer chain of exchanges (three per MoE
 * layer, each a meeting with the EP partners: counts, dispatch, combine;
 * the input-grad has two), so it goes first rather than be left running
 * its last ones alone after the backward finished, and its count
 * exchange's advance (no compute) starts the token exchange as soon as it
 * can. (Measured at pp = 2 x ep = 2, 32 micro-batches, before the carry:
 * 66% of all-to-all time hidden forward-first, 54% backward-first, 64% by
 * progress through each half's exchanges; scripts/bench/moe.) Neither can (both exchanges
 * in flight, e.g. the EP partner is late): a full backward runs a
 * weight-grad piece its input-grad has made ready (the experts' while
 * dispatch-backward flies, a block's once it finished: DeepSeek's MLP(W)
 * and ATTN(W) inside the pair; before them, what the previous pair's
 * backward left, carry_w), and only with nothing left to compute does the
 * rank wait, for whichever exchange ends first. Results equal running
 * the halves one after the other: the two micro-batches touch disjoint
 * state, each half's exchanges keep their order, and the weight-grads run
 * in the order they would at the end. */
static lp_status run_fb_any(lp_exec *e, const lp_action *a, int *adopted_out) {
  int fd = 0, bd = 0, adopted = !e->pr.hf[1].keep_w;
  *adopted_out = 0;
  while (!fd || !bd) {
    int rf = 0, rb = 0;
    if (!fd) LP_CHECK(ex_half_ready(e, 0, 0, &rf));
    if (rf) {
      LP_CHECK(pair_advance(e, 0, &fd));
      continue;
    }
    if (!bd) LP_CHECK(ex_half_ready(e, 1, 0, &rb));
    if (rb) {
      LP_CHECK(pair_advance(e, 1, &bd));
      continue;
    }
    int did = 0;
    LP_CHECK(ex_carry_w(e, &did));
    if (!did) LP_CHECK(ex_bw_parts(e, &did));
    if (!did && bd && !adopted) {
      /* the backward half ended and the older carry is done: its own
       * weight-grad becomes the carry now, so its pieces fill the
       * forward half's last waits (then the next pair's first ones) */
      e->pr.carry_v = a->bstage, e->pr.carry_mb = a->bmb;
      adopted = *adopted_out = 1;
      LP_CHECK(ex_carry_w(e, &did));
    }
    if (did) continue;
    LP_CHECK(pair_wait(e, fd, bd, &rf, &rb));
    if (!rf && !rb) LP_CHECK(pair_advance(e, bd ? 0 : 1, bd ? &fd : &bd));
  }
  return LP_OK;
}

lp_status ex_run_fb(lp_exec *e, const lp_action *a) {
  /* a carried weight-grad of this backward's stage ends before it starts */
  if (e->pr.carry_v == a->bstage) LP_CHECK(ex_carry_w(e, NULL));
  LP_CHECK(ex_f_begin(e, a->stage, a->mb));
  LP_CHECK(ex_b_begin(e, a->bstage, a->bmb, a->btype == LP_ACT_B));
  if (lp_nn_has_phase_stops(e->vs[e->loc[a->stage]].chunk) &&
      lp_nn_has_phase_stops(e->vs[e->loc[a->bstage]].chunk))
    return run_fb_phases(e);
  if (!e->ep_comm_b) return run_fb_fixed(e);
  int keep = a->btype == LP_ACT_B;
  e->pr.hf[1].keep_w = keep;
  int adopted = 0;
  lp_status st = run_fb_any(e, a, &adopted);
  if (st == LP_OK && keep && !adopted) {
    LP_CHECK(ex_carry_w(e, NULL)); /* the older one ends */
    e->pr.carry_v = a->bstage, e->pr.carry_mb = a->bmb;
  }
  return st;
}

