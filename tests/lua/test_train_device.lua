-- luapipe.train{device = ...}: the choice of device and its errors in the
-- user's words. Without a visible CUDA device (CI): device = "cuda" stops
-- at the start with one message naming the reason; with one: the same
-- model trained on the GPU gives the CPU's losses within float32 rounding.
-- A bad device name is refused either way; an MoE model goes through the
-- same device check as a dense one (no MoE refusal).
-- (The executor's device path itself is tested on a fake device backend:
-- tests/c/test_exec_device.c.)
local lu = require("luaunit")
local nn = require("luapipe.nn")
local core = require("luapipe.core")
local train = require("luapipe.train")

local function mlp()
  return nn.sequential { nn.linear(4, 8), nn.gelu(), nn.linear(8, 2), loss = "mse" }
end

local function data(step, mb)
  local x, y = {}, {}
  for i = 1, 12 do x[i] = math.sin(0.3 * step + 1.1 * mb + 0.7 * i) end
  for i = 1, 6 do y[i] = math.cos(0.5 * step + 0.9 * mb + 0.4 * i) end
  return nn.tensor({ 3, 4 }, x), nn.tensor({ 3, 2 }, y)
end

local function run(model, device, steps)
  return train { model = model, schedule = "gpipe", microbatches = 2, data = data, steps = steps or 2,
    seed = 3, optimizer = { kind = "sgd", lr = 0.05 }, quiet = true, device = device }
end

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local error_of = dofile(here .. "errors.lua").text_of

function test_cpu_is_the_default()
  local a, b = run(mlp(), nil), run(mlp(), "cpu")
  lu.assertEquals(a.device, "cpu")
  lu.assertEquals(b.device, "cpu")
  lu.assertEquals(a.losses, b.losses)
end

function test_no_cuda_device()
  local k = core.kernels()
  if k.devices > 0 then lu.skip("a CUDA device is visible") end
  local msg = error_of(run, mlp(), "cuda")
  if k.cuda then
    lu.assertStrMatches(msg,
      "luapipe%.train: device 'cuda' requested but no CUDA device is visible %(cudaGetDeviceCount: .+%)")
  else
    lu.assertEquals(msg, "luapipe.train: device 'cuda' requested but luapipe was built without CUDA (no nvcc)")
  end
  lu.assertStrContains(error_of(run, mlp(), "cuda:1"), "luapipe.train: device 'cuda:1' requested but ")
  lu.assertEquals(core.exec_device("cpu"), "cpu")
  local name, err = core.exec_device("cuda")
  lu.assertNil(name)
  lu.assertStrContains(err, "device 'cuda' requested but ")
end

function test_on_the_gpu_as_on_the_cpu()
  if core.kernels().devices == 0 then lu.skip("no CUDA device") end
  local c, g = run(mlp(), "cpu", 5), run(mlp(), "cuda", 5)
  lu.assertStrMatches(g.device, "cuda:%d+")
  for k = 1, 5 do lu.assertAlmostEquals(g.losses[k], c.losses[k], 1e-5 * math.abs(c.losses[k])) end
end

function test_bad_device_names()
  lu.assertEquals(error_of(run, mlp(), "gpu"), "luapipe.train: device 'gpu' is not cpu, cuda or cuda:N")
  lu.assertEquals(error_of(run, mlp(), "cuda:x"), "luapipe.train: device 'cuda:x' is not cpu, cuda or cuda:N")
  lu.assertStrContains(error_of(run, mlp(), 1),
    "luapipe.train: 'device' must be \"cpu\", \"cuda\" or \"cuda:N\", got 1")
end

local function moe_model()
  return nn.sequential { nn.linear(4, 8), nn.moe { dim = 8, hidden = 4, experts = 2, topk = 1 },
    nn.linear(8, 2), loss = "mse" }
end

function test_moe_on_a_device()
  if core.kernels().devices == 0 then
    -- no MoE refusal any more: the only reason given is the missing device
    lu.assertStrContains(error_of(run, moe_model(), "cuda"), "luapipe.train: device 'cuda' requested but ")
    lu.assertEquals(run(moe_model(), "cpu", 1).device, "cpu")
    return
  end
  local c, g = run(moe_model(), "cpu", 5), run(moe_model(), "cuda", 5)
  lu.assertStrMatches(g.device, "cuda:%d+")
  for k = 1, 5 do lu.assertAlmostEquals(g.losses[k], c.losses[k], 1e-5 * math.abs(c.losses[k])) end
end

os.exit(lu.LuaUnit.run())
