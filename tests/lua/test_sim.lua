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

-- cost.actions: each action's own time (0-based ranks and indices, as
-- s:action prints them); the rest keeps the model; bad entries named
TestActionTimes = {}
function TestActionTimes:test_replay_and_errors()
  local schedule = require("luapipe.schedule")
  local s = schedule.build("1f1b", { pp = 2, microbatches = 2 }):lower()
  local base = assert(s:simulate({ F = 1, B = 2 }))
  lu.assertAlmostEquals(base:makespan(), 9, 1e-12)
  -- rank 0's first F takes 4 instead of 1: everything after it moves by 3
  local first
  for i = 0, s:count(0) - 1 do
    if s:action(0, i).text == "0F0" then first = i end
  end
  local res = assert(s:simulate({ F = 1, B = 2, actions = { [0] = { [first] = 4 } } }))
  lu.assertAlmostEquals(res:makespan(), 12, 1e-12)
  local ev = res:events(0)[1]
  lu.assertEquals(ev.text, "0F0")
  lu.assertAlmostEquals(ev.finish - ev.start, 4, 1e-12)
  local send
  for i = 0, s:count(0) - 1 do
    if s:action(0, i).text:match("SEND") then send = send or i end
  end
  local function err(cost)
    local ok, e = pcall(s.simulate, s, cost)
    lu.assertFalse(ok)
    return tostring(e)
  end
  lu.assertStrContains(err({ actions = { [0] = { [send] = 1 } } }),
    string.format("simulate: actions[0][%d] (%s): only compute actions (F, B, I, W, FB) take time",
      send, s:action(0, send).text))
  lu.assertStrContains(err({ actions = { [2] = {} } }), "simulate: actions key 2 is not a rank 0..1")
  lu.assertStrContains(err({ actions = { [1] = { [99] = 1 } } }),
    string.format("simulate: actions[1] key 99 is not an action of rank 1 (0..%d)", s:count(1) - 1))
  lu.assertStrContains(err({ actions = { [0] = { [first] = -1 } } }),
    "simulate: actions[0][" .. first .. "] (0F0): its time = -1 must be a number in 0..")
  lu.assertStrContains(err({ actions = 3 }), "simulate: actions must be a table")
end

-- Data parallelism: each stage's gradient sum over dp ranks (a ring
-- all-reduce on the link) starts at the end of its last backward; the
-- rank finishes no earlier; the part before its last action is hidden.
TestDataParallel = {}

function TestDataParallel:test_dp_sums()
  local schedule = require("luapipe.schedule")
  -- link 1 MB/s, 1 cost unit a second: a sum of 0.5 MB over 2 ranks takes
  -- 2 x (0.25 MB / 1 MB/s) = 0.5
  local link = { F = 1, B = 2, I = 1, W = 1, link = "bw=1MB/s", link_unit = 1, dp = 2 }
  for _, fam in ipairs { "1f1b", "interleaved1f1b" } do
    local s = schedule.build(fam, { pp = 2, microbatches = 4 })
    local base = assert(s:simulate { F = 1, B = 2, I = 1, W = 1 })
    local cost = {}
    for k, v in pairs(link) do cost[k] = v end
    cost.dp_bytes = {}
    for st = 0, s:info().stages - 1 do cost.dp_bytes[st] = 0.5e6 end
    local res = assert(s:simulate(cost))
    local finish = 0
    for _, r in ipairs(res:ranks()) do
      -- each local stage's sum, from its last B, one at a time
      local last, ends = 0, {}
      for _, ev in ipairs(res:events(r.rank)) do
        last = math.max(last, ev.finish)
        if ev.type == "B" then ends[ev.stage] = math.max(ends[ev.stage] or 0, ev.finish) end
      end
      local t, took, hidden = {}, 0, 0
      for _, e in pairs(ends) do t[#t + 1] = e end
      table.sort(t)
      local free = 0
      for _, e in ipairs(t) do
        local a = math.max(e, free)
        free = a + 0.5
        took, hidden = took + 0.5, hidden + math.max(0, math.min(free, last) - a)
      end
      lu.assertAlmostEquals(r.dp, took, 1e-9, fam .. " rank " .. r.rank)
      lu.assertAlmostEquals(r.dp_hidden, hidden, 1e-9, fam .. " rank " .. r.rank)
      lu.assertAlmostEquals(r.finish, math.max(last, free), 1e-9, fam .. " rank " .. r.rank)
      finish = math.max(finish, r.finish)
    end
    lu.assertAlmostEquals(res:makespan(), finish, 1e-9)
    lu.assertTrue(res:makespan() > base:makespan(), fam)
    if fam == "interleaved1f1b" then
      -- a rank's first chunk ends its backwards before the other: hidden
      lu.assertTrue(res:ranks()[1].dp_hidden > 0)
    end
  end
  local s = schedule.build("1f1b", { pp = 2, microbatches = 4 })
  local ok, err = pcall(s.simulate, s, { dp = 2, dp_bytes = { [5] = 1 } })
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err), "simulate: dp_bytes key 5 is not a model stage 0..1")
end

os.exit(lu.LuaUnit.run())
