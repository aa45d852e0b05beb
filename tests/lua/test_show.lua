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

-- The chart is cut into bands of P rows each; every line fits the width.
local function bands(text)
  return count("\n" .. text, "\nr0 +|")
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
    lu.assertEquals(rows(text), 8 * bands(text))
    lu.assertTrue(max_width(text) <= 80, text)
  end
  local text = assert(ref.dualpipe(8, 20):simulate { FB = 3 }):gantt { color = false }
  lu.assertTrue(max_width(text) <= 80)
  lu.assertStrContains(text, "&") -- overlapped pairs
  -- 1F1B P=4 M=8 fits one band of 80 columns at 2 columns per unit
  text = assert(onef1b(4, 8):simulate { F = 1, B = 2 }):gantt { color = false }
  lu.assertEquals(bands(text), 1)
  lu.assertStrContains(text, "1 unit = 2 cols")
end

-- The cells of each rank, in order: the words between idle dots and the
-- spaces that end every cell, over all bands.
local function cells_of(text, P)
  local out = {}
  for r = 0, P - 1 do out[r] = {} end
  for line in (text .. "\n"):gmatch("(.-)\n") do
    local r, body = line:match("^r(%d+) +|(.*)|$")
    if r then
      for word in body:gsub("%.", " "):gmatch("%S+") do
        table.insert(out[tonumber(r)], word)
      end
    end
  end
  return out
end

