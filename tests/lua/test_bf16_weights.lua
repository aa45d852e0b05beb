-- bf16 layers read a rounded copy of each weight made once per change
-- (lp_tensor_keep_bf16): new values given from Lua (layer:set_params with
-- lists or Tensors, the route models.load and train's checkpoint import
-- take) are what the next forward uses, bitwise what a fresh layer given
-- the same values computes. The C side's routes (optimizer, ZeRO-1,
-- checkpoints, EPLB) are tests/c/test_bf16_cache.c's.
local lu = require("luaunit")
local nn = require("luapipe.nn")
local core = require("luapipe.core")

local function layer(seed)
  local l = core.nn_layer(nn.transformer_block(16, 2, 32, "gelu"), "blk", seed)
  l:set_precision("bf16")
  return l
end

local x = {}
for i = 1, 2 * 8 * 16 do x[i] = math.sin(i * 0.37) end
local function fwd(l) return l:forward(nn.tensor({ 2, 8, 16 }, x)):totable() end

-- a fresh layer (no bf16 copy made yet) with l's values
local function fresh_of(l)
  local f = layer(99)
  local set = {}
  for _, p in ipairs(l:params()) do set[p.name] = p.value end
  f:set_params(set)
  return fwd(f)
end

function test_set_params_reaches_the_next_forward()
  local l = layer(1)
  local y0 = fwd(l) -- makes the copies
  lu.assertEquals(y0, fresh_of(l))
  -- new values as lists
  local set = {}
  for _, p in ipairs(l:params()) do
    local v = {}
    for i, a in ipairs(p.value) do v[i] = a * 0.5 + 0.01 * math.cos(i) end
    set[p.name] = v
  end
  l:set_params(set)
  local y1 = fwd(l)
  lu.assertNotEquals(y1, y0)
  lu.assertEquals(y1, fresh_of(l))
  -- one weight as a Tensor (models.load's way)
  local p = l:params()[2]
  local v = {}
  for i, a in ipairs(p.value) do v[i] = -a end
  l:set_params { [p.name] = nn.tensor(p.shape, v) }
  local y2 = fwd(l)
  lu.assertNotEquals(y2, y1)
  lu.assertEquals(y2, fresh_of(l))
end

os.exit(lu.LuaUnit.run())
