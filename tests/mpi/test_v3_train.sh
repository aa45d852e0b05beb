#!/usr/bin/env bash
# test_v3_train.sh LUAPIPE — DeepSeek-V3 loaded from a checkpoint folder
# (tests/data/v3/v3_f32, luapipe.models.load) trained on 4 ranks equals one
# process (train.reference) within 1e-5, losses and every parameter, and
# train{save = DIR} writes a folder that loads back to the same model:
# DualPipe and DualPipeV at pp 2 x ep 2, 1F1B at pp 4, DualPipe at pp 2 x
# ep 2 with EPLB after every step (tests/mpi/v3_train.lua). Run from the
# repo root. Exits 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
for c in "dualpipe 2" "dualpipev 2" "1f1b 1" "dualpipe 2 eplb"; do
  rm -rf "$tmp/saved"
  V3_SAVE_DIR="$tmp/saved" timeout 120 mpirun --oversubscribe -np 4 "$luapipe" tests/mpi/v3_train.lua $c \
    >"$tmp/out" 2>"$tmp/err"
  rc=$?
  echo "$c: rc $rc"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne 4 ]; then
    fail "$c on 4 ranks"
    cat "$tmp/out" "$tmp/err"
  fi
  [ -f "$tmp/saved/config.json" ] && [ -f "$tmp/saved/model0-mp1.safetensors" ] || fail "$c: nothing saved"
done
[ "$fails" -eq 0 ] || exit 1
echo "ok"
