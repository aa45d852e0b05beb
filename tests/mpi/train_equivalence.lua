-- train_equivalence.lua FAMILY MICROBATCHES [mode [lookahead]] — run under mpirun by
-- test_train_equivalence.sh. Trains a small MLP with the schedule family on
-- the ranks of this job and checks, on every rank, that the per-step
-- losses and this rank's final parameters equal the single-process
-- reference (luapipe.train.reference) within 1e-5 relative, and that the
-- two copies of a replicated stage (DualPipe) are bitwise identical.
-- Prints "rank R: ok" or "rank R: FAIL ..." lines; every rank exits with
-- the job's failure count (0: all passed).
-- mode "reduce": the schedule gets explicit REDUCE_GRAD actions, each right
-- after the last compute action of its virtual stage (DualPipe).
-- mode "moe_reduce_ep<E>": the MoE LM on the pp x ep grid with those
-- REDUCE_GRAD actions (a pair's carried weight-grads must end before them).
-- mode "wait": the same as "reduce", plus PyTorch's stage actions: UNSHARD of each
-- stage first, WAIT_REDUCE_GRAD and RESHARD of each at the end.
-- mode "hook": an overlapped_fb hook runs each FB pair backward half first
-- (DualPipe); it must be called and change nothing.
-- mode "cost": the model split by measured layer cost instead of by count.
-- lookahead: receives posted that many compute actions ahead (-1: all at
-- the start of the step; default 4).
-- mode "lm": a small causal transformer LM (embedding, attention blocks,
-- cross-entropy) trained with AdamW instead.
-- mode "ep<E>" (e.g. ep2): the pp x ep grid, pp = ranks / E, each EP rank
-- training on its share of every micro-batch (MLP); "lm_ep<E>": the same
-- with the transformer LM.
-- mode "moe", "moe_ep<E>": the small MoE LM (fixtures.moe_lm) with AdamW,
-- its experts spread over the EP group.
-- mode "moe_eplb_ep<E>": the MoE LM with EPLB after every step (one
-- redundant slot per EP rank): expert weights and optimizer state move,
-- losses and parameters stay the reference's; the plans must even out the
-- load they were made for.
-- mode "moe_skew_ep<E>": the MoE LM with the EP partners out of step: odd
-- ranks take a slow emulated link (3 ms a message) and burn 0-4 ms in
-- data(), so the EP partners find their exchanges done at different times
-- (the pairs poll, fill with weight-grads and wait differently on each);
-- the results must not change.
-- FAMILY may be a .csv schedule (PyTorch's format, with SEND/RECV): it runs
-- as written, receives posted where the file says and waited for at use.
-- mode "dp<D>", "lm_dp<D>", "moe_dp<D>_ep<E>", ... (D in the mode, before
-- any ep<E>): the pp x dp grid, pp = ranks / D, each DP rank training on its
-- 1/D share of every micro-batch, EP groups of E of each stage's D ranks;
-- "zero" anywhere in the mode adds ZeRO-1.
-- mode "ranks": asks for pp = 4 on a smaller job (expects a clear error).
-- mode "stages": a model with fewer layers than stages (expects an error).
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local comm = require("luapipe.comm")

local family, M, mode, lookahead = arg[1], tonumber(arg[2]), arg[3], tonumber(arg[4])
-- a mode ending in "+recipe" also clips the global gradient norm (at a
-- norm the steps exceed) and follows a learning-rate schedule (warmup,
-- then cosine decay): the norms of every step must equal the reference's
local recipe = mode and mode:match("%+recipe$") ~= nil
if recipe then mode = mode:gsub("%+recipe$", "") end
-- a mode ending in "+bf16" trains both (the ranks and the reference) with
-- precision = "bf16"; the reference must then also differ from float32's
-- (the option took effect) by less than 2% a step
local bf16 = mode and mode:match("%+bf16$") ~= nil
if bf16 then mode = mode:gsub("%+bf16$", "") end
local precision = bf16 and "bf16" or nil
if mode == "mlp" or mode == "" then mode = nil end
local rank, P = comm.rank(), comm.size()
local STEPS, SEED = 3, 1234

local fx = dofile("tests/mpi/fixtures.lua")
local model, data = fx.mlp(), fx.regression_data

local optimizer = { kind = "sgd", lr = 0.05, momentum = 0.9 }
local EP = tonumber((mode or ""):match("_?ep(%d+)$")) or 1
-- "dp<D>" in the mode (before any "ep<E>"): the pp x dp grid, EP groups of
-- E of each stage's D ranks; "zero" in it: ZeRO-1 (optimizer state sharded)
local DP = tonumber((mode or ""):match("dp(%d+)")) or EP
local ZERO = (mode or ""):match("zero") and 1 or 0
local PP = P // DP

if mode == "lm" or (mode or ""):match("^lm_") then
  model, data = fx.lm(), fx.lm_data
  optimizer = { kind = "adamw", lr = 0.01, weight_decay = 0.01 }
elseif (mode or ""):match("^moe") then
  model, data = fx.moe_lm(), fx.moe_lm_data
  optimizer = { kind = "adamw", lr = 0.01, weight_decay = 0.01 }
end

if mode == "ranks" then
  train { model = model, schedule = family, pp = 4, microbatches = M, data = data, steps = 1 }
  return
elseif mode == "stages" then
  local tiny = nn.sequential { nn.linear(6, 3), loss = "mse" }
  train { model = tiny, schedule = family, microbatches = M, data = data, steps = 1 }
  return
end

local sched = family
if family:match("%.csv$") then
  -- a schedule file with explicit SEND/RECV (PyTorch's CSV, or
  -- `luapipe search -o found.csv`), run as written
  sched = assert(require("luapipe.schedule").from_csv(family))
  assert(sched:info().microbatches == M)
end
if mode == "reduce" or mode == "wait" or (mode or ""):match("_reduce") then
  sched = require("luapipe.schedule").build(family, { pp = PP, microbatches = M })
  for rk = 0, PP - 1 do
    local acts, lastpos = sched:actions(rk), {}
    for i, t in ipairs(acts) do
      for v in t:gmatch("(%d+)[FBIW]%d+") do lastpos[tonumber(v)] = i end
    end
    local out, mine = {}, {}
    for v in pairs(lastpos) do mine[#mine + 1] = v end
    table.sort(mine)
    if mode == "wait" then
      for _, v in ipairs(mine) do out[#out + 1] = v .. "UNSHARD" end
    end
    for i, t in ipairs(acts) do
      out[#out + 1] = t
      for v, p in pairs(lastpos) do
        if p == i then out[#out + 1] = v .. "REDUCE_GRAD" end
      end
    end
    if mode == "wait" then
      for _, v in ipairs(mine) do out[#out + 1] = v .. "WAIT_REDUCE_GRAD" end
      for _, v in ipairs(mine) do out[#out + 1] = v .. "RESHARD" end
    end
    sched:clear_rank(rk)
    sched:push(rk, out)
  end
  assert(sched:validate())
end

local hook_calls = 0
local hook
if (mode or ""):match("phases") then
  -- phase by phase, backward half first each round: the order changes, the
  -- results must not
  hook = function(exec, pair)
    hook_calls = hook_calls + 1
    assert(exec:begin_half("F", pair.f_stage, pair.f_mb))
    assert(exec:begin_half(pair.b_type, pair.b_stage, pair.b_mb))
    assert(exec:phase("F") ~= "done" and exec:phase("B") ~= "done")
    local fd, bd = false, false
    while not (fd and bd) do
      if not bd then bd = assert(exec:advance("B")) end
      if not fd then fd = assert(exec:advance("F")) end
    end
    assert(exec:phase("F") == "done" and exec:phase("B") == "done")
  end
elseif mode == "hook" then
  hook = function(exec, pair)
    hook_calls = hook_calls + 1
    assert(exec:run_half(pair.b_type, pair.b_stage, pair.b_mb))
    assert(exec:run_half("F", pair.f_stage, pair.f_mb))
  end
end

local tdata, link = data, nil
if (mode or ""):match("skew") then
  link = rank % 2 == 1 and "lat=3ms,bw=1GB/s" or "lat=20us,bw=1GB/s"
  tdata = function(step, mb)
    if rank % 2 == 1 then
      local t0 = os.clock()
      while os.clock() - t0 < 0.002 * ((step + mb) % 3) do end
    end
    return data(step, mb)
  end
end

local CLIP = 0.05
local lr_schedule = recipe and { warmup = 1, decay = "cosine", steps = STEPS,
  min_lr = 0.1 * optimizer.lr } or nil
local r = train { model = model, schedule = sched, overlapped_fb = hook, microbatches = M,
  data = tdata, clip = recipe and CLIP or nil, lr_schedule = lr_schedule,
  link = link,
  steps = STEPS, seed = SEED, optimizer = optimizer, quiet = true, lookahead = lookahead,
  partition = mode == "cost" and "cost" or "layers", ep = EP, dp = DP ~= EP and DP or nil,
  zero = ZERO == 1 and 1 or nil,
  eplb = (mode or ""):match("eplb") and { every = 1, redundant = 1 } or nil,
  precision = precision }
local ref = train.reference { model = model, microbatches = M, data = data, steps = STEPS,
  seed = SEED, optimizer = optimizer, clip = recipe and CLIP or nil, lr_schedule = lr_schedule,
  precision = precision }

local fails = {}
local function check(what, got, want)
  local scale = math.abs(want)
  if math.abs(got - want) > 1e-5 * math.max(scale, 1e-6) then
    fails[#fails + 1] = string.format("%s: got %.9g, want %.9g", what, got, want)
  end
end

for k = 1, STEPS do check("loss of step " .. k, r.losses[k], ref.losses[k]) end
if bf16 then
  if r.precision ~= "bf16" then fails[#fails + 1] = "r.precision is " .. tostring(r.precision) end
  local f32 = train.reference { model = model, microbatches = M, data = data, steps = STEPS,
    seed = SEED, optimizer = optimizer, clip = recipe and CLIP or nil, lr_schedule = lr_schedule }
  local differ = false
  for k = 1, STEPS do
    differ = differ or f32.losses[k] ~= ref.losses[k]
    if math.abs(f32.losses[k] - ref.losses[k]) > 0.02 * math.abs(f32.losses[k]) then
      fails[#fails + 1] = string.format("bf16 loss of step %d: %.9g, float32's %.9g: "
        .. "more than 2%% apart", k, ref.losses[k], f32.losses[k])
    end
  end
  if not differ then
    fails[#fails + 1] = "bf16 losses equal float32's bitwise: the precision did nothing"
  end
end
if recipe then
  local clipped = false
  for k = 1, STEPS do
    if not r.grad_norms[k] or not ref.grad_norms[k] then
      fails[#fails + 1] = "no gradient norm for step " .. k
    else
      check("gradient norm of step " .. k, r.grad_norms[k], ref.grad_norms[k])
      if ref.grad_norms[k] > CLIP then clipped = true end
    end
    check("learning rate of step " .. k, r.lrs[k], ref.lrs[k])
  end
  if not clipped then
    fails[#fails + 1] = "no step's norm exceeded the clip: the test clips nothing"
  end
end

local want = ref.params()
local V = r.schedule:info().vstages
local sums = {}
for i = 1, 2 * V do sums[i] = 0 end
local nchecked = 0
for _, vs in ipairs(r.stage_params()) do
  local s1, s2 = 0, 0
  local names = {}
  for name in pairs(vs.params) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local got, w = vs.params[name], want[name]
    if not w then
      fails[#fails + 1] = "parameter " .. name .. " is not in the reference"
    else
      -- relative to the tensor's largest magnitude
      local md, mx = 0, 0
      for i = 1, #w do
        md = math.max(md, math.abs(got[i] - w[i]))
        mx = math.max(mx, math.abs(w[i]))
      end
      if md > 1e-5 * math.max(mx, 1e-6) then
        fails[#fails + 1] = string.format("stage %d (vstage %d) parameter %s: max |diff| %.3g "
          .. "(max |value| %.3g)", vs.stage, vs.id, name, md, mx)
      end
      nchecked = nchecked + 1
    end
    for i = 1, #got do
      s1 = s1 + got[i]
      s2 = s2 + got[i] * ((i % 97) + 1)
    end
  end
  sums[2 * vs.id + 1], sums[2 * vs.id + 2] = s1, s2
end
if mode == "hook" or (mode or ""):match("phases") then
  local calls = assert(comm.allreduce({ hook_calls }, "gathering hook calls"))[1]
  if calls == 0 then fails[#fails + 1] = "the overlapped_fb hook was never called" end
end
if nchecked == 0 then fails[#fails + 1] = "no parameters checked on this rank" end
if (mode or ""):match("eplb") then
  local e = r.summary.eplb
  if not e or e.plans ~= STEPS then
    fails[#fails + 1] = "expected " .. STEPS .. " EPLB plans, got " .. tostring(e and e.plans)
  elseif e.bytes <= 0 then
    fails[#fails + 1] = "EPLB moved no weights"
  else
    -- the last plan against the last step's loads (what it was planned for)
    local loads = r.exec:expert_loads()
    local E = #loads[1]
    local def = {}
    for l = 1, #loads do
      def[l] = {}
      for s = 0, ((E + EP - 1) // EP) * EP - 1 do def[l][s + 1] = s % E end
    end
    local before, after = train.load_ratio(loads, def, EP),
      train.load_ratio(loads, e.placements, EP)
    if after > before + 1e-9 then
      fails[#fails + 1] = string.format("EPLB made the load worse: max/mean %.3f -> %.3f",
        before, after)
    end
    if rank == 0 then
      print(string.format("eplb: %d plans, %d bytes moved, load max/mean %.3f -> %.3f (last step)",
        e.plans, e.bytes, before, after))
    end
  end
end

-- copies of a replicated stage must be bitwise equal: compare checksums
local all = assert(comm.allreduce(sums, "gathering parameter checksums"))
local copies = 0
for v = 0, V - 1 do
  for u = v + 1, V - 1 do
    if r.schedule:vstage(v) == r.schedule:vstage(u) then
      copies = copies + 1
      if all[2 * v + 1] ~= all[2 * u + 1] or all[2 * v + 2] ~= all[2 * u + 2] then
        fails[#fails + 1] = string.format("copies %d and %d of model stage %d differ", v, u,
          (r.schedule:vstage(v)))
      end
    end
  end
end

for _, f in ipairs(fails) do
  print(string.format("rank %d: FAIL %s %d ranks: %s", rank, family, P, f))
end
if #fails == 0 then
  print(string.format("rank %d: ok %s pp=%d dp=%d ep=%d zero=%d M=%d (%d params, "
    .. "%d replicated stages, losses %.6f %.6f %.6f; optimizer %d bytes)", rank, family, PP, DP,
    EP, ZERO, M, nchecked, copies, r.losses[1], r.losses[2], r.losses[3], r.exec:optim_bytes()))
end
local total = assert(comm.allreduce({ #fails }, "gathering failure counts"))[1]
os.exit(total == 0 and 0 or 1)
