-- luapipe.lr (learning-rate schedules) and gradient clipping in the
-- one-process reference: rates checked by hand, the schedule's mistakes
-- named, a clip above every norm changes nothing, one below rescales.
local lu = require("luaunit")
local lr = require("luapipe.lr")
local nn = require("luapipe.nn")
local train = require("luapipe.train")

TestLr = {}

function TestLr:test_warmup_then_cosine()
  local f = lr.at({ warmup = 4, decay = "cosine", steps = 12, min_lr = 0.1 }, 1.0, 100)
  lu.assertAlmostEquals(f(1), 0.25, 1e-15)
  lu.assertAlmostEquals(f(4), 1.0, 1e-15)
  lu.assertAlmostEquals(f(8), 0.1 + 0.9 * 0.5, 1e-15) -- halfway: cos(pi/2) = 0
  lu.assertAlmostEquals(f(12), 0.1, 1e-15)
  lu.assertAlmostEquals(f(50), 0.1, 1e-15) -- past the end: the floor
end

function TestLr:test_linear_constant_and_run_steps()
  local lin = lr.at({ decay = "linear" }, 2.0, 11) -- steps: the run's 11
  lu.assertAlmostEquals(lin(1), 2.0 - 2.0 * 1 / 11, 1e-15)
  lu.assertAlmostEquals(lin(11), 0, 1e-15)
  local c = lr.at({ warmup = 2, decay = "constant" }, 0.5, 10)
  lu.assertEquals({ c(1), c(2), c(3), c(10) }, { 0.25, 0.5, 0.5, 0.5 })
end

function TestLr:test_mistakes_are_named()
  lu.assertEquals(lr.check({ decay = "step" }), 'lr_schedule.decay must be "cosine", "linear" or '
    .. '"constant", got "step"')
  lu.assertEquals(lr.check({ warmup = -1 }), "lr_schedule.warmup must be an integer >= 0, got -1")
  lu.assertEquals(lr.check({ warm = 1 }), 'lr_schedule: unknown field "warm" (it takes warmup, '
    .. 'decay, steps, min_lr)')
  lu.assertEquals(lr.check(5), "lr_schedule must be a table {warmup =, decay =, steps =, min_lr =} "
    .. "or a function(step) -> rate, got 5")
  local f = lr.at(function(k) return k == 2 and math.huge or 0.1 end, 1, 3)
  lu.assertEquals(f(1), 0.1)
  lu.assertErrorMsgEquals("lr_schedule(2) returned inf: a learning rate is a finite number >= 0", f,
    2)
end

local function run(clip, schedule)
  local model = nn.sequential { nn.linear(4, 8), nn.gelu(), nn.linear(8, 2), loss = "mse" }
  local function data(step, mb)
    local x, y = {}, {}
    for i = 1, 8 do x[i] = math.sin(step * 3 + mb * 5 + i) * 4 end
    for i = 1, 4 do y[i] = math.cos(step + mb + i) * 3 end
    return nn.tensor({ 2, 4 }, x), nn.tensor({ 2, 2 }, y)
  end
  return train.reference { model = model, data = data, steps = 3, microbatches = 2, seed = 3,
    optimizer = { kind = "sgd", lr = 0.05 }, clip = clip, lr_schedule = schedule }
end

function TestLr:test_reference_clipping()
  local plain, loose, tight = run(nil), run(1e9), run(0.01)
  lu.assertEquals(#plain.grad_norms, 0)
  lu.assertEquals(loose.losses, plain.losses) -- a clip above every norm: bitwise the same
  lu.assertEquals(#loose.grad_norms, 3)
  lu.assertTrue(loose.grad_norms[1] > 0.01)
  lu.assertEquals(tight.losses[1], plain.losses[1]) -- the first loss comes before any update
  lu.assertNotEquals(tight.losses[2], plain.losses[2])
  lu.assertAlmostEquals(tight.grad_norms[1], loose.grad_norms[1], 1e-12)
  local sched = run(nil, { warmup = 2, decay = "constant" })
  lu.assertEquals(sched.lrs, { 0.025, 0.05, 0.05 })
  lu.assertNotEquals(sched.losses[2], plain.losses[2])
  lu.assertErrorMsgContains("'clip' must be a positive number (the largest gradient norm), got 0",
    run, 0)
end

os.exit(lu.LuaUnit.run())
