#!/usr/bin/env bash
# Schedule files: a .lua file that gets the options as `...` and returns a
# schedule works with `luapipe schedule` and `luapipe simulate` (the shipped
# examples/eager_1f1b.lua, examples/custom_schedule.lua given to them, and
# the README's own snippet, taken from README.md); a file that returns
# nothing is told what a schedule file is.
. "$(dirname "$0")/lib.sh"

expect_rc "schedule a schedule file" 0 "$LP" schedule examples/eager_1f1b.lua --pp 3 --microbatches 4
expect_in "its options arrive as ..." "$tmp/out" "schedule 'eager-1f1b': 3 ranks, 3 stages (3 virtual), 4 micro-batches, 24 actions, valid"
expect_in "eager warm-up: 2(P-1-r) forwards" "$tmp/out" "rank 1: 1F0 1F1 1F2 1B0 1F3 1B1 1B2 1B3"
expect_rc "simulate a schedule file" 0 "$LP" simulate examples/eager_1f1b.lua --cost F=1,B=2,latency=0.5 --no-gantt
expect_in "simulated with the defaults (pp 4, 8 micro-batches)" "$tmp/out" \
  "simulated 'eager-1f1b': 4 ranks, 8 micro-batches: makespan 36, largest bubble 12"
expect_rc "schedule.load passes the options" 0 "$LP" -e \
  'local s = assert(luapipe.schedule.load("examples/eager_1f1b.lua", { pp = 2, microbatches = 3 })); print(s)'
expect_in "2 ranks, 3 micro-batches" "$tmp/out" "2 ranks, 2 stages (2 virtual), 3 micro-batches"
expect_rc "a schedule file run as a script" 0 "$LP" examples/eager_1f1b.lua
expect_in "prints its schedule" "$tmp/out" "schedule 'eager-1f1b': 4 ranks"
expect_rc "custom_schedule.lua given to schedule" 0 "$LP" schedule examples/custom_schedule.lua -p 2 -m 2
expect_in "returns the eager schedule" "$tmp/out" "schedule 'eager-1f1b': 2 ranks, 2 stages (2 virtual), 2 micro-batches"
expect_rc "custom_schedule.lua as a script" 0 "$LP" examples/custom_schedule.lua
expect_in "compares with 1F1B" "$tmp/out" "makespan 36, largest bubble 12 (plain 1F1B: 41, 17)"

# the README's snippet, as written
awk '/^-- mine\.lua: luapipe simulate mine\.lua/ { on = 1 } on { print } on && /^return s$/ { exit }' README.md >"$tmp/mine.lua"
[ -s "$tmp/mine.lua" ] && ok "README has the schedule-file snippet" || bad "no schedule-file snippet in README.md"
expect_rc "README snippet: simulate" 0 "$LP" simulate "$tmp/mine.lua" --pp 4 --microbatches 8 --no-gantt
expect_in "README snippet simulated" "$tmp/out" "simulated 'mine': 4 ranks, 8 micro-batches"
expect_rc "README snippet: schedule" 0 "$LP" schedule "$tmp/mine.lua" -p 2 -m 2
expect_in "README snippet: GPipe's order" "$tmp/out" "rank 0: 0F0 0F1 0B0 0B1"

printf 'print("hello")\n' >"$tmp/script.lua"
expect_rc "a script given as a schedule exits 1" 1 "$LP" schedule "$tmp/script.lua"
expect_in "says what a schedule file is" "$tmp/err" \
  "a schedule file must return its schedule, but it returned nothing (it is run with the options {pp =, microbatches =, chunks =} as \`...\`"
expect_in "and how to run a script" "$tmp/err" "a script that does something else runs as \`luapipe $tmp/script.lua\`"
finish
