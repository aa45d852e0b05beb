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
local M = {}

-- name (the module luapipe.schedules.<name>), label (as papers write it),
-- aliases users type (any case is accepted for every spelling)
local families = {
  { name = "gpipe", label = "GPipe" },
  { name = "1f1b", label = "1F1B" },
  { name = "interleaved1f1b", label = "Interleaved 1F1B", aliases = { "interleaved" } },
  { name = "zb1p", label = "ZB1P", aliases = { "zb-h1", "zbh1" } },
  { name = "zbv", label = "ZB-V", aliases = { "zb-v" } },
  { name = "dualpipe", label = "DualPipe" },
  { name = "dualpipev", label = "DualPipeV", aliases = { "dualpipe-v" } },
  { name = "chimera", label = "Chimera" },
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
return require("luapipe.util").guard(M, "luapipe.schedules", M.list)
