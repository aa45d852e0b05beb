#!/usr/bin/env bash
# test_train_device.sh LUAPIPE — `--device cuda` on the training examples
# where no CUDA device is visible (CI): one line on stderr naming the
# reason (no traceback), a non-zero exit, and under mpirun the line once
# (rank 0) and exit 2 on every rank; a bad device name is refused the
# same way, and an MoE model stops for the missing device only (no MoE
# refusal). Skips (77) where a GPU is visible.
. "$(dirname "$0")/lib.sh"
export LUAPIPE_LUA_PATH=${LUAPIPE_LUA_PATH:-$(cd "$(dirname "$0")/../.." && pwd)/lua}
"$LP" -v | grep -qE "built, [1-9][0-9]* device" && { echo "skip: a CUDA device is visible"; exit 77; }
lm=(examples/train_char_lm.lua --steps 1 --blocks 1 --dim 16 --context 8 --microbatches 2)
nodev="luapipe: luapipe.train: device 'cuda' requested but "
# exactly one stderr line, and it starts with $2
one_line() {
  if [ "$(wc -l <"$tmp/err")" = 1 ] && grep -qF -- "$2" "$tmp/err"; then ok "$1"; else
    bad "$1: stderr is not one line starting '$2'"; sed 's/^/  | /' "$tmp/err" | head -20; fi
}

expect_rc "char-LM --device cuda, one process" 1 "$LP" "${lm[@]}" --device cuda
one_line "  one line naming the reason" "$nodev"
"$LP" -v | grep -q "CUDA kernels: built," &&
  expect_in "  the CUDA runtime's reason" "$tmp/err" "no CUDA device is visible (cudaGetDeviceCount: "

expect_rc "train_mlp --device gpu" 1 "$LP" examples/train_mlp.lua --steps 1 --device gpu
one_line "  names the bad device" "luapipe: luapipe.train: device 'gpu' is not cpu, cuda or cuda:N"

expect_rc "train_moe --device cuda" 1 "$LP" examples/train_moe.lua --steps 1 --blocks 1 --device cuda
one_line "  only the missing device is named" "$nodev"

if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
  expect_rc "char-LM --device cuda, 2 ranks" 2 timeout -k 5 120 mpirun --oversubscribe -np 2 "$LP" "${lm[@]}" --device cuda
  n=$(grep -c "^$nodev" "$tmp/err")
  [ "$n" = 1 ] && ok "  the line once (rank 0)" || { bad "  the line $n times"; sed 's/^/  | /' "$tmp/err" | head; }
  grep -q "stack traceback" "$tmp/err" && bad "  a traceback was printed" || ok "  no traceback"
else
  echo "skip: no mpirun (2-rank check)"
fi
finish
