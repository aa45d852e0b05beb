-- test_search.lua — luapipe.search: every found schedule validates, lowers
-- and simulates to the figures the search reports; memory limits hold;
-- Zero Bubble's ZB-H2 and ZB-V are rediscovered without their families;
-- the lower bound never exceeds an exact optimum found by enumerating every
-- per-rank order; bad options give one clear error.
local lu = require("luaunit")
local core = require("luapipe.core")
local search = require("luapipe.search")
local schedule = require("luapipe.schedule")

local function scaled_cost(c, f)
  return { F = c.F * f, B = c.B * f, I = c.I * f, W = c.W * f, FB = c.FB and c.FB * f,
    latency = c.latency }
end

-- checks a result against its schedule: validates, lowers, simulates to the
-- reported makespan and span, peak memory as reported and within the limit
local function check(r, opts)
  local s = r:schedule()
  lu.assertTrue(s:validate())
  local lowered = assert(s:lower())
  lu.assertTrue(lowered:validate { sends = "rendezvous" })
  local info = s:info()
  local f = opts.pp / info.stages
  local res = assert(s:simulate(scaled_cost(r.cost, f)))
  lu.assertAlmostEquals(res:makespan(), r:makespan(), 1e-6)
  local first = {}
  for _, e in ipairs(res:events()) do
    if not first[e.rank] or e.start < first[e.rank] then first[e.rank] = e.start end
  end
  local span = 0
  for _, rk in ipairs(res:ranks()) do span = math.max(span, rk.finish - (first[rk.rank] or 0)) end
  lu.assertAlmostEquals(span, r:span(), 1e-6)
  local act = {}
  for k = 1, info.stages do act[k] = f end
  local peak = core.schedule_peak(s, act, opts.w_share or 0)
  local rep = r:peak_memory()
  for i = 1, opts.pp do
    lu.assertAlmostEquals(peak[i], rep[i], 1e-9, "rank " .. (i - 1))
    if opts.memory then lu.assertTrue(peak[i] <= opts.memory + 1e-9, "rank " .. (i - 1) .. " over the limit") end
  end
  lu.assertTrue(r:lower_bound() <= r:objective() + 1e-9, string.format("bound %g above found %g (%s)", r:lower_bound(), r:objective(), require("luapipe.json").encode(opts.placement or "linear") .. " " .. tostring(opts.cost) .. " mem " .. tostring(opts.memory) .. " w " .. tostring(opts.w_share) .. " " .. tostring(opts.objective) .. " " .. tostring(opts.split)))
  lu.assertTrue(r:gap() >= 0)
  return s, res
end

TestSearchValid = {}

function TestSearchValid:test_many_settings()
  local placements = { "linear", "v", "interleaved:2", "bidirectional", { 0, 1, 1, 0 } }
  local costs = { "F=1,B=2,W=1", "F=1,B=2,W=1,FB=2.4", "F=2,B=3,W=1,latency=0.5" }
  local n = 0
  for pi, pl in ipairs(placements) do
    for ci, c in ipairs(costs) do
      for _, mem in ipairs { false, 3, 6 } do
        for _, w in ipairs { 0, 0.5 } do
          n = n + 1
          local opts = { pp = 4, microbatches = 6, cost = c, memory = mem or nil, w_share = w,
            placement = pl, objective = (n % 2 == 0) and "span" or "makespan", time = 0.02,
            seed = n, progress = false, split = ({ "auto", "always", "never" })[n % 3 + 1] }
          if type(pl) == "table" then opts.pp = 2 end
          local r, err = search.search(opts)
          lu.assertNotNil(r, string.format("placement %d cost %d: %s", pi, ci, tostring(err)))
          check(r, opts)
        end
      end
    end
  end
end

function TestSearchValid:test_found_schedule_exports_csv()
  local r = assert(search.search { pp = 4, microbatches = 8, cost = "F=1,B=2,W=1,FB=2.2",
    memory = 4, placement = "v", time = 0.1, progress = false })
  local s = r:schedule()
  local back = assert(schedule.from_csv_text(s:to_csv(), "found.csv"))
  lu.assertEquals(back:to_csv(), s:to_csv())
  lu.assertTrue(back:validate())
end

