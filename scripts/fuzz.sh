#!/usr/bin/env bash
# Fuzzes luapipe's input readers with libFuzzer for SECONDS each (default
# 60): the schedule CSV reader, the schedule JSON reader, the EPLB load
# reader (through `luapipe eplb`), the checkpoint reader, the profile
# trace reader (core/profile) and the safetensors reader
# (core/safetensors); harnesses in
# tests/fuzz/fuzz_*.c, seeds in tests/fuzz/corpus/<reader>/.
#
#   scripts/fuzz.sh [SECONDS] [READER...]
#
# Builds with clang, libFuzzer, ASan and UBSan into build-fuzz/ (installs
# clang when missing). New inputs go to build-fuzz/corpus/<reader>/, never
# to the seed corpus; a crash or a broken contract leaves its input in
# build-fuzz/artifacts/<reader>/ and makes the script exit 1 naming it
# (replay it: build/fuzz_<reader> FILE). LUAPIPE_FUZZ_STRICT=1 also fails
# on error messages that read as Lua internals.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
shift || true
case $secs in *[!0-9]* | "") echo "fuzz.sh: SECONDS must be a whole number, got '$secs'" >&2; exit 2 ;; esac
LUAPIPE_DEPS_FUZZ=1 "$root/scripts/install-deps.sh"
build=$root/build-fuzz
readers=("$@")
if [ ${#readers[@]} -eq 0 ]; then
  for d in "$root"/tests/fuzz/corpus/*/; do readers+=("$(basename "$d")"); done
fi
echo "fuzz: building the harnesses with clang into $build"
CC=clang cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLUAPIPE_CUDA=OFF \
  -DLUAPIPE_NCCL=OFF -DLUAPIPE_FUZZ=ON -DLUAPIPE_ASAN=ON -DLUAPIPE_UBSAN=ON >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target fuzz_harnesses >/dev/null
export OPENBLAS_NUM_THREADS=1 LUAPIPE_LUA_PATH=$root/lua
export LSAN_OPTIONS=suppressions=$root/tests/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
failed=()
for r in "${readers[@]}"; do
  exe=$build/fuzz_$r
  [ -x "$exe" ] || { echo "fuzz.sh: no harness for '$r' (have: $(ls "$root"/tests/fuzz/corpus))" >&2; exit 2; }
  mkdir -p "$build/corpus/$r" "$build/artifacts/$r"
  echo "fuzz: $r for $secs s"
  if "$exe" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$r/" "$build/corpus/$r" "$root/tests/fuzz/corpus/$r" \
      >"$build/$r.log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$build/$r.log" |
      sed "s/^/  /"
  else
    echo "  FAILED: see $build/$r.log and $build/artifacts/$r/"
    grep -E 'ERROR|contract broken|runtime error' "$build/$r.log" | head -3 | sed 's/^/  /'
    failed+=("$r")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failures in ${failed[*]}"
  exit 1
fi
echo "fuzz: no failures (${readers[*]}, $secs s each)"
