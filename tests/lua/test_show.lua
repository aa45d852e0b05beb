-- test_show.lua — pictures and the Lua face of the simulator: the terminal
-- Gantt chart (P rows, fits 80 columns for P = 4 and 8, micro-batch
-- numbers, F&B pairs), the SVG (a lane per rank, legend, split pair cells,
-- well-formed), parse_cost, s:simulate errors, SimResult methods, traces.
local lu = require("luaunit")
local core = require("luapipe.core")
local schedule = require("luapipe.schedule")
local sim = require("luapipe.sim")
local show = require("luapipe.show")
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local ref = dofile(here .. "dualpipe_ref.lua")

-- 1F1B by hand: P-1-r warm-up forwards, then one forward / one backward.
local function onef1b(P, M)
  local s = schedule.new { name = "1f1b", ranks = P, stages = P, microbatches = M }
  for r = 0, P - 1 do
    local acts, f, b = {}, 0, 0
    for _ = 1, math.min(P - 1 - r, M) do acts[#acts + 1] = r .. "F" .. f; f = f + 1 end
    while b < M do
      if f < M then acts[#acts + 1] = r .. "F" .. f; f = f + 1 end
      acts[#acts + 1] = r .. "B" .. b; b = b + 1
    end
    s:push(r, acts)
  end
  return s
end

-- ZB-H1-like by hand on 2 ranks: backward split into I and W.
local function zb2()
  return schedule.new { ranks = 2, stages = 2, microbatches = 2, actions = {
    [0] = { "0F0", "0F1", "0I0", "0I1", "0W0", "0W1" },
    [1] = { "1F0", "1I0", "1F1", "1I1", "1W0", "1W1" } } }
end

local function rows(text)
  local n = 0
  for line in (text .. "\n"):gmatch("(.-)\n") do
    if line:match("^r%d+ +|") then n = n + 1 end
  end
  return n
end

local function max_width(text)
  local w = 0
  for line in (text .. "\n"):gmatch("(.-)\n") do w = math.max(w, #line) end
  return w
end

local function count(text, pat)
  local n = 0
  for _ in text:gmatch(pat) do n = n + 1 end
  return n
end

-- ---- Gantt ----

TestGantt = {}

function TestGantt:test_p4_rows_width_numbers()
  local res = assert(onef1b(4, 8):simulate { F = 1, B = 2 })
  local text = res:gantt { color = false }
  lu.assertEquals(rows(text), 4)
  lu.assertTrue(max_width(text) <= 80)
  for mb = 0, 7 do
    lu.assertStrContains(text, "B" .. mb)
  end
  lu.assertStrContains(text, "0 1 2 3") -- rank 0's warm-up forwards
  lu.assertStrContains(text, "legend:")
  lu.assertNotStrContains(text, "\27[")
  -- rank 3 idles for its first 3 units: 2 columns per unit here
  lu.assertStrContains(text, "r3 |......0 B0")
end

function TestGantt:test_p8_fits_80_columns()
  for _, s in ipairs { onef1b(8, 16), ref.dualpipe(8, 20), ref.dualpipev(8, 16) } do
    local res = assert(s:simulate { F = 1, B = 2, W = 1, FB = 3 })
    local text = res:gantt { color = false }
    lu.assertEquals(rows(text), 8)
    if res:makespan() <= 75 then lu.assertTrue(max_width(text) <= 80, text) end
  end
  local text = assert(ref.dualpipe(8, 20):simulate { FB = 3 }):gantt { color = false }
  lu.assertTrue(max_width(text) <= 80)
  lu.assertStrContains(text, "&") -- overlapped pairs
end

function TestGantt:test_pairs_and_split_backward()
  local text = assert(ref.dualpipe(4, 8):simulate { FB = 3 }):gantt { color = false }
  lu.assertStrContains(text, "3&5") -- (0F3;7B5): F of mb 3 with B of mb 5
  text = assert(zb2():simulate()):gantt { color = false, scale = 4 }
  lu.assertStrContains(text, "I0")
  lu.assertStrContains(text, "W1")
end

function TestGantt:test_colour()
  local res = assert(ref.dualpipe(4, 8):simulate { FB = 3 })
  local text = res:gantt { color = true }
  lu.assertStrContains(text, "\27[30;46m") -- F
  lu.assertStrContains(text, "\27[1;4;30;106m") -- F half of a pair
  lu.assertStrContains(text, "\27[1;4;30;102m") -- B half of a pair
  lu.assertEquals(rows((text:gsub("\27%[[%d;]*m", ""))), 4)
  if not core.isatty(1) then lu.assertFalse(show.use_color()) end
  lu.assertIsBoolean(core.isatty(0))
end

function TestGantt:test_schedule_methods()
  local s = onef1b(2, 2)
  local text = assert(s:gantt())
  lu.assertEquals(rows(text), 2)
  local slow = assert(s:gantt("F=1,B=4", { color = false }))
  lu.assertNotEquals(slow, s:gantt(nil, { color = false }))
  -- s:show prints to the default output
  local path = os.tmpname()
  local old = io.output()
  io.output(path)
  local ok = s:show({ F = 2 }, { color = false })
  io.output():close()
  io.output(old)
  local f = io.open(path)
  local printed = f:read("a")
  f:close()
  os.remove(path)
  lu.assertTrue(ok)
  lu.assertEquals(rows(printed), 2)
end

-- ---- SVG ----

-- Checks that tags balance; returns the number of elements.
local function well_formed(svg)
  local stack, n = {}, 0
  local body = svg:gsub("^<%?xml.-%?>%s*", "")
  for close, name, selfclose in body:gmatch("<(/?)([%w:_-]+)[^>]-(/?)>") do
    n = n + 1
    if close == "/" then
      lu.assertEquals(table.remove(stack), name, "unbalanced </" .. name .. ">")
    elseif selfclose ~= "/" then
      stack[#stack + 1] = name
    end
  end
  lu.assertEquals(#stack, 0)
  return n
end

TestSvg = {}

function TestSvg:test_lanes_legend_split_cells()
  local res = assert(ref.dualpipe(4, 8):simulate { FB = 2.5 })
  local svg = res:svg()
  lu.assertStrMatches(svg:sub(1, 38), "<%?xml version=\"1.0\" encoding=\"UTF%-8\"%?>\n?")
  lu.assertStrContains(svg, '<svg xmlns="http://www.w3.org/2000/svg"')
  lu.assertEquals(count(svg, 'class="lane"'), 4)
  lu.assertEquals(count(svg, 'class="legend"'), 1)
  local pairs_ = 0
  for _, e in ipairs(res:events()) do if e.type == "FB" then pairs_ = pairs_ + 1 end end
  lu.assertTrue(pairs_ > 0)
  lu.assertEquals(count(svg, 'class="FB%-F"'), pairs_)
  lu.assertEquals(count(svg, 'class="FB%-B"'), pairs_)
  lu.assertStrContains(svg, "url(#idle)")
  lu.assertStrContains(svg, "rank 3")
  lu.assertTrue(well_formed(svg) > 50)
  lu.assertStrMatches(svg, ".*</svg>\n$")
end

function TestSvg:test_write_svg_atomic()
  local res = assert(onef1b(2, 2):simulate())
  local path = os.tmpname()
  lu.assertTrue(res:write_svg(path))
  local f = io.open(path)
  lu.assertEquals(f:read("a"), res:svg())
  f:close()
  os.remove(path)
  local ok, err = res:write_svg("/nonexistent-luapipe-dir/x.svg")
  lu.assertNil(ok)
  lu.assertStrContains(err, "/nonexistent-luapipe-dir/x.svg")
  lu.assertNil(io.open("/nonexistent-luapipe-dir/x.svg"))
end

-- ---- parse_cost ----

TestParseCost = {}

function TestParseCost:test_good()
  lu.assertEquals(sim.parse_cost("F=1,B=2,W=1,FB=2.5,latency=0.1"),
    { F = 1, B = 2, W = 1, FB = 2.5, latency = 0.1 })
  lu.assertEquals(sim.parse_cost(" fb = 3 , Latency=0 ,i=1"), { FB = 3, latency = 0, I = 1 })
  lu.assertEquals(sim.parse_cost(""), {})
  lu.assertEquals(sim.parse_cost("F=1,F[1]=2,B[1]=4"), { F = 1, stages = { [1] = { F = 2, B = 4 } } })
end

function TestParseCost:test_bad()
  local function bad(text, want)
    local ok, err = pcall(sim.parse_cost, text)
    lu.assertFalse(ok, text)
    lu.assertStrContains(err, want)
  end
  bad("F=x", "F=x")
  bad("F=1,Q=2", "unknown key 'Q'")
  bad("F", "cost item 'F'")
  bad("F=-1", "F=-1")
  bad("latency[2]=1", "latency[2]=1")
  bad("B=2,,W=nan", "W=nan")
  local ok, err = pcall(sim.parse_cost, 3)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "expected a string")
end

function TestParseCost:test_round_trip_through_simulate()
  local s = onef1b(2, 2)
  local res = assert(s:simulate(sim.parse_cost("F=1,B=2,F[1]=2,B[1]=4")))
  lu.assertEquals(res:makespan(), 15)
end

-- ---- simulate and SimResult ----

TestSimulate = {}

function TestSimulate:test_errors()
  local s = onef1b(2, 2)
  local ok, err = pcall(s.simulate, s, { F = 1, Q = 2, zz = 3 })
  lu.assertFalse(ok)
  lu.assertStrContains(err, "unknown keys 'Q', 'zz'")
  ok, err = pcall(s.simulate, s, { F = "slow" })
  lu.assertFalse(ok)
  lu.assertStrContains(err, "F must be a number >= 0")
  ok, err = pcall(s.simulate, s, { F = -1 })
  lu.assertFalse(ok)
  ok, err = pcall(s.simulate, s, { stages = { [5] = { F = 1 } } })
  lu.assertFalse(ok)
  lu.assertStrContains(err, "not a model stage 0..1")
  ok, err = pcall(s.simulate, s, { stages = { [0] = { latency = 1 } } })
  lu.assertFalse(ok)
  lu.assertStrContains(err, "unknown key 'latency'")
  ok, err = pcall(s.simulate, s, { B = 1, W = 2 })
  lu.assertFalse(ok)
  lu.assertStrContains(err, "B = I + W")
  ok, err = pcall(s.simulate, s, 5)
  lu.assertFalse(ok)
end

function TestSimulate:test_invalid_schedule()
  local s = schedule.new { ranks = 2, stages = 2, microbatches = 1,
    actions = { [0] = { "0B0", "0F0" }, [1] = { "1F0", "1B0" } } }
  local res, err = s:simulate()
  lu.assertNil(res)
  lu.assertStrContains(err, "rank 0")
end

function TestSimulate:test_result_methods()
  local res = assert(onef1b(4, 8):simulate { F = 1, B = 2, latency = 0 })
  lu.assertEquals(res:makespan(), 33)
  lu.assertEquals(res:max_bubble(), 9)
  local ranks = res:ranks()
  lu.assertEquals(#ranks, 4)
  for i, r in ipairs(ranks) do
    lu.assertEquals(r.rank, i - 1)
    lu.assertEquals(r.busy, 24)
    lu.assertEquals(r.bubble, 9)
    lu.assertAlmostEquals(r.bubble_ratio, 9 / 33, 1e-12)
    lu.assertEquals(r.peak_live, 4 - (i - 1))
    lu.assertEquals(r.peak_pending_w, 0)
  end
  local ev = res:events()
  lu.assertEquals(#ev, 64)
  lu.assertEquals(ev[1], { rank = 0, index = 0, text = "0F0", type = "F", stage = 0, mb = 0,
    start = 0, finish = 1 })
  lu.assertEquals(#res:events(3), 16)
  local m = res:messages()
  lu.assertEquals(#m, 48)
  lu.assertEquals(m[1].from, 0)
  lu.assertEquals(m[1].to, 1)
  lu.assertEquals(m[1].text, "0F0")
  lu.assertEquals(m[1].sent, 1)
  lu.assertEquals(m[1].arrived, 1)
  lu.assertEquals(res:info().ranks, 4)
  lu.assertEquals(res:info().name, "1f1b")
  local mem = res:memory(0)
  lu.assertEquals(mem[1].time, 0)
  lu.assertEquals(mem[#mem].live, 0)
  lu.assertStrContains(res:summary(), "makespan 33")
  lu.assertEquals(tostring(res), res:summary())
  -- FB events carry their backward half
  local fb
  for _, e in ipairs(assert(ref.dualpipe(4, 8):simulate()):events(0)) do
    if e.type == "FB" then fb = fb or e end
  end
  lu.assertEquals(fb.text, "(0F3;7B5)OVERLAP_F_B")
  lu.assertEquals(fb.btype, "B")
  lu.assertEquals(fb.bstage, 7)
  lu.assertEquals(fb.bmb, 5)
end

function TestSimulate:test_close()
  local res = assert(onef1b(2, 2):simulate())
  res:close()
  res:close() -- idempotent
  local ok, err = pcall(res.makespan, res)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "attempt to use a closed luapipe.SimResult")
  lu.assertEquals(tostring(res), "luapipe.SimResult (closed)")
  do
    local r2 <close> = assert(onef1b(2, 2):simulate())
    lu.assertEquals(r2:makespan(), 9)
  end
end

function TestSimulate:test_trace()
  local json = require("luapipe.json")
  local res = assert(onef1b(2, 2):simulate { latency = 0.5 })
  local t = json.decode(res:trace_json())
  lu.assertEquals(t.displayTimeUnit, "ms")
  local phs = {}
  for _, e in ipairs(t.traceEvents) do
    lu.assertNotNil(e.ph)
    lu.assertNotNil(e.pid)
    lu.assertNotNil(e.tid)
    lu.assertNotNil(e.ts)
    phs[e.ph] = (phs[e.ph] or 0) + 1
  end
  lu.assertEquals(phs.s, 4)
  lu.assertEquals(phs.f, 4)
  lu.assertTrue(phs.C > 0)
  lu.assertEquals(phs.X, 8 + 2 * 4)
  local path = os.tmpname()
  lu.assertTrue(res:write_trace(path))
  local f = io.open(path)
  lu.assertEquals(f:read("a"), res:trace_json())
  f:close()
  os.remove(path)
  local ok, err = res:write_trace("/nonexistent-luapipe-dir/t.json")
  lu.assertNil(ok)
  lu.assertStrContains(err, "nonexistent-luapipe-dir")
end

os.exit(lu.LuaUnit.run())
