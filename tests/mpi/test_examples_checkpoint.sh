#!/usr/bin/env bash
# test_examples_checkpoint.sh LUAPIPE — the options every training example
# takes (luapipe.cli.train_options), run as a user types them, from the repo
# root:
#  - checkpoint and resume in each example (train_mlp, train_char_lm,
#    train_moe): a run checkpointed every N steps also saves after its last
#    step (which is no multiple of N), and a resumed job prints the very
#    step lines of the run that never stopped;
#  - --schedule takes a file from `luapipe search -o` (.csv, .json) or a .lua
#    schedule file in every example; a file for other ranks or micro-batch
#    counts, or one that does not load, is one line naming the file (exit 2);
#  - resuming under another schedule with the same placement is noted once;
#    another placement is refused naming the schedule to resume under;
#  - train_char_lm --eval-every / --sample: the held-out loss of the model
#    gathered from the ranks equals the one-process run's, and N characters
#    are printed;
#  - train_moe --svg / --trace-steps, and no header for a job of the wrong
#    size;
#  - state.json records the run's precision; resuming a checkpoint of the
#    other precision (float32 masters either way) is said once, naming both;
#  - stopped as Ctrl-C to mpirun stops it (SIGTERM to every rank): rank 0
#    names, once, the checkpoint a resume would start from.
# Exits 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
mpirun=(timeout -k 5 120 mpirun --oversubscribe)

# ex NAME NP SCRIPT ARGS...: one job; rc in $rc, stdout+stderr in $tmp/NAME
ex() {
  local name=$1 np=$2 script=$3
  shift 3
  "${mpirun[@]}" -np "$np" "$luapipe" "examples/$script" "$@" >"$tmp/$name" 2>&1 </dev/null
  rc=$?
  echo "$name: rc $rc"
}
# steps FILE FIRST LAST: the "step K loss X" lines for K in FIRST..LAST
steps() { awk -v a="$2" -v b="$3" '/^step [0-9]+ loss / && $2 >= a && $2 <= b { print $1, $2, $3, $4 }' "$1"; }
# once FILE TEXT: TEXT (a fixed string) is a whole line of FILE exactly once
once() { [ "$(grep -cxF -- "$2" "$1")" -eq 1 ]; }

# ---- checkpoint, the final save, resume: every example ----
# (partition by layers: the split of a measured cost could differ from job to job)
mlp=(train_mlp.lua --seed 3 --partition layers --log-every 1)
lm=(train_char_lm.lua --seed 2 --partition layers --dim 16 --heads 2 --blocks 2 --context 16 --batch 2)
moe=(train_moe.lua --pp 2 --ep 2 --seed 4 --partition layers --blocks 2 --dim 16 --hidden 16 --context 16)
check_resume() { # NAME NP STEPS PART EVERY ARGS...: unbroken STEPS, PART checkpointed every EVERY, then resumed
  local name=$1 np=$2 total=$3 part=$4 every=$5
  shift 5
  local ck=$tmp/ck-$name
  ex "$name-unbroken" "$np" "$@" --steps "$total"
  [ "$rc" -eq 0 ] || { fail "$name unbroken run"; cat "$tmp/$name-unbroken"; return; }
  ex "$name-part" "$np" "$@" --steps "$part" --checkpoint "$ck" --every "$every"
  # every EVERY-th step, and the last (PART is no multiple of EVERY)
  local want=() k
  for ((k = every; k <= part; k += every)); do want+=("$k"); done
  want+=("$part")
  for k in "${want[@]}"; do
    once "$tmp/$name-part" "checkpoint after step $k written to $ck/step$k" ||
      fail "$name: no 'checkpoint after step $k' line"
  done
  { [ "$rc" -eq 0 ] && grep -q "\"step\": $part," "$ck/latest" && [ -f "$ck/step$part/rank0.ckpt" ] &&
    [ "$(ls "$ck" | grep -c '^step')" -eq 1 ]; } ||
    { fail "$name: the last step ($part) is not the checkpoint left"; cat "$tmp/$name-part"; ls -R "$ck"; }
  ex "$name-resume" "$np" "$@" --steps "$total" --checkpoint "$ck" --every "$every" --resume
  once "$tmp/$name-resume" "resumed from checkpoint $ck/step$part (after step $part): running steps $((part + 1))..$total" ||
    fail "$name: no 'resumed from' line"
  if [ "$rc" -ne 0 ] || [ "$(steps "$tmp/$name-resume" 1 "$total")" != "$(steps "$tmp/$name-unbroken" $((part + 1)) "$total")" ] ||
    [ -z "$(steps "$tmp/$name-resume" 1 "$total")" ]; then
    fail "$name: the resumed steps differ from the unbroken run's"
    diff <(steps "$tmp/$name-unbroken" $((part + 1)) "$total") <(steps "$tmp/$name-resume" 1 "$total")
    cat "$tmp/$name-resume"
  fi
}
check_resume mlp 2 10 6 4 "${mlp[@]}"
check_resume char_lm 2 6 3 2 "${lm[@]}"
check_resume moe 4 4 3 2 "${moe[@]}"

