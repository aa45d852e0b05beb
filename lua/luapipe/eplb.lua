-- luapipe.eplb: expert placement (DeepSeek's EPLB) from Lua: the C planner,
-- load predictors and a Balancer for training or serving loops.
--
--   local eplb = require("luapipe.eplb")
--   local plan = assert(eplb.rebalance{ load = counts, replicas = 288,
--     groups = 8, nodes = 4, gpus = 32 })
--   plan.physical_to_logical[layer][slot + 1]  --> expert id (0-based)
--
-- Ids of experts and slots are 0-based, as in DeepSeek's maps; tables are
-- 1-based Lua arrays of them. Messages number layers from 0 too. Misuse
-- (wrong types, unknown options) raises; bad data and impossible
-- configurations return nil, message.
local core = require("luapipe.core")
local util = require("luapipe.util")

local M = {}

M.modes = { "balanced", "reference" }

local known = {
  load = true, replicas = true, groups = true, nodes = true, gpus = true, mode = true,
  spill = true, previous = true, max_moves = true, fixed_x = true, compact = true,
  ragged = true, json = true,
}

local function check_options(fname, opts)
  if type(opts) ~= "table" then
    error(fname .. ": expected a table of options, got " .. type(opts), 3)
  end
  for k in pairs(opts) do
    if not known[k] then error(fname .. ": unknown option '" .. tostring(k) .. "'", 3) end
  end
  if opts.load == nil then error(fname .. ": option 'load' is required", 3) end
  if opts.mode ~= nil and opts.mode ~= "balanced" and opts.mode ~= "reference" then
    error(fname .. ": unknown mode '" .. tostring(opts.mode) .. "' (expected balanced or reference)", 3)
  end
end

-- eplb.rebalance{load=, replicas=, groups=1, nodes=1, gpus=, mode="balanced",
--   spill=false, previous=nil, max_moves=nil, fixed_x=nil, compact=false, ragged=false,
--   json=false}
-- load: {{l0e0, l0e1, ...}, ...} (layers x experts, non-negative).
-- previous: the plan in force, as a result of rebalance or its
--   physical_to_logical (tables or compact string).
-- Returns {physical_to_logical, logical_to_physical, logical_count,
--   gpu_load, gpu_copies (with previous: copies each GPU receives),
--   stats = {balancedness, gpu_max_over_mean, node_max_over_mean,
--   off_node_load, copies, duplicates, solve_ms, refine_steps, refine_work,
--   refine_cut (balanced mode's swap refinement: swaps, budget units
--   spent, passes its budget stopped), per_layer = {...}},
--   layers, experts, replicas, gpus, nodes, width, policy, mode, compact}
-- or nil, message[, where] (where = {layer =}: with previous, the layer
-- of it the planner refused, 0-based, when one is to blame) (also beyond eplb.limits: "58 layers x 131072 replicas =
-- 7602176 slots: more than the limit of 4194304 slots in all (layers x
-- replicas)"). compact = true gives the three maps as strings of
-- native int32 (read them with string.unpack("i4", s, 4 * i + 1)).
-- ragged = true lists each expert's slots in logical_to_physical without
-- the -1 padding (logical_to_physical[l][e] has logical_count[l][e]
-- entries), so the result grows with the plan, not with experts x width.
-- json = true gives, instead of the three maps, json_rows =
-- {physical_to_logical = {...}, logical_to_physical = {...}, logical_count =
-- {...}}: one JSON text per layer (logical_to_physical unpadded, or with
-- fixed_x every expert's row padded with -1 to fixed_x entries: DeepSeek's
-- layout at fixed_x = replicas - experts + 1), made in C.
-- Calls a core planner; an option error it raises (a count out of range,
-- a wrong type) is raised again at the caller of eplb.rebalance/evaluate
-- (the binding's errors carry no position of their own).
local function call_core(f, args)
  local ok, r, err = pcall(f, args)
  if not ok then error(util.message(r), 3) end
  return r, err
end

-- The layer (0-based) of the previous plan the planner refused, found by
-- planning each layer alone with and without its previous row (never read
-- from the message); nil when no one layer is to blame.
local function refused_layer(args)
  local prev = args.previous
  if type(prev) == "table" and prev.physical_to_logical then prev = prev.physical_to_logical end
  if type(prev) ~= "table" or type(args.load) ~= "table" then return nil end
  for l = 1, #args.load do
    local one = {}
    for k, v in pairs(args) do one[k] = v end
    one.load, one.previous, one.max_moves = { args.load[l] }, { prev[l] }, nil
    local ok, r = pcall(core.eplb_rebalance, one)
    if ok and not r then
      one.previous = nil
      local ok2, r2 = pcall(core.eplb_rebalance, one)
      if ok2 and r2 then return l - 1 end
    end
  end
  return nil
end

function M.rebalance(opts)
  check_options("eplb.rebalance", opts)
  local args = {}
  for k, v in pairs(opts) do args[k] = v end
  args.mode = args.mode or "balanced"
  args.groups = args.groups or 1
  args.nodes = args.nodes or 1
  local r, err = call_core(core.eplb_rebalance, args) -- not a tail call: error level 3
  if not r and args.previous ~= nil then return nil, err, { layer = refused_layer(args) } end
  return r, err
end

-- eplb.evaluate{load=, physical_to_logical=, gpus=, nodes=1, previous=nil}
-- measures an existing placement under a load: same result fields.
function M.evaluate(opts)
  if type(opts) ~= "table" then
    error("eplb.evaluate: expected a table of options, got " .. type(opts), 2)
  end
  local map = opts.physical_to_logical
  if type(map) == "table" and map.physical_to_logical then map = map.physical_to_logical end
  local previous = opts.previous
  if type(previous) == "table" and previous.physical_to_logical then
    previous = previous.physical_to_logical
  end
  local r, err = call_core(core.eplb_evaluate, { load = opts.load, physical_to_logical = map,
    gpus = opts.gpus, nodes = opts.nodes or 1, previous = previous, compact = opts.compact,
    ragged = opts.ragged })
  return r, err
end

-- Checks a configuration (layers defaults to 1), size limits included:
-- true, or nil, message.
function M.check(experts, replicas, groups, nodes, gpus, layers)
  for i, a in ipairs { { "experts", experts }, { "replicas", replicas }, { "groups", groups },
    { "nodes", nodes }, { "gpus", gpus } } do
    util.arg("eplb.check", i, a[1], a[2], "integer")
  end
  util.arg("eplb.check", 6, "layers", layers, "?integer")
  return core.eplb_check(experts, replicas, groups, nodes, gpus, layers)
end

-- Size limits, checked before anything is allocated (lp_eplb.h): slots per
-- layer (replicas), slots in all (layers x replicas), and GPUs when
-- re-planning against a previous plan. Beyond them rebalance/evaluate
-- return nil and one line naming the limit and the size asked for.
M.limits = { replicas = core.EPLB_MAX_REPLICAS, slots = core.EPLB_MAX_SLOTS,
  relabel_gpus = core.EPLB_MAX_RELABEL_GPUS }

---------------------------------------------------------------------------
-- Predictors: each factory returns f(history) -> load, where history is the
-- list of recorded windows, oldest first: {{step = s, counts = {{...}}}, ...}
-- and load is a layers x experts table. Any Lua function of that shape
-- works as a predictor too.
---------------------------------------------------------------------------

local function zeros_like(m)
  local out = {}
  for l = 1, #m do
    local row = {}
    for e = 1, #m[l] do row[e] = 0 end
    out[l] = row
  end
  return out
end

local function add_into(acc, m, scale)
  for l = 1, #acc do
    local a, r = acc[l], m[l]
    for e = 1, #a do a[e] = a[e] + scale * r[e] end
  end
end

local function check_window(fname, n)
  if math.type(n) ~= "integer" or n < 1 then
    error("eplb.predictors." .. fname .. ": window must be a positive integer, got " .. tostring(n), 3)
  end
end

local function last_n(history, n)
  local first = math.max(1, #history - n + 1)
  return first, #history
end

M.predictors = {}

-- The last recorded window, as is.
function M.predictors.last()
  return function(history)
    local out = zeros_like(history[#history].counts)
    add_into(out, history[#history].counts, 1)
    return out
  end
end

-- Sum of the last n windows (vLLM's expert-load window).
function M.predictors.sliding_window(n)
  check_window("sliding_window", n)
  return function(history)
    local first, last = last_n(history, n)
    local out = zeros_like(history[last].counts)
    for i = first, last do add_into(out, history[i].counts, 1) end
    return out
  end
end

-- Mean of the last n windows.
function M.predictors.moving_average(n)
  check_window("moving_average", n)
  return function(history)
    local first, last = last_n(history, n)
    local out = zeros_like(history[last].counts)
    for i = first, last do add_into(out, history[i].counts, 1 / (last - first + 1)) end
    return out
  end
end

-- Exponential moving average: e = alpha * x + (1 - alpha) * e, seeded with
-- the oldest window.
function M.predictors.ema(alpha)
  if type(alpha) ~= "number" or not (alpha > 0 and alpha <= 1) then
    error("eplb.predictors.ema: alpha must be in (0, 1], got " .. tostring(alpha), 2)
  end
  return function(history)
    local out = zeros_like(history[1].counts)
    add_into(out, history[1].counts, 1)
    for i = 2, #history do
      local m = history[i].counts
      for l = 1, #out do
        local a, r = out[l], m[l]
        for e = 1, #a do a[e] = alpha * r[e] + (1 - alpha) * a[e] end
      end
    end
    return out
  end
end

---------------------------------------------------------------------------
-- Balancer: record(step, counts) every step, plan() when the trigger says
-- so. User policies (predictor, trigger) run through one protected call;
-- a policy that errors or returns garbage is reported once and replaced by
-- the built-in default for the rest of the run.
---------------------------------------------------------------------------

local Balancer = {}
Balancer.__index = Balancer
M.Balancer = Balancer

local balancer_known = {
  replicas = true, groups = true, nodes = true, gpus = true, mode = true, spill = true,
  max_moves = true, fixed_x = true, predictor = true, window = true, every = true,
  threshold = true, trigger = true, keep = true, on_warning = true,
}

-- Every call into user code goes through here: returns true, value or
-- false, message-with-traceback.
local function protected(f, ...)
  return xpcall(f, debug.traceback, ...)
end

local function default_warning(msg)
  io.stderr:write("luapipe.eplb: ", msg, "\n")
end

-- eplb.balancer{replicas=, groups=1, nodes=1, gpus=, mode="balanced",
--   spill=false, max_moves=nil, predictor=<sliding window>, window=10,
--   every=100, threshold=nil, trigger=nil, keep=nil, on_warning=<stderr>}
-- predictor: f(history) -> load; the default sums the last `window`
--   windows. history: the recorded windows, oldest first, {{step = s,
--   counts = {{...}, ...}}, ...} (the last max(keep, window) of them; the
--   predictor must not change it); load: layers x experts numbers.
-- every: the first step with a record plans; after that a step re-plans
--   when step - (the step of the last plan or threshold skip) >= every.
--   threshold: skip a due re-plan while the current placement's
--   balancedness under the predicted load is at least this (SGLang's
--   rule; the skip restarts the count). trigger: optional f(balancer,
--   step) -> boolean asked at every b:due/b:step, first plan included,
--   replacing the every-N rule and threshold.
function Balancer.new(opts)
  if type(opts) ~= "table" then error("eplb.balancer: expected a table of options", 2) end
  for k in pairs(opts) do
    if not balancer_known[k] then error("eplb.balancer: unknown option '" .. tostring(k) .. "'", 2) end
  end
  for _, k in ipairs({ "replicas", "gpus" }) do
    if math.type(opts[k]) ~= "integer" then
      error("eplb.balancer: option '" .. k .. "' must be an integer", 2)
    end
  end
  local window = opts.window or 10
  if math.type(window) ~= "integer" or window < 1 then
    error("eplb.balancer: window must be a positive integer", 2)
  end
  local every = opts.every or 100
  if math.type(every) ~= "integer" or every < 1 then
    error("eplb.balancer: every must be a positive integer", 2)
  end
  if opts.threshold ~= nil and type(opts.threshold) ~= "number" then
    error("eplb.balancer: threshold must be a number", 2)
  end
  for _, k in ipairs({ "predictor", "trigger", "on_warning" }) do
    if opts[k] ~= nil and type(opts[k]) ~= "function" then
      error("eplb.balancer: " .. k .. " must be a function", 2)
    end
  end
  if opts.mode ~= nil and opts.mode ~= "balanced" and opts.mode ~= "reference" then
    error("eplb.balancer: unknown mode '" .. tostring(opts.mode) .. "'", 2)
  end
  local self = setmetatable({}, Balancer)
  self.replicas, self.gpus = opts.replicas, opts.gpus
  self.groups, self.nodes = opts.groups or 1, opts.nodes or 1
  self.mode, self.spill = opts.mode or "balanced", opts.spill or false
  self.max_moves, self.fixed_x = opts.max_moves, opts.fixed_x
  self.window, self.every, self.threshold = window, every, opts.threshold
  self.default_predictor = M.predictors.sliding_window(window)
  self.predictor = opts.predictor or self.default_predictor
  self.trigger = opts.trigger
  self.keep = math.max(opts.keep or 0, window)
  self.on_warning = opts.on_warning or default_warning
  self.history = {}
  self.warnings = {}
  self.current = nil      -- the plan in force (a rebalance result)
  self.last_check = nil   -- step of the last plan or threshold skip
  self.plans = 0
  return self
end

M.balancer = Balancer.new

-- Reports a failed policy once and falls back to the default.
function Balancer:_policy_failed(kind, msg)
  if kind == "predictor" then
    self.predictor = self.default_predictor
  else
    self.trigger = nil
  end
  local text = kind .. " failed (" .. msg .. "); using the built-in default from now on"
  self.warnings[#self.warnings + 1] = text
  self.on_warning(text)
end

local function check_counts(fname, counts, layers, experts)
  if type(counts) ~= "table" or #counts == 0 then
    return nil, fname .. ": counts must be a non-empty table of layers"
  end
  local E = layers and experts or (type(counts[1]) == "table" and #counts[1] or -1)
  if layers and #counts ~= layers then
    return nil, string.format("%s: %s, expected %d", fname, util.count(#counts, "layer"), layers)
  end
  for l = 1, #counts do
    local row = counts[l]
    if type(row) ~= "table" then
      return nil, string.format("%s: layer %d is a %s, not a table", fname, l - 1, type(row))
    end
    if #row ~= E or E == 0 then
      return nil, string.format("%s: layer %d has %s, expected %d", fname, l - 1, util.count(#row, "expert"), E)
    end
    for e = 1, E do
      local v = row[e]
      if type(v) ~= "number" or v ~= v or v < 0 or v == math.huge then
        return nil, string.format("%s: layer %d, expert %d is %s, not a non-negative number",
          fname, l - 1, e - 1, tostring(v))
      end
    end
  end
  return true
end

-- b:record(step, counts): the expert counts of one step (or window).
-- Steps must increase. Misuse raises.
function Balancer:record(step, counts)
  if math.type(step) ~= "integer" then util.raise("Balancer:record: step must be an integer") end
  local last = self.history[#self.history]
  if last and step <= last.step then
    util.raise(string.format("Balancer:record: step %d after step %d", step, last.step))
  end
  local ok, err = check_counts("Balancer:record", counts, self.layers, self.experts)
  if not ok then util.raise(err) end
  self.layers, self.experts = #counts, #counts[1]
  local copy = {}
  for l = 1, #counts do copy[l] = table.move(counts[l], 1, #counts[l], 1, {}) end
  self.history[#self.history + 1] = { step = step, counts = copy }
  while #self.history > self.keep do table.remove(self.history, 1) end
end

-- b:export() -> a plain table (numbers, lists) of what the balancer has
-- learnt: the recorded history, the placement in force, the step of the
-- last check and the plan count (for checkpoints; the options, predictor
-- and trigger are the caller's to give again). b:import(t) takes it back
-- into a balancer built with the same options; raises on a malformed t.
function Balancer:export()
  return { history = self.history, layers = self.layers, experts = self.experts,
    current = self.current and self.current.physical_to_logical or nil,
    last_check = self.last_check, plans = self.plans }
end

function Balancer:import(t)
  if type(t) ~= "table" or type(t.history) ~= "table" then
    util.raise("Balancer:import: expected a table from Balancer:export")
  end
  local hist = {}
  for i, h in ipairs(t.history) do
    if math.type(h.step) ~= "integer" or type(h.counts) ~= "table" then
      util.raise("Balancer:import: history entry " .. i .. " is malformed")
    end
    local counts = {}
    for l, row in ipairs(h.counts) do
      counts[l] = {}
      for e, v in ipairs(row) do counts[l][e] = v + 0.0 end -- recorded counts are floats
    end
    local ok, err = check_counts("Balancer:import", counts, t.layers, t.experts)
    if not ok then util.raise(err) end
    hist[i] = { step = h.step, counts = counts }
  end
  self.history, self.layers, self.experts = hist, t.layers, t.experts
  self.current = t.current and { physical_to_logical = t.current } or nil
  self.last_check, self.plans = t.last_check, t.plans or 0
end

-- The predicted load (layers x experts) from the history; nil, message
-- when nothing was recorded.
function Balancer:predict()
  if #self.history == 0 then return nil, "no load recorded yet" end
  if self.predictor ~= self.default_predictor then
    local ok, load = protected(self.predictor, self.history)
    local err
    if ok and type(load) ~= "table" then
      ok, err = false, string.format("returned %s%s, not a table of loads (layers x experts)",
        type(load) == "string" and string.format("%q", load) or tostring(load),
        load == nil and "" or " (a " .. type(load) .. ")")
    elseif ok then
      ok, err = check_counts("returned a table", load, self.layers, self.experts)
    else
      err = tostring(load)
    end
    if ok then return load end
    self:_policy_failed("predictor", err)
  end
  return self.default_predictor(self.history)
end

-- Balancedness of the plan in force under load (or the predicted load);
-- nil when there is no plan.
function Balancer:balancedness(load)
  if not self.current then return nil end
  load = load or self:predict()
  local r, err = M.evaluate{ load = load, physical_to_logical = self.current, gpus = self.gpus,
    nodes = self.nodes }
  if not r then return nil, err end
  return r.stats.balancedness
end

-- Is a re-plan due at `step`? Returns due, reason.
function Balancer:due(step)
  if #self.history == 0 then return false, "no load recorded yet" end
  if self.trigger then
    local ok, v = protected(self.trigger, self, step)
    if ok and type(v) == "boolean" then
      return v, v and "trigger" or "trigger said no"
    end
    self:_policy_failed("trigger", ok and ("returned " .. tostring(v) .. ", not a boolean") or tostring(v))
  end
  if not self.current then return true, "first plan" end
  if step - self.last_check < self.every then
    return false, string.format("%d steps since the last check, every %d", step - self.last_check, self.every)
  end
  if self.threshold then
    local b = self:balancedness()
    if b and b >= self.threshold then
      self.last_check = step
      return false, string.format("balancedness %.4f >= threshold %.4f", b, self.threshold)
    end
  end
  return true, "every " .. self.every .. " steps"
end

-- Plans from the predicted load against the plan in force; it becomes the
-- plan in force. Returns the plan, or nil, message.
function Balancer:plan()
  local load, err = self:predict()
  if not load then return nil, err end
  local r
  r, err = M.rebalance{ load = load, replicas = self.replicas, groups = self.groups,
    nodes = self.nodes, gpus = self.gpus, mode = self.mode, spill = self.spill,
    previous = self.current, max_moves = self.current and self.max_moves or nil,
    fixed_x = self.fixed_x }
  if not r then return nil, err end
  self.current = r
  self.last_check = self.history[#self.history].step
  self.plans = self.plans + 1
  return r
end

-- record + due + plan: returns the new plan, or nil, reason.
function Balancer:step(step, counts)
  self:record(step, counts)
  local due, why = self:due(step)
  if not due then return nil, why end
  return self:plan()
end

-- a mistyped name ("luapipe.eplb.x") gets a "did you mean"
return require("luapipe.util").guard(M, "luapipe.eplb")
