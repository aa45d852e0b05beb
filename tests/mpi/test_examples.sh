#!/usr/bin/env bash
# test_examples.sh LUAPIPE — the training examples run under mpirun (from the
# repo root) and learn: examples/train_mlp.lua (dualpipe, 4 ranks) and
# examples/train_char_lm.lua (zbv, 4 ranks, a smaller model) print
# "step K loss X" on rank 0 only, and the last loss is clearly below the
# first. Also --trace writes one Chrome trace with every rank's events.
# Exits 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
mpirun=(timeout 120 mpirun --oversubscribe)
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# learns: the last "step K loss X" is below ratio * the first
learns() { # file steps ratio
  local n first last
  n=$(grep -c '^step [0-9]* loss ' "$1")
  [ "$n" -eq "$2" ] || { echo "expected $2 step lines, got $n"; return 1; }
  first=$(grep '^step 1 loss ' "$1" | awk '{print $4}')
  last=$(grep "^step $2 loss " "$1" | awk '{print $4}')
  echo "loss $first -> $last"
  awk -v a="$first" -v b="$last" -v r="$3" 'BEGIN { exit !(b < r * a) }'
}

t0=$(date +%s.%N)
"${mpirun[@]}" -np 4 "$luapipe" examples/train_mlp.lua --schedule dualpipe --microbatches 8 \
  --steps 15 --seed 3 --trace "$tmp/trace.json" >"$tmp/out" 2>"$tmp/err"
