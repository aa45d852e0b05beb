#!/usr/bin/env bash
# test_checkpoint.sh LUAPIPE — checkpoint and resume of luapipe.train on 4
# ranks (run from the repo root). For 1f1b, zb1p (deferred weight-grads)
# and dualpipe (two copies of every stage) with AdamW, and dualpipe with a
# small transformer LM (embedding, attention, cross-entropy): 4 steps without a
# break; 2 steps with checkpoint = {every = 2}; then a new job with resume =
# true for steps 3..4, whose losses and final parameters must equal the
# uninterrupted run's bitwise (checkpoint_check.lua), and which leaves only
# the step-4 checkpoint. Then the clear errors (non-zero exit, message on
# every rank): a truncated rank file, a checkpoint of another placement
# (dualpipe; zb1p, the same placement as 1f1b, resumes it with a note),
# another rank count, and resume = true with no checkpoint. Then MoE: the
# MoE LM (router-bias balancing) at pp=2 x ep=2 with EPLB every 2 steps (one
# redundant slot, 3-step window) for 1f1b and dualpipe: 6 steps unbroken, 2
# checkpointed (after step 2's new placement), resumed for 3..6 — losses and
# final parameters bitwise the unbroken run's; and its errors: the checkpoint
# resumed without EPLB (state.json names eplb.every), a pp=1 x ep=2
# checkpoint resumed at pp=2 x ep=1 (EP size named), a format-version-1
# file (refused naming both versions). Exits 77 (skipped)
# without mpirun.
. "$(dirname "$0")/lib.sh"
mpirun=(timeout -k 5 60 mpirun --oversubscribe)
driver=tests/mpi/checkpoint_check.lua
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
T0=$(date +%s.%N)

# run NAME NP ARGS...: one job; its rc in $rc, output in $tmp/out
run() {
  local what=$1 np=$2
  shift 2
  local t0 t1
  t0=$(date +%s.%N)
  "${mpirun[@]}" -np "$np" "$luapipe" "$driver" "$@" >"$tmp/out" 2>&1 </dev/null
  rc=$?
  t1=$(date +%s.%N)
  echo "$what: rc $rc in $(elapsed "$t0" "$t1") s"
}

for fam in 1f1b zb1p dualpipe dualpipe:lm; do
  d=$tmp/${fam/:/-}
  mkdir -p "$d"
  run "$fam uninterrupted 4 steps" 4 "$fam" full "$d"
  [ "$rc" -eq 0 ] && [ "$(grep -c ': ok full' "$tmp/out")" -eq 4 ] ||
    { fail "$fam full run"; cat "$tmp/out"; continue; }
  run "$fam 2 steps, checkpoint every 2" 4 "$fam" part "$d"
  [ "$rc" -eq 0 ] && [ -f "$d/ckpt/latest" ] && [ "$(ls "$d/ckpt/step2" | grep -c '^rank[0-3]\.ckpt$')" -eq 4 ] ||
    { fail "$fam checkpointed run"; cat "$tmp/out"; ls -R "$d/ckpt"; continue; }
  grep -q '"step": 2' "$d/ckpt/latest" || fail "$fam: latest does not name step 2"
  run "$fam resume, steps 3..4" 4 "$fam" resume "$d"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok resume' "$tmp/out")" -ne 4 ]; then
    fail "$fam resume differs from the uninterrupted run"
    cat "$tmp/out"
    continue
  fi
  grep -m1 ': ok resume' "$tmp/out"
  # the step-4 checkpoint replaced step 2; no temporary files are left
  [ -d "$d/ckpt/step2" ] && fail "$fam: the step-2 checkpoint was not removed"
  [ "$(ls "$d/ckpt/step4" | grep -c '^rank[0-3]\.ckpt$')" -eq 4 ] || fail "$fam: no step-4 checkpoint"
  grep -q '"step": 4' "$d/ckpt/latest" || fail "$fam: latest does not name step 4"
  [ -z "$(find "$d/ckpt" -name '*.tmp')" ] || fail "$fam: temporary files left behind"
