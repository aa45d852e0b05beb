-- nn.mla and nn.swiglu (DeepSeek-V3's dense layers, model.py's names): the
-- parameter names and shapes a checkpoint loads by, forwards computed by
-- hand here, the ModelArgs option names and their errors, and the layers
-- inside a model.
local lu = require("luaunit")
local nn = require("luapipe.nn")
local core = require("luapipe.core")

local function error_of(f, ...)
  local ok, err = pcall(f, ...)
  lu.assertFalse(ok, "expected an error")
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

local function names_shapes(l)
  local n, s = {}, {}
  for _, p in ipairs(l:params()) do
    n[#n + 1] = p.name
    s[#s + 1] = p.shape
  end
  return n, s
end

function test_mla_params_as_model_py()
  local l = core.nn_layer(nn.mla { dim = 8, n_heads = 2, q_lora_rank = 4, kv_lora_rank = 6,
    qk_nope_head_dim = 2, qk_rope_head_dim = 4, v_head_dim = 3, max_seq_len = 64,
    original_seq_len = 16, rope_factor = 4, mscale = 0.707 }, "layers.5.attn", 1)
  local n, s = names_shapes(l)
  lu.assertEquals(n, { "layers.5.attn.wq_a.weight", "layers.5.attn.q_norm.weight",
    "layers.5.attn.wq_b.weight", "layers.5.attn.wkv_a.weight", "layers.5.attn.kv_norm.weight",
    "layers.5.attn.wkv_b.weight", "layers.5.attn.wo.weight" })
  lu.assertEquals(s, { { 4, 8 }, { 4 }, { 12, 4 }, { 10, 8 }, { 6 }, { 10, 6 }, { 8, 6 } })
  l:close()
  -- without q LoRA: one wq
  local w = core.nn_layer(nn.mla { dim = 8, n_heads = 2, kv_lora_rank = 6, qk_nope_head_dim = 2,
    qk_rope_head_dim = 4, v_head_dim = 3 }, "attn", 1)
  n, s = names_shapes(w)
  lu.assertEquals(n[1], "attn.wq.weight")
  lu.assertEquals(s[1], { 12, 8 })
  lu.assertEquals(#n, 5)
  w:close()
end

-- One position: the softmax has one key, the rotation is the identity, so
-- y = wo [v_0, v_1] with v_h = wkv_b's value row of head h times
-- kv_norm(wkv_a's first kv_lora_rank rows x).
function test_mla_forward_by_hand()
  local l = core.nn_layer(nn.mla { dim = 4, n_heads = 2, kv_lora_rank = 2, qk_nope_head_dim = 1,
    qk_rope_head_dim = 2, v_head_dim = 1, max_seq_len = 8, original_seq_len = 8 }, "attn", 3)
  l:set_params {
    ["attn.wkv_a.weight"] = { 1, 0, 0, 0, 0, 1, 0, 0, 0.3, 0.1, 0, 0, 0, 0, 0.2, 0 },
    ["attn.kv_norm.weight"] = { 1, 0.5 },
    -- rows: head 0 key, head 0 value, head 1 key, head 1 value
    ["attn.wkv_b.weight"] = { 0.4, -0.2, 1, 1, 0.7, 0.1, 2, -1 },
    ["attn.wo.weight"] = { 1, 0, 0, 1, 1, 1, 1, -1 },
  }
  local y = l:forward(nn.tensor({ 1, 1, 4 }, { 1, 2, 3, 4 })):totable()
  local rms = math.sqrt((1 + 4) / 2 + 1e-6) -- c = (1, 2); normed: (1, 1) / rms
  local want = { 2 / rms, 1 / rms, 3 / rms, 1 / rms }
  for i = 1, 4 do lu.assertAlmostEquals(y[i], want[i], 1e-6) end
  l:close()
end

function test_swiglu_forward_by_hand()
  local l = core.nn_layer(nn.swiglu(2, 1), "layers.0.ffn", 1)
  local n, s = names_shapes(l)
  lu.assertEquals(n, { "layers.0.ffn.w1.weight", "layers.0.ffn.w2.weight", "layers.0.ffn.w3.weight" })
  lu.assertEquals(s, { { 1, 2 }, { 2, 1 }, { 1, 2 } })
  l:set_params { ["layers.0.ffn.w1.weight"] = { 1, 0 }, ["layers.0.ffn.w3.weight"] = { 0, 1 },
    ["layers.0.ffn.w2.weight"] = { 1, 2 } }
  local y = l:forward(nn.tensor({ 1, 2 }, { 1, 3 })):totable()
  local h = 1 / (1 + math.exp(-1)) * 3 -- silu(1) * 3
  lu.assertAlmostEquals(y[1], h, 1e-6)
  lu.assertAlmostEquals(y[2], 2 * h, 1e-6)
  l:close()
end

function test_mla_option_errors()
  lu.assertEquals(error_of(nn.mla, { dim = 8, qk_rope_head_dim = 3 }),
    "nn.mla: qk_rope_head_dim must be even and >= 2")
  lu.assertEquals(error_of(nn.mla, { dim = 8, n_head = 2 }), "nn.mla: unknown option 'n_head'")
  lu.assertEquals(error_of(nn.mla, { dim = 8.5 }), "nn.mla: 'dim' must be an integer, got 8.5")
  lu.assertEquals(error_of(nn.mla, { dim = 8, rope_theta = "1e4" }),
    "nn.mla: 'rope_theta' must be a number, got \"1e4\"")
  lu.assertEquals(error_of(nn.mla, { n_heads = 2 }), "nn.mla: 'dim' is required")
  lu.assertEquals(error_of(nn.mla, { dim = 8, rope_factor = 0 }),
    "nn.mla: rope_factor must be > 0 (YaRN applies: max_seq_len > original_seq_len)")
  -- no YaRN (max_seq_len <= original_seq_len): the factor is not used
  lu.assertEquals(nn.mla { dim = 8, rope_factor = 0, max_seq_len = 4096 }.kind, "mla")
  lu.assertEquals(error_of(nn.swiglu, 4, 0), "nn.swiglu: inter_dim (argument 2) must be a positive integer, got 0")
  lu.assertStrContains(error_of(core.nn_layer, { kind = "mla", dim = 8, v_head_dim = 0 }, "x", 1),
    "layer 'mla': v_head_dim must be >= 1")
end

function test_in_a_model()
  local m = nn.sequential {
    nn.embedding(11, 8), nn.rmsnorm(8, 1e-6),
    nn.residual(nn.mla { dim = 8, n_heads = 2, q_lora_rank = 4, kv_lora_rank = 4,
      qk_nope_head_dim = 2, qk_rope_head_dim = 2, v_head_dim = 2, max_seq_len = 32,
      original_seq_len = 8, rope_factor = 4 }),
    nn.residual(nn.swiglu(8, 16)), nn.linear(8, 11), loss = "cross_entropy",
  }
  local s = m:shapes({ 2, 5 })
  lu.assertEquals(s[3], { 2, 5, 8 })
  lu.assertEquals(s[5], { 2, 5, 11 })
  lu.assertEquals(error_of(nn.sequential { nn.mla { dim = 8 } }.shapes,
    nn.sequential { nn.mla { dim = 8 } }, { 2, 3, 6 }),
    "model layer 1 (mla) expects inputs [..., 8], got [2, 3, 6]")
  local model = m:build(1)
  local y = model:forward(nn.tensor({ 2, 5 }, { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }))
  lu.assertEquals(y:shape(), { 2, 5, 11 })
  for _, v in ipairs(y:totable()) do lu.assertTrue(v == v and math.abs(v) < 1e3) end
  model:close()
end

function test_mla_block()
  local attn = nn.mla { dim = 8, n_heads = 2, q_lora_rank = 4, kv_lora_rank = 4,
    qk_nope_head_dim = 2, qk_rope_head_dim = 2, v_head_dim = 2, max_seq_len = 32 }
  local m = nn.sequential {
    nn.embedding(11, 8),
    nn.mla_block { attn = attn, ffn = nn.swiglu(8, 16) },
    nn.mla_block { attn = attn, ffn = nn.moe { dim = 8, hidden = 4, experts = 4, topk = 2, shared = 1 } },
    nn.rmsnorm(8, 1e-6), nn.linear(8, 11, { bias = false }), loss = "cross_entropy",
  }
  lu.assertEquals(m:shapes({ 2, 5 })[5], { 2, 5, 11 })
  local dense = m:build_layer(2, 1)
  local n = names_shapes(dense)
  lu.assertEquals(n, { "layers.1.attn_norm.weight", "layers.1.attn.wq_a.weight",
    "layers.1.attn.q_norm.weight", "layers.1.attn.wq_b.weight", "layers.1.attn.wkv_a.weight",
    "layers.1.attn.kv_norm.weight", "layers.1.attn.wkv_b.weight", "layers.1.attn.wo.weight",
    "layers.1.ffn_norm.weight", "layers.1.ffn.w1.weight", "layers.1.ffn.w2.weight",
    "layers.1.ffn.w3.weight" })
  dense:close()
  local model = m:build(1)
  lu.assertEquals(model:moe_count(), 1)
  local y = model:forward(nn.tensor({ 2, 5 }, { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }))
  lu.assertEquals(y:shape(), { 2, 5, 11 })
  model:close()
  lu.assertEquals(error_of(nn.mla_block, { attn = attn, ffn = nn.swiglu(6, 16) }),
    "nn.mla_block: ffn dim (6) differs from attn dim (8)")
  lu.assertEquals(error_of(nn.mla_block, { attn = nn.swiglu(8, 16), ffn = nn.swiglu(8, 16) }),
    "nn.mla_block: 'attn' must be an nn.mla{...} spec, got a swiglu spec")
  lu.assertEquals(error_of(nn.mla_block, { attn = attn }),
    "nn.mla_block: 'ffn' must be a layer spec (nn.swiglu(...), nn.moe{...}), got nil")
  lu.assertEquals(error_of(nn.mla_block, { attn = attn, ffn = nn.swiglu(8, 16), norm = 1 }),
    "nn.mla_block: unknown option 'norm'")
end

os.exit(lu.LuaUnit.run())
