-- eager_1f1b.lua — a schedule file: a Lua file that returns a schedule.
-- `luapipe schedule`, `luapipe simulate` and schedule.load run it with one
-- argument, the options table, as `...`:
--
--   { pp = <ranks>, microbatches = <count>, chunks = <count or nil> }
--
-- (--pp, --microbatches and --chunks as typed, or their defaults: pp 4,
-- microbatches 8, chunks nil), and take the schedule it returns:
--
--   luapipe schedule examples/eager_1f1b.lua --pp 4 --microbatches 8
--   luapipe simulate examples/eager_1f1b.lua -p 4 -m 8 --cost F=1,B=2,latency=0.5
--   local s = require("luapipe.schedule").load("examples/eager_1f1b.lua",
--     { pp = 4, microbatches = 8 })
--
-- Run as a script (`luapipe examples/eager_1f1b.lua`) it prints the schedule
-- built with the defaults.
--
-- The schedule: "eager 1F1B". Plain 1F1B warms up with P-1-r forwards on
-- rank r, so in the steady state every forward waits for the message that
-- just left the previous rank; an eager 1F1B warms up with about twice as
-- many, 2(P-1-r), so a forward's input is already there when the rank gets
-- to it: more activations held, fewer idle gaps when messages take time.
local schedule = require("luapipe.schedule")

local opts = ...
local as_script = type(opts) ~= "table" -- run as a script, `...` holds its string arguments
if as_script then opts = {} end
local P, M = opts.pp or 4, opts.microbatches or 8

-- stage i on rank i (the default placement); every micro-batch's route is
-- stages 0..P-1 (the default route)
local s = schedule.new { name = "eager-1f1b", ranks = P, stages = P, microbatches = M }
for r = 0, P - 1 do
  local warmup = math.min(2 * (P - 1 - r), M)
  local f, b = 0, 0 -- next micro-batch to forward / to backward on this rank
  local list = {}
  local function F() list[#list + 1] = string.format("%dF%d", r, f); f = f + 1 end
  local function B() list[#list + 1] = string.format("%dB%d", r, b); b = b + 1 end
  for _ = 1, warmup do F() end          -- warm-up
  for _ = 1, M - warmup do F(); B() end -- steady state: one forward, one backward
  for _ = 1, warmup do B() end          -- cool-down
  s:push(r, list)
end

if as_script then -- show it
  print(s)
  for r = 0, P - 1 do print("rank " .. r .. ": " .. table.concat(s:actions(r), " ")) end
end
return s
