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
local util = require("luapipe.util")

local M = {}
local Schedule = core.Schedule -- the methods table shared with the C binding

-- Families by name: the list lives in luapipe.schedules (one home).
local schedules = require("luapipe.schedules")
M.families = schedules.list()

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

-- Calls method `name` of s; its error is raised at the caller of
-- schedule.new (level 3), as "schedule.new: <message>" without a position.
local function call(s, name, ...)
  local ok, err = pcall(s[name], s, ...)
  if not ok then error("schedule.new: " .. util.message(err), 3) end
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
  local ok, s = pcall(core.schedule_new, ranks, stages, mbs)
  if not ok then error("schedule.new: " .. tostring(s), 2) end
  if opts.name ~= nil then
    if type(opts.name) ~= "string" then
      error("schedule.new: 'name' must be a string, got " .. type(opts.name), 2)
    end
    call(s, "set_name", opts.name)
  end
  local placement = opts.placement
  if placement == nil then
    if stages ~= ranks then
      error(string.format("schedule.new: %d stages on %d ranks needs an explicit placement",
        stages, ranks), 2)
    end
    for i = 0, stages - 1 do call(s, "add_vstage", i, i) end
  else
    for i, p in ipairs(placement) do
      if type(p) ~= "table" or math.type(p.stage) ~= "integer" or math.type(p.rank) ~= "integer" then
        error(string.format("schedule.new: placement[%d] must be {stage = <int>, rank = <int>}", i), 2)
      end
      call(s, "add_vstage", p.stage, p.rank)
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
    if type(r) ~= "table" then
      error(string.format("schedule.new: the route of micro-batch %d must be a list of virtual "
        .. "stage ids, got %s", mb, type(r)), 2)
    end
    call(s, "set_route", mb, r)
  end
  if opts.actions ~= nil then
    if type(opts.actions) ~= "table" then
      error("schedule.new: 'actions' must be a table {[rank] = {\"0F0\", ...}}, got "
        .. type(opts.actions), 2)
    end
    for rank = 0, ranks - 1 do
      local list = opts.actions[rank]
      if list ~= nil and type(list) ~= "table" and type(list) ~= "string" then
        error(string.format("schedule.new: actions[%d] must be a list of action strings, got %s",
          rank, type(list)), 2)
      end
      if list then call(s, "push", rank, list) end
    end
  end
  return s
end

local read_file, write_file = util.read_file, util.write_file

-- schedule.from_csv(path) -> Schedule | nil, err
function M.from_csv(path)
  util.arg("schedule.from_csv", 1, "path", path, "string")
  local text, err = read_file(path)
  if not text then return nil, err end
  return core.schedule_from_csv(text, path)
end

-- schedule.from_csv_text(text[, origin]) -> Schedule | nil, err
function M.from_csv_text(text, origin)
  util.arg("schedule.from_csv_text", 1, "text", text, "string")
  util.arg("schedule.from_csv_text", 2, "origin", origin, "?string", "a name for messages")
  return core.schedule_from_csv(text, origin or "csv")
end

-- Checks of the JSON form: each raises {json = "<field> must be ..."} (a
-- table, so a message of ours is told apart from an internal error).
local function json_fail(fmt, ...) error({ json = string.format(fmt, ...) }, 0) end

local function json_int(v, field)
  if math.type(v) == "float" and v == math.floor(v) and math.abs(v) < 2 ^ 53 then
    v = math.tointeger(v)
  end
  if math.type(v) ~= "integer" then
    json_fail("%s must be an integer, got %s", field, type(v) == "string" and ("\"" .. v .. "\"") or tostring(v))
  end
  return v
end

local function json_list(v, field, what)
  if type(v) ~= "table" then json_fail("%s must be a list of %s, got %s", field, what, type(v)) end
  local n = #v
  for k in pairs(v) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      json_fail("%s must be a list of %s, got an object", field, what)
    end
  end
  return v
end

