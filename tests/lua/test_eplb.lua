-- luapipe.eplb from Lua: the README vector through the binding, compact
-- maps, errors, predictors, and the Balancer (triggers, threshold skip,
-- failing policies reported once and replaced by the default).
local lu = require("luaunit")
local eplb = require("luapipe.eplb")

local VECTOR = {
  { 90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86 },
  { 20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27 },
}

local function vector_plan(extra)
  local opts = { load = VECTOR, replicas = 16, groups = 4, nodes = 2, gpus = 8 }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return eplb.rebalance(opts)
end

-- Seeded skewed counts, layers x experts.
local function counts(seed, layers, experts, scale)
  local state = seed
  local function rnd()
    state = (state * 1103515245 + 12345) % 2147483648
    return state / 2147483648
  end
  local m = {}
  for l = 1, layers do
    m[l] = {}
    for e = 1, experts do m[l][e] = math.floor((scale or 100) * math.exp(2 * rnd())) end
  end
  return m
end

TestRebalance = {}

function TestRebalance.test_readme_vector()
  local r = assert(vector_plan{ mode = "reference" })
  lu.assertEquals(r.physical_to_logical, {
    { 5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1 },
    { 7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1 },
  })
  lu.assertEquals(r.logical_to_physical[1], {
    { 12, -1 }, { 15, 13 }, { 11, -1 }, { 6, -1 }, { 7, 5 }, { 0, 2 },
    { 1, -1 }, { 3, -1 }, { 4, -1 }, { 9, -1 }, { 8, 10 }, { 14, -1 },
  })
  lu.assertEquals(r.logical_count[1], { 1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1 })
  lu.assertEquals(r.policy, "hierarchical")
  lu.assertEquals(r.mode, "reference")
  lu.assertEquals(r.width, 2)
  lu.assertEquals(#r.gpu_load, 2)
  lu.assertEquals(#r.gpu_load[1], 8)
  lu.assertAlmostEquals(r.stats.per_layer[1].max_load, 156, 1e-9)
  lu.assertAlmostEquals(r.stats.balancedness,
    (r.stats.per_layer[1].balancedness + r.stats.per_layer[2].balancedness) / 2, 1e-12)
  lu.assertNil(r.stats.copies)
end

function TestRebalance.test_balanced_is_default_and_never_worse()
  local ref = assert(vector_plan{ mode = "reference" })
  local bal = assert(vector_plan())
  lu.assertEquals(bal.mode, "balanced")
  for l = 1, 2 do
    lu.assertTrue(bal.stats.per_layer[l].max_load <= ref.stats.per_layer[l].max_load)
  end
  local spill = assert(vector_plan{ spill = true })
  lu.assertTrue(spill.stats.balancedness >= bal.stats.balancedness)
end

function TestRebalance.test_compact_maps()
  local r = assert(vector_plan{ mode = "reference", compact = true })
  lu.assertEquals(type(r.physical_to_logical), "string")
  lu.assertEquals(#r.physical_to_logical, 2 * 16 * 4)
  local first = { string.unpack("i4i4i4i4", r.physical_to_logical) }
  lu.assertEquals({ first[1], first[2], first[3], first[4] }, { 5, 6, 5, 7 })
  lu.assertEquals(#r.logical_to_physical, 2 * 12 * 2 * 4)
  lu.assertEquals(string.unpack("i4", r.logical_to_physical, 4 * 2 + 1), 15)
  -- a compact result works as previous, a compact map can be evaluated
  local again = assert(vector_plan{ mode = "reference", previous = r })
  lu.assertEquals(again.stats.copies, 0)
  local e = assert(eplb.evaluate{ load = VECTOR, physical_to_logical = r.physical_to_logical,
    gpus = 8, nodes = 2 })
  lu.assertAlmostEquals(e.stats.balancedness, r.stats.balancedness, 1e-12)
end

function TestRebalance.test_previous_and_budget()
  local old = assert(eplb.rebalance{ load = counts(1, 3, 32), replicas = 48, groups = 4,
    nodes = 2, gpus = 8 })
  local new_load = counts(2, 3, 32)
  local free = assert(eplb.rebalance{ load = new_load, replicas = 48, groups = 4, nodes = 2,
    gpus = 8, previous = old })
  lu.assertTrue(free.stats.copies > 0)
  local stay = assert(eplb.rebalance{ load = new_load, replicas = 48, groups = 4, nodes = 2,
    gpus = 8, previous = old.physical_to_logical, max_moves = 0 })
  lu.assertEquals(stay.physical_to_logical, old.physical_to_logical)
  lu.assertEquals(stay.stats.copies, 0)
  local some = assert(eplb.rebalance{ load = new_load, replicas = 48, groups = 4, nodes = 2,
    gpus = 8, previous = old, max_moves = 3 })
  for l, s in ipairs(some.stats.per_layer) do
    lu.assertTrue(s.copies <= 3)
    local sum = 0
    for _, c in ipairs(some.gpu_copies[l]) do sum = sum + c end
    lu.assertEquals(sum, s.copies)
  end
  lu.assertNil(old.gpu_copies)
  lu.assertTrue(some.stats.balancedness >= stay.stats.balancedness)
  lu.assertTrue(free.stats.balancedness >= some.stats.balancedness - 1e-12)
end

function TestRebalance.test_evaluate()
  local r = assert(vector_plan{ mode = "reference" })
  local e = assert(eplb.evaluate{ load = VECTOR, physical_to_logical = r, gpus = 8, nodes = 2 })
  lu.assertAlmostEquals(e.stats.balancedness, r.stats.balancedness, 1e-12)
  lu.assertEquals(e.logical_count, r.logical_count)
end

function TestRebalance.test_bad_data_returns_nil_and_message()
  local cases = {
    { { load = { { 1, 2 }, { 3 } }, replicas = 4, gpus = 2 },
      "load: layer 1 has 1 entries, layer 0 has 2 (ragged rows)" },
    { { load = { { 1, -2 } }, replicas = 4, gpus = 2 },
      "layer 0, expert 1: load is negative (-2)" },
    { { load = { { 1, 0 / 0 } }, replicas = 4, gpus = 2 }, "layer 0, expert 1: load is NaN" },
    { { load = { { 1, "x" } }, replicas = 4, gpus = 2 },
      "load: layer 0, expert 1 is a string, not a number" },
    { { load = VECTOR, replicas = 15, gpus = 8 }, "replicas (15) must be a multiple of gpus (8)" },
    { { load = VECTOR, replicas = 16, groups = 4, nodes = 3, gpus = 8 },
      "gpus (8) must be a multiple of nodes (3)" },
    { { load = VECTOR, replicas = 16, groups = 8, nodes = 2, gpus = 8 },
      "experts (12) must be a multiple of groups (8)" },
    { { load = VECTOR, replicas = 8, gpus = 8 },
      "replicas (8) must be at least the number of experts (12)" },
    { { load = VECTOR, replicas = 16, gpus = 8, mode = "reference", spill = true },
      "spill needs mode balanced" },
    { { load = VECTOR, replicas = 16, gpus = 8, previous = { { 0 } } },
      "previous has 1 layer, expected 2" },
    { { load = {}, replicas = 16, gpus = 8 }, "load has no layers" },
  }
  for _, c in ipairs(cases) do
    local r, err = eplb.rebalance(c[1])
    lu.assertNil(r)
    lu.assertStrContains(err, c[2])
  end
end

function TestRebalance.test_misuse_raises()
  lu.assertErrorMsgContains("expected a table of options", eplb.rebalance, 3)
  lu.assertErrorMsgContains("option 'load' is required", eplb.rebalance, { replicas = 4, gpus = 2 })
  lu.assertErrorMsgContains("unknown option 'replica'", eplb.rebalance,
    { load = VECTOR, replica = 4 })
  lu.assertErrorMsgContains("unknown mode 'fast'", eplb.rebalance,
    { load = VECTOR, replicas = 16, gpus = 8, mode = "fast" })
  lu.assertErrorMsgContains("option 'replicas' must be an integer", eplb.rebalance,
    { load = VECTOR, replicas = "x", gpus = 8 })
  lu.assertErrorMsgContains("option 'gpus' is required", eplb.rebalance,
    { load = VECTOR, replicas = 16 })
  -- a count out of range: named, raised at the caller (no position inside luapipe)
  local ok, err = pcall(function()
    local r = eplb.rebalance { load = VECTOR, replicas = 16, gpus = 8, groups = 99999999999 }
    return r
  end)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "test_eplb.lua:")
  lu.assertStrContains(err, "eplb: option 'groups' must be from 1 to 2147483647 (got 99999999999)")
  lu.assertNotStrContains(err, "luapipe/eplb.lua:")
end

TestPredictors = {}

local H = {
  { step = 1, counts = { { 1, 2 }, { 10, 0 } } },
  { step = 2, counts = { { 3, 4 }, { 20, 0 } } },
  { step = 3, counts = { { 5, 6 }, { 30, 6 } } },
}

function TestPredictors.test_last()
  lu.assertEquals(eplb.predictors.last()(H), { { 5, 6 }, { 30, 6 } })
end

function TestPredictors.test_sliding_window_sums()
  lu.assertEquals(eplb.predictors.sliding_window(2)(H), { { 8, 10 }, { 50, 6 } })
  lu.assertEquals(eplb.predictors.sliding_window(10)(H), { { 9, 12 }, { 60, 6 } })
end

function TestPredictors.test_moving_average()
  lu.assertEquals(eplb.predictors.moving_average(2)(H), { { 4, 5 }, { 25, 3 } })
end

function TestPredictors.test_ema()
  local p = eplb.predictors.ema(0.5)(H)
  -- ((1 -> 0.5*3 + 0.5*1 = 2) -> 0.5*5 + 0.5*2 = 3.5)
  lu.assertAlmostEquals(p[1][1], 3.5, 1e-12)
  lu.assertAlmostEquals(p[2][1], 0.5 * 30 + 0.5 * (0.5 * 20 + 0.5 * 10), 1e-12)
  lu.assertEquals(eplb.predictors.ema(1)(H), { { 5, 6 }, { 30, 6 } })
end

function TestPredictors.test_bad_arguments()
  lu.assertErrorMsgContains("window must be a positive integer", eplb.predictors.sliding_window, 0)
  lu.assertErrorMsgContains("alpha must be in (0, 1]", eplb.predictors.ema, 1.5)
end

TestBalancer = {}

local function new_balancer(extra)
  local opts = { replicas = 48, groups = 4, nodes = 2, gpus = 8, every = 10, window = 4,
    on_warning = function() end }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return eplb.balancer(opts)
end

function TestBalancer.test_every_n_steps()
  local b = new_balancer()
  local planned = {}
  for step = 1, 35 do
    local plan = b:step(step, counts(step, 2, 32))
    if plan then planned[#planned + 1] = step end
  end
  lu.assertEquals(planned, { 1, 11, 21, 31 })
  lu.assertEquals(b.plans, 4)
  lu.assertNotNil(b.current.stats.copies) -- re-plans count copies
  lu.assertEquals(#b.history, 4)           -- only the window is kept
end

function TestBalancer.test_export_import_continues_identically()
  -- a balancer stopped after step 19 and rebuilt from its JSON export plans
  -- steps 20..35 exactly as the one that never stopped (its window holds
  -- steps 18 and 19 at the plan of step 21; max_moves: the
  -- plan in force matters too)
  local json = require("luapipe.json")
  local a, b = new_balancer{ max_moves = 6 }, nil
  local pa, pb = {}, {}
  for step = 1, 35 do
    local c = counts(step * 7, 2, 32)
    if step == 20 then
      b = new_balancer{ max_moves = 6 }
      b:import(json.decode(json.encode(a:export())))
    end
    local plan = a:step(step, c)
    if plan then pa[#pa + 1] = { step, plan.physical_to_logical } end
    if b then
      plan = b:step(step, c)
      if plan then pb[#pb + 1] = { step, plan.physical_to_logical } end
    end
  end
  lu.assertEquals(#pa, 4)
  lu.assertEquals(pb, { pa[3], pa[4] })
  lu.assertEquals(b.plans, a.plans)
  lu.assertErrorMsgContains("history entry 1 is malformed", b.import, b,
    { history = { { step = "x" } } })
end

function TestBalancer.test_threshold_skips_a_balanced_placement()
  local b = new_balancer{ threshold = 0.5 }
  local same = counts(7, 2, 32)
  lu.assertNotNil(b:step(1, same))
  local plan, why = b:step(11, same)
  lu.assertNil(plan)
  lu.assertStrContains(why, "balancedness")
  lu.assertStrContains(why, ">= threshold 0.5000")
  lu.assertEquals(b.plans, 1)
  -- a hopeless threshold re-plans when due
  local c = new_balancer{ threshold = 1.01 }
  c:step(1, same)
  lu.assertNotNil(c:step(11, same))
  lu.assertEquals(c.plans, 2)
end

function TestBalancer.test_predictor_uses_the_window()
  local seen
  local b = new_balancer{ predictor = function(history)
    seen = #history
    return history[#history].counts
  end }
  for step = 1, 6 do b:record(step, counts(step, 2, 32)) end
  assert(b:plan())
  lu.assertEquals(seen, 4)
  lu.assertEquals(#b.warnings, 0)
end

function TestBalancer.test_failing_predictor_reported_once()
  local calls, warned = 0, {}
  local b = new_balancer{
    predictor = function() calls = calls + 1; error("boom") end,
    on_warning = function(msg) warned[#warned + 1] = msg end,
  }
  for step = 1, 25 do b:step(step, counts(step, 2, 32)) end
  lu.assertEquals(calls, 1)
  lu.assertEquals(#warned, 1)
  lu.assertStrContains(warned[1], "predictor failed")
  lu.assertStrContains(warned[1], "boom")
  lu.assertStrContains(warned[1], "built-in default")
  lu.assertEquals(b.plans, 3)
  -- the default (sliding window sum) was used
  local want = eplb.predictors.sliding_window(4)(b.history)
  lu.assertEquals(b:predict(), want)
end

function TestBalancer.test_predictor_returning_a_bad_table()
  local warned = {}
  local b = new_balancer{
    predictor = function() return { { 1, 2, 3 } } end,
    on_warning = function(msg) warned[#warned + 1] = msg end,
  }
  lu.assertNotNil(b:step(1, counts(1, 2, 32)))
  lu.assertNotNil(b:step(11, counts(2, 2, 32)))
  lu.assertEquals(#warned, 1)
  lu.assertStrContains(warned[1], "predictor failed (returned a table: 1 layer, expected 2)")
end

-- A predictor returning no table is told what it returned
function TestBalancer.test_predictor_returning_no_table()
  for _, case in ipairs { { nil, "returned nil, not a table of loads (layers x experts)" },
      { 42, "returned 42 (a number), not a table of loads" },
      { "x", 'returned "x" (a string), not a table of loads' },
      { true, "returned true (a boolean), not a table of loads" } } do
    local warned = {}
    local b = new_balancer{
      predictor = function() return case[1] end,
      on_warning = function(msg) warned[#warned + 1] = msg end,
    }
    lu.assertNotNil(b:step(1, counts(1, 2, 32)))
    lu.assertEquals(#warned, 1)
    lu.assertStrContains(warned[1], "predictor failed (" .. case[2])
    lu.assertNotStrContains(warned[1], "table: 0x")
  end
end

-- history as documented: recorded windows, oldest first, {step=, counts=}
function TestBalancer.test_predictor_history_argument()
  local seen
  local b = new_balancer{ predictor = function(h) seen = h; return h[#h].counts end }
  b:record(3, counts(1, 2, 32))
  b:record(5, counts(2, 2, 32))
  assert(b:predict())
  lu.assertEquals(#seen, 2)
  lu.assertEquals(seen[1].step, 3)
  lu.assertEquals(seen[2].step, 5)
  lu.assertEquals(seen[2].counts, counts(2, 2, 32))
end

function TestBalancer.test_failing_trigger_falls_back_to_every_n()
  local warned = {}
  local b = new_balancer{
    trigger = function(_, step) return step % 2 == 0 and "yes" or error("no trigger") end,
    on_warning = function(msg) warned[#warned + 1] = msg end,
  }
  local planned = {}
  for step = 1, 12 do
    if b:step(step, counts(step, 2, 32)) then planned[#planned + 1] = step end
  end
  lu.assertEquals(#warned, 1)
  lu.assertStrContains(warned[1], "trigger failed")
  lu.assertEquals(planned, { 1, 11 })
end

function TestBalancer.test_custom_trigger()
  local b = new_balancer{ trigger = function(_, step) return step % 3 == 0 end }
  local planned = {}
  for step = 1, 9 do
    if b:step(step, counts(step, 2, 32)) then planned[#planned + 1] = step end
  end
  lu.assertEquals(planned, { 3, 6, 9 })
end

function TestBalancer.test_misuse()
  lu.assertErrorMsgContains("option 'replicas' must be an integer", eplb.balancer, { gpus = 8 })
  lu.assertErrorMsgContains("unknown option 'evrey'", eplb.balancer,
    { replicas = 16, gpus = 8, evrey = 3 })
  local b = new_balancer()
  b:record(5, counts(1, 2, 32))
  lu.assertErrorMsgContains("step 5 after step 5", b.record, b, 5, counts(1, 2, 32))
  lu.assertErrorMsgContains("layer 0 has 3 experts, expected 32", b.record, b, 6,
    { { 1, 2, 3 }, { 1, 2, 3 } })
  lu.assertErrorMsgContains("layer 1, expert 0 is -1", b.record, b, 6,
    { counts(1, 1, 32)[1], (function() local r = counts(1, 1, 32)[1]; r[1] = -1; return r end)() })
  local empty = new_balancer()
  local plan, err = empty:plan()
  lu.assertNil(plan)
  lu.assertEquals(err, "no load recorded yet")
end

function TestBalancer.test_bad_configuration_is_a_failure_not_a_crash()
  local b = new_balancer{ replicas = 20 } -- not a multiple of 8 GPUs
  local plan, err = b:step(1, counts(1, 2, 32))
  lu.assertNil(plan)
  lu.assertStrContains(err, "replicas (20) must be a multiple of gpus (8)")
end

TestLimits = {}

-- Over a size limit: nil and one line naming the limit and the size asked
-- for, from rebalance, evaluate and check alike, before anything is built.
function TestLimits.test_over_the_limits()
  lu.assertEquals(eplb.limits, { replicas = 1048576, slots = 4194304, relabel_gpus = 4096 })
  local load = {}
  for l = 1, 5 do load[l] = { 1, 2, 3, 4 } end
  local plan, err = eplb.rebalance{ load = load, replicas = 1 << 20, gpus = 4 }
  lu.assertNil(plan)
  lu.assertEquals(err, "5 layers x 1048576 replicas = 5242880 slots: more than the limit of "
    .. "4194304 slots in all (layers x replicas)")
  plan, err = eplb.rebalance{ load = { { 1, 2, 3, 4 } }, replicas = (1 << 20) + 4, gpus = 4 }
  lu.assertNil(plan)
  lu.assertEquals(err, "replicas 1048580: more than the limit of 1048576 slots per layer")
  local prev = {}
  for s = 1, 8192 do prev[s] = (s - 1) % 4 end
  plan, err = eplb.rebalance{ load = { { 1, 2, 3, 4 } }, replicas = 8192, gpus = 8192,
    previous = { prev } }
  lu.assertNil(plan)
  lu.assertEquals(err, "gpus 8192: more than the limit of 4096 GPUs for re-planning against "
    .. "a previous plan")
  local ok
  ok, err = eplb.check(4, 1 << 20, 1, 1, 4, 5)
  lu.assertNil(ok)
  lu.assertStrContains(err, "5242880 slots: more than the limit of 4194304")
  lu.assertTrue(eplb.check(4, 1 << 20, 1, 1, 4, 4))
  lu.assertTrue(eplb.check(4, 1 << 20, 1, 1, 4)) -- layers defaults to 1
end

-- Balanced mode reports its swap refinement; reference mode has none.
function TestLimits.test_refinement_counted()
  local load = { {} }
  for e = 1, 64 do load[1][e] = (e * 37) % 101 end
  local r = assert(eplb.rebalance{ load = load, replicas = 256, gpus = 16 })
  lu.assertTrue(r.stats.refine_work > 0)
  lu.assertTrue(r.stats.refine_steps >= 0 and r.stats.refine_steps <= r.stats.refine_work)
  lu.assertEquals(r.stats.refine_cut, 0)
  r = assert(eplb.rebalance{ load = load, replicas = 256, gpus = 16, mode = "reference" })
  lu.assertEquals({ r.stats.refine_steps, r.stats.refine_work, r.stats.refine_cut }, { 0, 0, 0 })
end

os.exit(lu.LuaUnit.run())