# --resume auto: with no checkpoint yet, a fresh start; then a resume
ex mlp-auto 2 "${mlp[@]}" --steps 3 --checkpoint "$tmp/ck-auto" --every 2 --resume auto
{ [ "$rc" -eq 0 ] && [ "$(steps "$tmp/mlp-auto" 1 3)" = "$(steps "$tmp/mlp-unbroken" 1 3)" ]; } ||
  { fail "mlp --resume auto without a checkpoint"; cat "$tmp/mlp-auto"; }
ex mlp-auto2 2 "${mlp[@]}" --steps 5 --checkpoint "$tmp/ck-auto" --every 2 --resume auto
{ [ "$rc" -eq 0 ] && once "$tmp/mlp-auto2" "resumed from checkpoint $tmp/ck-auto/step3 (after step 3): running steps 4..5" &&
  [ "$(steps "$tmp/mlp-auto2" 1 5)" = "$(steps "$tmp/mlp-unbroken" 4 5)" ]; } ||
  { fail "mlp --resume auto with a checkpoint"; cat "$tmp/mlp-auto2"; }
ex mlp-resume-x 2 "${mlp[@]}" --steps 5 --checkpoint "$tmp/ck-auto" --resume x
{ [ "$rc" -eq 2 ] && once "$tmp/mlp-resume-x" "train_mlp.lua: --resume takes no value, or 'auto' (resume if there is a checkpoint, else start afresh), got 'x'"; } ||
  { fail "mlp --resume x"; cat "$tmp/mlp-resume-x"; }

# ---- resume under another schedule ----
ck=$tmp/ck-mlp # 1f1b's, after step 10
if [ -f "$ck/step10/rank0.ckpt" ]; then
  cp -r "$ck" "$tmp/ck-other"
  ex mlp-zb1p 2 "${mlp[@]}" --schedule zb1p --steps 12 --checkpoint "$tmp/ck-other" --resume
  { [ "$rc" -eq 0 ] && once "$tmp/mlp-zb1p" "luapipe.train: note: the checkpoint was written under schedule '1f1b', this run's is 'zb1p': it places the model stages on the ranks alike, so parameters and optimizer state carry over (they do not depend on the schedule)" &&
    [ "$(steps "$tmp/mlp-zb1p" 11 12 | wc -l)" -eq 2 ]; } ||
    { fail "mlp: zb1p resuming 1f1b's checkpoint"; cat "$tmp/mlp-zb1p"; }
  ex mlp-interleaved 2 "${mlp[@]}" --schedule interleaved1f1b --steps 12 --checkpoint "$ck" --resume
  n=$(grep -c "^luapipe: luapipe.train: rank [01]: checkpoint $ck/step10/rank[01].ckpt does not match this run: .* (it was written under schedule '1f1b', this run's is 'interleaved1f1b': resume under '1f1b', or a schedule that places the model stages on the ranks alike)$" "$tmp/mlp-interleaved")
  { [ "$rc" -ne 0 ] && [ "$n" -eq 1 ] && ! grep -q traceback "$tmp/mlp-interleaved"; } ||
    { fail "mlp: interleaved1f1b resuming 1f1b's checkpoint (said $n times)"; cat "$tmp/mlp-interleaved"; }
