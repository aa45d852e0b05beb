-- luapipe.models.config: DeepSeek-V3's configuration, read from either of
-- the two config.json forms a checkpoint comes with, into model.py's
-- ModelArgs names (inference/model.py of deepseek-ai/DeepSeek-V3):
--   DeepSeek's converted form (inference/configs/*.json): the ModelArgs keys
--     themselves (dim, n_layers, n_dense_layers, ...);
--   Hugging Face's (DeepseekV3ForCausalLM): hidden_size, num_hidden_layers,
--     first_k_dense_replace, n_group, topk_group, routed_scaling_factor,
--     scoring_func, rope_scaling {type = "yarn", ...}, quantization_config.
-- A mistake names the file and the key: error(msg, 0), the caller exits 2.
local M = {}

-- ModelArgs' defaults for the keys a converted config may leave out
-- (model.py's values; max_seq_len is not defaulted: model.py's 16384 turns
-- YaRN on by itself, so a config must say it).
M.defaults = {
  n_expert_groups = 1, n_limited_groups = 1, score_func = "softmax", route_scale = 1.0,
  q_lora_rank = 0, original_seq_len = 4096, rope_theta = 10000.0, rope_factor = 40.0,
  beta_fast = 32, beta_slow = 1, mscale = 1.0, n_shared_experts = 0, n_dense_layers = 0,
}

-- Keys every config must give (ModelArgs names).
M.required = { "vocab_size", "dim", "inter_dim", "moe_inter_dim", "n_layers", "n_heads",
  "n_routed_experts", "n_activated_experts", "kv_lora_rank", "qk_nope_head_dim",
  "qk_rope_head_dim", "v_head_dim", "max_seq_len" }

local ints = { vocab_size = 1, dim = 1, inter_dim = 1, moe_inter_dim = 1, n_layers = 1,
  n_dense_layers = 0, n_heads = 1, n_routed_experts = 1, n_shared_experts = 0,
  n_activated_experts = 1, n_expert_groups = 1, n_limited_groups = 1, q_lora_rank = 0,
  kv_lora_rank = 1, qk_nope_head_dim = 1, qk_rope_head_dim = 2, v_head_dim = 1, max_seq_len = 1,
  original_seq_len = 1, beta_fast = 0, beta_slow = 0 }

-- HF key -> ModelArgs key (top level)
M.hf_keys = {
  vocab_size = "vocab_size", hidden_size = "dim", intermediate_size = "inter_dim",
  moe_intermediate_size = "moe_inter_dim", num_hidden_layers = "n_layers",
  first_k_dense_replace = "n_dense_layers", num_attention_heads = "n_heads",
  n_routed_experts = "n_routed_experts", n_shared_experts = "n_shared_experts",
  num_experts_per_tok = "n_activated_experts", n_group = "n_expert_groups",
  topk_group = "n_limited_groups", scoring_func = "score_func",
  routed_scaling_factor = "route_scale", q_lora_rank = "q_lora_rank",
  kv_lora_rank = "kv_lora_rank", qk_nope_head_dim = "qk_nope_head_dim",
  qk_rope_head_dim = "qk_rope_head_dim", v_head_dim = "v_head_dim", rope_theta = "rope_theta",
}

local function fail(file, fmt, ...) error(file .. ": " .. string.format(fmt, ...), 0) end

local function whole(v)
  if math.type(v) == "integer" then return v end
  if type(v) == "number" and v == math.floor(v) and v > -2 ^ 53 and v < 2 ^ 53 then
    return math.tointeger(v)
  end
  return nil
end

-- The form of a decoded config.json: "hf" (hidden_size), "deepseek" (dim) or nil.
function M.form(cfg)
  if cfg.hidden_size ~= nil then return "hf" end
  if cfg.dim ~= nil then return "deepseek" end
  return nil
end

