-- luapipe.cli.train_options: the training options every example script
-- takes (examples/train_*.lua), declared once: the schedule and its
-- counts, steps, seed, partition, device, precision, checkpoints and resume, the
-- measured trace and SVG, the report. A script adds them to its argparse
-- parser, checks them, turns them into train{}'s fields and, after
-- training, prints what was written:
--
--   local topts = require("luapipe.cli.train_options")
--   topts.add(parser, { schedule = "1f1b", microbatches = 8, steps = 150 })
--   local args = cli.parse(parser, arg, prog, comm.rank() ~= 0) or cli.usage_exit(prog)
--   topts.check(args, prog)
--   local r = train(topts.train_fields(args, { model = model, data = data, ... }))
--   topts.finish(args, r, REPORT_KEYS)
local cli = require("luapipe.cli")
local util = require("luapipe.util")
local limits = require("luapipe.cli.common").limits

local M = {}

local INT32 = 0x7fffffff
local int = cli.int_option

-- Does spec name a schedule file rather than a family? (what train{}
-- loads as a file: a .csv, .json or .lua name)
function M.is_file(spec)
  return type(spec) == "string" and require("luapipe.schedules").canonical(spec) == nil
    and (spec:match("%.csv$") or spec:match("%.json$") or spec:match("%.lua$")) ~= nil
end

