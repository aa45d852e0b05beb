-- luapipe.cli.help: the Lua API help topics of luapipe.help(topic) and
-- `luapipe help <topic>`. Each topic is a module of the library with its
-- functions and methods, one line each: { signature, summary }.
-- tests/lua/test_help.lua resolves every call written in a signature
-- (schedule.build(...), s:validate(), res:events(...), ...) against the
-- modules and classes and fails when one is missing, so a renamed function
-- cannot leave its help behind.
local M = {}

M.topics = {
  {
    name = "schedule", summary = "build, load, check and export schedules (luapipe.schedule)",
    intro = "A Schedule has ranks, model stages, virtual stages (a stage placed on a rank), "
      .. "a route per micro-batch and an ordered action list per rank (\"0F3\", \"5B3\", "
      .. "\"5I3\", \"5W3\", \"(0F7;7B3)OVERLAP_F_B\").",
    { "schedule.build(name, {pp=, microbatches=, chunks=})", "a built-in family by name" },
    { "schedule.load(spec, opts)", "a family name, .csv, .json or .lua file; or nil, err" },
    { "schedule.new{ranks=, stages=, microbatches=, placement=, routes=, actions=}", "an empty or hand-written schedule" },
    { "schedule.from_csv(path) / from_csv_text(text)", "PyTorch's CSV format" },
    { "schedule.from_json(text)", "luapipe's JSON format" },
    { "schedule.families", "the family names (see `help schedules`)" },
    { "s:push(rank, action | {actions})", "append actions to a rank's list" },
    { "s:actions(rank) / s:action(rank, i) / s:count(rank)", "read a rank's list" },
    { "s:info()", "{name, ranks, stages, vstages, microbatches}" },
    { "s:validate()", "true, or nil, message naming rank, action and micro-batch" },
    { "s:lower()", "a copy with SEND/RECV inserted" },
    { "s:simulate(cost)", "a SimResult (see `help sim`)" },
    { "s:memory(rank)", "{peak_live, param_stages, ...} per rank" },
    { "s:to_csv() / s:to_json() / s:write_csv(p) / s:write_json(p)", "export" },
    { "s:show([cost]) / s:gantt([cost])", "terminal Gantt chart under a cost model" },
    { "s:summary() / print(s)", "one paragraph about the schedule" },
    { "s:clone() / s:close()", "copy; free now (also on garbage collection)" },
  },
  {
    name = "schedules", summary = "the built-in families as builder functions (luapipe.schedules)",
    intro = "Each family is a builder f{pp=, microbatches=, chunks=, name=} -> Schedule; the family "
      .. "files in lua/luapipe/schedules/ show how a schedule is written.",
    { "schedules.list()", "the family names: " .. table.concat(require("luapipe.schedules").list(), ", ") },
    { "schedules.dualpipe{pp=, microbatches=}", "one builder per family (schedules[\"1f1b\"]{...})" },
  },
  {
    name = "sim", summary = "cost models and simulation results (luapipe.sim)",
    intro = "Costs: F, B, I, W, FB (overlapped F&B pair), latency, and per model stage "
      .. "stages = {[k] = {F = ...}}; B = I + W fills in what is not given.",
    { "sim.parse_cost(\"F=1,B=2,W=1,FB=2.5\")", "a cost table; F[3]=2 sets model stage 3" },
    { "sim.format_cost(cost)", "\"F=1 B=2 W=1\"" },
    { "res:makespan() / res:max_bubble()", "time to the last action; largest per-rank bubble" },
    { "res:ranks()", "per rank: busy, bubble, bubble_ratio, finish, peak_live" },
    { "res:events([rank])", "the timeline: {rank, text, start, finish}" },
    { "res:messages() / res:memory(rank)", "cross-rank messages; activations over time" },
    { "res:summary() / print(res)", "the per-rank table" },
    { "res:show() / res:gantt([opts])", "terminal Gantt chart (and summary)" },
    { "res:svg([opts]) / res:write_svg(path)", "SVG timeline" },
    { "res:trace_json() / res:write_trace(path)", "Chrome/Perfetto trace" },
  },
  {
    name = "show", summary = "pictures of a timeline (luapipe.show)",
    { "show.gantt(res, {width=, color=, scale=})", "terminal Gantt chart text" },
    { "show.svg(res, {scale=, title=})", "standalone SVG text" },
    { "show.use_color([fd])", "whether output to fd gets ANSI colour (NO_COLOR, --color)" },
  },
  {
    name = "eplb", summary = "expert placement, DeepSeek's EPLB (luapipe.eplb)",
    intro = "Experts, slots and layers are 0-based in the maps; bad data returns nil, message.",
    { "eplb.rebalance{load=, replicas=, groups=, nodes=, gpus=, mode=, previous=, max_moves=}", "a plan: physical_to_logical, logical_to_physical, logical_count, stats" },
    { "eplb.evaluate{load=, physical_to_logical=, gpus=, nodes=}", "the same statistics for an existing placement" },
    { "eplb.check(experts, replicas, groups, nodes, gpus)", "true, or nil, message" },
    { "eplb.predictors.last() / sliding_window(n) / moving_average(n) / ema(a)", "load predictors" },
    { "eplb.balancer{replicas=, gpus=, every=, threshold=, predictor=, ...}", "a Balancer for a training or serving loop" },
    { "b:record(step, counts) / b:due(step) / b:plan() / b:step(step, counts)", "record loads, re-plan when due" },
  },
  {
    name = "nn", summary = "models for pipeline training (luapipe.nn)",
    { "nn.sequential{layer specs..., loss = \"mse\" | \"cross_entropy\"}", "a Model" },
    { "nn.linear(din, dout) / nn.embedding(vocab, dim)", "layer specs" },
    { "nn.gelu() / nn.silu() / nn.rmsnorm(dim)", "layer specs" },
    { "nn.mlp_block(d, hidden) / nn.attention(d, heads) / nn.transformer_block(d, heads, hidden)", "blocks" },
    { "nn.residual(inner)", "x + inner(x)" },
    { "nn.tensor(shape[, values])", "a Tensor (row-major values; nil = zeros)" },
    { "model:partition{stages=, by = \"layers\" | \"cost\", input_shape=}", "split into model stages" },
    { "model:build([seed]) / model:build_stage(part, stage, seed)", "a Layer (C), the whole model or one stage" },
    { "t:shape() / t:totable() / t:numel()", "Tensor contents" },
    { "layer:forward(x) / layer:params() / layer:set_params(p)", "run and read a Layer" },
  },
  {
    name = "train", summary = "pipeline-parallel training under mpirun (luapipe.train)",
    intro = "Run one process per rank: mpirun -np 4 build/luapipe train_script.lua",
    { "train{model=, schedule=, microbatches=, data=, steps=, optimizer=, ...}", "train; returns {losses, summary, stage_params}" },
    { "  trace=, svg=, trace_steps=, log_every=", "measured Chrome trace, SVG of the last step, progress" },
    { "  checkpoint = {dir=, every=}, resume = true", "save every N steps; continue from dir/latest" },
    { "  pp=, ep=, link=, eplb = {every=, redundant=}", "MoE: pp x ep grid of ranks, emulated link, EPLB in the loop" },
    { "  overlapped_fb = function(exec, pair) ... end", "script DualPipe's F&B pairs (exec's begin_half, advance, phase, weight_grad_part)" },
    { "train.reference{model=, data=, steps=, microbatches=, optimizer=, seed=}", "the same steps in one process, unsplit: {losses, params}" },
  },
  {
    name = "comm", summary = "this job's communicator (luapipe.comm)",
    { "comm.rank() / comm.size() / comm.backend()", "0-based rank, ranks, \"mpi\" or \"self\"" },
    { "comm.info()", "{rank, size, backend, timeout, tag_ub}" },
    { "comm.send(peer, numbers, tag) / comm.recv(peer, n, tag, what)", "point-to-point; nil, message on timeout" },
    { "comm.barrier() / comm.allreduce(numbers)", "collectives (sum)" },
    { "comm.abort(message)", "take every rank down" },
  },
  {
    name = "checkpoint", summary = "training checkpoints (luapipe.checkpoint)",
    intro = "Used through train{checkpoint = {dir=, every=}, resume = true}: <dir>/step<N>/rank<R>.ckpt "
      .. "and <dir>/latest, each written to a temporary file and renamed.",
    { "checkpoint.options(opts)", "the checkpoint settings of a train{} table" },
    { "checkpoint.resume(cfg, exec)", "load the latest complete checkpoint on every rank" },
    { "checkpoint.after_step(cfg, exec, step, info)", "save when due (collective)" },
  },
  {
    name = "perf", summary = "measured against simulated (luapipe.perf)",
    intro = "When a host runs more ranks than the cores their affinity allows, summary.oversubscribed = "
      .. "{ranks =, cores =} and the text says the prediction does not apply (ranks also wait for a core).",
    { "perf.summary(exec, sched)", "step_ms, predicted_ms, ratio, bubbles (collective)" },
    { "perf.format(summary)", "the text train prints" },
    { "perf.write_measured_svg(exec, sched, path)", "the measured last step as SVG" },
  },
}