function TestSearchValid:test_custom_objective_and_generator()
  local calls = 0
  -- a placement of our own (a "W": 0 1 1 0 for 2 ranks) and an objective
  -- that weighs the worst rank's idle time
  local r = assert(search.search { pp = 2, microbatches = 4, cost = "F=1,B=2,W=1",
    placement = function(pp) return { 0, 1, 1, 0 } end, time = 0.05, progress = false,
    objective = function(e)
      calls = calls + 1
      local idle = 0
      for _, rk in ipairs(e.ranks) do idle = math.max(idle, e.makespan - rk.busy) end
      return e.makespan + idle
    end })
  lu.assertTrue(calls > 10)
  lu.assertEquals(r.placement_name, "custom")
  check(r, { pp = 2 })
end

function TestSearchValid:test_priority_function_seed()
  -- 1F1B-like priorities of our own: backward before forward, older first
  local seen = 0
  local opts = { pp = 4, microbatches = 8, cost = "F=1,B=2,W=1", memory = 4, time = 0, progress = false,
    families = false, split = "never",
    priority = function(a)
      seen = seen + 1
      return (a.kind == "F" and 1 or 0) * 1000 + a.mb
    end }
  local r = assert(search.search(opts))
  lu.assertEquals(seen, 4 * 8 * 3)
  check(r, opts)
  lu.assertEquals(r:makespan(), 33) -- 1F1B's (M + P - 1)(F + B), the bound
  lu.assertEquals(r.stats.label, "seed: priority function") -- decoded first, never beaten
  local r2, err = search.search { pp = 2, microbatches = 2, progress = false,
    priority = function() return "soon" end }
  lu.assertNil(r2)
  lu.assertStrContains(err, "priority must return a number, got string for F of micro-batch 0 on virtual stage 0")
end

function TestSearchValid:test_objective_error_is_reported()
  local r, err = search.search { pp = 2, microbatches = 2, time = 0.05, progress = false,
    objective = function() error("boom") end }
  lu.assertNil(r)
  lu.assertStrContains(err, "boom")
end

function TestSearchValid:test_any_placement()
  local opts = { pp = 4, microbatches = 8, cost = "F=1,B=2,W=1,FB=2.2", memory = 4, placement = "any",
    time = 0.4, progress = false }
  local r = assert(search.search(opts))
  check(r, opts)
  -- no single placement does better than "any" with its share of the time
  for _, pl in ipairs { "linear", "v", "interleaved:2", "bidirectional" } do
    local o = { pp = 4, microbatches = 8, cost = opts.cost, memory = 4, placement = pl, time = 0.02,
      progress = false }
    local one = search.search(o)
    if one then lu.assertTrue(r:objective() <= one:objective() + 1e-9, pl) end
  end
end

