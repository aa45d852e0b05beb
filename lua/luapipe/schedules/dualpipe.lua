-- DualPipe (DeepSeek-V3 technical report; github.com/deepseek-ai/DualPipe):
-- bidirectional pipeline. P ranks (even), P model stages, each stored twice:
-- virtual stage v < P is stage v on rank v (the down route), virtual stage
-- P+s is stage s on rank P-1-s (the up route); rank r holds r and 2P-1-r.
-- Micro-batches 0..M/2-1 go down, M/2..M-1 go up. Every rank runs the eight
-- steps of luapipe.schedules.dualpipe_steps (op for op as dualpipe.py).
-- The two copies of a stage (ranks r and P-1-r) must sum their gradients
-- before the optimizer step.
--
-- Constraints (as dualpipe.py): pp even, microbatches even and >= 2*pp.
-- Peak live activations: P+1 on every rank.
--
--   local s = require("luapipe.schedules.dualpipe"){ pp = 8, microbatches = 20 }
local schedule = require("luapipe.schedule")
local program = require("luapipe.schedules.program")
local steps = require("luapipe.schedules.dualpipe_steps")

return function(opts)
  local P, M = program.args("dualpipe", opts, 3)
  require("luapipe.schedules").check("dualpipe", P, M, 2) -- pp even, microbatches even and >= 2*pp
  local placement, down, up = {}, {}, {}
  for v = 0, P - 1 do placement[#placement + 1] = { stage = v, rank = v }; down[#down + 1] = v end
  for k = 0, P - 1 do
    placement[#placement + 1] = { stage = k, rank = P - 1 - k }; up[#up + 1] = P + k
  end
  local s = schedule.new { name = opts.name or "dualpipe", ranks = P, stages = P, microbatches = M,
    placement = placement, routes = function(mb) return mb < M // 2 and down or up end }

  local H = P // 2
  for r = 0, P - 1 do
    -- near: the chunk whose route starts in this rank's half (the down
    -- stage on ranks 0..H-1, the up stage on ranks H..P-1); far: the other
    local near, far = r, 2 * P - 1 - r
    if r >= H then near, far = far, near end
    local p = program.new(s, r)
    steps(p, near, far, H, math.min(r, P - 1 - r), M // 2)
    p:finish()
  end
  return s
end
