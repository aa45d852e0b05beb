-- luapipe.train: pipeline-parallel training of a luapipe.nn model on the
-- ranks of this job (one process per rank under mpirun), and the
-- single-process reference it must agree with.
--
--   local train = require("luapipe.train")
--   local r = train { model = model, schedule = "1f1b", microbatches = 8,
--     data = function(step, mb) return input, target end, steps = 10 }
--   r.losses[k]   -- loss of step k (the same on every rank)
--
-- `luapipe help train` (luapipe.cli.help) documents the options, the
-- result, checkpoints and resume, the partition, MoE (pp x ep, EPLB),
-- overlapped_fb and devices. Failures are luapipe.Error values
-- (luapipe.util); the program's job policy (luapipe.cli.job) decides what
-- a failure does to the job: this module never ends the process.
local core = require("luapipe.core")
local comm = require("luapipe.comm")
local schedule = require("luapipe.schedule")
local checkpoint = require("luapipe.checkpoint")
local util = require("luapipe.util")
local nn = require("luapipe.nn")
local lr = require("luapipe.lr")

local M = {}

-- ---- expert placement in the loop (EPLB) ----

-- Mean over MoE layers of (rank max / rank mean) of the tokens each EP rank's
-- slots take under `placements` ({[layer] = phys_to_log, 0-based ids}):
-- an expert's tokens split evenly among its replicas.
local function load_ratio(loads, placements, ep)
  util.arg("train.load_ratio", 1, "loads", loads, "table", "a list of per-layer expert loads")
  util.arg("train.load_ratio", 2, "placements", placements, "table",
    "a list of per-layer placements")
  util.int_arg("train.load_ratio", 3, "ep", ep, 1)
  local sum, n = 0, 0
  for l, c in ipairs(loads) do
    local pl = placements[l]
    local spr = #pl // ep
    local reps = {}
    for _, x in ipairs(pl) do reps[x] = (reps[x] or 0) + 1 end
    local mx, tot = 0, 0
    for r = 0, ep - 1 do
      local t = 0
      for s = r * spr + 1, (r + 1) * spr do t = t + c[pl[s] + 1] / reps[pl[s]] end
      mx, tot = math.max(mx, t), tot + t
    end
    if tot > 0 then sum, n = sum + mx / (tot / ep), n + 1 end
  end
  return n > 0 and sum / n or 1
end
M.load_ratio = load_ratio

-- The placement lp_nn_set_ep starts with: ceil(E / ep) slots per rank,
-- slot s holds expert s % E.
local function default_placement(E, ep)
  local spr, pl = (E + ep - 1) // ep, {}
  for s = 0, spr * ep - 1 do pl[s + 1] = s % E end
  return pl
end