-- Every action's full label appears, in order, whatever the cost ratio
-- (the README's F=1,B=2,W=1,FB=2.5 used to print "&0" for "e&0").
function TestGantt:test_every_label_whole_at_any_cost_ratio()
  local cases = {
    { ref.dualpipe(4, 10), { F = 1, B = 2, W = 1, FB = 2.5 } },
    { ref.dualpipe(8, 20), { F = 1, B = 2, W = 1, FB = 2.5 } },
    { ref.dualpipe(8, 20), { F = 1.3, B = 2.6, W = 1.3, FB = 3.1 } },
    { ref.dualpipev(4, 12), { F = 0.7, B = 1.9, W = 0.4, FB = 2.2 } },
    { onef1b(4, 16), { F = 10, B = 20 } },
    { zb2(), { F = 1, B = 5, W = 0.3 } },
  }
  for _, c in ipairs(cases) do
    local s, cost = c[1], c[2]
    local res = assert(s:simulate(cost))
    local P = res:info().ranks
    -- one band: the words are exactly the labels, in order
    local text = res:gantt { color = false, width = 100000 }
    lu.assertEquals(bands(text), 1)
    local got = cells_of(text, P)
    local chunk_of, multi = show.chunks(res)
    for r = 0, P - 1 do
      local want = {}
      for _, e in ipairs(res:events(r)) do
        if e.finish > e.start then want[#want + 1] = show.cell_label(e, multi and chunk_of or nil) end
      end
      lu.assertEquals(got[r], want, "rank " .. r)
    end
    -- 80 columns: bands; a cut action shows "~" where its label has no room
    text = res:gantt { color = false }
    lu.assertTrue(max_width(text) <= 80)
    got = cells_of(text, P)
    for r = 0, P - 1 do
      local n = 0
      for _, e in ipairs(res:events(r)) do if e.finish > e.start then n = n + 1 end end
      local whole = 0
      for _, w in ipairs(got[r]) do if not w:find("~", 1, true) then whole = whole + 1 end end
      lu.assertTrue(whole >= n - (bands(text) - 1), "rank " .. r)
    end
    lu.assertNotStrContains(text, "a-z")
  end
  -- full labels: no narrow-cell codes like "I4W45"
  lu.assertEquals(show.cell_label { type = "FB", mb = 14, bmb = 0, btype = "B" }, "14&0")
  lu.assertEquals(show.cell_label { type = "FB", mb = 3, bmb = 5, btype = "I" }, "3&I5")
  lu.assertEquals(show.cell_label { type = "W", mb = 12 }, "W12")
  lu.assertEquals(show.cell_label { type = "F", mb = 12 }, "12")
  -- with chunks: the chunk's letter after each half
  local ch = { [0] = 0, [7] = 1 }
  lu.assertEquals(show.cell_label({ type = "FB", mb = 3, stage = 0, bmb = 5, bstage = 7, btype = "B" }, ch),
    "3a&5b")
  lu.assertEquals(show.cell_label({ type = "I", mb = 12, stage = 7 }, ch), "I12b")
end

-- Two virtual stages on one rank are told apart: labels end with the
-- chunk's letter (a: the rank's lowest virtual stage), the colours
-- alternate normal and bright; one virtual stage per rank: no letters.
function TestGantt:test_chunks_told_apart()
  local zbv = require("luapipe.schedules").zbv { pp = 4, microbatches = 8 }
  local res = assert(zbv:simulate())
  local chunk_of, multi = show.chunks(res)
  lu.assertTrue(multi)
  lu.assertEquals(chunk_of[0], 0) -- rank 0 holds virtual stages 0 and 7
  lu.assertEquals(chunk_of[7], 1)
  local text = res:gantt { color = false, width = 100000 }
  local words = cells_of(text, 4)
  -- rank 0: F of mb 0 on the first leg, then its second leg's F, I and W
  lu.assertEquals(words[0][1], "0a")
  local second = false
  for _, w in ipairs(words[0]) do second = second or w == "I0b" end
  lu.assertTrue(second)
  for r = 0, 3 do
    for _, w in ipairs(words[r]) do lu.assertNotNil(w:match("^[BIW]?%d+[ab]$"), w) end
  end
  lu.assertStrContains(text, "3a/3b=chunk a/b")
  local colored = res:gantt { color = true, width = 100000 }
  lu.assertStrContains(colored, "\27[30;46m0a") -- F, chunk a: cyan
  lu.assertStrContains(colored, "\27[30;106m") -- F, chunk b: bright cyan
  lu.assertStrContains(colored, "\27[30;103mI") -- I, chunk b: bright yellow
  -- interleaved: chunks a and b of each rank
  local il = assert(require("luapipe.schedules").interleaved1f1b { pp = 2, microbatches = 4, chunks = 2 }
    :simulate()):gantt { color = false, width = 100000 }
  lu.assertStrContains(il, "0a")
  lu.assertStrContains(il, "B0b")
  -- 1F1B: no letters
  local one = assert(onef1b(4, 8):simulate()):gantt { color = false }
  lu.assertNotStrContains(one, "chunk")
  lu.assertNil(one:match("%d[ab] "))
end

-- Costs many orders of magnitude apart (--cost F=1e14,B=1) cannot label
-- every action in a chart of bounded size: at most 24 bands, the short
-- labels cut, and the legend says so (it used to need ~1e14 columns).
function TestGantt:test_extreme_cost_ratio_is_bounded()
  local res = assert(onef1b(2, 2):simulate { F = 1e14, B = 1 })
  local text = res:gantt { color = false }
  lu.assertTrue(bands(text) <= 24)
  lu.assertTrue(max_width(text) <= 80)
  lu.assertStrContains(text, "(costs too far apart to label every action in 24 bands: short ones cut)")
  -- an ordinary ratio has no such note
  lu.assertNotStrContains(assert(onef1b(2, 2):simulate { F = 1, B = 2 }):gantt { color = false },
    "too far apart")
  -- not a result: named, raised at the caller
  local ok, err = pcall(show.gantt, 5)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "show.gantt: expected a simulation result (s:simulate(cost)), got number")
  ok, err = pcall(show.svg, "x")
  lu.assertStrContains(err, "show.svg: expected a simulation result (s:simulate(cost)), got string")
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
  lu.assertStrContains(text, "\27[30;46m") -- F, chunk a
  lu.assertStrContains(text, "\27[1;4;30;46m") -- F half of a pair, chunk a
  lu.assertStrContains(text, "\27[1;4;30;102m") -- B half of a pair, chunk b
  local plain = text:gsub("\27%[[%d;]*m", "")
  lu.assertEquals(rows(plain), 4 * bands(plain))
  lu.assertEquals(plain, res:gantt { color = false })
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
  local n = select("#", s:show({ F = 2 }, { color = false }))
  io.output():close()
  io.output(old)
  local f = io.open(path)
  local printed = f:read("a")
  f:close()
  os.remove(path)
  lu.assertEquals(n, 0) -- nothing for the REPL to echo
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

