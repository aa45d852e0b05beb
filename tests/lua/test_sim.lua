-- test_sim.lua — the simulator against the DualPipe spec: the worked
-- example's action lists, the README bubble figures (DualPipe P=8 M=20:
-- 6 with F&B=3, 4.5 with F&B=2.5; DualPipeV P=8 M=16: 14) and peak
-- activations (P+1 per DualPipe rank, 2P+1 per DualPipeV rank). The
-- schedules come from tests/lua/dualpipe_ref.lua (the spec's eight steps).
local lu = require("luaunit")
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local ref = dofile(here .. "dualpipe_ref.lua")
require("luapipe.sim")

TestDualPipeSpec = {}

function TestDualPipeSpec:test_worked_example()
  local s = ref.dualpipe(4, 8)
  lu.assertEquals(table.concat(s:actions(0), " "),
    "0F0 0F1 0F2 7F4 7I4 7W4 7F5 (0F3;7B5)OVERLAP_F_B (7F6;0B0)OVERLAP_F_B 7B6 "
    .. "(7F7;0B1)OVERLAP_F_B 7B7 0I2 0W2 0I3 0W3")
  lu.assertEquals(table.concat(s:actions(1), " "),
    "1F0 6F4 1F1 6F5 1F2 6B4 (6F6;1B0)OVERLAP_F_B (1F3;6B5)OVERLAP_F_B "
    .. "(6F7;1B1)OVERLAP_F_B 6B6 1B2 6I7 1I3 6W7 1W3")
end

local function check(s, cost, bubble, peak)
  local res = assert(s:simulate(cost))
  lu.assertAlmostEquals(res:max_bubble(), bubble, 1e-9)
  for _, r in ipairs(res:ranks()) do
    lu.assertEquals(r.peak_live, peak, "rank " .. r.rank)
    lu.assertAlmostEquals(r.bubble, res:makespan() - r.busy, 1e-9)
  end
  return res
end

function TestDualPipeSpec:test_dualpipe_bubble_fb3()
  local res = check(ref.dualpipe(8, 20), { F = 1, B = 2, W = 1, FB = 3 }, 6, 9)
  lu.assertEquals(res:makespan(), 66)
end

function TestDualPipeSpec:test_dualpipe_bubble_fb25()
  check(ref.dualpipe(8, 20), { F = 1, B = 2, W = 1, FB = 2.5 }, 4.5, 9)
end

function TestDualPipeSpec:test_dualpipev_bubble()
  check(ref.dualpipev(8, 16), { F = 1, B = 2, W = 1, FB = 3 }, 14, 17)
end

function TestDualPipeSpec:test_dualpipev_turnaround_is_local()
  -- DualPipeV turns around on rank P-1 without a message
  local res = assert(ref.dualpipev(4, 8):simulate())
  for _, m in ipairs(res:messages()) do
    lu.assertNotEquals(m.from, m.to)
    lu.assertEquals(math.abs(m.from - m.to), 1) -- neighbours only
  end
end

function TestDualPipeSpec:test_latency_only_adds()
  local s = ref.dualpipe(4, 8)
  local a = assert(s:simulate { FB = 3 })
  local b = assert(s:simulate { FB = 3, latency = 0.1 })
  lu.assertTrue(b:makespan() > a:makespan())
  for _, m in ipairs(b:messages()) do
    lu.assertAlmostEquals(m.arrived - m.sent, 0.1, 1e-12)
  end
end

-- The simulator's fill-in rule, one implementation (C) for every caller
TestResolveCost = {}
function TestResolveCost:test_fill_in()
  local sim = require("luapipe.sim")
  local function times(c) return { c.F, c.B, c.I, c.W, c.FB, c.latency } end
  lu.assertEquals(times(sim.resolve_cost{}), { 1, 2, 1, 1, nil, 0 })
  lu.assertEquals(times(sim.resolve_cost{ B = 3 }), { 1, 3, 1.5, 1.5, nil, 0 })
  lu.assertEquals(times(sim.resolve_cost{ B = 3, W = 1 }), { 1, 3, 2, 1, nil, 0 })
  lu.assertEquals(times(sim.resolve_cost{ I = 3 }), { 1, 6, 3, 3, nil, 0 })
  lu.assertEquals(times(sim.resolve_cost{ F = 2, I = 1, W = 2, FB = 4, latency = 0.5 }),
    { 2, 3, 1, 2, 4, 0.5 })
  local c, err = sim.resolve_cost{ B = 1, W = 2 }
  lu.assertNil(c)
  lu.assertStrContains(err, "B = 1 is less than W = 2")
end

os.exit(lu.LuaUnit.run())
