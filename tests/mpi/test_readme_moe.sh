#!/usr/bin/env bash
# test_readme_moe.sh LUAPIPE — the README's MoE snippet is true as written:
# its pipeline run (mpirun, pp 2 x ep 2, DualPipe, EPLB, emulated link) and
# its --reference run (one process) print the same loss at every step
# (within 1e-5 relative). The two commands are taken from README.md itself,
# with build/luapipe replaced by the program under test. Exits 77 without
# mpirun.
. "$(dirname "$0")/lib.sh"

# the snippet: the mpirun line (with its continuation) and the --reference line
awk '/^mpirun .*examples\/train_moe\.lua/ { cmd = $0; while (cmd ~ /\\$/) { sub(/\\$/, "", cmd); getline more; cmd = cmd more }
       print cmd > "'"$tmp"'/pipeline"; next }
     /^build\/luapipe examples\/train_moe\.lua .*--reference/ { sub(/#.*/, ""); print > "'"$tmp"'/reference" }' README.md
for f in pipeline reference; do
  [ -s "$tmp/$f" ] || { echo "FAIL: README.md has no train_moe $f command"; exit 1; }
  sed -i "s#build/luapipe#$luapipe#" "$tmp/$f"
  echo "README $f: $(cat "$tmp/$f")"
done
timeout 300 bash "$tmp/pipeline" >"$tmp/pipe.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { fail "the README's pipeline run exited $rc"; tail -20 "$tmp/pipe.out"; }
timeout 300 bash "$tmp/reference" >"$tmp/ref.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { fail "the README's --reference run exited $rc"; tail -20 "$tmp/ref.out"; }
steps=$(grep -o -- '--steps [0-9]*' "$tmp/pipeline" | awk '{ print $2 }')
same=$(awk 'FNR == NR && /^step [0-9]+ loss / { ref[$2] = $4; next }
  /^step [0-9]+ loss / { n++; d = $4 - ref[$2]; if (d < 0) d = -d; if (ref[$2] != "" && d <= 1e-5 * ref[$2]) ok++
    else if (!bad) bad = "step " $2 ": " $4 " vs --reference " ref[$2] }
  END { print ok + 0, n + 0, bad }' "$tmp/ref.out" "$tmp/pipe.out")
echo "losses equal to --reference at $same (of $steps steps)"
[ "${same%% *}" = "$steps" ] && [ "$(echo "$same" | awk '{ print $2 }')" = "$steps" ] ||
  fail "the README's two MoE runs print different losses ($same)"
[ "$fails" -eq 0 ] && echo "all checks passed" || { echo "$fails check(s) failed"; exit 1; }
