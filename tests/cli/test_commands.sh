#!/usr/bin/env bash
# `luapipe schedule | simulate | bubbles`: outputs, files, and error paths.
. "$(dirname "$0")/lib.sh"

# bubbles: DualPipe's table at P=8, M=20, F=1 B=2 W=1 F&B=3
expect_rc "bubbles" 0 "$LP" bubbles --pp 8 --microbatches 20 --cost F=1,B=2,W=1,FB=3
grep -E '^1F1B ' "$tmp/out" | grep -qE '^1F1B +21 ' && ok "1F1B bubble 21" || bad "1F1B bubble 21: $(grep -E '^1F1B' "$tmp/out")"
grep -qE '^ZB1P +7 ' "$tmp/out" && ok "ZB1P bubble 7" || bad "ZB1P bubble 7: $(grep -E '^ZB1P' "$tmp/out")"
grep -qE '^DualPipe +6 ' "$tmp/out" && ok "DualPipe bubble 6" || bad "DualPipe bubble 6: $(grep -E '^DualPipe ' "$tmp/out")"
grep -E '^DualPipe ' "$tmp/out" | grep -q '9 (every rank)' && ok "DualPipe activations P+1 on every rank" || bad "DualPipe activations"
# every family on the same model: a chunk costs P / model stages of --cost
# (pp 16, m 64: ZB-V 7.5 and DualPipeV 15, where DeepSeek's per-chunk
# convention gives 15 and 30); params per rank in ranks' shares
row() { grep -E "^$1 " "$tmp/out" | tr -s ' '; }
expect_rc "bubbles pp 16" 0 "$LP" bubbles --pp 16 -m 64
[ "$(row ZB-V)" = "ZB-V 7.50 1/2 (none published) - 1x 16 (every rank)" ] && ok "ZB-V same model" || bad "ZB-V same model: $(row ZB-V)"
[ "$(row DualPipeV)" = "DualPipeV 15 1/2 (PP/2-1)(F&B+B-3W), PP=2P 15 1x 16.50 (every rank)" ] && ok "DualPipeV same model" || bad "DualPipeV same model: $(row DualPipeV)"
[ "$(row 'Interleaved 1F1B')" = "Interleaved 1F1B 22.50 1/2 (PP-1)(F+B)/v, F,B of a rank 22.50 1x 23.50..8.50" ] && ok "interleaved same model" || bad "interleaved same model: $(row 'Interleaved 1F1B')"
[ "$(row DualPipe)" = "DualPipe 14 1 (PP/2-1)(F&B+B-3W) 14 2x 17 (every rank)" ] && ok "DualPipe 2x params" || bad "DualPipe: $(row DualPipe)"
expect_in "bubbles: convention named" "$tmp/out" "per rank's share of one model (every family runs it)"
expect_in "bubbles: bubble unit" "$tmp/out" "in the time unit of --cost"
expect_rc "bubbles per chunk" 0 "$LP" bubbles --pp 16 -m 64 --per-chunk
[ "$(row ZB-V)" = "ZB-V 15 1 (none published) - 2x 32 (every rank)" ] && ok "ZB-V per chunk" || bad "ZB-V per chunk: $(row ZB-V)"
[ "$(row DualPipeV)" = "DualPipeV 30 1 (PP/2-1)(F&B+B-3W), PP=2P 30 2x 33 (every rank)" ] && ok "DualPipeV per chunk" || bad "DualPipeV per chunk: $(row DualPipeV)"
expect_in "bubbles: DeepSeek's convention named" "$tmp/out" "per chunk (DeepSeek's convention"
expect_rc "simulate help: the cost convention" 0 env COLUMNS=200 "$LP" help simulate
expect_in "simulate says costs are per chunk" "$tmp/out" "Costs are per action of one model stage (a chunk)"
# every help text within the width (COLUMNS; 80 off a terminal), broken
# between words only
for h in "--help" "help" "help env" "help sim" "help luapipe.eplb" "schedule --help" \
    "simulate --help" "bubbles --help" "eplb --help" "help eplb"; do
  env COLUMNS=80 "$LP" $h >"$tmp/out" 2>&1
  [ "$(wc -l <"$tmp/out")" -ge 5 ] || bad "luapipe $h: no help printed"
  awk 'length > 80 { bad = 1 } END { exit bad }' "$tmp/out" && ok "luapipe $h: within 80 columns" \
    || bad "luapipe $h: a line over 80 columns: $(awk 'length > 80' "$tmp/out" | head -1)"
