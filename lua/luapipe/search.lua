-- luapipe.search: find the schedule for your costs and your memory, with a
-- lower bound on how far from optimal it is (docs/search.md).
--
--   local r = luapipe.search { pp = 4, microbatches = 12, cost = "F=1,B=2,W=1",
--     memory = 7, w_share = 0.5, placement = "linear", objective = "span", time = 1 }
--   print(r)                      -- summary: objective, bound, gap, families
--   local s = r:schedule()        -- a luapipe.Schedule (validated)
--   r:makespan(), r:span(), r:lower_bound(), r:gap(), r:peak_memory()
--
-- Options:
--   pp, microbatches   ranks and micro-batches (required)
--   cost               a cost table or string as luapipe.sim.parse_cost takes
--                      (F, B, I, W, FB, latency). The times are those of one
--                      rank's share of the model (1/pp of it, a 1F1B stage):
--                      a placement with S model stages charges pp/S of them
--                      per stage (a V stage costs half).
--   memory             limit per rank in activations (one micro-batch's
--                      activations of 1/pp of the model = 1), a number or a
--                      table per rank; nil: unlimited
--   act                activation units per model stage (overrides pp/S)
--   act_values         values in one activation unit; with it the memory
--                      figures are also bytes: act_values x 4 (precision
--                      "f32", the default) or x 2 ("bf16": activations and
--                      messages in bf16) a unit, r:peak_bytes()
--   precision          "f32" or "bf16" (needs act_values)
--   memory_bytes       the limit per rank in bytes instead of activations
--                      (needs act_values; a number or a table per rank):
--                      bf16 fits twice the activations of f32
--   w_share            share of an activation held from its I until its W
--                      (0..1; Zero Bubble's F +2 / I -1 / W -1 rule is 0.5)
--   placement          "linear" (default), "interleaved:V", "v",
--                      "bidirectional", "any" (tries them all), a table
--                      {rank of model stage 0, rank of stage 1, ...}, or a
--                      function(pp) returning such a table (a generator)
--   objective          "makespan" (default: simulate's), "span" (Zero
--                      Bubble's: per rank first F to last W) or a
--                      function(eval) -> number, eval = {makespan=, span=,
--                      ranks = {{rank, start, finish, busy, peak_memory}}}
--   split              "auto" (default), "always" (I + W) or "never" (B)
--   pairs              false: no overlapped F&B pairs (default: used when
--                      FB is given and cheaper than F + B)
--   time               seconds of search (default 1); seed (default 1)
--   progress           true: a progress line on stderr (default: when stderr
--                      is a terminal); Ctrl-C stops and keeps the best so far
--   families           false: do not compare with (and seed from) families
--   priority           function(a) -> number: a seed of your own; a = {kind = "F" |
--                      "B" (the backward) | "W", vstage, stage, rank, mb,
--                      position (on the route)}; smaller runs first among
--                      the actions ready on a rank
--   robust             true or {jitter = 0.1, samples = 20, candidates = 4}: run
--                      `candidates` searches (seeds seed, seed+1, ...), re-score
--                      each found schedule under per-stage cost jitter and keep
--                      the one with the best 90th percentile (r.robust)
local core = require("luapipe.core")
local sim = require("luapipe.sim")
local util = require("luapipe.util")

local M = {}

local SearchResult = {}
SearchResult.__index = SearchResult
M.SearchResult = SearchResult

-- Helpers of the search, not the API (tests and scripts/bench/search reach
-- them here; the argument sweep leaves them out): resolve_cost, score,
-- jittered, robust_choice.
M._internal = {}

-- An option error (or a placement that cannot be built), raised at the
-- user's line as a luapipe.Error: "search: w_share must be a number in
-- 0..1, got 2" (who: the function, default "search"; reason: the text
-- after it, for a caller that names the function its own way, as the CLI).
local function fail(msg, who)
  who = who or "search"
  util.raise { what = who .. ": " .. msg, who = who, reason = msg }
end

-- placement name -> {name=, stages=, vstage_stage=, vstage_rank=, routes=, mb_route=}
-- (0-based ids; routes flat)
local function placement(spec, P, Mb, who)
  local pl = { vstage_stage = {}, vstage_rank = {}, routes = {}, mb_route = {} }
  local function single(ranks, name)
    if #ranks == 0 then fail("placement: a table of ranks needs at least one model stage", who) end
    pl.name = name
    pl.stages = #ranks
    for k = 1, #ranks do
      local r = ranks[k]
      if math.type(r) ~= "integer" or r < 0 or r >= P then
        fail(string.format("placement: model stage %d is on rank %s, not one of 0..%d", k - 1,
          tostring(r), P - 1), who)
      end
      pl.vstage_stage[k], pl.vstage_rank[k], pl.routes[k] = k - 1, r, k - 1
    end
    for m = 1, Mb do pl.mb_route[m] = 0 end
    pl.nroutes = 1
    return pl
  end
  if type(spec) == "function" then
    local ok, t = pcall(spec, P)
    if not ok then fail("placement generator: " .. tostring(t), who) end
    if type(t) ~= "table" or #t == 0 then
      fail("placement generator must return a table of ranks", who)
    end
    return single(t, "custom")
  elseif type(spec) == "table" then
    return single(spec, "custom")
  end
  spec = spec or "linear"
  if spec == "linear" then
    local t = {}
    for k = 0, P - 1 do t[k + 1] = k end
    return single(t, "linear")
  elseif spec == "v" then
    local t = {}
    for k = 0, 2 * P - 1 do t[k + 1] = k < P and k or 2 * P - 1 - k end
    return single(t, "v")
  elseif type(spec) == "string" and spec:match("^interleaved") then
    local v = spec == "interleaved" and 2
      or math.tointeger(tonumber(spec:match("^interleaved:(%d+)$")))
    if not v or v < 1 or v > 8 then
      fail("placement: interleaved:V needs V in 1..8, got '" .. spec .. "'", who)
    end
    local t = {}
    for k = 0, v * P - 1 do t[k + 1] = k % P end
    return single(t, "interleaved:" .. v)
  elseif spec == "bidirectional" then
    if Mb < 2 then fail("placement: bidirectional needs at least 2 micro-batches", who) end
    pl.name, pl.stages, pl.nroutes = "bidirectional", P, 2
    for v = 0, P - 1 do pl.vstage_stage[v + 1], pl.vstage_rank[v + 1] = v, v end
    for s = 0, P - 1 do pl.vstage_stage[P + s + 1], pl.vstage_rank[P + s + 1] = s, P - 1 - s end
    for s = 0, P - 1 do pl.routes[s + 1] = s; pl.routes[P + s + 1] = P + s end
    for m = 0, Mb - 1 do pl.mb_route[m + 1] = m < Mb // 2 and 0 or 1 end
    return pl
  end
  fail(string.format("placement '%s': expected linear, interleaved:V, v, bidirectional, "
    .. "any, a table of ranks or a function", tostring(spec)), who)
end

-- search.placement(spec, pp, microbatches) -> the placement (as above) of
-- a name ("linear", "interleaved:V", "v", "bidirectional"), a table of
-- ranks (rank of model stage 0, 1, ...) or a function(pp) returning one.
function M.placement(spec, P, Mb)
  local t = type(spec)
  if t ~= "string" and t ~= "table" and t ~= "function" then
    util.raise("search.placement: spec (argument 1) must be a placement name (linear, "
      .. "interleaved:V, v, bidirectional), a table of ranks or a function(pp), got "
      .. util.shown(spec))
  end
  P = util.int_arg("search.placement", 2, "pp", P, 1, 256)
  Mb = util.int_arg("search.placement", 3, "microbatches", Mb, 1, 4096)
  return placement(spec, P, Mb, "search.placement")
end

-- The resolved cost of the user (the simulator's B = I + W rules,
-- sim.resolve_cost); FB stays nil when not given.
local function resolve(cost, who)
  local c = sim.resolve_cost(cost)
  if not c then -- only B with I or W larger than it
    fail(string.format("cost: B = %g is less than %s (B = I + W)", cost.B, cost.W and "W" or "I"),
      who)
  end
  return c
end
M._internal.resolve_cost = resolve

-- The user's cost (a table or a string as sim.parse_cost takes) resolved,
-- every time checked by the core's rule.
local function user_cost(cost, who)
  if cost ~= nil and type(cost) ~= "table" and type(cost) ~= "string" then
    fail("cost must be a table {F =, B =, W =, ...} or a string such as \"F=1,B=2,W=1\", got "
      .. util.shown(cost), who)
  end
  local c = sim.to_cost(cost or {})
  for _, k in ipairs { "F", "B", "I", "W", "FB", "latency" } do
    local v = c[k]
    if v ~= nil then
      local ok, err = false, k .. " must be a number, got " .. util.shown(v)
      if type(v) == "number" then ok, err = core.sim_check_time(k, v) end
      if not ok then fail("cost: " .. tostring(err), who) end
    end
  end
  return resolve(c, who)
end

local function scaled(c, f)
  return { F = c.F * f, B = c.B * f, I = c.I * f, W = c.W * f, FB = c.FB and c.FB * f,
    latency = c.latency }
end

local function per_rank(memory, P, who)
  if memory == nil then return nil end
  if type(memory) == "number" then
    if not (memory > 0) then -- luacheck: ignore 581 (NaN is refused too)
      fail("memory must be a positive number of activations, got " .. memory, who)
    end
    local t = {}
    for r = 1, P do t[r] = memory end
    return t
  end
  if type(memory) ~= "table" or #memory ~= P then
    fail(string.format("memory must be a number or a table of %d limits (one per rank)", P), who)
  end
  for r = 1, P do
    if type(memory[r]) ~= "number" or not (memory[r] > 0) then -- luacheck: ignore 581 (NaN)
      fail(string.format("memory of rank %d must be a positive number, got %s", r - 1,
        tostring(memory[r])), who)
    end
  end
  return memory
end

local function objective_of(objective, eval)
  if objective == "span" then return eval.span end
  if type(objective) == "function" then return objective(eval) end
  return eval.makespan
end

-- Scores a built schedule under the options (its own stage scaling):
-- {makespan=, span=, bubble= (largest per rank), peak= {...}, fits=, objective=}
function M._internal.score(s, c, opts)
  local info = s:info()
  local f = opts.pp / info.stages
  local res, err = s:try_simulate(scaled(c, f))
  if not res then return nil, err end
  local act = {}
  for k = 1, info.stages do act[k] = f end
  local peak = core.schedule_peak(s, act, opts.w_share or 0)
  local ranks, span, fits = {}, 0, true
  local events = res:events()
  local first = {}
  for _, e in ipairs(events) do
    if not first[e.rank] or e.start < first[e.rank] then first[e.rank] = e.start end
  end
  for i, r in ipairs(res:ranks()) do
    local st = first[r.rank] or 0
    span = math.max(span, r.finish - st)
    ranks[i] = { rank = r.rank, start = st, finish = r.finish, busy = r.busy,
      peak_memory = peak[i] }
    if opts.memory and peak[i] > opts.memory[i] + 1e-9 then fits = false end
  end
  local eval = { makespan = res:makespan(), span = span, ranks = ranks }
  return { makespan = res:makespan(), span = span, bubble = res:max_bubble(), peak = peak,
    fits = fits, eval = eval }
end

local split_codes = { auto = 0, always = 1, never = 2 }

local function check_opts(opts, who)
  local function bad(msg) fail(msg, who) end
  for _, k in ipairs { "pp", "microbatches" } do
    if math.type(opts[k]) ~= "integer" or opts[k] < 1 then
      bad(string.format("%s must be a positive integer, got %s", k, tostring(opts[k])))
    end
  end
  if opts.pp > 256 then bad("pp must be at most 256 for a search, got " .. opts.pp) end
  if opts.microbatches > 4096 then
    bad("microbatches must be at most 4096 for a search, got " .. opts.microbatches)
  end
  local w = opts.w_share or 0
  if type(w) ~= "number" or not (w >= 0 and w <= 1) then
    bad("w_share must be a number in 0..1, got " .. tostring(opts.w_share))
  end
  local ob = opts.objective or "makespan"
  if ob ~= "makespan" and ob ~= "span" and type(ob) ~= "function" then
    bad("objective must be 'makespan', 'span' or a function, got " .. tostring(ob))
  end
  if opts.split and not split_codes[opts.split] then
    bad("split must be 'auto', 'always' or 'never', got " .. tostring(opts.split))
  end
  local t = opts.time or 1
  if type(t) ~= "number" or not (t >= 0 and t <= 86400) then
    bad("time must be a number of seconds in 0..86400, got " .. tostring(opts.time))
  end
  if opts.seed ~= nil and (math.type(opts.seed) ~= "integer" or opts.seed < 0) then
    bad("seed must be a non-negative integer, got " .. tostring(opts.seed))
  end
  local av = opts.act_values
  -- luacheck: ignore 581 (NaN is refused too)
  if av ~= nil and (type(av) ~= "number" or not (av > 0) or av == math.huge) then
    bad("act_values must be a positive number (values in one activation), got " .. util.shown(av))
  end
  local pr = opts.precision
  if pr ~= nil and pr ~= "f32" and pr ~= "bf16" then
    bad("precision must be \"f32\" or \"bf16\", got " .. util.shown(pr))
  end
  if (pr ~= nil or opts.memory_bytes ~= nil) and av == nil then
    bad((opts.memory_bytes ~= nil and "memory_bytes" or "precision")
      .. " needs act_values (values in one activation: what sizes it in bytes)")
  end
  if opts.memory_bytes ~= nil and opts.memory ~= nil then
    bad("give memory (activations) or memory_bytes, not both")
  end
end

-- Bytes of one activation unit: act_values x 4 (f32) or x 2 (bf16); nil
-- without act_values.
local function unit_bytes(opts)
  if not opts.act_values then return nil end
  return opts.act_values * (opts.precision == "bf16" and 2 or 4)
end

-- The limit per rank in activation units: memory, or memory_bytes over
-- the bytes of a unit at the precision; nil: unlimited.
local function memory_units(opts, P, who)
  if opts.memory_bytes == nil then return per_rank(opts.memory, P, who) end
  local mb, ub = per_rank(opts.memory_bytes, P, who), unit_bytes(opts)
  local t = {}
  for r = 1, P do t[r] = mb[r] / ub end
  return t
end
M._internal.memory_units = memory_units

local function stderr_tty()
  local ok, yes = pcall(core.isatty, 2)
  return ok and yes
end

-- Runs one search on one placement; returns a result table (no families).
local function run_one(pl, c, opts, budget, progress)
  local P, Mb = opts.pp, opts.microbatches
  local f = P / pl.stages
  local act = {}
  for k = 1, pl.stages do act[k] = (opts.act and opts.act[k]) or f end
  local spec = { ranks = P, stages = pl.stages, microbatches = Mb, nroutes = pl.nroutes,
    vstage_stage = pl.vstage_stage, vstage_rank = pl.vstage_rank, routes = pl.routes,
    mb_route = pl.mb_route, times = scaled(c, f), latency = c.latency, act = act,
    memory = opts.memory, w_share = opts.w_share or 0, split = split_codes[opts.split or "auto"],
    pairs = opts.pairs == false and 0 or 1, objective = opts.objective or "makespan",
    seed = opts.seed or 1 }
  -- the core's messages are in the search's own terms; this API names itself
  local S, err = core.search_new(spec)
  if not S then return nil, "search: " .. err, err end
  local families = {}
  local interrupted = false
  -- a Ctrl-C is told by the host's count of them (core.interrupts, absent
  -- outside the luapipe program), never by the message
  local interrupts = core.interrupts and core.interrupts() or 0
  local ok, perr = pcall(function()
    if opts.families ~= false then
      local schedules = require("luapipe.schedules")
      for _, name in ipairs(schedules.list()) do
        local bok, s = pcall(schedules[name], { pp = P, microbatches = Mb, chunks = 2 })
        if bok and s and s:info().stages == pl.stages and #pl.vstage_stage == s:info().vstages then
          local fits, obj = S:add_schedule(s, name)
          if fits == nil then util.fail({ what = "search: " .. obj, reason = obj }, 0) end
        end
      end
    end
    if opts.priority then -- a seed from the user's priority function
      local keys, n, V = {}, 0, #pl.vstage_stage
      local pos = {}
      for k = 1, pl.nroutes do
        for st = 0, pl.stages - 1 do
          local v = pl.routes[(k - 1) * pl.stages + st + 1]
          pos[v] = pos[v] or st
        end
      end
      local kinds = { "F", "B", "W" }
      for v = 0, V - 1 do
        for m = 0, Mb - 1 do
          for kind = 1, 3 do
            n = n + 1
            local key = opts.priority { kind = kinds[kind], vstage = v,
              stage = pl.vstage_stage[v + 1],
              rank = pl.vstage_rank[v + 1], mb = m, position = pos[v] }
            if type(key) ~= "number" then
              error(string.format("priority must return a number, got %s for %s of "
                .. "micro-batch %d on virtual stage %d", type(key), kinds[kind], m, v), 0)
            end
            keys[n] = key
          end
        end
      end
      local sok, serr = S:seed_keys(keys, "priority function", n)
      if not sok then util.fail({ what = "search: " .. serr, reason = serr }, 0) end
    end
    assert(S:seed_rules())
    local t0 = core.now()
    local last = t0
    while true do
      local left = budget - (core.now() - t0)
      if left <= 0 then break end
      local rok, rerr = S:run(math.min(left, 0.1))
      if not rok then util.fail({ what = "search: " .. rerr, reason = rerr }, 0) end
      local st = S:stats()
      if progress and core.now() - last >= 0.25 then
        last = core.now()
        io.stderr:write(string.format("\rsearch %s: %d evaluations, best %s, bound %s, "
          .. "gap %.2f%%   ",
          pl.name, st.evaluations, sim.format_number(st.best), sim.format_number(st.lower_bound),
          100 * st.gap))
        io.stderr:flush()
      end
      if st.best <= st.lower_bound * (1 + 1e-12) and type(opts.objective) ~= "function" then
        break
      end
    end
  end)
  if progress then io.stderr:write("\r\27[K"); io.stderr:flush() end
  if not ok then
    if core.interrupts and core.interrupts() > interrupts then
      interrupted = true
      io.stderr:write("search interrupted: keeping the best so far\n")
    else
      S:close()
      return nil, util.message(perr), util.is_error(perr) and perr.reason or util.message(perr)
    end
  end
  local st = S:stats()
  if st.best == math.huge then
    S:close()
    return nil, "no schedule found", "no schedule found"
  end
  local sched, serr = S:schedule()
  if not sched then
    S:close()
    return nil, "search: " .. serr, serr
  end
  local res = setmetatable({ _schedule = sched, stats = st, bounds = S:bounds(), peak = S:peak(P),
    placement_name = pl.name, placement = pl, interrupted = interrupted, families = families,
    options = opts }, SearchResult)
  S:close()
  return res