-- The fields of the to_json form, checked, as schedule.new options.
local function json_options(t)
  if type(t) ~= "table" or t[1] ~= nil then
    json_fail("the top level must be an object, got %s", type(t) == "table" and "a list" or type(t))
  end
  local o = {}
  if t.name ~= nil then
    if type(t.name) ~= "string" then json_fail("name must be a string, got %s", type(t.name)) end
    o.name = t.name
  end
  for _, k in ipairs { "ranks", "stages", "microbatches" } do
    if t[k] == nil then json_fail("%s is missing", k) end
    o[k] = json_int(t[k], k)
  end
  local err = select(2, pcall(core.schedule_new, o.ranks, o.stages, o.microbatches))
  if type(err) == "string" then json_fail("%s", err) end
  o.placement = {}
  if t.virtual_stages == nil then
    -- as schedule.new: model stage i on rank i
    if o.stages ~= o.ranks then
      json_fail("virtual_stages is missing; without it stage i goes on rank i, which needs "
        .. "stages = ranks (got %d stages, %d ranks)", o.stages, o.ranks)
    end
    for k = 0, o.stages - 1 do o.placement[k + 1] = { stage = k, rank = k } end
  end
  for i, v in ipairs(json_list(t.virtual_stages or {}, "virtual_stages", "objects")) do
    local f = string.format("virtual_stages[%d]", i - 1)
    if type(v) ~= "table" then json_fail("%s must be an object, got %s", f, type(v)) end
    local id = json_int(v.id, f .. ".id")
    if id ~= i - 1 then json_fail("%s has id %d, expected %d", f, id, i - 1) end
    o.placement[i] = { stage = json_int(v.stage, f .. ".stage"), rank = json_int(v.rank, f .. ".rank") }
  end
  o.routes = {}
  if t.routes == nil then
    -- no routes: with one virtual stage per model stage, every micro-batch
    -- takes the natural route (the virtual stages in model-stage order)
    local of = {}
    for v, p in ipairs(o.placement) do
      if p.stage < 0 or p.stage >= o.stages then
        json_fail("virtual_stages[%d].stage is %d, but the schedule has stages 0..%d", v - 1,
          p.stage, o.stages - 1)
      end
      if of[p.stage] then
        json_fail("routes is missing, and model stage %d has two virtual stages (%d and %d): "
          .. "give each micro-batch's route", p.stage, of[p.stage], v - 1)
      end
      of[p.stage] = v - 1
    end
    local natural = {}
    for k = 0, o.stages - 1 do
      if not of[k] then
        json_fail("routes is missing, and model stage %d has no virtual stage: the natural "
          .. "route needs one virtual stage per model stage", k)
      end
      natural[k + 1] = of[k]
    end
    for m = 1, o.microbatches do o.routes[m] = natural end
  end
  local routes = json_list(t.routes or o.routes, "routes", "lists")
  if #routes ~= o.microbatches then
    json_fail("routes has %d entries, expected one per micro-batch (%d)", #routes, o.microbatches)
  end
  for m, r in ipairs(routes) do
    local f = string.format("routes[%d]", m - 1)
    json_list(r, f, "virtual stage ids")
    local route = {}
    for k, v in ipairs(r) do route[k] = json_int(v, string.format("%s[%d]", f, k - 1)) end
    o.routes[m] = route
  end
  o.actions = {}
  local actions = json_list(t.actions or {}, "actions", "lists")
  if #actions > o.ranks then json_fail("actions has %d lists for %d ranks", #actions, o.ranks) end
  for r, list in ipairs(actions) do
    local f = string.format("actions[%d]", r - 1)
    json_list(list, f, "action strings")
    for i, a in ipairs(list) do
      if type(a) ~= "string" then
        json_fail("%s[%d] must be an action string such as \"0F3\", got %s", f, i - 1, type(a))
      end
    end
    o.actions[r - 1] = list
  end
  return o
end

-- schedule.from_json(text[, origin]) -> Schedule | nil, err (the to_json
-- format). Errors name the field: "s.json: virtual_stages[1] must be an object".
function M.from_json(text, origin)
  util.arg("schedule.from_json", 2, "origin", origin, "?string", "a name for messages")
  local json = require("luapipe.json")
  origin = origin or "json"
  if type(text) ~= "string" then return nil, origin .. ": expected JSON text, got " .. type(text) end
  local t, _, err = json.decode(text)
  if err then return nil, origin .. ": " .. tostring(err) end
  local ok, o = pcall(json_options, t)
  if not ok then
    if type(o) == "table" and o.json then return nil, origin .. ": " .. o.json end
    error(o, 0)
  end
  local built, s = pcall(M.new, o)
  if not built then
    return nil, origin .. ": " .. (tostring(s):gsub("^.-:%d+: ", ""):gsub("^schedule.new: ", ""))
  end
  return s
end

-- schedule.build(name, opts) -> Schedule: a built-in family by name (any
-- case, or an alias such as "zb-h1").
function M.build(name, opts)
  util.arg("schedule.build", 1, "name", name, "string", "a family name (" .. table.concat(M.families, ", ") .. ")")
  util.arg("schedule.build", 2, "opts", opts, "table", "a table {pp =, microbatches =, chunks =}")
  local fam = schedules.canonical(name)
  if not fam then
    error(string.format("unknown schedule '%s' (families: %s)", tostring(name),
      table.concat(M.families, ", ")), 2)
  end
  return schedules[fam](opts)
end

function M.is_family(name) return schedules.canonical(name) ~= nil end

-- schedule.load(spec, opts) -> Schedule | nil, err
-- spec is a family name (opts: pp, microbatches, chunks), a .csv file, a
-- .json file, or a schedule file: a .lua file run with opts as its one
-- argument (`local opts = ...`; the CLI passes {pp =, microbatches =,
-- chunks =} as typed or defaulted) that returns a schedule
-- (examples/eager_1f1b.lua).
function M.load(spec, opts)
  util.arg("schedule.load", 1, "spec", spec, "string", "a family name or a .csv, .json or .lua file name")
  opts = util.arg("schedule.load", 2, "opts", opts, "?table", "a table {pp =, microbatches =, chunks =}") or {}
  if M.is_family(spec) then
    local ok, s = pcall(M.build, spec, opts)
    if not ok then return nil, util.message(s) end
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
      return nil, string.format("%s: a schedule file must return its schedule, but it returned %s "
        .. "(it is run with the options {pp =, microbatches =, chunks =} as `...` and must end with "
        .. "`return s`; see examples/eager_1f1b.lua); a script that does something else runs as "
        .. "`luapipe %s`", spec, s == nil and "nothing" or util.shown(s), spec)
    end
    return s
  end
  return nil, string.format("'%s' is not a schedule family (%s) nor a .csv, .json or .lua file",
    spec, table.concat(M.families, ", "))
end

-- ---- Lua-side methods of luapipe.Schedule ----

-- s:note() -> text or nil: what a family builder says about the schedule
-- it built from these counts (interleaved1f1b with too few micro-batches
-- for its steady state), shown by s:summary(), `luapipe schedule` /
-- `simulate` and train{}. s:set_note(text) sets it (builders). Not kept
-- by s:clone() or s:lower().
local notes = setmetatable({}, { __mode = "k" })
function Schedule.note(s) return notes[s] end
function Schedule.set_note(s, text)
  notes[s] = util.arg("s:set_note", 1, "text", text, "?string")
end

-- Editing a rank's list (the C binding has s:push, all or nothing, and
-- s:pop(rank[, n]), which returns what it removed):
-- s:clear(rank) empties it; returns nothing, so the REPL echoes nothing.
function Schedule.clear(s, rank)
  s:clear_rank(util.int_arg("s:clear", 1, "rank", rank, 0, s:info().ranks - 1))
