-- luapipe.schedule: build, load and inspect pipeline schedules.
--
--   local schedule = require("luapipe.schedule")
--   local s = schedule.new{ name = "mine", ranks = 2, stages = 2, microbatches = 2,
--                          placement = { {stage = 0, rank = 0}, {stage = 1, rank = 1} } }
--   s:push(0, "0F0")            -- or s:push(0, {"0F0", "0F1", "0B0", "0B1"})
--   assert(s:validate())
--
-- A schedule is a luapipe.Schedule (C userdata); this module adds the
-- idiomatic constructors and Lua-side methods (summary, tostring, files).
local core = require("luapipe.core")

local M = {}
local Schedule = core.Schedule -- the methods table shared with the C binding

-- Families by name (see luapipe.schedules); aliases users type.
M.families = { "gpipe", "1f1b", "interleaved1f1b", "zb1p", "zbv", "dualpipe", "dualpipev" }
local aliases = { interleaved = "interleaved1f1b", ["zb-h1"] = "zb1p", zbh1 = "zb1p",
  ["zb-v"] = "zbv", ["dualpipe-v"] = "dualpipev" }

local function check_int(t, k, min, ctx)
  local v = t[k]
  if math.type(v) ~= "integer" then
    error(string.format("%s: '%s' must be an integer, got %s", ctx, k, tostring(v)), 3)
  end
  if min and v < min then
    error(string.format("%s: '%s' must be at least %d, got %d", ctx, k, min, v), 3)
  end
  return v
end

