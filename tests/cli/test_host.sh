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
# tables are shown (depth-limited, cycles safe), s:push echoes nothing, the
# REPL's help is the Lua API's
printf '%s\n' 't = {1, 2, x = {y = 3}}' 't' 'c = {}; c.me = c' 'c' '{a = {b = {c = {d = 1}}}}' \
  's = luapipe.schedule.new{ranks = 1, stages = 1, microbatches = 1}' 's:push(0, "0F0")' \
  's:push(0, {"0B0"})' 'print("pushed")' 's' 'luapipe.help("simulate")' 'luapipe.schedul' \
  | "$LP" -i >"$tmp/out" 2>"$tmp/err"
expect_in "REPL shows a table" "$tmp/out" "{1, 2, x = {y = 3}}"
expect_in "REPL shows a cycle safely" "$tmp/out" "{me = <cycle>}"
expect_in "REPL limits the depth" "$tmp/out" "{a = {b = {c = {...} (1 entry)}}}"
grep -q "table: 0x" "$tmp/out" && bad "REPL printed a table address" || ok "no table addresses"
grep -q "INVALID" "$tmp/out" && bad "s:push echoed the schedule" || ok "s:push echoes nothing"
expect_in "the schedule after the pushes" "$tmp/out" "schedule (unnamed): 1 rank, 1 stage (1 virtual), 1 micro-batch, 2 actions, valid"
expect_in "help(\"simulate\") says it is a command" "$tmp/out" "'simulate' is a command of the luapipe program, not a Lua API topic"
expect_in "a mistyped name: did you mean" "$tmp/err" "luapipe has no 'schedul' (did you mean 'schedule'?)"

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

# A Ctrl-C that arrives outside any call is not lost, even when the process
# was started with SIGINT ignored (bash does that for background jobs): the
# script below is still being read (a fifo) when the signal comes; the
# chunk must then be interrupted at once instead of looping forever.
mkfifo "$tmp/slow.lua"
( trap '' INT; exec "$LP" "$tmp/slow.lua" ) >"$tmp/out" 2>"$tmp/err" &
pid=$!
( sleep 30; kill -KILL $pid 2>/dev/null ) &
watchdog=$!
exec 3>"$tmp/slow.lua" # opens once luapipe opens the script: its handler is in place
kill -INT $pid
sleep 0.2
trap '' PIPE # a build that dies of the signal must fail this check, not the script
echo 'while true do end' >&3
exec 3>&-
trap - PIPE
wait $pid
rc=$?
kill $watchdog 2>/dev/null
wait $watchdog 2>/dev/null
[ "$rc" -eq 1 ] && ok "early Ctrl-C with SIGINT ignored by the parent interrupts (exit 1)" \
  || bad "early Ctrl-C: exit $rc (137 = hung and killed)"
expect_in "early Ctrl-C message" "$tmp/err" "interrupted!"

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


# ---- the bare program: lua5.4's behaviour on a pipe and on a terminal ----
echo 'print(1 + 1, arg[0] ~= nil, #arg)' | "$LP" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 0 ] && ok "piped stdin runs (exit 0)" || bad "piped stdin: exit $rc"
expect_in "piped stdin output" "$tmp/out" "2	true	0"
printf 'print("from file", ...)\n' >"$tmp/stdin.lua"
expect_rc "luapipe < file.lua" 0 "$LP" <"$tmp/stdin.lua"
expect_in "stdin script output" "$tmp/out" "from file"
"$LP" - x y <"$tmp/stdin.lua" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 0 ] && ok "luapipe - ARGS (exit 0)" || bad "luapipe - ARGS"
expect_in "luapipe - passes its arguments" "$tmp/out" "from file	x	y"
expect_rc "empty stdin exits 0" 0 "$LP" </dev/null
echo 'error("piped boom")' | "$LP" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] && ok "error on piped stdin exits 1" || bad "piped error exit"
expect_in "piped error message" "$tmp/err" "piped boom"
expect_rc "-e: arg[0] is the program" 0 "$LP" -e 'print("arg0=" .. arg[0], arg[1], arg[2])'
expect_in "arg[0] not the code" "$tmp/out" "arg0=$LP	-e	print("

