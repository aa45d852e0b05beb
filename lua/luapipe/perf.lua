-- luapipe.perf: what a training run measured against what the simulator
-- predicts from those measurements. Used by luapipe.train after the step
-- loop (every function here is collective: every rank calls it).
--
--   local perf = require("luapipe.perf")
--   local s = perf.summary(exec, sched)   -- same table on every rank
--   print(perf.format(s))
--   perf.write_measured_svg(exec, sched, "step.svg")   -- needs trace = true
--
-- Figures (times in milliseconds):
--   step_ms        measured step time: the largest per-rank mean step wall
--                  time (zero-grad to the end of the optimizer step)
--   predicted_ms   the simulator's prediction: the schedule simulated with
--                  the measured per-action mean costs of every model stage
--                  (F, B, I, W, FB, each with the exchange time it left
--                  exposed; latency = the emulated link's time for an
--                  activation message when the run has a link, else the
--                  measured message latency), plus each rank's
--                  measured optimizer time (with its summing of gradient
--                  copies at step end) after its last action (and
--                  after the other copies of its replicated stages are
--                  done, and their gradient sums crossed the link); the
--                  largest over ranks
--   makespan_ms    the simulated makespan alone (pipeline part)
--   spread_ms, spread_ratio, spread_draws  the prediction with the
--                  measured spread: 32 simulations, each action's time drawn
--                  from the kept times of its kind and model stage (see
--                  spread below), against step_ms
--   replay_ms, replay_step_ms, replay_ratio, replay_steps  the last
--                  steps (up to 64) each simulated with its own measured
--                  action times and optimizer times, against the measured
--                  time of the same steps: what mean costs miss (times that
--                  vary, on a schedule without slack) is in it, so the
--                  ratio's distance from 1 is the runtime's own waiting
--   ratio          predicted_ms / step_ms
--   oversubscribed {ranks =, cores =} when a host runs more ranks than the
--                  cores their affinity allows (the most crowded host): the
--                  prediction then does not apply (nil otherwise)
--   bubble_pct     measured bubble: mean over ranks of 1 - busy / step time,
--                  busy = compute actions + optimizer
--   sim_bubble_pct the same from the simulation (sim busy + optimizer over
--                  predicted_ms)
--   overhead_pct   100 * (wall - compute - wait) / wall, summed over ranks:
--                  step time spent neither computing nor waiting on messages
--   wait_pct, post_pct  waiting on messages; posting/polling (in overhead)
--   costs          {F = ms, B =, I =, W =, FB =} means over all stages
--   stages         {[stage] = {F = ms, ...}} per model stage (as simulated)
--   steps          steps measured (the first is skipped when there are more)
--   sim_a2a_ms, sim_a2a_hidden_pct, model_ms  (with a link and MoE) the
--                  simulator's exchange model (lp_sim.h): compute-only
--                  costs (measured less the time blocked in exchanges),
--                  every exchange at the link's all-to-all-v time, hidden
--                  in FB pairs under the other half's compute: exchange
--                  time per pipeline rank and step, the share hidden, and
--                  the step it predicts; beside the measured a2a_ms and
--                  a2a_hidden_pct it shows what the link alone costs (an
--                  EP partner that starts late is not in the model)
local core = require("luapipe.core")
local comm = require("luapipe.comm")
local util = require("luapipe.util")

local M = {}

-- the compute kinds, in the core's order and spelling (one C table)
M.kinds = {}
local is_kind = {}
for i, k in ipairs(core.compute_kinds) do M.kinds[i], is_kind[k] = k, true end
-- the kinds whose halves exchange tokens (lp_exec_action_exchanges)
local exchanging = { F = true, B = true, I = true }

-- The job's timing gathered from every rank (exec:job_timing, one C
-- collective): per world rank its figures and kept steps, per kind and
-- model stage the sums over the ranks, the message latency. Collective.
local function job_timing(exec)
  local t, err = exec:job_timing()
  if not t then error("luapipe.perf: " .. tostring(err), 0) end
  return t
end

