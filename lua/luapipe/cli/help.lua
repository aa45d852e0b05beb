-- luapipe.cli.help: the Lua API help topics of luapipe.help(topic) and
-- `luapipe help <topic>`. Each topic is a module of the library with its
-- functions and methods, one line each: { signature, summary }; details
-- (optional): paragraphs printed after them (luapipe.train's manual).
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
    { "schedule.load(spec, opts)", "a family name, .csv, .json or schedule file; or nil, err" },
    { "  a schedule file (.lua)", "gets opts {pp=, microbatches=, chunks=} as `...` and returns a Schedule (examples/eager_1f1b.lua)" },
    { "schedule.new{ranks=, stages=, microbatches=, placement=, routes=, actions=}", "an empty or hand-written schedule" },
    { "schedule.from_csv(path) / from_csv_text(text)", "PyTorch's CSV format" },
    { "schedule.from_json(text)", "luapipe's JSON format" },
    { "schedule.families", "the family names (see `help schedules`)" },
    { "s:push(rank, action | {actions})", "append actions to a rank's list; all or nothing: a bad action raises and the list stays as it was" },
    { "s:pop(rank[, n]) / s:clear(rank) / s:set(rank, {actions})", "edit a rank's list: remove its last n actions (default 1; returns them), empty it, replace it (all or nothing)" },
    { "s:actions(rank) / s:action(rank, i) / s:count(rank)", "read a rank's list: action i counts from 0, as in every message (s:actions is a Lua list: entry i + 1)" },
    { "s:note()", "what a family builder says about its counts (interleaved1f1b with too few micro-batches), or nil" },
    { "s:info()", "{name, ranks, stages, vstages, microbatches}" },
    { "s:validate([{sends = \"nonblocking\" | \"buffered\" | \"rendezvous\"}])", "true, or nil, message naming rank, action and micro-batch; sends: how SEND/RECV wait (default nonblocking: both only post, a compute waits for its inputs' sends, as in the executor and PyTorch; buffered: a RECV blocks; rendezvous: a send blocks too)" },
    { "s:lower()", "a copy with SEND/RECV inserted" },
    { "s:simulate(cost)", "a SimResult (see `help sim`); an invalid schedule raises with the validation message" },
    { "s:try_simulate(cost)", "a SimResult, or nil, message when the schedule is invalid (s:validate's message); for code that goes on after a failure" },
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
      .. "stages = {[k] = {F = ...}}; B = I + W fills in what is not given. Links: link = "
      .. "\"lat=50us,bw=2GB/s\" adds latency + bytes/bandwidth to every cross-rank message of "
      .. "bytes = N bytes (times in seconds then), or of values = N values at precision = \"f32\" "
      .. "(4 bytes a value) or \"bf16\" (2), which also gives each rank's peak activation bytes. "
      .. "MoE exchanges: exchanges = {[stage] = {F = {n =, "
      .. "bytes_out =, bytes_in =}, B = ..., I = ...}} (per action: how many all-to-all-v, this "
      .. "rank's bytes to / from the other EP ranks in one), link_unit = cost units per second of "
      .. "link time (1000 for ms). Per action: actions = {[rank] = {[i] = time}} (0-based, as "
      .. "s:action(rank, i); compute actions only) replaces those actions' whole time, e.g. one "
      .. "measured step's (the training summary's replay). res:summary()'s columns: busy, bubble (makespan - busy), "
      .. "bubble %, finish (its last action's end), activations (peak held: an F holds one until "
      .. "its B or I) and pending W (peak weight-grads waiting: an I done whose W has not run).",
    { "sim.parse_cost(\"F=1,B=2,W=1,FB=2.5\")", "a cost table; F[3]=2 sets model stage 3" },
    { "sim.format_cost(cost)", "\"F=1 B=2 W=1\"" },
    { "sim.resolve_cost(cost)", "{F, B, I, W, FB?, latency} as the simulator fills in what is not given (B = I + W), or nil, message" },
    { "res:makespan() / res:max_bubble()", "time to the last action; largest per-rank bubble" },
    { "res:ranks()", "per rank: busy, bubble, bubble_ratio, finish, peak_live, peak_pending_w, a2a (modelled exchange time), a2a_hidden, peak_act_bytes (with cost.values)" },
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
    { "  predictor = function(history) ... end", "history: the recorded windows, oldest first, {{step=, counts={{...}, ...}}, ...} (the last max(keep, window)); return layers x experts loads; an error or anything else is reported once and the default (sum of the last window) used from then on" },
    { "  every = N, threshold = b", "the first recorded step plans; then a step re-plans when it is N or more steps after the last plan (or threshold skip), unless the plan in force has balancedness >= b under the predicted load (a skip restarts the count)" },
    { "  trigger = function(balancer, step) ... end", "asked at every b:due/b:step, the first plan included: true plans now, false does not; replaces every and threshold" },
    { "eplb rebalance's JSON (luapipe eplb)", "logical_to_physical ragged (each expert's slots); --padded: DeepSeek's layout, -1 to R - E + 1 per expert" },
  },
  {
    name = "nn", summary = "models for pipeline training (luapipe.nn)",
    { "nn.sequential{layer specs..., loss = \"mse\" | \"cross_entropy\"}", "a Model" },
    { "nn.linear(din, dout) / nn.embedding(vocab, dim)", "layer specs" },
    { "nn.gelu() / nn.silu() / nn.rmsnorm(dim)", "layer specs" },
    { "nn.mlp_block(d, hidden) / nn.attention(d, heads) / nn.transformer_block(d, heads, hidden)", "blocks" },
    { "nn.residual(inner)", "x + inner(x)" },
    { "nn.moe{dim=, hidden=, experts=, topk=, groups=, topk_groups=, shared=, route_scale=, bias_speed=, router=, balance_alpha=}",
      "DeepSeek-V3 mixture of experts (SwiGLU experts; router \"sigmoid\" | \"softmax\")" },
    { "nn.moe_block{dim=, heads=, hidden=, experts=, topk=, ...}", "x + attn(rmsnorm(x)), then x + moe(rmsnorm(x))" },
    { "nn.tensor(shape[, values])", "a Tensor (row-major values; nil = zeros)" },
    { "model:partition{stages=, by = \"layers\" | \"cost\", input_shape=}", "split into model stages: equal layer counts (default here) or measured cost (train{}'s default; score = f(stage_costs) picks the split with the least f, e.g. a simulated step)" },
    { "model:build([seed]) / model:build_stage(part, stage, seed)", "a Layer (C), the whole model or one stage" },
    { "t:shape() / t:totable() / t:numel()", "Tensor contents" },
    { "layer:forward(x) / layer:params() / layer:set_params(p)", "run and read a Layer" },
    { "layer:route(i, x)", "MoE layer i's routing of its input x, per token: {experts (0-based, in order), weights, scores}" },
    { "layer:moe_bias(i) / layer:set_moe_bias(i, bias)", "MoE layer i's selection bias, one number per expert" },
  },
  {
    name = "train", summary = "pipeline-parallel training under mpirun (luapipe.train)",
    intro = "Run one process per rank: mpirun -np 4 build/luapipe train_script.lua",
    { "train{model=, schedule=, microbatches=, data=, steps=, optimizer=, ...}", "train; returns {losses, summary, stage_params, model}" },
    { "  schedule = \"1f1b\" | \"found.csv\" | s", "a family, a schedule file (.csv/.json as search -o writes, .lua) checked against the job's pp and microbatches, or a Schedule" },
    { "  optimizer = {kind = \"sgd\", lr=, momentum=, weight_decay=}", "SGD (defaults lr 0.01, momentum 0, weight_decay 0)" },
    { "  optimizer = {kind = \"adamw\", lr=, beta1=, beta2=, eps=, weight_decay=}", "AdamW (defaults 1e-3, 0.9, 0.999, 1e-8, 0.01)" },
    { "  partition = \"cost\" | \"layers\"", "model stages of measured layer cost, the split whose simulated step on the schedule is shortest (default; a resume keeps the checkpoint's), or equal layer counts" },
    { "  device = \"cpu\" | \"cuda\" | \"cuda:N\"", "where each rank's stages run (cuda: local rank modulo the GPUs)" },
    { "  precision = \"f32\" | \"bf16\"", "GEMMs on bf16-rounded inputs with float32 sums (oneDNN on AVX512-BF16/AMX, else a float32 fallback, said once); activations at layer boundaries, their gradients and MoE expert rows rounded to bf16 and sent as bf16 (half the message and all-to-all bytes); norms, softmax, loss, router, masters and optimizer state float32; checkpoints record it (resuming another precision is said once)" },
    { "  chunks=, seed=, quiet=, lookahead=", "chunks for interleaved1f1b only (refused otherwise); seed of init and data" },
    { "  trace=, svg=, trace_steps=, log_every=", "measured Chrome trace, SVG of the last step, progress" },
    { "  checkpoint = {dir=, every=}, resume = true", "save every N steps and after the last; continue from dir/latest (another schedule if it places the stages alike)" },
    { "  resume = \"auto\"", "resume from the newest complete checkpoint when there is one, else start at step 1 (jobs that restart themselves, examples/slurm/train.sbatch)" },
    { "  clip = 1.0", "global gradient-norm clipping as torch's clip_grad_norm_, every parameter counted once over all ranks; r.grad_norms[k]" },
    { "  lr_schedule = {warmup=, decay=, steps=, min_lr=} | fn(step)", "warmup then cosine/linear/constant decay to min_lr at steps (default the run's), or a Lua function of the step (luapipe.lr); r.lrs[k]" },
    { "  eval = {every=, fn = function(step, layer)}, announce = function(info)", "rank 0: the whole model every N steps; a header once the options are checked" },
    { "  pp=, ep=, link=, eplb = {every=, redundant=}", "MoE: pp x ep grid of ranks, emulated link, EPLB in the loop" },
    { "  dp=, zero = 0 | 1", "data parallelism: pp x dp ranks, rank = pipeline rank x dp + DP index d; EP groups of ep of each stage's dp ranks (ep divides dp; EP index d % ep, group d / ep; default dp = ep); each DP rank takes 1/dp of every micro-batch; zero = 1 shards the optimizer state over dp (ZeRO-1)" },
    { "  (placing ranks)", "mpirun fills a node's slots in rank order: the dp ranks of a pipeline stage (its EP groups first) are consecutive, so with dp dividing the ranks per node the EP and DP groups stay inside a node (NVLink) and only the pipeline crosses nodes" },
    { "  overlapped_fb = function(exec, pair) ... end", "script DualPipe's F&B pairs (exec's begin_half, advance, phase, weight_grad_part)" },
    { "train.reference{model=, data=, steps=, microbatches=, optimizer=, seed=}", "the same steps in one process, unsplit: {losses, params}" },
    details = {
      "The result: r.losses[k] is the loss of step k (the same on every rank); r.partition = {by =, bounds = {{first =, last =}, ...}, costs =, seconds =}; r.stage_params() = {{id =, stage =, params = {[name] = {values}}}, ...} of this rank; r.device names this rank's device; r.summary is measured vs simulated, the same on every rank (luapipe.perf: step_ms, predicted_ms, ratio, bubble_pct, sim_bubble_pct, overhead_pct, costs, stages, latency_ms, steps), printed by rank 0 after the progress lines (the first step is warm-up). Options beyond the table: trace = \"trace.json\" (measured Chrome trace, all ranks), svg = \"step.svg\" (the measured last step as an SVG timeline), trace_steps = N (trace and svg keep the last N steps), log_every = N (a progress line every N steps, default 1).",
      "Schedule files: schedule = \"found.csv\" (or .json, as luapipe search -o writes, or a .lua schedule file run with {pp =, microbatches =}) is loaded and checked against the job: its pipeline ranks against pp (or the ranks mpirun started / ep), its micro-batches against microbatches when given (else the file's count is the run's); a mismatch is one line naming the file, both counts and the way out (exit 2 under mpirun).",
      "eval = {every = N, fn = function(step, layer) ... end} gathers the whole model after every N-th and the last step onto rank 0 (each model stage's parameters from the rank of its first virtual stage) and calls fn there with it as one luapipe.Layer on the host (layer:forward(x)); r.model() does the same once after training (collective: every rank calls it; nil on the other ranks). Models with MoE layers are refused. announce = function(info) runs on rank 0 once the options are checked, before the first step (info: the schedule's, s:info()): the examples print their header there.",
      "The data function must give the same micro-batch on every rank that asks for it (input on the rank where the micro-batch enters, target where its loss is computed); steps are numbered from 1. Each micro-batch's loss is scaled by 1/M, so gradients are those of the mean loss of the whole batch, and the printed loss is that mean.",
      "Checkpoints: checkpoint = {dir =, every = N (default 1)} saves, after every N-th step and after the last, each rank's virtual stages (parameters and optimizer state: SGD momentum, AdamW moments and step count) to <dir>/step<k>/rank<R>.ckpt, each file written to .tmp, fsynced and renamed; when all ranks are done rank 0 replaces <dir>/latest (also atomically) and the previous checkpoint is deleted, so latest always names a complete one. resume = true (or resume = \"dir\") loads it on every rank and runs steps k+1..steps (data gets the true step numbers); r.losses[k] is then set for those steps only and r.first_step = k+1. The result is bitwise the run that never stopped. Another schedule may resume it when it places the model stages on the ranks alike (1f1b, gpipe, zb1p; parameters and optimizer state do not depend on the schedule; rank 0 notes it once); a missing, truncated or corrupt file, or one written for another placement, rank count, model or optimizer, fails on every rank with a message naming the file, what differs and the schedule it was written under. A job stopped by a signal (Ctrl-C to mpirun: SIGTERM to every rank) prints on rank 0 which checkpoint a resume would start from. dir need not be shared: each host may have its own copy at the same path (its ranks' files; rank 0's host also latest and state.json, which rank 0 reads and shares; see luapipe.checkpoint).",
      "Partition: by \"cost\" (the default) every rank measures each layer's forward + backward time on its micro-batch shape (one layer built at a time, the best of 3 runs, the fastest rank's time, the same figures on every rank), then the model is split into contiguous model stages minimising the costliest; \"layers\" gives equal layer counts. <dir>/step<k>/state.json records the partition, and a resume uses the recorded one (rank 0 reads it, every rank gets it) instead of measuring: the rank files hold those stages. A checkpoint with no record (an older luapipe's) is loaded with this run's split; a mismatch then fails naming the parameters, with a hint to pass the partition it was written with.",
      "With MoE layers each rank's file also holds every MoE layer's router bias and expert placement (restored before the parameters are read), and <dir>/step<k>/state.json holds the EPLB loop's state (placements, the Balancer's history and plan in force, the summary tallies), so a resumed run with eplb plans and trains bitwise as the one that never stopped; state.json written with another ep, eplb.every or eplb.redundant is refused naming the file (a resumed run is the run that was saved; a custom predictor or threshold is not stored: give the same again).",
      "Mixture of experts: pp = P, ep = E run on P x E ranks (mpirun -np P*E; rank = pipeline rank * E + EP index); each EP rank takes its share of every micro-batch (rows; the micro-batch size must divide by E) and holds its share of every MoE layer's experts. link = \"lat=50us,bw=2GB/s\" sets the emulated link (luapipe.comm.set_link) before the grid forms. eplb = {every = N, redundant = K, threshold =, predictor =, window =} records the expert loads of every step in a luapipe.eplb.Balancer and, from step N on every N steps (or while balancedness is under threshold), applies its plan with K extra slots per EP rank: weights and optimizer state move between EP ranks at the step boundary, the losses stay those of training without it. r.summary.eplb = {before =, after =, plans =, bytes =}: mean over MoE layers of the EP ranks' max/mean token load under the first and the last placement, and the bytes moved.",
      "overlapped_fb = function(exec, pair) ... end replaces the executor's own running of every overlapped pair (FB action, as DeepSeek's overlapped_forward_backward): pair = {f_stage =, f_mb =, b_type = \"B\" | \"I\", b_stage =, b_mb =, text =}; it must run both halves, in any order, with exec:run_half(\"F\", pair.f_stage, pair.f_mb) and exec:run_half(pair.b_type, pair.b_stage, pair.b_mb), or phase by phase: exec:begin_half(\"F\", pair.f_stage, pair.f_mb) and exec:begin_half(pair.b_type, pair.b_stage, pair.b_mb), then exec:advance(\"F\") / exec:advance(\"B\") (each -> done, the next phase's name) in any order until both are done (the same order on every rank of the EP group: an advance waits for its half's exchange); exec:phase(\"F\" | \"B\") names what the next advance runs (\"attn/dense\", \"dispatch\", \"experts\", \"combine\", \"done\"); exec:weight_grad_part() runs one weight-grad piece a full backward half has made ready (an MoE layer's experts, a finished block: true) or finds none (false). The default runs whichever half can go on without waiting (the forward when both can: its chain of exchanges is the longer), ready weight-grad pieces while both halves' exchanges fly (the previous pair's backward's last weight-grads, carried over, first), and waits for whichever ends first only when nothing is left; so each one's all-to-all flies while the other computes. Over a comm backend that needs one order on every rank, as NCCL does, it is DeepSeek's fixed alternation, backward first, weight-grad pieces after each backward advance.",
      "device = \"cuda\" runs the whole model on the GPU of each rank: rank r of a node (mpirun's local rank) takes GPU r modulo the GPUs it sees; \"cuda:N\" names one. Parameters, optimizer state, activations and gradients stay there; inputs from data() are copied there (targets may stay on the host); activations travel between ranks over NCCL when every rank has a GPU of its own, else through MPI staged in pinned host memory (LUAPIPE_COMM=nccl|mpi chooses). MoE layers run there too (their routing decisions are made on the host from the [tokens, experts] affinities; EP exchanges move the token rows in device memory over the EP group's context, NCCL or staged MPI as activations). Without a visible GPU it stops at the start with one line.",
      "Failures are luapipe.Error values (fields what, rank, status, everywhere, stranded): a mistake in the options under mpirun is raised on every rank alike, so pcall(train, ...) returns on every rank; a failure that leaves the other ranks waiting (a step that failed on one rank) says so (stranded). When a script does not catch it, the luapipe program's job policy (luapipe.cli.job) prints it once, or takes the whole job down for a stranded one, and sets the exit status (2 for a mistake in the options under mpirun).",
    },
  },
  {
    name = "data", summary = "token files as training data (luapipe.data)",
    intro = "nanoGPT's train.bin (uint16, no header; token_bytes = 4 for uint32) and llm.c's shards "
      .. "(1024-byte header, magic 20240520), memory-mapped. Windows of seq_len + 1 tokens; step k's "
      .. "micro-batch mb reads sequences ((k - 1) * microbatches + mb) * rows + row, in a seeded "
      .. "per-epoch order with shuffle: the position follows from the step, so a resume continues "
      .. "where the run stopped. A bad file (or a token id not below vocab, checked at open) is one "
      .. "line naming the file and byte offset.",
    { "data.tokens(path, {seq_len=, vocab=, token_bytes=, shuffle=, seed=, check=})", "a Dataset; ds.info = {format, tokens, windows, token_bytes, seq_len}" },
    { "ds:batches{microbatches=, rows=, dp=, dp_rank=}", "function(step, mb) -> input, target ({rows / dp, seq_len} each): train{data =}" },
    { "ds:window(g) / ds:position(step, microbatches, rows)", "the window sequence g reads; where a step starts" },
    { "data.write_tokens(path, ids, {token_bytes=, header=})", "write a token file (atomically)" },
  },
  {
    name = "models", summary = "DeepSeek-V3 / V2-Lite: checkpoints in, trained, out (luapipe.models)",
    intro = "The architecture of DeepSeek's inference/model.py as a chunk graph (embed, per layer "
      .. "nn.mla_block{attn = nn.mla, ffn = nn.swiglu or nn.moe}, norm, head; cross-entropy over every "
      .. "position), under model.py's parameter names. Checkpoint folders: DeepSeek's converted form "
      .. "(config.json with ModelArgs keys, model0-mp1.safetensors) or Hugging Face's (config.json "
      .. "with its keys, model.safetensors or shards + model.safetensors.index.json); F32, BF16, or "
      .. "FP8 E4M3 with 128x128 block scales (quantization_config.weight_block_size). A rank reads "
      .. "only its own stages' tensors (with ep, its own experts); MTP layers are listed in .unused. "
      .. "A bad folder raises one line naming the file and tensor (the CLI exits 2). "
      .. "An expert no token reached in a step is left alone by the optimizer (no decay, no "
      .. "moment update, its own step count stays), as torch.optim.AdamW leaves a grad of None. "
      .. "Command line: luapipe model info|forward|grad DIR [--precision bf16].",
    { "models.load(dir, {ep=, bias_speed=})", "a model train{} takes (partition, schedules, pp x ep, EPLB); fields args (ModelArgs), form (\"deepseek\" or \"hf\"), unused, dtypes; ckpt:bytes_read() counts what was read" },
    { "models.deepseek_v3(args)", "the same architecture from ModelArgs keys, initialised from the seed" },
    { "models.save(model, dir, {from=, dtype=})", "config.json + safetensors in the layout and names it was loaded with (HF with an index: the same shards, each tensor in its file, and an index with weight_map and total_size), \"f32\" or \"bf16\"; from = a built layer or train{}'s result (every rank calls it; rank 0 writes); all or nothing" },
    { "model:set_precision(\"f32\" | \"bf16\")", "GEMM precision of what is built next (train{precision=} sets it)" },
    { "  train{..., save = dir}", "the same after training (f32)" },
    { "models.config.read(config_table, file)", "ModelArgs from either form of config.json" },
    { "models.names.to_hf(name) / from_hf(name)", "model.py's names to Hugging Face's and back (inference/convert.py's map)" },
    { "models.names.to_model(name) / from_model(name)", "luapipe's layer parameter names to model.py's and back" },
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
    intro = "The prediction simulates the schedule with the measured mean costs of every model stage; "
      .. "the spread does so 32 times with each action's time drawn from the measured times of its "
      .. "kind and stage (a model of how they vary); the replay simulates each of the last steps (up to 64) with its own measured action times "
      .. "(exec:step_times()), so what it leaves between it and the measured step is the runtime's "
      .. "own waiting, while mean costs also miss how action times vary (a schedule without slack, "
      .. "DualPipe's, pays for that in full). When a host runs more ranks than the cores their "
      .. "affinity allows, summary.oversubscribed = {ranks =, cores =} and the text says the "
      .. "prediction does not apply (ranks also wait for a core).",
    { "perf.summary(exec, sched)", "step_ms, predicted_ms, ratio, spread_ms, spread_ratio, replay_ms, replay_ratio, bubbles (collective)" },
    { "exec:step_times()", "the kept steps, oldest first: {wall =, after =, actions = {[i] = seconds}}" },
    { "perf.format(summary)", "the text train prints" },
    { "perf.write_measured_svg(exec, sched, path)", "the measured last step as SVG" },
  },
  {
    name = "profile", summary = "profile traces in: overlap, phases, costs (luapipe.profile)",
    intro = "Reads PyTorch profiler traces (.json, .json.gz, folders of per-rank traces) and "
      .. "luapipe's own in C (yajl, zlib). A rule is {class=, cat=}, {class=, match=PATTERN}, "
      .. "{class=, plain=TEXT} or function(name, cat) -> class; classes compute, communication, "
      .. "memory, wait, ignore; first match wins; unnamed kernels count as compute and are listed.",
    { "profile.read(paths, {rules=})", "a report {ranks = {...}}, or nil, message (file, event)" },
    { "profile.rules", "the default rules (NCCL, DeepEP dispatch/combine/notify, memcpy/memset, ...)" },
    { "profile.classify(name, cat, rules)", "the class a rule gives, or nil" },
    { "profile.load_rules(path)", "a --rules file: rules (before the defaults), mapping" },
    { "profile.text(report) / json(report)", "the table; JSON with stable keys" },
    { "profile.mapping(name)", "phase -> {kind = F|I|W, exchange = dispatch|combine}" },
    { "profile.costs(rank, {mapping=, pairs=})", "F, I, W, B, FB in ms and a --cost text" },
    { "profile.costs_text(costs)", "the --costs table" },
    { "profile.svg(report, rank)", "SVG timeline per stream, phases coloured" },
  },
  {
    name = "search", summary = "find a schedule for your costs and memory, with a bound (luapipe.search)",
    intro = "Candidates (placement, per-rank priorities) decoded by a memory-gated list scheduler "
      .. "over the simulator, seeded with the families and Zero Bubble's greedy, improved by local "
      .. "search; a lower bound and the gap come with every result (docs/search.md). Ctrl-C keeps "
      .. "the best so far.",
    { "search.search{pp=, microbatches=, cost=, memory=, w_share=, placement=, objective=, time=, seed=}",
      "a SearchResult, or nil, message (also luapipe.search{...}); also split=, pairs=, act=, "
        .. "priority=function(a), robust=, families=, progress=; act_values= (values in one "
        .. "activation) with precision = \"f32\" | \"bf16\" and memory_bytes= (a limit in bytes: "
        .. "bf16 fits twice the activations), r:peak_bytes()" },
    { "search.placement(name | {ranks} | fn, pp, microbatches)", "a placement: linear, interleaved:V, v, bidirectional" },
    { "search.families(opts[, cost])", "every family scored under the same costs and limit" },
    { "search.SearchResult:schedule() / makespan() / span()", "the found schedule (validated); its figures" },
    { "search.SearchResult:lower_bound() / gap() / peak_memory()", "bound, (found - bound) / bound, per-rank peak" },
    { "search.SearchResult:evaluations() / seconds() / objective()", "work done; the objective's value" },
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
  for _, para in ipairs(t.details or {}) do
    lines[#lines + 1] = ""
    lines[#lines + 1] = para
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

-- ---- wrapping: the one routine every help text goes through ----

-- The columns help text wraps to: COLUMNS when it is a number, else the
-- width of the terminal standard output ends at, else 80; at least 40.
function M.width()
  local n = math.tointeger(tonumber(os.getenv("COLUMNS") or ""))
  if not n or n < 1 then
    local core = require("luapipe.core")
    n = core.terminal_columns and core.terminal_columns(1) or nil
  end
  return math.max(40, n or 80)
end

-- M.wrap(text[, width]) -> text with every line longer than width (default
-- M.width()) broken between words. A line's continuation lines start under
-- its description column (where text resumes after the first run of two or
-- more spaces following the line's first word, as in "  --loads FILE   Load
-- file: ...", "  LUAPIPE_LOG   log level ..."), else under its first word;
-- a column that leaves less than 20 columns of room falls back to 4 more
-- than the line's indent; a comment ("  # ...") goes on with "# ", a
-- command ("  luapipe ...", "  mpirun ...") with " \\" and 4 more spaces. A word longer than the room is kept whole: words
-- are never cut.
function M.wrap(text, width)
  width = width or M.width()
  local out = {}
  for line in (text .. (text:sub(-1) == "\n" and "" or "\n")):gmatch("([^\n]*)\n") do
    if #line <= width then
      out[#out + 1] = line
    else
      local lead = #line:match("^ *")
      local head, indent, tail -- head: kept as is; indent: of the continuations
      if line:find("^ *# ") then -- a comment goes on as one
        head, indent = line:sub(1, lead + 2), string.rep(" ", lead) .. "# "
      elseif line:find("^ *luapipe ") or line:find("^ *mpirun ") then -- a command, with \
        head, indent, tail = line:sub(1, lead), string.rep(" ", lead + 4), " \\"
      else
        local _, col = line:find("%S  +", lead + 1)
        if not col or col >= #line then col = lead end
        head, indent = line:sub(1, col), string.rep(" ", col)
        if width - col < 20 then -- too little room: move the continuation left
          if col == lead then
            head = string.rep(" ", math.min(lead, width // 2))
            indent = head
          else
            head, indent = line:sub(1, lead), string.rep(" ", math.min(lead + 4, width // 2))
          end
        end
      end
      tail = tail or ""
      local cur, fresh = head, true -- fresh: cur holds no word yet (head ends in a space)
      for word in line:sub(#head + 1):gmatch("%S+") do
        if not fresh and #cur + 1 + #word + #tail > width then
          out[#out + 1] = cur .. tail
          cur = indent .. word
        else
          cur = cur .. (fresh and "" or " ") .. word
        end
        fresh = false
      end
      out[#out + 1] = cur
    end
  end
  local r = table.concat(out, "\n")
  return text:sub(-1) == "\n" and r .. "\n" or r
end

return M
