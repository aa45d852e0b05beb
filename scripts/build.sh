#!/usr/bin/env bash
# Configures and builds luapipe into build/ (used by demo.sh and test.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${LUAPIPE_BUILD_DIR:-$root/build}
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$jobs" 2>&1 | grep -vE '^\[ *[0-9]+%\]' || true
test -x "$build/luapipe"
