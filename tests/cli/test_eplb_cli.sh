#!/usr/bin/env bash
# `luapipe eplb`: JSON and text load files, the README vector in the JSON
# output (logical_to_physical unpadded: each expert's slots), text output
# with its heat map, --previous / --max-moves, read errors naming file, line
# and entry as written (exit 1), bad options in one line (exit 2).
. "$(dirname "$0")/lib.sh"

V0="90,132,40,61,104,165,39,4,73,56,183,86"
V1="20,107,104,64,19,197,187,157,172,86,16,27"
printf '[[%s],\n [%s]]\n' "$V0" "$V1" >"$tmp/v.json"
printf '# the README vector\n%s\n\n%s\n' "$(echo "$V0" | tr ',' ' ')" "$V1" >"$tmp/v.txt"
ARGS=(--replicas 16 --groups 4 --nodes 2 --gpus 8)

# Checks a JSON plan file against DeepSeek's README vector.
cat >"$tmp/check.lua" <<'LUA'
local json = require("luapipe.json")
local f = assert(io.open(arg[1]))
local doc = assert(json.decode(f:read("a")))
f:close()
local function s(t)
  local o = {}
  for i, v in ipairs(t) do o[i] = type(v) == "table" and "[" .. s(v) .. "]" or tostring(v) end
  return table.concat(o, ",")