done
env -u COLUMNS "$LP" help env </dev/null >"$tmp/out" 2>&1
awk 'length > 80 { bad = 1 } END { exit bad }' "$tmp/out" && ok "help off a terminal: 80 columns" \
  || bad "help off a terminal: 80 columns"
env COLUMNS=50 "$LP" help env >"$tmp/out" 2>&1
awk 'length > 50 && / / { bad = 1 } END { exit bad }' "$tmp/out" && ok "help at COLUMNS=50" || bad "help at COLUMNS=50"
expect_rc "bubbles json" 0 "$LP" bubbles -p 8 -m 20 --format json
expect_in "bubbles json rows" "$tmp/out" '"rows"'
expect_rc "bubbles bad cost exits 2" 2 "$LP" bubbles --cost F=x
expect_in "bad cost named" "$tmp/err" "F=x"

# schedule: listing, csv/json export, round trip through a file
expect_rc "schedule text" 0 "$LP" schedule dualpipe --pp 4 --microbatches 8
expect_in "worked example rank 0" "$tmp/out" "rank 0: 0F0 0F1 0F2 7F4 7I4 7W4 7F5 (0F3;7B5)OVERLAP_F_B (7F6;0B0)OVERLAP_F_B 7B6 (7F7;0B1)OVERLAP_F_B 7B7 0I2 0W2 0I3 0W3"
expect_rc "schedule csv to file" 0 "$LP" schedule zb1p -p 4 -m 8 --format csv -o "$tmp/zb.csv"
[ -s "$tmp/zb.csv" ] && ok "csv written" || bad "csv written"
expect_rc "simulate from csv" 0 "$LP" simulate "$tmp/zb.csv" --cost F=1,B=2,W=1
expect_in "csv schedule simulated" "$tmp/out" "makespan"
expect_rc "schedule json" 0 "$LP" schedule 1f1b -p 2 -m 2 --format json -o "$tmp/s.json"
expect_rc "simulate from json" 0 "$LP" simulate "$tmp/s.json" --no-gantt
expect_rc "schedule lowered" 0 "$LP" schedule 1f1b -p 2 -m 2 --lower
expect_in "lowered has SEND_F" "$tmp/out" "0SEND_F0"
expect_rc "schedule gantt" 0 "$LP" schedule dualpipe -p 4 -m 8 --format gantt

# PyTorch's early receive (0RECV_B0 first): valid and simulated under the
# default non-blocking model; a deadlock when a RECV blocks (--sends buffered)
early="$(dirname "$0")/../lua/data/defer_recv/simple_2_rank_2_stage_iw_split_input.csv"
expect_rc "early receive validates" 0 "$LP" schedule "$early"
expect_in "early receive valid" "$tmp/out" "20 actions (lowered), valid"
expect_rc "early receive simulates" 0 "$LP" simulate "$early" --cost F=1,B=2 --no-gantt
expect_in "early receive makespan" "$tmp/out" "makespan 8,"
expect_rc "early receive under --sends buffered exits 1" 1 "$LP" schedule "$early" --sends buffered
expect_in "buffered deadlock named" "$tmp/err" "invalid schedule: deadlock under buffered sends (a send does not wait for its receive): rank 0 waits at action 0 (0RECV_B0) for rank 1 to reach action 4 (1SEND_B0)"
expect_rc "--sends nonblocking" 0 "$LP" schedule "$early" --sends nonblocking