function TestSearchValid:test_robust_choice()
  local opts = { pp = 4, microbatches = 8, cost = "F=1,B=2,W=1,latency=0.2", memory = 5,
    w_share = 0.5, time = 0.3, progress = false, robust = { jitter = 0.1, samples = 15, candidates = 3 } }
  local r = assert(search.search(opts))
  check(r, opts)
  lu.assertEquals(r.robust.candidates, 3)
  local c = search._internal.resolve_cost(require("luapipe.sim").parse_cost(opts.cost))
  local v = search._internal.jittered(r, c, opts, 0.1, 15)
  lu.assertEquals(#v, 15)
  lu.assertAlmostEquals(r.robust.p90, v[14], 1e-9) -- ceil(0.9 * 15) = 14th of 15
  lu.assertTrue(v[1] < v[15]) -- the draws differ
end

TestSearchMemory = {}

function TestSearchMemory:test_limit_one_activation()
  -- one activation per rank: one micro-batch in flight on rank 0
  local opts = { pp = 4, microbatches = 4, cost = "F=1,B=2,W=1", memory = 1, time = 0.1,
    progress = false }
  local r = assert(search.search(opts))
  check(r, opts)
  for _, p in ipairs(r:peak_memory()) do lu.assertTrue(p <= 1 + 1e-9) end
  -- the memory-time bound: 4 micro-batches each held 4 F + 4 I on rank 0
  lu.assertTrue(r.bounds.memory_time >= 32 - 1e-9)
end

function TestSearchMemory:test_w_share_counts()
  -- with w_share = 1 a pending W holds the whole activation
  local opts = { pp = 4, microbatches = 8, cost = "F=1,B=2,W=1", memory = 4, w_share = 1,
    time = 0.1, progress = false, split = "always" }
  local r = assert(search.search(opts))
  check(r, opts)
end

function TestSearchMemory:test_limit_below_one_microbatch()
  local r, err = search.search { pp = 4, microbatches = 4, memory = 0.75, progress = false }
  lu.assertNil(r)
  lu.assertStrContains(err, "memory limit of rank 0 (0.75 activations) is less than one micro-batch needs there (1)")
  -- V placement: one micro-batch needs both halves on a rank
  r, err = search.search { pp = 4, microbatches = 4, memory = 0.75, placement = "v", progress = false }
  lu.assertNil(r)
  lu.assertStrContains(err, "less than one micro-batch needs there (1)")
end

TestSearchRediscovery = {}

-- F = B = W (I = W = 1, B = 2): span = 3M is zero bubble
function TestSearchRediscovery:test_zb_h2()
  for _, P in ipairs { 4, 8 } do
    local opts = { pp = P, microbatches = 3 * P, cost = "F=1,B=2,W=1", memory = 2 * P - 1,
      w_share = 0.5, objective = "span", time = 1, families = false, progress = false }
    local r = assert(search.search(opts))
    check(r, opts)
    lu.assertEquals(r:span(), 3 * opts.microbatches, "P=" .. P)
    lu.assertEquals(r:gap(), 0)
  end
end

function TestSearchRediscovery:test_zb_v()
  for _, P in ipairs { 4, 8 } do
    local opts = { pp = P, microbatches = 3 * P, cost = "F=1,B=2,W=1", memory = P, w_share = 0.5,
      placement = "v", objective = "span", time = 1, families = false, progress = false }
    local r = assert(search.search(opts))
    check(r, opts)
    lu.assertEquals(r:span(), 3 * opts.microbatches, "P=" .. P)
    lu.assertEquals(r:gap(), 0)
  end
end

-- Zero Bubble's own first case (auto_schedule.py): never worse than its greedy
function TestSearchRediscovery:test_zero_bubble_case()
  local opts = { pp = 4, microbatches = 12, cost = "F=5478,I=5806,W=3534,latency=200",
    memory = 16, w_share = 0.5, objective = "span", time = 0.3, progress = false }
  local r = assert(search.search(opts))
  check(r, opts)
  lu.assertTrue(r.stats.zb_greedy < math.huge)
  lu.assertTrue(r:span() <= r.stats.zb_greedy)
end

TestSearchBounds = {}

-- Every order of each rank's actions (F before its I before its W, or F
-- before B), simulated: the exact optimum of the cost model.
local function orders(items, before)
  local out, cur, used = {}, {}, {}
  local function rec()
    if #cur == #items then
      out[#out + 1] = { table.unpack(cur) }
      return
    end
    for i, it in ipairs(items) do
      if not used[i] then
        local ok = true
        for j, pre in ipairs(items) do
          if not used[j] and j ~= i and before(pre, it) then ok = false break end
        end
        if ok then
          used[i] = true
          cur[#cur + 1] = it
          rec()
          cur[#cur] = nil
          used[i] = false
        end
      end
    end
  end
  rec()
  return out
end

local function exact_optimum(P, Mb, cost, split, objective, memory, w_share)
  local per_rank = {}
  local kinds = split and { "F", "I", "W" } or { "F", "B" }
  for r = 0, P - 1 do
    local items = {}
    for m = 0, Mb - 1 do
      for k, kind in ipairs(kinds) do items[#items + 1] = { k = k, m = m, text = r .. kind .. m } end
    end
    per_rank[r] = orders(items, function(a, b) return a.m == b.m and a.k < b.k end)
  end
  local best = math.huge
  local idx = {}
  for r = 0, P - 1 do idx[r] = 1 end
  while true do
    local actions = {}
    for r = 0, P - 1 do
      local t = {}
      for i, it in ipairs(per_rank[r][idx[r]]) do t[i] = it.text end
      actions[r] = t
    end
    local s = schedule.new { ranks = P, stages = P, microbatches = Mb, actions = actions }
    local res = s:try_simulate(cost)
    if res then
      local ok = true
      if memory then
        for _, p in ipairs(core.schedule_peak(s, nil, w_share)) do ok = ok and p <= memory + 1e-9 end
      end
      if ok then
        local v = res:makespan()
        if objective == "span" then
          local first, span = {}, 0
          for _, e in ipairs(res:events()) do
            if not first[e.rank] or e.start < first[e.rank] then first[e.rank] = e.start end
          end
          for _, rk in ipairs(res:ranks()) do span = math.max(span, rk.finish - first[rk.rank]) end
          v = span
        end
        best = math.min(best, v)
      end
    end
    local r = 0
    while r < P do
      idx[r] = idx[r] + 1
      if idx[r] <= #per_rank[r] then break end
      idx[r] = 1
      r = r + 1
    end
    if r == P then break end
  end
  return best
end

function TestSearchBounds:test_bound_below_exact_optimum()
  local cases = {
    { P = 2, M = 2, cost = { F = 1, B = 2, I = 1, W = 1 }, split = true },
    { P = 2, M = 2, cost = { F = 1, B = 3, I = 2, W = 1, latency = 0.5 }, split = true },
    { P = 3, M = 2, cost = { F = 1, B = 2 }, split = false },
    { P = 2, M = 3, cost = { F = 1, B = 2 }, split = false },
    { P = 2, M = 2, cost = { F = 1, B = 2, I = 1, W = 1 }, split = true, memory = 1, w_share = 0.5 },
    { P = 2, M = 2, cost = { F = 1, B = 2, I = 1, W = 1 }, split = true, objective = "span" },
  }
  for i, c in ipairs(cases) do
    local opt = exact_optimum(c.P, c.M, c.cost, c.split, c.objective, c.memory, c.w_share)
    local r = assert(search.search { pp = c.P, microbatches = c.M, cost = c.cost, time = 0.3,
      split = c.split and "always" or "never", objective = c.objective, memory = c.memory,
      w_share = c.w_share, progress = false, pairs = false })
    lu.assertTrue(r:lower_bound() <= opt + 1e-9,
      string.format("case %d: bound %g above the optimum %g", i, r:lower_bound(), opt))
    lu.assertTrue(r:objective() <= opt * 1.01 + 1e-9,
      string.format("case %d: found %g, optimum %g", i, r:objective(), opt))
  end
end

-- Pairs on a V (P = 2: stages 0 and 3 on rank 0, 1 and 2 on rank 1), M = 2,
-- full backwards, chunk costs F = 1, B = 2, FB = 1.5: every interleaving of
-- each rank's two micro-batch chains, with every way of merging adjacent F
-- and B of different stages into an overlapped pair, simulated. The
-- warm-up bound (rank 0: its first backward starts at 4 F = 4 at the
-- earliest) must not exceed that optimum.
local function v_pairs_optimum(cost)
  local function act(kind, v, m) return { kind = kind, v = v, m = m, text = v .. kind .. m } end
  local function interleavings(a, b)
    local out = {}
    local function rec(i, j, cur)
      if i > #a and j > #b then out[#out + 1] = { table.unpack(cur) } return end
      if i <= #a then cur[#cur + 1] = a[i]; rec(i + 1, j, cur); cur[#cur] = nil end
      if j <= #b then cur[#cur + 1] = b[j]; rec(i, j + 1, cur); cur[#cur] = nil end
    end
    rec(1, 1, {})
    return out
  end
  local function pairings(order)
    local out = {}
    local function rec(i, cur)
      if i > #order then out[#out + 1] = { table.unpack(cur) } return end
      cur[#cur + 1] = order[i].text
      rec(i + 1, cur)
      cur[#cur] = nil
      local x, y = order[i], order[i + 1]
      if y and x.kind ~= y.kind and x.v ~= y.v then
        local f, b = x.kind == "F" and x or y, x.kind == "F" and y or x
        cur[#cur + 1] = string.format("(%dF%d;%dB%d)OVERLAP_F_B", f.v, f.m, b.v, b.m)
        rec(i + 2, cur)
        cur[#cur] = nil
      end
    end
    rec(1, {})
    return out
  end
  local per = {}
  for r = 0, 1 do
    local lo, hi = r == 0 and 0 or 1, r == 0 and 3 or 2
    local chains = {}
    for m = 0, 1 do chains[m + 1] = { act("F", lo, m), act("F", hi, m), act("B", hi, m), act("B", lo, m) } end
    per[r] = {}
    for _, o in ipairs(interleavings(chains[1], chains[2])) do
      for _, p in ipairs(pairings(o)) do per[r][#per[r] + 1] = p end
    end
  end
  local placement = { { stage = 0, rank = 0 }, { stage = 1, rank = 1 }, { stage = 2, rank = 1 },
    { stage = 3, rank = 0 } }
  local best, valid = math.huge, 0
  for _, a0 in ipairs(per[0]) do
    for _, a1 in ipairs(per[1]) do
      local s = schedule.new { ranks = 2, stages = 4, microbatches = 2, placement = placement,
        actions = { [0] = a0, [1] = a1 } }
      local res = s:try_simulate(cost)
      if res then
        valid = valid + 1
        best = math.min(best, res:makespan())
      end
    end
  end
  return best, valid
end

function TestSearchBounds:test_warmup_bound_below_exact_optimum_with_pairs()
  local opt, valid = v_pairs_optimum { F = 1, B = 2, FB = 1.5 }
  lu.assertTrue(valid > 100)
  lu.assertEquals(opt, 16)
  -- search times are one rank's share: a V stage gets half of F=2,B=4,FB=3
  local r = assert(search.search { pp = 2, microbatches = 2, cost = "F=2,B=4,FB=3", placement = "v",
    split = "never", time = 0.3, progress = false })
  -- rank 1: its first backward starts at 5.5 (4 F + the pair-short backward
  -- on stage 3) at the earliest, after its own 2 forwards of that micro-batch
  -- at least (unpaired, from 1); with k = 2 the other 2 forwards pair
  -- (2 x 1.5 saved of 12) and stage 0's backward (1.5) follows its last:
  -- (5.5 - 2) + 9 + 1.5 = 14
  lu.assertEquals(r.bounds.warmup, 14)
  lu.assertTrue(r:lower_bound() <= opt + 1e-9)
  lu.assertEquals(r:objective(), opt)
end

-- The warm-up bound on DualPipeV's case of scripts/bench/search (V, P = 4,
-- M = 16, F = I = W = 1, FB = 2.2, DualPipeV's 4.5 activations): rank 3
-- starts at 1.5, its first backward at 5.5, so 8 unpaired forwards (4) and
-- 24 pairs (26.4) + 8 backwards (8) leave 1.5 + 4 + 26.4 + 8 = 39.9.
function TestSearchBounds:test_warmup_bound_dualpipev_case()
  local r = assert(search.search { pp = 4, microbatches = 16, cost = "F=1,I=1,W=1,FB=2.2",
    memory = 4.5, placement = "v", time = 0.3, progress = false })
  lu.assertAlmostEquals(r.bounds.warmup, 39.9, 1e-9)
  lu.assertAlmostEquals(r:lower_bound(), 39.9, 1e-9)
  lu.assertTrue(r:objective() >= 39.9 - 1e-9)
  lu.assertTrue(r:objective() <= 40.6 + 1e-9) -- DualPipeV's, a seed
end

-- A family of another placement with the same counts (interleaved1f1b's
-- 2P stages on a V search) is not returned as the V search's result.
function TestSearchBounds:test_result_keeps_the_placement()
  local r = assert(search.search { pp = 2, microbatches = 2, cost = "F=2,B=4,FB=3", placement = "v",
    split = "never", time = 0.2, progress = false })
  local s = r:schedule()
  lu.assertEquals(r.placement_name, "v")
  -- rank 0 runs stages 0 and 3 (V), not 0 and 2 (interleaved)
  local want = { [0] = { 0, 3 }, [1] = { 1, 2 } }
  for rk = 0, 1 do
    local seen = {}
    for _, e in ipairs(assert(s:simulate { F = 1, B = 2, FB = 1.5 }):events()) do
      if e.rank == rk then seen[e.stage] = true end
    end
    for _, st in ipairs(want[rk]) do lu.assertTrue(seen[st], "rank " .. rk .. " lacks stage " .. st) end
  end
end

TestSearchErrors = {}

function TestSearchErrors:test_bad_options()
  local function err_of(opts)
    local ok, e = pcall(search.search, opts)
    lu.assertFalse(ok)
    return tostring(e)
  end
  lu.assertStrContains(err_of { pp = 0, microbatches = 4 }, "pp must be a positive integer")
  lu.assertStrContains(err_of { pp = 4, microbatches = 4, w_share = 2 }, "w_share must be a number in 0..1")
  lu.assertStrContains(err_of { pp = 4, microbatches = 4, placement = "zigzag" }, "placement 'zigzag'")
  lu.assertStrContains(err_of { pp = 4, microbatches = 4, placement = { 0, 9 } },
    "model stage 1 is on rank 9, not one of 0..3")
  lu.assertStrContains(err_of { pp = 4, microbatches = 4, objective = "fast" }, "objective must be")
  lu.assertStrContains(err_of { pp = 4, microbatches = 4, memory = { 1, 2 } },
    "memory must be a number or a table of 4 limits")
end

os.exit(lu.LuaUnit.run())
