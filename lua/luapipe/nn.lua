-- luapipe.nn: models for pipeline training, built from layer specs.
--
--   local nn = require("luapipe.nn")
--   local model = nn.sequential {
--     nn.linear(16, 64), nn.gelu(), nn.mlp_block(64, 128), nn.linear(64, 4),
--     -- or MoE: nn.moe{dim = 64, hidden = 32, experts = 8, topk = 2}, and for
--     -- LMs nn.moe_block{dim =, heads =, hidden =, experts =, topk =, ...}
--     loss = "mse",                       -- or "cross_entropy"
--   }
--   local part = model:partition { stages = 4, by = "cost", input_shape = {8, 16} }
--   -- (by = "layers", the default here: equal layer counts; train{} uses "cost")
--   local chunk = model:build_stage(part, 2, seed)   -- a luapipe.Layer
--
-- Layer i (1-based in the spec list) is named "layers.<i-1>", and its
-- parameters are initialised from (seed, parameter name), so every split
-- of a model starts from the same numbers as the unsplit model.
-- Tensors: nn.tensor(shape, values) (flat row-major list; nil = zeros).
local core = require("luapipe.core")
local util = require("luapipe.util")

local M = {}

M.tensor = core.tensor

-- ---- layer specs (plain tables; the C side builds them) ----
-- Constructors check their arguments and raise at the caller, naming the
-- constructor and the argument ("nn.linear: din (argument 1) must be ...").

local INT32 = 0x7fffffff

local function shown(v)
  return type(v) == "string" and string.format("%q", v) or tostring(v)
end