end
assert(s(doc.physical_to_logical) == "[5,6,5,7,8,4,3,4,10,9,10,2,0,1,11,1],[7,10,6,8,6,11,8,9,2,4,5,1,5,0,3,1]", s(doc.physical_to_logical))
assert(s(doc.logical_to_physical[1]) == "[12],[15,13],[11],[6],[7,5],[0,2],[1],[3],[4],[9],[8,10],[14]", s(doc.logical_to_physical[1]))
assert(s(doc.logical_count[1]) == "1,2,1,1,2,2,1,1,1,1,2,1")
assert(math.abs(doc.stats.balancedness - 0.8163691432754) < 1e-9, doc.stats.balancedness)
assert(doc.stats.gpu_max_over_mean > 1 and #doc.stats.per_layer == 2 and doc.stats.solve_ms >= 0)
assert(doc.stats.copies == nil) -- JSON null without --previous
LUA
check_vector() { "$LP" "$tmp/check.lua" "$1"; }

expect_rc "json loads, reference" 0 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --mode reference
check_vector "$tmp/out" && ok "README vector from JSON" || bad "README vector from JSON"
expect_rc "text loads, reference" 0 "$LP" eplb --loads "$tmp/v.txt" "${ARGS[@]}" --mode reference --format json
check_vector "$tmp/out" && ok "README vector from text" || bad "README vector from text"
expect_in "json keys" "$tmp/out" '"physical_to_logical":['
expect_in "json map row" "$tmp/out" '    [5,6,5,7,8,4,3,4,10,9,10,2,0,1,11,1],'
expect_in "no copies without --previous: null" "$tmp/out" '"copies":null,'

expect_rc "output file" 0 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --mode reference -o "$tmp/plan.json"
expect_in "output file named" "$tmp/out" "wrote json plan to $tmp/plan.json"
check_vector "$tmp/plan.json" && ok "README vector in the output file" || bad "README vector in the output file"

# the heat map: block characters in a UTF-8 locale, ASCII otherwise, whatever
# the caller's locale (the checks compare bytes: grep -F)
expect_rc "text output" 0 env LC_ALL=C.UTF-8 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --format text
expect_in "text header" "$tmp/out" "EPLB plan: 2 layers, 12 experts -> 16 slots on 8 GPUs over 2 nodes (hierarchical policy, balanced mode)"
expect_in "text per layer" "$tmp/out" "layer balancedness"
expect_in "text heat map" "$tmp/out" "GPU load heat map: a row per layer, a column per GPU (nodes apart); ▁ = 86.5 .. █ = 179.5"
heat_rows() { # heat_rows NAME ROW0 ROW1: the two rows of $tmp/out, exactly
  grep -qxF "    0 $2" "$tmp/out" && grep -qxF "    1 $3" "$tmp/out" && ok "$1" || { bad "$1"; tail -3 "$tmp/out"; }
}
heat_rows "heat map row per layer, UTF-8" "▄▁▄▃ ▆▄▆▆" "██▄▇ ▄▆▃▃"
expect_rc "text output, C locale" 0 env -u LC_ALL -u LC_CTYPE -u LANG "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --format text
expect_in "ASCII heat map legend" "$tmp/out" "(nodes apart); . = 86.5 .. @ = 179.5"
heat_rows "heat map row per layer, ASCII" "=.=- *=**" "@@=# =*--"
LC_ALL= LC_CTYPE=en_US.utf8 LANG=C "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --format text >"$tmp/out"
heat_rows "LC_CTYPE utf8 before LANG" "▄▁▄▃ ▆▄▆▆" "██▄▇ ▄▆▃▃"
LC_ALL=C LANG=C.UTF-8 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --format text >"$tmp/out"
heat_rows "LC_ALL=C before LANG" "=.=- *=**" "@@=# =*--"
LC_ALL=C.UTF-8 LUAPIPE_CHARSET=ascii "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --format text >"$tmp/out"
heat_rows "LUAPIPE_CHARSET=ascii" "=.=- *=**" "@@=# =*--"
LC_ALL=C LUAPIPE_CHARSET=UTF-8 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --format text >"$tmp/out"
heat_rows "LUAPIPE_CHARSET=UTF-8" "▄▁▄▃ ▆▄▆▆" "██▄▇ ▄▆▃▃"
# every load the same (here 0): every cell the lowest, the legend says so
printf '0 0 0 0\n0 0 0 0\n' >"$tmp/zero.txt"
LC_ALL=C.UTF-8 "$LP" eplb --loads "$tmp/zero.txt" --replicas 4 --gpus 2 --format text >"$tmp/out"
expect_in "all-zero heat map legend" "$tmp/out" "(nodes apart); every GPU's load is 0"
heat_rows "all-zero heat map: lowest cells" "▁▁" "▁▁"
# --padded: DeepSeek's logical_to_physical, -1 to R - E + 1 = 5 entries per expert
expect_rc "padded" 0 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --mode reference --padded
expect_in "padded row" "$tmp/out" "    [[12,-1,-1,-1,-1],[15,13,-1,-1,-1],[11,-1,-1,-1,-1],[6,-1,-1,-1,-1],[7,5,-1,-1,-1],[0,2,-1,-1,-1],[1,-1,-1,-1,-1],[3,-1,-1,-1,-1],[4,-1,-1,-1,-1],[9,-1,-1,-1,-1],[8,10,-1,-1,-1],[14,-1,-1,-1,-1]],"
cat >"$tmp/rect.lua" <<'LUA'
local json = require("luapipe.json")
local f = assert(io.open(arg[1])); local doc = assert(json.decode(f:read("a"))); f:close()
for l, layer in ipairs(doc.logical_to_physical) do
  assert(#layer == 12, "experts")
  for e, row in ipairs(layer) do
    assert(#row == 5, "width")
    local n = 0
    for i, s in ipairs(row) do if s >= 0 then n = n + 1; assert(n == i, "slots first") end end
    assert(n == doc.logical_count[l][e], "count")
  end
end
LUA
"$LP" "$tmp/rect.lua" "$tmp/out" && ok "padded: rectangular, slots then -1" || bad "padded: rectangular, slots then -1"
# help: options on one line each, examples, the budget's node rule
expect_rc "help eplb" 0 env COLUMNS=80 "$LP" help eplb
expect_in "help: --output" "$tmp/out" "   --output FILE,"
grep -q '^ *-o FILE,$' "$tmp/out" && bad "help: a dangling -o FILE," || ok "help: no dangling -o FILE,"
expect_in "help: examples" "$tmp/out" "Examples:"
expect_in "help: padded" "$tmp/out" "--padded"
tr -s ' \n' ' ' <"$tmp/out" | grep -qF "keeps each group on the node --previous has it on" \
  && ok "help: budget keeps groups home" || bad "help: budget keeps groups home"
awk 'length > 80 { bad = 1 } END { exit bad }' "$tmp/out" && ok "help eplb within 80 columns" || bad "help eplb within 80 columns"
expect_rc "text output, one node" 0 "$LP" eplb --loads "$tmp/v.json" --replicas 16 --gpus 8 --format text
expect_in "one node in the singular" "$tmp/out" "on 8 GPUs over 1 node (hierarchical policy"

# the plan in force: its own JSON output as --previous keeps everything
expect_rc "previous" 0 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --mode reference --previous "$tmp/plan.json"
expect_in "no copies against itself" "$tmp/out" '"copies":0,'
expect_in "copies per GPU" "$tmp/out" '"gpu_copies":[0,0,0,0,0,0,0,0]'
printf '%s\n%s\n' "0 1 2 3 4 5 6 7 8 9 10 11 0 1 2 3" "0,1,2,3,4,5,6,7,8,9,10,11,4,5,6,7" >"$tmp/prev.txt"
expect_rc "previous text, budget" 0 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --previous "$tmp/prev.txt" --max-moves 2 --format text
grep -qE '^ +0 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[012] ' "$tmp/out" && ok "budget respected" || bad "budget respected"

# a budget against a plan in force keeps every group on its node (no --spill):
# --max-moves 0 is that plan, off-node 0 as eplb.evaluate says
printf '%s\n%s\n' "472 58 419 49 0 215 115 81 303 40 668 17 127 0 299 64" \
  "104 0 5 113 393 86 785 548 150 517 507 162 684 0 17 124" >"$tmp/l2.txt"
tac "$tmp/l2.txt" >"$tmp/l3.txt"
A2=(--replicas 24 --groups 4 --nodes 2 --gpus 8)
expect_rc "plan in force" 0 "$LP" eplb --loads "$tmp/l2.txt" "${A2[@]}" -o "$tmp/p2.json"
for k in 0 8; do
  expect_rc "budget $k" 0 "$LP" eplb --loads "$tmp/l3.txt" "${A2[@]}" --previous "$tmp/p2.json" --max-moves $k --format text
  [ "$(grep -cE '^ +[01] +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +0$' "$tmp/out")" -eq 2 ] \
    && ok "budget $k: no off-node load" || bad "budget $k: no off-node load"
done
"$LP" eplb --loads "$tmp/l3.txt" "${A2[@]}" --previous "$tmp/p2.json" --max-moves 0 >"$tmp/same.json"
cat >"$tmp/same.lua" <<'LUA'
local json = require("luapipe.json")
local function read(p) local f = assert(io.open(p)); local t = f:read("a"); f:close(); return json.decode(t) end
local a, b = read(arg[1]), read(arg[2])
for l = 1, 2 do assert(table.concat(a.physical_to_logical[l], ",") == table.concat(b.physical_to_logical[l], ","), "layer " .. l) end
assert(b.stats.off_node_load == 0, b.stats.off_node_load)
LUA
"$LP" "$tmp/same.lua" "$tmp/p2.json" "$tmp/same.json" && ok "budget 0 keeps the plan, off-node 0" || bad "budget 0 keeps the plan, off-node 0"
expect_rc "budget with --spill" 0 "$LP" eplb --loads "$tmp/l3.txt" "${A2[@]}" --previous "$tmp/p2.json" --max-moves 8 --spill --format text

# read errors: file, line and the entry as written, exit 1
# read_error NAME FILE CONTENT MESSAGE: CONTENT (printf format) in $tmp/FILE
read_error() {
  printf "$3" >"$tmp/$2"
  expect_rc "$1" 1 "$LP" eplb --loads "$tmp/$2" --replicas 4 --gpus 2
  expect_in "$1 named" "$tmp/err" "$tmp/$2:$4"
}
read_error "ragged json" ragged.json '[[1,2,3,4],\n [1,2,3,4],\n [1,2,3]]\n' \
  "3: layer 2 has 3 entries, layer 0 has 4"
read_error "bad number" bad.txt '1 2 3 4\n# comment\n1 2 x 4\n' \
  "3: layer 1, entry 2 ('x') is not a number"
read_error "negative load" neg.json '[[1,2,3,4],\n [1,2,\n   -3,4]]\n' \
  "3: layer 1, entry 2 ('-3'): the load is negative"
read_error "infinite load" inf.json '[[1,2,3,4],\n [1,2,\n   3, 1e999]]\n' \
  "3: layer 1, entry 3 ('1e999'): the load is not a finite number"
read_error "load beyond float32" huge.json '[[1,2,3,4],\n [1e300,2,3,4]]\n' \
  "2: layer 1, entry 0 ('1e300'): the load is larger than a float32 holds"
read_error "NaN load" nan.json '[[1,2,3,4],\n [1,2,NaN,4]]\n' \
  "2: invalid JSON"
read_error "infinite load, text" inf.txt '1 2 3 4\n1 2 3 inf\n' \
  "2: layer 1, entry 3 ('inf') is not a number"
read_error "overflowing load, text" inf2.txt '1 2 3 4\n1 2 3 1e400\n' \
  "2: layer 1, entry 3 ('1e400'): the load is not a finite number"
read_error "string load" str.json '[[1,2,3,4],\n [1,"2",3,4]]\n' \
  "2: layer 1, entry 1 ('\"2\"') is not a number"
read_error "truncated json" cut.json '[[1,2,3,4],\n [1,2' "2: invalid JSON"
expect_rc "missing file" 1 "$LP" eplb --loads "$tmp/nope.json" --replicas 4 --gpus 2
expect_in "missing file named" "$tmp/err" "cannot read $tmp/nope.json: No such file or directory"
[ "$(grep -o "nope.json" "$tmp/err" | wc -l)" -eq 1 ] && ok "missing file named once" || bad "missing file named once"
printf '0 1 2\n' >"$tmp/shortprev.txt"
# an expert id out of range in --previous: the file and its line named
printf '%s\n%s\n' "0 1 2 3 4 5 6 7 8 9 10 11 0 1 2 3" "0 1 2 3 4 5 6 7 8 9 10 11 4 5 99 7" >"$tmp/badprev.txt"
expect_rc "previous id out of range" 1 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --previous "$tmp/badprev.txt"
expect_in "previous id: file and line" "$tmp/err" \
  "luapipe eplb: $tmp/badprev.txt:2: previous plan, layer 1, slot 14: expert 99 is out of range 0..11"
expect_rc "short previous" 1 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --previous "$tmp/shortprev.txt"
expect_in "short previous named" "$tmp/err" "$tmp/shortprev.txt: 1 layer, but $tmp/v.json has 2"

# bad options: exit 2
expect_rc "replicas not a number" 2 "$LP" eplb --loads "$tmp/v.json" --replicas x --gpus 8
expect_in "replicas named" "$tmp/err" "luapipe eplb: --replicas must be an integer from 1 to 1048576, got 'x'"
# every count: one line naming the option, its range and the text as typed
for bad in "--groups 99999999999" "--groups 1e9" "--replicas 1.5" "--gpus=-3" "--nodes 0" \
    "--nodes 1048577" "--max-moves=-1" "--groups 0x10"; do
  opt=${bad%%[ =]*} val=${bad#*[ =]}
  expect_rc "bad $bad" 2 "$LP" eplb --loads "$tmp/v.json" --replicas 16 --gpus 8 --previous "$tmp/plan.json" $bad
  expect_in "bad $bad named" "$tmp/err" "luapipe eplb: $opt must be "
  if [ "$opt" = --max-moves ]; then range="0 to 1048576"; else range="1 to 1048576"; fi
  expect_in "bad $bad: the range" "$tmp/err" "from $range, got"
  expect_in "bad $bad as typed" "$tmp/err" "got '$val'"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] && ok "bad $bad: one line" || bad "bad $bad: one line"
  grep -q traceback "$tmp/err" && bad "bad $bad: traceback" || ok "bad $bad: no traceback"
done
expect_rc "unknown mode" 2 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --mode fast
expect_rc "missing --loads" 2 "$LP" eplb "${ARGS[@]}"
expect_rc "R not a multiple of G" 2 "$LP" eplb --loads "$tmp/v.json" --replicas 15 --groups 4 --nodes 2 --gpus 8
expect_in "R/G named" "$tmp/err" "replicas (15) must be a multiple of gpus (8)"
expect_rc "max-moves without previous" 2 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --max-moves 3
expect_rc "spill with reference" 2 "$LP" eplb --loads "$tmp/v.json" "${ARGS[@]}" --mode reference --spill

# size limits (eplb.limits): one line naming the limit and what was asked, exit 2
printf '[%s]\n' "$(for l in $(seq 58); do printf '[%s],' "$V0"; done | sed 's/,$//')" >"$tmp/v58.json"
expect_rc "over the slot limit" 2 "$LP" eplb --loads "$tmp/v58.json" --replicas 131072 --gpus 1024
expect_in "slot limit named" "$tmp/err" \
  "luapipe eplb: 58 layers x 131072 replicas = 7602176 slots: more than the limit of 4194304 slots in all (layers x replicas)"
[ "$(wc -l <"$tmp/err")" -eq 1 ] && ok "slot limit: one line" || bad "slot limit: one line"
expect_rc "over the per-layer limit" 2 "$LP" eplb --loads "$tmp/v.json" --replicas 2097152 --gpus 8
expect_in "per-layer limit named" "$tmp/err" "luapipe eplb: --replicas must be from 1 to 1048576, got '2097152'"
expect_rc "over the relabel GPU limit" 2 "$LP" eplb --loads "$tmp/v.json" --replicas 8192 --gpus 8192 \
  --previous "$tmp/plan.json"
expect_in "relabel GPU limit named" "$tmp/err" \
  "luapipe eplb: --gpus 8192: more than the limit of 4096 GPUs for re-planning against --previous"

# help lists the options
expect_rc "help" 0 "$LP" help eplb
expect_in "help mentions --max-moves" "$tmp/out" "--max-moves"

finish
