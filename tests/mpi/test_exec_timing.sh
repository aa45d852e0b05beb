#!/usr/bin/env bash
# test_exec_timing.sh LUAPIPE — the job's timing gathered on every rank
# (lp_exec_job_timing, over the comm layer's all-gather) on real ranks:
# runs the test_exec_timing program (next to the luapipe binary) under
# mpirun on 2 ranks (pp 2) and 4 ranks (pp 2 x ep 2); every rank finds each
# rank's own figures, kept steps and planted trace slices under its world
# rank, the sums in rank order and the latency of the planted messages.
# Exits 77 (skipped) without mpirun.
set -u
luapipe=${1:?usage: test_exec_timing.sh path/to/luapipe}
prog=$(dirname "$luapipe")/test_exec_timing
command -v mpirun >/dev/null || { echo "skip: no mpirun"; exit 77; }
[ -x "$prog" ] || { echo "FAIL: $prog is missing"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
fails=0
for np in 2 4; do
  if ! out=$(timeout -k 5 120 mpirun --oversubscribe -np $np "$prog" 2>&1); then
    echo "$out"
    echo "FAIL: $np ranks"
    fails=$((fails + 1))
  elif [ "$(grep -c 'PASSED  \] 3 test' <<<"$out")" != $np ]; then
    echo "$out"
    echo "FAIL: $np ranks: not every rank passed its 3 multi-rank tests"
    fails=$((fails + 1))
  else
    echo "ok: the job's timing on $np ranks"
  fi
done
[ $fails = 0 ] && echo "test_exec_timing: all passed"
exit $((fails > 0))