-- The measured message latency of a job's timing: ms, count (0, 0 when no
-- message was measured: the integer, as the reports print it)
local function latency_of(job)
  if job.latency_messages == 0 then return 0, 0 end
  return job.latency_ms, job.latency_messages
end

-- perf.message_latency(exec, sched) -> mean latency in ms, count: from
-- the measured events (exec built with trace = true; 0, 0 without), over
-- the messages the receiver had to wait for: from the later of the
-- sender's isend and the start of the wait to the end of the wait (the
-- delivery and wake-up time the simulator's latency stands for; computed
-- in C, lp_exec_job_timing). Every rank gets the same figures (ranks of
-- one host share the trace clock). Collective.
function M.message_latency(exec, sched)
  util.arg("perf.message_latency", 1, "exec", exec, "luapipe.Exec")
  util.arg("perf.message_latency", 2, "sched", sched, "schedule",
    "the lowered luapipe.Schedule exec runs")
  return latency_of(job_timing(exec))
end

-- The replay (part of perf.summary): each of the last measured steps
-- (every rank's kept steps, up to 64, gathered by exec:job_timing)
-- simulated with its own measured action times (an action of a pipeline
-- rank: the mean over its EP ranks) and its
-- ranks' own optimizer times, against the measured time of the same step
-- (the largest over ranks). Mean costs leave out how action times vary
-- from step to step and from one position in the step to another; where
-- a schedule has no slack to absorb that (DualPipe's), the step is longer
-- than the mean costs say although the runtime adds nothing. The replay
-- keeps that in, so what is left between it and the measured step is the
-- runtime's own: waiting beyond the schedule's dependencies and latency.
-- A large job replays fewer steps: the gathered times stay under
-- LP_EXEC_JOB_KEPT_MAX numbers (a million: 8 MB, on 64 ranks of 4,000
-- actions 3 steps). Sets out.replay_ms, out.replay_step_ms (measured, same steps),
-- out.replay_ratio, out.replay_steps; nothing when no step was kept.
-- The prediction with the measured spread (part of perf.summary, after the
-- replay, from the same kept steps): SPREAD_DRAWS simulations in which
-- every compute action takes a time drawn from all the kept times of its
-- kind (F, B, I, W, FB) and model stage (an FB pair's: its F half's), on
-- any rank and in any step, and every rank's optimizer a time drawn from its
-- own kept ones; the mean of the predicted steps. Unlike the replay it is a
-- model, not the measured steps again: what it keeps of the measurement is
-- each kind's distribution (the variation a schedule without slack pays for,
-- and, pooled into it, the cost of an action's place in the step), not
-- which action was slow when. The draws are deterministic (their own
-- generator, seeded the same on every rank). Sets out.spread_ms,
-- out.spread_ratio (against step_ms), out.spread_draws.
local SPREAD_DRAWS = 32
local function spread(sched, base, predict, kept, P, out)
  local PS = sched:info().ranks
  local key, pool = {}, {}
  for p = 0, PS - 1 do
    key[p] = {}
    for i = 0, sched:count(p) - 1 do
      local a = sched:action(p, i)
      if is_kind[a.type] then
        local st = sched:vstage(a.stage)
        key[p][i] = a.type .. st
      end
    end
  end
  for _, k in ipairs(kept) do
    for p = 0, PS - 1 do
      for i, t in pairs(k.acts[p]) do
        local kk = key[p][i]
        if kk then
          pool[kk] = pool[kk] or {}
          pool[kk][#pool[kk] + 1] = t
        end
      end
    end
  end
  local state = 0x9E3779B97F4A7C15
  local function draw(n) -- xorshift64*, 1..n
    state = state ~ (state >> 12)
    state = state ~ (state << 25)
    state = state ~ (state >> 27)
    return ((state * 0x2545F4914F6CDD1D) >> 33) % n + 1
  end
  local sum = 0
  for _ = 1, SPREAD_DRAWS do
    local acts, opt = {}, {}
    for p = 0, PS - 1 do
      local row = {}
      for i, kk in pairs(key[p]) do
        local pl = pool[kk]
        if pl then row[i] = pl[draw(#pl)] end
      end
      acts[p] = row
    end
    for w = 0, P - 1 do opt[w] = kept[draw(#kept)].opt[w] end
    base.actions = acts
    local ok, res = pcall(sched.simulate, sched, base)
    if not ok or not res then return end
    sum = sum + predict(res, opt)
  end
  out.spread_draws = SPREAD_DRAWS
  out.spread_ms = sum / SPREAD_DRAWS
  out.spread_ratio = out.step_ms > 0 and out.spread_ms / out.step_ms or 0
end

local function replay(job, sched, cost, predict, out)
  local K, P, ep = job.kept, job.ranks, job.ep
  if K < 1 then return end -- a rank kept no step
  local ms = 1000
  local sum_pred, sum_meas = 0, 0
  local base = {}
  for k2, val in pairs(cost) do base[k2] = val end
  local kept = {} -- [k] = {acts = {[p] = {[i] = ms}}, opt = {[w] = s}}
  for k = 1, K do
    local acts, opt, meas = {}, {}, 0
    for w = 0, P - 1 do
      local step = job.rank[w].kept[k]
      meas = math.max(meas, step.wall)
      opt[w] = step.after
    end
    for p = 0, sched:info().ranks - 1 do
      local row = {}
      for i = 0, sched:count(p) - 1 do
        local t, n = 0, 0
        for j = 0, ep - 1 do
          local x = job.rank[p * ep + j].kept[k].actions[i]
          if x and x > 0 then t, n = t + x, n + 1 end
        end
        if n > 0 then row[i] = t / n * ms end
      end
      acts[p] = row
    end
    base.actions = acts
    local ok, res = pcall(sched.simulate, sched, base)
    if not ok or not res then return end
    sum_pred = sum_pred + predict(res, opt)
    sum_meas = sum_meas + meas * ms
    kept[k] = { acts = acts, opt = opt }
  end
  out.replay_steps = K
  out.replay_ms = sum_pred / K
  out.replay_step_ms = sum_meas / K
  out.replay_ratio = sum_meas > 0 and sum_pred / sum_meas or 0
  spread(sched, base, predict, kept, P, out)
end

-- perf.summary(exec, sched[, opts]) -> summary table (see above), the same
-- on every rank. sched: the lowered schedule exec runs. opts.latency_ms:
-- the message latency to simulate with (default: measured by
-- perf.message_latency when exec records trace events, else 0).
function M.summary(exec, sched, opts)
  util.arg("perf.summary", 1, "exec", exec, "luapipe.Exec")
  util.arg("perf.summary", 2, "sched", sched, "schedule", "the lowered luapipe.Schedule exec runs")
  util.arg("perf.summary", 3, "opts", opts, "?table", "a table {latency_ms =}")
  opts = opts or {}
  local job = job_timing(exec)
  local lat_n
  if opts.latency_ms == nil then
    opts.latency_ms, lat_n = latency_of(job)
  end
  local P, sum = job.ranks, job.sum -- sum: every rank's totals, summed
  local info = sched:info()
  local S = info.stages
  local n = math.max(job.rank[comm.rank()].steps, 1) -- steps this rank measured
  local steps = math.floor(sum.steps / P + 0.5)
  local ep = job.ep -- world rank = pipeline rank * ep + EP index
  local PS = info.ranks -- the schedule's (pipeline) ranks
  local ms = 1000
  local out = { steps = steps, ranks = P, schedule = info.name, microbatches = info.microbatches }
  local wall_sum = sum.wall
  out.overhead_pct = wall_sum > 0 and 100 * sum.overhead / wall_sum or 0
  out.wait_pct = wall_sum > 0 and 100 * sum.wait / wall_sum or 0
  out.post_pct = wall_sum > 0 and 100 * sum.post / wall_sum or 0
  out.compute_pct = wall_sum > 0 and 100 * sum.compute / wall_sum or 0
  -- all-to-all (MoE, EP > 1): the share of its time hidden under compute on
  -- the same rank = (in flight while the rank computed) / (its time); the
  -- emulated link's modelled time of the same exchanges (the rest of
  -- a2a_ms is waiting for the slower EP partner)
  out.a2a_count = sum.a2a_count
  out.a2a_ms = sum.a2a / math.max(n * P, 1) * ms -- per rank and step
  out.a2a_blocked_ms = sum.a2a_blocked / math.max(n * P, 1) * ms
  out.a2a_link_ms = sum.a2a_link / math.max(n * P, 1) * ms
  out.a2a_hidden_pct = sum.a2a > 0 and 100 * math.min(1, sum.a2a_hidden / sum.a2a) or nil
  -- bytes every rank sent per step (summed over the ranks, mean over the
  -- steps): activations and gradients between pipeline ranks, MoE token
  -- rows between EP ranks (bf16 models: 2 bytes a value)
  out.msg_bytes = sum.msg_bytes / math.max(steps, 1)
  out.a2a_bytes = sum.a2a_bytes / math.max(steps, 1)
  out.wire = exec:wire()
  -- ranks and cores of each rank's host (more ranks than cores: ranks
  -- also wait for a core, which the simulator does not model)
  for r = 0, P - 1 do
    local nr, nc = job.rank[r].host_ranks, job.rank[r].host_cores
    if nc > 0 and nr > nc and (not out.oversubscribed or nr / nc > out.oversubscribed.ranks /
        out.oversubscribed.cores) then
      out.oversubscribed = { ranks = nr, cores = nc }
    end
  end
  local rw, rc, ro = {}, {}, {}
  local step_s = 0
  for r = 0, P - 1 do -- per step: wall, compute, optimizer and gradient sums
    local R = job.rank[r]
    local nr = math.max(R.steps, 1)
    rw[r], rc[r], ro[r] = R.wall / nr, R.compute / nr, (R.optim + R.reduce) / nr
    step_s = math.max(step_s, rw[r])
  end
  out.step_ms = step_s * ms
  local bub = 0
  for r = 0, P - 1 do bub = bub + (step_s > 0 and math.max(0, 1 - rc[r] / step_s) or 0) end
  out.bubble_pct = 100 * bub / P
  local link = comm.link and comm.link() or "none"
  local lk = link ~= "none" and comm.parse_link(link) or nil
  -- measured costs: per model stage and overall means (what every action
  -- took, its exposed exchanges included); with a link and MoE exchanges
  -- also the compute-only costs (less the time blocked in exchanges) and
  -- the exchanges per F / B / I half, for the simulator's exchange model
  local cost, stages, tot = {}, {}, {}
  local mstages, xch = {}, nil
  for _, kind in ipairs(M.kinds) do
    local ssum, sn = 0, 0
    for s = 0, S - 1 do
      local a = job.actions[kind][s] -- summed over the ranks (nil: none ran)
      if a and a.n > 0 then
        stages[s] = stages[s] or {}
        stages[s][kind] = a.sum / a.n * ms
        mstages[s] = mstages[s] or {}
        mstages[s][kind] = (a.sum - (lk and a.x_blocked or 0)) / a.n * ms
        ssum, sn = ssum + a.sum, sn + a.n
      end
      if lk and a and a.x_n > 0 and a.x_halves > 0 and exchanging[kind] then -- lone or in pairs
        xch = xch or {}
        xch[s] = xch[s] or {}
        -- the link serialises the larger direction of each exchange:
        -- its mean, so that n exchanges cost n x the mean link time
        xch[s][kind] = { n = a.x_n / a.x_halves, bytes_out = a.x_max / a.x_n, bytes_in = 0 }
      end
    end
    if sn > 0 then tot[kind] = ssum / sn * ms end
  end
  for k, val in pairs(tot) do cost[k] = val end
  -- a backward's exchanges are its input-grad part's (W exchanges nothing):
  -- a stage that runs only one of B and I takes the other's from it
  for _, x in pairs(xch or {}) do
    x.B, x.I = x.B or x.I, x.I or x.B
  end
  -- the emulated link (the comm layer's lp_link model, as set for the run):
  -- a cross-rank message is simulated with the link's time for the bytes of
  -- an activation message (mean over stages), and a rank holding a copy of
  -- a replicated stage (DualPipe) waits, after the other copies are done,
  -- for the link's time of its gradient-sum messages (sent in parallel:
  -- the largest). Without a link: the measured latency, no reduce time.
  local function link_ms(bytes)
    if not lk then return 0 end
    return (lk.latency + (lk.bandwidth > 0 and bytes / lk.bandwidth or 0)) * ms
  end
  local red = {} -- per world rank (1-based): its largest gradient-sum message's link time
  for r = 0, P - 1 do
    local grad = job.rank[r].grad_floats
    red[r + 1] = grad > 0 and link_ms(4 * grad) or 0
  end
  local act_ms, act_n, act_v = 0, 0, 0
  local wire, vb = exec:wire() -- the run's precision between stages; bytes a value (bf16: 2)
  for s = 0, S - 1 do
    local act = exec:message_floats(s)
    if act > 0 then act_ms, act_n, act_v = act_ms + link_ms(vb * act), act_n + 1, act_v + act end
  end
  if lk and act_n > 0 then
    opts.latency_ms = act_ms / act_n
    out.link = link
  end
  cost.latency = opts.latency_ms or 0
  cost.stages = stages
  out.costs, out.stages, out.latency_ms = tot, stages, cost.latency
  out.latency_messages = lat_n
  -- a rank holding a copy of a replicated stage (DualPipe) waits for the
  -- other copies' gradients: its optimizer starts when all those ranks are
  -- done (the simulator gives REDUCE_GRAD no time)
  local holders, peers = {}, {}
  for vs = 0, (info.vstages or 0) - 1 do
    local stg, rk = sched:vstage(vs)
    holders[stg] = holders[stg] or {}
    holders[stg][rk] = true
  end
  for _, hs in pairs(holders) do
    for a in pairs(hs) do
      peers[a] = peers[a] or {}
      for b in pairs(hs) do peers[a][b] = true end
    end
  end
  -- The step a simulated timeline predicts: each pipeline rank's finish
  -- (after its replicated stages' copies and their gradient sums), plus the
  -- slowest of its EP ranks' measured optimizer time (opt_of: per world
  -- rank, seconds; default the mean over steps); and each rank's busy.
  local function predict(res, opt_of)
    opt_of = opt_of or ro
    local finish = {}
    for _, rr in ipairs(res:ranks()) do finish[rr.rank] = rr.finish end
    local pred, busy = 0, {}
    for _, rr in ipairs(res:ranks()) do
      local opt, rl = 0, 0
      for j = 0, ep - 1 do
        opt = math.max(opt, opt_of[rr.rank * ep + j] or 0)
        rl = math.max(rl, red[rr.rank * ep + j + 1] or 0)
      end
      opt = opt * ms
      local ready = rr.finish
      for b in pairs(peers[rr.rank] or {}) do ready = math.max(ready, finish[b] or 0) end
      if next(peers[rr.rank] or {}) then ready = ready + rl end
      pred = math.max(pred, ready + opt)
      busy[rr.rank] = rr.busy + opt
    end
    return pred, busy
  end
  -- the simulator's prediction from the measured costs
  local ok, res, err = pcall(sched.simulate, sched, cost)
  if not ok or not res then
    err = ok and err or res
    out.sim_error = tostring(err)
    out.predicted_ms, out.makespan_ms, out.ratio, out.sim_bubble_pct = 0, 0, 0, 0
    return out
  end
  out.makespan_ms = res:makespan()
  local pred, sim_busy = predict(res)
  out.predicted_ms = pred
  -- the exchange model: compute-only costs plus every exchange at the
  -- link's all-to-all-v time, hidden in FB pairs under the other half's
  -- compute (lp_sim.h). It leaves out what the link model does not know
  -- (an EP partner that starts its side late), so beside the measured step
  -- it shows what the link alone would cost and hide.
  if xch then
    -- messages of the mean activation's values at the run's precision (the
    -- simulator sizes them: 2 bytes a value in bf16 when they travel so)
    local mcost = { latency = 0, link = link, link_unit = ms, exchanges = xch, stages = mstages,
      values = act_n > 0 and act_v / act_n or 0, precision = vb == 2 and wire or "f32" }
    local mok, mres = pcall(sched.simulate, sched, mcost)
    if mok and mres then
      out.model_ms = predict(mres)
      local xa, xh = 0, 0
      for _, rr in ipairs(mres:ranks()) do xa, xh = xa + rr.a2a, xh + rr.a2a_hidden end
      out.sim_a2a_ms = xa / math.max(PS, 1)
      out.sim_a2a_hidden_pct = xa > 0 and 100 * xh / xa or 0
    end
  end
  local sb = 0
  for r = 0, PS - 1 do sb = sb + (pred > 0 and math.max(0, 1 - (sim_busy[r] or 0) / pred) or 0) end
  out.sim_bubble_pct = 100 * sb / PS
  out.ratio = out.step_ms > 0 and pred / out.step_ms or 0
  out.sim = res
  replay(job, sched, cost, predict, out)
  return out
end

local function f1(x) return string.format("%.1f", x) end
local function f2(x) return string.format(math.abs(x) < 0.1 and x ~= 0 and "%.2g" or "%.2f", x) end

-- perf.format(summary) -> text (several lines)
function M.format(s)
  if type(s) ~= "table" or math.type(s.steps) ~= "integer" or type(s.step_ms) ~= "number" then
    util.raise("perf.format: summary (argument 1) must be a table from perf.summary, got "
      .. util.shown(s))
  end
  local L = {}
  L[#L + 1] = string.format("summary (%d measured step%s%s, %d rank%s):", s.steps,
    s.steps == 1 and "" or "s", s.skipped and ", first step skipped as warm-up" or "", s.ranks,
    s.ranks == 1 and "" or "s")
  local parts = {}
  for _, k in ipairs(M.kinds) do
    if s.costs[k] then parts[#parts + 1] = string.format("%s %s", k, f2(s.costs[k])) end
  end
  L[#L + 1] = "  measured mean action costs (ms, all stages): " .. table.concat(parts, "  ")
  local per = {}
  local ks = {}
  for st in pairs(s.stages) do ks[#ks + 1] = st end
  table.sort(ks)
  for _, st in ipairs(ks) do
    local p = {}
    for _, k in ipairs(M.kinds) do
      if s.stages[st][k] then p[#p + 1] = k .. "=" .. f2(s.stages[st][k]) end
    end
    per[#per + 1] = string.format("[%d] %s", st, table.concat(p, " "))
  end
  L[#L + 1] = "  per model stage: " .. table.concat(per, "  ")
  if s.sim_error then
    L[#L + 1] = "  simulation failed: " .. s.sim_error
  end
  L[#L + 1] = string.format("  step time: measured %s ms, simulator's prediction %s ms "
    .. "(makespan %s ms + optimizer; latency %s ms): predicted/measured %.3f",
    f1(s.step_ms), f1(s.predicted_ms), f1(s.makespan_ms), f2(s.latency_ms), s.ratio)
  -- Actions under a millisecond: a message's delivery, the progress
  -- thread's polling (50 us and up) and a rank's wake-up, none of which the
  -- simulator models, are a large share of each, so no ratio means much.
  local longest, longest_kind = 0, nil
  for _, k in ipairs(M.kinds) do
    if s.costs[k] and s.costs[k] > longest then longest, longest_kind = s.costs[k], k end
  end
  local too_short = longest_kind ~= nil and longest < 1
  if too_short then
    L[#L + 1] = string.format("    (too short for the prediction to mean much: "
      .. "the longest mean action here, %s, takes %s ms; under a millisecond a message's delivery "
      .. "and a rank's wake-up, which the simulator does not model, are a large part of every "
      .. "action: compare steps of more work, larger micro-batches or layers)", longest_kind,
      f2(longest))
  end
  if s.replay_ms then
    local miss = s.replay_step_ms > 0 and 100 * (s.replay_ms - s.predicted_ms) / s.replay_step_ms
      or 0
    L[#L + 1] = string.format("    replaying each step's own measured action times (last %s): "
      .. "%s ms against %s ms measured: %.3f", util.count(s.replay_steps, "step"), f1(s.replay_ms),
      f1(s.replay_step_ms), s.replay_ratio)
    if s.spread_ms then
      L[#L + 1] = string.format("    with the measured spread of action times (%d draws from each "
        .. "kind and stage's times): %s ms: predicted/measured %.3f", s.spread_draws,
        f1(s.spread_ms), s.spread_ratio)
    end
    if miss > 2 and not s.oversubscribed and not too_short then
      L[#L + 1] = string.format("    (mean costs miss %s%% of the step here: action times vary "
        .. "from step to step and with their place in the step, and this schedule has little slack "
        .. "to absorb that)", f1(miss))
    end
  end
  if s.oversubscribed then
    L[#L + 1] = string.format("    the prediction does not apply here: %d ranks share %d core%s "
      .. "on one host, so ranks also wait for a core, which the simulator does not "
      .. "model (run at most one rank per core)",
      s.oversubscribed.ranks, s.oversubscribed.cores, s.oversubscribed.cores == 1 and "" or "s")
  end
  L[#L + 1] = string.format("  bubble: measured %s%%, simulated %s%%", f1(s.bubble_pct),
    f1(s.sim_bubble_pct))
  if (s.msg_bytes or 0) > 0 or (s.a2a_bytes or 0) > 0 then
    L[#L + 1] = string.format("  bytes sent per step (all ranks, %s values): %.0f between pipeline "
      .. "stages, %.0f in all-to-alls", s.wire, s.msg_bytes, s.a2a_bytes)
  end
  if s.a2a_hidden_pct then
    L[#L + 1] = string.format("  all-to-all: %d exchanges, %s ms per rank and step, %s%% hidden "
      .. "under compute", s.a2a_count, f2(s.a2a_ms), f1(s.a2a_hidden_pct))
    if s.sim_a2a_hidden_pct then
      L[#L + 1] = string.format("    link model alone: %s ms per rank and step, %s%% hidden (FB "
        .. "pairs' max-style overlap), step %s ms", f2(s.sim_a2a_ms), f1(s.sim_a2a_hidden_pct),
        f2(s.model_ms or 0))
    end
    L[#L + 1] = string.format("    (blocked %s ms; the link model's time of these exchanges %s ms, "
      .. "the rest is waiting for the EP partner)", f2(s.a2a_blocked_ms), f2(s.a2a_link_ms))
  end
  if s.eplb then
    L[#L + 1] = string.format("  expert load (EP ranks' max/mean tokens, mean over MoE layers): "
      .. "%.3f -> %.3f; %d rebalance%s moved %d bytes of expert weights and optimizer state",
      s.eplb.before, s.eplb.after, s.eplb.plans, s.eplb.plans == 1 and "" or "s", s.eplb.bytes)
  end
  if s.dp and (s.dp.dp > 1 or s.dp.zero == 1) then -- (train adds it: exec:dp_stats)
    local d = s.dp
    L[#L + 1] = string.format("  data parallel: dp %d (ep %d), zero %d, optimizer state %.0f "
      .. "bytes per rank", d.dp, d.ep, d.zero, d.optim_bytes)
    if d.n > 0 and d.s > 0 then
      L[#L + 1] = string.format("    gradient sums over dp: %d per rank, %s ms each, %s%% hidden "
        .. "under backward work (link model %s ms each)", d.n, f2(1e3 * d.s / d.n),
        f1(100 * d.hidden / d.s), f2(1e3 * d.link / d.n))
    end
  end
  L[#L + 1] = string.format("  overhead: %s%% of the step (neither compute nor waiting; "
    .. "posting/polling %s%%), waiting on messages %s%%, compute %s%%", f2(s.overhead_pct),
    f2(s.post_pct), f1(s.wait_pct), f1(s.compute_pct))
  return table.concat(L, "\n")
end

-- ---- the measured timeline as a picture ----

-- A luapipe.SimResult look-alike over measured events, enough for
-- luapipe.show.svg / gantt: info, makespan, max_bubble, events(rank).
local Measured = {}
Measured.__index = Measured
function Measured:info() return self.meta end
function Measured:makespan() return self.T end
function Measured:max_bubble() return self.maxb end
function Measured:events(r) return self.ev[r] or {} end

-- perf.measured(exec, sched) -> on rank 0 a SimResult look-alike holding
-- the measured compute slices (and optimizer) of the last step of every
-- rank (one row per world rank: with EP, each EP rank of a pipeline rank
-- its own), times in ms from the step's first slice; nil on other ranks.
-- Needs exec built with trace = true. Collective.
function M.measured(exec, sched)
  util.arg("perf.measured", 1, "exec", exec, "luapipe.Exec")
  util.arg("perf.measured", 2, "sched", sched, "schedule", "the lowered luapipe.Schedule exec runs")
  local job = job_timing(exec) -- each rank's last step's compute slices (job.rank[r].slices)
  if comm.rank() ~= 0 then return nil end
  local P = job.ranks
  local t0 = math.huge
  for r = 0, P - 1 do
    for _, sl in ipairs(job.rank[r].slices) do t0 = math.min(t0, sl.start_us) end
  end
  local info = sched:info()
  local obj = setmetatable({ ev = {}, T = 0, maxb = 0,
    meta = { name = (info.name ~= "" and info.name or "schedule") .. " (measured)", ranks = P,
      stages = info.stages, microbatches = info.microbatches, latency = 0 } }, Measured)
  local busy = {}
  for r = 0, P - 1 do -- world rank r runs pipeline rank r // ep's actions
    local p = r // job.ep
    local list, texts = {}, sched:actions(p)
    busy[r] = 0
    for _, sl in ipairs(job.rank[r].slices) do
      local idx = sl.index
      local e
      if idx >= 0 then
        e = sched:action(p, idx) or { type = "?" }
        e.text = texts[idx + 1] or "?"
      else
        e = { type = "optim", text = "optimizer", mb = "opt", stage = -1 }
      end
      e.rank, e.index = r, idx
      e.start = (sl.start_us - t0) / 1000
      e.finish = e.start + sl.dur_us / 1000
      busy[r] = busy[r] + sl.dur_us / 1000
      obj.T = math.max(obj.T, e.finish)
      list[#list + 1] = e
    end
    obj.ev[r] = list
  end
  for r = 0, P - 1 do obj.maxb = math.max(obj.maxb, obj.T - busy[r]) end
  return obj
end

-- perf.write_measured_svg(exec, sched, path) -> true | nil, err on rank 0
-- (true elsewhere): the measured last step drawn like a simulated one, time
-- in ms; grey slices are the optimizer step (in the legend). Collective.
function M.write_measured_svg(exec, sched, path)
  util.arg("perf.write_measured_svg", 1, "exec", exec, "luapipe.Exec")
  util.arg("perf.write_measured_svg", 2, "sched", sched, "schedule",
    "the lowered luapipe.Schedule exec runs")
  util.arg("perf.write_measured_svg", 3, "path", path, "string", "a file name")
  local m = M.measured(exec, sched)
  if not m then return true end
  local info = sched:info()
  local title = string.format("%s: measured last step on %s, %s: %.1f ms",
    info.name ~= "" and info.name or "schedule", util.count(m.meta.ranks, "rank"),
    util.count(m.meta.microbatches, "micro-batch"), m.T)
  -- measured slices can be far shorter than the step's typical action:
  -- a fixed width (1200 px) keeps the picture about 3:1 (tooltips name them)
  return core.write_file(path, require("luapipe.show").svg(m, { title = title, unit = "ms",
    scale = m.T > 0 and 1200 / m.T or nil }))
end

-- a mistyped name ("luapipe.perf.x") gets a "did you mean"
return require("luapipe.util").guard(M, "luapipe.perf")
