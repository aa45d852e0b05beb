-- luapipe.train checkpoints on one process: checkpoint every step, resume,
-- and the resumed steps give bitwise the losses and parameters of the run
-- that never stopped (SGD with momentum and AdamW); only the newest
-- checkpoint is kept; misuse of the options and resume without a
-- checkpoint are clear errors.
local lu = require("luaunit")
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local core = require("luapipe.core")

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local error_of = dofile(here .. "errors.lua").error_of

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
    "'resume' must be true, \"auto\" or a checkpoint directory")
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

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

-- A damaged or truncated marker is an error naming the file and the
-- fault; it is never read as another step.
function test_damaged_marker()
  local dir = tmp .. "/damaged"
  local o = { kind = "sgd", lr = 0.05 }
  train(opts { steps = 2, optimizer = o, checkpoint = { dir = dir, every = 2 } })
  local marker = dir .. "/latest"
  local f = assert(io.open(marker))
  local good = f:read("a")
  f:close()
  lu.assertStrContains(good, '"step": 2, "dir": "step2"')
  local cases = {
    { good:sub(1, 9), "it is not complete JSON" },  -- '{"step": ' cut before the number
    { good:sub(1, 10), "it is not complete JSON" }, -- '{"step": 2' : not read as step 2
    { "", "it is empty" },
    { "[2]", "\"step\" is missing" },
    { '{"step": "2"}', '"step" is "2", not a step number' },
    { '{"step": -1}', '"step" is -1, not a step number' },
    { '{"step": 2.5}', '"step" is 2.5, not a step number' },
    { '{"step": 2, "dir": "step3"}', '"dir" is "step3", but "step" is 2 (expected "step2")' },
    { '{"step": 2, "dir": "step2", "ranks": 0}', '"ranks" is 0, not a rank count' },
    { "\0\1garbage", "it is not complete JSON" },
  }
  for _, c in ipairs(cases) do
    write(marker, c[1])
    local err = error_of(train, opts { steps = 3, optimizer = o, resume = true,
      checkpoint = { dir = dir, every = 2 } })
    lu.assertStrContains(err, "checkpoint marker " .. marker .. " is damaged: " .. c[2])
  end
  -- a directory where the marker should be: named as unreadable, not "empty"
  os.remove(marker)
  assert(core.mkdir_p(marker))
  lu.assertStrContains(error_of(train, opts { steps = 3, optimizer = o, resume = true,
    checkpoint = { dir = dir, every = 2 } }), "checkpoint marker " .. marker
    .. " is damaged: it cannot be read (Is a directory)")
  assert(os.remove(marker))
  write(marker, good)
  local r = train(opts { steps = 3, optimizer = o, resume = true, checkpoint = { dir = dir, every = 2 } })
  lu.assertEquals(r.first_step, 3)
end

-- What a killed save leaves (pending, its step's files, *.tmp) is removed
-- at the next resume, and at the next save of a job that does not resume.
function test_stale_temporaries()
  local o = { kind = "sgd", lr = 0.05 }
  for _, resume in ipairs({ true, false }) do
    local dir = tmp .. "/stale" .. tostring(resume)
    train(opts { steps = 2, optimizer = o, checkpoint = { dir = dir, every = 2 } })
    -- a save of step 3 killed after rank 0 wrote its file, one killed mid-write
    assert(core.mkdir_p(dir .. "/step3"))
    write(dir .. "/pending", '{"step": 3, "ranks": 2}\n')
    write(dir .. "/step3/rank0.ckpt", "x")
    write(dir .. "/step3/rank1.ckpt.tmp", "x")
    write(dir .. "/step2/rank0.ckpt.tmp", "x")
    write(dir .. "/latest.tmp", '{"st')
    local r = train(opts { steps = 4, optimizer = o, resume = resume or nil,
      checkpoint = { dir = dir, every = 2 } })
    lu.assertEquals(r.first_step, resume and 3 or 1)
    for _, left in ipairs({ "/pending", "/latest.tmp", "/step3/rank0.ckpt", "/step3/rank1.ckpt.tmp",
        "/step3", "/step2/rank0.ckpt.tmp", "/step2/rank0.ckpt" }) do
      lu.assertFalse(exists(dir .. left), dir .. left .. " was left behind")
    end
    lu.assertTrue(exists(dir .. "/step4/rank0.ckpt"))
    local f = assert(io.open(dir .. "/latest"))
    lu.assertStrContains(f:read("a"), '"step": 4, "dir": "step4"')
    f:close()
  end
end

local rc = lu.LuaUnit.run()
os.execute("rm -rf '" .. tmp .. "'")
os.exit(rc)
