#!/usr/bin/env bash
# test_v3_phases.sh LUAPIPE — DualPipe's overlapped pair on DeepSeek-V3's
# blocks runs DeepSeek's 10 phases per layer in the order of its training
# profile (tests/mpi/v3_phases.lua: the measured trace's phase slices of
# every pair at pp 2 x ep 2; results equal one process: losses 1e-5, parameters 1e-4), and
# `luapipe profile --beside` prints that trace's phase table beside
# another's with one layer's order checked. Run from the repo root. Exits
# 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
timeout 120 mpirun --oversubscribe -np 4 "$luapipe" tests/mpi/v3_phases.lua "$tmp/trace.json" \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok$' "$tmp/out")" -ne 4 ]; then
  fail "v3 phases on 4 ranks (rc $rc)"
  cat "$tmp/out" "$tmp/err"
fi
"$luapipe" profile "$tmp/trace.json" --rank 1 --beside "$tmp/trace.json" >"$tmp/prof" 2>&1 ||
  { fail "luapipe profile --beside"; cat "$tmp/prof"; }
want="  one layer of the pair, A: combine(B), attn(F), mlp(B), dispatch(F), dispatch(B), mlp(W), mlp(F), attn(B), attn(W), combine(F) (DeepSeek's order)"
grep -qxF "$want" "$tmp/prof" || { fail "profile: one layer's order"; cat "$tmp/prof"; }
grep -qE '^  attn\(W\) +[0-9]+ ' "$tmp/prof" || { fail "profile: no attn(W) row beside"; cat "$tmp/prof"; }
[ "$fails" -eq 0 ] || exit 1
echo "ok"
