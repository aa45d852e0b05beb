#!/usr/bin/env bash
# `luapipe profile`: the report of a small hand-written trace (text, JSON,
# --costs that simulate accepts, --simulate, --svg), bad input (one line
# naming the file and event, exit 2, no traceback, no output file left)
# and, when present, DeepSeek's training trace.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
small=tests/profile/small.json

expect_rc "text report" 0 "$LP" profile "$small"
expect_in "text: rank from distributedInfo" "$tmp/out" "rank 3 ($small): 7 GPU operations on 3 streams, span 0.064 ms"
expect_in "text: overlapped share" "$tmp/out" "comm_overlap_ratio 0.4143"
expect_in "text: phase row" "$tmp/out" "   3 mlp(B)                        0.030      0.009      0.009      0.000      2"

expect_rc "json to a file" 0 "$LP" profile "$small" --format json -o "$tmp/rep.json"
expect_in "json: overlap" "$tmp/rep.json" '"comm_overlap_us":14.5,'
expect_in "json: busy" "$tmp/rep.json" '"communication":35.0,'

expect_rc "costs" 0 "$LP" profile "$small" --costs
expect_in "costs: the --cost line" "$tmp/out" "--cost F=0.060,B=0.009,W=0.000,FB=0.064"
cost=$(grep '^--cost ' "$tmp/out" | cut -d' ' -f2)
expect_rc "simulate accepts the costs" 0 "$LP" simulate 1f1b --pp 2 --microbatches 4 --cost "$cost" --no-gantt
expect_rc "bubbles accepts the costs" 0 "$LP" bubbles --pp 4 --microbatches 8 --cost "$cost"
expect_rc "--simulate" 0 "$LP" profile "$small" --simulate dualpipe --pp 4 --microbatches 8
expect_in "--simulate: the row" "$tmp/out" "DualPipe "
# the best searched schedule: DualPipe's peak as the limit by default (the
# search seeds with DualPipe, so it is never slower), --memory otherwise
expect_rc "--simulate search" 0 "$LP" profile "$small" --simulate search --pp 4 --microbatches 8 --time 0.2
expect_in "search: the note" "$tmp/out" "search: memory limit 5 activations per rank (DualPipe's peak), placement any, 0.2 s: lower bound 0.614, gap "
row=$(grep '^search (' "$tmp/out")
dp=$("$LP" profile "$small" --simulate dualpipe --pp 4 --microbatches 8 | awk '$1 == "DualPipe" { print $2 }')
if [ -n "$row" ] && [ -n "$dp" ] \
    && awk -v r="$row" -v dp="$dp" 'BEGIN { split(r, a, " +"); exit !(a[3] + 0 <= dp + 0 && a[7] + 0 <= 5 && a[3] + 0 >= 0.614) }'; then
  ok "search: step within [bound, DualPipe's $dp], activations within 5 ($row)"
else bad "search row: '$row' (DualPipe $dp)"; fi
expect_rc "--simulate search --memory" 0 "$LP" profile "$small" --simulate search --pp 4 --microbatches 8 --time 0.2 --memory 3 --placement v
expect_in "search --memory: the note" "$tmp/out" "search: memory limit 3 activations per rank (--memory), placement v, 0.2 s: lower bound "
row=$(grep '^search (v) ' "$tmp/out")
if [ -n "$row" ] && awk -v r="$row" 'BEGIN { split(r, a, " +"); exit !(a[7] + 0 <= 3) }'; then
  ok "search --memory: activations within 3 ($row)"; else bad "search --memory row: '$row'"; fi
expect_rc "--simulate all has the search" 0 "$LP" profile "$small" --simulate all --pp 4 --microbatches 8 --time 0.2
expect_in "all: ZB-V row" "$tmp/out" "ZB-V "
expect_in "all: search row" "$tmp/out" "search ("
expect_rc "--simulate search: limit below one micro-batch" 2 "$LP" profile "$small" --simulate search --pp 4 --microbatches 8 --memory 0.5
expect_in "search: limit message" "$tmp/err" "luapipe profile: --simulate: search: the memory limit of rank 0 (0.5 activations) is less than one micro-batch needs there (1)"
expect_rc "--memory without the search" 2 "$LP" profile "$small" --simulate 1f1b --memory 3
expect_in "--memory: message" "$tmp/err" "--memory, --placement and --time apply to --simulate search (or all)"
expect_rc "--placement unknown" 2 "$LP" profile "$small" --simulate search --placement zigzag
expect_in "--placement: message" "$tmp/err" "--placement 'zigzag': expected linear, interleaved:V, v, bidirectional or any"
expect_rc "--simulate unknown family" 2 "$LP" profile "$small" --simulate dualpip
expect_in "--simulate: suggestion" "$tmp/err" "did you mean 'dualpipe'"

expect_rc "svg" 0 "$LP" profile "$small" --svg "$tmp/t.svg"
expect_in "svg written" "$tmp/t.svg" "</svg>"

