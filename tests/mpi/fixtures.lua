-- fixtures.lua — the models and data shared by the multi-rank test drivers
-- (loaded with dofile from the repository root). Everything is
-- deterministic: the same micro-batch on every rank that asks for it.
local nn = require("luapipe.nn")

local F = {}

-- An 8-layer MLP (linear, activations, residual MLP blocks, RMSNorm) with
-- an MSE loss: 6 inputs, 3 outputs.
function F.mlp()
  return nn.sequential {
    nn.linear(6, 16), nn.gelu(), nn.mlp_block(16, 32, "gelu"), nn.linear(16, 16),
    nn.silu(), nn.mlp_block(16, 24, "silu"), nn.rmsnorm(16), nn.linear(16, 3),
    loss = "mse",
  }
end

-- Inputs of a synthetic regression: 4 rows of 6 features for (step, mb).
local function inputs(step, mb)
  local x = {}
  for b = 0, 3 do
    for i = 1, 6 do x[b * 6 + i] = math.sin(0.7 * step + 1.3 * mb + 0.37 * b + 0.91 * i) end
  end
  return x
end

-- The target is a fixed function of the input (learnable).
function F.regression_data(step, mb)
  local x, y = inputs(step, mb), {}
  for b = 0, 3 do
    for j = 1, 3 do
      local s = 0
      for i = 1, 6 do s = s + x[b * 6 + i] * math.cos(i * j) end
      y[b * 3 + j] = math.tanh(s)
    end
  end
  return nn.tensor({ 4, 6 }, x), nn.tensor({ 4, 3 }, y)
end

-- A small transformer LM (embedding, attention, cross-entropy) over a
-- 12-token vocabulary, and its data: 2 sequences of 5 tokens.
local V, D, T = 12, 8, 5
function F.lm()
  return nn.sequential {
    nn.embedding(V, D), nn.transformer_block(D, 2, 16, "gelu"), nn.residual(nn.attention(D, 2)),
    nn.transformer_block(D, 2, 16, "silu"), nn.rmsnorm(D), nn.linear(D, V),
    loss = "cross_entropy",
  }
end

function F.lm_data(step, mb)
  local x, y = {}, {}
  for i = 1, 2 * T do
    x[i] = (step * 5 + mb * 3 + i * 7) % V
    y[i] = (x[i] * 3 + 1) % V
  end
  return nn.tensor({ 2, T }, x), nn.tensor({ 2, T }, y)
end

-- A small MoE LM of 8 layers (enough for 8 stages): embedding, three
-- DeepSeek-style MoE blocks (sigmoid routers with groups, a shared expert
-- and router-bias balancing; one softmax router) between attention and a
-- transformer block, and the head; 4 experts, top-2. Data: 4 sequences of 5 tokens, so
-- 2 EP ranks take 2 sequences each.
function F.moe_lm(experts)
  local E = experts or 4
  return nn.sequential {
    nn.embedding(V, D),
    nn.moe_block { dim = D, heads = 2, hidden = 8, experts = E, topk = 2, groups = 2,
      topk_groups = 1, shared = 1, route_scale = 1.5, bias_speed = 0.01 },
    nn.residual(nn.attention(D, 2)),
    nn.moe_block { dim = D, heads = 2, hidden = 8, experts = E, topk = 2, router = "softmax",
      balance_alpha = 0.1 },
    nn.transformer_block(D, 2, 16, "silu"),
    nn.moe_block { dim = D, heads = 2, hidden = 8, experts = E, topk = 2, groups = 2,
      topk_groups = 2, bias_speed = 0.01 },
    nn.rmsnorm(D), nn.linear(D, V),
    loss = "cross_entropy",
  }
end

function F.moe_lm_data(step, mb)
  local x, y = {}, {}
  for i = 1, 4 * T do
    x[i] = (step * 5 + mb * 3 + i * 7 + (i * i) % 5) % V
    y[i] = (x[i] * 3 + 1) % V
  end
  return nn.tensor({ 4, T }, x), nn.tensor({ 4, T }, y)
end

-- A token-LM data function over ids 0..vocab-1: micro-batch mb of step
-- `step` is 2 sequences of `seq` tokens (default 8; inputs and targets),
-- different per mb and step (the DeepSeek-V3 drivers).
function F.token_data(vocab, seq)
  seq = seq or 8
  return function(step, mb)
    local x, y = {}, {}
    for i = 1, 2 * seq do
      x[i] = (i * 7 + mb * 13 + step * 29) % vocab
      y[i] = (i * 11 + mb * 5 + step * 3 + 1) % vocab
    end
    return nn.tensor({ 2, seq }, x), nn.tensor({ 2, seq }, y)
  end
end

return F
