-- summary_check.lua FAMILY STEPS SVG — run under mpirun by test_summary.sh.
-- Trains a small MLP with the schedule family on the ranks of this job and
-- checks the end-of-training summary (result.summary, luapipe.perf) and the
-- executor's timing on every rank: fields present, figures sane (no timing
-- thresholds: scripts/bench/pipeline judges the figures), the same summary
-- on every rank, rank 0's SVG of the measured last step, trace_steps
-- (only the last two steps' events kept) and the job's timing gathered in
-- C (exec:job_timing: this rank's own figures under its rank, the sums). Prints
-- "rank R: ok" or "rank R: FAIL ..." lines; exits with the failure count.
local train = require("luapipe.train")
local comm = require("luapipe.comm")

local family, steps, svg = arg[1], tonumber(arg[2]), arg[3]
local rank, P = comm.rank(), comm.size()

local fx = dofile("tests/mpi/fixtures.lua")
local model, data = fx.mlp(), fx.regression_data

local r = train { model = model, schedule = family, microbatches = 8, data = data, steps = steps,
  seed = 7, optimizer = { kind = "sgd", lr = 0.05 }, svg = svg ~= "-" and svg or nil,
  trace_steps = 2 }

local fails = {}
local function check(ok, what) if not ok then fails[#fails + 1] = what end end
local function num(x) return type(x) == "number" and x == x and x ~= math.huge end

local s = r.summary
check(type(s) == "table", "result.summary missing")
if type(s) == "table" then
  local measured = steps > 1 and steps - 1 or steps
  check(s.steps == measured, string.format("summary.steps %s, expected %d", tostring(s.steps), measured))
  check(s.skipped == (steps > 1), "summary.skipped")
  check(s.ranks == P, "summary.ranks")
  for _, k in ipairs({ "step_ms", "predicted_ms", "makespan_ms", "ratio" }) do
    check(num(s[k]) and s[k] > 0, k .. " = " .. tostring(s[k]) .. ", expected > 0")
  end
  for _, k in ipairs({ "overhead_pct", "bubble_pct", "sim_bubble_pct", "wait_pct", "post_pct",
    "compute_pct" }) do
    check(num(s[k]) and s[k] >= 0 and s[k] <= 100, k .. " = " .. tostring(s[k]) .. ", expected 0..100")
  end
  check(num(s.latency_ms) and s.latency_ms >= 0, "latency_ms")
  check(s.sim_error == nil, "simulation failed: " .. tostring(s.sim_error))
  check(s.predicted_ms >= s.makespan_ms, "predicted_ms < makespan_ms")
  check(num(s.costs.F) and s.costs.F > 0, "costs.F")
  local info = r.schedule:info()
  for st = 0, info.stages - 1 do
    check(s.stages[st] and num(s.stages[st].F) and s.stages[st].F > 0,
      "no measured F cost for model stage " .. st)
  end
  if family == "dualpipe" then check(num(s.costs.FB) and s.costs.FB > 0, "costs.FB (dualpipe)") end
  if family == "zb1p" then
    check(num(s.costs.I) and num(s.costs.W), "costs.I / costs.W (zb1p)")
  end
  -- the same figures on every rank
  local t = assert(comm.allreduce({ s.step_ms, s.predicted_ms, s.overhead_pct }))
  check(math.abs(t[1] - P * s.step_ms) < 1e-9 * P * s.step_ms + 1e-12 and
    math.abs(t[2] - P * s.predicted_ms) < 1e-9 * P * s.predicted_ms + 1e-12,
    "summary differs between ranks")
end

-- the executor's timing: the last step's parts add up
local wall, busy, last = r.exec:timing()
check(num(wall) and wall > 0 and num(busy) and busy >= 0, "exec:timing wall/busy")
check(type(last) == "table" and last.steps == 1, "exec:timing detail table")
if type(last) == "table" then
  check(math.abs(last.wall - wall) < 1e-12, "detail wall differs")
  check(math.abs(last.overhead - (last.wall - last.compute - last.wait)) < 1e-9,
    "overhead ~= wall - compute - wait")
  check(last.compute >= 0 and last.wait >= 0 and last.post >= 0 and last.optim >= 0 and
    last.optim <= last.compute and last.compute <= last.wall * 1.0001, "detail parts out of range")
end
local tot = r.exec:timing_stats()
check(tot.steps == (steps > 1 and steps - 1 or steps), "timing_stats steps " .. tostring(tot.steps))
local nF = 0
for _, a in pairs(tot.actions.F) do nF = nF + a.n end
local mine = 0
for _, v in ipairs(r.exec:vstages()) do
  for mb = 0, 7 do
    for _, x in ipairs(r.schedule:route(mb)) do if x == v.id then mine = mine + 1 end end
  end
end
-- every F of this rank counted once per measured step (FB pairs apart)
local nFB = 0
for _, a in pairs(tot.actions.FB) do nFB = nFB + a.n end
-- no MoE layers: no exchanges counted on any action
for _, kind in pairs(tot.actions) do
  for st, a in pairs(kind) do
    check(a.x_n == 0 and a.x_out == 0 and a.x_in == 0 and a.x_max == 0 and a.x_blocked == 0,
      "exchanges counted on model stage " .. st .. " without MoE")
  end
end
check(nF + nFB == mine * tot.steps, string.format("F actions counted %d + FB %d, expected %d",
  nF, nFB, mine * tot.steps))
-- every forward half, lone or in an FB pair, counted once under F
local hF = 0
for _, a in pairs(tot.actions.F) do hF = hF + a.x_halves end
check(hF == mine * tot.steps, string.format("F halves counted %d, expected %d", hF, mine * tot.steps))
-- message sizes for the simulator's link model: an activation message into
-- every stage but the first; a gradient-sum message only for the copies of
-- DualPipe's replicated stages this rank holds
local held = {}
for _, v in ipairs(r.exec:vstages()) do held[v.stage] = true end
local S = r.schedule:info().stages
for st = 0, S - 1 do
  local act, grad = r.exec:message_floats(st)
  check(st == 0 and act == 0 or st > 0 and act > 0, "message_floats(" .. st .. ") act " .. tostring(act))
  local want = family == "dualpipe" and held[st]
  check(want and grad > 0 or not want and grad == 0,
    "message_floats(" .. st .. ") grad " .. tostring(grad) .. (want and ", expected > 0" or ", expected 0"))
end
local mok, merr = pcall(r.exec.message_floats, r.exec, S)
check(not mok and tostring(merr):find("no such model stage", 1, true), "message_floats(S) must fail")
-- the kept steps (exec:step_times): one per measured step, a time for
-- every compute action of this rank and none for the others, and the
-- parts within the step's wall time (waits are excluded from them)
local hist = r.exec:step_times()
check(#hist == tot.steps, string.format("step_times kept %d steps, expected %d", #hist, tot.steps))
local acts = r.schedule:actions(rank) -- (no EP here: the pipeline rank is the rank)
for k, h in ipairs(hist) do
  local sum = h.after
  for i = 0, #acts - 1 do
    local compute = not acts[i + 1]:match("SEND") and not acts[i + 1]:match("RECV")
      and not acts[i + 1]:match("REDUCE")
    local t = h.actions[i]
    check(compute == (t ~= nil) and (t == nil or num(t) and t > 0),
      string.format("step_times[%d] action %d (%s): %s", k, i, acts[i + 1], tostring(t)))
    sum = sum + (t or 0)
  end
  check(num(h.wall) and h.after > 0 and sum <= h.wall * (1 + 1e-9),
    string.format("step_times[%d]: actions + after %.6g > wall %.6g", k, sum, h.wall))
end
-- the replay of those steps: present, and the same on every rank
if type(s) == "table" then
  check(s.replay_steps == tot.steps, "summary.replay_steps " .. tostring(s.replay_steps))
  check(num(s.replay_ms) and s.replay_ms > 0 and num(s.replay_step_ms) and s.replay_step_ms > 0
    and num(s.replay_ratio) and s.replay_ratio > 0, "replay figures missing")
  check(s.spread_draws == 32 and num(s.spread_ms) and s.spread_ms > 0 and num(s.spread_ratio)
    and s.spread_ratio > 0, "spread figures missing")
  if num(s.replay_ms) then
    local t = assert(comm.allreduce({ s.replay_ms, s.spread_ms or 0 }))
    check(math.abs(t[1] - P * s.replay_ms) < 1e-9 * P * s.replay_ms, "replay differs between ranks")
    check(math.abs(t[2] - P * (s.spread_ms or 0)) < 1e-9 * P * (s.spread_ms or 0), "spread differs between ranks")
  end
end
-- the job's timing gathered in C (exec:job_timing): named fields, this
-- rank's own figures under its rank, the kept steps it has, the sums
local job, jerr = r.exec:job_timing()
check(job, "job_timing: " .. tostring(jerr))
if job then
  local me = job.rank[rank]
  check(job.ranks == P and job.ep == 1 and job.kept == #hist, "job_timing: ranks, ep, kept")
  check(me.steps == tot.steps and me.wall == tot.wall and me.compute == tot.compute and
    me.optim == tot.optim and me.reduce == tot.reduce, "job_timing: this rank's totals")
  local hr, hc = r.exec:host_share()
  check(me.host_ranks == hr and me.host_cores == hc and me.nkept == #hist,
    "job_timing: this rank's host share and kept count")
  for k, h in ipairs(hist) do
    local g = me.kept[k]
    local same = g.wall == h.wall and g.after == h.after
    for i = 0, #acts - 1 do same = same and g.actions[i] == h.actions[i] end
    check(same, "job_timing: kept step " .. k .. " differs from step_times")
  end
  local t = assert(comm.allreduce({ tot.wall, tot.steps }))
  check(job.sum.steps == P * tot.steps and math.abs(job.sum.wall - t[1]) <= 1e-12 * t[1],
    "job_timing: the sums over the ranks")
  local n = 0
  for _, a in pairs(job.actions.F) do n = n + a.n end
  check(n == assert(comm.allreduce({ nF }))[1], "job_timing: F actions summed over the ranks")
  check(table.concat(require("luapipe.core").compute_kinds, " ") == "F B I W FB", "core.compute_kinds")
  for _, k in ipairs(require("luapipe.core").compute_kinds) do
    check(type(job.actions[k]) == "table", "job_timing: actions." .. k)
  end
end
r.exec:timing_reset()
check(r.exec:timing_stats().steps == 0, "timing_reset")
check(#r.exec:step_times() == 0, "timing_reset keeps no step times")

-- trace_steps = 2: only the last two steps' events are kept
if svg ~= "-" then
  local nopt = 0
  for _, e in ipairs(r.exec:trace_events()) do if e.cat == "optim" then nopt = nopt + 1 end end
  check(nopt == math.min(2, steps), "trace_steps = 2 kept " .. nopt .. " steps")
end

if rank == 0 and svg ~= "-" then
  local f = io.open(svg)
  local text = f and f:read("a") or ""
  if f then f:close() end
  check(text:find("<svg", 1, true) and text:find("measured last step", 1, true),
    "SVG of the measured step missing or wrong")
  check(text:find("time (ms)", 1, true) and not text:find("units", 1, true)
    and text:find("optimizer step", 1, true), "measured SVG: ms on the axis, optimizer in the legend")
end

if #fails == 0 then
  print(string.format("rank %d: ok", rank))
else
  print(string.format("rank %d: FAIL %s", rank, table.concat(fails, "; ")))
end
io.stdout:flush()
os.exit(#fails)
