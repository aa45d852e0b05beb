#!/usr/bin/env bash
# test_v3_train.sh LUAPIPE — DeepSeek-V3 loaded from a checkpoint folder
# (tests/data/v3/v3_f32, luapipe.models.load) trained on 4 ranks equals one
# process (train.reference): losses within 1e-5, every parameter within 1e-5
# with SGD and 1e-4 with AdamW (relative L2: AdamW moves an element whose
# gradient is float noise by up to lr, whatever the sums' order), and
# train{save = DIR} writes a folder that loads back to the same model:
# DualPipe and DualPipeV at pp 2 x ep 2, 1F1B at pp 4, DualPipe at pp 2 x
# ep 2 with EPLB after every step (tests/mpi/v3_train.lua); the v3_sparse
# fixture (experts without tokens in a step) the same way, also resumed
# from a checkpoint. Run from the
# repo root. Exits 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
for run in "adamw dualpipe 2" "adamw dualpipev 2" "adamw 1f1b 1" "adamw dualpipe 2 eplb" \
  "sgd dualpipe 2" "sgd dualpipev 2 eplb"; do
  read -r optim c <<<"$run"
  rm -rf "$tmp/saved"
  V3_OPTIM=$optim V3_SAVE_DIR="$tmp/saved" timeout 120 mpirun --oversubscribe -np 4 "$luapipe" tests/mpi/v3_train.lua $c \
    >"$tmp/out" 2>"$tmp/err"
  rc=$?
  echo "$optim $c: rc $rc"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne 4 ]; then
    fail "$c on 4 ranks"
    cat "$tmp/out" "$tmp/err"
  fi
  [ -f "$tmp/saved/config.json" ] && [ -f "$tmp/saved/model0-mp1.safetensors" ] || fail "$c: nothing saved"
done
# v3_sparse: experts without tokens in a step are left alone by AdamW as
# torch leaves them (grad None), their step counts moving with EPLB and
# kept in checkpoints: 5 steps, and 3 + a resumed 2, equal one process
# within 1e-5, parameters too
for resume in "" "$tmp/resume"; do
  rm -rf "$tmp/saved" "$tmp/resume"
  [ -n "$resume" ] && mkdir -p "$resume"
  V3_CASE=v3_sparse V3_RESUME=$resume V3_SAVE_DIR="$tmp/saved" timeout 120 mpirun --oversubscribe -np 4 \
    "$luapipe" tests/mpi/v3_train.lua dualpipe 2 eplb >"$tmp/out" 2>"$tmp/err"
  rc=$?
  echo "v3_sparse dualpipe 2 eplb${resume:+ resumed}: rc $rc"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne 4 ]; then
    fail "v3_sparse${resume:+ resumed} on 4 ranks"
    cat "$tmp/out" "$tmp/err"
  fi
done
# hf_fp8 (Hugging Face's names, 2 shards + index, FP8): trained the same
# way and saved by train{save =} into the same two shards and an index
rm -rf "$tmp/saved"
V3_CASE=hf_fp8 V3_SAVE_DIR="$tmp/saved" timeout 120 mpirun --oversubscribe -np 4 "$luapipe" \
  tests/mpi/v3_train.lua dualpipe 2 eplb >"$tmp/out" 2>"$tmp/err"
rc=$?
echo "hf_fp8 dualpipe 2 eplb: rc $rc"
if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne 4 ]; then
  fail "hf_fp8 on 4 ranks"
  cat "$tmp/out" "$tmp/err"
fi
for f in model-00001-of-00002.safetensors model-00002-of-00002.safetensors model.safetensors.index.json; do
  [ -f "$tmp/saved/$f" ] || fail "hf_fp8: $f not saved"
done
[ -e "$tmp/saved/model.safetensors" ] && fail "hf_fp8: saved as one model.safetensors"
[ "$fails" -eq 0 ] || exit 1
echo "ok"