-- An EPLB loop over exec: record every step's loads, plan with the
-- Balancer (every N steps from step N, or below a balancedness threshold),
-- move weights at the step boundary. opts: {every=, redundant=, threshold=,
-- predictor=, window=}. Tracks the load ratio before and after.
local function eplb_loop(exec, opts, ep)
  local eplb = require("luapipe.eplb")
  local L = { ep = ep, opts = opts or {}, placements = nil, plans = 0, bytes = 0,
    before = { sum = 0, n = 0 }, after = { sum = 0, n = 0 }, last_loads = nil }
  function L.balancer(E)
    if not L.bal then
      local spr = (E + ep - 1) // ep + (L.opts.redundant or 0)
      L.spr = spr
      L.bal = eplb.balancer { replicas = ep * spr, gpus = ep, every = L.opts.every,
        threshold = L.opts.threshold, predictor = L.opts.predictor,
        window = L.opts.window or L.opts.every }
    end
    return L.bal
  end
  -- What a checkpoint keeps so that a resumed run plans as this one would:
  -- the placements in force, the Balancer's history and plan in force, the
  -- load-ratio tallies (floats as exact text), the bytes moved by all
  -- ranks. nil before the first step (or without MoE layers). Collective.
  function L.state()
    if not L.placements then return nil end
    local function exact(a) return { sum = string.format("%.17g", a.sum), n = a.n } end
    local moved = assert(comm.allreduce({ L.bytes }, "EPLB: bytes moved"))[1]
    return { ep = ep, every = L.opts.every, redundant = L.opts.redundant or 0,
      placements = L.placements, plans = L.plans, bytes = math.floor(moved + 0.5),
      before = exact(L.before),
      after = exact(L.after), balancer = L.bal and L.bal:export() or nil }
  end
  -- Takes back L.state() from a checkpoint (file: its name, for errors);
  -- raises naming the file when it was written with other EPLB settings.
  function L.restore(t, file)
    local function differs(what, a, b)
      error(string.format("luapipe.train: checkpoint %s does not match this run: %s %s in the "
        .. "checkpoint, %s in this run", file, what, tostring(a), tostring(b)), 0)
    end
    if t.ep ~= ep then differs("EP size", t.ep, ep) end
    if t.every ~= L.opts.every then
      differs("eplb.every", t.every or "none", L.opts.every or "none")
    end
    if t.redundant ~= (L.opts.redundant or 0) then
      differs("eplb.redundant", t.redundant, L.opts.redundant or 0)
    end
    -- the bytes of every rank so far count once, on rank 0
    L.placements, L.plans, L.bytes = t.placements, t.plans, comm.rank() == 0 and t.bytes or 0
    L.before = { sum = tonumber(t.before.sum), n = t.before.n }
    L.after = { sum = tonumber(t.after.sum), n = t.after.n }
    if t.balancer then
      L.balancer(t.balancer.experts)
      L.bal:import(t.balancer)
    end
  end
  function L.after_step(k)
    local loads = exec:expert_loads()
    if #loads == 0 then return end
    local E = #loads[1]
    if not L.placements then
      L.placements = {}
      for l = 1, #loads do L.placements[l] = default_placement(E, ep) end
    end
    local r = load_ratio(loads, L.placements, ep)
    local acc = L.plans == 0 and L.before or L.after
    acc.sum, acc.n = acc.sum + r, acc.n + 1
    L.last_loads = loads
    if not L.opts.every then return end
    L.balancer(E)
    L.bal:record(k, loads)
    if k < L.opts.every or not L.bal:due(k) then return end
    local plan, err = L.bal:plan()
    if not plan then error("luapipe.train: EPLB planning failed: " .. tostring(err), 0) end
    local moved = 0
    for l = 1, #loads do
      local pl = plan.physical_to_logical[l]
      local b, serr = exec:set_placement(l - 1, L.spr, pl)
      if not b then error("luapipe.train: " .. tostring(serr), 0) end
      moved = moved + b
      L.placements[l] = pl
    end
    L.bytes = L.bytes + moved
    L.plans = L.plans + 1
    L.after = { sum = 0, n = 0 }
  end
  -- {before =, after =, plans =, bytes = (every rank's, summed)}: collective
  function L.result()
    local b = L.before.n > 0 and L.before.sum / L.before.n or 1
    local a = b
    if L.plans > 0 then
      a = L.after.n > 0 and L.after.sum / L.after.n
        or (L.last_loads and load_ratio(L.last_loads, L.placements, ep) or b)
    end
    local t = assert(comm.allreduce({ L.bytes }, "EPLB: bytes moved"))
    return { before = b, after = a, plans = L.plans, bytes = math.floor(t[1] + 0.5),
      placements = L.placements }
  end
  return L
end

-- Errors are luapipe.Error values (luapipe.util): the text, and fields
-- that tell the program's job policy (luapipe.cli.job) what the job does.
-- The library never ends the process.
local function fail(msg, option)
  util.fail({ what = msg, option = option }, 0)
end

-- A failure that leaves the other ranks waiting on this one (they are in a
-- collective or an exchange it will never join): the error says so
-- (stranded), and the job policy takes the job down. On one process a
-- plain error.
local function fail_stranded(msg)
  util.fail({ what = msg, stranded = comm.size() > 1 }, 0)
end

-- A mistake in how the job was started or configured, found the same way
-- on every rank: every rank raises it (everywhere: the job policy prints
-- it once, on rank 0, and every rank exits with status 2; a script that
-- catches it goes on, on every rank); on one process an error printed as
-- one line (a REPL session goes on).
local function usage_fail(msg)
  util.arg("train.usage_fail", 1, "msg", msg, "string", "a message")
  if comm.size() > 1 then util.fail({ what = msg, everywhere = true, status = 2 }, 0) end
  util.fail(msg, 0)
end
M.usage_fail = usage_fail

-- The device cannot be used (no GPU, a bad name):
-- a usage error.
local device_fail = usage_fail

-- A family's constraint on pp or microbatches that the job breaks
-- (schedules.problem's fields), in the words of someone who only chose how
-- many processes mpirun starts: nprocs processes, ep of them per pipeline
-- rank (word: what those are called, "ep" or "dp"; default "ep"). The text
-- is built from the fields, never parsed from a message.
local function in_rank_terms(p, nprocs, ep, word)
  util.arg("train.in_rank_terms", 1, "problem", p, "table", "a table from schedules.problem")
  util.arg("train.in_rank_terms", 2, "nprocs", nprocs, "integer", "the number of processes")
  util.arg("train.in_rank_terms", 3, "ep", ep, "integer", "the expert-parallel degree")
  if type(p.label) ~= "string" or type(p.text) ~= "string" then
    util.raise("train.in_rank_terms: problem (argument 1) must be a table from "
      .. "schedules.problem, got "
      .. util.shown(p))
  end
  local name = p.label
  if p.field == "pp" and p.rule == "even" then
    if nprocs == 1 then
      return string.format("%s needs an even number of ranks; this is one process (start it with "
        .. "mpirun -np 2 or more)", name)
    elseif ep > 1 then
      return string.format("%s needs an even number of pipeline ranks; mpirun started %d "
        .. "= pp %d x %s %d", name, nprocs, p.got, word or "ep", ep)
    end
    return string.format("%s needs an even number of ranks; mpirun started %d", name, p.got)
  elseif p.field == "microbatches" and p.rule == "at_least" then
    return string.format("%s needs at least %d micro-batches per rank: %d micro-batches "
      .. "on %s, got %d", name, p.per_pp, p.need, util.count(p.need // p.per_pp, "rank"), p.got)
  end
  return name .. ": " .. p.text
end
M.in_rank_terms = in_rank_terms

-- A schedule file named by train{schedule = "found.csv"}: a .csv or .json
-- file (as `luapipe search -o` writes) or a .lua schedule file (run with
-- {pp =, microbatches =, chunks =}). Loaded, then checked against this
-- job: its pipeline ranks against the job's (pp, or the ranks mpirun
-- started / ep), its micro-batches against opts.microbatches when given
-- (else the file's count is the run's). A mismatch is a usage error
-- naming the file, both counts and the way out.
local function is_schedule_file(spec)
  return type(spec) == "string" and require("luapipe.schedules").canonical(spec) == nil
    and (spec:match("%.csv$") or spec:match("%.json$") or spec:match("%.lua$")) ~= nil
end

local function schedule_file(opts, path)
  local size, ep = comm.size(), opts.ep or 1
  local pp = opts.pp or size // ep
  if opts.chunks ~= nil then
    usage_fail(string.format("luapipe.train: chunks applies to a family (interleaved1f1b); "
      .. "the schedule file %s has its own placement", path))
  end
  local mb = opts.microbatches
  local s, err = schedule.load(path, { pp = pp, microbatches = mb or 2 * pp })
  if not s then usage_fail("cannot load the schedule file " .. tostring(err)) end
  local i = s:info()
  if i.ranks ~= pp then
    local job = ep > 1 and string.format("pp x ep = %d x %d", pp, ep)
      or (size > 1 and "mpirun -np " .. size or "one process")
    local fix = ep > 1 and string.format("run it with mpirun -np %d (pp %d x ep %d)", i.ranks * ep,
      i.ranks, ep)
      or string.format("run it with mpirun -np %d", i.ranks)
    usage_fail(string.format("schedule file %s is for %s, but this run has %d (%s): %s, or make a"
      .. " schedule for %d (luapipe search --pp %d)", path, util.count(i.ranks, "pipeline rank"),
      pp, job, fix, pp, pp))
  end
  if mb ~= nil and i.microbatches ~= mb then
    usage_fail(string.format("schedule file %s has %s per step, but this run asks for %d"
      .. " (microbatches = %d): leave it out to take the file's, or make a schedule for %d"
      .. " (luapipe search -m %d)", path, util.count(i.microbatches, "micro-batch"), mb,
      mb, mb, mb))
  end
  local ok, verr = s:validate()
  if not ok then
    usage_fail(string.format("schedule file %s is invalid: %s", path, tostring(verr)))
  end
  return s
end

-- Resolves opts.schedule to a validated compute-only schedule.
local function get_schedule(opts)
  local s = opts.schedule
  if is_schedule_file(s) then s = schedule_file(opts, s) end
  if opts.chunks ~= nil and type(s) ~= "string" then
    usage_fail("luapipe.train: chunks applies to a family name (interleaved1f1b); this schedule is "
      .. "built already")
  end
  if type(s) == "string" then
    local fam = require("luapipe.schedules").canonical(s)
    if opts.chunks ~= nil and fam and fam ~= "interleaved1f1b" then
      usage_fail(string.format("luapipe.train: chunks = %s applies to interleaved1f1b "
        .. "only; %s has a fixed placement (%s)", tostring(opts.chunks), s,
        (fam == "zbv" or fam == "dualpipev")
        and "two chunks per rank" or "one model stage per rank"))
    end
    local ep = opts.dp or opts.ep or 1 -- the ranks per pipeline rank
    local pp = opts.pp or comm.size() // ep
    local mb = opts.microbatches or 2 * pp
    -- pp is the job's (derived, or what the job's size gives): a broken
    -- family constraint is a mistake in how it was started
    local by_job = opts.pp == nil or pp * ep == comm.size()
    local bad = fam and math.type(pp) == "integer" and pp >= 1 and math.type(mb) == "integer"
      and mb >= 1
      and require("luapipe.schedules").problem(fam, pp, mb)
    if bad and by_job then
      usage_fail(in_rank_terms(bad, comm.size(), ep, opts.dp and opts.dp ~= (opts.ep or 1)
        and "dp" or "ep"))
    end
    local ok, res = pcall(schedule.build, s, { pp = pp, microbatches = mb, chunks = opts.chunks })
    if not ok then
      local msg = util.message(res) -- the position is ours, not the user's
      if by_job then usage_fail(msg) end
      fail("luapipe.train: " .. msg)
    end
    s = res
  elseif s == nil then
    fail("luapipe.train: 'schedule' is required (a family name or a luapipe.Schedule)", "schedule")
  end
  local ok, err = s:validate()
  if not ok then fail("luapipe.train: the schedule is invalid: " .. tostring(err)) end
  if s:note() and comm.rank() == 0 and not opts.quiet then
    io.stderr:write("luapipe.train: note: ", s:note(), "\n")
    io.stderr:flush()
  end
  return s
end

local function check_common(opts, who)
  if type(opts) ~= "table" then
    util.raise(who .. " expects a table of options, got " .. util.shown(opts))
  end
  local function bad(option, msg) util.raise { what = who .. ": " .. msg, option = option } end
  if type(opts.model) ~= "table" or getmetatable(opts.model) == nil or not opts.model.partition then
    bad("model", "'model' must be a luapipe.nn model (nn.sequential{...}), got "
      .. util.shown(opts.model))
  end
  if type(opts.data) ~= "function" then
    bad("data", "'data' must be a function(step, mb) -> input, target, got "
      .. util.shown(opts.data))
  end
  local steps = opts.steps or 1
  if math.type(steps) ~= "integer" or steps < 0 then
    bad("steps", "'steps' must be a non-negative integer, got " .. util.shown(steps))
  end
  return steps
end

local function input_shape_of(data)
  local x = data(1, 0)
  if type(x) ~= "userdata" then
    error("luapipe.train: data(step, mb) must return luapipe.Tensor values (nn.tensor(shape, "
      .. "values))", 0)
  end
  return x:shape()
end

local function params_of(layer)
  local out = {}
  for _, p in ipairs(layer:params()) do out[p.name] = p.value end
  return out
end

-- The checks of train{}'s options and everything decided before the
-- executor exists (schedule, partition, shapes): the same on every rank.
-- Returns what the run needs.
-- The recipe's options: clip (the largest global gradient norm) and
-- lr_schedule (luapipe.lr) -> clip (0: off), lr_at (nil: the optimizer's
-- fixed rate). A mistake is the user's: one line, exit 2.
local function check_recipe(opts, steps, who)
  local clip = opts.clip
  if clip ~= nil and (type(clip) ~= "number" or clip ~= clip or clip <= 0 or clip == math.huge) then
    usage_fail(who .. ": 'clip' must be a positive number (the largest gradient norm), got "
      .. util.shown(clip))
  end
  local lr_at, record
  if opts.lr_schedule ~= nil then
    local bad = lr.check(opts.lr_schedule, "lr_schedule")
    if bad then usage_fail(who .. ": " .. bad) end
    local o = type(opts.optimizer) == "table" and opts.optimizer or {}
    local base = o.lr or (o.kind == "adamw" and 1e-3 or 0.01)
    lr_at = lr.at(opts.lr_schedule, base, math.max(steps, 1), "lr_schedule")
    record = lr.record(opts.lr_schedule, base, math.max(steps, 1))
  end
  return clip or 0, lr_at, record
end

-- precision = "bf16": Linear, attention (projections, scores, values) and
-- MoE experts multiply bf16-rounded inputs with float32 sums; embeddings,
-- norms, softmax, the loss, MoE routers, parameters and optimizer state
-- stay float32 (model:set_precision); activations at layer boundaries and
-- their gradients, and MoE expert rows, are bf16 values in every path and
-- travel as bf16 (lp_nn_chunk_set_boundary, the executor's messages). On the CPU oneDNN runs
-- the bf16 GEMMs where the build has it and the CPU has AVX512-BF16 or AMX;
-- elsewhere a float32 fallback over the same rounded inputs does (the
-- same products, another order of sums, float32 speed), said once.
-- -> "f32" | "bf16", engine text (bf16 only)
local function check_precision(opts, fn)
  local p = opts.precision or "f32"
  if p ~= "f32" and p ~= "bf16" then -- a usage error, the same on every rank: exit 2
    util.fail({ what = string.format("%s: 'precision' must be \"f32\" or \"bf16\", got %s", fn,
      util.shown(p)), option = "precision", status = 2, everywhere = comm.size() > 1 }, 0)
  end
  opts.model:set_precision(p)
  if p ~= "bf16" then return p end
  local engine, native = core.bf16_engine()
  if not native and comm.rank() == 0 and not opts.quiet then
    io.stderr:write(string.format("%s: note: precision bf16 runs as a %s: the same rounding,"
      .. " float32 speed\n", fn, engine))
    io.stderr:flush()
  end
  return p, engine
end

local function configure(opts)
  local steps = check_common(opts, "luapipe.train")
  local ckpt = checkpoint.options(opts) -- nil without checkpoint / resume
  if ckpt then ckpt.last = steps end -- the last step saves too (checkpoint.after_step)
  local model, seed = opts.model, opts.seed or 0
  local precision, bf16_engine = check_precision(opts, "luapipe.train")
  local size = comm.size()
  local ep = opts.ep or 1
  if math.type(ep) ~= "integer" or ep < 1 then
    fail("luapipe.train: 'ep' must be a positive integer, got " .. tostring(opts.ep), "ep")
  end
  if opts.pp ~= nil and (math.type(opts.pp) ~= "integer" or opts.pp < 1) then
    fail("luapipe.train: 'pp' must be a positive integer, got " .. tostring(opts.pp), "pp")
  end
  -- data parallelism: pp x dp ranks, EP groups of ep of each stage's dp
  -- ranks (dp = ep without it: the pp x ep grid)
  local dp = opts.dp or ep
  if math.type(dp) ~= "integer" or dp < 1 then
    usage_fail("luapipe.train: 'dp' must be a positive integer, got " .. util.shown(opts.dp))
  end
  if dp % ep ~= 0 then
    usage_fail(string.format("luapipe.train: ep = %d does not divide dp = %d (each "
      .. "EP group is ep of a pipeline stage's dp ranks)", ep, dp))
  end
  local zero = opts.zero or 0
  if zero ~= 0 and zero ~= 1 then
    usage_fail("luapipe.train: 'zero' must be 0 (off) or 1 (optimizer state sharded over dp), got "
      .. util.shown(opts.zero))
  end
  if zero == 1 and type(opts.eplb) == "table" and opts.eplb.every then
    usage_fail("luapipe.train: zero = 1 and eplb.every: expert placements cannot change while the"
      .. " experts' optimizer state is sharded (use one or the other)")
  end
  if dp > ep then
    local started = size > 1 and "mpirun started " .. size or "this is one process"
    if opts.pp == nil and size % dp ~= 0 then
      usage_fail(string.format("dp = %d does not divide the ranks: %s (pp x dp ranks are needed)",
        dp, started))
    end
    -- the core's one rule
    local gok, gerr = core.exec_grid_check(opts.pp or size // dp, ep, size, nil, dp)
    if not gok then usage_fail(gerr) end
  elseif ep > 1 then
    local started = size > 1 and "mpirun started " .. size or "this is one process"
    if opts.pp == nil and size % ep ~= 0 then
      usage_fail(string.format("ep = %d needs a multiple of %d ranks (pp x ep), but %s", ep,
        ep, started))
    end
    local gok, gerr = core.exec_grid_check(opts.pp or size // ep, ep, size) -- the core's one rule
    if not gok then usage_fail(gerr) end
  end
  if opts.announce ~= nil and type(opts.announce) ~= "function" then
    fail("luapipe.train: 'announce' must be a function(info), got " .. util.shown(opts.announce))
  end
  if opts.eval ~= nil and (type(opts.eval) ~= "table" or math.type(opts.eval.every) ~= "integer"
      or opts.eval.every < 1 or type(opts.eval.fn) ~= "function") then
    fail("luapipe.train: 'eval' must be {every = N (a positive integer), fn = function(step, "
      .. "layer)}, got " .. util.shown(opts.eval))
  end
  if opts.eplb ~= nil then
    local e = opts.eplb
    if type(e) ~= "table" then
      fail("luapipe.train: 'eplb' must be a table {every =, redundant =}", "eplb")
    end
    if e.every ~= nil and (math.type(e.every) ~= "integer" or e.every < 1) then
      fail("luapipe.train: eplb.every must be a positive integer, got " .. tostring(e.every))
    end
    if e.redundant ~= nil and (math.type(e.redundant) ~= "integer" or e.redundant < 0) then
      fail("luapipe.train: eplb.redundant must be a non-negative integer, got "
        .. tostring(e.redundant))
    end
  end
  local clip, lr_at, lr_record = check_recipe(opts, steps, "luapipe.train")
  local device = opts.device or "cpu"
  if type(device) ~= "string" then
    fail("luapipe.train: 'device' must be \"cpu\", \"cuda\" or \"cuda:N\", got "
      .. tostring(device), "device")
  end
  local device_name, derr = core.exec_device(device)
  if not device_name then device_fail("luapipe.train: " .. derr) end
  local s = get_schedule(opts)
  local info = s:info()
  local sname = info.name ~= "" and info.name or "(unnamed)"
  -- the same rule exec_new applies (dp: the grid's, dp = ep without DP)
  local gok, gerr = core.exec_grid_check(info.ranks, ep, size, sname, dp)
  if not gok then usage_fail(gerr) end
  local lowered = s
  if not info.lowered then
    local err
    lowered, err = s:lower()
    if not lowered then fail("luapipe.train: lowering the schedule failed: " .. tostring(err)) end
  end
  local in_shape = input_shape_of(opts.data)
  if dp > 1 then
    -- every DP rank takes its share of each micro-batch's rows
    if (in_shape[1] or 1) % dp ~= 0 then
      if dp == ep then
        usage_fail(string.format("a micro-batch of %d rows cannot be shared by ep = %d "
          .. "ranks: make the micro-batch size a multiple of %d", in_shape[1] or 1, ep, ep))
      end
      usage_fail(string.format("a micro-batch of %d rows cannot be shared by dp = %d "
        .. "ranks: make the micro-batch size a multiple of %d", in_shape[1] or 1, dp, dp))
    end
    in_shape = { table.unpack(in_shape) }
    in_shape[1] = in_shape[1] // dp
  end
  local by = opts.partition or "cost"
  if by ~= "cost" and by ~= "layers" then
    fail("luapipe.train: 'partition' must be \"cost\" or \"layers\", got " .. util.shown(by),
      "partition")
  end
  -- resume: the partition the checkpoint was written with, whatever this
  -- run would measure (its rank files hold those stages' layers)
  local recorded, unrecorded
  if ckpt and ckpt.resume then
    recorded, unrecorded = checkpoint.recorded_partition(ckpt, info.stages, model:nlayers())
  end
  -- a cost split is judged by the step it gives this schedule (simulated:
  -- a stage's F a third of its measured forward + backward, B two thirds,
  -- I and W a third each), so ranks that hold several stages (interleaved,
  -- V shapes, DualPipe's two directions) get balanced loads, not only
  -- balanced stages. With one stage per rank the balanced split is already
  -- the one (no score). A family with many micro-batches is judged on the
  -- same family with fewer (2 per virtual stage: the same placement and
  -- shape, a much shorter simulation; a large schedule takes tens of ms
  -- per simulation and the search tries hundreds of splits).
  local score
  if (info.vstages or 0) > info.ranks then
    local judge = s
    local fam = type(opts.schedule) == "string"
      and require("luapipe.schedules").canonical(opts.schedule)
    local few = 2 * info.vstages
    if fam and info.microbatches > few then
      few = few + (-few) % info.ranks -- a multiple of the ranks (interleaved1f1b wants one)
      local ok, small = pcall(schedule.build, opts.schedule, { pp = info.ranks, microbatches = few,
        chunks = opts.chunks })
      if ok and small and small:info().stages == info.stages then judge = small end
    end
    score = function(stage_costs)
      local st = {}
      for k, c in ipairs(stage_costs) do
        st[k - 1] = { F = c / 3, B = 2 * c / 3, I = c / 3, W = c / 3 }
      end
      local ok, res = pcall(judge.simulate, judge, { stages = st })
      return ok and res and res:makespan() or math.huge
    end
  end
  local popts = { stages = info.stages, by = by, input_shape = in_shape, seed = seed,
    score = score }
  if recorded then popts.by, popts.bounds = recorded.by, recorded.bounds end
  local ok, part = pcall(model.partition, model, popts)
  if not ok then fail("luapipe.train: " .. util.message(part)) end
  if recorded then
    part.recorded = recorded.file
    if recorded.by ~= by and comm.rank() == 0 and not opts.quiet then
      io.stderr:write(string.format("luapipe.train: note: resuming with the partition %s records"
        .. " (by %s: layers %s), not partition = %q%s\n", recorded.file, recorded.by,
        nn.bounds_text(part.bounds), by, opts.partition and "" or " (the default)"))
      io.stderr:flush()
    end
  elseif unrecorded == "none" then
    ckpt.load_hint = string.format(" (the checkpoint records no partition, as an older "
      .. "luapipe wrote it, and this run split the model by %s as layers %s: if it was written "
      .. "with another split, resume with that partition, e.g. partition = \"layers\", "
      .. "the old default)", by, nn.bounds_text(part.bounds))
  end
  local ok2, act_shapes = pcall(model.stage_input_shapes, model, part, in_shape)
  if not ok2 then fail("luapipe.train: " .. tostring(act_shapes)) end
  if opts.link then
    local lok, lerr = pcall(comm.set_link, opts.link)
    if not lok then usage_fail("luapipe.train: link: " .. util.message(lerr)) end
  end
  if ckpt then ckpt.grid = { dp = dp, ep = ep, zero = zero } end
  return { opts = opts, steps = steps, ckpt = ckpt, model = model, seed = seed, ep = ep, dp = dp,
    zero = zero, clip = clip, lr_at = lr_at, lr_record = lr_record,
    device = device, device_name = device_name, info = info, lowered = lowered, in_shape = in_shape,
    part = part, act_shapes = act_shapes, precision = precision, bf16_engine = bf16_engine }
end

-- ---- the whole model on rank 0 (evaluation, sampling) ----

-- Gathers every model stage's parameters into one luapipe.Layer of the
-- whole model on rank 0 (built on the host once and kept in held, its
-- values replaced at each call); nil on the other ranks. Collective: every
-- rank calls it after the same step. A model stage's values come from the
-- rank of its first virtual stage, as one list of floats (parameters are
-- float32: exact), stage after stage in order, so no send waits on a
-- receive that comes later. Models with MoE layers are refused (their
-- expert placement and router bias live beside the parameters).
local GATHER_TAG = 7177
local function gather_model(c, exec, held)
  if #exec:expert_loads() > 0 then
    checkpoint.fail_all("luapipe.train: the whole model cannot be gathered on rank "
      .. "0 with MoE layers (their experts and router biases are not parameters of one layer)")
  end
  local rank, part = comm.rank(), c.part
  local owner = {} -- model stage -> the rank of its first virtual stage
  for v = 0, c.info.vstages - 1 do
    local stage, r = c.lowered:vstage(v)
    if owner[stage] == nil then owner[stage] = r end
  end
  local mine = {}
  for _, v in ipairs(exec:vstages()) do
    if owner[v.stage] == rank and not mine[v.stage] then
      mine[v.stage] = v.layer
    else
      v.layer:close()
    end
  end
  local values = {}
  for st = 0, part.stages - 1 do
    local what = string.format("gathering model stage %d on rank 0", st)
    if owner[st] == rank then
      local ps = mine[st]:params()
      mine[st]:close()
      if rank == 0 then
        for _, p in ipairs(ps) do values[p.name] = p.value end
      else
        local flat = {}
        for _, p in ipairs(ps) do table.move(p.value, 1, #p.value, #flat + 1, flat) end
        local ok, err = comm.send(0, flat, GATHER_TAG, what)
        if not ok then fail_stranded("luapipe.train: " .. tostring(err)) end
      end
    elseif rank == 0 then
      local names = held.names[st] -- the stage's parameter names and sizes, from a copy built once
      if not names then
        local l = c.model:build_stage(part, st, c.seed)
        names = {}
        for i, p in ipairs(l:params()) do names[i] = { name = p.name, n = #p.value } end
        l:close()
        held.names[st] = names
      end
      local total = 0
      for _, x in ipairs(names) do total = total + x.n end
      local flat, err = comm.recv(owner[st], total, GATHER_TAG, what)
      if not flat then fail_stranded("luapipe.train: " .. tostring(err)) end
      local at = 1
      for _, x in ipairs(names) do
        values[x.name] = table.move(flat, at, at + x.n - 1, 1, {})
        at = at + x.n
      end
    end
  end
  if rank ~= 0 then return nil end
  held.layer = held.layer or c.model:build(c.seed)
  held.layer:set_params(values)
  return held.layer
end

-- A mistake in train{}'s options is found on every rank alike (configure
-- runs the same code on the same options): under mpirun every rank raises
-- it (everywhere, status 2: the job policy prints it once, by rank 0, or,
-- when rank 0 found none, by the first rank that did; cause: that rank's
-- own error); on one process it is raised as it is. Every rank reaches the
-- one all-reduce below whether its configure failed or not.
local function configure_all(opts)
  local size = comm.size()
  if size == 1 then return configure(opts) end
  local ok, c = pcall(configure, opts)
  local flags = {}
  for r = 1, size do flags[r] = 0 end
  if not ok then flags[comm.rank() + 1] = 1 end
  local all = comm.allreduce(flags, "luapipe.train: checking the options on every rank")
  if not all then
    fail_stranded("luapipe.train: the ranks could not agree that the options are valid")
  end
  local first
  for r = 1, size do
    if all[r] ~= 0 then first = r - 1; break end
  end
  if not first then return c end
  local text
  if not ok then
    local okm, msg = pcall(tostring, c)
    text = (first == comm.rank() and first ~= 0 and ("rank " .. first .. ": ") or "")
      .. (okm and msg or "luapipe.train: invalid options")
  else
    text = string.format("luapipe.train: the options were refused on rank %d (see its message)",
      first)
  end
  util.fail({ what = text, everywhere = true, speaker = first, status = 2, rank = first,
    option = (not ok) and util.is_error(c) and c.option or nil, cause = (not ok) and c or nil }, 0)
end

-- luapipe.train{model=, schedule=, data=, steps=, optimizer=, seed=,
--   microbatches=, pp=, chunks=, partition = "cost" | "layers", trace=,
--   quiet=, lookahead=, overlapped_fb=, checkpoint = {dir=, every=}, resume=,
--   save = DIR2 (a luapipe.models model: written back there)} -> result
function M.run(opts)
  local c = configure_all(opts)
  local steps, ckpt, model, seed, ep = c.steps, c.ckpt, c.model, c.seed, c.ep
  local device, device_name, info, lowered = c.device, c.device_name, c.info, c.lowered
  local in_shape, part, act_shapes = c.in_shape, c.part, c.act_shapes
  local rank, size = comm.rank(), comm.size()
  -- the options are valid: the run's header
  if rank == 0 and opts.announce then opts.announce(info) end
  local exec, err = core.exec_new(lowered, {
    -- ep: a loaded model reads its own experts
    build = function(stage) return model:build_stage(part, stage, seed, ep) end,
    data = opts.data, loss = model.loss, act_shapes = act_shapes,
    optimizer = opts.optimizer, trace = (opts.trace or opts.svg) and true or false,
      lookahead = opts.lookahead,
    overlapped_fb = opts.overlapped_fb, ep = ep, dp = c.dp, zero = c.zero, device = device,
      clip = c.clip,
  })
  if not exec then fail_stranded("luapipe.train: " .. err) end
  local M_ = info.microbatches
  local samples = M_ * (in_shape[1] or 1) * c.dp -- whole micro-batches (each DP rank has a share)
  local losses, timing, gnorms, rates = {}, {}, {}, {}
  local quiet = opts.quiet
  -- resume: every rank loads its file of the latest checkpoint, then the
  -- steps after it run with their true numbers
  local first_step = ckpt and ckpt.resume and checkpoint.resume(ckpt, exec) + 1 or 1
  if ckpt and ckpt.fresh and rank == 0 and not quiet then
    io.write(string.format("no checkpoint in %s yet: starting at step 1\n", ckpt.dir))
    io.flush()
  end
  if first_step > 1 and rank == 0 and not quiet then
    io.write(string.format("resumed from checkpoint %s/step%d (after step %d): %s\n",
      ckpt.resume_dir, first_step - 1, first_step - 1, first_step <= steps
        and string.format("running steps %d..%d", first_step, steps)
        or string.format("no steps left to run (steps = %d)", steps)))
    io.flush()
    if ckpt.written_under and ckpt.written_under ~= info.name then -- (rank 0 read latest)
      io.stderr:write(string.format("luapipe.train: note: the checkpoint was written under schedule"
        .. " '%s', this run's is '%s': it places the model stages on the ranks alike, "
        .. "so parameters and optimizer state carry over (they do not depend on the schedule)\n",
        ckpt.written_under, info.name))
      io.stderr:flush()
    end
  end
  -- what a job stopped by a signal (Ctrl-C to mpirun) prints: where a
  -- resume would start (rank 0; updated at every save)
  local set_stop_note = rank == 0 and not quiet and ckpt and ckpt.dir and core.set_stop_note
    or function() end
  local function stop_note(at)
    local due = ckpt.every * ((first_step + ckpt.every - 1) // ckpt.every)
    set_stop_note(at and string.format("luapipe: stopped; a resume (resume = true, the examples'"
      .. " --resume) would start from checkpoint %s/step%d (after step %d)", ckpt.dir, at, at)
      or string.format("luapipe: stopped before this run's first checkpoint (due after step %d):"
      .. " nothing of this run to resume from", math.min(steps, due)))
  end
  if ckpt and ckpt.dir then
    stop_note(first_step > 1 and ckpt.resume_dir == ckpt.dir and first_step - 1 or nil)
    ckpt.on_commit = stop_note -- (rank 0, as soon as latest names the new step)
  end
  if ckpt and ckpt.state and type(ckpt.state.partition) == "table" then
    -- the checkpoint loaded is the one whose partition configure used
    local rec = ckpt.state.partition
    local b = nn.check_bounds(rec.bounds, part.stages, model:nlayers())
    if not b or nn.bounds_text(b) ~= nn.bounds_text(part.bounds) then
      checkpoint.fail_all(string.format("luapipe.train: checkpoint %s does not match this run: the"
        .. " model was split as layers %s in the checkpoint, %s in this run", ckpt.state_file,
        b and nn.bounds_text(b) or "(unreadable)", nn.bounds_text(part.bounds)))
    end
  end
  if ckpt and ckpt.state and ckpt.state.precision ~= nil then
    -- the checkpoint's precision (state.json; none recorded: an older
    -- luapipe, nothing said): masters and optimizer state are float32 at
    -- either, so another precision resumes from them, said once
    local was = ckpt.state.precision
    if was ~= "f32" and was ~= "bf16" then
      checkpoint.fail_all(string.format("luapipe.train: checkpoint %s is damaged: its precision is"
        .. " %s, not \"f32\" or \"bf16\"", ckpt.state_file, util.shown(was)))
    end
    if was ~= c.precision and rank == 0 and not quiet then
      io.stderr:write(string.format("luapipe.train: note: checkpoint %s was trained at precision"
        .. " %s, this run trains at %s: its master weights and optimizer state are float32 either"
        .. " way, so it resumes from them at %s\n", ckpt.state_file, was, c.precision, c.precision))
      io.stderr:flush()
    end
  end
  local balance = eplb_loop(exec, opts.eplb, ep)
  local held = { names = {} } -- gather_model's whole model on rank 0
  if ckpt and ckpt.state and rank == 0 and not quiet and (ckpt.state.lr_schedule or c.lr_record)
      and not lr.same(ckpt.state.lr_schedule, c.lr_record) then
    -- the rate is a function of the step: the run goes on under this run's schedule
    io.write(string.format("note: the learning-rate schedule differs from the one checkpoint %s was"
      .. " trained under (%s there, %s here): this run's applies from step %d\n", ckpt.state_file,
      ckpt.state.lr_schedule and lr.describe_record(ckpt.state.lr_schedule) or "none",
      c.lr_record and lr.describe_record(c.lr_record) or "none", first_step))
    io.flush()
  end
  if ckpt and ckpt.state and ckpt.state.eplb then
    local rok, rerr = pcall(balance.restore, ckpt.state.eplb, ckpt.state_file)
    if not rok then checkpoint.fail_all(tostring(rerr)) end -- every rank has rank 0's state.json
  end
  for k = first_step, steps do
    if opts.trace_steps and k == steps - opts.trace_steps + 1 and k > first_step then
      exec:trace_clear() -- keep the events of the last trace_steps steps only
    end
    local rate
    if c.lr_at then
      local rok, r = pcall(c.lr_at, k)
      -- the same function of the step on every rank: a mistake found everywhere
      if not rok then usage_fail(util.message(r)) end
      rate = r
      exec:set_lr(rate)
    end
    local loss, serr = exec:step(k)
    if not loss then fail_stranded(serr) end
    losses[k] = loss
    gnorms[k] = exec:grad_norm()
    rates[k] = rate
    local wall, busy = exec:timing()
    if k == first_step and steps > k then exec:timing_reset() end -- the first step is warm-up
    local wall_max, busy_sum = wall, busy
    if size > 1 then
      local t = assert(comm.allreduce({ wall, busy }, "step timing"))
      wall_max, busy_sum = t[1] / size, t[2]
    end
    local bubble = wall_max > 0 and math.max(0, 100 * (1 - busy_sum / (size * wall_max))) or 0
    timing[k] = { wall = wall_max, bubble = bubble,
      samples_per_s = samples / math.max(wall_max, 1e-9) }
    if rank == 0 and not quiet and (k % (opts.log_every or 1) == 0 or k == first_step
      or k == steps) then
      local extra = (rate and string.format(", lr %.3g", rate) or "")
        .. (exec:grad_norm() and string.format(", gnorm %.4g", exec:grad_norm()) or "")
      io.write(string.format("step %d loss %.6f  (%.1f samples/s, bubble %.1f%%%s)\n", k, loss,
        timing[k].samples_per_s, bubble, extra))
      io.flush()
    end
    local eok, eerr = pcall(balance.after_step, k)
    if not eok then fail_stranded(tostring(eerr)) end
    if opts.eval and (k % opts.eval.every == 0 or k == steps) then
      -- the whole model on rank 0, given to the hook there; every rank
      -- learns whether it failed
      local layer = gather_model(c, exec, held)
      local hok, herr = true, nil
      if layer then hok, herr = pcall(opts.eval.fn, k, layer) end
      if size > 1 then
        local all = comm.allreduce({ hok and 0 or 1 }, "luapipe.train: the eval hook on rank 0")
        hok = all and all[1] == 0
      end
      if not hok then
        checkpoint.fail_all("luapipe.train: eval hook after step " .. k .. ": " .. tostring(herr))
      end
    end
    if ckpt then
      local saved = checkpoint.after_step(ckpt, exec, k, info, function()
        return { eplb = balance.state(),
          partition = checkpoint.partition_record(part, model:nlayers()),
          lr_schedule = c.lr_record, grid = { dp = c.dp, ep = c.ep, zero = c.zero },
          precision = c.precision }
      end)
      if saved and rank == 0 and not quiet then
        io.write(string.format("checkpoint after step %d written to %s\n", k, saved))
        io.flush()
      end
    end
  end
  set_stop_note(nil)
  local result = { losses = losses, timing = timing, partition = part, schedule = lowered,
    exec = exec, device = device_name, grad_norms = gnorms, lrs = rates, precision = c.precision,
    bf16_engine = c.bf16_engine }
  result.first_step = first_step -- > 1 after resume: losses[k] for k = first_step..steps
  -- {{id =, stage =, params = {[name] = values}}, ...} for this rank's virtual stages
  function result.stage_params()
    local out = {}
    for _, v in ipairs(exec:vstages()) do
      out[#out + 1] = { id = v.id, stage = v.stage, params = params_of(v.layer) }
      v.layer:close()
    end
    return out
  end
  -- the whole model as one luapipe.Layer on rank 0 (host memory), nil on
  -- the other ranks; collective: every rank calls it (sampling at the end)
  function result.model() return gather_model(c, exec, held) end
  -- {[name] = values} of this rank's stages (a replicated stage's first copy)
  function result.params()
    local out = {}
    for _, v in ipairs(result.stage_params()) do
      for name, val in pairs(v.params) do if out[name] == nil then out[name] = val end end
    end
    return out
  end
  if opts.save ~= nil then -- a luapipe.models model, written back (luapipe.models.save)
    local sok, serr = pcall(require("luapipe.models").save, model, opts.save, { from = result })
    if not sok then fail_stranded("save: " .. util.message(serr)) end
  end
  if opts.trace then
    local tok, terr = exec:trace_write(opts.trace) -- gathered over the comm on rank 0
    if not tok then fail_stranded("trace: " .. tostring(terr)) end
  end
  -- measured vs predicted (luapipe.perf): every rank takes part
  if steps >= first_step then
    local perf = require("luapipe.perf")
    result.summary = perf.summary(exec, lowered)
    result.summary.skipped = steps > first_step
    local dps, dperr = exec:dp_stats() -- collective: every rank's DP sums, optimizer bytes
    if not dps then fail_stranded("luapipe.train: " .. tostring(dperr)) end
    result.summary.dp = dps
    if #exec:expert_loads() > 0 then result.summary.eplb = balance.result() end
    if rank == 0 and not quiet then
      io.write(perf.format(result.summary), "\n")
      if c.precision == "bf16" then
        io.write("precision bf16: GEMMs on the ", c.bf16_engine, "\n")
      end
      io.flush()
    end
    if opts.svg then
      local sok, serr = perf.write_measured_svg(exec, lowered, opts.svg)
      if not sok then fail_stranded("svg: " .. tostring(serr)) end
    end
  end
  return result
end

-- luapipe.train.reference{model=, data=, steps=, microbatches=, optimizer=,
--   seed=} -> {losses =, params = function() -> {[name] = values}}
-- The same model trained without a pipeline: all layers in one process,
-- micro-batches 0..M-1 in order, each loss scaled by 1/M, one optimizer
-- step per step.
function M.reference(opts)
  local steps = check_common(opts, "luapipe.train.reference")
  local Mb = opts.microbatches
  if math.type(Mb) ~= "integer" or Mb < 1 then
    error("luapipe.train.reference: 'microbatches' must be a positive integer", 2)
  end
  local model = opts.model
  local precision, bf16_engine = check_precision(opts, "luapipe.train.reference")
  model:shapes(input_shape_of(opts.data))
  local layer = model:build(opts.seed or 0)
  local optim = core.nn_optim(layer, opts.optimizer)
  local clip, lr_at = check_recipe(opts, steps, "luapipe.train.reference")
  local losses, gnorms, rates = {}, {}, {}
  for k = 1, steps do
    if lr_at then
      rates[k] = lr_at(k)
      optim:set_lr(rates[k])
    end
    local loss, err = core.nn_reference_step(layer, optim, model.loss, Mb, opts.data, k, clip)
    if not loss then error("luapipe.train.reference: " .. err, 2) end
    losses[k] = loss
    if err >= 0 then gnorms[k] = err end
    if opts.verbose then io.write(string.format("step %d loss %.6f\n", k, loss)) end
  end
  return { losses = losses, grad_norms = gnorms, lrs = rates, layer = layer, precision = precision,
    bf16_engine = bf16_engine,
    params = function() return params_of(layer) end }
end

setmetatable(M, { __call = function(_, opts) return M.run(opts) end })
return util.guard(M, "luapipe.train")
