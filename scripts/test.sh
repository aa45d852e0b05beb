#!/usr/bin/env bash
# Installs what is missing, builds (scripts/build.sh: Release, warnings as
# errors: the build users get), and runs every test through ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
build=${LUAPIPE_BUILD_DIR:-$root/build}
export OPENBLAS_NUM_THREADS=1
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
jobs=$(nproc 2>/dev/null || echo 2)
(cd "$build" && ctest --output-on-failure -j "$jobs" "$@")

# The same suite again under AddressSanitizer and UndefinedBehaviorSanitizer
# (build-asan/; LUAPIPE_SANITIZE=0 skips it). Open MPI's own leaks are
# suppressed by tests/lsan.supp, leak detection stays on; the full malloc
# stacks (fast_unwind_on_malloc=0) let the suppressions see Open MPI's
# frames. Left out here, the three slowest multi-rank tests (minutes each
# under ASan on 2 cores; their code runs in the single-process checkpoint
# and executor tests and in the other multi-rank tests): mpi_test_examples,
# mpi_test_train_equivalence, mpi_test_checkpoint. Also the Slurm test (daemons and
# jobs; its resume path runs in the checkpoint and examples tests).
if [ "${LUAPIPE_SANITIZE:-1}" != 0 ]; then
  asan=${LUAPIPE_ASAN_BUILD_DIR:-$root/build-asan}
  echo "test: the suite under ASan + UBSan ($asan)"
  # with debug info, for the sanitizers' stack traces
  LUAPIPE_BUILD_DIR=$asan LUAPIPE_BUILD_TYPE=RelWithDebInfo "$root/scripts/build.sh" \
    -DLUAPIPE_ASAN=ON -DLUAPIPE_UBSAN=ON -DLUAPIPE_CUDA=OFF
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:fast_unwind_on_malloc=0
  export LSAN_OPTIONS=suppressions=$root/tests/lsan.supp:print_suppressions=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  (cd "$asan" && ctest --output-on-failure -j "$jobs" \
    -E '^(mpi_test_(examples|train_equivalence|checkpoint)|cluster_test_slurm)$' "$@")
fi