-- Adds the shared options to parser. defaults: {schedule =, steps =,
-- microbatches = N (for a family; nil: train{}'s 2 x pp), microbatches_help
-- = text for that default, every = N}.
function M.add(parser, defaults)
  util.arg("train_options.add", 2, "defaults", defaults, "table")
  local d = defaults
  parser:option("--schedule",
    "Schedule: a family (" .. table.concat(require("luapipe.schedules").list(), ", ")
    .. ") or a schedule file: .csv or .json (as `luapipe search -o` writes) or .lua.", d.schedule)
  parser:option("--microbatches",
    string.format("Micro-batches per step (default %s; a .csv or .json "
    .. "schedule file has its own).", d.microbatches_help or tostring(d.microbatches)))
    :convert(int("--microbatches", 1, limits.microbatches))
  parser:option("--chunks", "Chunks per rank (interleaved1f1b only; default 2).")
    :convert(int("--chunks", 1, limits.chunks))
  parser:option("--steps", "Training steps.", tostring(d.steps))
    :convert(int("--steps", d.steps_min or 1, INT32))
  parser:option("--seed", "Seed for initialisation and data.", "1"):convert(int("--seed", 0, INT32))
  parser:option("--partition", "Split the model into stages of balanced measured "
    .. "\"cost\" or of equal \"layers\" counts.", "cost")
    :choices { "layers", "cost" }
  parser:option("--device", "Where the model runs: cpu, cuda (each rank's GPU: local "
    .. "rank modulo the GPUs) or cuda:N.", "cpu")
  parser:option("--precision", "GEMM precision: f32, or bf16 (bf16 inputs with float32 "
    .. "sums; norms, softmax, loss, routers, optimizer and master weights stay float32).", "f32")
    :choices { "f32", "bf16" }
  parser:option("--checkpoint", "Save checkpoints (every rank's stages and optimizer "
    .. "state) in this directory: every --every steps and after the last step.")
  parser:option("--every", "Steps between checkpoints.", tostring(d.every or 10))
    :convert(int("--every", 1, INT32))
  parser:option("--resume", "Continue from the latest checkpoint in --checkpoint (the same model, "
    .. "ranks and partition; the schedule may differ if it places the model stages alike); "
    .. "--resume auto: if there is one, else start afresh (a job that restarts itself).")
    :args("?")
  parser:option("--trace", "Write the measured Chrome/Perfetto trace (all ranks) to this file.")
  parser:option("--svg", "Draw the measured last step (all ranks) as an SVG timeline in this file.")
  parser:option("--trace-steps", "Keep only the last N steps in --trace / --svg (default: all).")
    :convert(int("--trace-steps", 1, INT32))
  parser:option("--log-every", "Print the progress line every N steps.", "1")
    :convert(int("--log-every", 1, INT32))
  parser:option("--report", "Write the end-of-training summary figures (key=value lines) "
    .. "to this file.")
  parser:option("--dp", "Data-parallel ranks per pipeline stage: the job is pp x dp ranks (rank = "
    .. "pipeline rank * dp + DP index), each DP rank takes its share of every "
    .. "micro-batch (default: 1, or ep in an expert-parallel run).")
    :convert(int("--dp", 1, 4096))
  parser:option("--zero", "ZeRO-1: 1 shards the optimizer state over each parameter's "
    .. "data-parallel ranks (default 0).", "0")
    :choices { "0", "1" }
  parser:option("--clip", "Clip the global gradient norm (over the whole model, every "
    .. "parameter once) at this value, as torch.nn.utils.clip_grad_norm_ (default: off).")
    :convert(cli.number_option("--clip", 0, math.huge))
  parser:option("--warmup", "Learning-rate warmup: the rate rises linearly over the first N steps.")
    :convert(int("--warmup", 0, INT32))
  parser:option("--decay", "Learning-rate decay after the warmup, to --min-lr at the last step: "
    .. "cosine, linear or constant (default: constant, or cosine with --min-lr).")
    :choices { "cosine", "linear", "constant" }
  parser:option("--min-lr", "The rate --decay ends at (default 0).")
    :convert(cli.number_option("--min-lr", 0, math.huge))
  parser:option("--decay-steps", "The step --decay ends at (default --steps; give the whole run's "
    .. "length when it is trained in parts).")
    :convert(int("--decay-steps", 1, INT32))
  M.defaults = d
end

-- Checks what argparse cannot: a usage error is one line (prog: message)
-- on rank 0 and exit 2 on every rank.
function M.check(args, prog)
  if type(args.resume) == "table" then -- --resume (no value) or --resume auto
    local v = args.resume[1]
    if v ~= nil and v ~= "auto" then
      cli.usage_exit(prog, string.format("--resume takes no value, or 'auto' (resume if there is a"
        .. " checkpoint, else start afresh), got '%s'", v))
    end
    args.resume = v or true
  end
  if args.resume and not args.checkpoint then
    cli.usage_exit(prog, "--resume needs --checkpoint DIR, the directory the checkpoints "
      .. "were saved in")
  end
  if args.clip == 0 then
    cli.usage_exit(prog, "--clip must be above 0 (leave it out for no clipping)")
  end
  if args.min_lr and args.decay == "constant" then
    cli.usage_exit(prog, "--min-lr is where --decay ends: it has no use with --decay constant")
  end
  if args.chunks and M.is_file(args.schedule) then
    cli.usage_exit(prog, "--chunks applies to a family (interleaved1f1b); the schedule file "
      .. args.schedule .. " has its own placement")
  end
end

-- The micro-batch count a family is built with (the option, or the
-- script's default); nil for a schedule file unless given (the file's).
function M.microbatches(args)
  if args.microbatches or M.is_file(args.schedule) then return args.microbatches end
  return M.defaults and M.defaults.microbatches
end

-- t (train{}'s other fields) with the shared options' fields added.
function M.train_fields(args, t)
  t.schedule, t.microbatches, t.chunks = args.schedule, M.microbatches(args), args.chunks
  t.steps, t.seed, t.partition, t.device = args.steps, args.seed, args.partition, args.device
  t.precision = args.precision
  t.trace, t.svg, t.trace_steps, t.log_every = args.trace, args.svg, args.trace_steps,
    args.log_every
  if args.checkpoint then t.checkpoint = { dir = args.checkpoint, every = args.every } end
  t.resume = args.resume or nil
  t.clip = args.clip
  t.dp = t.dp or args.dp
  if args.zero == "1" then t.zero = 1 end
  if args.warmup or args.decay or args.min_lr or args.decay_steps then
    t.lr_schedule = { warmup = args.warmup, min_lr = args.min_lr, steps = args.decay_steps,
      decay = args.decay or (args.min_lr and "cosine" or "constant") }
  end
  return t
end

-- The summary figures --report writes by default (luapipe.perf's names).
M.report_keys = { "steps", "step_ms", "predicted_ms", "makespan_ms", "ratio", "bubble_pct",
  "sim_bubble_pct", "overhead_pct", "wait_pct", "post_pct", "latency_ms", "replay_ms",
  "replay_step_ms", "replay_ratio", "spread_ms", "spread_ratio" }

-- After training, on rank 0: names the files written and writes --report
-- (summary[k] for each of keys, default M.report_keys, then final_loss and oversubscribed, and
-- extra lines, as key=value). Nothing when no step ran (a resume with no
-- steps left has no summary).
function M.finish(args, result, keys, extra)
  if require("luapipe.comm").rank() ~= 0 then return end
  if args.trace then print("measured Chrome/Perfetto trace written to " .. args.trace) end
  if args.svg and result.summary then
    print("measured SVG timeline (last step) written to " .. args.svg)
  end
  if args.report and result.summary then
    local s, lines = result.summary, {}
    for _, k in ipairs(keys or M.report_keys) do
      lines[#lines + 1] = string.format("%s=%s\n", k, tostring(s[k]))
    end
    for _, l in ipairs(extra or {}) do lines[#lines + 1] = l .. "\n" end
    lines[#lines + 1] = string.format("final_loss=%.6f\n", result.losses[args.steps] or 0)
    lines[#lines + 1] = string.format("oversubscribed=%d\n", s.oversubscribed and 1 or 0)
    lines[#lines + 1] = string.format("precision=%s\n", result.precision or "f32")
    -- bytes sent per step, every rank's (bf16: 2 bytes a value)
    lines[#lines + 1] = string.format("msg_bytes=%.0f\na2a_bytes=%.0f\n", s.msg_bytes or 0,
      s.a2a_bytes or 0)
    local ok, err = util.write_file(args.report, table.concat(lines))
    if not ok then
      io.stderr:write("luapipe: --report: ", tostring(err), "\n")
      io.stderr:flush()
    end
  end
end

return M
