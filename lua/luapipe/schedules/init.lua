-- luapipe.schedules: the built-in schedule families by name — the one list
-- of them (luapipe.schedule, the CLI and the help ask it). Each entry is a
-- builder function(opts) -> Schedule, loaded on first use:
--
--   local schedules = require("luapipe.schedules")
--   local s = schedules.dualpipe { pp = 8, microbatches = 20 }
--   local t = schedules["1f1b"] { pp = 4, microbatches = 8 }
--   for _, name in ipairs(schedules.list()) do ... end
--
-- opts: pp (ranks), microbatches, chunks (interleaved1f1b only, default 2),
-- name (optional). Read the family files to see how a schedule is written.
local util = require("luapipe.util")
local M = {}

-- name (the module luapipe.schedules.<name>), label (as papers write it),
-- aliases users type (any case is accepted for every spelling), needs (what
-- the family asks of pp and microbatches beyond being positive: see problem)
local families = {
  { name = "gpipe", label = "GPipe" },
  { name = "1f1b", label = "1F1B" },
  { name = "interleaved1f1b", label = "Interleaved 1F1B", aliases = { "interleaved" } },
  { name = "zb1p", label = "ZB1P", aliases = { "zb-h1", "zbh1" } },
  { name = "zbv", label = "ZB-V", aliases = { "zb-v" } },
  { name = "dualpipe", label = "DualPipe", needs = { pp_even = true, mb_even = true,
    mb_per_pp = 2 } },
  { name = "dualpipev", label = "DualPipeV", aliases = { "dualpipe-v" },
    needs = { mb_per_pp = 2 } },
  { name = "chimera", label = "Chimera", needs = { pp_even = true, mb_multiple_of_pp = true } },
}

local by_spelling, by_name = {}, {}
for _, f in ipairs(families) do
  by_name[f.name] = f
  by_spelling[f.name] = f.name
  by_spelling[f.label:lower()] = f.name
  for _, a in ipairs(f.aliases or {}) do by_spelling[a] = f.name end
end

-- schedules.list() -> the family names, in the order above (a new table)
function M.list()
  local t = {}
  for i, f in ipairs(families) do t[i] = f.name end
  return t
end

-- schedules.canonical(spelling) -> the family name ("ZB-H1" -> "zb1p"), or
-- nil when it names no family
function M.canonical(spelling)
  return type(spelling) == "string" and by_spelling[spelling:lower()] or nil
end

-- schedules.label(name) -> "DualPipe" (the name itself when unknown)
function M.label(name)
  local f = by_name[M.canonical(name) or ""]
  return f and f.label or name
end


-- schedules.problem(name, pp, microbatches) -> nil when the family can be
-- built with these counts, else the first constraint they break, as data:
--   {family = "dualpipe", label = "DualPipe", field = "pp" | "microbatches",
--    rule = "even" | "at_least" | "multiple_of", need = <the bound>,
--    per_pp = <k of "at least k*pp">, got = <the value>,
--    text = "pp must be even, got 3"}
-- The family's builder raises "<family>: <text>"; callers that know more
-- about where pp came from (luapipe.train: the ranks mpirun started) word
-- it from the fields. pp and microbatches are positive integers.
function M.problem(name, pp, mb)
  util.arg("schedules.problem", 1, "name", name, "string", "a family name")
  util.arg("schedules.problem", 2, "pp", pp, "integer", "a positive integer")
  util.arg("schedules.problem", 3, "microbatches", mb, "integer", "a positive integer")
  local f = by_name[M.canonical(name) or ""]
  local needs = f and f.needs
  if not needs then return nil end
  local function bad(field, rule, need, got, text)
    return { family = f.name, label = f.label, field = field, rule = rule, need = need, got = got,
      per_pp = rule == "at_least" and needs.mb_per_pp or nil, text = text }
  end
  if needs.pp_even and pp % 2 ~= 0 then
    return bad("pp", "even", 2, pp, string.format("pp must be even, got %d", pp))
  end
  if needs.mb_even and mb % 2 ~= 0 then
    return bad("microbatches", "even", 2, mb, string.format("microbatches must be even, got %d",
      mb))
  end
  if needs.mb_per_pp and mb < needs.mb_per_pp * pp then
    local need = needs.mb_per_pp * pp
    return bad("microbatches", "at_least", need, mb,
      string.format("microbatches must be at least %d*pp = %d, got %d", needs.mb_per_pp, need, mb))
  end
  if needs.mb_multiple_of_pp and mb % pp ~= 0 then
    return bad("microbatches", "multiple_of", pp, mb,
      string.format("microbatches must be a multiple of pp = %d, got %d", pp, mb))
  end
  return nil
end

-- schedules.check(name, pp, microbatches, level): raises "<family>: <text>"
-- of schedules.problem at level (a builder passes 3: its caller)
function M.check(name, pp, mb, level)
  util.arg("schedules.check", 4, "level", level, "?integer", "a stack level")
  local p = M.problem(name, pp, mb)
  if p then error(p.family .. ": " .. p.text, level and level + 1 or 2) end
end
setmetatable(M, {
  __index = function(t, k)
    if by_name[k] then
      local builder = require("luapipe.schedules." .. k)
      rawset(t, k, builder)
      return builder
    end
  end,
})
-- a mistyped family or function name gets a "did you mean"
return util.guard(M, "luapipe.schedules", M.list)
