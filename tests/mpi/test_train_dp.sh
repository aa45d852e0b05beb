#!/usr/bin/env bash
# test_train_dp.sh LUAPIPE — data parallelism (run from the repo root).
# 1. Equivalence (train_equivalence.lua): at dp = 2 every family on
#    pp 2 x dp 2, the MLP and the transformer LM on pp 1 x dp 2, the MoE LM
#    on pp 1 x dp 4 x ep 2 (dp beyond the EP group: experts summed over the
#    expert-DP group) and pp 2 x dp 2 x ep 1, with EPLB, ZeRO-1 and
#    clipping with a learning-rate schedule, and with a gradient bucket per
#    layer (LUAPIPE_DP_BUCKET=1): the one-process reference's losses,
#    gradient norms and parameters within 1e-5.
# 2. dp_check.lua (the LM, 4 sequences per micro-batch): dp = 2 equals
#    dp = 1 within 1e-5; ZeRO-1 equals zero = 0 bitwise with half the
#    optimizer bytes per rank, and the summary says so; per-layer buckets
#    equal one bucket bitwise; a ZeRO-1 checkpoint resumed at the same grid
#    is bitwise the unbroken run, and at another dp or zero it is refused
#    naming both.
# 3. Bad input: one line, exit 2, nothing started.
# Exits 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
mpirun=(timeout 90 mpirun --oversubscribe)
driver=tests/mpi/train_equivalence.lua

while read -r np fam M mode env; do
  [ -z "$np" ] && continue
  env ${env:-} "${mpirun[@]}" -np "$np" "$luapipe" "$driver" "$fam" "$M" "$mode" >"$tmp/out" 2>"$tmp/err" </dev/null
  rc=$?
  echo "$fam np=$np M=$M ($mode${env:+, $env}): rc $rc"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne "$np" ]; then
    fail "$fam np=$np ($mode${env:+, $env})"
    cat "$tmp/out" "$tmp/err"
  fi
done <<'EOF'
2 1f1b 2 dp2
2 1f1b 2 lm_dp2
4 gpipe 4 dp2
4 1f1b 4 dp2
4 interleaved1f1b 4 dp2
4 zb1p 4 dp2
4 zbv 4 dp2
4 dualpipe 4 dp2
4 dualpipev 4 dp2
4 chimera 4 dp2
4 1f1b 4 moe_dp4_ep2
4 dualpipe 4 moe_dp2
4 1f1b 4 moe_eplb_dp4_ep2
2 1f1b 2 dp2_zero
4 1f1b 4 moe_dp4_zero_ep2
4 dualpipe 4 moe_dp2_zero+recipe
2 1f1b 2 dp2+recipe
2 1f1b 2 lm_dp2_zero
4 1f1b 4 moe_dp4_ep2+recipe
4 zb1p 4 lm_dp2 LUAPIPE_DP_BUCKET=1
EOF

# ---- dp_check.lua: exact figures per rank in $tmp/<mode>.rank<R>.txt ----
check=tests/mpi/dp_check.lua
run() { # NAME NP MODE ARGS...: runs, keeps rank 0's figures as $tmp/NAME.txt
  local name=$1 np=$2 mode=$3
  shift 3
  "${mpirun[@]}" -np "$np" "$luapipe" "$check" "$mode" "$tmp" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" \
    || { fail "$name: rc $?"; cat "$tmp/$name.out" "$tmp/$name.err"; return 1; }
  cp "$tmp/$mode.rank0.txt" "$tmp/$name.txt"
}
run dp1 1 run
run dp2 2 run
run dp2z 2 run zero=1
LUAPIPE_DP_BUCKET=1 run dp2b 2 run
# dp = 2 against dp = 1: the same global batch, losses and parameters within 1e-5
paste "$tmp/dp1.txt" "$tmp/dp2.txt" | awk '
  /^loss/ { d = $3 - $6; if (d < 0) d = -d; if (d > 1e-5 * ($3 < 0 ? -$3 : $3)) { print "loss " $2 ": " $3 " vs " $6; bad = 1 } }
  /^params/ { for (i = 2; i <= 3; i++) { d = $i - $(i + 3); if (d < 0) d = -d; a = $i < 0 ? -$i : $i
      if (d > 1e-5 * a) { print "params checksum: " $i " vs " $(i + 3); bad = 1 } } }
  END { exit bad }' || fail "dp = 2 differs from dp = 1"
