-- test_sim_precision.lua — the simulator and the search know the
-- activation's dtype: cost.values (values in one activation) with
-- cost.precision sizes messages (4 bytes a value in f32, 2 in bf16) and
-- gives the peak activation memory in bytes; the search takes a memory
-- limit in bytes (memory_bytes, act_values, precision), where bf16 fits
-- twice the activations. Exact figures; bad input is one message.
local lu = require("luaunit")
local schedule = require("luapipe.schedule")
local search = require("luapipe.search")

TestSimPrecision = {}

function TestSimPrecision:test_messages_halve_in_bf16()
  -- GPipe, 2 ranks, 1 micro-batch: F0 -> F1 -> B1 -> B0 = 0.06 s of
  -- compute and two messages of 1e6 values at 1 GB/s: 4 ms each in f32,
  -- 2 ms in bf16 (and bytes = 4e6 is f32's)
  local s = schedule.build("gpipe", { pp = 2, microbatches = 1 })
  local c = { F = 0.01, B = 0.02, W = 0.01, link = "lat=0us,bw=1GB/s", values = 1e6 }
  local f32 = assert(s:simulate(c))
  lu.assertAlmostEquals(f32:info().latency, 4e-3, 1e-15)
  lu.assertAlmostEquals(f32:makespan(), 0.068, 1e-12)
  c.precision = "f32"
  lu.assertEquals(assert(s:simulate(c)):makespan(), f32:makespan())
  c.precision = "bf16"
  local bf = assert(s:simulate(c))
  lu.assertAlmostEquals(bf:info().latency, 2e-3, 1e-15)
  lu.assertAlmostEquals(bf:makespan(), 0.064, 1e-12)
  lu.assertEquals(assert(s:simulate { F = 0.01, B = 0.02, W = 0.01, link = "lat=0us,bw=1GB/s",
    bytes = 4e6 }):makespan(), f32:makespan())
end

function TestSimPrecision:test_peak_activation_bytes()
  -- 1F1B, 4 ranks, 8 micro-batches: rank r holds 4 - r activations at
  -- its peak; 1000 values each = 4000 bytes in f32, 2000 in bf16
  local s = schedule.build("1f1b", { pp = 4, microbatches = 8 })
  local want = { f32 = { 16000, 12000, 8000, 4000 }, bf16 = { 8000, 6000, 4000, 2000 } }
  for p, w in pairs(want) do
    local res = assert(s:simulate { values = 1000, precision = p })
    for i, r in ipairs(res:ranks()) do
      lu.assertEquals(r.peak_live, 4 - (i - 1))
      lu.assertEquals(r.peak_act_bytes, w[i], p .. " rank " .. r.rank)
    end
  end
  -- ZB-H1: activations held for their W count too (live + pending W)
  local zb = schedule.build("zb1p", { pp = 2, microbatches = 4 })
  local res = assert(zb:simulate { values = 10, precision = "bf16" })
  for _, r in ipairs(res:ranks()) do
    lu.assertTrue(r.peak_act_bytes >= 20 * r.peak_live)
    lu.assertTrue(r.peak_act_bytes <= 20 * (r.peak_live + r.peak_pending_w))
  end
  -- no values: no byte figures
  for _, r in ipairs(assert(s:simulate {}):ranks()) do lu.assertEquals(r.peak_act_bytes, 0) end
  -- the summary shows the column only then
  lu.assertStrContains(tostring(assert(s:simulate { values = 1000, precision = "bf16" })),
    "act. bytes")
  lu.assertNotStrContains(tostring(assert(s:simulate {})), "act. bytes")
end

function TestSimPrecision:test_bad_cost()
  local s = schedule.build("1f1b", { pp = 2, microbatches = 2 })
  local ok, err = pcall(s.simulate, s, { values = 10, precision = "fp8" })
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err), 'simulate: precision must be "f32" or "bf16", got fp8')
  ok, err = pcall(s.simulate, s, { values = 10, bytes = 40 })
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err),
    "cost model: give the message size as bytes or as values (with the precision), not both")
end

function TestSimPrecision:test_search_memory_in_bytes()
  -- 8000 bytes per rank of 1000-value activations: 2 in f32, 4 in bf16
  local mu = search._internal.memory_units
  lu.assertEquals(mu({ memory_bytes = 8000, act_values = 1000 }, 2), { 2, 2 })
  lu.assertEquals(mu({ memory_bytes = 8000, act_values = 1000, precision = "bf16" }, 2), { 4, 4 })
  local base = { pp = 4, microbatches = 8, cost = "F=1,B=2,W=1", time = 0.1, families = false,
    progress = false, act_values = 1000, memory_bytes = 8000 }
  local f32 = assert(search.search(base))
  base.precision = "bf16"
  local bf = assert(search.search(base))
  for i, v in ipairs(f32:peak_memory()) do
    lu.assertTrue(v <= 2, "f32 rank " .. i)
    lu.assertEquals(f32:peak_bytes()[i], 4000 * v)
  end
  local most = 0
  for i, v in ipairs(bf:peak_memory()) do
    lu.assertTrue(v <= 4, "bf16 rank " .. i)
    lu.assertEquals(bf:peak_bytes()[i], 2000 * v)
    lu.assertTrue(bf:peak_bytes()[i] <= 8000)
    most = math.max(most, v)
  end
  -- the room bf16 leaves is used: 1F1B's 4 in flight on rank 0, a shorter step
  lu.assertEquals(most, 4)
  lu.assertTrue(bf:makespan() < f32:makespan())
  lu.assertNil(assert(search.search { pp = 2, microbatches = 2, time = 0.05, families = false,
    progress = false }):peak_bytes())
end

function TestSimPrecision:test_search_bad_options()
  local function msg(o)
    local ok, err = pcall(search.search, o)
    lu.assertFalse(ok)
    return tostring(err)
  end
  lu.assertStrContains(msg { pp = 2, microbatches = 2, precision = "bf16" },
    "precision needs act_values (values in one activation: what sizes it in bytes)")
  lu.assertStrContains(msg { pp = 2, microbatches = 2, precision = "fp8", act_values = 1 },
    'precision must be "f32" or "bf16", got "fp8"')
  lu.assertStrContains(msg { pp = 2, microbatches = 2, memory = 2, memory_bytes = 8, act_values = 1 },
    "give memory (activations) or memory_bytes, not both")
end

os.exit(lu.LuaUnit.run())
