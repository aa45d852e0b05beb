-- luapipe.sim: cost models and simulation results.
--
--   local sim = require("luapipe.sim")
--   local cost = sim.parse_cost("F=1,B=2,W=1,FB=2.5,latency=0.1")
--   local res = assert(s:simulate(cost))     -- a luapipe.SimResult (C userdata)
--   print(res)                                -- summary: makespan, bubbles, memory
--   res:show()                                -- terminal Gantt chart
--
-- Costs: F, B, I, W, FB (an overlapped F&B pair; default F + the backward
-- half), latency (per cross-rank message) and per-model-stage overrides,
-- stages = {[k] = {F = ...}}; bytes (of one cross-rank message) and link
-- ("lat=50us,bw=2GB/s", the comm layer's emulated-link model: each message
-- also takes lat + bytes/bw; times then in seconds; `--link` on the CLI).
-- values (in one activation: what a message carries and what an F holds)
-- with precision ("f32": 4 bytes a value, the default; "bf16": 2) size
-- messages and give the memory figures in bytes too (res:ranks()'s
-- peak_act_bytes; `--precision` on the CLI); bytes or values, not both.
-- B = I + W fills in what is not given (only B:
-- I = W = B/2; nothing: F=1, B=2, I=1, W=1). Times are abstract units; in
-- traces one unit is shown as one millisecond.
--
-- This module adds the Lua-side methods of luapipe.SimResult: summary,
-- __tostring, show and gantt (the pictures live in luapipe.show).
local core = require("luapipe.core")
local util = require("luapipe.util")

local M = {}
package.loaded["luapipe.sim"] = M -- luapipe.show requires us back

local SimResult = core.SimResult -- the methods table shared with the C binding

M.cost_keys = { "F", "B", "I", "W", "FB", "latency", "bytes", "values" }
local canonical = { f = "F", b = "B", i = "I", w = "W", fb = "FB", latency = "latency",
  lat = "latency", bytes = "bytes", values = "values" }

-- sim.parse_cost(text) -> cost table for s:simulate.
-- text: comma-separated KEY=NUMBER items, e.g. "F=1,B=2,W=1,FB=2.5,latency=0.1";
-- keys F, B, I, W, FB, latency (any case); KEY[k]=NUMBER overrides model
-- stage k ("F[3]=2"). Raises an error naming the bad item.
function M.parse_cost(text)
  if type(text) ~= "string" then
    error("parse_cost: expected a string such as 'F=1,B=2,W=1', got " .. type(text), 2)
  end
  local cost, err = M.read_cost(text)
  if not cost then error(err, 2) end
  return cost
end

-- sim.read_cost(text) -> cost table | nil, message naming the bad item:
-- parse_cost for callers that report the message their own way (the CLI).
function M.read_cost(text)
  if type(text) ~= "string" then
    return nil, "parse_cost: expected a string such as 'F=1,B=2,W=1', got " .. type(text)
  end
  local cost = {}
  for item in (text .. ","):gmatch("([^,]*),") do
    local it = item:match("^%s*(.-)%s*$")
    if it ~= "" then
      local key, value = it:match("^([%w_%[%]]+)%s*=%s*(.+)$")
      if not key then
        return nil, string.format("cost item '%s': expected KEY=NUMBER (keys: F, B, I, W, FB, "
          .. "latency, bytes, values)", it)
      end
      local name, stage = key:match("^(%a+)%[(%d+)%]$")
      name = canonical[(name or key):lower()]
      if not name or (stage and (name == "latency" or name == "bytes" or name == "values")) then
        return nil, string.format("cost item '%s': unknown key '%s' (keys: F, B, I, W, FB, "
          .. "latency, bytes, values%s)",
          it, key, stage and "; per stage: F[k], B[k], I[k], W[k], FB[k]" or "")
      end
      local v = tonumber(value)
      if not v then
        return nil, string.format("cost item '%s': '%s' is not a number", it, value)
      end
      local ok, why = core.sim_check_time(name, v) -- the core's one rule
      if not ok then return nil, string.format("cost item '%s': %s", it, why) end
      if stage then
        cost.stages = cost.stages or {}
        local k = math.tointeger(tonumber(stage))
        cost.stages[k] = cost.stages[k] or {}
        cost.stages[k][name] = v
      else
        cost[name] = v
      end
    end
  end
  return cost
end

