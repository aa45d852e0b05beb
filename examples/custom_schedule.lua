-- Writing your own pipeline schedule, and comparing it with a built-in one:
-- "eager 1F1B" (examples/eager_1f1b.lua, a schedule file) against plain
-- 1F1B, validated, simulated under one cost model with a message latency,
-- and drawn. Run it:
--
--   ./build/luapipe examples/custom_schedule.lua
--
-- (This is a script. A schedule file returns its schedule and can be given
-- to `luapipe schedule` / `luapipe simulate`: see examples/eager_1f1b.lua.
-- Given to them, this script returns the eager schedule too.)
local schedule = require("luapipe.schedule")

local P, M = 4, 8 -- ranks (= model stages here) and micro-batches

-- the schedule file beside this script, run with the options as `...`
local here = (debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./")
local opts = ...
if type(opts) == "table" then -- loaded as a schedule file: that schedule, no comparison
  return assert(schedule.load(here .. "eager_1f1b.lua", opts))
end
local eager = assert(schedule.load(here .. "eager_1f1b.lua", { pp = P, microbatches = M }))
local plain = schedule.build("1f1b", { pp = P, microbatches = M })

-- validate: nil plus a message naming rank, action and reason when wrong
assert(eager:validate())
print(eager)                                -- one-line summary
for r = 0, P - 1 do print("rank " .. r .. ": " .. table.concat(eager:actions(r), " ")) end

-- simulate both under the same cost model, with a message latency
local cost = { F = 1, B = 2, latency = 0.5 }
local res = eager:simulate(cost)
local base = plain:simulate(cost)
print(string.format("makespan %g, largest bubble %g (plain 1F1B: %g, %g)",
  res:makespan(), res:max_bubble(), base:makespan(), base:max_bubble()))
for _, x in ipairs(res:ranks()) do
  print(string.format("  rank %d: busy %g, bubble %g, peak activations %d", x.rank, x.busy,
    x.bubble, x.peak_live))
end

-- draw it (terminal Gantt chart)
res:show()