-- The cell groups of an SVG: {class, tip, width, labels = {{text, size}}}.
local function svg_cells(svg)
  local out = {}
  for class, tip, inner in svg:gmatch('<g class="([%w_-]+)"><title>(.-)</title>\n(.-)</g>') do
    local c = { class = class, tip = tip, width = tonumber(inner:match('width="([%d.]+)"')), labels = {} }
    for size, text in inner:gmatch('<text [^>]-font%-size="([%d.]+)"[^>]->(.-)</text>') do
      c.labels[#c.labels + 1] = { text, tonumber(size) }
    end
    out[#out + 1] = c
  end
  return out
end

local function svg_size(svg)
  local w, h = svg:match('<svg [^>]-width="([%d.]+)" height="([%d.]+)"')
  return tonumber(w), tonumber(h)
end

-- Each label is one micro-batch number (never "101112..."), fits its cell,
-- and is readable (>= 8 px); two-digit numbers fit at P=8, M=20.
function TestSvg:test_labels_fit_their_cells()
  local res = assert(ref.dualpipe(8, 20):simulate { F = 1, B = 2, W = 1, FB = 3 })
  local svg = res:svg()
  local cells, labelled, two = svg_cells(svg), 0, 0
  lu.assertTrue(#cells > 200)
  for _, c in ipairs(cells) do
    lu.assertTrue(#c.labels <= (c.class == "FB" and 2 or 1))
    for _, l in ipairs(c.labels) do
      local text, size = l[1], l[2]
      lu.assertNotNil(text:match("^I?%d+[ab]$"), c.tip)
      lu.assertTrue(size >= 8, c.tip)
      lu.assertTrue(#text * size * 0.6 + 4 <= c.width + 1e-6, c.tip)
      labelled = labelled + 1
      if #text:match("%d+") == 2 then two = two + 1 end
    end
  end
  -- every action is labelled, two-digit micro-batches included
  lu.assertEquals(labelled, #res:events() + count(svg, 'class="FB%-B"'))
  lu.assertTrue(two > 50)
  lu.assertNotStrContains(svg, "1011")
  local w, h = svg_size(svg)
  lu.assertTrue(w / h >= 1.5 and w / h <= 4, w .. "x" .. h)
end

-- Kinds get hues far apart (F and I above all), a rank's two chunks a
-- dark and a light shade, named in the legend with their direction;
-- 1F1B only the dark one.
local function rgb(hex)
  return tonumber(hex:sub(2, 3), 16), tonumber(hex:sub(4, 5), 16), tonumber(hex:sub(6, 7), 16)
end
local function distance(a, b)
  local r1, g1, b1 = rgb(a)
  local r2, g2, b2 = rgb(b)
  return math.sqrt((r1 - r2) ^ 2 + (g1 - g2) ^ 2 + (b1 - b2) ^ 2)
end

function TestSvg:test_chunks_and_kinds_apart()
  local svg = assert(ref.dualpipe(4, 8):simulate { FB = 3 }):svg()
  lu.assertStrContains(svg, "chunk a (down the ranks, 0 to 3):")
  lu.assertStrContains(svg, "chunk b (up the ranks, 3 to 0):")
  local il = assert(require("luapipe.schedules").interleaved1f1b { pp = 4, microbatches = 8, chunks = 4 }
    :simulate()):svg()
  lu.assertStrContains(il, "chunks a, c (down the ranks, 0 to 3):")
  lu.assertStrContains(il, "chunks b, d (down the ranks, 0 to 3):")
  lu.assertStrContains(il, "labels: micro-batch and chunk (3a, I3b)")
  -- rank 0 runs F of mb 0 (vstage 0, chunk a) and F of mb 4 (vstage 7, chunk b)
  local cells = svg_cells(svg)
  local function cell(tipword)
    for _, c in ipairs(cells) do
      if c.tip:find(tipword, 1, true) then
        return svg:match('<title>' .. c.tip:gsub("%p", "%%%0") .. '</title>\n<rect [^>]-fill="(#%x+)"'), c
      end
    end
  end
  local fa, ca = cell("rank 0, action 0: 0F0 ")
  local fb, cb = cell("rank 0, action 3: 7F4 ")
  lu.assertEquals(ca.labels[1][1], "0a")
  lu.assertEquals(cb.labels[1][1], "4b")
  lu.assertTrue(distance(fa, fb) > 100, fa .. " vs " .. fb) -- chunks apart
  -- every pair of kinds far apart, in both shades
  local zb = assert(require("luapipe.schedules").zbv({ pp = 4, microbatches = 8 }):simulate()):svg()
  local by = {}
  for fill, kind in zb:gmatch('width="16" height="14" fill="(#%x+)" stroke="#999" stroke%-width="0.5"/>\n<text [^>]*>(%u) ') do
    by[#by + 1] = { kind = kind, fill = fill }
  end
  lu.assertTrue(#by >= 6, #by) -- F, I, W in two shades
  for i = 1, #by do
    for j = i + 1, #by do
      lu.assertTrue(distance(by[i].fill, by[j].fill) > 70, by[i].kind .. by[i].fill .. " vs " .. by[j].kind .. by[j].fill)
    end
  end
  local one = assert(onef1b(4, 8):simulate()):svg()
  lu.assertNotStrContains(one, "chunk")
  lu.assertStrContains(one, "F forward")
  lu.assertStrContains(one, "B backward")
  lu.assertStrContains(one, "numbers: micro-batch")
  lu.assertNotStrContains(one, "W weight-grad") -- only what the picture uses
end

-- A big chart keeps every label: a cell too narrow for its number across
-- gets it along (rotated), never a dropped two-digit number.
function TestSvg:test_big_chart_keeps_labels()
  local res = assert(onef1b(16, 64):simulate())
  local svg = res:svg()
  local cells, labelled, two, up = svg_cells(svg), 0, 0, 0
  for _, c in ipairs(cells) do
    lu.assertEquals(#c.labels, 1, c.tip)
    local text = c.labels[1][1]
    lu.assertEquals(text, c.tip:match("%u(%d+) %[")) -- the micro-batch
    labelled = labelled + 1
    if #text == 2 then two = two + 1 end
  end
  up = count(svg, 'transform="rotate%(%-90 ')
  lu.assertEquals(labelled, #res:events())
  lu.assertTrue(two > 1000)
  lu.assertTrue(up > 0)
end

-- A measured step (times in ms, optimizer slices) as perf.write_measured_svg
-- draws it: the unit on the axis, the optimizer in the legend, about 3:1.
function TestSvg:test_measured_units_optimizer_aspect()
  local Fake = {}
  Fake.__index = Fake
  function Fake:info() return { name = "1f1b (measured)", ranks = 2, stages = 2, microbatches = 2 } end
  function Fake:makespan() return 12.5 end
  function Fake:max_bubble() return 3 end
  local ev = {
    [0] = { { type = "F", stage = 0, mb = 0, start = 0, finish = 2, index = 0, text = "0F0" },
      { type = "B", stage = 0, mb = 0, start = 7, finish = 10.5, index = 1, text = "0B0" },
      { type = "optim", stage = -1, mb = "opt", start = 10.5, finish = 12.5, index = -1, text = "optimizer" } },
    [1] = { { type = "F", stage = 1, mb = 0, start = 2.5, finish = 4.5, index = 0, text = "1F0" },
      { type = "B", stage = 1, mb = 0, start = 4.5, finish = 6.9, index = 1, text = "1B0" },
      { type = "optim", stage = -1, mb = "opt", start = 7, finish = 9, index = -1, text = "optimizer" } },
  }
  function Fake:events(r) return ev[r] end
  local m = setmetatable({}, Fake)
  local svg = show.svg(m, { title = "measured", unit = "ms", scale = 1200 / 12.5 })
  lu.assertStrContains(svg, "time (ms)")
  lu.assertNotStrContains(svg, "units")
  lu.assertStrContains(svg, "optimizer step")
  lu.assertStrContains(svg, "[10.5, 12.5] ms")
  local w, h = svg_size(svg)
  lu.assertTrue(w / h >= 2 and w / h <= 4, w .. "x" .. h)
  well_formed(svg)
  -- the simulated picture says "units"
  lu.assertStrContains(assert(onef1b(2, 2):simulate()):svg(), "time (units)")
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
  local res, err = s:try_simulate()
  lu.assertNil(res)
  lu.assertStrContains(err, "rank 0")
  lu.assertStrContains(tostring(select(2, pcall(s.simulate, s))), "simulate: rank 0")
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
