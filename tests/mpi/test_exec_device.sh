#!/usr/bin/env bash
# test_exec_device.sh LUAPIPE — the executor with the whole model on a
# device backend over real ranks: runs the test_exec_device program (next
# to the luapipe binary) under mpirun. On 2 ranks each rank trains 1F1B
# (plain and with split backward) and pp 1 x ep 2 (dense gradients summed
# over the EP group); on 4 ranks DualPipe (both directions, overlapped
# pairs, copies of every stage summed across ranks) — each on the CPU and
# on the fake:0 backend (memory the host cannot touch; activations and
# gradients through the staged comm), losses and its parameters bitwise
# equal. Exits 77 (skipped) without mpirun.
set -u
luapipe=${1:?usage: test_exec_device.sh path/to/luapipe}
prog=$(dirname "$luapipe")/test_exec_device
command -v mpirun >/dev/null || { echo "skip: no mpirun"; exit 77; }
[ -x "$prog" ] || { echo "FAIL: $prog is missing"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
fails=0
for run in "2 test_two_ranks" "4 test_dualpipe_four_ranks"; do
  set -- $run
  if ! out=$(timeout -k 5 120 mpirun --oversubscribe -np "$1" "$prog" 2>&1); then
    echo "$out"
    echo "FAIL: $1 ranks"
    fails=$((fails + 1))
  elif [ "$(grep -c "\[       OK \] $2\$" <<<"$out")" != "$1" ]; then
    echo "$out"
    echo "FAIL: $2 did not pass on all $1 ranks"
    fails=$((fails + 1))
  else
    echo "ok: $2 on $1 ranks, model on fake:0, bitwise equal to the CPU"
  fi
done
exit $((fails > 0))
