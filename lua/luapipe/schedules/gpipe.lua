-- GPipe (Huang et al. 2019): every rank runs all its forwards, then all its
-- backwards. Stage i on rank i (S = P). Backwards run in forward micro-batch
-- order, as in PyTorch's ScheduleGPipe. Peak live activations: M on every rank.
--
--   local s = require("luapipe.schedules.gpipe"){ pp = 4, microbatches = 8 }
local schedule = require("luapipe.schedule")
local program = require("luapipe.schedules.program")

return function(opts)
  local P, M = program.args("gpipe", opts)
  local s = schedule.new { name = opts.name or "gpipe", ranks = P, stages = P, microbatches = M }
  for r = 0, P - 1 do
    local p = program.new(s, r)
    for _ = 1, M do p:F(r) end -- all forwards
    for _ = 1, M do p:B(r) end -- then all backwards
    p:finish()
  end
  return s
end