done

# errors: clear, printed once (by the first rank that failed, its own message),
# no traceback, every rank exits non-zero
d=$tmp/1f1b
if [ -f "$d/ckpt/step4/rank1.ckpt" ]; then
  # another schedule with the same placement (zb1p: model stage r on rank r,
  # as 1f1b) resumes it (on a copy, so the step-4 checkpoint stays), noted once
  mkdir -p "$tmp/other" && cp -r "$d/ckpt" "$tmp/other/ckpt"
  run "zb1p resuming a 1f1b checkpoint" 4 zb1p other "$tmp/other"
  n=$(grep -c "^luapipe.train: note: the checkpoint was written under schedule '1f1b', this run's is 'zb1p': it places the model stages on the ranks alike" "$tmp/out")
  ok=$(grep -c ": ok other zb1p (steps 5..6, losses finite)" "$tmp/out")
  { [ "$rc" -eq 0 ] && [ "$n" -eq 1 ] && [ "$ok" -eq 4 ]; } ||
    { fail "zb1p resuming 1f1b's checkpoint (noted $n times, $ok ranks ok)"; cat "$tmp/out"; }
  grep -q '"step": 6, .*"schedule": "zb1p"' "$tmp/other/ckpt/latest" || fail "zb1p's resume did not save step 6"
  # another placement (DualPipe: two virtual stages per rank): refused, naming
  # the schedule it was written under as the way out, once
  run "dualpipe resuming a 1f1b checkpoint" 4 dualpipe error "$d"
  n=$(grep -c "does not match this run: .* (it was written under schedule '1f1b', this run's is 'dualpipe': resume under '1f1b', or a schedule that places the model stages on the ranks alike)$" "$tmp/out")
  { [ "$rc" -ne 0 ] && [ "$n" -eq 1 ] && ! grep -q "stack traceback" "$tmp/out"; } ||
    { fail "placement mismatch ($n ranks said it)"; cat "$tmp/out"; }
  # another rank count
  run "1f1b on 2 ranks resuming a 4-rank checkpoint" 2 1f1b error "$d"
  n=$(grep -c "4 ranks in the checkpoint, 2 in this run" "$tmp/out")
  { [ "$rc" -ne 0 ] && [ "$n" -eq 1 ]; } || { fail "rank-count mismatch ($n ranks said it)"; cat "$tmp/out"; }
  # a truncated file (a copy, so the good one stays)
  cp -r "$d/ckpt" "$tmp/cut-ckpt-copy"
  mkdir -p "$tmp/cut" && mv "$tmp/cut-ckpt-copy" "$tmp/cut/ckpt"
  f=$tmp/cut/ckpt/step4/rank1.ckpt
  truncate -s $(($(stat -c %s "$f") / 2)) "$f"
  run "resume from a truncated rank1.ckpt" 4 1f1b error "$tmp/cut"
  n1=$(grep -c "rank 1: checkpoint $f is truncated or corrupt" "$tmp/out")
  n=$(grep -c "loading checkpoint $tmp/cut/ckpt/step4 failed on rank 1" "$tmp/out")
  { [ "$rc" -ne 0 ] && [ "$n1" -eq 1 ] && [ "$n" -eq 0 ]; } ||
    { fail "truncated checkpoint ($n1 + $n ranks said it)"; cat "$tmp/out"; }
fi
mkdir -p "$tmp/empty"
run "resume = true without a checkpoint" 4 1f1b error "$tmp/empty"
n=$(grep -c "resume = true, but there is no checkpoint in '$tmp/empty/ckpt'" "$tmp/out")
{ [ "$rc" -ne 0 ] && [ "$n" -eq 1 ] && ! grep -q "stack traceback" "$tmp/out"; } ||
  { fail "missing checkpoint ($n ranks said it)"; cat "$tmp/out"; }

