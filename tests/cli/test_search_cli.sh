#!/usr/bin/env bash
# `luapipe search`: the text table, the JSON keys, the files it writes
# (CSV that simulate reads back), and its error paths.
. "$(dirname "$0")/lib.sh"

# ZB-H2: F = B = W, linear, memory 2P-1 under Zero Bubble's rule: zero span bubble
expect_rc "search zb-h2" 0 "$LP" search --pp 4 --microbatches 12 --cost F=1,B=2,W=1 --memory 7 \
  --w-share 0.5 --objective span --time 0.5
grep -qE '^search \(linear\) +[0-9.]+ +36 ' "$tmp/out" && ok "span 36 = 3M" || bad "span 36: $(grep '^search' "$tmp/out")"
expect_in "gap 0 said" "$tmp/out" "gap 0.00% (optimal for this cost model)"
expect_in "families beside it" "$tmp/out" "ZB1P"
expect_in "lower bound printed" "$tmp/out" "lower bound (span) 36"
expect_in "families over the limit named" "$tmp/out" "GPipe (peak 12)"

# JSON: stable keys; the schedule is luapipe's schedule JSON
expect_rc "search json" 0 "$LP" search -p 4 -m 8 --cost F=1,B=2,W=1,FB=2.2 --memory 4 --placement v \
  --time 0.3 --format json -o "$tmp/found.csv" --svg "$tmp/found.svg"
for k in makespan span lower_bound gap peak_memory placement schedule evaluations seconds; do
  expect_in "json key $k" "$tmp/out" "\"$k\":"
done
expect_in "json schedule has actions" "$tmp/out" '"virtual_stages":'
expect_in "json placement v" "$tmp/out" '"placement":"v"'
[ -s "$tmp/found.csv" ] && ok "csv written" || bad "csv written"
grep -q "<svg" "$tmp/found.svg" && ok "svg written" || bad "svg written"
# two commands from search to the simulator: the CSV reads back (V stages cost half)
ms=$(sed -n 's/^  "makespan":\([0-9.]*\),*$/\1/p' "$tmp/out" | head -1)
expect_rc "simulate the found csv" 0 "$LP" simulate "$tmp/found.csv" --cost F=0.5,B=1,W=0.5,FB=1.1 --no-gantt
grep -q "makespan $(printf '%g' "$ms")," "$tmp/out" && ok "simulated makespan = search's ($ms)" \
  || bad "simulated makespan: $(grep makespan "$tmp/out") vs $ms"

# errors: one line, exit 2 for usage
expect_rc "search --robust" 0 "$LP" search -p 4 -m 8 --cost F=1,B=2,W=1,latency=0.2 --memory 5 --robust --time 0.3 --format json
expect_in "robust p90 in json" "$tmp/out" '"p90":'

expect_rc "memory below one micro-batch" 1 "$LP" search -p 4 -m 4 --memory 0.5 --time 0.1
expect_in "memory message" "$tmp/err" "luapipe search: the memory limit of rank 0 (0.5 activations) is less than one micro-batch needs there (1)"
expect_rc "bad placement exits 2" 2 "$LP" search --placement zigzag
expect_in "placement message" "$tmp/err" "--placement 'zigzag': expected linear, interleaved:V, v, bidirectional or any"
expect_rc "bad w-share exits 2" 2 "$LP" search --w-share 2
expect_in "w-share message" "$tmp/err" "--w-share must be from 0 to 1"
expect_rc "bad cost exits 2" 2 "$LP" search --cost F=x
expect_in "cost message" "$tmp/err" "F=x"
expect_rc "unwritable output exits 1" 1 "$LP" search -p 2 -m 2 --time 0.05 -o /nonexistent/dir/x.csv
[ ! -e /nonexistent/dir/x.csv ] && ok "nothing half-written" || bad "file appeared"
# Ctrl-C stops the search and keeps the best so far (script and CLI)
"$LP" -e 'local r = luapipe.search{pp = 8, microbatches = 32, memory = 4, time = 60, progress = false}
  print("kept", r:makespan(), r.interrupted)' >"$tmp/out" 2>"$tmp/err" &
pid=$!
sleep 1.5
kill -INT $pid
wait $pid
rc=$?
[ "$rc" -eq 0 ] && ok "Ctrl-C ends luapipe.search (exit 0)" || { bad "Ctrl-C: exit $rc"; cat "$tmp/err"; }
expect_in "the best so far is kept" "$tmp/out" "true"
expect_in "the interrupt is said" "$tmp/err" "search interrupted: keeping the best so far"
"$LP" search -p 8 -m 32 --memory 4 --time 60 >"$tmp/out" 2>"$tmp/err" &
pid=$!
sleep 1.5
kill -INT $pid
wait $pid
rc=$?
[ "$rc" -eq 0 ] && ok "Ctrl-C ends luapipe search (exit 0)" || { bad "CLI Ctrl-C: exit $rc"; cat "$tmp/err"; }
expect_in "CLI prints the best so far" "$tmp/out" "(interrupted: the best so far)"

# the example: its own placement generator and objective
expect_rc "examples/search_custom.lua" 0 "$LP" examples/search_custom.lua --time 0.1 -o "$tmp/w.csv"
expect_in "example prints the W placement" "$tmp/out" "W (own generator)"
expect_rc "example csv simulates" 0 "$LP" simulate "$tmp/w.csv" --no-gantt
expect_rc "help search" 0 "$LP" help search
expect_in "help names --w-share" "$tmp/out" "--w-share"

# the bound's parts: only those that bound the objective asked for
expect_rc "span objective" 0 "$LP" search -p 4 -m 12 --cost F=1,B=2,W=1 --memory 7 --w-share 0.5 \
  --objective span --time 0.2
expect_in "span's bound: work, critical path, memory-time" "$tmp/out" \
  "lower bound (span) 36: work 36, critical path 9, memory-time 13.714"
grep -q "lower bound (span).*start skew" "$tmp/out" && bad "span's bound lists the start skew" \
  || ok "span's bound leaves the start skew out (a makespan bound)"
expect_rc "makespan objective" 0 "$LP" search -p 4 -m 12 --cost F=1,B=2,W=1 --memory 6 --time 0.2
expect_in "makespan's bound lists the start skew too" "$tmp/out" \
  "lower bound (makespan) 39: work 36, start skew 39, critical path 9, memory-time 16"
# weight-grads pending beyond the limit: said, with how --w-share counts them
expect_rc "w-share 0, memory 6" 0 "$LP" search -p 4 -m 12 --cost F=1,B=2,W=1 --memory 6 --objective span --time 0.2
expect_in "pending W over the limit is said" "$tmp/out" "weight-grads pending at once"
expect_in "and how --w-share 0 counts them" "$tmp/out" \
  "with --w-share 0 a pending W counts as no memory, so the limit does not bound them"
expect_rc "w-share 0.5, memory 7" 0 "$LP" search -p 4 -m 12 --cost F=1,B=2,W=1 --memory 7 --w-share 0.5 --time 0.2
grep -q "pending at once" "$tmp/out" && expect_in "--w-share 0.5 counts them at half" "$tmp/out" \
  "--w-share 0.5 counts each as 0.5 of an activation" || ok "no pending W over the limit at --w-share 0.5"
expect_rc "no limit" 0 "$LP" search -p 4 -m 12 --cost F=1,B=2,W=1 --time 0.2
grep -q "pending at once" "$tmp/out" && bad "a note about pending W without a memory limit" \
  || ok "no note without a memory limit"
finish
