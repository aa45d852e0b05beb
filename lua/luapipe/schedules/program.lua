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
--   p:finish()    appends the actions written so far to s (one C call)
--
-- Micro-batches go through each virtual stage in increasing order (FIFO),
-- separately for forwards and for backwards; the micro-batches of v are the
-- ones whose route (s:route(mb)) contains v. Actions are buffered and go to
-- s at p:finish(). Every call costs O(1) (amortized): a builder is linear
-- in its actions.
local core = require("luapipe.core")
local CODE = core.action_codes

local M = {}
local Program = {}
Program.__index = Program

-- buffers one action: (type, v, mb)
local function emit(p, code, v, mb)
  local ops, n = p.ops, p.nops
  ops[n + 1], ops[n + 2], ops[n + 3] = code, v, mb
  p.nops = n + 3
end

-- program.new(s, rank) -> a writer for rank's list on schedule s (routes set).
function M.new(s, rank)
  -- mbs[v]: the micro-batches through v, looked up on first use
  local nv = s:info().vstages
  local mbs = setmetatable({}, { __index = function(t, v)
    if math.type(v) ~= "integer" or v < 0 or v >= nv then return nil end
    local list = s:microbatches_of(v)
    rawset(t, v, list)
    return list
  end })
  return setmetatable({ s = s, rank = rank, mbs = mbs, nf = {}, nb = {}, wq = {}, nw = 0,
    seq = 0, ops = {}, nops = 0 }, Program)
end

function Program:finish()
  if self.nops > 0 then self.s:push_ops(self.rank, self.ops, self.nops) end
  self.ops, self.nops = {}, 0
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
  emit(self, CODE.F, v, take(self, v, "F"))
end

function Program:B(v)
  emit(self, CODE.B, v, take(self, v, "B"))
end

-- Pending weight-grads: one FIFO per virtual stage, {head, tail, [i] =
-- {seq, mb}}; seq orders them across stages (the oldest overall).
function Program:I(v)
  local mb = take(self, v, "B")
  local q = self.wq[v]
  if not q then q = { head = 1, tail = 0 }; self.wq[v] = q end
  self.seq = self.seq + 1
  q.tail = q.tail + 1
  q[q.tail] = { self.seq, mb }
  self.nw = self.nw + 1
  emit(self, CODE.I, v, mb)
end

function Program:W(v)
  if v == nil then -- the oldest pending one of any stage
    local oldest
    for u, q in pairs(self.wq) do
      if q.head <= q.tail and (oldest == nil or q[q.head][1] < oldest) then
        v, oldest = u, q[q.head][1]
      end
    end
  end
  local q = v ~= nil and self.wq[v]
  if not q or q.head > q.tail then
    error(string.format("rank %d: no pending weight-grad%s", self.rank,
      v and (" on virtual stage " .. v) or ""), 2)
  end
  local w = q[q.head]
  q[q.head] = nil
  q.head = q.head + 1
  self.nw = self.nw - 1
  emit(self, CODE.W, v, w[2])
end

function Program:FB(vf, vb)
  local fmb = take(self, vf, "F")
  local bmb = take(self, vb, "B")
  local ops, n = self.ops, self.nops
  ops[n + 1], ops[n + 2], ops[n + 3] = CODE.FB, vf, fmb
  ops[n + 4], ops[n + 5], ops[n + 6] = CODE.B, vb, bmb
  self.nops = n + 6
end

-- number of queued weight-grads (of v, when given)
function Program:pending_w(v)
  if v == nil then return self.nw end
  local q = self.wq[v]
  return q and q.tail - q.head + 1 or 0
end

local limits = require("luapipe.core").schedule_limits()

-- program.args(family, opts[, ops]) -> pp, microbatches: the options every
-- family takes, checked against the limits of luapipe.core.schedule_limits()
-- before anything is built; `ops` (default 2) is about how many actions
-- the family writes per rank and micro-batch. Misuse raises an error naming
-- the family, the option and the limit.
function M.args(family, opts, ops)
  if type(opts) ~= "table" then
    error(string.format("%s: expects a table of options {pp = <ranks>, microbatches = <count>}",
      family), 3)
  end
  local max = { pp = limits.ranks, microbatches = limits.microbatches }
  for _, k in ipairs { "pp", "microbatches" } do
    local v = opts[k]
    if math.type(v) ~= "integer" or v < 1 then
      error(string.format("%s: %s must be a positive integer, got %s", family, k, tostring(v)), 3)
    end
    if v > max[k] then
      error(string.format("%s: %s must be at most %d, got %d", family, k, max[k], v), 3)
    end
  end
  local need = opts.pp * opts.microbatches * (ops or 2)
  if need > limits.actions then
    error(string.format("%s: pp = %d with %d micro-batches needs about %d actions, over the "
      .. "limit of %d", family, opts.pp, opts.microbatches, need, limits.actions), 3)
  end
  return opts.pp, opts.microbatches
end
M.limits = limits

return M
