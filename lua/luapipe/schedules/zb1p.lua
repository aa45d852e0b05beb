-- ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B with
-- every backward split into I (input-grad, on the critical path) and W
-- (weight-grad, deferrable). Rank r defers its first r W's, running F+I only,
-- which lets the backwards travel up faster; the deferred W's fill the
-- cool-down bubble. Op order as PyTorch's ScheduleInterleavedZeroBubble with
-- one stage per rank (the paper's "uniform B-W split"). Stage i on rank i.
--
-- Live activations (F done, I not yet) are 1F1B's: min(P-r, M) on rank r;
-- activations still held for a W bring every rank to min(P, M), 1F1B's peak.
-- Bubble with zero latency: (P-1)(F+I-W) instead of 1F1B's (P-1)(F+B).
--
--   local s = require("luapipe.schedules.zb1p"){ pp = 4, microbatches = 8 }
local schedule = require("luapipe.schedule")
local program = require("luapipe.schedules.program")

return function(opts)
  local P, M = program.args("zb1p", opts, 3)
  local s = schedule.new { name = opts.name or "zb1p", ranks = P, stages = P, microbatches = M }
  for r = 0, P - 1 do
    local p = program.new(s, r)
    local warmup = math.min(P - 1 - r, M)
    for _ = 1, warmup do p:F(r) end -- warm-up, as 1F1B
    -- steady state F, I (, W): W's start after the first r steps
    for i = 0, M - warmup - 1 do
      p:F(r); p:I(r)
      if i >= r then p:W() end
    end
    for i = M - warmup, M - 1 do    -- cool-down I (, W)
      p:I(r)
      if i >= r then p:W() end
    end
    while p:pending_w() > 0 do p:W() end -- the deferred W's
    p:finish()
  end
  return s
end