fi

# ---- schedule files ----
"$luapipe" search --pp 2 -m 4 --time 0.2 -o "$tmp/found.csv" >/dev/null 2>&1 || fail "search -o found.csv"
"$luapipe" search --pp 2 -m 4 --time 0.2 -o "$tmp/found.json" >/dev/null 2>&1 || fail "search -o found.json"
ex file-mlp-csv 2 "${mlp[@]}" --schedule "$tmp/found.csv" --steps 3
{ [ "$rc" -eq 0 ] && once "$tmp/file-mlp-csv" "train_mlp: $tmp/found.csv on 2 ranks, 4 micro-batches of 16, 11 layers" &&
  [ "$(steps "$tmp/file-mlp-csv" 1 3 | wc -l)" -eq 3 ]; } || { fail "train_mlp --schedule found.csv"; cat "$tmp/file-mlp-csv"; }
ex file-lm-json 2 "${lm[@]}" --schedule "$tmp/found.json" --steps 2
{ [ "$rc" -eq 0 ] && grep -q "^train_char_lm: $tmp/found.json on 2 ranks, .*, 4 micro-batches of 2x16 chars$" "$tmp/file-lm-json" &&
  [ "$(steps "$tmp/file-lm-json" 1 2 | wc -l)" -eq 2 ]; } || { fail "train_char_lm --schedule found.json"; cat "$tmp/file-lm-json"; }
ex file-moe-csv 4 "${moe[@]}" --schedule "$tmp/found.csv" --steps 2
{ [ "$rc" -eq 0 ] && grep -q "^train_moe: $tmp/found.csv on pp 2 x ep 2 = 4 ranks, .* 4 micro-batches of 4x16 chars$" "$tmp/file-moe-csv" &&
  [ "$(steps "$tmp/file-moe-csv" 1 2 | wc -l)" -eq 2 ]; } || { fail "train_moe --schedule found.csv"; cat "$tmp/file-moe-csv"; }
# a .lua schedule file gets the run's pp and micro-batches
ex file-mlp-lua 2 "${mlp[@]}" --schedule examples/eager_1f1b.lua --microbatches 6 --steps 2
{ [ "$rc" -eq 0 ] && once "$tmp/file-mlp-lua" "train_mlp: examples/eager_1f1b.lua on 2 ranks, 6 micro-batches of 16, 11 layers"; } ||
  { fail "train_mlp --schedule eager_1f1b.lua"; cat "$tmp/file-mlp-lua"; }
# ... checked against the run, once, exit 2, before any header or step
bad_file() { # NAME NP MESSAGE ARGS...
  local name=$1 np=$2 msg=$3
  shift 3
  ex "$name" "$np" "${mlp[@]}" --steps 1 "$@"
  { [ "$rc" -eq 2 ] && once "$tmp/$name" "$msg" && ! grep -qE "^(train_mlp:|step )|traceback" "$tmp/$name"; } ||
    { fail "$name: rc $rc"; cat "$tmp/$name"; }
}
bad_file file-ranks 4 "luapipe: schedule file $tmp/found.csv is for 2 pipeline ranks, but this run has 4 (mpirun -np 4): run it with mpirun -np 2, or make a schedule for 4 (luapipe search --pp 4)" \
  --schedule "$tmp/found.csv"
bad_file file-mb 2 "luapipe: schedule file $tmp/found.json has 4 micro-batches per step, but this run asks for 6 (microbatches = 6): leave it out to take the file's, or make a schedule for 6 (luapipe search -m 6)" \
  --schedule "$tmp/found.json" --microbatches 6
