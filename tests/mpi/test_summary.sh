#!/usr/bin/env bash
# test_summary.sh LUAPIPE — the end-of-training summary (luapipe.perf): a
# small MLP trained on 4 ranks (mpirun) with 1f1b, zb1p and dualpipe; rank
# 0 prints the summary after the progress lines, result.summary holds sane
# figures on every rank (summary_check.lua), and train{svg=} draws the
# measured last step; with two ranks pinned to one core it says the
# prediction does not apply, with one rank per core it does not. One step only: nothing skipped as warm-up. No timing
# thresholds (scripts/bench/pipeline judges the figures). Exits 77
# (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"

run() { # family steps svg
  timeout 120 mpirun --oversubscribe -np 4 "$luapipe" tests/mpi/summary_check.lua "$@" \
    >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  echo "$1, $2 steps: rc $rc, $(grep -c ': ok$' "$tmp/out") ranks ok"
  [ "$rc" -eq 0 ] && [ "$(grep -c ': ok$' "$tmp/out")" -eq 4 ] ||
    { fail "$1 ($2 steps)"; cat "$tmp/out" "$tmp/err"; return; }
  grep -q '^summary (' "$tmp/out" || fail "$1: no summary printed"
  [ "$(grep -c '^summary (' "$tmp/out")" -eq 1 ] || fail "$1: summary printed more than once"
  grep -q '^  step time: measured .* ms, simulator.s prediction .* ms' "$tmp/out" ||
    fail "$1: no step-time line"
  grep -q '^  bubble: measured .*%, simulated .*%' "$tmp/out" || fail "$1: no bubble line"
  grep -q '^  overhead: ' "$tmp/out" || fail "$1: no overhead line"
  # the summary comes after the last progress line
  last_step=$(grep -n '^step [0-9]* loss ' "$tmp/out" | tail -1 | cut -d: -f1)
  sum_line=$(grep -n '^summary (' "$tmp/out" | cut -d: -f1)
  [ -n "$last_step" ] && [ "$sum_line" -gt "$last_step" ] || fail "$1: summary before the progress lines"
}

run 1f1b 4 "$tmp/1f1b.svg"
run zb1p 4 -
run dualpipe 5 "$tmp/dualpipe.svg"
grep -q 'skipped as warm-up' "$tmp/out" || fail "dualpipe: warm-up step not reported as skipped"
run 1f1b 1 -
grep -q 'skipped as warm-up' "$tmp/out" && fail "1 step: nothing should be skipped"

# ranks that share cores: the summary says the prediction does not apply.
# Both ranks pinned to CPU 0 (mpirun binds nothing, taskset gives the mask)
if command -v taskset >/dev/null; then
  timeout 120 mpirun --oversubscribe --bind-to none -np 2 taskset -c 0 "$luapipe" \
    tests/mpi/summary_check.lua 1f1b 2 - >"$tmp/out" 2>"$tmp/err"
  echo "1f1b, 2 ranks on CPU 0: rc $?"
  grep -q '^    the prediction does not apply here: 2 ranks share 1 core on one host' "$tmp/out" ||
    { fail "2 ranks on one core: no note that the prediction does not apply"; cat "$tmp/out" "$tmp/err"; }
  # one rank per core (when the machine has two): no such note
  if [ "$(nproc)" -ge 2 ]; then
    timeout 120 mpirun --bind-to none -np 2 sh -c 'exec taskset -c "$OMPI_COMM_WORLD_RANK" "$@"' sh \
      "$luapipe" tests/mpi/summary_check.lua 1f1b 2 - >"$tmp/out" 2>"$tmp/err"
    echo "1f1b, 2 ranks on 2 cores: rc $?"
    grep -q 'does not apply' "$tmp/out" && fail "one rank per core: the note should not appear"
    grep -q '^  step time: measured' "$tmp/out" || { fail "2 ranks on 2 cores: no summary"; cat "$tmp/out" "$tmp/err"; }
  fi
fi

if [ "$fails" -ne 0 ]; then
  echo "test_summary: $fails failure(s)"
  exit 1
fi
echo "test_summary: all passed"
