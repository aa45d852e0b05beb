#!/usr/bin/env bash
# test_comm_staged.sh LUAPIPE — the "mpi-staged" comm wrapper (device
# buffers through host staging, as several ranks sharing one GPU use it) on
# 2 and 3 real ranks: runs the test_comm_staged program (next to the
# luapipe binary) under mpirun; every rank checks a send/receive ring, an
# uneven all-to-all-v with gaps, all-reduce, broadcast, all-gather and
# split. Exits 77 (skipped) without mpirun.
set -u
luapipe=${1:?usage: test_comm_staged.sh path/to/luapipe}
prog=$(dirname "$luapipe")/test_comm_staged
command -v mpirun >/dev/null || { echo "skip: no mpirun"; exit 77; }
[ -x "$prog" ] || { echo "FAIL: $prog is missing"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
fails=0
for np in 2 3; do
  if ! out=$(timeout -k 5 60 mpirun --oversubscribe -np $np "$prog" 2>&1); then
    echo "$out"
    echo "FAIL: $np ranks"
    fails=$((fails + 1))
  elif [ "$(grep -c 'PASSED  \] 4 test' <<<"$out")" != $np ]; then
    echo "$out"
    echo "FAIL: $np ranks: not every rank passed all 4 tests"
    fails=$((fails + 1))
  fi
done
[ $fails = 0 ] && echo "ok: staged comm on 2 and 3 ranks"
exit $((fails > 0))
