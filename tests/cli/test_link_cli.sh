#!/usr/bin/env bash
# test_link_cli.sh LUAPIPE — `--link` of `luapipe simulate` and `luapipe
# bubbles` (the comm layer's emulated-link model in the simulator): the
# step time grows by the modelled message delay, bad specs exit 2 naming
# the field and the accepted units.
. "$(dirname "$0")/lib.sh"

expect_rc "simulate without a link" 0 "$LP" simulate gpipe --pp 2 -m 1 --cost F=0.01,B=0.02 -f json
expect_in "  makespan 2F + 2B" "$tmp/out" '"makespan":0.06,'
# two messages of 4 MB on lat=1ms,bw=1GB/s: 2 x (1 ms + 4 ms) more
expect_rc "simulate --link" 0 "$LP" simulate gpipe --pp 2 -m 1 --cost F=0.01,B=0.02,bytes=4e6 \
  --link lat=1ms,bw=1GB/s -f json
expect_in "  makespan grows by 2 x 5 ms" "$tmp/out" '"makespan":0.07,'
expect_rc "simulate --link, bad unit" 2 "$LP" simulate gpipe --pp 2 -m 1 --link lat=1
expect_in "  message" "$tmp/err" "luapipe simulate: --link: link 'lat=1': lat=1 needs a unit (us, ms or s)"
expect_rc "simulate --link, unknown field" 2 "$LP" simulate gpipe --pp 2 -m 1 --link latency=1ms
expect_in "  message" "$tmp/err" "unknown field 'latency=1ms' (expected lat=<time> or bw=<rate>"
expect_rc "bubbles --link" 0 "$LP" bubbles --pp 4 -m 8 --cost F=0.01,B=0.02,W=0.01,FB=0.03,bytes=1e6 \
  --link lat=1ms,bw=1GB/s -f json
"$LP" bubbles --pp 4 -m 8 --cost F=0.01,B=0.02,W=0.01,FB=0.03 -f json >"$tmp/plain" 2>&1
if [ "$(cmp -s "$tmp/out" "$tmp/plain"; echo $?)" -ne 0 ]; then ok "  bubbles change with the link"
else bad "  bubbles ignore --link"; fi
expect_rc "bubbles --link, bad rate" 2 "$LP" bubbles --link bw=1Gb/s
expect_in "  message" "$tmp/err" "bw=1Gb/s has an unknown unit 'Gb/s' (use GB/s, MB/s, KB/s or B/s)"
finish
