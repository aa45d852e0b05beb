-- Seeded random sweep over every schedule family: build, validate, lower
-- (and validate the lowered schedule), simulate, CSV and JSON round trips.
-- The seed is printed; rerun one with LUAPIPE_SEED=<seed>.
local lu = require("luaunit")
local schedule = require("luapipe.schedule")
local schedules = require("luapipe.schedules")

local SEED = tonumber(os.getenv("LUAPIPE_SEED")) or os.time()
print("test_schedule_sweep: seed " .. SEED)
math.randomseed(SEED)

local PER_FAMILY = 7
local COST = { F = 1, B = 2, I = 1, W = 1, FB = 3, latency = 0 }
local COST_OF = { F = 1, B = 2, I = 1, W = 1, FB = 3 }

-- random legal parameters for each family
local gen = {
  gpipe = function() return { pp = math.random(1, 8), microbatches = math.random(1, 24) } end,
  ["1f1b"] = function() return { pp = math.random(1, 8), microbatches = math.random(1, 24) } end,
  zb1p = function() return { pp = math.random(1, 8), microbatches = math.random(1, 24) } end,
  zbv = function() return { pp = math.random(1, 8), microbatches = math.random(1, 24) } end,
  interleaved1f1b = function()
    local P, v = math.random(1, 8), math.random(2, 4)
    local M
    repeat M = math.random(1, 3 * P) until M % math.max(1, M // P) == 0
    return { pp = P, microbatches = M, chunks = v }
  end,
  dualpipe = function()
    local P = 2 * math.random(1, 5)
    return { pp = P, microbatches = 2 * P + 2 * math.random(0, 8) }
  end,
  dualpipev = function()
    local P = math.random(1, 8)
    return { pp = P, microbatches = 2 * P + math.random(0, 10) }
  end,
  chimera = function()
    local P = 2 * math.random(1, 4)
    return { pp = P, microbatches = P * math.random(1, 4) }
  end,
}

local function describe(name, o)
  return string.format("%s{pp=%d, microbatches=%d%s} (seed %d)", name, o.pp, o.microbatches,
    o.chunks and (", chunks=" .. o.chunks) or "", SEED)
end

local function compute_only(s, r)
  local out = {}
  for i = 1, s:count(r) do
    local a = s:action(r, i - 1)
    if COST_OF[a.type] then out[#out + 1] = a.text end
  end
  return out
end

local function assert_same_actions(a, b, what)
  local ia, ib = a:info(), b:info()
  lu.assertEquals({ ib.ranks, ib.stages, ib.microbatches, ib.vstages },
    { ia.ranks, ia.stages, ia.microbatches, ia.vstages }, what)
  for r = 0, ia.ranks - 1 do lu.assertEquals(b:actions(r), a:actions(r), what .. ", rank " .. r) end
end

local function check(name, opts)
  local what = describe(name, opts)
  local s = schedules[name](opts)
  local info = s:info()

  local ok, err = s:validate()
  lu.assertTrue(ok, what .. ": " .. tostring(err))

  -- lowering adds only messages: the compute order of every rank is kept
  local low, lerr = s:lower()
  lu.assertNotNil(low, what .. ": lower: " .. tostring(lerr))
  ok, err = low:validate()
  lu.assertTrue(ok, what .. ": lowered: " .. tostring(err))
  lu.assertTrue(info.ranks == 1 or low:info().lowered, what .. ": lowered has messages")
  for r = 0, info.ranks - 1 do
    lu.assertEquals(compute_only(low, r), s:actions(r), what .. ", rank " .. r)
  end

  -- simulate: busy time is the sum of the rank's costs; bubble = makespan - busy
  local res, serr = s:simulate(COST)
  lu.assertNotNil(res, what .. ": simulate: " .. tostring(serr))
  local ranks, worst = res:ranks(), 0
  lu.assertEquals(#ranks, info.ranks, what)
  for r = 0, info.ranks - 1 do
    local busy = 0
    for i = 1, s:count(r) do busy = busy + COST_OF[s:action(r, i - 1).type] end
    local x = ranks[r + 1]
    lu.assertAlmostEquals(x.busy, busy, 1e-9, what .. ", rank " .. r)
    lu.assertAlmostEquals(x.bubble, res:makespan() - busy, 1e-9, what .. ", rank " .. r)
    lu.assertTrue(x.bubble >= -1e-9, what)
    worst = math.max(worst, x.bubble)
  end
  lu.assertAlmostEquals(res:max_bubble(), worst, 1e-9, what)

  -- CSV round trip: same actions per rank
  local c, cerr = schedule.from_csv_text(s:to_csv(), what)
  lu.assertNotNil(c, what .. ": from_csv: " .. tostring(cerr))
  assert_same_actions(s, c, what .. ", csv")
  lu.assertTrue(c:validate(), what .. ", csv")

  -- JSON round trip: same name, placement, routes and actions
  local j, jerr = schedule.from_json(s:to_json(), what)
  lu.assertNotNil(j, what .. ": from_json: " .. tostring(jerr))
  assert_same_actions(s, j, what .. ", json")
  lu.assertEquals(j:info().name, info.name, what)
  for v = 0, info.vstages - 1 do
    lu.assertEquals({ j:vstage(v) }, { s:vstage(v) }, what .. ", virtual stage " .. v)
  end
  for mb = 0, info.microbatches - 1 do
    lu.assertEquals(j:route(mb), s:route(mb), what .. ", mb " .. mb)
  end
end

-- draw every case up front, in a fixed order, so a seed names the same cases
-- whichever tests run
for _, name in ipairs(schedules.list()) do
  local cases = {}
  for i = 1, PER_FAMILY do cases[i] = gen[name]() end
  _G["test_sweep_" .. name] = function()
    for _, opts in ipairs(cases) do check(name, opts) end
  end
end

os.exit(lu.LuaUnit.run())
