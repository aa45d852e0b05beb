#!/usr/bin/env bash
# Configures and builds luapipe into build/ (used by demo.sh and test.sh).
# The build users get, and CI tests: LUAPIPE_BUILD_TYPE (default Release)
# with compiler warnings as errors (LUAPIPE_WERROR=0 turns that off);
# further arguments go to cmake (-DLUAPIPE_CUDA=OFF, ...) and win.
# On a terminal the compile progress is one line that updates in place
# ("[ 45%] Building C object ..."); otherwise (logs, CI) every line shows.
# A failed build exits non-zero.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${LUAPIPE_BUILD_DIR:-$root/build}
jobs=$(nproc 2>/dev/null || echo 2)
echo "build: configuring and compiling luapipe into $build ($jobs jobs)"
werror=ON
[ "${LUAPIPE_WERROR:-1}" = 0 ] && werror=OFF
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${LUAPIPE_BUILD_TYPE:-Release}" \
  -DLUAPIPE_WERROR=$werror "$@" >/dev/null
if [ -t 1 ]; then
  cols=$(tput cols 2>/dev/null || echo 80)
  cmake --build "$build" -j "$jobs" 2>&1 | while IFS= read -r line; do
    case $line in
      "["*"%]"*) printf '\r\033[K%s' "${line:0:$((cols - 1))}" ;;
      *) printf '\r\033[K%s\n' "$line" ;;
    esac
  done
  printf '\r\033[K'
else
  cmake --build "$build" -j "$jobs" 2>&1
fi
test -x "$build/luapipe"
echo "build: done ($build/luapipe)"