-- HF keys -> ModelArgs table (plus hf extras: num_nextn_predict_layers,
-- quantization block, eps).
local function from_hf(cfg, file)
  local a = {}
  for hk, mk in pairs(M.hf_keys) do
    local v = cfg[hk]
    if v ~= nil and v ~= require("luapipe.json").null then a[mk] = v end
  end
  if cfg.q_lora_rank == require("luapipe.json").null then a.q_lora_rank = 0 end
  local rs = cfg.rope_scaling
  if type(rs) == "table" then
    local kind = rs.type or rs.rope_type
    if kind ~= "yarn" then
      fail(file, "rope_scaling of type %s: only \"yarn\" (DeepSeek-V3's) is supported",
        tostring(kind))
    end
    a.max_seq_len = cfg.max_position_embeddings
    a.original_seq_len = rs.original_max_position_embeddings
    a.rope_factor = rs.factor
    a.beta_fast, a.beta_slow = rs.beta_fast, rs.beta_slow
    -- model.py's mscale is HF's mscale_all_dim; HF multiplies cos/sin by
    -- yarn(mscale) / yarn(mscale_all_dim), which is 1 only when they agree
    a.mscale = rs.mscale_all_dim or rs.mscale
    if rs.mscale ~= nil and rs.mscale_all_dim ~= nil and rs.mscale ~= rs.mscale_all_dim then
      fail(file, "rope_scaling.mscale (%s) differs from mscale_all_dim (%s): "
        .. "model.py has one mscale", tostring(rs.mscale), tostring(rs.mscale_all_dim))
    end
    for _, k in ipairs({ "original_max_position_embeddings", "factor" }) do
      if rs[k] == nil then fail(file, "rope_scaling of type yarn lacks '%s'", k) end
    end
  else
    -- no YaRN: the sequence length must not exceed original_seq_len
    a.max_seq_len = cfg.max_position_embeddings
    a.original_seq_len = cfg.max_position_embeddings
  end
  if cfg.max_position_embeddings == nil then fail(file, "missing key 'max_position_embeddings'") end
  if cfg.hidden_act ~= nil and cfg.hidden_act ~= "silu" then
    fail(file, "hidden_act \"%s\": DeepSeek-V3's MLPs are SwiGLU (\"silu\")",
      tostring(cfg.hidden_act))
  end
  if cfg.tie_word_embeddings == true then
    fail(file, "tie_word_embeddings is true: DeepSeek-V3's head is not tied to the embedding")
  end
  if cfg.rms_norm_eps ~= nil and math.abs(cfg.rms_norm_eps - 1e-6) > 1e-12 then
    a.eps = cfg.rms_norm_eps
  end
  if cfg.moe_layer_freq ~= nil and cfg.moe_layer_freq ~= 1 then
    fail(file, "moe_layer_freq %s: only 1 (every layer after the dense ones is MoE) is supported",
      tostring(cfg.moe_layer_freq))
  end
  -- norm_topk_prob: model.py normalises sigmoid weights only
  local sf = a.score_func or "softmax"
  if cfg.norm_topk_prob ~= nil and (cfg.norm_topk_prob == true) ~= (sf == "sigmoid") then
    fail(file, "norm_topk_prob = %s with scoring_func \"%s\": model.py normalises the weights "
      .. "of sigmoid scores only", tostring(cfg.norm_topk_prob), sf)
  end
  return a
end

local function block_of(cfg, file)
  local q = cfg.quantization_config
  if type(q) ~= "table" then return 128 end
  local b = q.weight_block_size
  if b == nil then return 128 end
  if type(b) ~= "table" or #b ~= 2 or whole(b[1]) == nil or b[1] ~= b[2] or b[1] < 1 then
    fail(file, "quantization_config.weight_block_size must be two equal positive integers, got %s",
      require("luapipe.json").encode(b))
  end
  return whole(b[1])
end

-- M.read(cfg, file) -> args (ModelArgs names, every key set), form.
-- args.block: the FP8 scale block; args.mtp: MTP layers (HF's
-- num_nextn_predict_layers).
function M.read(cfg, file)
  if type(cfg) ~= "table" then fail(file, "is not a JSON object") end
  local form = M.form(cfg)
  if not form then
    fail(file, "has neither 'dim' (DeepSeek's ModelArgs keys) nor 'hidden_size' (Hugging "
      .. "Face's keys)")
  end
  local a
  if form == "hf" then
    a = from_hf(cfg, file)
  else
    a = {}
    for k, v in pairs(cfg) do a[k] = v end
    if cfg.hidden_size ~= nil then
      fail(file, "mixes DeepSeek's 'dim' with Hugging Face's 'hidden_size'")
    end
  end
  for _, k in ipairs(M.required) do
    if a[k] == nil then
      local hk
      for h, m in pairs(M.hf_keys) do if m == k then hk = h end end
      fail(file, "missing key '%s'", form == "hf" and (hk or k) or k)
    end
  end
  for k, v in pairs(M.defaults) do if a[k] == nil then a[k] = v end end
  for k, min in pairs(ints) do
    local v = whole(a[k])
    if v == nil or v < min then
      fail(file, "'%s' must be an integer >= %d, got %s", k, min, tostring(a[k]))
    end
    a[k] = v
  end
  for _, k in ipairs({ "route_scale", "rope_theta", "rope_factor", "mscale" }) do
    if type(a[k]) ~= "number" then
      fail(file, "'%s' must be a number, got %s", k, tostring(a[k]))
    end
  end
  if a.score_func ~= "softmax" and a.score_func ~= "sigmoid" then
    fail(file, "score_func must be \"softmax\" or \"sigmoid\", got %s", tostring(a.score_func))
  end
  if a.n_dense_layers > a.n_layers then
    fail(file, "n_dense_layers (%d) is more than n_layers (%d)", a.n_dense_layers, a.n_layers)
  end
  if a.n_activated_experts > a.n_routed_experts then
    fail(file, "n_activated_experts (%d) is more than n_routed_experts (%d)",
      a.n_activated_experts, a.n_routed_experts)
  end
  if a.n_routed_experts % a.n_expert_groups ~= 0 then
    fail(file, "n_routed_experts (%d) is not a multiple of n_expert_groups (%d)",
      a.n_routed_experts, a.n_expert_groups)
  end
  if a.n_limited_groups > a.n_expert_groups then
    fail(file, "n_limited_groups (%d) is more than n_expert_groups (%d)", a.n_limited_groups,
      a.n_expert_groups)
  end
  if a.qk_rope_head_dim % 2 ~= 0 then
    fail(file, "qk_rope_head_dim (%d) must be even", a.qk_rope_head_dim)
  end
  a.block = block_of(cfg, file)
  a.mtp = whole(cfg.num_nextn_predict_layers) or 0
  a.eps = a.eps or 1e-6
  return a, form
end

return M