M.by_name = {}
for _, t in ipairs(M.topics) do M.by_name[t.name] = t end

-- The topic names, in order.
function M.names()
  local n = {}
  for i, t in ipairs(M.topics) do n[i] = t.name end
  return n
end

-- Help text of an API topic, or nil.
function M.text(name)
  local t = M.by_name[name]
  if not t then return nil end
  local lines = { string.format("luapipe.%s: %s", t.name, t.summary) }
  if t.intro then lines[#lines + 1] = t.intro end
  lines[#lines + 1] = ""
  local w = 0
  for _, e in ipairs(t) do w = math.max(w, #e[1]) end
  w = math.min(w, 44)
  for _, e in ipairs(t) do
    if #e[1] > w then
      lines[#lines + 1] = "  " .. e[1]
      lines[#lines + 1] = string.rep(" ", w + 4) .. e[2]
    else
      lines[#lines + 1] = string.format("  %-" .. w .. "s  %s", e[1], e[2])
    end
  end
  return table.concat(lines, "\n") .. "\n"
end

-- The topic list (one line each).
function M.list()
  local lines = {}
  for _, t in ipairs(M.topics) do
    lines[#lines + 1] = string.format("  %-10s %s", t.name, t.summary)
  end
  return table.concat(lines, "\n") .. "\n"
end

return M
