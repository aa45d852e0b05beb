-- luapipe.models.names: the three name sets of DeepSeek-V3's parameters,
-- mapped one to one.
--   luapipe's layers (nn.mla_block, nn.moe): layers.3.ffn.router.weight,
--     layers.3.ffn.shared.w1, layers.3.ffn.experts.7.w1
--   model.py's (DeepSeek's converted checkpoints): layers.3.ffn.gate.weight,
--     layers.3.ffn.shared_experts.w1.weight, layers.3.ffn.experts.7.w1.weight
--   Hugging Face's (inference/convert.py's mapping, reversed):
--     model.layers.3.mlp.gate.weight, model.layers.3.mlp.shared_experts.gate_proj.weight,
--     model.layers.3.mlp.experts.7.gate_proj.weight
-- Everything else (embed, norms, attention) is model.py's name in luapipe.
local M = {}

-- luapipe -> model.py
function M.to_model(n)
  local r = n:gsub("^(layers%.%d+%.ffn)%.router%.weight$", "%1.gate.weight")
  if r ~= n then return r end
  r = n:gsub("^(layers%.%d+%.ffn)%.shared%.(w%d)$", "%1.shared_experts.%2.weight")
  if r ~= n then return r end
  r = n:gsub("^(layers%.%d+%.ffn%.experts%.%d+)%.(w%d)$", "%1.%2.weight")
  return r
end

-- model.py -> luapipe
function M.from_model(n)
  local r = n:gsub("^(layers%.%d+%.ffn)%.gate%.weight$", "%1.router.weight")
  if r ~= n then return r end
  r = n:gsub("^(layers%.%d+%.ffn)%.shared_experts%.(w%d)%.weight$", "%1.shared.%2")
  if r ~= n then return r end
  r = n:gsub("^(layers%.%d+%.ffn%.experts%.%d+)%.(w%d)%.weight$", "%1.%2")
  return r
end

-- one dotted component inside layers.N, model.py -> HF
local to_hf_part = {
  attn = "self_attn", ffn = "mlp", attn_norm = "input_layernorm",
  ffn_norm = "post_attention_layernorm", wq_a = "q_a_proj", q_norm = "q_a_layernorm",
  wq_b = "q_b_proj", wq = "q_proj", wkv_a = "kv_a_proj_with_mqa", kv_norm = "kv_a_layernorm",
  wkv_b = "kv_b_proj", wo = "o_proj", w1 = "gate_proj", w2 = "down_proj", w3 = "up_proj",
}
local from_hf_part = {}
for k, v in pairs(to_hf_part) do from_hf_part[v] = k end
local top_to_hf = { ["embed.weight"] = "model.embed_tokens.weight",
  ["head.weight"] = "lm_head.weight", ["norm.weight"] = "model.norm.weight" }
local top_from_hf = {}
for k, v in pairs(top_to_hf) do top_from_hf[v] = k end

local function split(s)
  local t = {}
  for part in s:gmatch("[^.]+") do t[#t + 1] = part end
  return t
end

-- model.py -> HF (a scale: "...scale" -> "...weight_scale_inv")
function M.to_hf(n)
  if top_to_hf[n] then return top_to_hf[n] end
  local i, rest = n:match("^layers%.(%d+)%.(.+)$")
  if not i then return nil end
  local t = split(rest)
  for k, p in ipairs(t) do t[k] = to_hf_part[p] or p end
  local s = table.concat(t, ".")
  s = s:gsub("^mlp%.gate%.bias$", "mlp.gate.e_score_correction_bias")
  s = s:gsub("%.scale$", ".weight_scale_inv")
  return "model.layers." .. i .. "." .. s
end

-- HF -> model.py (nil for a name outside the map)
function M.from_hf(n)
  if top_from_hf[n] then return top_from_hf[n] end
  local i, rest = n:match("^model%.layers%.(%d+)%.(.+)$")
  if not i then return nil end
  rest = rest:gsub("^mlp%.gate%.e_score_correction_bias$", "mlp.gate.bias")
  rest = rest:gsub("%.weight_scale_inv$", ".scale")
  local t = split(rest)
  for k, p in ipairs(t) do t[k] = from_hf_part[p] or p end
  return "layers." .. i .. "." .. table.concat(t, ".")
end

-- The layer index of a model.py or HF name (nil for embed/norm/head).
function M.layer_of(n)
  return tonumber(n:match("^layers%.(%d+)%.") or n:match("^model%.layers%.(%d+)%."))
end

return M