-- schedule.new{ranks=, stages=, microbatches=, name=, placement=, routes=, actions=}
--   placement: list of {stage=, rank=} giving virtual stages 0, 1, 2, ... in
--              order; default: stage i on rank i (needs stages == ranks).
--   routes:    list (1-based, for mb 0..M-1) of virtual-stage lists, or a
--              function(mb) -> list; default: every micro-batch passes the
--              virtual stages 0..V-1 (needs V == stages).
--   actions:   optional {[rank] = {"0F0", ...}} keyed by 0-based rank.
function M.new(opts)
  if type(opts) ~= "table" then error("schedule.new expects a table of options", 2) end
  local ranks = check_int(opts, "ranks", 1, "schedule.new")
  local stages = check_int(opts, "stages", 1, "schedule.new")
  local mbs = check_int(opts, "microbatches", 1, "schedule.new")
  local s = core.schedule_new(ranks, stages, mbs)
  if opts.name then s:set_name(opts.name) end
  local placement = opts.placement
  if placement == nil then
    if stages ~= ranks then
      error(string.format("schedule.new: %d stages on %d ranks needs an explicit placement",
        stages, ranks), 2)
    end
    for i = 0, stages - 1 do s:add_vstage(i, i) end
  else
    for i, p in ipairs(placement) do
      if type(p) ~= "table" or math.type(p.stage) ~= "integer" or math.type(p.rank) ~= "integer" then
        error(string.format("schedule.new: placement[%d] must be {stage = <int>, rank = <int>}", i), 2)
      end
      s:add_vstage(p.stage, p.rank)
    end
  end
  local nv = s:info().vstages
  for mb = 0, mbs - 1 do
    local r
    if type(opts.routes) == "function" then
      r = opts.routes(mb)
    elseif type(opts.routes) == "table" then
      r = opts.routes[mb + 1]
    else
      if nv ~= stages then
        error("schedule.new: several copies of a stage need explicit routes", 2)
      end
      r = {}
      for v = 0, nv - 1 do r[#r + 1] = v end
    end
    if r == nil then error(string.format("schedule.new: no route for micro-batch %d", mb), 2) end
    s:set_route(mb, r)
  end
  if opts.actions then
    for rank = 0, ranks - 1 do
      if opts.actions[rank] then s:push(rank, opts.actions[rank]) end
    end
  end
  return s
end

local util = require("luapipe.util")
local read_file, write_file = util.read_file, util.write_file

-- schedule.from_csv(path) -> Schedule | nil, err
function M.from_csv(path)
  local text, err = read_file(path)
  if not text then return nil, err end
  return core.schedule_from_csv(text, path)
end

-- schedule.from_csv_text(text[, origin]) -> Schedule | nil, err
function M.from_csv_text(text, origin)
  return core.schedule_from_csv(text, origin or "csv")
end

-- schedule.from_json(text) -> Schedule | nil, err (the to_json format)
function M.from_json(text, origin)
  local json = require("luapipe.json")
  local t, _, err = json.decode(text)
  origin = origin or "json"
  if not t then return nil, origin .. ": " .. tostring(err) end
  local ok, s = pcall(function()
    local placement = {}
    for i, v in ipairs(t.virtual_stages or {}) do
      if v.id ~= i - 1 then error(string.format("virtual_stages[%d] has id %s, expected %d", i, tostring(v.id), i - 1)) end
      placement[i] = { stage = v.stage, rank = v.rank }
    end
    local actions = {}
    for r, list in ipairs(t.actions or {}) do actions[r - 1] = list end
    return M.new { name = t.name, ranks = t.ranks, stages = t.stages,
      microbatches = t.microbatches, placement = placement, routes = t.routes,
      actions = actions }
  end)
  if not ok then return nil, origin .. ": " .. tostring(s):gsub("^.-:%d+: ", "") end
  return s
end

-- schedule.build(name, opts) -> Schedule: a built-in family by name.
function M.build(name, opts)
  local fam = aliases[name] or name
  local ok, builder = false, nil
  if M.is_family(fam) then ok, builder = pcall(require, "luapipe.schedules." .. fam) end
  if not ok or type(builder) ~= "function" then
    error(string.format("unknown schedule '%s' (families: %s)", name,
      table.concat(M.families, ", ")), 2)
  end
  return builder(opts)
end

function M.is_family(name)
  name = aliases[name] or name
  for _, f in ipairs(M.families) do if f == name then return true end end
  return false
end

-- schedule.load(spec, opts) -> Schedule | nil, err
-- spec is a family name (opts: pp, microbatches, chunks), a .csv file, a
-- .json file, or a .lua file returning a schedule (run with opts as `...`).
function M.load(spec, opts)
  opts = opts or {}
  if M.is_family(spec) then
    local ok, s = pcall(M.build, spec, opts)
    if not ok then return nil, (tostring(s):gsub("^[^:]*:%d+: ", "")) end
    return s
  end
  if spec:match("%.csv$") then return M.from_csv(spec) end
  if spec:match("%.json$") then
    local text, err = read_file(spec)
    if not text then return nil, err end
    return M.from_json(text, spec)
  end
  if spec:match("%.lua$") then
    local chunk, err = loadfile(spec)
    if not chunk then return nil, err end
    local ok, s = xpcall(chunk, debug.traceback, opts)
    if not ok then return nil, s end
    if getmetatable(s) ~= getmetatable(core.schedule_new(1, 1, 1)) then
      return nil, spec .. ": the script must return a schedule (got " .. type(s) .. ")"
    end
    return s
  end
  return nil, string.format("'%s' is not a schedule family (%s) nor a .csv, .json or .lua file",
    spec, table.concat(M.families, ", "))
end

-- ---- Lua-side methods of luapipe.Schedule ----

-- s:ranks_list() is handy in loops: for r = 0, s:info().ranks - 1 ...
function Schedule.write_csv(s, path) return write_file(path, s:to_csv()) end
function Schedule.write_json(s, path) return write_file(path, s:to_json()) end

-- s:summary() -> one paragraph of text
function Schedule.summary(s)
  local i = s:info()
  local n = 0
  for r = 0, i.ranks - 1 do n = n + s:count(r) end
  local ok, err = s:validate()
  return string.format("schedule %s: %d ranks, %d stages (%d virtual), %d micro-batches, %d actions%s, %s",
    i.name ~= "" and ("'" .. i.name .. "'") or "(unnamed)", i.ranks, i.stages, i.vstages,
    i.microbatches, n, i.lowered and " (lowered)" or "",
    ok and "valid" or ("INVALID: " .. err))
end

local mt = getmetatable(core.schedule_new(1, 1, 1))
mt.__tostring = function(s)
  local ok, text = pcall(Schedule.summary, s)
  return ok and text or "luapipe.Schedule (closed)"
end

return M
