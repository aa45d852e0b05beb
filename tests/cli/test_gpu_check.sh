#!/usr/bin/env bash
# scripts/gpu-check.sh on a machine without a GPU: it checks what needs no
# device (the binaries start, the CPU half of the char-LM bench runs),
# reports "no device" for the rest, writes its logs and table, exits 0.
# Exits 77 (skipped) where a CUDA device is visible: there the script runs
# the real device checks, which scripts/gpu-check.sh is for.
. "$(dirname "$0")/lib.sh"
devices=$("$LP" -e 'print(require("luapipe.core").kernels().devices)')
[ "$devices" = 0 ] || { echo "skip: a CUDA device is visible"; exit 77; }
root=$(cd "$(dirname "$0")/../.." && pwd)
expect_rc "gpu-check without a device exits 0" 0 \
  env GPU_CHECK_BIN="$(dirname "$LP")" "$root/scripts/gpu-check.sh" "$tmp/logs"
expect_in "says no device" "$tmp/out" "gpu-check: no device"
expect_in "binaries start" "$tmp/logs/table.txt" "start      ok"
expect_in "CPU half of the LM bench" "$tmp/logs/table.txt" "lm-cpu     ok"
expect_in "device row" "$tmp/logs/table.txt" "device     none"
expect_in "device checks skipped" "$tmp/logs/table.txt" "twins      skip   no device"
expect_in "the --device cuda training check skipped" "$tmp/logs/table.txt" "lm-train   skip   no device"
[ "$(tail -1 "$tmp/out")" = "$(tail -1 "$tmp/logs/table.txt")" ] &&
  ok "the table is printed last" || bad "the table is not the last output"
expect_rc "no OUTDIR is a usage error" 2 "$root/scripts/gpu-check.sh"
expect_in "usage text" "$tmp/err" "usage: scripts/gpu-check.sh OUTDIR"
finish
