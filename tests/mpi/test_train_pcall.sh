#!/usr/bin/env bash
# test_train_pcall.sh LUAPIPE — the library never ends the process: under
# mpirun, pcall(luapipe.train, bad options) returns on every rank with a
# luapipe.Error whose fields say every rank has it (and the exit status the
# program's policy would use); a mistake on one rank reaches every rank; a
# missing checkpoint likewise; a failure that strands the other ranks says
# so, and when raised again the job policy (luapipe.cli.job) takes the job
# down naming the rank; an uncaught options error is printed once and every
# rank exits 2. Runs tests/mpi/train_pcall.lua. Exits 77 without mpirun.
. "$(dirname "$0")/lib.sh"
mpirun=(timeout -k 5 120 mpirun --oversubscribe)
script=tests/mpi/train_pcall.lua
# count NAME FILE TEXT N: TEXT (fixed) on N lines of FILE
count() { local n; n=$(grep -cF -- "$3" "$2"); [ "$n" -eq "$4" ] ||
  { fail "$1: '$3' on $n lines, expected $4"; sed 's/^/  | /' "$2" | head -20; }; }
steps_msg="luapipe.train: 'steps' must be a non-negative integer, got \"ten\""

# every rank's options are wrong: each rank catches it, the job goes on
"${mpirun[@]}" -np 3 "$luapipe" "$script" options >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "options: exit $rc"
count "options: caught on every rank" "$tmp/out" "caught everywhere=true stranded=nil status=2 speaker=0 option=steps text=" 3
count "options: the message" "$tmp/out" "$steps_msg" 3
count "options: every rank went on" "$tmp/out" ": after: true" 3

# only rank 1's options are wrong: every rank still returns; rank 1 has its
# own message, the others name rank 1
"${mpirun[@]}" -np 3 "$luapipe" "$script" one_rank >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "one_rank: exit $rc"
count "one_rank: caught on every rank" "$tmp/out" "caught everywhere=true stranded=nil status=2 speaker=1 option=" 3
count "one_rank: rank 1's own message" "$tmp/out" "rank 1: caught everywhere=true stranded=nil status=2 speaker=1 option=steps text=rank 1: " 1
count "one_rank: the others name rank 1" "$tmp/out" \
  "text=luapipe.train: the options were refused on rank 1 (see its message)" 2
count "one_rank: every rank went on" "$tmp/out" ": after: true" 3

# resume without a checkpoint: every rank returns the same error (status 1)
"${mpirun[@]}" -np 2 "$luapipe" "$script" resume "$tmp/none" >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "resume: exit $rc"
count "resume: caught on every rank" "$tmp/out" "caught everywhere=true stranded=nil status=1 speaker=0 option=nil" 2
count "resume: names the directory" "$tmp/out" "there is no checkpoint in '$tmp/none'" 2
count "resume: every rank went on" "$tmp/out" ": after: true" 2

# a failure on rank 1 in the middle of a step: rank 1's error says the
# others wait; raised again, the policy takes every rank down at once
LUAPIPE_TIMEOUT=60 "${mpirun[@]}" -x LUAPIPE_TIMEOUT -np 2 "$luapipe" "$script" stranded >"$tmp/out" 2>&1
rc=$?
[ "$rc" -ne 0 ] || fail "stranded: exit 0"
count "stranded: rank 1 caught it, stranded" "$tmp/out" "rank 1: caught everywhere=nil stranded=true" 1
count "stranded: the job was taken down, naming rank 1" "$tmp/out" "luapipe: rank 1: " 1
count "stranded: no rank went on" "$tmp/out" ": after:" 0
count "stranded: not the watchdog" "$tmp/out" "timed out" 0

# not caught: the program's policy prints it once, every rank exits 2
"${mpirun[@]}" -np 3 "$luapipe" "$script" uncaught >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "uncaught: exit $rc, expected 2"
count "uncaught: printed once" "$tmp/out" "$steps_msg" 1
count "uncaught: no traceback" "$tmp/out" "stack traceback" 0

[ "$fails" -eq 0 ] && echo "all checks passed" || { echo "$fails check(s) failed"; exit 1; }