end

-- luapipe.search(opts) -> SearchResult (raises on bad options, a
-- luapipe.Error with reason = the text after "search: "; returns nil,
-- message, reason when nothing can be found, e.g. a limit below one
-- micro-batch's need: reason is the message without the API's name)
function M.search(opts)
  util.arg("search.search", 1, "opts", opts, "table",
    "a table of options {pp =, microbatches =, ...}")
  check_opts(opts)
  local P, Mb = opts.pp, opts.microbatches
  local c = user_cost(opts.cost)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  local ub = unit_bytes(opts)
  o.memory = memory_units(opts, P)
  local progress = opts.progress
  if progress == nil then progress = stderr_tty() end
  local budget = opts.time or 1
  local candidates
  if opts.placement == "any" then
    candidates = { "linear", "v", "interleaved:2" }
    if Mb >= 2 then candidates[#candidates + 1] = "bidirectional" end
  else
    candidates = { opts.placement or "linear" }
  end
  local robust = opts.robust
  if robust == true then robust = {} end
  local rounds = robust and (robust.candidates or 4) or 1
  local best, lasterr, lastreason
  local found = {}
  local t0 = core.now()
  local stop = false
  for round = 1, rounds do
    o.seed = (opts.seed or 1) + round - 1
    for i, name in ipairs(candidates) do
      local pl = placement(name, P, Mb)
      local left = budget - (core.now() - t0)
      local share = left / ((rounds - round) * #candidates + #candidates - i + 1)
      local r, err, reason = run_one(pl, c, o, math.max(share, 0), progress)
      if r then
        r.cost = c
        found[#found + 1] = r
        if not best or r.stats.best < best.stats.best then best = r end
        if r.interrupted then stop = true break end
      else
        lasterr, lastreason = err, reason
      end
    end
    if stop then break end
  end
  if not best then return nil, lasterr, lastreason end
  if robust then best = M._internal.robust_choice(found, c, opts, robust) end
  best.seconds_total = core.now() - t0
  best.unit_bytes, best.precision = ub, ub and (opts.precision or "f32") or nil
  return best
end

-- The objective of result r's schedule under `samples` draws of per-stage
-- costs, each time scaled by a factor uniform in 1 +- jitter (a fixed
-- pseudo-random sequence: the same draws for every candidate). Returns the
-- sorted values.
function M._internal.jittered(r, c, opts, jitter, samples)
  local s = r:schedule()
  local S = s:info().stages
  local f = opts.pp / S
  local state = 12345
  local function unit()
    state = (state * 1103515245 + 12345) % 2147483648
    return state / 2147483648
  end
  local values = {}
  for k = 1, samples do
    local cost = { latency = c.latency, stages = {} }
    for st = 0, S - 1 do
      local u = 1 + jitter * (2 * unit() - 1)
      cost.stages[st] = { F = c.F * f * u, B = c.B * f * u, I = c.I * f * u, W = c.W * f * u,
        FB = c.FB and c.FB * f * u }
    end
    local res = assert(s:simulate(cost))
    local first, span = {}, 0
    local ranks = {}
    for _, e in ipairs(res:events()) do
      if not first[e.rank] or e.start < first[e.rank] then first[e.rank] = e.start end
    end
    for i, rk in ipairs(res:ranks()) do
      span = math.max(span, rk.finish - (first[rk.rank] or 0))
      ranks[i] = { rank = rk.rank, start = first[rk.rank] or 0, finish = rk.finish, busy = rk.busy,
        peak_memory = r.peak[i] }
    end
    values[k] = objective_of(opts.objective, { makespan = res:makespan(), span = span,
      ranks = ranks })
  end
  table.sort(values)
  return values
end

-- Among the results found, the one whose 90th percentile under cost jitter
-- is the smallest (robust = {jitter = 0.1, samples = 20, candidates = 4});
-- it carries robust = {p90 =, nominal =, jitter =, samples =, candidates =}.
function M._internal.robust_choice(found, c, opts, robust)
  local jitter, samples = robust.jitter or 0.1, robust.samples or 20
  local best, bp
  for _, r in ipairs(found) do
    local v = M._internal.jittered(r, c, opts, jitter, samples)
    local p90 = v[math.max(1, math.ceil(0.9 * #v))]
    r.robust = { p90 = p90, nominal = r.stats.best, jitter = jitter, samples = samples,
      candidates = #found }
    if not bp or p90 < bp then best, bp = r, p90 end
  end
  return best
end

-- search.families(opts[, cost]) -> the families built for these options
-- (those of search.search), scored under cost (default opts.cost; a table
-- or a string as sim.parse_cost takes): rows {family, label, makespan,
-- span, bubble, peak, fits, objective} (rows for families that cannot be
-- built carry error).
function M.families(opts, c)
  util.arg("search.families", 1, "opts", opts, "table",
    "a table of options {pp =, microbatches =, ...}")
  check_opts(opts, "search.families")
  if c == nil then c = opts.cost end
  if c ~= nil and type(c) ~= "table" and type(c) ~= "string" then
    util.raise("search.families: cost (argument 2) must be a cost table {F =, B =, W =, ...} or a "
      .. "string such as \"F=1,B=2,W=1\" (or nil: opts.cost), got " .. util.shown(c))
  end
  c = user_cost(c, "search.families")
  local schedules = require("luapipe.schedules")
  local rows = {}
  local mem = memory_units(opts, opts.pp, "search.families")
  local o = { pp = opts.pp, memory = mem, w_share = opts.w_share }
  for _, name in ipairs(schedules.list()) do
    local row = { family = name, label = schedules.label(name) }
    local ok, s = pcall(schedules[name], { pp = opts.pp, microbatches = opts.microbatches,
      chunks = 2 })
    if not ok then
      row.error = util.message(s)
    else
      local sc, err = M._internal.score(s, c, o)
      if not sc then
        row.error = err
      else
        for k, v in pairs(sc) do row[k] = v end
        row.objective = objective_of(opts.objective, sc.eval)
      end
    end
    rows[#rows + 1] = row
  end
  return rows
end

-- The methods take no arguments; called on something else than a result
-- (r.schedule() for r:schedule()) they say so.
local function result(r, method)
  if getmetatable(r) ~= SearchResult then
    util.raise(string.format("r:%s: call it on a search result, r:%s(), got %s", method, method,
      util.shown(r)))
  end
  return r
end

function SearchResult:schedule() return result(self, "schedule")._schedule end
function SearchResult:makespan() return result(self, "makespan").stats.makespan end
function SearchResult:span() return result(self, "span").stats.span end
function SearchResult:lower_bound() return result(self, "lower_bound").stats.lower_bound end
function SearchResult:gap() return result(self, "gap").stats.gap end
function SearchResult:peak_memory()
  local t = {}
  for i, v in ipairs(result(self, "peak_memory").peak) do t[i] = v end
  return t
end
-- r:peak_bytes() -> per rank, the peak memory in bytes (act_values x the
-- precision's bytes a unit); nil without act_values
function SearchResult:peak_bytes()
  local ub = result(self, "peak_bytes").unit_bytes
  if not ub then return nil end
  local t = {}
  for i, v in ipairs(self.peak) do t[i] = v * ub end
  return t
end
function SearchResult:evaluations() return result(self, "evaluations").stats.evaluations end
function SearchResult:seconds()
  return result(self, "seconds").seconds_total or self.stats.seconds
end
function SearchResult:objective() return result(self, "objective").stats.best end

function SearchResult:__tostring()
  local st, num = self.stats, sim.format_number
  local lines = {
    string.format("search (%s placement): makespan %s, span %s, lower bound %s, gap %.2f%%%s",
      self.placement_name, num(st.makespan), num(st.span), num(st.lower_bound), 100 * st.gap,
      self.interrupted and " (interrupted)" or ""),
    string.format("  %d evaluations in %.2f s; best from %s; peak memory per rank: %s",
      st.evaluations, self:seconds(), st.label, table.concat((function()
        local t = {}
        for i, v in ipairs(self.peak) do t[i] = num(v) end
        return t
      end)(), " ")),
  }
  local pb = self.unit_bytes and self:peak_bytes()
  if pb then
    for i, v in ipairs(pb) do pb[i] = num(v) end
    lines[#lines + 1] = string.format("  peak activation bytes per rank (%s, %s bytes an "
      .. "activation): %s", self.precision or "f32", num(self.unit_bytes), table.concat(pb, " "))
  end
  return table.concat(lines, "\n")
end

return setmetatable(M, { __call = function(_, opts) return M.search(opts) end })
