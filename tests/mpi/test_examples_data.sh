#!/usr/bin/env bash
# test_examples_data.sh LUAPIPE — the char-LM example trained from a token
# file, as a user runs it (run from the repo root): --write-tokens makes
# the file from the text it ships; a run on 2 ranks from --data that is
# stopped after step 6 and resumed gives the losses of the unbroken run
# bitwise (the position in the file follows from the step); --clip and a
# learning-rate schedule show in the progress line; a file with a token
# beyond the text's vocabulary is refused before training, one line
# naming the file and the byte offset, exit 2.
. "$(dirname "$0")/lib.sh"
mpirun=(timeout 120 mpirun --oversubscribe -np 2)
ex=$(pwd)/examples/train_char_lm.lua
cd "$tmp" || exit 1
common=(--data gpl.bin --seed 2 --partition layers --blocks 2 --dim 32 --context 32 --log-every 1
  --clip 1 --warmup 3 --min-lr 0.001 --decay-steps 12)

"$luapipe" "$ex" --write-tokens gpl.bin >out 2>&1
grep -q "^wrote gpl.bin: [0-9]* tokens (uint16), vocabulary [0-9]* from " out || { fail "--write-tokens"; cat out; }

"${mpirun[@]}" "$luapipe" "$ex" "${common[@]}" --steps 12 >unbroken 2>&1 || { fail "unbroken run"; cat unbroken; }
"${mpirun[@]}" "$luapipe" "$ex" "${common[@]}" --steps 6 --checkpoint ck --every 3 >first 2>&1 \
  || { fail "first half"; cat first; }
"${mpirun[@]}" "$luapipe" "$ex" "${common[@]}" --steps 12 --checkpoint ck --every 3 --resume >second 2>&1 \
  || { fail "resumed half"; cat second; }
grep -q "^resumed from checkpoint ck/step6" second || { fail "no resume"; cat second; }
want=$(grep -E '^step ([7-9]|1[0-2]) loss' unbroken | awk '{print $2, $4}')
got=$(grep -E '^step ([7-9]|1[0-2]) loss' second | awk '{print $2, $4}')
if [ -z "$want" ] || [ "$want" != "$got" ]; then
  fail "resumed losses differ from the unbroken run's"
  diff <(echo "$want") <(echo "$got")
else
  echo "steps 7..12 resumed from a token file: losses equal the unbroken run's bitwise"
fi
# resumed under another schedule: said once, this run's applies
"${mpirun[@]}" "$luapipe" "$ex" "${common[@]}" --steps 13 --checkpoint ck --every 3 --resume --min-lr 0.002 \
  >third 2>&1 || { fail "resume under another lr schedule"; cat third; }
n=$(grep -c "^note: the learning-rate schedule differs from the one checkpoint ck/step12/state.json was trained under (rate 0.005, warmup 3, cosine decay over 12 steps to 0.001 there, rate 0.005, warmup 3, cosine decay over 12 steps to 0.002 here): this run's applies from step 13$" third)
[ "$n" -eq 1 ] || { fail "the schedule change was said $n times"; cat third; }
grep -qE '^step 1 loss [0-9.]+ +\(.*lr 0\.00167, gnorm [0-9.]+\)$' unbroken \
  || { fail "the progress line lacks lr / gnorm"; grep '^step 1 ' unbroken; }

# data parallelism from the examples' options: pp 1 x dp 2 (ZeRO-1) against one process
"$luapipe" "$ex" "${common[@]}" --steps 4 >one 2>&1 || { fail "one process"; cat one; }
"${mpirun[@]}" "$luapipe" "$ex" "${common[@]}" --steps 4 --dp 2 --zero 1 >dp2 2>&1 || { fail "--dp 2"; cat dp2; }
a=$(grep '^step 4 loss' one | awk '{printf "%.4f", $4}')
b=$(grep '^step 4 loss' dp2 | awk '{printf "%.4f", $4}')
echo "step 4 loss: one process $a, pp 1 x dp 2 with ZeRO-1 $b"
[ -n "$a" ] && [ "$a" = "$b" ] || { fail "--dp 2 --zero 1 differs from one process"; cat one dp2; }

"$luapipe" -e 'local d = require("luapipe.data"); local ids = {}
  for i = 1, 200 do ids[i] = i % 7 end; ids[150] = 300; d.write_tokens("bad.bin", ids)'
"${mpirun[@]}" "$luapipe" "$ex" --data bad.bin --steps 2 >bad 2>&1
rc=$?
n=$(grep -c "^train_char_lm.lua: bad.bin: token 300 at byte offset 298 is not below the vocabulary size [0-9]*$" bad)
echo "token beyond the vocabulary: rc $rc, reported $n time(s)"
{ [ "$rc" -eq 2 ] && [ "$n" -eq 1 ] && ! grep -q "^step" bad; } || { fail "bad token file"; cat bad; }

if [ "$fails" -ne 0 ]; then
  echo "test_examples_data: $fails failure(s)"
  exit 1
fi
echo "test_examples_data: all passed"
