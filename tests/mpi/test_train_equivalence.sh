#!/usr/bin/env bash
# test_train_equivalence.sh LUAPIPE — the executor against the single-process
# reference (run from the repo root): for every schedule family on 2 and 4
# ranks (M = 2P micro-batches; interleaved1f1b with 2 chunks), a small MLP
# trained 3 steps gives the reference's per-step losses and final
# parameters within 1e-5 relative on every rank, and DualPipe's two copies
# of each stage end bitwise equal (train_equivalence.lua); the same for a
# small transformer LM with AdamW on 2 ranks (1f1b, zbv, dualpipe); PyTorch's
# deferred-receive CSV schedules as written. Then the clear
# errors: a schedule for 4 ranks on a 2-rank job, and a model with fewer
# layers than the schedule's stages. Chimera is one of the families; schedules found by
# `luapipe search` (linear, V, bidirectional) train from their CSV file the same way.
# Exits 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
mpirun=(timeout 60 mpirun --oversubscribe)
driver=tests/mpi/train_equivalence.lua
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

for P in 2 4; do
  for fam in gpipe 1f1b interleaved1f1b zb1p zbv dualpipe dualpipev chimera; do
    M=$((2 * P))
    t0=$(date +%s.%N)
    "${mpirun[@]}" -np "$P" "$luapipe" "$driver" "$fam" "$M" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    t1=$(date +%s.%N)
    echo "$fam P=$P M=$M: rc $rc in $(elapsed "$t0" "$t1") s"
    if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne "$P" ]; then
      fail "$fam on $P ranks"
      cat "$tmp/out" "$tmp/err"
    fi
  done
done

# schedules found by `luapipe search` (linear, V and bidirectional placements,
# F&B pairs, memory limits), written as CSV and trained from the file
for case in "2 linear 2" "2 v 2" "4 linear 3" "4 v 4" "4 bidirectional 5"; do
  read -r P pl mem <<<"$case"
  M=$((2 * P))
  "$luapipe" search --pp "$P" --microbatches "$M" --cost F=1,B=2,W=1,FB=2.4 --memory "$mem" \
    --placement "$pl" --w-share 0.5 --time 0.2 -o "$tmp/found.csv" >"$tmp/sout" 2>&1 \
    || { fail "search P=$P $pl"; cat "$tmp/sout"; continue; }
  t0=$(date +%s.%N)
  "${mpirun[@]}" -np "$P" "$luapipe" "$driver" "$tmp/found.csv" "$M" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  echo "searched ($pl, memory $mem) P=$P M=$M: rc $rc in $(elapsed "$t0" "$(date +%s.%N)") s"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne "$P" ]; then
    fail "searched schedule ($pl) on $P ranks"
    cat "$tmp/found.csv" "$tmp/out" "$tmp/err"
  fi
done

# a small transformer LM (embedding, attention, cross-entropy, AdamW)
for fam in 1f1b zbv dualpipe; do
  t0=$(date +%s.%N)
  "${mpirun[@]}" -np 2 "$luapipe" "$driver" "$fam" 4 lm >"$tmp/out" 2>"$tmp/err"
  rc=$?
  t1=$(date +%s.%N)
  echo "$fam P=2 M=4 (transformer LM, AdamW): rc $rc in $(elapsed "$t0" "$t1") s"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne 2 ]; then
    fail "$fam on 2 ranks (LM)"
    cat "$tmp/out" "$tmp/err"
  fi
done

# the pp x ep grid: every family at pp = 2, ep = 2 (4 ranks), and pp = 1,
# ep = 2; each EP rank trains on its half of every micro-batch, dense grads
# summed over the EP group: the reference's losses and parameters. Then a
# small MoE LM (3 MoE blocks, 4 experts, top-2, AdamW) for every family at
# 2 x 2, 4 x 1 and 1 x 2 (DualPipe needs an even pp, so not at 1 x 2), its
# experts spread over the EP group and tokens exchanged by all-to-all-v.
# EPLB: the MoE LM rebalanced after every step (one redundant slot per EP
# rank; weights and optimizer state move) keeps the reference's losses.
while read -r np fam M mode what; do
  t0=$(date +%s.%N)
  "${mpirun[@]}" -np "$np" "$luapipe" "$driver" "$fam" "$M" "$mode" >"$tmp/out" 2>"$tmp/err" </dev/null
  rc=$?
  t1=$(date +%s.%N)
  echo "$fam $what M=$M ($mode): rc $rc in $(elapsed "$t0" "$t1") s"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne "$np" ]; then
    fail "$fam $what ($mode)"
    cat "$tmp/out" "$tmp/err"
  fi
