#!/usr/bin/env bash
# test_partition_resume.sh LUAPIPE — the model partition of luapipe.train on
# 4 ranks (1f1b, the 8-layer MLP; run from the repo root; driver
# partition_check.lua): train{}'s default splits by measured cost and every
# rank gets the same bounds; a checkpoint written with partition = "layers"
# records its split in state.json, and a resume whose fresh split by cost
# would differ (costs forced: the last layer alone) uses the recorded one,
# says so once, and is bitwise the uninterrupted run; resumed on 2 ranks the
# load names the rank counts (not a missing record); a checkpoint without
# the record (state.json removed, as an older luapipe wrote) resumed with
# another split fails once, clearly, naming the split and the way out.
# Exits 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
mpirun=(timeout -k 5 60 mpirun --oversubscribe)
driver=tests/mpi/partition_check.lua

# run MODE [NP]: one job (4 ranks by default); its rc in $rc, stdout in
# $tmp/out, stderr in $tmp/err
run() {
  "${mpirun[@]}" -np "${2:-4}" "$luapipe" "$driver" "$1" "$tmp" >"$tmp/out" 2>"$tmp/err" </dev/null
  rc=$?
  echo "$1 on ${2:-4} ranks: rc $rc"
}

run cost
if [ "$rc" -eq 0 ] && [ "$(grep -c ': ok cost' "$tmp/out")" -eq 4 ]; then
  grep -m1 ': ok cost' "$tmp/out"
else
  fail "the default split by measured cost"; cat "$tmp/out" "$tmp/err"
fi

run full
[ "$rc" -eq 0 ] && [ "$(grep -c ': ok full 1-2 | 3-4 | 5-6 | 7-8' "$tmp/out")" -eq 4 ] ||
  { fail "the uninterrupted run by layers"; cat "$tmp/out" "$tmp/err"; }
run part
[ "$rc" -eq 0 ] && [ -f "$tmp/ckpt/step2/state.json" ] ||
  { fail "the checkpointed run"; cat "$tmp/out" "$tmp/err"; ls -R "$tmp/ckpt"; }
grep -q '"partition":{.*"bounds":\[\[1,2\],\[3,4\],\[5,6\],\[7,8\]\]' "$tmp/ckpt/step2/state.json" &&
  grep -q '"by":"layers"' "$tmp/ckpt/step2/state.json" ||
  { fail "state.json does not record the partition"; cat "$tmp/ckpt/step2/state.json"; }
cp -r "$tmp/ckpt" "$tmp/ckpt-copy"

run resume
if [ "$rc" -eq 0 ] && [ "$(grep -c ': ok resume' "$tmp/out")" -eq 4 ]; then
  grep -m1 ': ok resume' "$tmp/out"
else
  fail "the resume with another fresh split"; cat "$tmp/out" "$tmp/err"
fi
n=$(grep -c "luapipe.train: note: resuming with the partition $tmp/ckpt/step2/state.json records (by layers: layers 1-2 | 3-4 | 5-6 | 7-8), not partition = \"cost\"" "$tmp/err")
[ "$n" -eq 1 ] || { fail "the note on the recorded partition ($n times)"; cat "$tmp/err"; }
grep -q '"bounds":\[\[1,2\],\[3,4\],\[5,6\],\[7,8\]\]' "$tmp/ckpt/step4/state.json" ||
  fail "the resumed run's checkpoint does not keep the partition"

# a record of another stage count (4 ranks' checkpoint, 2 ranks now): the
# load names the difference, with no word of a missing record
run error 2
n=$(grep -c "4 ranks in the checkpoint, 2 in this run" "$tmp/err")
{ [ "$rc" -ne 0 ] && [ "$n" -eq 1 ] && ! grep -q "records no partition" "$tmp/err"; } ||
  { fail "resuming a 4-stage record on 2 ranks ($n ranks said it)"; cat "$tmp/out" "$tmp/err"; }

# a checkpoint without the record, resumed with another split
rm -rf "$tmp/ckpt"
mv "$tmp/ckpt-copy" "$tmp/ckpt"
rm "$tmp/ckpt/step2/state.json"
run error
n=$(grep -c "does not match the model: .* (the checkpoint records no partition, as an older luapipe wrote it, and this run split the model by cost as layers 1-2 | 3-4 | 5-7 | 8: if it was written with another split, resume with that partition, e.g. partition = \"layers\", the old default)" "$tmp/err")
{ [ "$rc" -ne 0 ] && [ "$n" -eq 1 ] && ! grep -q "stack traceback" "$tmp/err"; } ||
  { fail "resuming a checkpoint without a recorded partition ($n ranks said it)"; cat "$tmp/out" "$tmp/err"; }

if [ "$fails" -ne 0 ]; then
  echo "test_partition_resume: $fails failure(s)"
  exit 1
fi
echo "test_partition_resume: all passed"
