#!/usr/bin/env bash
# test_train_watchdog.sh LUAPIPE — a training job never hangs when a rank
# stops (run from the repo root). With LUAPIPE_TIMEOUT=3 and 1f1b
# (train_watchdog.lua): the last rank gets stuck in step 2 ("hang") — the
# job ends non-zero within seconds and a waiting rank's message names
# itself, its pending action and the silent peer (exactly, on 2 ranks);
# the last rank kills itself ("kill") — the job ends non-zero within
# seconds. Exits 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
export LUAPIPE_TIMEOUT=3
mpirun=(timeout 60 mpirun --oversubscribe -x LUAPIPE_TIMEOUT)
driver=tests/mpi/train_watchdog.lua
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

run() { # np mode
  local t0 t1
  t0=$(date +%s.%N)
  "${mpirun[@]}" -np "$1" "$luapipe" "$driver" "$2" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  t1=$(date +%s.%N)
  secs=$(elapsed "$t0" "$t1")
  echo "$2 on $1 ranks: rc $rc in $secs s"
  [ "$rc" -ne 0 ] || fail "$2 on $1 ranks: the job exited 0"
  [ "$rc" -ne 124 ] || fail "$2 on $1 ranks: the job hung (killed by timeout)"
  awk -v s="$secs" 'BEGIN { exit !(s < 20) }' || fail "$2 on $1 ranks: took $secs s"
  if grep -q "finished (should not happen)" "$tmp/out"; then fail "$2 on $1 ranks: a rank finished"; fi
}

run 2 hang
want="luapipe: rank 0: timed out after 3 s (LUAPIPE_TIMEOUT) waiting for rank 1 to send 16 floats (tag 8) to rank 0: rank 0, action 5 (0B0) waits for RECV_B (gradient) of micro-batch 0 from rank 1"
grep -qF "$want" "$tmp/err" || { fail "hang on 2 ranks: message missing"; cat "$tmp/err"; }

run 4 hang
grep -qE '^luapipe: rank [0-3]: timed out after 3 s \(LUAPIPE_TIMEOUT\) waiting for rank [0-3] to send [0-9]+ floats \(tag [0-9]+\) to rank [0-3]: rank [0-3], action [0-9]+ \([0-9]+B[0-9]+\) waits for RECV_B \(gradient\) of micro-batch [0-9]+ from rank [0-3]$' "$tmp/err" ||
  { fail "hang on 4 ranks: message missing"; cat "$tmp/err"; }

run 4 kill

if [ "$fails" -ne 0 ]; then
  echo "test_train_watchdog: $fails failure(s)"
  exit 1
fi
echo "test_train_watchdog: all passed"
