#!/usr/bin/env bash
# test_profile_trace.sh LUAPIPE — a trace luapipe's own training wrote, read
# back by `luapipe profile`, gives the share of all-to-all time hidden under
# compute that the run's summary printed: examples/train_moe.lua on a
# pp 2 x ep 2 grid (4 ranks, one step, an emulated link), its report's
# a2a_hidden_pct against the profile's summed per-exchange overlap
# (comm_ops_overlap_us / comm_ops_us over the ranks; pipeline messages
# ignored by a rules file, as the summary counts all-to-alls only). The two
# differ only by the executor's bookkeeping gaps (posting, polling): within
# 1 percentage point (3 under AddressSanitizer, whose bookkeeping is slower:
# a loaded fresh-root run saw 2.2). Then `profile --svg` of that trace: a "wrote" line and
# a time axis. Exits 77 (skipped) without mpirun.
. "$(dirname "$0")/lib.sh"
cat >"$tmp/rules.lua" <<'LUA'
return { { cat = "comm", class = "ignore" } } -- pipeline messages: not all-to-all
LUA
cat >"$tmp/share.lua" <<'LUA'
local json = require("luapipe.json")
local f = assert(io.open(arg[1])); local v = assert(json.decode(f:read("a"))); f:close()
local a, h = 0, 0
for _, r in ipairs(v.ranks) do a = a + r.comm_ops_us; h = h + r.comm_ops_overlap_us end
print(string.format("%.4f", a > 0 and 100 * h / a or -1))
LUA
for family in dualpipe 1f1b; do
  timeout 180 mpirun --oversubscribe -np 4 "$luapipe" examples/train_moe.lua --schedule $family \
    --pp 2 --ep 2 --steps 1 --link lat=50us,bw=2GB/s --trace "$tmp/t.json" --report "$tmp/rep" \
    >"$tmp/out" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || { fail "$family: training rc $rc"; cat "$tmp/out"; continue; }
  printed=$(sed -n 's/^all-to-all hidden: \([0-9.]*\)%$/\1/p' "$tmp/out")
  summary=$(sed -n 's/^a2a_hidden_pct=//p' "$tmp/rep")
  "$luapipe" profile "$tmp/t.json" --rules "$tmp/rules.lua" --format json -o "$tmp/p.json" 2>"$tmp/err" ||
    { fail "$family: luapipe profile failed: $(cat "$tmp/err")"; continue; }
  # the text: luapipe's trace worded as such; per track, compute holds the
  # blocked time the union leaves out, and says so
  "$luapipe" profile "$tmp/t.json" >"$tmp/text" 2>&1 || fail "$family: luapipe profile (text) failed"
  grep -q "^rank 0 ($tmp/t.json): [0-9]* timed operations on [0-9]* tracks" "$tmp/text" \
    || fail "$family: rank 0's line does not speak of timed operations on tracks"
  grep -q "GPU operations" "$tmp/text" && fail "$family: a CPU trace read as GPU operations"
  if [ "$family" = dualpipe ]; then
    grep -q "per track, compute counts each action's whole slice, including the time the rank sat blocked in exchanges" \
      "$tmp/text" || fail "$family: no note where a track's compute exceeds the union's"
  fi
  read_back=$("$luapipe" "$tmp/share.lua" "$tmp/p.json")
  tol=1.0
  [ -n "${ASAN_OPTIONS:-}" ] && tol=3.0
  verdict=$(awk -v s="$summary" -v p="$read_back" -v t="$tol" 'BEGIN { d = s - p; if (d < 0) d = -d;
    print (s != "" && p >= 0 && d <= t) ? "ok" : "bad" }')
  echo "$family: summary printed ${printed}% hidden (report $summary), trace read back $read_back%: $verdict"
  [ "$verdict" = ok ] || fail "$family: hidden share read back $read_back% vs summary $summary%"
done
# --svg: says where it wrote (after the text report, on stdout), and the
# picture has a time axis in ms from 0 (the first GPU operation)
if [ -s "$tmp/t.json" ]; then
  "$luapipe" profile "$tmp/t.json" --svg "$tmp/p.svg" >"$tmp/pout" 2>&1
  rc=$?
  ticks=$(grep -c '" text-anchor="middle">[0-9.]*</text>$' "$tmp/p.svg")
  echo "profile --svg: rc $rc, $ticks ticks, last line: $(tail -1 "$tmp/pout")"
  { [ "$rc" -eq 0 ] && [ "$(tail -1 "$tmp/pout")" = "wrote SVG timeline of rank 0 to $tmp/p.svg" ] &&
    grep -q '>time (ms)</text>' "$tmp/p.svg" && grep -q '" text-anchor="middle">0</text>$' "$tmp/p.svg" &&
    [ "$ticks" -ge 3 ]; } || { fail "profile --svg: no 'wrote' line or no time axis"; cat "$tmp/pout"; }
fi
if [ "$fails" -ne 0 ]; then echo "test_profile_trace: $fails failure(s)"; exit 1; fi
echo "test_profile_trace: all passed"
