-- luapipe.train checkpoints on one process: checkpoint every step, resume,
-- and the resumed steps give bitwise the losses and parameters of the run
-- that never stopped (SGD with momentum and AdamW); only the newest
-- checkpoint is kept; misuse of the options and resume without a
-- checkpoint are clear errors.
local lu = require("luaunit")
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local core = require("luapipe.core")

local function error_of(f, ...)
  local ok, err = pcall(f, ...)
  lu.assertFalse(ok, "expected an error")
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

local model = nn.sequential {
  nn.linear(4, 8), nn.gelu(), nn.mlp_block(8, 16), nn.rmsnorm(8), nn.linear(8, 2), loss = "mse",
}

local function data(step, mb)
  local x, y = {}, {}
  for i = 1, 12 do x[i] = math.sin(step * 0.9 + mb * 1.7 + i * 0.31) end
  for i = 1, 6 do y[i] = math.cos(step * 0.4 + mb * 0.6 + i) end
  return nn.tensor({ 3, 4 }, x), nn.tensor({ 3, 2 }, y)
end

local tmp = os.tmpname()
os.remove(tmp)
tmp = tmp .. ".ckpt.d"
assert(core.mkdir_p(tmp))

local function opts(extra)
  local o = { model = model, schedule = "1f1b", microbatches = 3, data = data, seed = 5,
    quiet = true }
  for k, v in pairs(extra) do o[k] = v end
  return o
end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

local function check_resume(optimizer, dir)
  local full = train(opts { steps = 4, optimizer = optimizer })
  local part = train(opts { steps = 2, optimizer = optimizer, checkpoint = { dir = dir, every = 1 } })
  lu.assertEquals(part.losses[2], full.losses[2])
  lu.assertTrue(exists(dir .. "/step2/rank0.ckpt"))
  lu.assertFalse(exists(dir .. "/step1/rank0.ckpt")) -- replaced by step 2
  local r = train(opts { steps = 4, optimizer = optimizer, resume = true,
    checkpoint = { dir = dir, every = 1 } })
  lu.assertEquals(r.first_step, 3)
  lu.assertNil(r.losses[1])
  lu.assertNil(r.losses[2])
  lu.assertTrue(r.losses[3] == full.losses[3]) -- bitwise
  lu.assertTrue(r.losses[4] == full.losses[4])
  lu.assertEquals(r.params(), full.params())
  -- a run that does not resume differs (the test is not vacuous)
  local fresh = train(opts { steps = 2, optimizer = optimizer })
  lu.assertFalse(fresh.losses[2] == full.losses[4])
  local f = assert(io.open(dir .. "/latest"))
  lu.assertStrContains(f:read("a"), '"step": 4')
  f:close()
end

function test_resume_adamw()
  check_resume({ kind = "adamw", lr = 0.01, weight_decay = 0.01 }, tmp .. "/adamw")
end

function test_resume_sgd_momentum()
  check_resume({ kind = "sgd", lr = 0.05, momentum = 0.9 }, tmp .. "/sgd")
end

function test_option_errors()
  lu.assertStrContains(error_of(train, opts { checkpoint = "ckpt" }),
    "'checkpoint' must be {dir = \"path\", every = N}")
  lu.assertStrContains(error_of(train, opts { checkpoint = { dir = tmp, every = 0 } }),
    "checkpoint.every must be a positive integer")
  lu.assertStrContains(error_of(train, opts { resume = true }),
    "resume = true needs checkpoint = {dir = \"path\"}")
  lu.assertStrContains(error_of(train, opts { resume = 3, checkpoint = { dir = tmp } }),
    "'resume' must be true or a checkpoint directory")
  lu.assertStrContains(error_of(train, opts { steps = 2, resume = true, checkpoint = { dir = tmp .. "/none" } }),
    "resume = true, but there is no checkpoint in '" .. tmp .. "/none' (" .. tmp
    .. "/none/latest does not exist)")
end

function test_other_optimizer()
  local dir = tmp .. "/opt"
  train(opts { steps = 1, optimizer = { kind = "sgd", lr = 0.1 }, checkpoint = { dir = dir } })
  lu.assertStrContains(error_of(train, opts { steps = 2, optimizer = { kind = "adamw", lr = 0.1 },
      resume = dir }),
    "does not match this run: optimizer sgd in the checkpoint, adamw in this run")
end

local rc = lu.LuaUnit.run()
os.execute("rm -rf '" .. tmp .. "'")
os.exit(rc)
