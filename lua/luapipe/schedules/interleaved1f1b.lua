-- Interleaved 1F1B (Narayanan et al. 2021) in Megatron-LM's order: each rank
-- holds v model chunks; model stage k = c*P + r (chunk c of rank r) lives on
-- rank k % P, S = P*v, virtual stage id = stage id.
--
-- Micro-batches go through the chunks in groups of G: a rank runs forwards of
-- G micro-batches on chunk 0, the same G on chunk 1, ..., then the next group;
-- backwards likewise, chunks in reverse. G = P when M is a multiple of P
-- (Megatron's and PyTorch's classic rule, and its order exactly); otherwise
-- G = M / max(1, M // P) as PyTorch's ScheduleInterleaved1F1B does.
-- Warm-up: min((P-r-1)*2 + (v-1)*G, M*v) forwards, then one forward and one
-- backward at a time, then the cool-down backwards.
--
-- Constraints: chunks >= 2 (one chunk is plain 1f1b); when microbatches > pp,
-- microbatches must split into groups of equal size >= pp, i.e. be a
-- multiple of microbatches // pp (any multiple of pp is, and any count
-- below 2*pp); with microbatches <= pp any count works.
--
--   local s = require("luapipe.schedules.interleaved1f1b"){ pp = 4, microbatches = 8, chunks = 2 }
local schedule = require("luapipe.schedule")
local program = require("luapipe.schedules.program")

return function(opts)
  if type(opts) ~= "table" then program.args("interleaved1f1b", opts) end -- raises
  local v = opts.chunks or 2
  if math.type(v) ~= "integer" or v < 2 then
    error(string.format("interleaved1f1b: chunks must be an integer >= 2 (use 1f1b for "
      .. "one chunk), got %s", tostring(v)), 2)
  end
  if type(opts.pp) == "number" and opts.pp * v > program.limits.stages then
    error(string.format("interleaved1f1b: pp x chunks must be at most %d model stages, got %d x %d",
      program.limits.stages, opts.pp, v), 2)
  end
  local P, M = program.args("interleaved1f1b", opts, 2 * v)
  local groups = math.max(1, M // P)
  if M % groups ~= 0 then
    local lo, hi = groups * (M // groups), groups * (M // groups + 1)
    error(string.format("interleaved1f1b: %d micro-batches do not split into groups of equal "
      .. "size >= pp = %d (%d // %d = %d groups); use a multiple of %d such as %d or %d, or any "
      .. "multiple of pp", M, P, M, P, groups, groups, lo, hi), 2)
  end
  local G = M // groups
  local placement = {}
  for k = 0, P * v - 1 do placement[k + 1] = { stage = k, rank = k % P } end
  local s = schedule.new { name = opts.name or "interleaved1f1b", ranks = P, stages = P * v,
    microbatches = M, placement = placement }

  local warmup_of = function(r, g) return (P - r - 1) * 2 + (v - 1) * g end
  local gpipe_ranks = 0 -- ranks whose warm-up is every forward (no 1F1B steady state)
  for r = 0, P - 1 do
    local p = program.new(s, r)
    local total = M * v -- forwards (and backwards) this rank runs
    local warmup = math.min(warmup_of(r, G), total)
    if warmup == total then gpipe_ranks = gpipe_ranks + 1 end
    -- the virtual stage of rank r that runs its k-th forward / k-th backward
    local function fwd(k) return ((k // G) % v) * P + r end
    local function bwd(k) return (v - 1 - (k // G) % v) * P + r end

    for k = 0, warmup - 1 do p:F(fwd(k)) end            -- warm-up
    for k = 0, total - warmup - 1 do                    -- steady state: 1F1B
      p:F(fwd(k + warmup))
      p:B(bwd(k))
    end
    for k = total - warmup, total - 1 do p:B(bwd(k)) end -- cool-down
    p:finish()
  end
  if gpipe_ranks > 0 then
    -- too few micro-batches for the steady state on the first ranks: say
    -- so (the schedule is valid, as PyTorch's with the same counts), and
    -- name the smallest multiple of pp that has one on every rank
    local need = P
    while warmup_of(0, P) >= need * v do need = need + P end
    s:set_note(string.format("with %d micro-batches on %d ranks, %s every forward before any "
      .. "backward (GPipe's order: no 1F1B steady state, all %d x %d activations held); "
      .. "use %d micro-batches or more (a multiple of pp) for interleaved 1F1B's steady state",
      M, P, gpipe_ranks == 1 and "rank 0 runs" or string.format("ranks 0-%d run", gpipe_ranks - 1),
      M, v, need))
  end
  return s
end
