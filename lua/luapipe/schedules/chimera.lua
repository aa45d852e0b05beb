-- Chimera (Li & Hoefler, SC'21, "Chimera: Efficiently Training Large-Scale
-- Neural Networks with Bidirectional Pipelines"): two pipelines in opposite
-- directions over the same P ranks (P = D, even). Each rank holds two
-- stages: virtual stage v < P is stage v on rank v (the down pipeline),
-- virtual stage P+s is stage s on rank P-1-s (the up pipeline), as in
-- DualPipe, so the two copies of a stage (ranks s and P-1-s) sum their
-- gradients before the optimizer step.
--
-- The basic unit takes D micro-batches: D/2 go down, D/2 go up. Each
-- pipeline alone runs 1F1B over its D/2 micro-batches (stage s: min(D-1-s,
-- D/2) warm-up forwards, then one forward and one backward in turn); a
-- rank's list is its two stages' lists merged by their start times in those
-- pipelines (backward = 2 forwards, the paper's unit), so that one
-- pipeline's work fills the other's bubbles; at a tie the backward goes
-- first, then the down pipeline. More micro-batches: the unit is repeated
-- (micro-batches kD..kD+D-1 form unit k), its lists concatenated.
--
-- Bubble of one unit with F = B (the paper's setting): (D/2 - 1)(F + B) on the
-- worst rank, D - 2 slots of one pass, the paper's bubble ratio
-- (D-2)/(2N+D-2) with N = D micro-batches; 1F1B has (D-1)(F+B). Units are
-- concatenated (the paper's direct concatenation): each adds its bubble.
-- Peak live activations: between D/2+1 and D per rank.
--
-- Constraints: pp even, microbatches a multiple of pp.
--
--   local s = require("luapipe.schedules.chimera"){ pp = 4, microbatches = 8 }
local schedule = require("luapipe.schedule")

-- One pipeline of D stages with n micro-batches under 1F1B: per stage the
-- list of {kind = "F"|"B", i = micro-batch index 0..n-1, t = start time}
-- with F = 1, B = 2.
local function one_f_one_b(D, n)
  local lists = {}
  for s = 0, D - 1 do
    local l, warm = {}, math.min(D - 1 - s, n)
    for i = 0, warm - 1 do l[#l + 1] = { kind = "F", i = i } end
    local f, b = warm, 0
    while b < n do
      if f < n then l[#l + 1] = { kind = "F", i = f }; f = f + 1 end
      l[#l + 1] = { kind = "B", i = b }; b = b + 1
    end
    lists[s] = l
  end
  -- start times: each action when its stage is free and its input is done
  local fend, bend, pos, free = {}, {}, {}, {}
  for s = 0, D - 1 do fend[s], bend[s], pos[s], free[s] = {}, {}, 1, 0 end
  local left = 2 * n * D
  while left > 0 do
    local progress = false
    for s = 0, D - 1 do
      local a = lists[s][pos[s]]
      while a do
        local ready
        if a.kind == "F" then
          ready = s == 0 and 0 or fend[s - 1][a.i]
        else
          ready = s == D - 1 and fend[s][a.i] or bend[s + 1][a.i]
        end
        if ready == nil then break end
        a.t = math.max(free[s], ready)
        free[s] = a.t + (a.kind == "F" and 1 or 2)
        if a.kind == "F" then fend[s][a.i] = free[s] else bend[s][a.i] = free[s] end
        pos[s], left, progress = pos[s] + 1, left - 1, true
        a = lists[s][pos[s]]
      end
    end
    assert(progress, "chimera: 1F1B timing stalled")
  end
  return lists
end

return function(opts)
  local program = require("luapipe.schedules.program")
  local P, M = program.args("chimera", opts, 2)
  require("luapipe.schedules").check("chimera", P, M, 2) -- pp even, microbatches a multiple of pp
  local placement, down, up = {}, {}, {}
  for v = 0, P - 1 do placement[#placement + 1] = { stage = v, rank = v }; down[#down + 1] = v end
  for k = 0, P - 1 do placement[#placement + 1] = { stage = k, rank = P - 1 - k }; up[#up + 1] = P + k end
  local H = P // 2
  local s = schedule.new { name = opts.name or "chimera", ranks = P, stages = P, microbatches = M,
    placement = placement, routes = function(mb) return mb % P < H and down or up end }

  local pipe = one_f_one_b(P, H)
  for r = 0, P - 1 do
    -- this rank's two stages: down stage r, up stage P-1-r (whose timing
    -- is the down pipeline's stage P-1-r, the mirror image)
    local merged = {}
    for _, a in ipairs(pipe[r]) do merged[#merged + 1] = { a = a, dir = 0, pos = r } end
    for _, a in ipairs(pipe[P - 1 - r]) do merged[#merged + 1] = { a = a, dir = 1, pos = P - 1 - r } end
    for k, e in ipairs(merged) do e.k = k end
    table.sort(merged, function(x, y)
      if x.a.t ~= y.a.t then return x.a.t < y.a.t end
      if x.a.kind ~= y.a.kind then return x.a.kind == "B" end
      if x.dir ~= y.dir then return x.pos > y.pos end
      return x.k < y.k
    end)
    local ops = {}
    for unit = 0, M // P - 1 do
      for _, e in ipairs(merged) do
        local v = e.dir == 0 and r or (P + (P - 1 - r))
        local mb = unit * P + e.dir * H + e.a.i
        ops[#ops + 1] = string.format("%d%s%d", v, e.a.kind, mb)
      end
    end
    s:push(r, ops)
  end
  return s
end
