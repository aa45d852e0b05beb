-- luapipe.lr: learning-rate schedules, as train{lr_schedule =} takes them.
--
--   lr_schedule = { warmup = 100, decay = "cosine", steps = 2000, min_lr = 1e-5 }
--   lr_schedule = function(step) return 3e-4 * math.min(1, step / 100) end
--
-- The rate of step k (from 1), with lr the optimizer's rate:
--   k <= warmup:  lr * k / warmup                          (linear warmup)
--   after it, with p = (k - warmup) / (steps - warmup), at most 1:
--     "cosine":   min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
--     "linear":   lr + (min_lr - lr) * p
--     "constant": lr
-- steps defaults to the run's steps and min_lr to 0. The rate depends on
-- the step alone, so a resumed run (train{resume =}) continues the
-- schedule where it stopped; the checkpoint's state.json records it, and a
-- resume under another schedule says so once.
local util = require("luapipe.util")

local M = {}

M.decays = { "cosine", "linear", "constant" }

local function is_decay(d)
  for _, v in ipairs(M.decays) do if v == d then return true end end
  return false
end

-- lr.check(spec, who) -> nil | message: what is wrong with a schedule table.
function M.check(spec, who)
  who = who or "lr_schedule"
  if type(spec) == "function" then return nil end
  if type(spec) ~= "table" then
    return string.format("%s must be a table {warmup =, decay =, steps =, min_lr =} or a "
      .. "function(step) -> rate, got %s", who, util.shown(spec))
  end
  for k in pairs(spec) do
    if k ~= "warmup" and k ~= "decay" and k ~= "steps" and k ~= "min_lr" then
      return string.format("%s: unknown field %s (it takes warmup, decay, steps, min_lr)", who,
        util.shown(k))
    end
  end
  local w = spec.warmup or 0
  if math.type(w) ~= "integer" or w < 0 then
    return string.format("%s.warmup must be an integer >= 0, got %s", who, util.shown(spec.warmup))
  end
  if spec.decay ~= nil and not is_decay(spec.decay) then
    return string.format("%s.decay must be \"cosine\", \"linear\" or \"constant\", got %s", who,
      util.shown(spec.decay))
  end
  if spec.steps ~= nil and (math.type(spec.steps) ~= "integer" or spec.steps < 1) then
    return string.format("%s.steps must be a positive integer, got %s", who, util.shown(spec.steps))
  end
  local m = spec.min_lr
  if m ~= nil and (type(m) ~= "number" or m < 0 or m ~= m or m == math.huge) then
    return string.format("%s.min_lr must be a number >= 0, got %s", who, util.shown(m))
  end
  return nil
end

-- lr.at(spec, lr, steps) -> function(step) -> rate: the schedule as a
-- function; a user function is wrapped so that a result that is not a
-- finite number >= 0 raises, naming the step and the value.
function M.at(spec, lr, steps, who)
  who = who or "lr_schedule"
  local bad = M.check(spec, who)
  if bad then util.raise(bad) end
  if type(spec) == "function" then
    return function(k)
      local v = spec(k)
      if type(v) ~= "number" or v ~= v or v < 0 or v == math.huge then
        error(string.format("%s(%d) returned %s: a learning rate is a finite number >= 0", who, k,
          util.shown(v)), 0)
      end
      return v
    end
  end
  local warmup, decay = spec.warmup or 0, spec.decay or "cosine"
  local total, min_lr = spec.steps or steps, spec.min_lr or 0
  return function(k)
    if k <= warmup then return lr * k / warmup end
    if decay == "constant" then return lr end
    local p = total > warmup and math.min(1, (k - warmup) / (total - warmup)) or 1
    if decay == "linear" then return lr + (min_lr - lr) * p end
    return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * p)) / 2
  end
end

-- lr.record(spec, lr, steps) -> what a checkpoint's state.json keeps of the
-- schedule in force: {lr =, warmup =, decay =, steps =, min_lr =}, or
-- {fn = true} for a Lua function (which cannot be stored).
function M.record(spec, lr, steps)
  if type(spec) == "function" then return { fn = true } end
  return { lr = lr, warmup = spec.warmup or 0, decay = spec.decay or "cosine",
    steps = spec.steps or steps, min_lr = spec.min_lr or 0 }
end

-- lr.same(a, b) -> true when two records describe the same schedule
function M.same(a, b)
  if type(a) ~= "table" or type(b) ~= "table" then return false end
  if a.fn or b.fn then return a.fn == b.fn end
  for _, k in ipairs({ "lr", "warmup", "decay", "steps", "min_lr" }) do
    if a[k] ~= b[k] then return false end
  end
  return true
end

-- lr.describe_record(r) -> text of a record (lr.record)
function M.describe_record(r)
  if r.fn then return "a Lua function of the step" end
  return string.format("rate %g, warmup %d, %s decay over %d steps to %g", r.lr, r.warmup, r.decay,
    r.steps, r.min_lr)
end

return M