-- Raises msg at the first caller outside this file (the user's code).
local function raise(msg)
  local here, level = debug.getinfo(1, "S").source, 1
  while debug.getinfo(level + 1, "S") and debug.getinfo(level + 1, "S").source == here do
    level = level + 1
  end
  error(msg, level + 1)
end

local function arg_error(fn, name, pos, what, v)
  raise(string.format("nn.%s: %s (argument %d) must be %s, got %s", fn, name, pos, what, shown(v)))
end

-- v as an integer in [min, INT32], else raises naming the argument
local function int_arg(fn, name, pos, v, min)
  local n = type(v) == "number" and math.tointeger(v)
  if not n or n < (min or 1) or n > INT32 then
    arg_error(fn, name, pos, min == 0 and "an integer >= 0" or "a positive integer", v)
  end
  return n
end

local function act_arg(fn, pos, act)
  if act ~= nil and act ~= "gelu" and act ~= "silu" then
    arg_error(fn, "act", pos, '"gelu" or "silu" (or nil: gelu)', act)
  end
  return act
end

local function heads_arg(fn, d_model, heads)
  heads = int_arg(fn, "heads", 2, heads)
  if d_model % heads ~= 0 then
    raise(string.format("nn.%s: d_model (%d) must be a multiple of heads (%d)", fn, d_model, heads))
  end
  return heads
end

function M.linear(din, dout, opts)
  din, dout = int_arg("linear", "din", 1, din), int_arg("linear", "dout", 2, dout)
  if opts ~= nil
    and (type(opts) ~= "table" or (opts.bias ~= nil and type(opts.bias) ~= "boolean")) then
    arg_error("linear", "opts", 3, "nil or {bias = true|false}", opts)
  end
  return { kind = "linear", din = din, dout = dout, bias = not (opts and opts.bias == false) }
end
function M.gelu() return { kind = "gelu" } end
function M.silu() return { kind = "silu" } end
function M.rmsnorm(dim, eps)
  dim = int_arg("rmsnorm", "dim", 1, dim)
  if eps ~= nil and not (type(eps) == "number" and eps > 0 and eps < math.huge) then
    arg_error("rmsnorm", "eps", 2, "a positive number (or nil)", eps)
  end
  return { kind = "rmsnorm", dim = dim, eps = eps }
end
function M.embedding(vocab, dim)
  return { kind = "embedding", vocab = int_arg("embedding", "vocab", 1, vocab),
    dim = int_arg("embedding", "dim", 2, dim) }
end
-- x + fc2(act(fc1(rmsnorm(x))))
function M.mlp_block(d_model, d_hidden, act)
  return { kind = "mlp_block", d_model = int_arg("mlp_block", "d_model", 1, d_model),
    d_hidden = int_arg("mlp_block", "d_hidden", 2, d_hidden), act = act_arg("mlp_block", 3, act) }
end
-- causal multi-head self-attention, x [batch, seq, d_model]
function M.attention(d_model, heads)
  d_model = int_arg("attention", "d_model", 1, d_model)
  return { kind = "attention", d_model = d_model, heads = heads_arg("attention", d_model, heads) }
end
-- x + attn(rmsnorm(x)), then an MLP block
function M.transformer_block(d_model, heads, d_hidden, act)
  local fn = "transformer_block"
  d_model = int_arg(fn, "d_model", 1, d_model)
  return { kind = fn, d_model = d_model, heads = heads_arg(fn, d_model, heads),
    d_hidden = int_arg(fn, "d_hidden", 3, d_hidden), act = act_arg(fn, 4, act) }
end
-- x + inner(x)
function M.residual(inner)
  if type(inner) ~= "table" or type(inner.kind) ~= "string" then
    arg_error("residual", "inner", 1, "a layer spec (nn.linear(...), ...)", inner)
  end
  return { kind = "residual", inner = inner }
end

local moe_fields = { "dim", "hidden", "experts", "topk", "groups", "topk_groups", "shared",
  "route_scale", "bias_speed", "router", "balance_alpha", "correction_bias", "norm_topk", "heads" }

local function moe_spec(kind, t)
  if type(t) ~= "table" then raise("nn." .. kind .. " expects a table of options") end
  local spec = { kind = kind }
  local known = {}
  for _, k in ipairs(moe_fields) do
    known[k] = k ~= "heads" or kind == "moe_block"; spec[k] = t[k]
  end
  for k in pairs(t) do
    if not known[k] then raise(string.format("nn.%s: unknown option '%s'", kind, tostring(k))) end
  end
  for _, k in ipairs({ "dim", "hidden", "experts" }) do
    if math.type(t[k]) ~= "integer" or t[k] < 1 then
      raise(string.format("nn.%s: '%s' must be a positive integer, got %s", kind, k,
        tostring(t[k])))
    end
  end
  for _, k in ipairs({ "topk", "groups", "topk_groups", "shared" }) do
    local v = t[k]
    if v ~= nil and (math.type(v) ~= "integer" or v < (k == "shared" and 0 or 1)) then
      raise(string.format("nn.%s: '%s' must be %s, got %s", kind, k,
        k == "shared" and "an integer >= 0" or "a positive integer", shown(v)))
    end
  end
  spec.topk = spec.topk or 1
  if spec.router and spec.router ~= "sigmoid" and spec.router ~= "softmax" then
    raise(string.format("nn.%s: router must be \"sigmoid\" or \"softmax\", got \"%s\"", kind,
      tostring(spec.router)))
  end
  for _, k in ipairs({ "correction_bias", "norm_topk" }) do
    if t[k] ~= nil and type(t[k]) ~= "boolean" then
      raise(string.format("nn.%s: '%s' must be true or false, got %s", kind, k, shown(t[k])))
    end
  end
  if t.correction_bias == false and (t.bias_speed or 0) > 0 then
    raise(string.format("nn.%s: bias_speed = %s moves a correction bias the layer does not have "
      .. "(correction_bias = false)", kind, tostring(t.bias_speed)))
  end
  if spec.topk > spec.experts then
    raise(string.format("nn.%s: topk (%d) is more than experts (%d)", kind, spec.topk,
      spec.experts))
  end
  return spec
end

-- DeepSeek-V3-style mixture of experts, x [..., dim] -> same shape:
-- nn.moe{dim =, hidden =, experts =, topk = 1, groups = 1, topk_groups = groups,
--        shared = 0, route_scale = 1, bias_speed = 0, router = "sigmoid" | "softmax",
--        balance_alpha = 0, correction_bias = true, norm_topk = true}
-- The router is DeepSeek's Gate (DeepSeek-V3 inference/model.py; its
-- score_func = router, n_groups = groups): the correction bias (nudged by
-- bias_speed) only selects; with groups, a group scores the sum of its two
-- best biased affinities and topk_groups groups are eligible. Without a
-- bias (correction_bias = false, as DeepSeek-V2) a group scores its best
-- affinity. Weights: route_scale * the chosen affinities / their sum;
-- norm_topk = false leaves out the division (the Gate's softmax weights).
-- (routed experts: SwiGLU FFNs of `hidden`; `shared` shared experts;
-- balance_alpha > 0 adds the sequence-wise balance loss, alpha times its
-- mean over the step's sequences, however train{} splits the batch into
-- micro-batches and EP shares; see lp_nn.h)
-- On a built layer, MoE layers counted from 1: layer:route(i, x) -> per
-- token {experts = {0-based ids, in selection order}, weights =, scores =}
-- (the forward's routing, experts not run); layer:moe_bias(i) and
-- layer:set_moe_bias(i, {one number per expert}).
function M.moe(t) return moe_spec("moe", t, 2) end
-- x + attn(rmsnorm(x)), then x + moe(rmsnorm(x)): nn.moe options plus heads
function M.moe_block(t) return moe_spec("moe_block", t, 2) end

-- DeepSeek-V3's dense layers, as inference/model.py defines them (its
-- parameter names: a checkpoint loads by name).
-- Multi-head Latent Attention, x [batch, seq, dim] -> same shape, causal:
-- nn.mla{dim =, n_heads = 16, q_lora_rank = 0, kv_lora_rank = 512,
--        qk_nope_head_dim = 128, qk_rope_head_dim = 64, v_head_dim = 128,
--        max_seq_len = 16384, original_seq_len = 4096, rope_theta = 10000,
--        rope_factor = 40, beta_fast = 32, beta_slow = 1, mscale = 1, eps = 1e-6}
-- (model.py's ModelArgs names and defaults; YaRN, and mscale on the softmax
-- scale, apply when max_seq_len > original_seq_len). Params <name>.wq.weight
-- (q_lora_rank 0) or .wq_a / .q_norm / .wq_b, then .wkv_a, .kv_norm, .wkv_b,
-- .wo (each ".weight").
local mla_int = { dim = true, n_heads = true, q_lora_rank = true, kv_lora_rank = true,
  qk_nope_head_dim = true, qk_rope_head_dim = true, v_head_dim = true, max_seq_len = true,
  original_seq_len = true }
local mla_num = { rope_theta = true, rope_factor = true, beta_fast = true, beta_slow = true,
  mscale = true, eps = true }
function M.mla(t)
  if type(t) ~= "table" then
    raise("nn.mla expects a table of options (model.py's ModelArgs names)")
  end
  local spec = { kind = "mla" }
  for k, v in pairs(t) do
    if mla_int[k] then
      if math.type(v) ~= "integer" then
        raise(string.format("nn.mla: '%s' must be an integer, got %s", k, shown(v)))
      end
    elseif mla_num[k] then
      if type(v) ~= "number" then
        raise(string.format("nn.mla: '%s' must be a number, got %s", k, shown(v)))
      end
    else
      raise(string.format("nn.mla: unknown option '%s'", tostring(k)))
    end
    spec[k] = v
  end
  if t.dim == nil then raise("nn.mla: 'dim' is required") end
  local why = core.nn_mla_check(spec) -- the core's rules
  if why then raise("nn.mla: " .. why) end
  return spec
end
-- model.py's MLP: w2(silu(w1 x) * w3 x), x [..., dim]; params <name>.w1.weight
-- [inter_dim, dim], .w2.weight [dim, inter_dim], .w3.weight [inter_dim, dim]
function M.swiglu(dim, inter_dim)
  return { kind = "swiglu", dim = int_arg("swiglu", "dim", 1, dim),
    inter_dim = int_arg("swiglu", "inter_dim", 2, inter_dim) }
end
-- model.py's Block: x + attn(attn_norm(x)), then x + ffn(ffn_norm(x)), the
-- norms RMSNorm(dim, eps): nn.mla_block{attn = nn.mla{...}, ffn = nn.swiglu(dim,
-- inter_dim) | nn.moe{dim =, ...}}. Params <name>.attn_norm.weight,
-- <name>.attn.*, <name>.ffn_norm.weight, <name>.ffn.* (model.py's layers.<i>.*).
function M.mla_block(t)
  if type(t) ~= "table" then
    raise("nn.mla_block expects {attn = nn.mla{...}, ffn = <layer spec>}")
  end
  for k in pairs(t) do
    if k ~= "attn" and k ~= "ffn" then
      raise(string.format("nn.mla_block: unknown option '%s'", tostring(k)))
    end
  end
  local function what(v)
    return type(v) == "table" and type(v.kind) == "string" and ("a " .. v.kind .. " spec")
      or shown(v)
  end
  if type(t.attn) ~= "table" or t.attn.kind ~= "mla" then
    raise("nn.mla_block: 'attn' must be an nn.mla{...} spec, got " .. what(t.attn))
  end
  if type(t.ffn) ~= "table" or type(t.ffn.kind) ~= "string" then
    raise("nn.mla_block: 'ffn' must be a layer spec (nn.swiglu(...), nn.moe{...}), got "
      .. what(t.ffn))
  end
  if t.ffn.dim ~= t.attn.dim then
    raise(string.format("nn.mla_block: ffn dim (%s) differs from attn dim (%d)", shown(t.ffn.dim),
      t.attn.dim))
  end
  return { kind = "mla_block", attn = t.attn, ffn = t.ffn }
end

local function describe(spec)
  if spec.kind == "linear" then return string.format("linear %d->%d", spec.din, spec.dout) end
  if spec.kind == "moe" or spec.kind == "moe_block" then
    return string.format("%s %d experts top-%d", spec.kind, spec.experts, spec.topk)
  end
  return spec.kind
end

local function fmt_shape(s) return "[" .. table.concat(s, ", ") .. "]" end

-- Output shape of `spec` for input shape `s` (a new table); raises with the
-- layer's position on a mismatch.
local function out_shape(spec, s, i)
  local last = s[#s]
  local function need(dim)
    if last ~= dim then
      error(string.format("model layer %d (%s) expects inputs [..., %d], got %s", i,
        describe(spec), dim, fmt_shape(s)), 0)
    end
  end
  local o = table.move(s, 1, #s, 1, {})
  local k = spec.kind
  if k == "linear" then need(spec.din); o[#o] = spec.dout
  elseif k == "embedding" then o[#o + 1] = spec.dim
  elseif k == "rmsnorm" then need(spec.dim)
  elseif k == "attention" or k == "mlp_block" or k == "transformer_block" then need(spec.d_model)
  elseif k == "moe" or k == "moe_block" or k == "mla" or k == "swiglu" then need(spec.dim)
  elseif k == "mla_block" then need(spec.attn.dim)
  elseif k == "residual" then
    local inner = out_shape(spec.inner, s, i)
    if fmt_shape(inner) ~= fmt_shape(s) then
      error(string.format("model layer %d (residual): inner output %s differs from its input %s",
        i, fmt_shape(inner), fmt_shape(s)), 0)
    end
  end
  return o
end

local Model = {}
Model.__index = Model

-- nn.sequential{spec, spec, ..., loss = "mse" | "cross_entropy"} -> Model
function M.sequential(t)
  if type(t) ~= "table" or #t == 0 then
    error("nn.sequential expects a list of layer specs (nn.linear(...), ...)", 2)
  end
  local layers = {}
  for i, spec in ipairs(t) do
    if type(spec) ~= "table" or type(spec.kind) ~= "string" then
      error(string.format("nn.sequential: entry %d is not a layer spec", i), 2)
    end
    layers[i] = spec
  end
  local loss = t.loss or "mse"
  local names = core.nn_loss_names()
  local known = false
  for _, n in ipairs(names) do known = known or loss == n end
  if not known then
    error(string.format("nn.sequential: loss must be \"%s\", got %s",
      table.concat(names, "\" or \""), tostring(loss)), 2)
  end
  return setmetatable({ layers = layers, loss = loss }, Model)
end

function Model:nlayers() return #self.layers end

-- model:shapes(input_shape) -> list: shapes[i] = output shape of layer i
-- (shapes[0] = the input shape). Raises on a size mismatch.
function Model:shapes(input_shape)
  local ok, why = core.check_shape(input_shape) -- the core's one shape rule
  if not ok then error("model:shapes: " .. why, 2) end
  local shapes = { [0] = input_shape }
  local s = input_shape
  for i, spec in ipairs(self.layers) do
    s = out_shape(spec, s, i)
    shapes[i] = s
  end
  return shapes
end

-- model:set_precision("f32" | "bf16") -> model: the precision of the GEMMs
-- of every layer built from now on (layer:set_precision; default "f32")
function Model:set_precision(p)
  if p ~= "f32" and p ~= "bf16" then
    util.raise(string.format("model:set_precision: precision must be \"f32\" or \"bf16\", got %s",
      util.shown(p)))
  end
  self.precision = p
  return self
end

-- model:build_layer(i, seed) -> luapipe.Layer for layer i (1-based)
function Model:build_layer(i, seed)
  util.int_arg("model:build_layer", 1, "i", i, 1, #self.layers)
  util.arg("model:build_layer", 2, "seed", seed, "?number", "a number")
  local l = core.nn_layer(self.layers[i], "layers." .. (i - 1), seed or 0)
  if self.precision and self.precision ~= "f32" then l:set_precision(self.precision) end
  return l
end

local function chunk_of(self, first, last, seed, name)
  local ls = {}
  for i = first, last do ls[#ls + 1] = self:build_layer(i, seed) end
  -- bf16: the values between the layers (where a stage boundary may fall)
  -- are bf16, here as on the wire between stages
  local c = core.nn_chunk(name, ls, self.precision == "bf16" and "bf16" or "f32")
  for _, l in ipairs(ls) do l:close() end
  return c
end

-- model:build(seed) -> the whole model as one luapipe.Layer (a chunk)
function Model:build(seed)
  util.arg("model:build", 1, "seed", seed, "?number", "a number")
  return chunk_of(self, 1, #self.layers, seed, "model")
end

-- model:build_stage(partition, stage, seed) -> luapipe.Layer of model stage
-- `stage` (0-based)
local function check_part(fn, part)
  if type(part) ~= "table" or type(part.bounds) ~= "table"
    or math.type(part.stages) ~= "integer" then
    util.raise(string.format("%s: partition (argument 1) must be a table from "
      .. "model:partition{...}, got %s", fn, util.shown(part)))
  end
end

function Model:build_stage(part, stage, seed)
  check_part("model:build_stage", part)
  util.arg("model:build_stage", 2, "stage", stage, "integer", "a model stage (0-based integer)")
  util.arg("model:build_stage", 3, "seed", seed, "?number", "a number")
  local b = part.bounds[stage + 1]
  if not b then
    error(string.format("build_stage: no stage %d in a %d-stage partition", stage, part.stages), 2)
  end
  return chunk_of(self, b.first, b.last, seed, "stage." .. stage)
end

-- Splits costs c[1..n] into S contiguous groups minimising the largest
-- group sum; returns bounds {{first, last}, ...}.
local function balanced_bounds(c, S)
  local n = #c
  local pre = { [0] = 0 }
  for i = 1, n do pre[i] = pre[i - 1] + c[i] end
  -- best[s][i]: minimal max cost of splitting the first i layers into s stages
  local best, cut = {}, {}
  best[0] = { [0] = 0 }
  for s = 1, S do
    best[s], cut[s] = {}, {}
    for i = s, n - (S - s) do
      local b, bj = math.huge, nil
      for j = s - 1, i - 1 do
        local prev = best[s - 1][j]
        if prev then
          local v = math.max(prev, pre[i] - pre[j])
          if v < b then b, bj = v, j end
        end
      end
      best[s][i], cut[s][i] = b, bj
    end
  end
  local bounds, i = {}, n
  for s = S, 1, -1 do
    local j = cut[s][i]
    bounds[s] = { first = j + 1, last = i }
    i = j
  end
  return bounds
end

-- With a score (score(stage_costs) -> number, e.g. the simulated step of
-- the schedule that will run; luapipe.train gives one), the split that
-- minimises the largest stage can still lose: where ranks run several
-- stages (interleaved, V shapes) it can leave one rank with twice
-- another's work. This one minimises the score first, then the largest
-- stage: every split when there are few (C(n-1, S-1) <= 2000), else moves
-- of one boundary by one layer from the balanced split while that
-- improves; either way for at most `budget` seconds (then the best found:
-- never worse than the balanced split). -> bounds
local function scored_bounds(c, S, score, start, budget)
  local t_end = core.now() + budget
  local n = #c
  local pre = { [0] = 0 }
  for i = 1, n do pre[i] = pre[i - 1] + c[i] end
  local function eval(cuts) -- cuts[s]: last layer of stage s (cuts[S] = n)
    local costs, worst, first = {}, 0, 1
    for st = 1, S do
      costs[st] = pre[cuts[st]] - pre[first - 1]
      worst = math.max(worst, costs[st])
      first = cuts[st] + 1
    end
    local v = score(costs)
    if type(v) ~= "number" or v ~= v then
      error("partition: score must return a number, got " .. util.shown(v), 0)
    end
    return v, worst
  end
  local function better(a1, a2, b1, b2)
    local e1, e2 = 1e-9 * (math.abs(b1) + 1e-30), 1e-12 * (pre[n] + 1e-30)
    return a1 < b1 - e1 or (a1 <= b1 + e1 and a2 < b2 - e2)
  end
  local cuts = {}
  for st = 1, S do cuts[st] = start[st].last end
  local b1, b2 = eval(cuts)
  local count, lim = 1, 2000
  for k = 1, S - 1 do -- C(n-1, S-1), stopping once past the limit
    count = count * (n - k) / k
    if count > lim then break end
  end
  if count <= lim then
    local cur = {}
    local function rec(st, lo)
      if core.now() > t_end then return end
      if st == S then
        cur[S] = n
        local x1, x2 = eval(cur)
        if better(x1, x2, b1, b2) then
          b1, b2 = x1, x2
          for k = 1, S do cuts[k] = cur[k] end
        end
        return
      end
      for last = lo, n - (S - st) do
        cur[st] = last
        rec(st + 1, last + 1)
      end
    end
    rec(1, 1)
  else
    local improved = true
    while improved and core.now() <= t_end do
      improved = false
      for st = 1, S - 1 do
        for _, d in ipairs({ -1, 1 }) do
          if core.now() > t_end then goto done end
          local v = cuts[st] + d
          local lo = st > 1 and cuts[st - 1] + 1 or 1
          if v >= lo and v < cuts[st + 1] then
            local old = cuts[st]
            cuts[st] = v
            local x1, x2 = eval(cuts)
            if better(x1, x2, b1, b2) then
              b1, b2, improved = x1, x2, true
            else
              cuts[st] = old
            end
          end
        end
      end
    end
  end
  ::done::
  local bounds, first = {}, 1
  for st = 1, S do
    bounds[st] = { first = first, last = cuts[st] }
    first = cuts[st] + 1
  end
  return bounds
end

-- Measures each layer's forward + backward seconds on a zero input of
-- input_shape, building, timing and closing one layer at a time (the
-- next layer's input is this one's output), so that at most one layer and
-- its activations exist at once, after an untimed warm-up pass (cut short
-- after WARMUP_S seconds). Under mpirun every rank measures and each
-- layer's cost is its fastest rank's, the same numbers on every rank.
-- -> costs, seconds spent
local WARMUP_S = 0.1

-- One pass over the layers, each built, run `reps` times and closed;
-- stops after `stop_s` seconds when given (the warm-up). -> {seconds...}
local function layer_pass(self, input_shape, seed, reps, stop_s)
  local t0, costs = core.now(), {}
  local x = core.tensor(input_shape)
  for i = 1, #self.layers do
    local l = self:build_layer(i, seed)
    local t, y = core.nn_time_layer(l, x, reps, i > 1)
    l:close()
    x:close()
    if not t then
      error(string.format("partition: measuring the cost of model layer %d (%s) failed: %s", i,
        self.layers[i].kind, tostring(y)), 0)
    end
    costs[i], x = t, y
    if stop_s and core.now() - t0 >= stop_s then break end
  end
  x:close()
  return costs
end

local function measure_costs(self, input_shape, seed, reps)
  local t0 = core.now()
  local n = #self.layers
  local comm = require("luapipe.comm")
  -- a process's first pass runs slow (measured on the char-LM: its first
  -- transformer block a quarter over its five twins): one untimed pass
  -- first, cut short after WARMUP_S for a big model
  layer_pass(self, input_shape, seed, 1, WARMUP_S)
  local costs = layer_pass(self, input_shape, seed, reps)
  if comm.size() > 1 then
    -- every rank timed the same work; interference (other ranks sharing a
    -- core, one still starting up) only adds time: take each layer's
    -- fastest rank. Every rank gathers the same lists (as floats) and the
    -- minimum is exact, so every rank gets the very same numbers and split.
    local lists = {}
    for r = 1, comm.size() do lists[r] = costs end
    local all, err = comm.alltoallv(lists, "partition: gathering layer costs")
    if not all then error("partition: " .. tostring(err), 0) end
    for i = 1, n do
      local m = all[1][i]
      for r = 2, comm.size() do m = math.min(m, all[r][i]) end
      costs[i] = m
    end
  end
  return costs, core.now() - t0
end

-- model:partition{stages = S, by = "layers" | "cost", input_shape = {...},
--                 costs = {...}, reps = 3, bounds = {...}}
--   -> {stages = S, by =, bounds = {{first =, last =}, ...}, costs =, seconds =}
-- "layers" (the default here; luapipe.train{} defaults to "cost"):
-- contiguous groups of (almost) equal layer counts, the earlier stages
-- taking the extra layers. "cost": contiguous groups minimising the
-- largest stage cost, where a layer's cost is its measured forward +
-- backward time (the best of `reps` runs, after an untimed warm-up) on a
-- zero input of input_shape
-- (or the given `costs`); the layers are built, timed and closed one at a
-- time, and `seconds` is how long measuring took. Measuring is collective
-- under mpirun (call it on every rank): a layer's cost is that of its
-- fastest rank (the same work everywhere; sharing a core only adds time),
-- exactly the same on every rank, so every rank gets the same partition;
-- ties go to the earliest cut. With `score` (a function of the stage
-- costs {c1, ..., cS} returning a number; luapipe.train gives the
-- schedule's simulated step) the split minimises the score first, then the
-- largest stage: a rank that holds two stages of a V shape or of an
-- interleaved schedule gets their sum balanced; the search stops after
-- score_seconds (default 1) with the best split found. `bounds` ({{first, last}, ...} or
-- {{first =, last =}, ...}, e.g. a checkpoint's) gives the split itself
-- (checked: contiguous, covering every layer, S stages). A model with
-- fewer layers than stages is an error.
function Model:partition(opts)
  opts = util.arg("model:partition", 1, "opts", opts, "?table",
    "a table {stages =, by =, input_shape =}") or {}
  local S, n = opts.stages, #self.layers
  if math.type(S) ~= "integer" or S < 1 then
    error("partition: 'stages' must be a positive integer, got " .. tostring(S), 2)
  end
  if S > n then
    error(string.format("partition: the schedule wants %d model stages, but the model has only %s"
      .. " (each stage needs at least one layer): use a deeper model, or fewer stages (fewer ranks"
      .. " or chunks)", S, util.count(n, "layer")), 2)
  end
  local by = opts.by or "layers"
  local bounds, costs, seconds
  if opts.bounds ~= nil then
    local why
    bounds, why = M.check_bounds(opts.bounds, S, n)
    if not bounds then error("partition: bounds: " .. why, 2) end
  elseif by == "layers" then
    bounds = {}
    local base, extra, first = n // S, n % S, 1
    for s = 1, S do
      local size = base + (s <= extra and 1 or 0)
      bounds[s] = { first = first, last = first + size - 1 }
      first = first + size
    end
  elseif by == "cost" then
    costs = opts.costs
    if not costs then
      if not opts.input_shape then
        error("partition: by = \"cost\" needs input_shape (or costs)", 2)
      end
      self:shapes(opts.input_shape)
      local ok, c, t = pcall(measure_costs, self, opts.input_shape, opts.seed or 0, opts.reps or 3)
      if not ok then error(c, 2) end
      costs, seconds = c, t
    end
    bounds = balanced_bounds(costs, S)
    if opts.score ~= nil then
      if type(opts.score) ~= "function" then
        error("partition: score must be a function(stage_costs) -> number, got "
          .. util.shown(opts.score), 2)
      end
      local ok, b = pcall(scored_bounds, costs, S, opts.score, bounds, opts.score_seconds or 1)
      if not ok then error(b, 2) end
      bounds = b
    end
  else
    error("partition: 'by' must be \"layers\" or \"cost\", got " .. tostring(by), 2)
  end
  return { stages = S, by = by, bounds = bounds, costs = costs, seconds = seconds }
end

-- nn.check_bounds(bounds, S, n) -> {{first =, last =}, ...} | nil, why:
-- bounds ({{first, last}, ...} or {{first =, last =}, ...}) as S
-- contiguous, non-empty groups covering layers 1..n.
function M.check_bounds(bounds, S, n)
  util.arg("nn.check_bounds", 2, "S", S, "integer")
  util.arg("nn.check_bounds", 3, "n", n, "integer")
  if type(bounds) ~= "table" then return nil, "not a list of {first, last}" end
  if #bounds ~= S then
    return nil, string.format("%s for %s", util.count(#bounds, "stage"),
      util.count(S, "model stage"))
  end
  local out, next_first = {}, 1
  for s, b in ipairs(bounds) do
    local f = type(b) == "table" and (b.first or b[1])
    local l = type(b) == "table" and (b.last or b[2])
    if math.type(f) ~= "integer" or math.type(l) ~= "integer" then
      return nil, string.format("stage %d is not {first, last}", s - 1)
    end
    if f ~= next_first or l < f then
      return nil, string.format("stage %d holds layers %d..%d, but it must start at layer %d and"
        .. " hold at least one", s - 1, f, l, next_first)
    end
    out[s] = { first = f, last = l }
    next_first = l + 1
  end
  if next_first ~= n + 1 then
    return nil, string.format("the stages end at layer %d, but the model has %s", next_first - 1,
      util.count(n, "layer"))
  end
  return out
end

-- nn.bounds_text(bounds) -> "1-3 | 4-8": a partition's layers per stage
-- (1-based, as in the model's spec list)
function M.bounds_text(bounds)
  util.arg("nn.bounds_text", 1, "bounds", bounds, "table",
    "a partition's bounds {{first =, last =}, ...}")
  local t = {}
  for s, b in ipairs(bounds) do
    if type(b) ~= "table" or math.type(b.first) ~= "integer" or math.type(b.last) ~= "integer" then
      util.raise(string.format("nn.bounds_text: bounds (argument 1): stage %d is not "
        .. "{first =, last =}", s - 1))
    end
    t[s] = b.first == b.last and tostring(b.first) or string.format("%d-%d", b.first, b.last)
  end
  return table.concat(t, " | ")
end

-- model:stage_input_shapes(partition, input_shape) -> {[s] = shape} for
-- s = 1..S-1: the activation shape entering model stage s.
function Model:stage_input_shapes(part, input_shape)
  check_part("model:stage_input_shapes", part)
  local shapes = self:shapes(input_shape)
  local out = {}
  for s = 1, part.stages - 1 do out[s] = shapes[part.bounds[s + 1].first - 1] end
  return out
end

M.Model = Model
-- a mistyped name ("luapipe.nn.x") gets a "did you mean"
return require("luapipe.util").guard(M, "luapipe.nn")
