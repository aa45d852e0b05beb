-- 1F1B (PipeDream-Flush; Megatron-LM's and PyTorch's Schedule1F1B): rank r
-- runs min(P-1-r, M) warm-up forwards, then alternates one forward and one
-- backward, then drains the backwards it still owes. Stage i on rank i.
-- Peak live activations on rank r: min(P-r, M).
--
--   local s = require("luapipe.schedules.1f1b"){ pp = 4, microbatches = 8 }
local schedule = require("luapipe.schedule")
local program = require("luapipe.schedules.program")

return function(opts)
  local P, M = program.args("1f1b", opts)
  local s = schedule.new { name = opts.name or "1f1b", ranks = P, stages = P, microbatches = M }
  for r = 0, P - 1 do
    local p = program.new(s, r)
    local warmup = math.min(P - 1 - r, M)
    for _ = 1, warmup do p:F(r) end               -- warm-up
    for _ = 1, M - warmup do p:F(r); p:B(r) end   -- steady state: 1F1B
    for _ = 1, warmup do p:B(r) end               -- cool-down
    p:finish()
  end
  return s
end
