-- train_char_lm.lua — a small character-level transformer language model
-- trained with a pipeline schedule on a text file (by default the GPL-3
-- licence text that Debian ships).
--
--   mpirun --oversubscribe -np 4 luapipe examples/train_char_lm.lua --schedule zbv \
--     --microbatches 8 --steps 150 --seed 1
--   mpirun -np 2 luapipe examples/train_char_lm.lua --device cuda   (the model on the GPUs)
--
-- Rank 0 prints "step K loss X" (cross-entropy in nats per character; a
-- uniform guess is ln(vocab)), with samples/s and the measured bubble.
local argparse = require("argparse")
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local comm = require("luapipe.comm")
local cli = require("luapipe.cli")
local count = require("luapipe.util").count -- "1 rank", "2 ranks"
-- options: the CLI's converters (a bad value is one line, exit 2)
local int, INT32 = cli.int_option, 0x7fffffff
local limits = require("luapipe.cli.common").limits

local parser = argparse("train_char_lm.lua", "Train a char-level transformer with a pipeline schedule.")
parser:option("--schedule", "Schedule family (" .. table.concat(require("luapipe.schedules").list(), ", ")
  .. ").", "1f1b")
parser:option("--microbatches", "Micro-batches per step.", "8"):convert(int("--microbatches", 1, limits.microbatches))
parser:option("--steps", "Training steps.", "150"):convert(int("--steps", 1, INT32))
parser:option("--seed", "Seed for initialisation and data.", "1"):convert(int("--seed", 0, INT32))
parser:option("--chunks", "Chunks per rank (interleaved1f1b only; default 2).")
  :convert(int("--chunks", 1, limits.chunks))
parser:option("--blocks", "Transformer blocks.", "6"):convert(int("--blocks", 1, 4096))
parser:option("--dim", "Model width.", "64"):convert(int("--dim", 1, 65536))
parser:option("--heads", "Attention heads.", "4"):convert(int("--heads", 1, 65536))
parser:option("--context", "Characters per sequence.", "64"):convert(int("--context", 1, 65536))
parser:option("--batch", "Sequences per micro-batch.", "4"):convert(int("--batch", 1, 65536))
parser:option("--lr", "AdamW learning rate.", "0.005"):convert(cli.number_option("--lr", 0, math.huge))
parser:option("--text", "Training text.", "/usr/share/common-licenses/GPL-3")
parser:option("--partition", "Split the model into stages of balanced measured \"cost\" or of equal"
  .. " \"layers\" counts.", "cost")
  :choices { "layers", "cost" }
parser:option("--trace", "Write the measured Chrome trace (all ranks) to this file.")
parser:option("--svg", "Draw the measured last step (all ranks) as an SVG timeline in this file.")
parser:option("--trace-steps", "Keep only the last N steps in the trace (default: all).")
  :convert(int("--trace-steps", 1, INT32))
parser:flag("--show", "Print the schedule (simulated Gantt chart) before training.")
parser:option("--log-every", "Print the progress line every N steps.", "1"):convert(int("--log-every", 1, INT32))
parser:option("--precision", "GEMM precision: f32, or bf16 (bf16 inputs, float32 sums; the rest float32).", "f32")
  :choices({ "f32", "bf16" })
parser:option("--device", "Where the model runs: cpu, cuda (each rank's GPU: local rank modulo the GPUs) or cuda:N.", "cpu")
parser:option("--report", "Write the end-of-training summary figures (key=value lines) to this file.")
local args = cli.parse(parser, arg, "train_char_lm.lua", comm.rank() ~= 0) or cli.usage_exit("train_char_lm.lua")

local f = assert(io.open(args.text, "rb"))
local text = f:read("a")
f:close()

-- vocabulary: the distinct bytes of the text, in byte order
local seen, chars = {}, {}
for c in text:gmatch(".") do
  if not seen[c] then seen[c] = true; chars[#chars + 1] = c end
end
table.sort(chars)
local id = {}
for i, c in ipairs(chars) do id[c] = i - 1 end
local V, T, D = #chars, args.context, args.dim
local ids = {}
for i = 1, #text do ids[i] = id[text:sub(i, i)] end

local specs = { nn.embedding(V, D) }
for _ = 1, args.blocks do specs[#specs + 1] = nn.transformer_block(D, args.heads, 4 * D, "gelu") end
specs[#specs + 1] = nn.rmsnorm(D)
specs[#specs + 1] = nn.linear(D, V)
specs.loss = "cross_entropy"
local model = nn.sequential(specs)

-- deterministic window offsets: the same on every rank
local function offset(step, mb, b)
  local x = args.seed
  for _, v in ipairs({ step, mb, b }) do
    x = (x * 6364136223846793005 + v * 1442695040888963407 + 1) & 0x7fffffffffffffff
    x = x ~ (x >> 31)
  end
  return x % (#ids - T - 1)
end

local function data(step, mb)
  local x, y = {}, {}
  for b = 0, args.batch - 1 do
    local o = offset(step, mb, b)
    for t = 1, T do
      x[b * T + t] = ids[o + t]
      y[b * T + t] = ids[o + t + 1]
    end
  end
  return nn.tensor({ args.batch, T }, x), nn.tensor({ args.batch, T }, y)
end

if comm.rank() == 0 then
  print(string.format("train_char_lm: %s on %s, vocab %d (ln V = %.3f), %s, %s of %dx%d chars",
    args.schedule, count(comm.size(), "rank"), V, math.log(V), count(model:nlayers(), "layer"),
    count(args.microbatches, "micro-batch"), args.batch, T))
  if args.show then
    local s = require("luapipe.schedule").build(args.schedule, { pp = comm.size(),
      microbatches = args.microbatches, chunks = args.chunks })
    print("the schedule, simulated with the default costs (F=1 B=2 I=W=1):")
    print(s:gantt())
  end
end
local result = train { model = model, schedule = args.schedule, microbatches = args.microbatches,
  chunks = args.chunks, data = data, steps = args.steps, seed = args.seed,
  optimizer = { kind = "adamw", lr = args.lr, weight_decay = 0.01 },
  partition = args.partition, trace = args.trace, svg = args.svg,
  log_every = args.log_every, trace_steps = args.trace_steps, device = args.device,
  precision = args.precision }
if comm.rank() == 0 then
  if args.trace then print("measured Chrome/Perfetto trace written to " .. args.trace) end
  if args.svg then print("measured SVG timeline (last step) written to " .. args.svg) end
  if args.report and result.summary then
    local r = assert(io.open(args.report, "w"))
    local s = result.summary
    for _, k in ipairs({ "steps", "step_ms", "predicted_ms", "makespan_ms", "ratio", "bubble_pct",
      "sim_bubble_pct", "overhead_pct", "wait_pct", "post_pct", "latency_ms", "replay_ms", "replay_step_ms",
      "replay_ratio", "spread_ms", "spread_ratio" }) do
      r:write(string.format("%s=%s\n", k, tostring(s[k])))
    end
    r:write(string.format("final_loss=%.6f\n", result.losses[#result.losses] or 0))
    r:write(string.format("precision=%s\n", result.precision))
    r:write(string.format("oversubscribed=%d\n", s.oversubscribed and 1 or 0))
    r:close()
  end
end