# ZeRO-1 and per-layer buckets: bitwise zero = 0's / one bucket's losses and parameters
cmp -s <(grep -v optim_bytes "$tmp/dp2.txt") <(grep -v optim_bytes "$tmp/dp2z.txt") \
  || { fail "zero = 1 is not bitwise zero = 0"; diff "$tmp/dp2.txt" "$tmp/dp2z.txt"; }
cmp -s "$tmp/dp2.txt" "$tmp/dp2b.txt" \
  || { fail "per-layer buckets are not bitwise one bucket"; diff "$tmp/dp2.txt" "$tmp/dp2b.txt"; }
b1=$(awk '/^optim_bytes/ { print $2 }' "$tmp/dp1.txt")
b2=$(awk '/^optim_bytes/ { print $2 }' "$tmp/dp2.txt")
bz=$(awk '/^optim_bytes/ { print $2 }' "$tmp/dp2z.txt")
echo "optimizer bytes per rank: dp 1 $b1, dp 2 $b2, dp 2 zero 1 $bz"
[ "$b2" = "$b1" ] && [ $((2 * bz)) -eq "$b1" ] || fail "ZeRO-1 at dp = 2 does not hold half of dp = 1's optimizer bytes"
grep -qx "  data parallel: dp 2 (ep 1), zero 1, optimizer state $bz bytes per rank" "$tmp/dp2z.out" \
  || { fail "the summary does not print ZeRO-1's optimizer bytes"; cat "$tmp/dp2z.out"; }
grep -q "^    gradient sums over dp: 3 per rank, .* hidden under backward work" "$tmp/dp2.out" \
  || { fail "the summary does not report the DP sums"; cat "$tmp/dp2.out"; }

# a ZeRO-1 checkpoint: resumed at the same grid, bitwise the unbroken run
run part 2 part zero=1 && run resume 2 resume zero=1 && for r in 0 1; do
  cmp -s <(grep -e '^loss 3 ' -e '^params' "$tmp/dp2z.txt") <(grep -e '^loss 3 ' -e '^params' "$tmp/resume.rank$r.txt") \
    || { fail "rank $r: the resumed ZeRO-1 run is not bitwise the unbroken one"; cat "$tmp/resume.rank$r.txt"; }
done
# ... at another dp or zero: refused, naming both
for case in "1 dp = 1, zero = 0" "2 dp = 2, zero = 0"; do
  read -r np want <<<"$case"
  "${mpirun[@]}" -np "$np" "$luapipe" "$check" resume "$tmp" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  line="luapipe: luapipe.train: checkpoint $tmp/ckpt/step3 was written at dp = 2, zero = 1; this run has $want: each rank's file holds its share of the data-parallel group, so resume with dp = 2, zero = 1 (re-sharding is not supported)"
  if [ "$rc" -eq 0 ] || ! grep -qxF "$line" "$tmp/err"; then
    fail "resume at $want: rc $rc, expected the refusal"
    cat "$tmp/err"
  fi
done

# ---- bad input: one line in the user's terms, exit 2 ----
while IFS='|' read -r np args want; do
  # shellcheck disable=SC2086
  "${mpirun[@]}" -np "$np" "$luapipe" "$check" run "$tmp/none" $args >"$tmp/out" 2>"$tmp/err"
  rc=$?
  got=$(grep -v -e '^---' -e '^Primary' -e '^a non' -e '^mpirun' -e '^the job' -e 'Process name' -e 'Exit code' \
    -e '^$' -e '^ *$' "$tmp/err")
  if [ "$rc" -ne 2 ] || [ "$got" != "$want" ] || [ -e "$tmp/none" ]; then
    fail "np $np $args: rc $rc (want 2)"
    printf 'got:  %s\nwant: %s\n' "$got" "$want"
  fi
done <<'EOF'
3|dp=2|luapipe: dp = 2 does not divide the ranks: mpirun started 3 (pp x dp ranks are needed)
4|pp=1 dp=2|luapipe: pp x dp = 1 x 2 needs 2 ranks, but mpirun started 4 (run it with mpirun -np 2)
4|dp=2 ep=4|luapipe: luapipe.train: ep = 4 does not divide dp = 2 (each EP group is ep of a pipeline stage's dp ranks)
2|rows=3|luapipe: a micro-batch of 3 rows cannot be shared by dp = 2 ranks: make the micro-batch size a multiple of 2
2|zero=2|luapipe: luapipe.train: 'zero' must be 0 (off) or 1 (optimizer state sharded over dp), got 2
EOF

[ "$fails" -eq 0 ] && echo "all data-parallel checks passed"
exit "$fails"