done <<'LIST'
4 gpipe 4 ep2 pp=2xep=2
4 1f1b 4 ep2 pp=2xep=2
4 interleaved1f1b 4 ep2 pp=2xep=2
4 zb1p 4 ep2 pp=2xep=2
4 zbv 4 ep2 pp=2xep=2
4 dualpipe 4 ep2 pp=2xep=2
4 dualpipev 4 ep2 pp=2xep=2
4 dualpipe 4 lm_ep2 pp=2xep=2
4 dualpipe 4 phases_ep2 pp=2xep=2
4 dualpipe 4 moe_eplb_ep2 EPLB-pp=2xep=2
4 zb1p 4 moe_eplb_ep2 EPLB-pp=2xep=2
2 1f1b 2 moe_eplb_ep2 EPLB-pp=1xep=2
4 gpipe 4 moe_ep2 MoE-pp=2xep=2
4 1f1b 4 moe_ep2 MoE-pp=2xep=2
4 interleaved1f1b 4 moe_ep2 MoE-pp=2xep=2
4 zb1p 4 moe_ep2 MoE-pp=2xep=2
4 zbv 4 moe_ep2 MoE-pp=2xep=2
4 dualpipe 4 moe_ep2 MoE-pp=2xep=2
4 dualpipev 4 moe_ep2 MoE-pp=2xep=2
4 dualpipe 8 moe_eplb_ep2 EPLB-pp=2xep=2-more-pairs
4 dualpipe 8 moe_skew_ep2 MoE-pp=2xep=2-partners-out-of-step
4 dualpipe 8 moe_reduce_ep2 MoE-pp=2xep=2-explicit-REDUCE_GRAD
4 gpipe 8 moe MoE-pp=4xep=1
4 1f1b 8 moe MoE-pp=4xep=1
4 interleaved1f1b 8 moe MoE-pp=4xep=1
4 zb1p 8 moe MoE-pp=4xep=1
4 zbv 8 moe MoE-pp=4xep=1
4 dualpipe 8 moe MoE-pp=4xep=1
4 dualpipev 8 moe MoE-pp=4xep=1
2 gpipe 2 moe_ep2 MoE-pp=1xep=2
2 1f1b 2 moe_ep2 MoE-pp=1xep=2
2 interleaved1f1b 2 moe_ep2 MoE-pp=1xep=2
2 zb1p 2 moe_ep2 MoE-pp=1xep=2
2 zbv 2 moe_ep2 MoE-pp=1xep=2
2 dualpipev 2 moe_ep2 MoE-pp=1xep=2
2 dualpipev 8 moe_ep2 MoE-pp=1xep=2-more-pairs
2 dualpipev 8 moe_skew_ep2 MoE-pp=1xep=2-partners-out-of-step
2 1f1b 2 ep2 pp=1xep=2
LIST

# variants on 4 ranks: M = 4P, receives posted one action ahead / all at
# the start of the step, the model split by measured cost, DualPipe with
# explicit REDUCE_GRAD actions, and with a Lua overlapped_fb hook
while read -r fam M mode look what; do
  t0=$(date +%s.%N)
  "${mpirun[@]}" -np 4 "$luapipe" "$driver" "$fam" "$M" "$mode" "$look" >"$tmp/out" 2>"$tmp/err" </dev/null
  rc=$?
  t1=$(date +%s.%N)
  echo "$fam P=4 M=$M ($what): rc $rc in $(elapsed "$t0" "$t1") s"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne 4 ]; then
    fail "$fam on 4 ranks ($what)"
    cat "$tmp/out" "$tmp/err"
  fi
done <<'LIST'
1f1b 16 mlp 4 M=4P
interleaved1f1b 16 mlp 4 M=4P
dualpipe 16 mlp 4 M=4P
zbv 8 mlp 1 lookahead 1
dualpipev 8 mlp -1 all receives posted at step start
dualpipe 8 mlp 1 lookahead 1
zb1p 8 cost 4 partition by cost
dualpipe 8 reduce 4 explicit REDUCE_GRAD actions
dualpipe 8 wait 4 REDUCE_GRAD, WAIT_REDUCE_GRAD, UNSHARD, RESHARD
dualpipe 8 hook 4 overlapped_fb hook
LIST

# PyTorch's test_defer_recv_ops schedules (explicit SEND/RECV, receives
# posted early or deferred to their use, full B or I/W split) run as written
# on 2 ranks: the reference's losses and parameters
# (and the early-receive one with receives posted one compute action ahead)
d=tests/lua/data/defer_recv
for run in "$d"/*_no_overlap_*.csv "$d"/*_iw_split_*.csv "$d/simple_2_rank_2_stage_iw_split_input.csv mlp 1"; do
  read -r f mode look <<<"$run"
  t0=$(date +%s.%N)
  "${mpirun[@]}" -np 2 "$luapipe" "$driver" "$f" 2 $mode $look >"$tmp/out" 2>"$tmp/err" </dev/null
  rc=$?
  t1=$(date +%s.%N)
  echo "$(basename "$f") P=2 M=2${look:+ lookahead $look}: rc $rc in $(elapsed "$t0" "$t1") s"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne 2 ]; then
    fail "$(basename "$f") on 2 ranks"
    cat "$tmp/out" "$tmp/err"
  fi
done

# a schedule for 4 ranks on a 2-rank job: one clear line, once, exit 2
"${mpirun[@]}" -np 2 "$luapipe" "$driver" 1f1b 8 ranks >"$tmp/out" 2>&1
rc=$?
n=$(grep -c "^luapipe: schedule '1f1b' needs 4 ranks, but mpirun started 2 (run it with mpirun -np 4)$" "$tmp/out")
echo "wrong rank count: rc $rc, reported $n time(s)"
{ [ "$rc" -eq 2 ] && [ "$n" -eq 1 ] && ! grep -q traceback "$tmp/out"; } ||
  { fail "wrong rank count"; cat "$tmp/out"; }

# more stages than layers: an error before anything runs
"${mpirun[@]}" -np 2 "$luapipe" "$driver" zbv 4 stages >"$tmp/out" 2>&1
rc=$?
n=$(grep -c "the schedule wants 4 model stages, but the model has only 1 layer (each stage" "$tmp/out")
echo "too few layers: rc $rc, $n rank(s) reported it"
{ [ "$rc" -ne 0 ] && [ "$n" -ge 1 ]; } || { fail "too few layers"; cat "$tmp/out"; }

if [ "$fails" -ne 0 ]; then
  echo "test_train_equivalence: $fails failure(s)"
  exit 1
fi
echo "test_train_equivalence: all passed"
