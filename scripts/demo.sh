#!/usr/bin/env bash
# The main job: installs what is missing, builds, then shows what luapipe
# does — DualPipe's bubble table measured for every schedule family, the
# DualPipe schedule drawn in the terminal, and an SVG timeline and a
# Chrome/Perfetto trace written to out/; then it trains the char-LM example
# with DualPipe on 4 ranks (mpirun): the schedule, the progress lines with
# the falling loss, the measured-vs-simulated summary, and the measured
# trace and SVG (out/char_lm_trace.json, out/char_lm.svg); then a short
# MoE run (DualPipe at pp=2 x ep=2 with EPLB, out/moe_trace.json). The whole
# demo took 80 s on a shared 2-core machine with everything built (the
# README's figure; the char-LM training 76 s of it) and prints the time each
# training took.
#
# To add a training run, add one `train` line at the end (see below).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
lp="${LUAPIPE_BUILD_DIR:-$root/build}/luapipe"
out="$root/out"
mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# train TITLE RANKS SCRIPT [ARGS...]: one training run on RANKS processes
# (mpirun --oversubscribe), under a heading, timed.
train() {
  local title=$1 ranks=$2
  shift 2
  echo
  echo "== Training: $title =="
  if ! command -v mpirun >/dev/null; then
    echo "(skipped: mpirun not found; scripts/install-deps.sh installs Open MPI)"
    return
  fi
  local t0=$SECONDS
  (cd "$root" && mpirun --oversubscribe -np "$ranks" "$lp" "$@")
  echo "(training took $((SECONDS - t0)) s)"
}

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

echo
echo "The char-LM run below: mpirun -np 4, one process per rank; rank 0 prints the"
echo "schedule, a progress line every 25 steps (loss in nats per character, samples/s,"
echo "measured bubble) and the summary: measured step time against the simulator's"
echo "prediction from the measured costs. About 75 s on 2 shared cores."
train "a character-level transformer LM with DualPipe on 4 ranks (150 steps)" 4 \
  examples/train_char_lm.lua --schedule dualpipe --microbatches 8 --steps 150 --seed 1 \
  --log-every 25 --show --trace "$out/char_lm_trace.json" --trace-steps 20 --svg "$out/char_lm.svg"
echo "The measured timeline of training: $out/char_lm_trace.json (the last 20 steps,"
echo "every rank; open it in https://ui.perfetto.dev) and $out/char_lm.svg (the last step)."

echo
echo "The MoE run below: a char-level mixture-of-experts LM, DualPipe at pp=2 x ep=2"
echo "(4 ranks): experts spread over 2 EP ranks per pipeline rank, tokens exchanged by"
echo "all-to-all-v over an emulated link; every 5 steps EPLB re-plans with 1 redundant"
echo "slot per EP rank and moves expert weights between ranks. The summary ends with the"
echo "share of all-to-all time hidden under compute and the expert load before -> after."
train "a mixture-of-experts LM, DualPipe at pp=2 x ep=2 with EPLB (20 steps)" 4 \
  examples/train_moe.lua --schedule dualpipe --pp 2 --ep 2 --microbatches 8 --steps 20 \
  --seed 1 --redundant 1 --eplb-every 5 --link lat=50us,bw=2GB/s --trace "$out/moe_trace.json"
echo "The measured MoE trace (all-to-alls on each rank's comm track): $out/moe_trace.json"