end

-- s:set(rank, list) replaces rank's list with list (action strings, or
-- one string); all or nothing: a bad entry raises (numbered in the new
-- list) and leaves the old list in place.
function Schedule.set(s, rank, list)
  util.int_arg("s:set", 1, "rank", rank, 0, s:info().ranks - 1)
  if type(list) ~= "table" and type(list) ~= "string" then
    util.raise(string.format("s:set: list (argument 2) must be a list of action strings such as "
      .. "{\"0F0\", \"0B0\"}, got %s", util.shown(list)))
  end
  local old = s:actions(rank)
  s:clear_rank(rank)
  local ok, err = pcall(s.push, s, rank, list)
  if not ok then
    s:clear_rank(rank)
    s:push(rank, old)
    error(err, 0)
  end
end

-- s:ranks_list() is handy in loops: for r = 0, s:info().ranks - 1 ...
function Schedule.write_csv(s, path)
  util.arg("s:write_csv", 1, "path", path, "string", "a file name")
  return write_file(path, s:to_csv())
end
function Schedule.write_json(s, path)
  util.arg("s:write_json", 1, "path", path, "string", "a file name")
  return write_file(path, s:to_json())
end

-- s:summary() -> one paragraph of text
function Schedule.summary(s)
  local i = s:info()
  local n = 0
  for r = 0, i.ranks - 1 do n = n + s:count(r) end
  local ok, err = s:validate()
  return string.format("schedule %s: %s, %s (%d virtual), %s, %s%s, %s",
    i.name ~= "" and ("'" .. i.name .. "'") or "(unnamed)", util.count(i.ranks, "rank"),
    util.count(i.stages, "stage"), i.vstages, util.count(i.microbatches, "micro-batch"),
    util.count(n, "action"), i.lowered and " (lowered)" or "",
    ok and "valid" or ("INVALID: " .. err)) .. (notes[s] and ("\nnote: " .. notes[s]) or "")
end

local mt = getmetatable(core.schedule_new(1, 1, 1))
mt.__tostring = function(s)
  local ok, text = pcall(Schedule.summary, s)
  return ok and text or "luapipe.Schedule (closed)"
end

-- The simulator's and the pictures' methods (res:summary, res:show,
-- s:show, s:gantt) come with every schedule: those modules install them on
-- the C classes (the binding never loads Lua modules itself).
require("luapipe.sim")

-- a mistyped method (s:valdate()) gets a "did you mean"
util.guard(Schedule, "luapipe.Schedule")

-- a mistyped name ("luapipe.schedule.x") gets a "did you mean"
return require("luapipe.util").guard(M, "luapipe.schedule")