# the terminal driver: tests/cli/pty_run.c, built beside luapipe
PTY_RUN=$(dirname "$LP")/pty_run
[ -x "$PTY_RUN" ] || { bad "no terminal driver at $PTY_RUN (build the pty_run target)"; finish; }
pty() { TERM=xterm LUAPIPE_HISTORY= NO_COLOR= timeout 60 "$PTY_RUN" "$@"; }
pty --timeout 30 --prompt "luapipe> " --prompt ">> " --send "1+1" \
  --send 's = luapipe.schedule.build("1f1b", {pp = 2, microbatches = 2})' --send "s:show()" \
  --send 'luapipe.help("schedules")' --send 'luapipe.help("nonsense")' \
  --send 't = {1, "two", sub = {3}}' --send 't' --send 'p = luapipe.schedule.new{ranks = 1, stages = 1, microbatches = 1}' \
  --send 'p:push(0, "0F0")' --send 'luapipe.help()' \
  --send "x = 1 +" --send "^C" --send 'print("after " .. "ctrl-c")' --send "^D" \
  -- "$LP" >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && ok "bare luapipe on a terminal: REPL, Ctrl-D ends it (exit 0)" \
  || { bad "bare luapipe on a terminal: exit $rc"; sed 's/^/  | /' "$tmp/out" | head -30; }
sed 's/\x1b\[[?0-9;]*[a-zA-Z]//g; s/\r//g' "$tmp/out" >"$tmp/clean" # terminal codes off
mv "$tmp/clean" "$tmp/out"
expect_in "REPL banner" "$tmp/out" "the library is \`luapipe\`"
grep -q '^2$' "$tmp/out" && ok "REPL prints 1+1" || bad "REPL did not print 2"
expect_in "s:show() draws" "$tmp/out" "r1 |"
grep -q '^true$' "$tmp/out" && bad "s:show() echoed true" || ok "s:show() echoes nothing"
expect_in "help(schedules) on a terminal" "$tmp/out" "schedules.list()"
expect_in "help(unknown) names it" "$tmp/out" "unknown help topic 'nonsense'; topics:"
expect_in "a table on a terminal" "$tmp/out" '{1, "two", sub = {3}}'
grep -q "INVALID" "$tmp/out" && bad "s:push echoed on a terminal" || ok "s:push echoes nothing on a terminal"
expect_in "help() lists the API and says where the commands' help is" "$tmp/out" "\`luapipe help <command>\` in a shell"
expect_in "Ctrl-C at a continuation prompt drops the statement" "$tmp/out" "after ctrl-c"
grep -q "stdin:.*unexpected symbol\|'=' expected" "$tmp/out" && bad "dropped statement was compiled" \
  || ok "no syntax error from the dropped statement"

# ---- colour: only when the output ends at a terminal ----
esc=$(printf '\033[')
pty -- "$LP" schedule 1f1b -f gantt >"$tmp/out" 2>&1
grep -qF "$esc" "$tmp/out" && ok "colour on a terminal" || bad "no colour on a terminal"
TERM=xterm "$LP" schedule 1f1b -f gantt >"$tmp/out" 2>&1
grep -qF "$esc" "$tmp/out" && bad "colour into a pipe" || ok "no colour into a pipe"
TERM=xterm NO_COLOR=1 timeout 60 "$PTY_RUN" -- "$LP" schedule 1f1b -f gantt >"$tmp/out" 2>&1
grep -qF "$esc" "$tmp/out" && bad "colour despite NO_COLOR" || ok "NO_COLOR honoured"
pty -- "$LP" --color=never schedule 1f1b -f gantt >"$tmp/out" 2>&1
grep -qF "$esc" "$tmp/out" && bad "colour despite --color=never" || ok "--color=never"
TERM=xterm "$LP" --color=always schedule 1f1b -f gantt >"$tmp/out" 2>&1
grep -qF "$esc" "$tmp/out" && ok "--color=always into a pipe" || bad "--color=always gave none"
expect_rc "--color=bogus exits 2" 2 "$LP" --color=bogus -e 1
expect_in "--color=bogus named" "$tmp/err" "'--color=bogus': use --color=auto"
if command -v mpirun >/dev/null; then
  # under mpirun a rank's stdout is mpirun's pseudo-terminal: what counts is
  # where mpirun's own output goes
  probe='io.write("color=", tostring(require("luapipe.show").use_color()), "\n")'
  TERM=xterm timeout 60 mpirun --oversubscribe -np 1 "$LP" -e "$probe" >"$tmp/out" 2>"$tmp/err"
  expect_in "mpirun > file: no colour" "$tmp/out" "color=false"
  pty -- mpirun --oversubscribe -np 1 "$LP" -e "$probe" >"$tmp/out" 2>&1
  expect_in "mpirun on a terminal: colour" "$tmp/out" "color=true"
fi

