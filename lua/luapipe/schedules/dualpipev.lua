-- DualPipeV (DeepSeek's dualpipev.py, the "cut-in-half" DualPipe; also
-- PyTorch's ScheduleDualPipeV): 2P model stages in a V — rank r holds stage r
-- and stage 2P-1-r, virtual stage id = stage id. Every micro-batch goes down
-- ranks 0..P-1 and back up; its loss is on rank 0. Every rank runs the eight
-- steps of luapipe.schedules.dualpipe_steps with H = P and h = r.
--
-- Constraint (as dualpipev.py): microbatches >= 2*pp.
-- Peak live activations: 2P+1 on every rank.
--
--   local s = require("luapipe.schedules.dualpipev"){ pp = 4, microbatches = 8 }
local schedule = require("luapipe.schedule")
local program = require("luapipe.schedules.program")
local steps = require("luapipe.schedules.dualpipe_steps")

return function(opts)
  local P, M = program.args("dualpipev", opts, 6)
  require("luapipe.schedules").check("dualpipev", P, M, 2) -- microbatches >= 2*pp
  local placement = {}
  for k = 0, 2 * P - 1 do placement[k + 1] = { stage = k, rank = k < P and k or 2 * P - 1 - k } end
  local s = schedule.new { name = opts.name or "dualpipev", ranks = P, stages = 2 * P,
    microbatches = M, placement = placement }

  for r = 0, P - 1 do
    local p = program.new(s, r)
    steps(p, r, 2 * P - 1 - r, P, r, M)
    p:finish()
  end
  return s
end
