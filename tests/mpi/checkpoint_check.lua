-- checkpoint_check.lua FAMILY[:lm] MODE DIR [STEPS] — run under mpirun by
-- test_checkpoint.sh. A small MLP (FAMILY:lm: a small transformer LM with
-- cross-entropy; FAMILY:moe<E>: the MoE LM of fixtures.lua, router-bias
-- balancing on, at pp = P/E x ep = E with EPLB every 2 steps, one redundant
-- slot per EP rank and a 3-step window, so the resumed run needs the
-- restored placement, router biases and Balancer history) trained with
-- AdamW (M = 2 x pipeline ranks micro-batches).
-- MODE:
--   full    STEPS steps (default 4) without checkpoints; writes this rank's
--           losses and final parameters to DIR/full.rank<R>.lua
--   part    STEPS steps (default 2) with checkpoint = {dir = DIR/ckpt, every = 2}
--   resume  resume = true from DIR/ckpt up to STEPS (default 4), still
--           checkpointing every 2; checks, on every rank, that the steps it
--           ran have exactly (bitwise) the losses of the full run and that
--           the final parameters are bitwise those of the full run; prints
--           "rank R: ok ..." or "rank R: FAIL ..." and exits with the job's
--           failure count
--   error   resume = true from DIR/ckpt up to STEPS (default 6): expected to
--           fail (corrupt file, other placement, no checkpoint); the error
--           text goes to stderr via the host
--   other   resume = true from DIR/ckpt up to STEPS (default 6), not quiet
--           (the resume's lines and notes printed), under another schedule
--           than the checkpoint's: prints "rank R: ok other ..." with the
--           first step it ran and whether every loss is finite
local train = require("luapipe.train")
local comm = require("luapipe.comm")

local family, mode, dir, steps = arg[1], arg[2], arg[3], tonumber(arg[4])
local variant
family, variant = family:match("^([^:]+):?(.*)$")
local rank, P = comm.rank(), comm.size()
local EP = tonumber(variant:match("^moe(%d+)$") or "1")
local M, SEED = 2 * (P // EP), 77

local fx = dofile("tests/mpi/fixtures.lua")
local model, data = fx.mlp(), fx.regression_data

local optimizer = { kind = "adamw", lr = 0.01, weight_decay = 0.01 }

if variant == "lm" then -- embedding, attention, cross-entropy
  model, data = fx.lm(), fx.lm_data
end
local eplb
if variant:match("^moe") then
  model, data = fx.moe_lm(), fx.moe_lm_data
  eplb = { every = 2, redundant = 1, window = 3 }
  -- arg[5] == "noeplb": the same without EPLB (a mismatching resume)
  if arg[5] == "noeplb" then eplb = nil end
end
-- partition = "layers": the full run's per-stage dump must hold the very
-- stages of the checkpointed run (a split by measured cost may differ from
-- job to job; test_partition_resume.sh covers resuming one)
local base = { model = model, schedule = family, microbatches = M, data = data, seed = SEED,
  optimizer = optimizer, quiet = true, ep = EP > 1 and EP or nil, eplb = eplb, partition = "layers" }
local function run(extra)
  local o = {}
  for k, v in pairs(base) do o[k] = v end
  for k, v in pairs(extra) do o[k] = v end
  return train(o)
end

local ckdir = dir .. "/ckpt"
local full_file = string.format("%s/full.rank%d.lua", dir, rank)

if mode == "full" then
  steps = steps or 4
  local r = run { steps = steps }
  local f = assert(io.open(full_file, "w"))
  f:write("return {\nlosses = {")
  for k = 1, steps do f:write(string.format("%.17g, ", r.losses[k])) end
  f:write("},\n")
  local e = r.summary.eplb
  if e then f:write(string.format("eplb = {plans = %d, bytes = %d},\n", e.plans, e.bytes)) end
  f:write("stages = {\n")
  for _, vs in ipairs(r.stage_params()) do
    f:write(string.format("{id = %d, params = {\n", vs.id))
    for name, vals in pairs(vs.params) do
      local t = {}
      for i, x in ipairs(vals) do t[i] = string.format("%.17g", x) end
      f:write(string.format("[%q] = {%s},\n", name, table.concat(t, ",")))
    end
    f:write("}},\n")
  end
  f:write("}}\n")
  f:close()
  print(string.format("rank %d: ok full %s (losses %.9g .. %.9g)%s", rank, family, r.losses[1],
    r.losses[steps], r.summary.eplb and string.format(" eplb %d plans, %d bytes moved",
    r.summary.eplb.plans, r.summary.eplb.bytes) or ""))
elseif mode == "part" then
  steps = steps or 2
  local r = run { steps = steps, checkpoint = { dir = ckdir, every = 2 } }
  print(string.format("rank %d: ok part %s (%d steps, loss %.9g)", rank, family, steps,
    r.losses[steps]))
elseif mode == "resume" then
  steps = steps or 4
  local r = run { steps = steps, resume = true, checkpoint = { dir = ckdir, every = 2 } }
  local want = assert(dofile(full_file))
  local fails = {}
  if r.first_step ~= 3 then
    fails[#fails + 1] = "resumed at step " .. tostring(r.first_step) .. ", want 3"
  end
  for k = 1, steps do
    local got = r.losses[k]
    if k < r.first_step then
      if got ~= nil then fails[#fails + 1] = "a loss for step " .. k .. ", which did not run" end
    elseif got ~= want.losses[k] then
      fails[#fails + 1] = string.format("loss of step %d: %.17g, uninterrupted %.17g", k,
        got or 0 / 0, want.losses[k])
    end
  end
  -- EPLB: the resumed run's summary counts the plans and bytes of both jobs
  local e = r.summary and r.summary.eplb
  if want.eplb and (not e or e.plans ~= want.eplb.plans or e.bytes ~= want.eplb.bytes) then
    fails[#fails + 1] = string.format("EPLB summary: %s plans, %s bytes; uninterrupted %d, %d",
      e and e.plans or "no", e and e.bytes or "no", want.eplb.plans, want.eplb.bytes)
  end
  local n, nv = 0, 0
  for i, vs in ipairs(r.stage_params()) do
    local w = want.stages[i]
    nv = nv + 1
    if not w or w.id ~= vs.id then
      fails[#fails + 1] = "virtual stage " .. vs.id .. " is not in the full run's dump"
    else
      for name, vals in pairs(vs.params) do
        local wv = w.params[name]
        if not wv or #wv ~= #vals then
          fails[#fails + 1] = "parameter " .. name .. " differs in size"
        else
          local bad = 0
          for j = 1, #vals do if vals[j] ~= wv[j] then bad = bad + 1 end end
          if bad > 0 then
            fails[#fails + 1] = string.format("stage %d parameter %s: %d of %d values differ",
              vs.id, name, bad, #vals)
          end
          n = n + 1
        end
      end
    end
  end
  if n == 0 then fails[#fails + 1] = "no parameters checked" end
  for _, m in ipairs(fails) do print(string.format("rank %d: FAIL %s resume: %s", rank, family, m)) end
  if #fails == 0 then
    print(string.format("rank %d: ok resume %s (steps %d..%d bitwise, %d params in %d vstages)",
      rank, family, r.first_step, steps, n, nv))
  end
  local total = assert(comm.allreduce({ #fails }, "gathering failure counts"))[1]
  os.exit(total == 0 and 0 or 1)
elseif mode == "error" then
  run { steps = steps or 6, resume = true, checkpoint = { dir = ckdir, every = 2 } }
  print(string.format("rank %d: resumed without an error", rank))
elseif mode == "other" then
  steps = steps or 6
  local r = run { steps = steps, resume = true, checkpoint = { dir = ckdir, every = 2 }, quiet = false }
  local finite = true
  for k = r.first_step, steps do finite = finite and r.losses[k] == r.losses[k] and r.losses[k] < math.huge end
  print(string.format("rank %d: ok other %s (steps %d..%d, losses %s)", rank, family, r.first_step, steps,
    finite and "finite" or "NOT finite"))
else
  error("unknown mode " .. tostring(mode))
end
