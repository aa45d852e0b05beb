#!/usr/bin/env bash
# test_exec_device.sh LUAPIPE — the executor with the whole model on a
# device backend over 2 real ranks: runs the test_exec_device program (next
# to the luapipe binary) under mpirun; each rank trains 1F1B (plain and
# with split backward) on the CPU and on the fake:0 backend (memory the
# host cannot touch; activations and gradients through the staged comm)
# and checks losses and its parameters bitwise equal; then pp 1 x ep 2
# (dense gradients summed over the EP group). Exits 77 (skipped)
# without mpirun.
set -u
luapipe=${1:?usage: test_exec_device.sh path/to/luapipe}
prog=$(dirname "$luapipe")/test_exec_device
command -v mpirun >/dev/null || { echo "skip: no mpirun"; exit 77; }
[ -x "$prog" ] || { echo "FAIL: $prog is missing"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
if ! out=$(timeout -k 5 120 mpirun --oversubscribe -np 2 "$prog" 2>&1); then
  echo "$out"
  echo "FAIL: 2 ranks"
  exit 1
fi
if [ "$(grep -c '\[       OK \] test_two_ranks' <<<"$out")" != 2 ]; then
  echo "$out"
  echo "FAIL: test_two_ranks did not pass on both ranks"
  exit 1
fi
echo "ok: 1F1B on 2 ranks, model on fake:0, bitwise equal to the CPU"