# MoE with router bias and EPLB: resume is bitwise the unbroken run
for fam in 1f1b:moe2 dualpipe:moe2; do
  d=$tmp/${fam/:/-}
  mkdir -p "$d"
  run "$fam (pp 2 x ep 2, EPLB every 2) uninterrupted 6 steps" 4 "$fam" full "$d" 6
  [ "$rc" -eq 0 ] && [ "$(grep -c ': ok full.* eplb 3 plans' "$tmp/out")" -eq 4 ] ||
    { fail "$fam full run"; cat "$tmp/out"; continue; }
  run "$fam 2 steps, checkpoint every 2" 4 "$fam" part "$d"
  [ "$rc" -eq 0 ] && [ -f "$d/ckpt/step2/state.json" ] ||
    { fail "$fam checkpointed run"; cat "$tmp/out"; ls -R "$d/ckpt"; continue; }
  grep -q '"redundant":1' "$d/ckpt/step2/state.json" || fail "$fam: state.json lacks the EPLB state"
  run "$fam resume, steps 3..6" 4 "$fam" resume "$d" 6
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok resume' "$tmp/out")" -ne 4 ]; then
    fail "$fam resume differs from the uninterrupted run"
    cat "$tmp/out"
    continue
  fi
  grep -m1 ': ok resume' "$tmp/out"
  [ -d "$d/ckpt/step2" ] && fail "$fam: the step-2 checkpoint (with its state.json) was not removed"
  [ -f "$d/ckpt/step6/state.json" ] || fail "$fam: no step-6 state.json"
done
d=$tmp/1f1b-moe2
if [ -f "$d/ckpt/step6/rank0.ckpt" ]; then
  run "1f1b:moe2 resumed without EPLB" 4 1f1b:moe2 error "$d" 8 noeplb
  n=$(grep -c "checkpoint $d/ckpt/step6/state.json does not match this run: eplb.every 2 in the checkpoint, none in this run" "$tmp/out")
  { [ "$rc" -ne 0 ] && [ "$n" -eq 1 ]; } || { fail "EPLB mismatch ($n ranks said it)"; cat "$tmp/out"; }
fi
d=$tmp/ep
mkdir -p "$d"
run "1f1b:moe2 at pp 1 x ep 2, checkpoint after 2 steps" 2 1f1b:moe2 part "$d"
if [ "$rc" -eq 0 ]; then
  run "pp 2 x ep 1 resuming a pp 1 x ep 2 checkpoint" 2 1f1b:moe1 error "$d"
  n=$(grep -c "checkpoint $d/ckpt/step2/rank[01].ckpt does not match this run: .*EP size 2 in the checkpoint, 1 in this run" "$tmp/out")
  { [ "$rc" -ne 0 ] && [ "$n" -eq 1 ]; } || { fail "EP size mismatch ($n ranks said it)"; cat "$tmp/out"; }
  # a format-version-1 file (written before MoE records) is refused by name
  f=$d/ckpt/step2/rank1.ckpt
  printf '\001\000\000\000' | dd of="$f" bs=1 seek=8 conv=notrunc 2>/dev/null
  run "resume from a version-1 rank1.ckpt" 2 1f1b:moe2 error "$d"
  n=$(grep -c "rank 1: checkpoint $f has format version 1; this luapipe reads versions 2 to 3 (version 1 has no expert placements" "$tmp/out")
  { [ "$rc" -ne 0 ] && [ "$n" -eq 1 ]; } || { fail "version-1 file ($n ranks said it)"; cat "$tmp/out"; }
else
  fail "1f1b:moe2 on 2 ranks"
  cat "$tmp/out"
fi

echo "total $(elapsed "$T0" "$(date +%s.%N)") s"
if [ "$fails" -ne 0 ]; then
  echo "test_checkpoint: $fails failure(s)"
  exit 1
fi
echo "test_checkpoint: all passed"
