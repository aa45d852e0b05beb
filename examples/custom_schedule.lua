-- Writing your own pipeline schedule: "eager 1F1B".
--
-- Plain 1F1B warms up with P-1-r forwards on rank r, so in the steady state
-- every forward waits for the message that just left the previous rank. An
-- eager 1F1B warms up with about twice as many, 2(P-1-r), so a forward's input
-- is already there when the rank gets to it: more activations held, fewer
-- idle gaps when messages take time. Run it:
--
--   ./build/luapipe examples/custom_schedule.lua
local schedule = require("luapipe.schedule")

local P, M = 4, 8 -- ranks (= model stages here) and micro-batches

local function one_f_one_b(name, warmup_of)
  -- stage i on rank i (the default placement); every micro-batch's route
  -- is stages 0..P-1 (the default route)
  local s = schedule.new { name = name, ranks = P, stages = P, microbatches = M }
  for r = 0, P - 1 do
    local warmup = math.min(warmup_of(r), M)
    local f, b = 0, 0 -- next micro-batch to forward / to backward on this rank
    local function F() s:push(r, string.format("%dF%d", r, f)); f = f + 1 end
    local function B() s:push(r, string.format("%dB%d", r, b)); b = b + 1 end
    for _ = 1, warmup do F() end            -- warm-up
    for _ = 1, M - warmup do F(); B() end   -- steady state: one forward, one backward
    for _ = 1, warmup do B() end            -- cool-down
  end
  return s
end

local eager = one_f_one_b("eager-1f1b", function(r) return 2 * (P - 1 - r) end)
local plain = one_f_one_b("1f1b", function(r) return P - 1 - r end)

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
  print(string.format("  rank %d: busy %g, bubble %g, peak activations %d", x.rank, x.busy, x.bubble, x.peak_live))
end

-- draw it (terminal Gantt chart)
res:show()