# bad input: one line, exit 2, no traceback, nothing written
printf '{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":-4}]}' >"$tmp/neg.json"
expect_rc "negative dur" 2 "$LP" profile "$tmp/neg.json" -o "$tmp/never.txt" --svg "$tmp/never.svg"
expect_in "negative dur: message" "$tmp/err" "luapipe profile: $tmp/neg.json: traceEvents[0] (\"k\"): negative \"dur\" (-4.000 us)"
if [ "$(wc -l <"$tmp/err")" -eq 1 ] && ! grep -q traceback "$tmp/err"; then ok "one line, no traceback"; else bad "stderr is not one line"; cat "$tmp/err"; fi
if [ ! -e "$tmp/never.txt" ] && [ ! -e "$tmp/never.svg" ] && [ ! -s "$tmp/out" ]; then ok "no output file"; else bad "output written on bad input"; fi
head -c 200 "$small" >"$tmp/trunc.json"
expect_rc "truncated" 2 "$LP" profile "$tmp/trunc.json"
expect_in "truncated: message" "$tmp/err" "$tmp/trunc.json: truncated: the JSON ends early (after 200 bytes)"
echo "plain" >"$tmp/x.json.gz"
expect_rc "not gzip" 2 "$LP" profile "$tmp/x.json.gz"
expect_in "not gzip: message" "$tmp/err" "$tmp/x.json.gz: not a gzip file"
mkdir "$tmp/empty"
expect_rc "empty folder" 2 "$LP" profile "$tmp/empty"
expect_in "empty folder: message" "$tmp/err" "$tmp/empty: no trace files (*.json, *.json.gz) in this folder"
expect_rc "missing file" 2 "$LP" profile "$tmp/nope.json"
expect_in "missing: message" "$tmp/err" "$tmp/nope.json: cannot open: No such file or directory"
echo 'return { { match = "x", class = "network" } }' >"$tmp/rules.lua"
expect_rc "bad rules file" 2 "$LP" profile "$small" --rules "$tmp/rules.lua"
expect_in "bad rules: message" "$tmp/err" "--rules: $tmp/rules.lua: rule 1: class must be one of"
echo 'return { { match = "^compute_b$", class = "communication" } }' >"$tmp/rules.lua"
expect_rc "rules file" 0 "$LP" profile "$small" --rules "$tmp/rules.lua" --format json
expect_in "rules: compute_b is communication" "$tmp/out" '"communication":40.0,'
cat >"$tmp/map.lua" <<'LUA'
return { mapping = { ["mlp(B)"] = { kind = "W" } } } -- a user's phase mapping
LUA
expect_rc "mapping from a rules file" 0 "$LP" profile "$small" --rules "$tmp/map.lua" --costs
expect_in "mapping: mlp(B) as W" "$tmp/out" "--cost F=0.060,B=0.009,W=0.009,FB=0.064"
expect_rc "--no-exchanges" 0 "$LP" profile "$small" --costs --no-exchanges
expect_in "--no-exchanges: F is compute only" "$tmp/out" "--cost F=0.025,B=0.009,W=0.000,FB=0.064"
expect_rc "--rank absent" 2 "$LP" profile "$small" --rank 1 --costs
expect_in "--rank: message" "$tmp/err" "--rank 1: the traces hold ranks 3"
expect_rc "help profile" 0 "$LP" help profile
expect_in "help: usage" "$tmp/out" "Usage: luapipe profile"

# a trace luapipe wrote (here the simulator's): its operations are what the
# ranks timed, worded as such, on tracks, not GPU operations on streams
expect_rc "simulate --trace" 0 "$LP" simulate 1f1b --pp 2 --microbatches 2 --no-gantt --trace "$tmp/sim.json"
expect_rc "profile of luapipe's trace" 0 "$LP" profile "$tmp/sim.json"
expect_in "luapipe's trace said so" "$tmp/out" "a trace luapipe wrote: its operations are the actions, messages and all-to-alls each rank timed (CPU work on a CPU run, not GPU kernels)"
expect_in "timed operations on tracks" "$tmp/out" "rank 0 ($tmp/sim.json): 8 timed operations on 2 tracks"
grep -q "GPU operations" "$tmp/out" && bad "luapipe's trace read as GPU operations" || ok "no 'GPU operations' for luapipe's trace"
grep -q "a trace luapipe wrote" <("$LP" profile "$small") && bad "a profiler trace called luapipe's" \
  || ok "a profiler's trace is not called luapipe's"

# DeepSeek's training trace (skipped when absent)
ds=${LUAPIPE_DEEPSEEK_TRACE:-../shared/data/deepseek-profile/train.json}
[ -f "$ds" ] || ds=../../shared/data/deepseek-profile/train.json
if [ -f "$ds" ]; then
  expect_rc "deepseek" 0 "$LP" profile "$ds" --costs --simulate dualpipe --pp 16 --microbatches 32
  expect_in "deepseek: span" "$tmp/out" "983 GPU operations on 3 streams, span 129.012 ms"
  expect_in "deepseek: communication" "$tmp/out" "  communication                     113.030    87.6%"
  expect_in "deepseek: overlapped" "$tmp/out" "  communication overlapped          108.868    96.3%"
  expect_in "deepseek: idle" "$tmp/out" "  idle                                0.497     0.4%"
  expect_in "deepseek: phase totals" "$tmp/out" "  dispatch(F)                   4     26.761     67.808"
  expect_in "deepseek: costs" "$tmp/out" "--cost F=97.391,B=146.678,W=35.067,FB=129.012"
  expect_rc "deepseek: search" 0 "$LP" profile "$ds" --simulate search --pp 16 --microbatches 32 --placement bidirectional --time 0.3
  expect_in "deepseek: search note" "$tmp/out" "search: memory limit 17 activations per rank (DualPipe's peak), placement bidirectional, 0.3 s: lower bound 6485.583, gap "
  row=$(grep '^search (bidirectional) ' "$tmp/out")
  if [ -n "$row" ] && awk -v r="$row" 'BEGIN { split(r, a, " +"); exit !(a[3] + 0 <= 7434.165 && a[7] + 0 <= 17) }'; then
    ok "deepseek: search no slower than DualPipe ($row)"; else bad "deepseek search row: '$row'"; fi
else
  echo "skip DeepSeek's trace (absent: $ds)"
fi
finish