bad_file file-missing 2 "luapipe: cannot load the schedule file $tmp/none.csv: No such file or directory" \
  --schedule "$tmp/none.csv"
ex file-chunks 2 "${mlp[@]}" --steps 1 --schedule "$tmp/found.csv" --chunks 2
{ [ "$rc" -eq 2 ] && once "$tmp/file-chunks" "train_mlp.lua: --chunks applies to a family (interleaved1f1b); the schedule file $tmp/found.csv has its own placement"; } ||
  { fail "file-chunks: rc $rc"; cat "$tmp/file-chunks"; }

# ---- train_char_lm: held-out loss and samples ----
ex lm-eval 2 "${lm[@]}" --steps 4 --eval-every 2 --sample 30
ex lm-eval-1 1 "${lm[@]}" --steps 4 --eval-every 2
# DualPipe: two copies of every model stage, each rank holding two stages
ex lm-eval-dp 2 "${lm[@]}" --steps 4 --eval-every 2 --schedule dualpipe
for k in 2 4; do
  a=$(grep "^eval after step $k: held-out loss " "$tmp/lm-eval" | awk '{print $7}')
  b=$(grep "^eval after step $k: held-out loss " "$tmp/lm-eval-1" | awk '{print $7}')
  c=$(grep "^eval after step $k: held-out loss " "$tmp/lm-eval-dp" | awk '{print $7}')
  echo "held-out loss after step $k: 2 ranks $a (dualpipe $c), one process $b"
  [ "$(grep -c "^eval after step $k: held-out loss [0-9.]* (256 characters)$" "$tmp/lm-eval")" -eq 1 ] &&
    awk -v a="$a" -v b="$b" -v c="$c" 'BEGIN { d = a - b; e = c - b; if (d < 0) d = -d; if (e < 0) e = -e
      exit !(a > 0 && d < 1e-4 && e < 1e-4) }' ||
    { fail "char_lm: held-out loss after step $k"; cat "$tmp/lm-eval" "$tmp/lm-eval-1" "$tmp/lm-eval-dp"; }
done
{ [ "$rc" -eq 0 ] && once "$tmp/lm-eval" "sample (30 characters, greedy):" &&
  [ "$(grep -A1 -xF "sample (30 characters, greedy):" "$tmp/lm-eval" | tail -1 | tr -d '\n' | wc -c)" -eq 30 ]; } ||
  { fail "char_lm --sample 30"; cat "$tmp/lm-eval"; }
ex lm-sample-t 2 "${lm[@]}" --steps 1 --sample 20 --temperature 1 --seed 5
once "$tmp/lm-sample-t" "sample (20 characters, temperature 1, seed 5):" || { fail "char_lm --temperature 1"; cat "$tmp/lm-sample-t"; }

# ---- train_moe: --svg, --trace-steps; no header for a job of the wrong size ----
ex moe-svg 4 "${moe[@]}" --steps 3 --svg "$tmp/moe.svg" --trace "$tmp/moe.json" --trace-steps 1
{ [ "$rc" -eq 0 ] && grep -q 'measured last step' "$tmp/moe.svg" &&
  once "$tmp/moe-svg" "measured SVG timeline (last step) written to $tmp/moe.svg"; } || { fail "train_moe --svg"; cat "$tmp/moe-svg"; }
