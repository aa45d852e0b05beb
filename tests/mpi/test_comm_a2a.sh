#!/usr/bin/env bash
# test_comm_a2a.sh LUAPIPE — all-to-all-v, split communicators and the
# emulated link on real ranks (run from the repo root): uneven counts with
# zeros on 2, 3 and 4 ranks, a message on a lat=20ms link completes no
# earlier than 20 ms after its start, a late sender's message no earlier
# than its own start + latency (comm_check.lua a2a); 4 ranks split into a
# 2 x 2 grid with all-reduce, barrier, broadcast and all-to-all-v in the
# groups (grid); the watchdog when a rank never joins an all-to-all-v
# (a2a_silent) or a split (split_silent); a malformed LUAPIPE_LINK stops
# the job with the parser's message. Exits 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
mpirun=(timeout -k 5 60 mpirun --oversubscribe)

# 1. without mpirun: all-to-all-v on the self backend is the copy
out=$(env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK "$luapipe" -e '
  local c = require("luapipe.comm")
  local g = c.alltoallv({{1, 2.5}})
  local s = c.split(3)
  print(#g, g[1][1], g[1][2], s:size(), s:alltoallv({{7}})[1][1])')
[ "$out" = "$(printf '1\t1.0\t2.5\t1\t7.0')" ] || fail "plain run: got '$out'"

for np in 2 3 4; do
  "${mpirun[@]}" -np $np "$luapipe" tests/mpi/comm_check.lua a2a >"$tmp/out" 2>"$tmp/err"
  rc=$?
  echo "a2a on $np ranks: rc $rc"
  [ "$rc" -eq 0 ] && [ "$(grep -c ': ok$' "$tmp/out")" -eq $np ] ||
    { fail "a2a on $np ranks"; cat "$tmp/out" "$tmp/err"; }
done

"${mpirun[@]}" -np 4 "$luapipe" tests/mpi/comm_check.lua grid >"$tmp/out" 2>"$tmp/err"
rc=$?
echo "grid: rc $rc"
[ "$rc" -eq 0 ] && [ "$(grep -c ': ok$' "$tmp/out")" -eq 4 ] ||
  { fail "grid"; cat "$tmp/out" "$tmp/err"; }

LUAPIPE_TIMEOUT=2 "${mpirun[@]}" -x LUAPIPE_TIMEOUT -np 2 "$luapipe" \
  tests/mpi/comm_check.lua a2a_silent >"$tmp/out" 2>"$tmp/err"
rc=$?
echo "a2a_silent: rc $rc"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "a2a_silent: mpirun exited $rc"
want="luapipe: rank 0: timed out after 2 s (LUAPIPE_TIMEOUT) in an all-to-all-v on rank 0 (2 ranks) sending 1 float to and receiving 1 float from other ranks: dispatch of layer 3 (5F2)"
grep -qF "$want" "$tmp/err" || { fail "a2a_silent: message missing"; cat "$tmp/err"; }
grep -qE '^rank 0: alltoallv returned after (1\.9|2\.[0-9]) s' "$tmp/err" ||
  { fail "a2a_silent: did not return after ~2 s"; cat "$tmp/err"; }

LUAPIPE_TIMEOUT=2 "${mpirun[@]}" -x LUAPIPE_TIMEOUT -np 2 "$luapipe" \
  tests/mpi/comm_check.lua split_silent >"$tmp/out" 2>"$tmp/err"
rc=$?
echo "split_silent: rc $rc"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "split_silent: mpirun exited $rc"
want="luapipe: rank 0: timed out after 2 s (LUAPIPE_TIMEOUT) in a barrier on rank 0 (2 ranks): splitting the communicator (color 0, key 0)"
grep -qF "$want" "$tmp/err" || { fail "split_silent: message missing"; cat "$tmp/err"; }

LUAPIPE_LINK=lat=5 "${mpirun[@]}" -x LUAPIPE_LINK -np 2 "$luapipe" -e 'print("ran")' >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -ne 0 ] && ! grep -q ran "$tmp/out" &&
  grep -qF "luapipe: LUAPIPE_LINK: link 'lat=5': lat=5 needs a unit (us, ms or s)" "$tmp/err" ||
  { fail "bad LUAPIPE_LINK: rc $rc"; cat "$tmp/out" "$tmp/err"; }

if [ "$fails" -ne 0 ]; then
  echo "test_comm_a2a: $fails failure(s)"
  exit 1
fi
echo "test_comm_a2a: all passed"
