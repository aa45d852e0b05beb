#!/usr/bin/env bash
# test_model.sh LUAPIPE — `luapipe model info|forward|grad` on the three
# fixtures of tests/data/v3 (DeepSeek's model.py's numbers, see their
# README): forward's logits within 1e-4 (max |d| / max |logit|), grad's
# `loss X` within 1e-5 relative and every gradient under the checkpoint's
# own names (model.py's or HF's) within 1e-3 relative L2, no more and no
# fewer; --precision bf16: logits within 3e-2 of float32's (max |d| / max
# |logit|: bf16 keeps 8 bits, rounded again at every GEMM) but not equal
# to them, loss within 1e-2 relative; info's description of the HF FP8
# folder; bad folders, configs and
# token files: one line naming the file (and tensor), exit 2, nothing
# written. Run from the repo root.
. "$(dirname "$0")/lib.sh"
src=$(cd "$(dirname "$0")/../.." && pwd)
d=$src/tests/data/v3

# compare.lua OUT REF KIND: logits or grads against ref.safetensors
cat >"$tmp/compare.lua" <<'LUA'
local core = require("luapipe.core")
local out, ref, kind = arg[1], arg[2], arg[3]
local a, r = assert(core.safetensors_open(out)), assert(core.safetensors_open(ref))
local function rel(x, y)
  local dn, n = 0, 0
  for i = 1, #y do dn = dn + (x[i] - y[i]) ^ 2; n = n + y[i] ^ 2 end
  return math.sqrt(dn) / math.sqrt(n)
end
if kind == "logits" then
  local x, y = a:read("logits"), r:read("logits")
  assert(table.concat(x:shape(), ",") == table.concat(y:shape(), ","), "logits shape")
  x, y = x:totable(), y:totable()
  local dm, lm = 0, 0
  for i = 1, #y do dm = math.max(dm, math.abs(x[i] - y[i])); lm = math.max(lm, math.abs(y[i])) end
  assert(dm / lm < 1e-4, string.format("logits off by %.3g of %.3g", dm, lm))
  print("logits ok")
elseif kind == "bf16" then -- OUT: bf16 logits, REF: float32 logits (both ours)
  local x, y = a:read("logits"):totable(), r:read("logits"):totable()
  local dm, lm = 0, 0
  for i = 1, #y do dm = math.max(dm, math.abs(x[i] - y[i])); lm = math.max(lm, math.abs(y[i])) end
  assert(dm / lm < 3e-2, string.format("bf16 logits off by %.3g of %.3g", dm, lm))
  assert(dm / lm > 1e-5, string.format("bf16 logits equal float32's (%.3g): no bf16 ran", dm / lm))
  print(string.format("bf16 logits within %.3g", dm / lm))
else
  local n, m = 0, 0
  for name in pairs(r:tensors()) do
    local g = name:match("^grad%.(.+)$")
    if g then
      m = m + 1
      local x = assert(a:read(g))
      local e = rel(x:totable(), r:read(name):totable())
      assert(e < 1e-3, string.format("%s off by %.3g", g, e))
    end
  end
  for _ in pairs(a:tensors()) do n = n + 1 end
  assert(n == m, string.format("%d gradients written, model.py has %d", n, m))
  print("grads ok " .. n)
end
LUA

for c in v3_f32 v2lite_bf16 hf_fp8; do
  expect_rc "$c: forward" 0 "$LP" model forward "$d/$c/checkpoint" --tokens "$d/$c/tokens.json" -o "$tmp/l.st"
  expect_rc "$c: logits equal model.py's" 0 "$LP" "$tmp/compare.lua" "$tmp/l.st" "$d/$c/ref.safetensors" logits
  expect_rc "$c: grad" 0 "$LP" model grad "$d/$c/checkpoint" --tokens "$d/$c/tokens.json" -o "$tmp/g.st"
  loss=$(sed -n 's/^loss //p' "$tmp/out")
  want=$("$LP" -e "io.write(string.format('%.9g', require('luapipe.core').safetensors_open('$d/$c/ref.safetensors'):read('loss'):totable()[1]))")
  if awk -v a="$loss" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }'; then
    ok "$c: loss $loss (model.py $want)"
  else bad "$c: loss '$loss', model.py $want"; fi
  expect_rc "$c: gradients equal model.py's" 0 "$LP" "$tmp/compare.lua" "$tmp/g.st" "$d/$c/ref.safetensors" grads
  expect_rc "$c: forward in bf16" 0 "$LP" model forward "$d/$c/checkpoint" --tokens "$d/$c/tokens.json" -o "$tmp/b.st" --precision bf16
  expect_rc "$c: bf16 logits near float32's" 0 "$LP" "$tmp/compare.lua" "$tmp/b.st" "$tmp/l.st" bf16
  expect_rc "$c: grad in bf16" 0 "$LP" model grad "$d/$c/checkpoint" --tokens "$d/$c/tokens.json" -o "$tmp/g.st" --precision bf16
  loss=$(sed -n 's/^loss //p' "$tmp/out")
  if awk -v a="$loss" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-2 * b && d > 0) }'; then
    ok "$c: bf16 loss $loss (model.py float32 $want)"
  else bad "$c: bf16 loss '$loss', model.py float32 $want"; fi