cat >"$tmp/markers.lua" <<'LUA'
local t = require("luapipe.json").decode(assert(io.open(arg[1])):read("a"))
local n = {}
for _, e in ipairs(t.traceEvents) do if e.ph == "i" and e.name:match("^step ") then n[#n + 1] = e.name end end
table.sort(n)
print(table.concat(n, ","))
LUA
markers=$("$luapipe" "$tmp/markers.lua" "$tmp/moe.json" 2>&1)
[ "$markers" = "step 3,step 3,step 3,step 3" ] || fail "train_moe --trace-steps 1: step markers $markers"
ex moe-3 3 train_moe.lua --pp 2 --ep 2 --steps 1
{ [ "$rc" -ne 0 ] && once "$tmp/moe-3" "luapipe: pp x ep = 2 x 2 needs 4 ranks, but mpirun started 3 (run it with mpirun -np 4)" &&
  ! grep -q "^train_moe:" "$tmp/moe-3"; } || { fail "train_moe on 3 ranks for pp 2 x ep 2"; cat "$tmp/moe-3"; }

# ---- precision: state.json records it; another precision resumes, said once ----
ck=$tmp/ck-prec
ex lm-f32 2 "${lm[@]}" --steps 2 --checkpoint "$ck" --every 2
{ [ "$rc" -eq 0 ] && grep -q '"precision": *"f32"' "$ck/step2/state.json"; } ||
  { fail "state.json of an f32 run does not record its precision"; cat "$tmp/lm-f32" "$ck/step2/state.json"; }
ex lm-bf16 2 "${lm[@]}" --steps 4 --checkpoint "$ck" --every 2 --resume --precision bf16
{ [ "$rc" -eq 0 ] && once "$tmp/lm-bf16" "luapipe.train: note: checkpoint $ck/step2/state.json was trained at precision f32, this run trains at bf16: its master weights and optimizer state are float32 either way, so it resumes from them at bf16" &&
  [ "$(grep -c "was trained at precision" "$tmp/lm-bf16")" -eq 1 ] &&
  grep -q '"precision": *"bf16"' "$ck/step4/state.json" && [ -n "$(steps "$tmp/lm-bf16" 3 4)" ]; } ||
  { fail "resuming an f32 checkpoint at bf16"; cat "$tmp/lm-bf16"; }
# the same precision again: nothing said
ex lm-bf16b 2 "${lm[@]}" --steps 5 --checkpoint "$ck" --every 1 --resume --precision bf16
{ [ "$rc" -eq 0 ] && ! grep -q "was trained at precision" "$tmp/lm-bf16b"; } ||
  { fail "resuming a bf16 checkpoint at bf16"; cat "$tmp/lm-bf16b"; }

# ---- stopped by a signal: where a resume would start, once ----
ck=$tmp/ck-sig
timeout -k 5 120 mpirun --oversubscribe -np 2 "$luapipe" examples/train_mlp.lua --steps 100000000 \
  --checkpoint "$ck" --every 5 --log-every 100000 >"$tmp/sig" 2>&1 </dev/null &
pid=$!
for _ in $(seq 600); do grep -q "^checkpoint after step 10 " "$tmp/sig" && break; sleep 0.1; done
# what mpirun does on Ctrl-C: SIGTERM to every rank (sent here to the ranks
# themselves: mpirun, taking a job down on SIGINT, sometimes drops the
# ranks' last output, whatever it is)
ranks=$(for m in $(pgrep -P "$pid"); do pgrep -P "$m"; done)
echo "ranks: $(echo $ranks)"
[ -n "$ranks" ] && kill -TERM $ranks
wait "$pid"
rc=$?
note=$(grep "^luapipe: stopped; " "$tmp/sig")
k=$(echo "$note" | sed -n 's|^luapipe: stopped; a resume (resume = true, the examples'"'"' --resume) would start from checkpoint '"$ck"'/step\([0-9]*\) (after step \1)$|\1|p')
echo "SIGTERM: rc $rc, '$note'"
{ [ "$rc" -ne 0 ] && [ "$(grep -c "^luapipe: stopped" "$tmp/sig")" -eq 1 ] && [ -n "$k" ] && [ "$k" -ge 10 ] &&
  [ -f "$ck/step$k/rank0.ckpt" ] && [ -f "$ck/step$k/rank1.ckpt" ]; } ||
  { fail "SIGTERM: expected one line naming a complete checkpoint"; tail -5 "$tmp/sig"; ls -R "$ck"; }

if [ "$fails" -ne 0 ]; then
  echo "test_examples_checkpoint: $fails failure(s)"
  exit 1
fi
echo "test_examples_checkpoint: all passed"
