#!/usr/bin/env bash
# test_comm.sh LUAPIPE — the comm layer on real ranks (run from the repo
# root): a plain run is rank 0 of 1; 4 ranks under mpirun pass ring
# send/recv, all-reduce, barrier and error checks (comm_check.lua basic);
# the watchdog: with LUAPIPE_TIMEOUT=2 rank 1 never sends (or leaves with
# os.exit), rank 0's recv fails after ~2 s naming both ranks, the tag and
# the description, and the whole job ends non-zero instead of hanging;
# comm.abort on one rank ends ranks that wait in recv.
# Exits 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
mpirun=(timeout -k 5 60 mpirun --oversubscribe)
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# 1. without mpirun: the self backend, no MPI_Init
out=$(env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK "$luapipe" -e '
  local c = require("luapipe.comm")
  print(c.rank(), c.size(), c.backend(), c.allreduce({1.5})[1], c.barrier())')
[ "$out" = "$(printf '0\t1\tself\t1.5\ttrue')" ] || fail "plain run: got '$out'"

err=$(env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK "$luapipe" -e '
  require("luapipe.comm").abort("boom"); print("still here")' 2>&1)
rc=$?
[ "$rc" -eq 1 ] && [ "$err" = "luapipe: rank 0: boom" ] ||
  fail "plain abort: rc $rc, output '$err'"

# 2. four ranks: ring, all-reduce, barrier, errors
t0=$(date +%s.%N)
"${mpirun[@]}" -np 4 "$luapipe" tests/mpi/comm_check.lua basic >"$tmp/out" 2>"$tmp/err"
rc=$?
t1=$(date +%s.%N)
echo "basic: rc $rc in $(elapsed "$t0" "$t1") s"
[ "$rc" -eq 0 ] || { fail "basic: mpirun exited $rc"; cat "$tmp/out" "$tmp/err"; }
[ "$(grep -c ': ok$' "$tmp/out")" -eq 4 ] || { fail "basic: not every rank ok"; cat "$tmp/out"; }

# 3. the watchdog, with a silent peer and with a peer that leaves early
for mode in silent exit; do
  t0=$(date +%s.%N)
  LUAPIPE_TIMEOUT=2 "${mpirun[@]}" -x LUAPIPE_TIMEOUT -np 3 "$luapipe" \
    tests/mpi/comm_check.lua "$mode" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  t1=$(date +%s.%N)
  secs=$(elapsed "$t0" "$t1")
  echo "watchdog ($mode): rc $rc in $secs s"
  [ "$rc" -ne 0 ] || fail "watchdog ($mode): mpirun exited 0"
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "watchdog ($mode): the job hung (killed by timeout)"
  want="luapipe: rank 0: timed out after 2 s (LUAPIPE_TIMEOUT) waiting for rank 1 to send 4 floats (tag 7) to rank 0: action 14 (5B3) waits for RECV_B from rank 1"
  grep -qF "$want" "$tmp/err" || { fail "watchdog ($mode): message missing"; cat "$tmp/err"; }
  grep -qE '^rank 0: recv returned after (1\.9|2\.[0-9]) s' "$tmp/err" ||
    { fail "watchdog ($mode): recv did not return after ~2 s"; cat "$tmp/err"; }
  awk -v s="$secs" 'BEGIN { exit !(s < 20) }' || fail "watchdog ($mode): took $secs s"
done

# 4. comm.abort on one rank takes down the others, which wait in recv
t0=$(date +%s.%N)
"${mpirun[@]}" -np 4 "$luapipe" tests/mpi/comm_check.lua abort >"$tmp/out" 2>"$tmp/err"
rc=$?
t1=$(date +%s.%N)
secs=$(elapsed "$t0" "$t1")
echo "abort: rc $rc in $secs s"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "abort: mpirun exited $rc"
grep -qF "luapipe: rank 3: giving up on purpose" "$tmp/err" || { fail "abort: message missing"; cat "$tmp/err"; }
! grep -q "recv returned" "$tmp/out" || { fail "abort: a rank outlived the abort"; cat "$tmp/out"; }
awk -v s="$secs" 'BEGIN { exit !(s < 20) }' || fail "abort: took $secs s"

if [ "$fails" -ne 0 ]; then
  echo "test_comm: $fails failure(s)"
  exit 1
fi
echo "test_comm: all passed"
