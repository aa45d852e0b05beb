#!/usr/bin/env bash
# `cmake --install build --prefix P` gives a working program: P/bin/luapipe
# finds its modules in P/share/luapipe/lua (next to the binary, whatever P
# is), not in the source tree, and runs commands from any directory; with
# CUDA built, it opens the backend modules from P/lib/luapipe.
. "$(dirname "$0")/lib.sh"

build=$(cd "$(dirname "$LP")" && pwd)
[ -f "$build/cmake_install.cmake" ] || { echo "no cmake install script in $build: skipped"; exit 77; }
prefix="$tmp/prefix with space"
expect_rc "cmake --install" 0 cmake --install "$build" --prefix "$prefix"
inst="$prefix/bin/luapipe"
[ -x "$inst" ] && ok "installed binary" || bad "no $inst"
[ -f "$prefix/share/luapipe/lua/luapipe/init.lua" ] && ok "installed modules" || bad "no modules"

cd "$tmp" || exit 1
run() { env -u LUAPIPE_LUA_PATH "$inst" "$@"; }
expect_rc "installed luapipe -v" 0 run -v
expect_in "version" "$tmp/out" "luapipe 0.1.0"
cuda=0
grep -q "CUDA kernels: built" "$tmp/out" && cuda=1
if [ $cuda = 1 ]; then # the backend modules, opened from the install tree
  expect_in "installed CUDA module opened" "$tmp/out" \
    "CUDA module: $prefix/bin/../lib/luapipe/luapipe_cuda.so"
  if [ -f "$build/luapipe_nccl.so" ]; then
    expect_in "installed NCCL module opened" "$tmp/out" \
      "NCCL module: $prefix/bin/../lib/luapipe/luapipe_nccl.so"
  fi
fi
expect_rc "installed luapipe uses its own modules" 0 \
  run -e 'print("from=" .. package.searchpath("luapipe.schedule", package.path))'
expect_in "modules from the prefix" "$tmp/out" "from=$prefix/bin/../share/luapipe/lua/luapipe/schedule.lua"
expect_rc "installed schedule command" 0 run schedule dualpipe --pp 4 --microbatches 8
expect_in "schedule built" "$tmp/out" "schedule 'dualpipe': 4 ranks, 4 stages (8 virtual), 8 micro-batches"
expect_rc "installed simulate command" 0 run simulate zb1p -p 4 -m 8 --format json
expect_in "simulated" "$tmp/out" '"makespan"'

# a moved install still works (nothing absolute is baked in)
mv "$prefix" "$tmp/moved"
inst="$tmp/moved/bin/luapipe"
expect_rc "moved install runs a command" 0 run bubbles --pp 4 --microbatches 8
expect_in "bubbles table" "$tmp/out" "DualPipe"
if [ $cuda = 1 ]; then
  expect_rc "moved install -v" 0 run -v
  expect_in "  opens its own CUDA module" "$tmp/out" "CUDA module: $tmp/moved/bin/../lib/luapipe/luapipe_cuda.so"
fi
finish
