-- dualpipe_ref.lua — test helper (not a test): DualPipe and DualPipeV built
-- literally from the eight steps of the DualPipe spec (specs/dualpipe.md), so the
-- simulator's tests do not depend on luapipe.schedules (built elsewhere).
--   local ref = dofile(dir .. "dualpipe_ref.lua")
--   local s = ref.dualpipe(8, 20)     -- or ref.dualpipev(8, 16)
local schedule = require("luapipe.schedule")
local R = {}

local function build(P, M, v)
  local H, N, s
  if v then
    H, N = P, M
    local placement, route = {}, {}
    for k = 0, 2 * P - 1 do
      placement[#placement + 1] = { stage = k, rank = k < P and k or 2 * P - 1 - k }
      route[#route + 1] = k
    end
    s = schedule.new{ name = "dualpipev-ref", ranks = P, stages = 2 * P, microbatches = M,
      placement = placement, routes = function() return route end }
  else
    H, N = P // 2, M // 2
    local placement = {}
    for k = 0, P - 1 do placement[#placement + 1] = { stage = k, rank = k } end
    for k = 0, P - 1 do placement[#placement + 1] = { stage = k, rank = P - 1 - k } end
    local down, up = {}, {}
    for k = 0, P - 1 do down[#down + 1] = k; up[#up + 1] = P + k end
    s = schedule.new{ name = "dualpipe-ref", ranks = P, stages = P, microbatches = M,
      placement = placement, routes = function(mb) return mb < N and down or up end }
  end
  for r = 0, P - 1 do
    local h = v and r or math.min(r, P - 1 - r)
    local near, far
    if v then near, far = r, 2 * P - 1 - r
    elseif r < H then near, far = r, 2 * P - 1 - r
    else near, far = 2 * P - 1 - r, r end
    -- first micro-batch of each chunk
    local base = {}
    if v then base[near], base[far] = 0, 0
    else
      base[r] = 0; base[2 * P - 1 - r] = N
    end
    local fnext = { [near] = base[near], [far] = base[far] }
    local bnext = { [near] = base[near], [far] = base[far] }
    local wq, acts = {}, {}
    local function F(c) local m = fnext[c]; fnext[c] = m + 1; return c .. "F" .. m end
    local function Bk(c, kind)
      local m = bnext[c]; bnext[c] = m + 1
      if kind == "I" then wq[#wq + 1] = c .. "W" .. m end
      return c .. kind .. m
    end
    local function W() return table.remove(wq, 1) end
    local function FB(a, b)
      local f = F(a); local bb = Bk(b, "B")
      return "(" .. f .. ";" .. bb .. ")OVERLAP_F_B"
    end
    local function add(x) acts[#acts + 1] = x end
    for _ = 1, 2 * (H - h - 1) do add(F(near)) end
    for _ = 1, h + 1 do add(F(near)); add(F(far)) end
    for _ = 1, H - h - 1 do add(Bk(far, "I")); add(W()); add(F(far)) end
    for i = 1, N - 2 * H + h + 1 do
      if i == 1 and h == H - 1 then add(F(near)); add(Bk(far, "B"))
      else add(FB(near, far)) end
      add(FB(far, near))
    end
    for _ = 1, H - h - 1 do add(Bk(far, "B")); add(FB(far, near)) end
    local bw = {}
    for _ = 1, h + 1 do bw[#bw + 1] = far; bw[#bw + 1] = near end
    for i, c in ipairs(bw) do add(Bk(c, i > #bw - (h + 1) and "I" or "B")) end
    for _ = 1, H - h - 1 do add(W()); add(Bk(near, "I")) end
    for _ = 1, h + 1 do add(W()) end
    s:push(r, acts)
  end
  return s
end

function R.dualpipe(P, M) return build(P, M, false) end
function R.dualpipev(P, M) return build(P, M, true) end
return R