# a Lua file returning a schedule
cat >"$tmp/mine.lua" <<'LUA'
local schedule = require("luapipe.schedule")
return schedule.new{ name = "mine", ranks = 2, stages = 2, microbatches = 2,
  actions = { [0] = { "0F0", "0F1", "0B0", "0B1" }, [1] = { "1F0", "1B0", "1F1", "1B1" } } }
LUA
expect_rc "simulate a Lua schedule" 0 "$LP" simulate "$tmp/mine.lua" --cost F=1,B=2 --svg "$tmp/m.svg" --trace "$tmp/m.json"
expect_in "svg named" "$tmp/out" "wrote SVG timeline to $tmp/m.svg"
grep -q "<svg" "$tmp/m.svg" && ok "svg file" || bad "svg file"
grep -q '"traceEvents"' "$tmp/m.json" && ok "trace file" || bad "trace file"
expect_rc "simulate json" 0 "$LP" simulate "$tmp/mine.lua" --format json
expect_in "json makespan" "$tmp/out" '"makespan"'

# errors: invalid schedule, bad family parameters, missing file, unknown name
cat >"$tmp/bad.lua" <<'LUA'
local schedule = require("luapipe.schedule")
return schedule.new{ ranks = 2, stages = 2, microbatches = 1,
  actions = { [0] = { "0B0", "0F0" }, [1] = { "1F0", "1B0" } } }
LUA
expect_rc "invalid schedule exits 1" 1 "$LP" simulate "$tmp/bad.lua"
expect_in "validation message" "$tmp/err" "rank 0, action 0 (0B0): backward of micro-batch 0 on stage 0 comes before its forward"
expect_rc "dualpipe odd pp is a usage error (exit 2)" 2 "$LP" schedule dualpipe --pp 3 --microbatches 8
expect_in "dualpipe pp message" "$tmp/err" "pp must be even"
expect_rc "missing csv exits 1" 1 "$LP" simulate "$tmp/none.csv"
expect_in "missing file named" "$tmp/err" "none.csv"
expect_rc "unknown family exits 2" 2 "$LP" schedule nosuch
expect_in "unknown family message" "$tmp/err" "unknown schedule family 'nosuch'"
expect_rc "unwritable svg exits 1" 1 "$LP" simulate 1f1b --svg /nonexistent/dir/x.svg
[ ! -e /nonexistent/dir/x.svg ] && ok "nothing half-written" || bad "file appeared"
expect_in "unwritable svg: the user's path and the reason" "$tmp/err" \
  "cannot create /nonexistent/dir/x.svg: there is no folder /nonexistent/dir"
grep -q "x.svg.tmp" "$tmp/err" && bad "svg error names the temporary file" || ok "no temporary named"

# outputs that are not regular files are written in place, never replaced:
# a FIFO (as /dev/null or /dev/stdout would be) stays a FIFO and gets the data
mkfifo "$tmp/pipe"
timeout 20 cat "$tmp/pipe" >"$tmp/from_pipe" &
reader=$!
expect_rc "--trace into a FIFO" 0 timeout 20 "$LP" simulate 1f1b --pp 2 --trace "$tmp/pipe"
wait "$reader"
[ -p "$tmp/pipe" ] && ok "the FIFO is still a FIFO" || bad "the FIFO was replaced by a file"
expect_in "the trace went through the FIFO" "$tmp/from_pipe" '"traceEvents"'
[ ! -e "$tmp/pipe.tmp" ] && ok "no temporary beside the FIFO" || bad "pipe.tmp left behind"
# a symbolic link to a file: the target is replaced, the link stays
echo old >"$tmp/target.svg"
ln -s "$tmp/target.svg" "$tmp/link.svg"
expect_rc "--svg through a symbolic link" 0 "$LP" simulate 1f1b --pp 2 --svg "$tmp/link.svg"
[ -L "$tmp/link.svg" ] && ok "the link is still a link" || bad "the link was replaced by a file"
expect_in "the target got the SVG" "$tmp/target.svg" "<svg"

finish
