-- luapipe.schedules.program: writes one rank's action list in the words
-- schedule papers use — "forward chunk v", "backward chunk v", "the oldest
-- pending weight-grad" — so a builder never counts micro-batches itself.
--
--   local p = program.new(s, rank)
--   p:F(v)        forward of the next micro-batch on virtual stage v
--   p:B(v)        full backward of the next micro-batch on v
--   p:I(v)        input-grad only; its weight-grad is queued
--   p:W([v])      weight-grad of the oldest queued I (of v, when given)
--   p:FB(vf, vb)  one overlapped pair: F on vf with a full B on vb
--   p:left(v, kind) how many "F" or "B" (B or I) remain on v
--   p:pending_w([v]) how many weight-grads are queued (of v, when given)
--
-- Micro-batches go through each virtual stage in increasing order (FIFO),
-- separately for forwards and for backwards; the micro-batches of v are the
-- ones whose route (s:route(mb)) contains v. Actions are pushed to s at once.
local M = {}
local Program = {}
Program.__index = Program

-- program.new(s, rank) -> a writer for rank's list on schedule s (routes set).
function M.new(s, rank)
  local info = s:info()
  local mbs = {} -- mbs[v] = micro-batches through v, in order
  for mb = 0, info.microbatches - 1 do
    for _, v in ipairs(s:route(mb) or {}) do
      mbs[v] = mbs[v] or {}
      table.insert(mbs[v], mb)
    end
  end
  return setmetatable({ s = s, rank = rank, mbs = mbs, nf = {}, nb = {}, wq = {} }, Program)
end

-- next micro-batch of kind "F" or "B" on v, advancing the counter
local function take(p, v, kind)
  local count = kind == "F" and p.nf or p.nb
  local i = (count[v] or 0) + 1
  local list = p.mbs[v]
  local mb = list and list[i]
  if mb == nil then
    error(string.format("rank %d: no %s left on virtual stage %d", p.rank,
      kind == "F" and "forward" or "backward", v), 3)
  end
  count[v] = i
  return mb
end

function Program:left(v, kind)
  local count = kind == "F" and self.nf or self.nb
  return #(self.mbs[v] or {}) - (count[v] or 0)
end

function Program:F(v)
  self.s:push(self.rank, string.format("%dF%d", v, take(self, v, "F")))
end

function Program:B(v)
  self.s:push(self.rank, string.format("%dB%d", v, take(self, v, "B")))
end

function Program:I(v)
  local mb = take(self, v, "B")
  table.insert(self.wq, { v, mb })
  self.s:push(self.rank, string.format("%dI%d", v, mb))
end

function Program:W(v)
  for i, w in ipairs(self.wq) do
    if v == nil or w[1] == v then
      table.remove(self.wq, i)
      self.s:push(self.rank, string.format("%dW%d", w[1], w[2]))
      return
    end
  end
  error(string.format("rank %d: no pending weight-grad%s", self.rank,
    v and (" on virtual stage " .. v) or ""), 2)
end

function Program:FB(vf, vb)
  local fmb = take(self, vf, "F")
  local bmb = take(self, vb, "B")
  self.s:push(self.rank, string.format("(%dF%d;%dB%d)OVERLAP_F_B", vf, fmb, vb, bmb))
end

-- number of queued weight-grads (of v, when given)
function Program:pending_w(v)
  if v == nil then return #self.wq end
  local n = 0
  for _, w in ipairs(self.wq) do if w[1] == v then n = n + 1 end end
  return n
end

-- program.args(family, opts) -> pp, microbatches: the options every family
-- takes, checked; misuse raises an error naming the family and the option.
function M.args(family, opts)
  if type(opts) ~= "table" then
    error(string.format("%s: expects a table of options {pp = <ranks>, microbatches = <count>}", family), 3)
  end
  for _, k in ipairs { "pp", "microbatches" } do
    local v = opts[k]
    if math.type(v) ~= "integer" or v < 1 then
      error(string.format("%s: %s must be a positive integer, got %s", family, k, tostring(v)), 3)
    end
  end
  return opts.pp, opts.microbatches
end

return M
