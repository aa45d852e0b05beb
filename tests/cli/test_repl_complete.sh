#!/usr/bin/env bash
# test_repl_complete.sh LUAPIPE — the REPL on a terminal (tests/cli/pty_run,
# keys typed as a person types them): Tab completes luapipe's names, a
# module's functions and a value's methods (readline's completion hook,
# luapipe.repl.complete); a second Tab lists the choices; a failed push
# leaves the list as it was, and an invalid schedule's simulate raises.
. "$(dirname "$0")/lib.sh"
PTY_RUN=$(dirname "$LP")/pty_run
[ -x "$PTY_RUN" ] || { bad "no terminal driver at $PTY_RUN (build the pty_run target)"; finish; }
TERM=xterm LUAPIPE_HISTORY= NO_COLOR= timeout 60 "$PTY_RUN" --timeout 30 --prompt "luapipe> " \
  --type 'luap\t.version' \
  --type 'luapipe.schedule\t\ts.li\t()[2]' \
  --send 's = luapipe.schedule.build("1f1b", {pp = 2, microbatches = 2})' \
  --type 'print("checked", s:vali\t())' \
  --type 'print("families", #luapipe.schedule.fam\t)' \
  --send 'p = luapipe.schedule.new{ranks = 1, stages = 1, microbatches = 2}' \
  --type 'p:pu\t(0, {"0F0", "0F1", "0X1"})' \
  --type 'print("kept", p:cou\t(0))' \
  --send 'p:set(0, {"0F0", "0F1", "0B1"})' \
  --type 'p:simu\t()' \
  --type 'print("no match", luapipe.frob\t)' \
  --send "^D" -- "$LP" >"$tmp/raw" 2>&1
rc=$?
sed 's/\x1b\[[?0-9;]*[a-zA-Z]//g; s/\r//g; s/\x07//g' "$tmp/raw" >"$tmp/out" # terminal codes off
[ "$rc" -eq 0 ] && ok "REPL on a terminal, Ctrl-D ends it (exit 0)" \
  || bad "REPL exit $rc"
expect_in "a global: luap<Tab> is luapipe" "$tmp/out" "luapipe> luapipe.version"
expect_in "the second Tab lists luapipe's names that start so" "$tmp/out" "luapipe.schedule   luapipe.schedules"
expect_in "a module's function: schedules.li<Tab> is list" "$tmp/out" "luapipe> luapipe.schedules.list()[2]"
grep -q '^1f1b$' "$tmp/out" && ok "the completed line ran" || bad "luapipe.schedules.list()[2] printed no 1f1b"
expect_in "a value's method: s:vali<Tab> is s:validate" "$tmp/out" 'print("checked", s:validate())'
expect_in "and it ran" "$tmp/out" "checked	true"
expect_in "a module's field: luapipe.schedule.fam<Tab>" "$tmp/out" "families	8"
expect_in "p:pu<Tab> completes as far as the choices agree" "$tmp/out" 'p:push(0, {"0F0", "0F1", "0X1"})'
expect_in "the bad action is named" "$tmp/out" "rank 0, action 2: action '0X1': unknown action type 'X'"
expect_in "a failed push leaves the list as it was" "$tmp/out" "kept	0"
expect_in "an invalid schedule's simulate raises, naming the problem" "$tmp/out" \
  "luapipe: simulate: micro-batch 0 is never backwarded on stage 0 (rank 0)"
expect_in "a name with no match stays as typed" "$tmp/out" "no match	nil"
[ "$fails" -eq 0 ] || sed "s/^/  | /" "$tmp/out" | tail -30
finish
