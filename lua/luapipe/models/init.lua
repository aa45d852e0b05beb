-- luapipe.models: real architectures as readable chunk graphs, their
-- config readers and the name maps to checkpoint tensors.
--
--   models.deepseek_v3(args) -> model      DeepSeek-V3 / V2-Lite as
--     DeepSeek's inference/model.py defines it, args in ModelArgs names
--     (luapipe.models.config); an nn.sequential model train{} takes.
--   models.load(DIR [, opts]) -> model     the same, its weights read from
--     a checkpoint folder (DeepSeek's converted form or Hugging Face's).
--   models.save(model_or_result, DIR2 [, {dtype = "f32" | "bf16"}])
--     writes config.json + safetensors in the layout and names it was
--     loaded with (rank 0 writes, every rank sends its stages' tensors).
--
-- The graph, read beside model.py's Transformer:
--   embed      nn.embedding(vocab_size, dim)              embed.weight
--   layers.i   nn.mla_block{attn = nn.mla{...},           model.py's Block:
--                ffn = nn.swiglu(dim, inter_dim)          x + attn(attn_norm(x)),
--                    | nn.moe{...}}                       x + ffn(ffn_norm(x))
--   norm       nn.rmsnorm(dim, 1e-6)                      norm.weight
--   head       nn.linear(dim, vocab_size, {bias = false}) head.weight
--   loss       cross-entropy over every position
-- The MoE is model.py's MoE: routed SwiGLU experts of moe_inter_dim, one
-- shared MLP of n_shared_experts * moe_inter_dim, Gate = nn.moe's router
-- (score_func, groups, the correction bias for selection only, weights
-- normalised for sigmoid only, times route_scale).
local core = require("luapipe.core")
local nn = require("luapipe.nn")
local util = require("luapipe.util")
local config = require("luapipe.models.config")
local names = require("luapipe.models.names")

local M = {}
M.config = config
M.names = names

-- The usage error of this module: one line, exit 2 in the CLI.
local function fail(msg) error(msg, 0) end

-- ---- the architecture ----

local function mla_spec(a)
  return nn.mla { dim = a.dim, n_heads = a.n_heads, q_lora_rank = a.q_lora_rank,
    kv_lora_rank = a.kv_lora_rank, qk_nope_head_dim = a.qk_nope_head_dim,
    qk_rope_head_dim = a.qk_rope_head_dim, v_head_dim = a.v_head_dim,
    max_seq_len = a.max_seq_len, original_seq_len = a.original_seq_len,
    rope_theta = a.rope_theta, rope_factor = a.rope_factor, beta_fast = a.beta_fast,
    beta_slow = a.beta_slow, mscale = a.mscale, eps = a.eps }
end

-- model.py's MoE (Gate, routed experts, shared experts)
local function moe_spec(a)
  return nn.moe { dim = a.dim, hidden = a.moe_inter_dim, experts = a.n_routed_experts,
    topk = a.n_activated_experts, groups = a.n_expert_groups, topk_groups = a.n_limited_groups,
    shared = a.n_shared_experts, route_scale = a.route_scale, router = a.score_func,
    correction_bias = a.correction_bias, norm_topk = a.score_func == "sigmoid",
    bias_speed = a.bias_speed }
end

local Base = getmetatable(nn.sequential { nn.rmsnorm(1) })
local V3 = setmetatable({}, { __index = Base })
V3.__index = V3

-- models.deepseek_v3(args) -> model. args: ModelArgs keys (a table as
-- config.read returns, or written by hand: missing keys take model.py's
-- defaults); correction_bias: whether the routers have the selection bias
-- (model.py: at dim 7168 only; a loaded checkpoint: when it holds one).
function M.deepseek_v3(args)
  if type(args) ~= "table" then fail("models.deepseek_v3: expects a table of ModelArgs keys") end
  local a = config.read(args, "models.deepseek_v3{...}")
  if args.correction_bias == nil then a.correction_bias = a.dim == 7168 end
  local specs, lnames = {}, {}
  local function add(spec, name) specs[#specs + 1] = spec; lnames[#lnames + 1] = name end
  add(nn.embedding(a.vocab_size, a.dim), "embed")
  for i = 0, a.n_layers - 1 do
    local ffn = i < a.n_dense_layers and nn.swiglu(a.dim, a.inter_dim) or moe_spec(a)
    add(nn.mla_block { attn = mla_spec(a), ffn = ffn }, "layers." .. i)
  end
  add(nn.rmsnorm(a.dim, a.eps), "norm")
  add(nn.linear(a.dim, a.vocab_size, { bias = false }), "head")
  specs.loss = "cross_entropy"
  local m = nn.sequential(specs)
  m.args, m.layer_names = a, lnames
  return setmetatable(m, V3)
end

-- model:build_layer(i, seed [, ep, ep_rank]): layer i under model.py's
-- name, initialised from seed (partition's cost measurement builds these:
-- it reads nothing); with ep > 1 its MoE is built placed for EP rank
-- ep_rank: only that rank's expert slots exist (the same values); its
-- GEMMs in the model's precision (model:set_precision)
function V3:build_layer(i, seed, ep, ep_rank)
  util.int_arg("model:build_layer", 1, "i", i, 1, #self.layers)
  local l = core.nn_layer(self.layers[i], self.layer_names[i], seed or 0, ep or 1, ep_rank or 0)
  if self.precision and self.precision ~= "f32" then l:set_precision(self.precision) end
  return l
end

-- The experts (0-based ids, as a set) that EP rank r of `ep` holds under
-- the MoE layer's default placement (slot s holds expert s % E).
local function own_experts(E, ep, r)
  local spr, own = (E + ep - 1) // ep, {}
  for s = r * spr, (r + 1) * spr - 1 do own[s % E] = true end
  return own
end

-- Layer i, built and (for a loaded model) filled from the checkpoint:
-- only its own tensors are read; with ep > 1, of the routed experts only
-- those this rank holds.
local function load_layer(self, i, seed, ep)
  local ep_rank = ep and ep > 1 and require("luapipe.comm").rank() % ep or 0
  -- placed for its EP rank: the other experts are never allocated, so the
  -- peak at load is the rank's share plus the tensor being read
  local l = self:build_layer(i, seed, ep and ep > 1 and ep or 1, ep_rank)
  if not self.ckpt then return l end
  local own
  if ep and ep > 1 then own = own_experts(self.args.n_routed_experts, ep, ep_rank) end
  local set = {}
  for _, p in ipairs(l:params()) do
    local e = p.name:match("%.ffn%.experts%.(%d+)%.")
    if not (own and e and not own[tonumber(e)]) then
      set[p.name] = self.ckpt:read(names.to_model(p.name), p.shape)
    end
  end
  l:set_params(set)
  for _, t in pairs(set) do t:close() end
  if l:moe_count() > 0 and self.args.correction_bias then
    local b = self.ckpt:read(self.layer_names[i] .. ".ffn.gate.bias",
      { self.args.n_routed_experts })
    l:set_moe_bias(1, b:totable())
    b:close()
  end
  return l
end

local function chunk(self, first, last, seed, name, ep)
  local ls = {}
  for i = first, last do ls[#ls + 1] = load_layer(self, i, seed, ep) end
  local c = core.nn_chunk(name, ls)
  for _, l in ipairs(ls) do l:close() end
  return c
end

function V3:build(seed) return chunk(self, 1, #self.layers, seed, "model") end

-- model:build_stage(partition, stage, seed [, ep]): train{} passes ep so
-- that a rank reads only its own experts
function V3:build_stage(part, stage, seed, ep)
  local b = part.bounds[stage + 1]
  if not b then
    error(string.format("build_stage: no stage %d in a %d-stage partition", stage, part.stages), 2)
  end
  return chunk(self, b.first, b.last, seed, "stage." .. stage, ep or self.ep)
end

-- model:param_list() -> {{name =, shape =, layer =}, ...}: every trained
-- parameter of the whole model in order (model.py's names), computed from
-- the config (nothing built).
function V3:param_list()
  local a, out = self.args, {}
  local function p(layer, name, shape)
    out[#out + 1] = { layer = layer, name = name, shape = shape }
  end
  p(1, "embed.weight", { a.vocab_size, a.dim })
  local dq = a.qk_nope_head_dim + a.qk_rope_head_dim
  for i = 0, a.n_layers - 1 do
    local L, pre = i + 2, "layers." .. i .. "."
    p(L, pre .. "attn_norm.weight", { a.dim })
    if a.q_lora_rank > 0 then
      p(L, pre .. "attn.wq_a.weight", { a.q_lora_rank, a.dim })
      p(L, pre .. "attn.q_norm.weight", { a.q_lora_rank })
      p(L, pre .. "attn.wq_b.weight", { a.n_heads * dq, a.q_lora_rank })
    else
      p(L, pre .. "attn.wq.weight", { a.n_heads * dq, a.dim })
    end
    p(L, pre .. "attn.wkv_a.weight", { a.kv_lora_rank + a.qk_rope_head_dim, a.dim })
    p(L, pre .. "attn.kv_norm.weight", { a.kv_lora_rank })
    p(L, pre .. "attn.wkv_b.weight", { a.n_heads * (a.qk_nope_head_dim + a.v_head_dim),
      a.kv_lora_rank })
    p(L, pre .. "attn.wo.weight", { a.dim, a.n_heads * a.v_head_dim })
    p(L, pre .. "ffn_norm.weight", { a.dim })
    if i < a.n_dense_layers then
      p(L, pre .. "ffn.w1.weight", { a.inter_dim, a.dim })
      p(L, pre .. "ffn.w2.weight", { a.dim, a.inter_dim })
      p(L, pre .. "ffn.w3.weight", { a.inter_dim, a.dim })
    else
      p(L, pre .. "ffn.gate.weight", { a.n_routed_experts, a.dim })
      for e = 0, a.n_routed_experts - 1 do
        local x = pre .. "ffn.experts." .. e .. "."
        p(L, x .. "w1.weight", { a.moe_inter_dim, a.dim })
        p(L, x .. "w2.weight", { a.dim, a.moe_inter_dim })
        p(L, x .. "w3.weight", { a.moe_inter_dim, a.dim })
      end
      if a.n_shared_experts > 0 then
        local h = a.n_shared_experts * a.moe_inter_dim
        p(L, pre .. "ffn.shared_experts.w1.weight", { h, a.dim })
        p(L, pre .. "ffn.shared_experts.w2.weight", { a.dim, h })
        p(L, pre .. "ffn.shared_experts.w3.weight", { h, a.dim })
      end
    end
  end
  p(#self.layers - 1, "norm.weight", { a.dim })
  p(#self.layers, "head.weight", { a.vocab_size, a.dim })
  return out
end

-- model:counts() -> total parameters, parameters activated per token
function V3:counts()
  local a, total, active = self.args, 0, 0
  for _, p in ipairs(self:param_list()) do
    local n = 1
    for _, d in ipairs(p.shape) do n = n * d end
    total = total + n
    local e = p.name:match("%.experts%.(%d+)%.")
    if not e then active = active + n
    elseif tonumber(e) < a.n_activated_experts then active = active + n end
  end
  return total, active
end

-- ---- loading ----

M.load = require("luapipe.models.checkpoint").loader(M, V3)
M.save = require("luapipe.models.checkpoint").saver(M, V3)

return M
