#!/usr/bin/env bash
# The luapipe program: options, scripts, exit codes, REPL, Ctrl-C.
. "$(dirname "$0")/lib.sh"

expect_rc "-v prints the version" 0 "$LP" -v
expect_in "-v text" "$tmp/out" "luapipe 0.1.0"
expect_rc "--help" 0 "$LP" --help
expect_in "--help lists -e" "$tmp/out" "-e CODE"
expect_rc "unknown option exits 2" 2 "$LP" --bogus
expect_in "unknown option named" "$tmp/err" "unrecognized option '--bogus'"
expect_rc "-e without code exits 2" 2 "$LP" -e
expect_rc "-e runs code" 0 "$LP" -e 'print(1 + 1)'
expect_in "-e output" "$tmp/out" "2"
expect_rc "library preloaded as luapipe" 0 "$LP" -e 'print(type(luapipe), luapipe.version)'
expect_in "luapipe global" "$tmp/out" "table	0.1.0"

cat >"$tmp/args.lua" <<'LUA'
print("script", arg[0], arg[1], arg[2], select("#", ...), ...)
LUA
expect_rc "script with arguments" 0 "$LP" "$tmp/args.lua" a b
expect_in "arg table and ..." "$tmp/out" "script	$tmp/args.lua	a	b	2	a	b"

cat >"$tmp/boom.lua" <<'LUA'
local function inner() error("boom here") end
inner()
LUA
expect_rc "script error exits 1" 1 "$LP" "$tmp/boom.lua"
expect_in "error message" "$tmp/err" "boom.lua:1: boom here"
expect_in "traceback" "$tmp/err" "stack traceback:"
expect_rc "missing script exits 1" 1 "$LP" "$tmp/nope.lua"
expect_in "missing script named" "$tmp/err" "cannot open $tmp/nope.lua"
expect_rc "os.exit code kept" 3 "$LP" -e 'os.exit(3)'

# REPL (-i with piped input): expressions print, statements continue over
# lines, an error prints a traceback and the REPL goes on.
printf 'x = 20\nx + 1\n=x*2\nfor i = 1, 2 do\n  print("loop", i)\nend\nerror("oops")\nprint("still here")\n' \
  | "$LP" -i >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 0 ] && ok "REPL exits 0 at end of input" || bad "REPL exit $rc"
expect_in "REPL prints expressions" "$tmp/out" "21"
expect_in "REPL = prefix" "$tmp/out" "40"
expect_in "REPL continues statements" "$tmp/out" "loop	2"
expect_in "REPL reports errors" "$tmp/err" "oops"
expect_in "REPL error traceback" "$tmp/err" "stack traceback:"
expect_in "REPL goes on after an error" "$tmp/out" "still here"
printf 's = luapipe.schedule.new{ranks = 2, stages = 2, microbatches = 1}\ns\n' \
  | "$LP" -i >"$tmp/out" 2>"$tmp/err"
expect_in "REPL prints a schedule summary" "$tmp/out" "schedule (unnamed): 2 ranks, 2 stages"

# Ctrl-C interrupts a running chunk: in a script it exits 1 with
# "interrupted!"; in the REPL the REPL goes on.
"$LP" -e 'while true do end' >"$tmp/out" 2>"$tmp/err" &
pid=$!
sleep 0.5
kill -INT $pid
wait $pid
rc=$?
[ "$rc" -eq 1 ] && ok "Ctrl-C stops a chunk (exit 1)" || bad "Ctrl-C: exit $rc"
expect_in "Ctrl-C message" "$tmp/err" "interrupted!"

mkfifo "$tmp/in"
"$LP" -i <"$tmp/in" >"$tmp/out" 2>"$tmp/err" &
pid=$!
exec 3>"$tmp/in"
echo 'while true do end' >&3
sleep 0.7
kill -INT $pid
sleep 0.3
echo 'print("alive after interrupt")' >&3
exec 3>&-
wait $pid
expect_in "REPL survives Ctrl-C" "$tmp/out" "alive after interrupt"
expect_in "REPL reports the interrupt" "$tmp/err" "interrupted!"

# Subcommands and help
expect_rc "help" 0 "$LP" help
expect_in "help lists simulate" "$tmp/out" "simulate"
expect_rc "help simulate" 0 "$LP" help simulate
expect_in "help simulate shows --cost" "$tmp/out" "--cost"
expect_rc "help env" 0 "$LP" help env
expect_in "help env lists LUAPIPE_TIMEOUT" "$tmp/out" "LUAPIPE_TIMEOUT"
expect_rc "help on unknown topic exits 2" 2 "$LP" help nonsense
expect_rc "bad subcommand option exits 2" 2 "$LP" simulate 1f1b --bogus
expect_in "usage printed" "$tmp/err" "Usage: luapipe simulate"

finish