# ---- commands: unknown words, family names, counting options ----
expect_rc "neither a command nor a file exits 2" 2 "$LP" frobnicate
expect_in "says so" "$tmp/err" "luapipe: 'frobnicate' is neither a command nor a file"
expect_in "lists the commands" "$tmp/err" "Commands: schedule, simulate, bubbles, eplb, search, profile, model, help"
expect_rc "a missing script exits 1" 1 "$LP" "$tmp/no-such-script.lua"
expect_in "a missing script is named with the reason" "$tmp/err" "cannot open $tmp/no-such-script.lua: No such file or directory"
expect_rc "a missing *.lua name is a script, not a command" 1 "$LP" no-such-script.lua
expect_in "says it cannot open it" "$tmp/err" "luapipe: cannot open no-such-script.lua: No such file or directory"
expect_rc "a directory is not a script" 1 "$LP" "$tmp"
expect_in "says it is a directory" "$tmp/err" "Is a directory"
expect_rc "near miss of a command" 2 "$LP" simulte
expect_in "did you mean a command" "$tmp/err" "(did you mean 'simulate'?)"
expect_rc "family names in any case" 0 "$LP" schedule DualPipe -p 4 -m 8
expect_in "DualPipe built" "$tmp/out" "schedule 'dualpipe'"
expect_rc "unknown family exits 2" 2 "$LP" simulate dualpip
expect_in "did you mean a family" "$tmp/err" "unknown schedule family 'dualpip'; did you mean 'dualpipe'?"
for cmd in "schedule 1f1b" "simulate zb1p" "bubbles"; do
  for bad_opt in "--pp 0|--pp must be from 1 to 4096, got '0'" \
    "--pp 1.5|--pp must be an integer from 1 to 4096, got '1.5'" \
    "--pp 9223372036854775807|--pp must be from 1 to 4096, got '9223372036854775807'" \
    "--microbatches 1e9|--microbatches must be from 1 to 65536, got '1e9'" \
    "--microbatches x|--microbatches must be an integer from 1 to 65536, got 'x'" \
    "--chunks 1e9|--chunks must be from 1 to 64, got '1e9'" \
    "--chunks=-1|--chunks must be from 1 to 64, got '-1'"; do
    # shellcheck disable=SC2086
    expect_rc "$cmd ${bad_opt%%|*} exits 2" 2 timeout 60 "$LP" $cmd ${bad_opt%%|*}
    expect_in "$cmd ${bad_opt%%|*} message" "$tmp/err" "${bad_opt#*|}"
  done
done
expect_rc "too many passes exits 2" 2 timeout 60 "$LP" simulate 1f1b --pp 4096 --microbatches 65536
expect_in "pass limit named" "$tmp/err" "is more than the limit of 4194304"
expect_rc "family parameter error is a usage error" 2 "$LP" simulate dualpipe --pp 3
for cmd in "simulate 1f1b" "bubbles"; do
  for c in "F=1e308|--cost: cost item 'F=1e308': F = 1e+308 must be a number in 0..1e+15" \
    "F=inf|cost item 'F=inf': 'inf' is not a number" "W=nan|cost item 'W=nan': 'nan' is not a number" \
    "F=1,,Q=2|unknown key 'Q'"; do
    # shellcheck disable=SC2086
    expect_rc "$cmd --cost ${c%%|*} exits 2" 2 "$LP" $cmd --cost "${c%%|*}"
    expect_in "$cmd --cost ${c%%|*} message" "$tmp/err" "${c#*|}"
    grep -q "traceback" "$tmp/err" && bad "$cmd --cost ${c%%|*}: traceback" || ok "no traceback"
  done
done
expect_rc "per-stage B < W exits 2" 2 "$LP" simulate 1f1b --cost "B[3]=0,W=1"
expect_in "per-stage B < W message" "$tmp/err" "luapipe simulate: --cost: cost of model stage 3: B = 0 is less than W = 1"
expect_rc "stage out of range exits 2" 2 "$LP" simulate 1f1b --cost "F[9]=1"
expect_in "stage out of range message" "$tmp/err" \
  "--cost: per-stage cost [9] (as in F[9]=...): this schedule's model stages are 0..3"
expect_rc "bubbles: per-stage cost exits 2" 2 "$LP" bubbles --cost "B[3]=0"
expect_in "bubbles: per-stage cost message" "$tmp/err" "per-stage costs (such as B[3]=...) do not apply"
expect_rc "bubbles: B < W exits 2" 2 "$LP" bubbles --cost "B=1,W=2"
expect_in "bubbles: B < W in the user's terms" "$tmp/err" "luapipe bubbles: --cost: B = 1 is less than W = 2"
expect_rc "help train (API topic)" 0 "$LP" help train
expect_in "help train content" "$tmp/out" "train{model=, schedule="
expect_rc "help luapipe.eplb" 0 "$LP" help luapipe.eplb
expect_in "help luapipe.eplb content" "$tmp/out" "eplb.rebalance{load="

finish
