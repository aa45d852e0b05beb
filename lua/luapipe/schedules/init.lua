-- luapipe.schedules: the built-in schedule families by name. Each entry is a
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

local names = { "gpipe", "1f1b", "interleaved1f1b", "zb1p", "zbv", "dualpipe", "dualpipev" }

-- schedules.list() -> the family names, in the order above (a new table)
function M.list()
  return table.move(names, 1, #names, 1, {})
end

return setmetatable(M, {
  __index = function(t, k)
    for _, name in ipairs(names) do
      if name == k then
        local builder = require("luapipe.schedules." .. k)
        rawset(t, k, builder)
        return builder
      end
    end
  end,
})
