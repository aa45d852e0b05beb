#!/usr/bin/env bash
# The main job: installs what is missing, builds, then shows what luapipe
# does — DualPipe's bubble table measured for every schedule family, the
# DualPipe schedule drawn in the terminal, and an SVG timeline and a
# Chrome/Perfetto trace written to out/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
lp="${LUAPIPE_BUILD_DIR:-$root/build}/luapipe"
out="$root/out"
mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1

echo
echo "== DualPipe's bubble table, measured (P=8 ranks, M=20 micro-batches) =="
"$lp" bubbles --pp 8 --microbatches 20 --cost F=1,B=2,W=1,FB=3

echo
echo "== The DualPipe schedule, P=8, M=20, simulated with F=1 B=2 W=1 F&B=3 =="
"$lp" simulate dualpipe --pp 8 --microbatches 20 --cost F=1,B=2,W=1,FB=3 \
  --svg "$out/dualpipe.svg" --trace "$out/dualpipe_trace.json"

echo
echo "Open $out/dualpipe.svg in a browser, and load $out/dualpipe_trace.json"
echo "in https://ui.perfetto.dev or chrome://tracing."
