-- The built-in schedule families (lua/luapipe/schedules/): placement, op
-- order, memory, bubbles, error messages, and DualPipe's properties from
-- specs/dualpipe.md (worked example, mirror symmetry, DualPipeV = DualPipe
-- cut in half).
local lu = require("luaunit")
local schedule = require("luapipe.schedule")
local schedules = require("luapipe.schedules")

local COST = { F = 1, B = 2, I = 1, W = 1, FB = 3, latency = 0 }

-- ---- helpers ----

local function build(name, opts) return schedules[name](opts) end

local function joined(s, r) return table.concat(s:actions(r), " ") end

-- error text of f(...) without the "file:line: " prefix
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local error_of = dofile(here .. "errors.lua").error_of

-- Reference simulator: an INDEPENDENT CROSS-CHECK of s:simulate, written
-- from the definitions only (every action starts when its rank is free and
-- its inputs are done; zero latency). Returns {makespan, busy[r], live[r]}
-- or nil, "deadlock ...".
local function reference_simulate(s, cost)
  local info = s:info()
  local pos = {} -- pos[mb][vstage] = index in the route
  local route = {}
  for mb = 0, info.microbatches - 1 do
    route[mb], pos[mb] = s:route(mb), {}
    for i, v in ipairs(route[mb]) do pos[mb][v] = i end
  end
  local done = {} -- "F:v:mb" (forward), "G:v:mb" (input-grad) -> finish time
  local function key(kind, v, mb) return kind .. ":" .. v .. ":" .. mb end
  local function deps(kind, v, mb, out)
    local rt, i = route[mb], pos[mb][v]
    if kind == "F" then
      if i > 1 then out[#out + 1] = key("F", rt[i - 1], mb) end
    elseif kind == "W" then
      out[#out + 1] = key("G", v, mb)
    else -- B or I
      out[#out + 1] = key("F", v, mb)
      if i < #rt then out[#out + 1] = key("G", rt[i + 1], mb) end
    end
    return out
  end
  local lists, at, clock, busy, live, peak = {}, {}, {}, {}, {}, {}
  local left = 0
  for r = 0, info.ranks - 1 do
    lists[r] = {}
    for i = 1, s:count(r) do lists[r][i] = s:action(r, i - 1) end
    at[r], clock[r], busy[r], live[r], peak[r] = 1, 0, 0, 0, 0
    left = left + #lists[r]
  end
  while left > 0 do
    local progress = false
    for r = 0, info.ranks - 1 do
      while lists[r][at[r]] do
        local a = lists[r][at[r]]
        local ds, c = {}, nil
        if a.type == "FB" then
          deps("F", a.stage, a.mb, ds)
          deps(a.btype, a.bstage, a.bmb, ds)
          c = cost.FB
        else
          deps(a.type, a.stage, a.mb, ds)
          c = cost[a.type]
        end
        local start, ready = clock[r], true
        for _, d in ipairs(ds) do
          if not done[d] then ready = false; break end
          start = math.max(start, done[d])
        end
        if not ready then break end
        local fin = start + c
        clock[r], busy[r] = fin, busy[r] + c
        if a.type == "F" or a.type == "FB" then
          done[key("F", a.stage, a.mb)] = fin
          live[r] = live[r] + 1
          peak[r] = math.max(peak[r], live[r])
        end
        local bt = a.type == "FB" and a.btype or a.type
        if bt == "B" or bt == "I" then
          done[key("G", a.type == "FB" and a.bstage or a.stage, a.type == "FB" and a.bmb or a.mb)] = fin
          live[r] = live[r] - 1
        end
        at[r], left, progress = at[r] + 1, left - 1, true
      end
    end
    if not progress then return nil, "deadlock" end
  end
  local makespan = 0
  for r = 0, info.ranks - 1 do makespan = math.max(makespan, clock[r]) end
  return { makespan = makespan, busy = busy, peak_live = peak }
end

-- every (virtual stage, mb) of every route: one F, one B or I, a W per I
local function assert_complete(s, what)
  local info = s:info()
  local n = {}
  local function add(k) n[k] = (n[k] or 0) + 1 end
  for r = 0, info.ranks - 1 do
    for i = 1, s:count(r) do
      local a = s:action(r, i - 1)
      if a.type == "FB" then
        add("F" .. a.stage .. ":" .. a.mb)
        add("G" .. a.bstage .. ":" .. a.bmb)
      elseif a.type == "F" then
        add("F" .. a.stage .. ":" .. a.mb)
      elseif a.type == "B" then
        add("G" .. a.stage .. ":" .. a.mb)
      elseif a.type == "I" then
        add("G" .. a.stage .. ":" .. a.mb); add("I" .. a.stage .. ":" .. a.mb)
      elseif a.type == "W" then
        add("W" .. a.stage .. ":" .. a.mb)
      end
    end
  end
  for mb = 0, info.microbatches - 1 do
    for _, v in ipairs(s:route(mb)) do
      local k = v .. ":" .. mb
      lu.assertEquals(n["F" .. k], 1, what .. ": forwards of " .. k)
      lu.assertEquals(n["G" .. k], 1, what .. ": backwards of " .. k)
      lu.assertEquals(n["W" .. k], n["I" .. k], what .. ": W per I of " .. k)
    end
  end
end

-- a representative (valid) set of parameters per family
local CASES = {
  { "gpipe", { pp = 4, microbatches = 6 } },
  { "1f1b", { pp = 4, microbatches = 8 } },
  { "1f1b", { pp = 5, microbatches = 3 } },
  { "interleaved1f1b", { pp = 4, microbatches = 8, chunks = 2 } },
  { "interleaved1f1b", { pp = 3, microbatches = 6, chunks = 3 } },
  { "interleaved1f1b", { pp = 8, microbatches = 20 } },
  { "zb1p", { pp = 4, microbatches = 8 } },
  { "zb1p", { pp = 6, microbatches = 4 } },
  { "zbv", { pp = 4, microbatches = 8 } },
  { "zbv", { pp = 4, microbatches = 3 } },
  { "dualpipe", { pp = 4, microbatches = 8 } },
  { "dualpipe", { pp = 6, microbatches = 14 } },
  { "dualpipev", { pp = 4, microbatches = 8 } },
  { "dualpipev", { pp = 3, microbatches = 9 } },
}

-- ---- the registry ----

function test_list_and_lazy_builders()
  lu.assertEquals(schedules.list(),
    { "gpipe", "1f1b", "interleaved1f1b", "zb1p", "zbv", "dualpipe", "dualpipev", "chimera" })
  table.insert(schedules.list(), "x") -- a copy: the registry is unchanged
  lu.assertEquals(#schedules.list(), 8)
  for _, name in ipairs(schedules.list()) do
    lu.assertIsFunction(schedules[name], name)
    lu.assertIs(schedules[name], require("luapipe.schedules." .. name))
  end
  lu.assertNil(schedules.nosuch)
  lu.assertEquals(schedules.list(), schedule.families)
end

function test_build_by_name_and_alias()
  lu.assertEquals(schedule.build("zb-h1", { pp = 2, microbatches = 2 }):info().name, "zb1p")
  lu.assertEquals(schedule.build("dualpipe-v", { pp = 2, microbatches = 4 }):info().name, "dualpipev")
  local s = schedules.gpipe { pp = 2, microbatches = 2, name = "mine" }
  lu.assertEquals(s:info().name, "mine")
end

-- ---- placement and routes ----

local function assert_placement(s, expect) -- expect[v+1] = {stage, rank}
  lu.assertEquals(s:info().vstages, #expect)
  for v = 0, #expect - 1 do
    local st, rk = s:vstage(v)
    lu.assertEquals({ st, rk }, expect[v + 1], "virtual stage " .. v)
  end
end

local function seq(a, b)
  local t = {}
  for i = a, b do t[#t + 1] = i end
  return t
end

function test_placement_one_stage_per_rank()
  for _, name in ipairs { "gpipe", "1f1b", "zb1p" } do
    local s = build(name, { pp = 4, microbatches = 5 })
    local i = s:info()
    lu.assertEquals({ i.ranks, i.stages, i.microbatches }, { 4, 4, 5 })
    assert_placement(s, { { 0, 0 }, { 1, 1 }, { 2, 2 }, { 3, 3 } })
    for mb = 0, 4 do lu.assertEquals(s:route(mb), seq(0, 3)) end
  end
end

function test_placement_interleaved()
  local s = schedules.interleaved1f1b { pp = 3, microbatches = 6, chunks = 3 }
  lu.assertEquals(s:info().stages, 9)
  local expect = {}
  for k = 0, 8 do expect[k + 1] = { k, k % 3 } end
  assert_placement(s, expect)
  lu.assertEquals(s:route(5), seq(0, 8))
  -- chunks defaults to 2
  lu.assertEquals(schedules.interleaved1f1b { pp = 4, microbatches = 4 }:info().stages, 8)
end

function test_placement_v_shape()
  for _, name in ipairs { "zbv", "dualpipev" } do
    local s = build(name, { pp = 3, microbatches = 6 })
    lu.assertEquals(s:info().stages, 6)
    assert_placement(s, { { 0, 0 }, { 1, 1 }, { 2, 2 }, { 3, 2 }, { 4, 1 }, { 5, 0 } })
    for mb = 0, 5 do lu.assertEquals(s:route(mb), seq(0, 5)) end
  end
end

function test_placement_dualpipe()
  local s = schedules.dualpipe { pp = 4, microbatches = 8 }
  lu.assertEquals(s:info().stages, 4)
  assert_placement(s, { { 0, 0 }, { 1, 1 }, { 2, 2 }, { 3, 3 }, { 0, 3 }, { 1, 2 }, { 2, 1 }, { 3, 0 } })
  for mb = 0, 3 do lu.assertEquals(s:route(mb), { 0, 1, 2, 3 }) end
  for mb = 4, 7 do lu.assertEquals(s:route(mb), { 4, 5, 6, 7 }) end
end

-- ---- completeness, counts, validation ----

function test_every_case_complete_and_valid()
  for _, c in ipairs(CASES) do
    local s = build(c[1], c[2])
    local what = string.format("%s pp=%d M=%d", c[1], c[2].pp, c[2].microbatches)
    assert_complete(s, what)
    local ok, err = s:validate()
    lu.assertTrue(ok, what .. ": " .. tostring(err))
    lu.assertNotNil(reference_simulate(s, COST), what .. ": deadlock")
  end
end

function test_action_counts()
  local P, M = 4, 8
  for r = 0, P - 1 do
    lu.assertEquals(schedules.gpipe { pp = P, microbatches = M }:count(r), 2 * M)
    lu.assertEquals(schedules["1f1b"] { pp = P, microbatches = M }:count(r), 2 * M)
    lu.assertEquals(schedules.zb1p { pp = P, microbatches = M }:count(r), 3 * M)
    lu.assertEquals(schedules.interleaved1f1b { pp = P, microbatches = M, chunks = 3 }:count(r), 2 * M * 3)
    lu.assertEquals(schedules.zbv { pp = P, microbatches = M }:count(r), 2 * 3 * M)
  end
  -- DualPipe/V: per rank, pairs FB = 2(N-2H+h+1) - middle + (H-h-1), and
  -- I = W = 2H-h-1 (steps 3, 6, 7); every F and backward once.
  for _, c in ipairs { { "dualpipe", 8, 20 }, { "dualpipe", 4, 8 }, { "dualpipev", 4, 10 }, { "dualpipev", 1, 2 } } do
    local name, P, M = c[1], c[2], c[3]
    local s = build(name, { pp = P, microbatches = M })
    local H = name == "dualpipe" and P // 2 or P
    local N = name == "dualpipe" and M // 2 or M
    for r = 0, P - 1 do
      local h = name == "dualpipe" and math.min(r, P - 1 - r) or r
      local n = { F = 0, B = 0, I = 0, W = 0, FB = 0 }
      for i = 1, s:count(r) do
        local t = s:action(r, i - 1).type
        n[t] = n[t] + 1
      end
      local fb = 2 * (N - 2 * H + h + 1) - (h == H - 1 and 1 or 0) + (H - h - 1)
      local what = string.format("%s P=%d M=%d rank %d", name, P, M, r)
      lu.assertEquals(n.FB, fb, what .. " FB")
      lu.assertEquals(n.I, 2 * H - h - 1, what .. " I")
      lu.assertEquals(n.W, n.I, what .. " W")
      lu.assertEquals(n.F + n.FB, 2 * N, what .. " forwards")
      lu.assertEquals(n.B + n.I + n.FB, 2 * N, what .. " backwards")
    end
  end
end

-- ---- op order: small cases written out by hand from the sources ----

function test_1f1b_order()
  local s = schedules["1f1b"] { pp = 3, microbatches = 4 }
  lu.assertEquals(joined(s, 0), "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3")
  lu.assertEquals(joined(s, 1), "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3")
  lu.assertEquals(joined(s, 2), "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3")
end

function test_gpipe_order()
  local s = schedules.gpipe { pp = 2, microbatches = 3 }
  lu.assertEquals(joined(s, 0), "0F0 0F1 0F2 0B0 0B1 0B2")
  lu.assertEquals(joined(s, 1), "1F0 1F1 1F2 1B0 1B1 1B2")
end

-- Megatron's get_model_chunk_id with P = 2, v = 2, M = 4
function test_interleaved_order()
  local s = schedules.interleaved1f1b { pp = 2, microbatches = 4, chunks = 2 }
  lu.assertEquals(joined(s, 0), "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3")
  lu.assertEquals(joined(s, 1), "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3")
end

-- ZB-H1: rank r defers its first r W's
function test_zb1p_order()
  local s = schedules.zb1p { pp = 3, microbatches = 4 }
  lu.assertEquals(joined(s, 0), "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3")
  lu.assertEquals(joined(s, 1), "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3")
  lu.assertEquals(joined(s, 2), "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3")
end

-- PyTorch's ScheduleZBVZeroBubble, P = 2, M = 4, and P = 2, M = 2 (padded to 3)
function test_zbv_order()
  local s = schedules.zbv { pp = 2, microbatches = 4 }
  lu.assertEquals(joined(s, 0), "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 "
    .. "0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3")
  lu.assertEquals(joined(s, 1), "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 "
    .. "2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3")
  s = schedules.zbv { pp = 2, microbatches = 2 }
  lu.assertEquals(joined(s, 0), "0F0 0F1 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 0I1 0W1")
  lu.assertEquals(joined(s, 1), "1F0 2F0 1F1 2F1 2I0 2W0 1I0 1W0 2I1 2W1 1I1 1W1")
end

-- ---- DualPipe / DualPipeV (specs/dualpipe.md) ----

local WORKED = {
  [0] = "0F0 0F1 0F2 7F4 7I4 7W4 7F5 (0F3;7B5)OVERLAP_F_B (7F6;0B0)OVERLAP_F_B "
      .. "7B6 (7F7;0B1)OVERLAP_F_B 7B7 0I2 0W2 0I3 0W3",
  [1] = "1F0 6F4 1F1 6F5 1F2 6B4 (6F6;1B0)OVERLAP_F_B (1F3;6B5)OVERLAP_F_B "
      .. "(6F7;1B1)OVERLAP_F_B 6B6 1B2 6I7 1I3 6W7 1W3",
  -- the mirror images of ranks 1 and 0 (virtual stage v <-> v+P mod 2P,
  -- micro-batch m <-> m+M/2 mod M)
  [2] = "5F4 2F0 5F5 2F1 5F6 2B0 (2F2;5B4)OVERLAP_F_B (5F7;2B1)OVERLAP_F_B "
      .. "(2F3;5B5)OVERLAP_F_B 2B2 5B6 2I3 5I7 2W3 5W7",
  [3] = "4F4 4F5 4F6 3F0 3I0 3W0 3F1 (4F7;3B1)OVERLAP_F_B (3F2;4B4)OVERLAP_F_B "
      .. "3B2 (3F3;4B5)OVERLAP_F_B 3B3 4I6 4W6 4I7 4W7",
}

function test_dualpipe_worked_example()
  local s = schedules.dualpipe { pp = 4, microbatches = 8 }
  for r = 0, 3 do lu.assertEquals(joined(s, r), WORKED[r], "rank " .. r) end
end

-- rewrites every action's virtual stages and micro-batches
local function renamed(s, r, fv, fm)
  local out = {}
  for i = 1, s:count(r) do
    local a = s:action(r, i - 1)
    if a.type == "FB" then
      out[i] = string.format("(%dF%d;%d%s%d)OVERLAP_F_B", fv(a.stage), fm(a.mb), fv(a.bstage), a.btype,
        fm(a.bmb))
    else
      out[i] = string.format("%d%s%d", fv(a.stage), a.type, fm(a.mb))
    end
  end
  return table.concat(out, " ")
end

function test_dualpipe_mirror_symmetry()
  for _, c in ipairs { { 2, 4 }, { 4, 8 }, { 4, 14 }, { 6, 12 }, { 8, 20 }, { 10, 24 } } do
    local P, M = c[1], c[2]
    local s = schedules.dualpipe { pp = P, microbatches = M }
    for r = 0, P - 1 do
      lu.assertEquals(joined(s, P - 1 - r),
        renamed(s, r, function(v) return (v + P) % (2 * P) end,
          function(m) return (m + M // 2) % M end),
        string.format("P=%d M=%d rank %d mirrors rank %d", P, M, P - 1 - r, r))
    end
  end
end

-- DualPipe on 2P ranks and 2M micro-batches, rank r < P, holds virtual
-- stages r (down, micro-batches 0..M-1) and 4P-1-r (model stage 2P-1-r, up,
-- micro-batches M..2M-1); DualPipeV's rank r holds stages r and 2P-1-r, each
-- seeing micro-batches 0..M-1. Renaming v >= 2P to v-2P and m to m mod M
-- maps one onto the other.
function test_dualpipev_is_dualpipe_cut_in_half()
  for _, c in ipairs { { 1, 2 }, { 2, 4 }, { 3, 7 }, { 4, 8 }, { 4, 11 }, { 8, 16 } } do
    local P, M = c[1], c[2]
    local v = schedules.dualpipev { pp = P, microbatches = M }
    local d = schedules.dualpipe { pp = 2 * P, microbatches = 2 * M }
    for r = 0, P - 1 do
      lu.assertEquals(joined(v, r),
        renamed(d, r, function(x) return x < 2 * P and x or x - 2 * P end,
          function(m) return m % M end),
        string.format("P=%d M=%d rank %d", P, M, r))
    end
  end
end

-- ---- memory (s:memory, the C accounting) ----

local function peaks(s, field)
  local t = {}
  for r = 0, s:info().ranks - 1 do t[r + 1] = s:memory(r)[field] end
  return t
end

local function filled(n, x)
  local t = {}
  for i = 1, n do t[i] = x end
  return t
end

function test_memory_1f1b_gpipe_zb1p()
  for _, c in ipairs { { 8, 20 }, { 4, 8 }, { 5, 3 }, { 1, 4 } } do
    local P, M = c[1], c[2]
    local f = schedules["1f1b"] { pp = P, microbatches = M }
    local expect = {}
    for r = 0, P - 1 do expect[r + 1] = math.min(P - r, M) end
    lu.assertEquals(peaks(f, "peak_live"), expect, "1f1b")
    lu.assertEquals(peaks(f, "param_stages"), filled(P, 1))
    -- ZB-H1 keeps 1F1B's activations; the W's held bring every rank to 1F1B's peak
    local z = schedules.zb1p { pp = P, microbatches = M }
    lu.assertEquals(peaks(z, "peak_live"), expect, "zb1p")
    lu.assertEquals(peaks(z, "peak_total"), filled(P, math.min(P, M)), "zb1p total")
    lu.assertEquals(peaks(schedules.gpipe { pp = P, microbatches = M }, "peak_live"), filled(P, M))
  end
end

function test_memory_interleaved()
  local P, M, v = 4, 8, 2
  local s = schedules.interleaved1f1b { pp = P, microbatches = M, chunks = v }
  local expect = {}
  for r = 0, P - 1 do expect[r + 1] = math.min((P - r - 1) * 2 + (v - 1) * P + 1, M * v) end
  lu.assertEquals(peaks(s, "peak_live"), expect)
  lu.assertEquals(peaks(s, "param_stages"), filled(P, v))
end

function test_memory_dualpipe_uniform()
  for _, c in ipairs { { 4, 8 }, { 8, 20 }, { 6, 30 } } do
    local P, M = c[1], c[2]
    local s = schedules.dualpipe { pp = P, microbatches = M }
    lu.assertEquals(peaks(s, "peak_live"), filled(P, P + 1), "dualpipe P=" .. P)
    lu.assertEquals(peaks(s, "param_stages"), filled(P, 2))
  end
  for _, c in ipairs { { 4, 8 }, { 8, 16 }, { 3, 10 } } do
    local P, M = c[1], c[2]
    local s = schedules.dualpipev { pp = P, microbatches = M }
    lu.assertEquals(peaks(s, "peak_live"), filled(P, 2 * P + 1), "dualpipev P=" .. P)
    lu.assertEquals(peaks(s, "param_stages"), filled(P, 2))
  end
end

function test_memory_zbv()
  -- 2P half-size chunks on every rank (= 1F1B's P stages) once M >= 2P-1
  for _, c in ipairs { { 4, 12 }, { 3, 5 }, { 6, 11 }, { 1, 1 } } do
    local P, M = c[1], c[2]
    local s = schedules.zbv { pp = P, microbatches = M }
    lu.assertEquals(peaks(s, "peak_live"), filled(P, 2 * P), "zbv P=" .. P .. " M=" .. M)
    lu.assertEquals(peaks(s, "param_stages"), filled(P, 2))
  end
end

-- ---- bubbles (s:simulate) ----

local function sim(s, cost)
  local res, err = s:simulate(cost)
  lu.assertNotNil(res, tostring(err))
  return res
end

function test_bubbles_match_the_published_numbers()
  local P, M = 8, 20
  lu.assertAlmostEquals(sim(schedules["1f1b"] { pp = P, microbatches = M }, COST):max_bubble(), 21, 1e-9)
  lu.assertAlmostEquals(sim(schedules.zb1p { pp = P, microbatches = M }, COST):max_bubble(), 7, 1e-9)
  lu.assertAlmostEquals(sim(schedules.dualpipe { pp = P, microbatches = M }, COST):max_bubble(), 6, 1e-9)
  local c25 = { F = 1, B = 2, I = 1, W = 1, FB = 2.5, latency = 0 }
  lu.assertAlmostEquals(sim(schedules.dualpipe { pp = P, microbatches = M }, c25):max_bubble(), 4.5, 1e-9)
  lu.assertAlmostEquals(sim(schedules.dualpipev { pp = P, microbatches = 16 }, COST):max_bubble(), 14, 1e-9)
end

function test_bubble_formulas_across_sizes()
  for _, c in ipairs { { 4, 8 }, { 4, 12 }, { 6, 18 }, { 8, 32 } } do
    local P, M = c[1], c[2]
    local what = string.format("P=%d M=%d", P, M)
    lu.assertAlmostEquals(sim(schedules["1f1b"] { pp = P, microbatches = M }, COST):max_bubble(),
      (P - 1) * 3, 1e-9, "1f1b " .. what)
    lu.assertAlmostEquals(sim(schedules.zb1p { pp = P, microbatches = M }, COST):max_bubble(),
      (P - 1) * (1 + 2 - 2), 1e-9, "zb1p " .. what)
    lu.assertAlmostEquals(sim(schedules.dualpipe { pp = P, microbatches = M }, COST):max_bubble(),
      (P / 2 - 1) * (3 + 2 - 3), 1e-9, "dualpipe " .. what)
  end
end

function test_simulated_peaks_and_ranks()
  local P = 8
  local res = sim(schedules.dualpipe { pp = P, microbatches = 20 }, COST)
  local ranks = res:ranks()
  lu.assertEquals(#ranks, P)
  for i, x in ipairs(ranks) do
    lu.assertEquals(x.rank, i - 1)
    lu.assertEquals(x.peak_live, P + 1)
    lu.assertAlmostEquals(x.bubble, res:makespan() - x.busy, 1e-9)
    lu.assertTrue(x.bubble <= res:max_bubble() + 1e-9)
  end
end

-- s:simulate against the reference simulator above, every family
function test_simulate_agrees_with_reference()
  local cases = {}
  for _, c in ipairs(CASES) do cases[#cases + 1] = c end
  for _, name in ipairs(schedules.list()) do cases[#cases + 1] = { name, { pp = 8, microbatches = 24 } } end
  for _, c in ipairs(cases) do
    local s = build(c[1], c[2])
    local what = string.format("%s pp=%d M=%d", c[1], c[2].pp, c[2].microbatches)
    for _, cost in ipairs { COST, { F = 1, B = 2, I = 1, W = 1, FB = 2.5, latency = 0 },
      { F = 1, B = 3, I = 1.5, W = 1.5, FB = 3.5, latency = 0 } } do
      local ref = assert(reference_simulate(s, cost))
      local res = sim(s, cost)
      lu.assertAlmostEquals(res:makespan(), ref.makespan, 1e-9, what)
      for i, x in ipairs(res:ranks()) do
        lu.assertAlmostEquals(x.busy, ref.busy[i - 1], 1e-9, what)
        lu.assertEquals(x.peak_live, ref.peak_live[i - 1], what)
      end
    end
  end
end

-- ---- errors ----

function test_errors_common()
  for _, name in ipairs(schedules.list()) do
    lu.assertEquals(error_of(schedules[name]), name .. ": expects a table of options {pp = <ranks>, microbatches = <count>}")
    lu.assertEquals(error_of(schedules[name], { microbatches = 8 }), name .. ": pp must be a positive integer, got nil")
    lu.assertEquals(error_of(schedules[name], { pp = 0, microbatches = 8 }), name .. ": pp must be a positive integer, got 0")
    lu.assertEquals(error_of(schedules[name], { pp = 2.5, microbatches = 8 }), name .. ": pp must be a positive integer, got 2.5")
    lu.assertEquals(error_of(schedules[name], { pp = 2, microbatches = -1 }),
      name .. ": microbatches must be a positive integer, got -1")
    lu.assertEquals(error_of(schedules[name], { pp = 2, microbatches = "8" }),
      name .. ": microbatches must be a positive integer, got 8")
  end
end

function test_errors_dualpipe()
  lu.assertEquals(error_of(schedules.dualpipe, { pp = 3, microbatches = 8 }), "dualpipe: pp must be even, got 3")
  lu.assertEquals(error_of(schedules.dualpipe, { pp = 4, microbatches = 9 }), "dualpipe: microbatches must be even, got 9")
  lu.assertEquals(error_of(schedules.dualpipe, { pp = 4, microbatches = 6 }),
    "dualpipe: microbatches must be at least 2*pp = 8, got 6")
  lu.assertEquals(error_of(schedules.dualpipev, { pp = 4, microbatches = 7 }),
    "dualpipev: microbatches must be at least 2*pp = 8, got 7")
  -- the smallest legal sizes build
  lu.assertEquals(schedules.dualpipe { pp = 2, microbatches = 4 }:info().ranks, 2)
  lu.assertEquals(schedules.dualpipev { pp = 1, microbatches = 2 }:info().ranks, 1)
end

-- the families' constraints as data: what luapipe.train words in ranks
-- (the builders raise the same text; test_errors_dualpipe)
function test_problem_fields()
  lu.assertEquals(schedules.problem("dualpipe", 3, 8), { family = "dualpipe", label = "DualPipe",
    field = "pp", rule = "even", need = 2, got = 3, text = "pp must be even, got 3" })
  lu.assertEquals(schedules.problem("DualPipe", 4, 9).text, "microbatches must be even, got 9")
  lu.assertEquals(schedules.problem("dualpipe-v", 4, 7), { family = "dualpipev", label = "DualPipeV",
    field = "microbatches", rule = "at_least", need = 8, per_pp = 2, got = 7,
    text = "microbatches must be at least 2*pp = 8, got 7" })
  lu.assertEquals(schedules.problem("chimera", 4, 6), { family = "chimera", label = "Chimera",
    field = "microbatches", rule = "multiple_of", need = 4, got = 6,
    text = "microbatches must be a multiple of pp = 4, got 6" })
  lu.assertEquals(error_of(schedules.chimera, { pp = 4, microbatches = 6 }),
    "chimera: microbatches must be a multiple of pp = 4, got 6")
  lu.assertNil(schedules.problem("dualpipe", 2, 4))
  lu.assertNil(schedules.problem("1f1b", 3, 1)) -- no constraint beyond positive counts
  lu.assertNil(schedules.problem("nosuchfamily", 3, 1))
end

function test_errors_interleaved()
  lu.assertEquals(error_of(schedules.interleaved1f1b, { pp = 4, microbatches = 8, chunks = 1 }),
    "interleaved1f1b: chunks must be an integer >= 2 (use 1f1b for one chunk), got 1")
  lu.assertEquals(error_of(schedules.interleaved1f1b, { pp = 4, microbatches = 8, chunks = "2" }),
    "interleaved1f1b: chunks must be an integer >= 2 (use 1f1b for one chunk), got 2")
  lu.assertEquals(error_of(schedules.interleaved1f1b, { pp = 4, microbatches = 9 }),
    "interleaved1f1b: 9 micro-batches do not split into groups of equal size >= pp = 4 "
    .. "(9 // 4 = 2 groups); use a multiple of 2 such as 8 or 10, or any multiple of pp")
  -- fewer micro-batches than ranks, or a multiple of the groups, is fine
  lu.assertEquals(schedules.interleaved1f1b { pp = 4, microbatches = 3 }:count(0), 12)
  lu.assertEquals(schedules.interleaved1f1b { pp = 8, microbatches = 20 }:count(0), 80)
end

function test_error_is_raised_at_the_caller()
  local ok, err = pcall(function()
    local s = schedules.dualpipe { pp = 3, microbatches = 8 } -- not a tail call: keeps the line
    return s
  end)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "test_schedules.lua:")
  lu.assertEquals(select(2, schedule.load("dualpipe", { pp = 3, microbatches = 8 })),
    "dualpipe: pp must be even, got 3")
end

os.exit(lu.LuaUnit.run())
