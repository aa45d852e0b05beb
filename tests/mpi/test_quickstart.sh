#!/usr/bin/env bash
# test_quickstart.sh LUAPIPE — the README's quick start runs as written: the
# shell blocks between <!-- quickstart --> and <!-- /quickstart --> in
# README.md, taken from the README itself, run with `bash -e` in a fresh
# folder where build/ is the program's build folder and examples/ the
# repository's (so what they write stays there), HOME a fresh folder too.
# The block that reads DeepSeek's trace (~/profile-data/train.json) runs
# when the trace is here (LUAPIPE_DEEPSEEK_TRACE, or
# ../shared/data/deepseek-profile/train.json beside the repository), put at
# the path the README names. Exits 77 without mpirun.
. "$(dirname "$0")/lib.sh"
src=$(cd "$(dirname "$0")/../.." && pwd)

# the quick start's ```sh blocks, one file each: $tmp/block1, $tmp/block2, ...
awk -v dir="$tmp" '/<!-- quickstart -->/ { on = 1; next } /<!-- \/quickstart -->/ { on = 0 }
  on && /^```sh$/ { n++; inside = 1; next } inside && /^```$/ { inside = 0; next }
  inside { print > (dir "/block" n) }' "$src/README.md"
[ -s "$tmp/block1" ] || { fail "README.md has no quick start between its markers"; exit 1; }
[ -s "$tmp/block2" ] || fail "the quick start has no block reading DeepSeek's trace"

run="$tmp/run"
mkdir -p "$run" "$tmp/home"
ln -s "$(cd "$(dirname "$luapipe")" && pwd)" "$run/build"
ln -s "$src/examples" "$run/examples"
# each block in one shell, as a user pastes it; stop at the first failing command
quick() { (cd "$run" && HOME="$tmp/home" timeout 500 bash -e "$tmp/$1") >"$tmp/$1.out" 2>&1; }

quick block1
rc=$?
[ "$rc" -eq 0 ] || { fail "the quick start's commands exited $rc"; tail -30 "$tmp/block1.out"; }
# what each step shows (the README's words for them)
want() {
  if grep -qF -- "$3" "$tmp/$1.out"; then echo "ok   $2"; else
    fail "$2: '$3' not in the output"; fi
}
want block1 "1. simulate a family" "simulated 'dualpipe': 4 ranks, 8 micro-batches"
want block1 "1. bubbles of every family" "DualPipeV"
want block1 "2. the schedule file simulates" "simulated 'mine': 4 ranks, 8 micro-batches"
want block1 "3. search writes its schedule" "wrote found.csv"
want block1 "3. the found schedule simulates" "simulated 'found'"
want block1 "4. training runs its steps" "step 20 loss"
want block1 "4. and checkpoints" "checkpoint after step 20 written to ckpt/step20"
want block1 "5. the resume starts after the checkpoint" "resumed from checkpoint ckpt/step20 (after step 20)"
want block1 "5. and runs to the end" "step 30 loss"
want block1 "6. the profile of the run's trace" "rank 1 (trace.json)"
grep -q "^step 21 loss" "$tmp/block1.out" && grep -q "^step 1 loss" "$tmp/block1.out" \
  && [ "$(grep -c '^step 1 loss' "$tmp/block1.out")" -eq 1 ] && echo "ok   the resume did not start over" \
  || fail "the resumed run did not continue at step 21"

# DeepSeek's trace, at the path the README names (~/profile-data/train.json)
trace=${LUAPIPE_DEEPSEEK_TRACE:-$src/../shared/data/deepseek-profile/train.json}
if [ -s "$tmp/block2" ] && [ -f "$trace" ]; then
  grep -qF "~/profile-data/train.json" "$tmp/block2" || fail "the DeepSeek block does not read ~/profile-data/train.json"
  mkdir -p "$tmp/home/profile-data"
  ln -s "$(cd "$(dirname "$trace")" && pwd)/$(basename "$trace")" "$tmp/home/profile-data/train.json"
  quick block2
  rc=$?
  [ "$rc" -eq 0 ] || { fail "the quick start's DeepSeek commands exited $rc"; tail -20 "$tmp/block2.out"; }
  want block2 "DeepSeek's trace read" "983 GPU operations on 3 streams"
  want block2 "its costs simulated" "DualPipe"
else
  echo "skip: DeepSeek's trace is not here ($trace), its quick start block not run"
fi
[ "$fails" -eq 0 ] && echo "all checks passed" || { echo "$fails check(s) failed"; exit 1; }