done
rm -f "$tmp/l.st" "$tmp/g.st" "$tmp/b.st"

expect_rc "info (HF, FP8)" 0 "$LP" model info "$d/hf_fp8/checkpoint"
expect_in "info: layout" "$tmp/out" "Hugging Face's layout (2 files)"
expect_in "info: layers" "$tmp/out" "layers: dense moe"
expect_in "info: parameters" "$tmp/out" "parameters: 215200 in total, 169120 activated per token"
expect_in "info: dtypes" "$tmp/out" "stored dtypes: BF16 x 23, F32 x 74, F8_E4M3 x 72"
expect_in "info: MTP not used" "$tmp/out" "tensors not used: 76 (the 1 multi-token-prediction layer"

# bad input: one line, exit 2, nothing written
one_line() { # NAME WANT-TEXT
  if [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qF -- "$2" "$tmp/err"; then ok "$1: one line"
  else bad "$1: wanted one line with '$2'"; sed 's/^/  | /' "$tmp/err" | head -5; fi
  if [ -e "$tmp/o.st" ]; then bad "$1: wrote $tmp/o.st"; rm -f "$tmp/o.st"; fi
}
cp -r "$d/v3_f32/checkpoint" "$tmp/ck"
"$LP" -e "local p = '$tmp/ck/model0-mp1.safetensors'
local core = require('luapipe.core')
local st = assert(core.safetensors_open(p))
local t = {}
for n in pairs(st:tensors()) do if n ~= 'layers.1.attn.wkv_b.weight' then t[n] = st:read(n) end end
st:close()
assert(core.safetensors_write(p, t))"
expect_rc "tensor missing" 2 "$LP" model forward "$tmp/ck" --tokens "$d/v3_f32/tokens.json" -o "$tmp/o.st"
one_line "tensor missing" "luapipe model: $tmp/ck: tensor layers.1.attn.wkv_b.weight is missing"
rm -rf "$tmp/ck"
cp -r "$d/v3_f32/checkpoint" "$tmp/ck"
sed -i 's/"kv_lora_rank": 32/"kv_lora_rank": 16/' "$tmp/ck/config.json"
expect_rc "shape against the config" 2 "$LP" model grad "$tmp/ck" --tokens "$d/v3_f32/tokens.json" -o "$tmp/o.st"
one_line "shape against the config" "$tmp/ck/model0-mp1.safetensors: tensor layers.0.attn.wkv_a.weight has shape [40, 64], the config gives [24, 64]"
sed -i 's/"kv_lora_rank": 16/"n_routed_experts": 6, "kv_lora_rank": 32/; s/"n_routed_experts": 8,//' "$tmp/ck/config.json"
expect_rc "contradictory config" 2 "$LP" model info "$tmp/ck"
one_line "contradictory config" "$tmp/ck/config.json: n_routed_experts (6) is not a multiple of n_expert_groups (4)"
rm -rf "$tmp/ck"
cp -r "$d/hf_fp8/checkpoint" "$tmp/ck"
sed -i 's/"hidden_size": 160,//' "$tmp/ck/config.json"
expect_rc "config key missing" 2 "$LP" model info "$tmp/ck"
one_line "config key missing" "$tmp/ck/config.json: has neither 'dim'"
rm -rf "$tmp/ck"
echo '{"tokens": [[1, 2], [3]]}' >"$tmp/t.json"
expect_rc "ragged tokens" 2 "$LP" model forward "$d/v3_f32/checkpoint" --tokens "$tmp/t.json" -o "$tmp/o.st"
one_line "ragged tokens" "$tmp/t.json: tokens[2] has 1, tokens[1] has 2"
echo '{"tokens": [[1, 200]]}' >"$tmp/t.json"
expect_rc "token outside the vocabulary" 2 "$LP" model forward "$d/v3_f32/checkpoint" --tokens "$tmp/t.json" -o "$tmp/o.st"
one_line "token outside the vocabulary" "tokens entry 2 is 200, outside the vocabulary [0, 128)"
echo '{"tokens": [[1, 2]]}' >"$tmp/t.json"
expect_rc "grad without targets" 2 "$LP" model grad "$d/v3_f32/checkpoint" --tokens "$tmp/t.json" -o "$tmp/o.st"
one_line "grad without targets" "'targets' must be a non-empty list"
expect_rc "unknown precision" 2 "$LP" model forward "$d/v3_f32/checkpoint" --tokens "$d/v3_f32/tokens.json" -o "$tmp/o.st" --precision fp16
one_line "unknown precision" "luapipe model: --precision fp16: unknown precision (f32 or bf16)"
expect_rc "no such folder" 2 "$LP" model info "$tmp/nothing"
one_line "no such folder" "$tmp/nothing: no config.json"
finish
