#!/usr/bin/env bash
# test_train_messages.sh LUAPIPE — what training prints a user: counted
# nouns ("1 rank"), a mistake in the options printed once under mpirun
# (no traceback per rank; every rank exits 2), --resume without
# --checkpoint in the example's own option names, one line per checkpoint
# written and on resume, interleaved1f1b's note when it has too few
# micro-batches, and chunks refused for a family that has none. Exits 77
# without mpirun.
set -u
luapipe=${1:?usage: test_train_messages.sh path/to/luapipe}
command -v mpirun >/dev/null || { echo "skip: no mpirun"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
mpirun=(timeout 120 mpirun --oversubscribe)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
# check NAME FILE TEXT: FILE has TEXT (a fixed string)
check() { if grep -qF -- "$3" "$2"; then ok "$1"; else fail "$1: '$3' not in:"; sed 's/^/  | /' "$2" | head -20; fi; }
# count NAME FILE TEXT N: TEXT occurs on N lines of FILE
count() { local n; n=$(grep -cF -- "$3" "$2"); [ "$n" -eq "$4" ] && ok "$1" ||
  { fail "$1: '$3' on $n lines, expected $4"; sed 's/^/  | /' "$2" | head -20; }; }
mlp=(examples/train_mlp.lua --layers 2 --width 8 --batch 4)

"$luapipe" "${mlp[@]}" --steps 1 >"$tmp/one" 2>&1
check "one process: 1 rank (not 1 ranks)" "$tmp/one" "train_mlp: 1f1b on 1 rank, 8 micro-batches of 4, 5 layers"
check "summary: 1 rank" "$tmp/one" "summary (1 measured step, 1 rank):"

# a mistake in the options: once, on rank 0, no traceback, exit 2 everywhere
"${mpirun[@]}" -np 3 "$luapipe" -e 'local nn = luapipe.nn
  luapipe.train { model = nn.sequential { nn.linear(2, 2) }, schedule = "1f1b", steps = "ten",
    data = function() return nn.tensor({ 1, 2 }), nn.tensor({ 1, 2 }) end }' >"$tmp/bad" 2>&1
rc=$?
[ "$rc" -eq 2 ] && ok "options error under mpirun: exit 2" || fail "options error under mpirun: exit $rc"
count "options error printed once" "$tmp/bad" "luapipe.train: 'steps' must be a non-negative integer, got \"ten\"" 1
count "no traceback" "$tmp/bad" "stack traceback" 0
check "named at the user's line" "$tmp/bad" "luapipe: (command line):2: luapipe.train: 'steps'"

# the examples' own usage errors: once, exit 2 on every rank
"${mpirun[@]}" -np 3 "$luapipe" "${mlp[@]}" --steps x >"$tmp/opt" 2>&1
rc=$?
[ "$rc" -eq 2 ] && ok "bad option under mpirun: exit 2" || fail "bad option under mpirun: exit $rc"
count "bad option printed once" "$tmp/opt" "train_mlp.lua: --steps must be an integer" 1
"${mpirun[@]}" -np 2 "$luapipe" examples/train_moe.lua --topk 9 >"$tmp/topk" 2>&1
rc=$?
[ "$rc" -eq 2 ] && ok "train_moe --topk 9 under mpirun: exit 2" || fail "train_moe --topk 9 under mpirun: exit $rc"
count "train_moe --topk 9 printed once" "$tmp/topk" "train_moe.lua: --topk 9 is more than --experts 8" 1

# --resume without --checkpoint, in the example's terms
"${mpirun[@]}" -np 2 "$luapipe" "${mlp[@]}" --resume >"$tmp/resume" 2>&1
rc=$?
[ "$rc" -eq 2 ] && ok "--resume alone: exit 2" || fail "--resume alone: exit $rc"
count "--resume alone: once, with the option names" "$tmp/resume" \
  "train_mlp.lua: --resume needs --checkpoint DIR, the directory the checkpoints were saved in" 1
count "--resume alone: not in Lua API terms" "$tmp/resume" "resume = true" 0

# checkpoints written and a resumed run say so (once, on rank 0)
"${mpirun[@]}" -np 2 "$luapipe" "${mlp[@]}" --steps 4 --checkpoint "$tmp/ck" --every 2 >"$tmp/save" 2>&1 ||
  fail "checkpointed run failed"
count "a line per checkpoint written" "$tmp/save" "checkpoint after step 2 written to $tmp/ck/step2" 1
count "the second checkpoint" "$tmp/save" "checkpoint after step 4 written to $tmp/ck/step4" 1
"${mpirun[@]}" -np 2 "$luapipe" "${mlp[@]}" --steps 5 --checkpoint "$tmp/ck" --every 2 --resume >"$tmp/res" 2>&1 ||
  fail "resumed run failed"
count "the resumed run says where from and what it runs" "$tmp/res" \
  "resumed from checkpoint $tmp/ck/step4 (after step 4): running steps 5..5" 1
check "the resumed run's step" "$tmp/res" "step 5 loss "

# interleaved1f1b with too few micro-batches for its steady state: a note
"${mpirun[@]}" -np 4 "$luapipe" "${mlp[@]}" --layers 6 --schedule interleaved1f1b --microbatches 6 --steps 1 >"$tmp/il" 2>&1 ||
  fail "interleaved1f1b m = 6 on 4 ranks failed"
count "interleaved note, once" "$tmp/il" "luapipe.train: note: with 6 micro-batches on 4 ranks, rank 0 runs every forward before any backward" 1
check "interleaved note names the count to use" "$tmp/il" "use 8 micro-batches or more"
"${mpirun[@]}" -np 4 "$luapipe" "${mlp[@]}" --layers 6 --schedule interleaved1f1b --microbatches 8 --steps 1 >"$tmp/il8" 2>&1 ||
  fail "interleaved1f1b m = 8 on 4 ranks failed"
count "no note with enough micro-batches" "$tmp/il8" "note:" 0
# chunks for a family without them: refused, once
"${mpirun[@]}" -np 2 "$luapipe" "${mlp[@]}" --schedule gpipe --chunks 3 --steps 1 >"$tmp/ch" 2>&1
rc=$?
[ "$rc" -eq 2 ] && ok "chunks for gpipe: exit 2" || fail "chunks for gpipe: exit $rc"
count "chunks for gpipe: refused once" "$tmp/ch" \
  "luapipe: luapipe.train: chunks = 3 applies to interleaved1f1b only; gpipe has a fixed placement (one model stage per rank)" 1

[ "$fails" -eq 0 ] && echo "all checks passed" || { echo "$fails check(s) failed"; exit 1; }
