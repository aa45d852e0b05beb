-- ZB-V (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 6):
-- 2P model stages in a V — rank r holds stage r (chunk 0, going down) and
-- stage 2P-1-r (chunk 1, coming back up), virtual stage id = stage id — and
-- every backward split into I and W. Op order as PyTorch's
-- ScheduleZBVZeroBubble (the paper's hand-crafted ZB-V):
--
--   1. 2(P-r)-1 forwards of chunk 0
--   2. r times: F chunk 1, F chunk 0
--   3. P-r times: F chunk 1, I chunk 1, W chunk 1
--   4. steady: F0 I0 W0 F1 I1 W1 until every forward is done
--   5. r times: I chunk 0, I chunk 1 (their W's wait)
--   6. P-r times: I chunk 0, W chunk 0
--   7. the remaining W's, chunk 1 first
--
-- The pattern is laid out for max(M, 2P-1) micro-batches; with fewer, the
-- actions on the missing micro-batches are left out (as PyTorch does), so any
-- M >= 1 works; below about 1.5*P micro-batches the bubble grows.
-- Peak live activations: 2P half-size chunks on every rank once M >= 2P-1
-- (as much as 1F1B's P full stages on its first rank).
--
--   local s = require("luapipe.schedules.zbv"){ pp = 4, microbatches = 8 }
local schedule = require("luapipe.schedule")
local program = require("luapipe.schedules.program")

return function(opts)
  local P, M = program.args("zbv", opts, 6)
  local placement = {}
  for k = 0, 2 * P - 1 do placement[k + 1] = { stage = k, rank = k < P and k or 2 * P - 1 - k } end
  local s = schedule.new { name = opts.name or "zbv", ranks = P, stages = 2 * P,
    microbatches = M, placement = placement }

  for r = 0, P - 1 do
    local p = program.new(s, r)
    local c0, c1 = r, 2 * P - 1 - r
    -- each op is skipped once its chunk has no micro-batch left (padding)
    local function F(c) if p:left(c, "F") > 0 then p:F(c) end end
    local function I(c) if p:left(c, "B") > 0 then p:I(c) end end
    local function W(c) if p:pending_w(c) > 0 then p:W(c) end end
    local mbs = math.max(M, 2 * P - 1) -- the pattern's micro-batch count
    local f0, f1 = 0, 0                -- forwards laid out per chunk

    for _ = 1, 2 * (P - r) - 1 do F(c0); f0 = f0 + 1 end               -- 1
    for _ = 1, r do F(c1); F(c0); f0, f1 = f0 + 1, f1 + 1 end          -- 2
    for _ = 1, P - r do F(c1); I(c1); W(c1); f1 = f1 + 1 end           -- 3
    while f1 < f0 or f0 < mbs do                                       -- 4
      if f0 < mbs then F(c0); f0 = f0 + 1 end
      I(c0); W(c0)
      F(c1); I(c1); W(c1); f1 = f1 + 1
    end
    for _ = 1, r do I(c0); I(c1) end                                   -- 5
    for _ = 1, P - r do I(c0); W(c0) end                               -- 6
    while p:pending_w(c1) > 0 do p:W(c1) end                          -- 7
    while p:pending_w(c0) > 0 do p:W(c0) end
    p:finish()
  end
  return s
end
