#!/usr/bin/env bash
# test_cpu_maps.sh LUAPIPE — a CPU run maps no CUDA library: the program
# links none, and its CUDA and NCCL backends are modules (luapipe_cuda.so,
# luapipe_nccl.so) opened on first use. Checked in /proc/self/maps of
# `luapipe -e`, of a CPU training step (one process and, under mpirun, each
# of 2 ranks); the check itself is shown to see the libraries once a module
# is opened (-v's listing). Then the program copied away from its modules:
# -v, a layer's to("cuda") and `--device cuda` each say which module is
# missing and where it was looked for, and a module that is not one says
# the loader's reason.
. "$(dirname "$0")/lib.sh"
export LUAPIPE_LUA_PATH=${LUAPIPE_LUA_PATH:-$(cd "$(dirname "$0")/../.." && pwd)/lua}
export OPENBLAS_NUM_THREADS=1

# cuda_maps() -> the CUDA / NCCL files mapped into this process, or "none"
maps='local function cuda_maps()
  local seen, names = {}, {}
  for line in io.lines("/proc/self/maps") do
    local f = line:match("/([^/]+)$")
    if f and not seen[f] and (f:find("^libcublas") or f:find("^libnccl") or f:find("^libcudart")
        or f:find("^libcuda%.") or f:find("^luapipe_cuda") or f:find("^luapipe_nccl")) then
      seen[f] = true
      names[#names + 1] = f
    end
  end
  table.sort(names)
  return #names > 0 and table.concat(names, " ") or "none"
end'
expect_rc "luapipe -e reads its maps" 0 "$LP" -e "$maps print('maps: ' .. cuda_maps())"
expect_in "  no CUDA library mapped" "$tmp/out" "maps: none"

# one CPU training step of the MLP example; the maps are read when the
# script ends (or calls os.exit)
step="$maps
local exit = os.exit
os.exit = function(...) print('maps: ' .. cuda_maps()); io.stdout:flush(); return exit(...) end
arg = { [0] = 'examples/train_mlp.lua', '--steps', '1', '--microbatches', '2', '--layers', '1' }
dofile('examples/train_mlp.lua')
print('maps: ' .. cuda_maps())"
expect_rc "a CPU training step" 0 "$LP" -e "$step"
expect_in "  it trained" "$tmp/out" "step 1 loss"
expect_in "  no CUDA library mapped" "$tmp/out" "maps: none"
grep "^maps: " "$tmp/out" | grep -v "maps: none" | sed 's/^/  | /'
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  expect_rc "a CPU training step on 2 ranks" 0 timeout -k 5 120 \
    mpirun --oversubscribe -np 2 "$LP" -e "$step"
  n=$(grep -c "^maps: none" "$tmp/out")
  [ "$n" = 2 ] && ok "  no CUDA library mapped on either rank" ||
    { bad "  'maps: none' from $n of 2 ranks"; grep "^maps" "$tmp/out" | sed 's/^/  | /'; }
else
  echo "skip: no mpirun (2-rank check)"
fi

if ! "$LP" -v | grep -q "CUDA kernels: built"; then
  echo "skip: built without CUDA (no modules to open)"
  finish
  exit
fi
expect_rc "-v opens the modules" 0 "$LP" -e "$maps require('luapipe.core').kernels() print('maps: ' .. cuda_maps())"
expect_in "  the CUDA module and cuBLAS are mapped" "$tmp/out" "libcublas"
expect_in "  (the module itself)" "$tmp/out" "luapipe_cuda.so"

# the program without its modules
mkdir -p "$tmp/bin"
cp "$LP" "$tmp/bin/luapipe"
lone=$tmp/bin/luapipe
expect_rc "-v without the modules" 0 "$lone" -v
expect_in "  names the missing CUDA module and where it looked" "$tmp/out" \
  "CUDA backend: module luapipe_cuda.so not found (looked in $tmp/bin and $tmp/bin/../lib/luapipe)"
if "$LP" -v | grep -q "^NCCL module: "; then
  expect_in "  and the NCCL one" "$tmp/out" "NCCL backend: module luapipe_nccl.so not found"
fi
expect_rc "to('cuda') without the module" 0 "$lone" -e '
local nn = require("luapipe.nn")
local m = nn.sequential({ nn.linear(2, 2) }):build(1)
print(select(2, m:to("cuda")))'
expect_in "  says the module is missing" "$tmp/out" "CUDA backend: module luapipe_cuda.so not found"
expect_rc "--device cuda without the module" 1 "$lone" examples/train_mlp.lua --steps 1 --device cuda
[ "$(wc -l <"$tmp/err")" = 1 ] && ok "  one line" || { bad "  not one line"; sed 's/^/  | /' "$tmp/err"; }
expect_in "  names the missing module" "$tmp/err" \
  "luapipe.train: device 'cuda' requested but CUDA backend: module luapipe_cuda.so not found"
echo "not a shared object" >"$tmp/bin/luapipe_cuda.so"
expect_rc "-v with a broken module" 0 "$lone" -v
expect_in "  gives the loader's reason" "$tmp/out" "CUDA backend: cannot load $tmp/bin/luapipe_cuda.so: "
finish
