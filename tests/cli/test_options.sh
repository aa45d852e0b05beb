#!/usr/bin/env bash
# Option values everywhere go through the CLI's one converter
# (luapipe.cli int_option / number_option): the commands, `luapipe eplb`
# and the example scripts all give one line naming the option, the range
# and the text as typed, and exit 2.
. "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)

one_line() { # NAME: $tmp/err is exactly one line, no traceback
  [ "$(wc -l <"$tmp/err")" -eq 1 ] && ok "$1: one line" || { bad "$1: one line"; head -5 "$tmp/err"; }
  grep -q traceback "$tmp/err" && bad "$1: traceback" || ok "$1: no traceback"
}

# the commands: a bad value is one line "luapipe CMD: ..."
expect_rc "bubbles --pp 0" 2 "$LP" bubbles --pp 0
expect_in "bubbles --pp 0 message" "$tmp/err" "luapipe bubbles: --pp must be from 1 to 4096, got '0'"
one_line "bubbles --pp 0"
expect_rc "hex count refused" 2 "$LP" schedule 1f1b --microbatches 0x10
expect_in "hex count as typed" "$tmp/err" "--microbatches must be an integer from 1 to 65536, got '0x10'"
expect_rc "1e1 is a whole number" 0 "$LP" schedule 1f1b --microbatches 1e1
expect_in "1e1 read as 10" "$tmp/out" "10 micro-batches"
# other usage errors keep the usage text
expect_rc "unknown option" 2 "$LP" eplb --bogus
expect_in "unknown option: usage" "$tmp/err" "Usage: luapipe eplb"

# costs far apart: the Gantt chart stays bounded (it once needed 1e15 columns)
expect_rc "--cost F=1e15 draws" 0 timeout 60 "$LP" simulate 1f1b -p 2 -m 2 --cost F=1e15
expect_in "--cost F=1e15 legend" "$tmp/out" "short ones cut"
expect_rc "per-stage cost out of range" 2 "$LP" simulate 1f1b -p 2 -m 2 --cost "B[3]=0"
expect_in "per-stage cost as typed" "$tmp/err" \
  "luapipe simulate: --cost: per-stage cost [3] (as in F[3]=...): this schedule's model stages are 0..1"
one_line "per-stage cost out of range"

# the link's latency and a message's whole delay obey the same cost rule
expect_rc "--link lat=1e300s" 2 "$LP" simulate 1f1b --link lat=1e300s,bw=1GB/s
expect_in "--link latency named" "$tmp/err" \
  "luapipe simulate: --link: cost model: link latency = 1e+300 must be a number in 0..1e+15"
one_line "--link lat=1e300s"
expect_rc "message delay too long" 2 "$LP" bubbles --link lat=1s,bw=1B/s --cost F=1,bytes=1e15
expect_in "message delay named" "$tmp/err" "luapipe bubbles: --cost/--link: cost model: a message takes \
1000000000000001 (latency + link latency + bytes / bandwidth), more than the limit of 1e+15"

# environment knobs with a fixed form: a typo is an error, not the default
for c in "LUAPIPE_TIMEOUT=abc|LUAPIPE_TIMEOUT='abc': must be a number of seconds from 0 to 1e9" \
  "LUAPIPE_TIMEOUT=-1|LUAPIPE_TIMEOUT='-1': must be a number of seconds from 0 to 1e9" \
  "LUAPIPE_COMM_THREAD=2|LUAPIPE_COMM_THREAD='2': use 0 (off) or 1 (on)" \
  "LUAPIPE_LOG=loud|LUAPIPE_LOG='loud': use error, warn, info or debug" \
  "LUAPIPE_COLOR=yes|LUAPIPE_COLOR='yes': use auto, always or never" \
  "LUAPIPE_COMM=gloo|LUAPIPE_COMM='gloo': use nccl or mpi" \
  "LUAPIPE_TF32=yes|LUAPIPE_TF32='yes': use 0 (off) or 1 (on)" \
  "LUAPIPE_CUDA_SYNC=true|LUAPIPE_CUDA_SYNC='true': use 0 (off) or 1 (on)"; do
  expect_rc "${c%%|*}" 2 env "${c%%|*}" "$LP" -e 'print("ran")'
  expect_in "${c%%|*} named" "$tmp/err" "luapipe: ${c#*|}"
  one_line "${c%%|*}"
  grep -q ran "$tmp/out" && bad "${c%%|*}: ran anyway" || ok "${c%%|*}: nothing ran"
done
expect_rc "good knobs run" 0 env LUAPIPE_TIMEOUT=0.5 LUAPIPE_COMM_THREAD=0 LUAPIPE_LOG=debug \
  LUAPIPE_COLOR=never "$LP" -e 'print("ran")'
expect_in "good knobs ran" "$tmp/out" "ran"

# luapipe eplb: the same converter (hex is not read as 16)
printf '[[1,2,3,4],[4,3,2,1]]\n' >"$tmp/v.json"
expect_rc "eplb --groups 0x10" 2 "$LP" eplb --loads "$tmp/v.json" --replicas 8 --gpus 2 --groups 0x10
expect_in "eplb --groups 0x10 as typed" "$tmp/err" \
  "luapipe eplb: --groups must be an integer from 1 to 1048576, got '0x10'"
one_line "eplb --groups 0x10"
expect_rc "eplb --groups 2 fine" 0 "$LP" eplb --loads "$tmp/v.json" --replicas 8 --gpus 2 --groups 2

# the example scripts (they fail before any training starts)
for ex in train_mlp train_char_lm; do
  for c in "--microbatches 1.5|--microbatches must be an integer from 1 to 65536, got '1.5'" \
    "--microbatches 0|--microbatches must be from 1 to 65536, got '0'" \
    "--microbatches 1e9|--microbatches must be from 1 to 65536, got '1e9'" \
    "--steps abc|--steps must be an integer from 1 to 2147483647, got 'abc'" \
    "--seed 9223372036854775807|--seed must be from 0 to 2147483647, got '9223372036854775807'" \
    "--chunks=-1|--chunks must be from 1 to 64, got '-1'" \
    "--batch 0x10|--batch must be an integer from 1 to 65536, got '0x10'" \
    "--lr abc|--lr must be a number 0 or more, got 'abc'" \
    "--lr=-1|--lr must be 0 or more, got '-1'" \
    "--lr inf|--lr must be a number 0 or more, got 'inf'"; do
    # shellcheck disable=SC2086
    expect_rc "$ex ${c%%|*}" 2 "$LP" "$root/examples/$ex.lua" ${c%%|*}
    expect_in "$ex ${c%%|*} message" "$tmp/err" "$ex.lua: ${c#*|}"
    one_line "$ex ${c%%|*}"
  done
  expect_rc "$ex --partition foo" 2 "$LP" "$root/examples/$ex.lua" --partition foo
  expect_in "$ex --partition choices" "$tmp/err" "'--partition' must be one of 'layers', 'cost'"
  expect_rc "$ex --help" 0 "$LP" "$root/examples/$ex.lua" --help
  expect_in "$ex --help lists --microbatches" "$tmp/out" "--microbatches"
done
finish