rc=$?
echo "train_mlp (dualpipe, 4 ranks, 15 steps): rc $rc in $(elapsed "$t0" "$(date +%s.%N)") s"
[ "$rc" -eq 0 ] || { fail "train_mlp exited $rc"; cat "$tmp/out" "$tmp/err"; }
learns "$tmp/out" 15 0.5 || { fail "train_mlp did not learn"; cat "$tmp/out"; }
if [ -s "$tmp/trace.json" ]; then
  # every rank's compute slices (15 steps x its F/B/optimizer actions), and
  # send->receive flows that never go back in time
  cat >"$tmp/check.lua" <<'LUA'
    local json = require("luapipe.json")
    local f = assert(io.open(arg[1])); local t = json.decode(f:read("a")); f:close()
    local compute, s, fl, bad = {}, {}, {}, 0
    local t0, markers, live, sends, peerless = math.huge, {}, {}, 0, 0
    for _, e in ipairs(t.traceEvents) do
      if e.ph == "X" and e.tid == 0 then compute[e.pid] = (compute[e.pid] or 0) + 1 end
      if e.ph == "s" then s[e.id] = e.ts end
      if e.ph == "f" then fl[#fl + 1] = e end
      if e.ph == "X" or e.ph == "C" or e.ph == "i" then t0 = math.min(t0, e.ts) end
      if e.ph == "i" and e.name:match("^step %d+$") then markers[e.pid] = (markers[e.pid] or 0) + 1 end
      if e.ph == "C" and e.name == "live activations" then live[e.pid] = true end
      if e.ph == "X" and e.name:match("^send ") then
        sends = sends + 1
        if not (e.args.peer and e.args.tag and e.args.step) then peerless = peerless + 1 end
      end
    end
    for _, e in ipairs(fl) do if not s[e.id] or e.ts < s[e.id] then bad = bad + 1 end end
    print(string.format("ranks %d %d %d %d flows %d backwards %d", compute[0] or 0,
      compute[1] or 0, compute[2] or 0, compute[3] or 0, #fl, bad))
    -- times from 0, a marker per step on every rank, counters, every send paired
    print(string.format("start %g markers %d %d %d %d live %s sends %d unpaired %d peerless %d", t0,
      markers[0] or 0, markers[1] or 0, markers[2] or 0, markers[3] or 0,
      (live[0] and live[1] and live[2] and live[3]) and "all" or "missing", sends, sends - #fl, peerless))
LUA
  check=$("$luapipe" "$tmp/check.lua" "$tmp/trace.json")
  echo "trace: $check"
  [[ "$check" =~ ^ranks\ [1-9][0-9]*\ [1-9][0-9]*\ [1-9][0-9]*\ [1-9][0-9]*\ flows\ [1-9][0-9]*\ backwards\ 0 ]] ||
    fail "trace: expected compute slices on every rank and forward flows"
  [[ "$check" == *"start 0 markers 15 15 15 15 live all sends "*" unpaired 0 peerless 0"* ]] ||
    fail "trace: expected times from 0, 15 step markers per rank, live-activation counters, every send paired"
  ls "$tmp" | grep -q part && fail "trace: per-rank part files left behind"
else
  fail "train_mlp --trace wrote no trace"
fi

# train_moe: DualPipe at pp=2 x ep=2 with EPLB every step prints the
# reference's losses (--reference, one process), its summary lines, and a
# bad option is one line with exit 2
"${mpirun[@]}" -np 4 "$luapipe" examples/train_moe.lua --schedule dualpipe --pp 2 --ep 2 \
  --steps 4 --redundant 1 --eplb-every 1 --link lat=20us,bw=4GB/s --trace "$tmp/moe.json" \
  --report "$tmp/moe_report" >"$tmp/moe" 2>&1
rc=$?
"$luapipe" examples/train_moe.lua --reference --steps 4 --microbatches 4 >"$tmp/moe_ref" 2>&1
echo "train_moe (dualpipe, pp=2 x ep=2, EPLB): rc $rc"
[ "$rc" -eq 0 ] || { fail "train_moe exited $rc"; cat "$tmp/moe"; }
same=$(awk 'FNR == NR && /^step [0-9]+ loss / { ref[$2] = $4; next }
  /^step [0-9]+ loss / { n++; d = $4 - ref[$2]; if (d < 0) d = -d; if (ref[$2] != "" && d <= 1e-5 * ref[$2]) ok++ }
  END { print ok + 0, n + 0 }' "$tmp/moe_ref" "$tmp/moe")
echo "train_moe losses equal to --reference: $same"
[ "$same" = "4 4" ] || { fail "train_moe losses differ from --reference"; cat "$tmp/moe" "$tmp/moe_ref"; }
# the same pairs in DeepSeek-V3's fixed order, scripted by an overlapped_fb
# hook (exec:advance, exec:phase, exec:weight_grad_part): the same losses
"${mpirun[@]}" -np 4 "$luapipe" examples/train_moe.lua --schedule dualpipe --pp 2 --ep 2 \
  --steps 4 --redundant 1 --eplb-every 1 --fb-order deepseek >"$tmp/moe_ds" 2>&1
rc=$?
same=$(awk 'FNR == NR && /^step [0-9]+ loss / { ref[$2] = $4; next }
  /^step [0-9]+ loss / { n++; d = $4 - ref[$2]; if (d < 0) d = -d; if (ref[$2] != "" && d <= 1e-5 * ref[$2]) ok++ }
  END { print ok + 0, n + 0 }' "$tmp/moe_ref" "$tmp/moe_ds")
echo "train_moe --fb-order deepseek: rc $rc, losses equal to --reference: $same"
[ "$rc" -eq 0 ] && [ "$same" = "4 4" ] || { fail "train_moe --fb-order deepseek"; cat "$tmp/moe_ds"; }
grep -qE '^  all-to-all: [0-9]+ exchanges, .*, [0-9.]+% hidden under compute$' "$tmp/moe" ||
  fail "train_moe: no all-to-all line in the summary"
grep -qE '^  expert load \(.*\): [0-9.]+ -> [0-9.]+; [0-9]+ rebalances? moved [0-9]+ bytes' "$tmp/moe" ||
  fail "train_moe: no expert load line in the summary"
# the summary's figures are printed once (not again after the summary)
[ "$(grep -c 'hidden' "$tmp/moe")" -eq 2 ] || fail "train_moe: the all-to-all figures are repeated"
grep -qE '^(all-to-all hidden|expert load max/mean|weight bytes moved):' "$tmp/moe" &&
  fail "train_moe: summary lines repeated after the summary"
# the simulator models the exchanges too: its hidden share beside the measured one
grep -qE '^    link model alone: [0-9.e-]+ ms per rank and step, [0-9.]+% hidden .*, step [0-9.e-]+ ms$' "$tmp/moe" ||
  fail "train_moe: no simulated all-to-all line in the summary"
# ... from the exchanges the executor counted per action: the simulated link
# time per rank and step is the measured exchanges' link-model time (pairs'
# exchanges counted per F / B / I half, lone or in pairs), within 10% (byte counts, not clocks)
sim_x=$(awk -F= '/^sim_a2a_ms=/ { s = $2 } /^a2a_link_ms=/ { l = $2 }
  END { print (l > 0 && s / l > 0.9 && s / l < 1.1) ? "ok (" s " / " l " ms)" : "bad " s " / " l }' "$tmp/moe_report")
echo "train_moe simulated vs measured exchange link time: $sim_x"
[ "${sim_x%% *}" = ok ] || fail "train_moe: simulated exchange time off the measured link time ($sim_x)"
# the measured trace: all-to-alls on every rank's comm track (odd tids)
cat >"$tmp/a2a.lua" <<'LUA'
  local json = require("luapipe.json")
  local f = assert(io.open(arg[1])); local t = json.decode(f:read("a")); f:close()
  local per, bad = {}, 0
  for _, e in ipairs(t.traceEvents) do
    if e.ph == "X" and e.name == "all-to-all" then
      per[e.pid] = (per[e.pid] or 0) + 1
      if e.tid % 2 ~= 1 then bad = bad + 1 end
    end
  end
  print(string.format("a2a %d %d %d %d off-track %d", per[0] or 0, per[1] or 0, per[2] or 0,
    per[3] or 0, bad))
LUA
a2a=$("$luapipe" "$tmp/a2a.lua" "$tmp/moe.json" 2>&1)
echo "train_moe trace: $a2a"
[[ "$a2a" =~ ^a2a\ [1-9][0-9]*\ [1-9][0-9]*\ [1-9][0-9]*\ [1-9][0-9]*\ off-track\ 0$ ]] ||
  fail "train_moe trace: expected all-to-alls on the comm track of every rank"
"$luapipe" examples/train_moe.lua --topk 9 >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "^train_moe.lua: --topk 9 is more than --experts 8$" "$tmp/out" ||
  { fail "train_moe --topk 9: rc $rc"; cat "$tmp/out"; }
"$luapipe" examples/train_moe.lua --fb-order sideways >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "^Error: argument for option '--fb-order' must be one of 'auto', 'deepseek', 'forward-first'$" "$tmp/out" ||
  { fail "train_moe --fb-order sideways: rc $rc"; cat "$tmp/out"; }
"$luapipe" examples/train_moe.lua --ep 1.5 >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "^train_moe.lua: --ep must be an integer from 1 to 4096, got '1.5'$" "$tmp/out" ||
  { fail "train_moe --ep 1.5: rc $rc"; cat "$tmp/out"; }
# DualPipe (the example's default) started without mpirun: one line, no traceback
"$luapipe" examples/train_moe.lua --steps 1 >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 1 ] && grep -q "^luapipe: DualPipe needs an even number of ranks; this is one process (start it with mpirun -np 2 or more)$" "$tmp/out" &&
  ! grep -q "traceback" "$tmp/out" ||
  { fail "train_moe on one process: rc $rc"; cat "$tmp/out"; }
# ... and on pp 3 x ep 2: the pipeline ranks, in the user's words
"${mpirun[@]}" -np 6 "$luapipe" examples/train_moe.lua --ep 2 --steps 1 >"$tmp/out" 2>&1
rc=$?
n=$(grep -c "^luapipe: DualPipe needs an even number of pipeline ranks; mpirun started 6 = pp 3 x ep 2$" "$tmp/out")
[ "$rc" -ne 0 ] && [ "$n" -eq 1 ] && ! grep -q "traceback" "$tmp/out" ||
  { fail "train_moe dualpipe on pp 3 x ep 2: rc $rc, reported $n time(s)"; cat "$tmp/out"; }

# DualPipe on an odd number of ranks: one line, once, in the user's words
"${mpirun[@]}" -np 3 "$luapipe" examples/train_mlp.lua --schedule dualpipe --steps 1 >"$tmp/out" 2>&1
rc=$?
n=$(grep -c "^luapipe: DualPipe needs an even number of ranks; mpirun started 3$" "$tmp/out")
echo "dualpipe on 3 ranks: rc $rc, reported $n time(s)"
{ [ "$rc" -eq 2 ] && [ "$n" -eq 1 ] && ! grep -qiE "traceback|\bpp\b" "$tmp/out"; } ||
  { fail "dualpipe on 3 ranks"; cat "$tmp/out"; }

t0=$(date +%s.%N)
"${mpirun[@]}" -np 4 "$luapipe" examples/train_char_lm.lua --schedule zbv --microbatches 8 \
  --steps 30 --seed 1 --dim 32 --context 32 --blocks 6 --lr 0.01 \
  --svg "$tmp/lm.svg" --report "$tmp/report" >"$tmp/out" 2>"$tmp/err"
rc=$?
echo "train_char_lm (zbv, 4 ranks, 30 steps): rc $rc in $(elapsed "$t0" "$(date +%s.%N)") s"
[ "$rc" -eq 0 ] || { fail "train_char_lm exited $rc"; cat "$tmp/out" "$tmp/err"; }
learns "$tmp/out" 30 0.8 || { fail "train_char_lm did not learn"; cat "$tmp/out"; }
# the end-of-training summary (figures judged by scripts/bench/pipeline, not here)
grep -q '^summary (29 measured steps, first step skipped as warm-up, 4 ranks):' "$tmp/out" ||
  { fail "train_char_lm: no summary"; cat "$tmp/out"; }
grep -q '^  step time: measured .* ms, simulator.s prediction .* ms' "$tmp/out" ||
  fail "train_char_lm: no step-time comparison"
if [ -s "$tmp/report" ]; then
  sane=$(awk -F= '{ v[$1] = $2 } END { print (v["overhead_pct"] >= 0 && v["overhead_pct"] <= 100 &&
    v["predicted_ms"] > 0 && v["step_ms"] > 0 && v["ratio"] > 0 && v["steps"] == 29 &&
    v["bubble_pct"] >= 0 && v["bubble_pct"] <= 100) ? "yes" : "no" }' "$tmp/report")
  echo "summary: $(tr '\n' ' ' <"$tmp/report")"
  [ "$sane" = yes ] || fail "train_char_lm --report: figures out of range"
else
  fail "train_char_lm --report wrote nothing"
fi
grep -q 'measured last step' "$tmp/lm.svg" 2>/dev/null || fail "train_char_lm --svg: no measured SVG"

if [ "$fails" -ne 0 ]; then
  echo "test_examples: $fails failure(s)"
  exit 1
fi
echo "test_examples: all passed"
