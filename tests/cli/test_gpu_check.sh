#!/usr/bin/env bash
# scripts/gpu-check.sh, two ways:
#  1. its whole control flow, every device step included, over stand-in
#     binaries (a folder of small scripts that print what the real ones
#     print on a GPU, plus stand-in mpirun, python3 and nvidia-smi on PATH),
#     with LD_LIBRARY_PATH unset and set: the script runs under set -u and
#     must finish every step and print its table (an unguarded expansion
#     killed it minutes into the device's time); the LD_LIBRARY_PATH the
#     multi-rank steps get has no empty entry;
#  2. on a machine without a GPU, the real build: it checks what needs no
#     device (the binaries and the CUDA / NCCL modules load, the CPU half
#     of the char-LM bench runs), reports "no device" for the rest, writes
#     its logs and table, exits 0. Skipped where a CUDA device is visible
#     (there the script runs the real device checks, which it is for).
. "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)

# ---- 1. stand-ins ----
fake=$tmp/fake fbin=$tmp/fakebin
mkdir -p "$fake" "$fbin"
script() { printf '#!/bin/sh\n%s\n' "$2" >"$1" && chmod +x "$1"; }
script "$fake/luapipe" 'if [ "$1" = -v ]; then
  echo "luapipe 0.1.0 (stand-in)"; echo "CUDA kernels: built, 1 device(s) visible"
  echo "CUDA module: '"$fake"'/luapipe_cuda.so"; echo "NCCL module: '"$fake"'/luapipe_nccl.so"; exit 0
fi
i=1; while [ $i -le 50 ]; do echo "step $i loss 2.5"; i=$((i + 1)); done'
script "$fake/gpu_test_kernels" 'echo "ok the CUDA module loads"'
script "$fake/gpu_test_cuda_ops" 'echo "ok gemm"; echo "ok axpy"'
script "$fake/gpu_test_cuda_nn" 'echo "ok linear"'
script "$fake/gpu_test_nccl" 'echo "ok all-reduce"'
script "$fake/bench_gpu_lm" 'echo final_loss=3.5; echo max_rel_loss_diff=2e-6; echo gpu_step_ms=1.5; echo cpu_step_ms=40'
script "$fake/bench_gpu_gemm" 'echo "m n k luapipe_ms cublas_ms ratio"; echo "512 512 512 0.10 0.10 1.02"'
script "$fbin/mpirun" 'echo "LD_LIBRARY_PATH=[${LD_LIBRARY_PATH-unset}]" >>"'"$tmp"'/mpirun.env"
while :; do case $1 in --oversubscribe) shift ;; -np) shift 2 ;; *) break ;; esac; done
exec "$@"'
script "$fbin/python3" 'echo torch_step_ms=2.0'
script "$fbin/nvidia-smi" 'echo "GPU 0: stand-in H200"'
for ld in unset /opt/somewhere; do
  rm -f "$tmp/mpirun.env"
  if [ "$ld" = unset ]; then env=(env -u LD_LIBRARY_PATH); else env=(env LD_LIBRARY_PATH="$ld"); fi
  expect_rc "every step with stand-ins, LD_LIBRARY_PATH $ld" 0 \
    "${env[@]}" PATH="$fbin:$PATH" GPU_CHECK_BIN="$fake" "$root/scripts/gpu-check.sh" "$tmp/fake-$ld"
  grep -q "unbound variable" "$tmp/err" && bad "  an unbound variable: $(grep -m1 unbound "$tmp/err")" ||
    ok "  no unbound variable"
  t=$tmp/fake-$ld/table.txt
  for r in "start      ok     CUDA kernels: built, modules: luapipe_cuda.so luapipe_nccl.so" \
    "device     ok" "cuda_ops   ok" "nccl       ok" "staged-2   ok" "lm50       ok" \
    "lm-train   ok" "lm-train-2 ok" "gemm       ok" "torch-sdpa ok"; do
    expect_in "  row '$r'" "$t" "$r"
  done
  n=$(grep -c . "$tmp/mpirun.env" 2>/dev/null)
  [ "$n" = 2 ] && ok "  mpirun ran twice (staged-2, lm-train-2)" || bad "  mpirun ran ${n:-0} times"
  want="LD_LIBRARY_PATH=[]"
  [ "$ld" = unset ] || want="LD_LIBRARY_PATH=[$ld]"
  [ "$(sort -u "$tmp/mpirun.env")" = "$want" ] && ok "  mpirun's $want" ||
    { bad "  mpirun's environment is not $want:"; sed 's/^/  | /' "$tmp/mpirun.env"; }
done

# a module that cannot be loaded fails the start row (luapipe -v names it)
script "$fake/luapipe" 'echo "CUDA kernels: built, 0 device(s) visible"
echo "CUDA backend: cannot load /x/luapipe_cuda.so: libcublas.so.13: cannot open shared object file"'
expect_rc "a module that does not load" 0 env PATH="$fbin:$PATH" GPU_CHECK_BIN="$fake" \
  "$root/scripts/gpu-check.sh" "$tmp/fake-nomod"
expect_in "  fails the start row, naming the library" "$tmp/fake-nomod/table.txt" \
  "start      FAIL   CUDA backend: cannot load /x/luapipe_cuda.so: libcublas.so.13"

# ---- 2. the real build, no device ----
devices=$("$LP" -e 'print(require("luapipe.core").kernels().devices)')
if [ "$devices" = 0 ]; then
  expect_rc "gpu-check without a device exits 0" 0 \
    env GPU_CHECK_BIN="$(dirname "$LP")" "$root/scripts/gpu-check.sh" "$tmp/logs"
  expect_in "says no device" "$tmp/out" "gpu-check: no device"
  expect_in "binaries start" "$tmp/logs/table.txt" "start      ok"
  if "$LP" -v | grep -q "CUDA kernels: built"; then
    expect_in "  and the modules load" "$tmp/logs/table.txt" "modules: luapipe_cuda.so"
  fi
  expect_in "CPU half of the LM bench" "$tmp/logs/table.txt" "lm-cpu     ok"
  expect_in "device row" "$tmp/logs/table.txt" "device     none"
  expect_in "device checks skipped" "$tmp/logs/table.txt" "twins      skip   no device"
  expect_in "the --device cuda training check skipped" "$tmp/logs/table.txt" "lm-train   skip   no device"
  [ "$(tail -1 "$tmp/out")" = "$(tail -1 "$tmp/logs/table.txt")" ] &&
    ok "the table is printed last" || bad "the table is not the last output"
else
  echo "skip: a CUDA device is visible (the real no-device run)"
fi
expect_rc "no OUTDIR is a usage error" 2 "$root/scripts/gpu-check.sh"
expect_in "usage text" "$tmp/err" "usage: scripts/gpu-check.sh OUTDIR"
finish