-- sim.format_cost(cost) -> "F=1 B=2 W=1" (the keys that are set, in order)
function M.format_cost(cost)
  util.arg("sim.format_cost", 1, "cost", cost, "?table", "a cost table {F =, B =, ...}")
  local parts = {}
  for _, k in ipairs(M.cost_keys) do
    if cost and cost[k] ~= nil then parts[#parts + 1] = string.format("%s=%g", k, cost[k]) end
  end
  return #parts > 0 and table.concat(parts, " ") or "default (F=1 B=2 I=1 W=1)"
end

-- Accepts a cost table, a cost string or nil.
function M.to_cost(cost)
  if type(cost) == "string" then return M.parse_cost(cost) end
  return cost
end

local function num(x)
  if x == math.floor(x) and math.abs(x) < 1e15 then return string.format("%d", x) end
  return (string.format("%.3f", x):gsub("0+$", ""):gsub("%.$", ""))
end
-- sim.resolve_cost(cost) -> {F, B, I, W, FB?, latency}: the model-level
-- times as the simulator fills in what is not given (B = I + W; only B:
-- I = W = B/2; only I or W: the other equal, B their sum; nothing: F=1,
-- B=2, I=W=1); FB only when given; or nil, message when B is less than
-- the I or W given.
function M.resolve_cost(cost)
  util.arg("sim.resolve_cost", 1, "cost", cost, "table", "a cost table {F =, B =, ...}")
  local c, err = core.sim_resolve_cost(cost)
  if not c then return nil, err end
  c.latency = cost.latency or 0
  return c
end

-- sim.format_number(x) -> text: an integer as such, else up to 3 decimals
-- (luapipe search prints its figures with it).
function M.format_number(x)
  util.arg("sim.format_number", 1, "x", x, "number")
  return num(x)
end

-- res:summary() -> text: makespan, then one line per rank.
function SimResult.summary(res)
  local info = res:info()
  local ranks = res:ranks()
  local lines = {}
  local worst = ranks[1]
  for _, r in ipairs(ranks) do
    if r.bubble > worst.bubble then worst = r end
  end
  lines[1] = string.format("simulated %s: %s, %s: makespan %s, "
    .. "largest bubble %s (rank %d, %.1f%%)",
    info.name ~= "" and ("'" .. info.name .. "'") or "schedule", util.count(info.ranks, "rank"),
    util.count(info.microbatches, "micro-batch"), num(res:makespan()), num(res:max_bubble()),
      worst and worst.rank or 0,
    worst and 100 * worst.bubble_ratio or 0)
  lines[2] = string.format("%6s %10s %10s %10s %8s %12s %10s", "rank", "busy", "bubble",
    "bubble %", "finish", "activations", "pending W")
  local bytes = false -- with cost.values: the peak held in bytes too
  for _, r in ipairs(ranks) do bytes = bytes or r.peak_act_bytes > 0 end
  if bytes then lines[2] = lines[2] .. string.format(" %14s", "act. bytes") end
  for _, r in ipairs(ranks) do
    lines[#lines + 1] = string.format("%6d %10s %10s %9.1f%% %8s %12d %10d", r.rank, num(r.busy),
      num(r.bubble), 100 * r.bubble_ratio, num(r.finish), r.peak_live, r.peak_pending_w)
      .. (bytes and string.format(" %14s", num(r.peak_act_bytes)) or "")
  end
  return table.concat(lines, "\n")
end

-- res:gantt([opts]) -> text (see luapipe.show.gantt for opts)
function SimResult.gantt(res, opts)
  return require("luapipe.show").gantt(res, opts)
end

-- res:show([opts]) prints the Gantt chart and the summary.
function SimResult.show(res, opts)
  io.write(res:gantt(opts), "\n", res:summary(), "\n")
end

-- s:simulate([cost]) -> SimResult; an invalid schedule raises with the
-- validation message ("rank 0, action 1 (0B0): ..."), so a script stops at
-- the line that simulated it. s:try_simulate([cost]) -> SimResult | nil,
-- message: the binding's own form, for code that goes on after a failure.
-- Bad costs raise in both.
local Schedule = core.Schedule
if not rawget(Schedule, "try_simulate") then Schedule.try_simulate = Schedule.simulate end
function Schedule.simulate(s, cost)
  util.arg("s:simulate", 1, "cost", cost, "?table", "a cost table such as {F = 1, B = 2, W = 1}")
  local res, err = Schedule.try_simulate(s, cost)
  if not res then util.raise("simulate: " .. tostring(err)) end
  return res
end

-- print(res) shows res:summary(): the C __tostring calls this method.

require("luapipe.show") -- installs the picture methods (svg, write_svg, Schedule:show)

-- a mistyped method (res:makspan()) gets a "did you mean"
util.guard(SimResult, "luapipe.SimResult")

-- a mistyped name ("luapipe.sim.x") gets a "did you mean"
return require("luapipe.util").guard(M, "luapipe.sim")
