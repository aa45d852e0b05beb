-- Layers on a device from Lua: layer:to / layer:device, their errors in
-- the user's words, and (when a CUDA device is visible) a forward pass and
-- parameters read back from the GPU equal to the CPU's.
local lu = require("luaunit")
local nn = require("luapipe.nn")
local core = require("luapipe.core")

local function model()
  return nn.sequential {
    nn.embedding(11, 8), nn.transformer_block(8, 2, 16), nn.rmsnorm(8), nn.linear(8, 11),
    loss = "cross_entropy",
  }
end

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local error_of = dofile(here .. "errors.lua").error_of

function test_cpu_and_bad_names()
  local m = model():build(1)
  lu.assertEquals(m:device(), "cpu")
  lu.assertIs(m:to("cpu"), m)
  lu.assertEquals(error_of(m.to, m, "gpu"), "to: device 'gpu' is not cpu, cuda or cuda:N")
  lu.assertEquals(error_of(m.to, m, "cuda:x"), "to: device 'cuda:x' is not cpu, cuda or cuda:N")
end

function test_no_device_is_a_message()
  local k = core.kernels()
  if k.devices > 0 then lu.skip("a CUDA device is visible") end
  local m = model():build(1)
  local r, msg = m:to("cuda")
  lu.assertNil(r)
  if k.cuda then
    lu.assertEquals(msg, "cuda:0: no CUDA device is visible")
  else
    lu.assertStrContains(msg, "built without CUDA")
  end
  lu.assertEquals(m:device(), "cpu") -- nothing moved
end

function test_forward_on_cuda_matches_cpu()
  if core.kernels().devices == 0 then lu.skip("no CUDA device") end
  local a, b = model():build(3), model():build(3)
  lu.assertIs(b:to("cuda"), b)
  lu.assertEquals(b:device(), "cuda:0")
  local x = nn.tensor({ 2, 5 }, { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 })
  local ya, yb = a:forward(x):totable(), b:forward(x):totable()
  lu.assertEquals(#ya, #yb)
  for i = 1, #ya do lu.assertAlmostEquals(yb[i], ya[i], 1e-4 * (1 + math.abs(ya[i]))) end
  local pa, pb = a:params(), b:params()
  for i = 1, #pa do lu.assertEquals(pb[i].value, pa[i].value) end
end

os.exit(lu.LuaUnit.run())
