-- train_mlp.lua — pipeline-parallel training of a residual MLP on a
-- synthetic regression task (targets from a fixed random "teacher").
--
--   mpirun --oversubscribe -np 4 luapipe examples/train_mlp.lua --schedule dualpipe \
--     --microbatches 8 --steps 20 --seed 1
--   (add --checkpoint DIR --every 10 to save; rerun with --resume to continue)
--
-- Rank 0 prints "step K loss X" (with samples/s and the measured bubble).
local argparse = require("argparse")
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local comm = require("luapipe.comm")
local cli = require("luapipe.cli")
local count = require("luapipe.util").count -- "1 rank", "2 ranks"
-- options: the CLI's converters (a bad value is one line, exit 2)
local int, INT32 = cli.int_option, 0x7fffffff
local limits = require("luapipe.cli.common").limits

local parser = argparse("train_mlp.lua", "Train a residual MLP with a pipeline schedule.")
parser:option("--schedule", "Schedule family (" .. table.concat(require("luapipe.schedules").list(), ", ")
  .. ").", "1f1b")
parser:option("--microbatches", "Micro-batches per step.", "8"):convert(int("--microbatches", 1, limits.microbatches))
parser:option("--steps", "Training steps.", "20"):convert(int("--steps", 1, INT32))
parser:option("--seed", "Seed for initialisation and data.", "1"):convert(int("--seed", 0, INT32))
parser:option("--chunks", "Chunks per rank (interleaved1f1b only; default 2).")
  :convert(int("--chunks", 1, limits.chunks))
parser:option("--layers", "Residual MLP blocks.", "8"):convert(int("--layers", 1, 4096))
parser:option("--width", "Model width.", "64"):convert(int("--width", 1, 65536))
parser:option("--batch", "Samples per micro-batch.", "16"):convert(int("--batch", 1, 65536))
parser:option("--lr", "AdamW learning rate.", "0.003"):convert(cli.number_option("--lr", 0, math.huge))
parser:option("--partition", "Split the model into stages of balanced measured \"cost\" or of equal"
  .. " \"layers\" counts.", "cost")
  :choices { "layers", "cost" }
parser:option("--trace", "Write the measured Chrome trace (all ranks) to this file.")
parser:option("--precision", "GEMM precision: f32, or bf16 (bf16 inputs, float32 sums; the rest float32).", "f32")
  :choices({ "f32", "bf16" })
parser:option("--device", "Where the model runs: cpu, cuda (each rank's GPU: local rank modulo the GPUs) or cuda:N.", "cpu")
parser:option("--checkpoint", "Save checkpoints (every rank's stages and optimizer state) in this directory.")
parser:option("--every", "Steps between checkpoints.", "10"):convert(int("--every", 1, INT32))
parser:flag("--resume", "Continue from the latest checkpoint in --checkpoint.")
local args = cli.parse(parser, arg, "train_mlp.lua", comm.rank() ~= 0) or cli.usage_exit("train_mlp.lua")
if args.resume and not args.checkpoint then
  cli.usage_exit("train_mlp.lua", "--resume needs --checkpoint DIR, the directory the checkpoints were saved in")
end

local DIN, DOUT, W = 16, 4, args.width
local specs = { nn.linear(DIN, W) }
for _ = 1, args.layers do specs[#specs + 1] = nn.mlp_block(W, 2 * W, "gelu") end
specs[#specs + 1] = nn.rmsnorm(W)
specs[#specs + 1] = nn.linear(W, DOUT)
specs.loss = "mse"
local model = nn.sequential(specs)

-- a deterministic hash -> [0, 1): the same numbers on every rank
local function u01(...)
  local x = args.seed
  for _, v in ipairs({ ... }) do
    x = (x * 6364136223846793005 + v * 1442695040888963407 + 1) & 0x7fffffffffffffff
    x = x ~ (x >> 29)
  end
  return ((x * 2685821657736338717) >> 11 & 0xfffffffffffff) / 0x10000000000000
end

local teacher = {}
for j = 1, DOUT do
  for i = 1, DIN do teacher[(j - 1) * DIN + i] = (u01(7, j, i) * 2 - 1) * 0.6 end
end

local function data(step, mb)
  local B, x, y = args.batch, {}, {}
  for b = 0, B - 1 do
    for i = 1, DIN do x[b * DIN + i] = u01(step, mb, b, i) * 2 - 1 end
    for j = 1, DOUT do
      local s = 0
      for i = 1, DIN do s = s + teacher[(j - 1) * DIN + i] * x[b * DIN + i] end
      y[b * DOUT + j] = math.tanh(2 * s)
    end
  end
  return nn.tensor({ B, DIN }, x), nn.tensor({ B, DOUT }, y)
end

if comm.rank() == 0 then
  print(string.format("train_mlp: %s on %s, %s of %d, %s", args.schedule, count(comm.size(), "rank"),
    count(args.microbatches, "micro-batch"), args.batch, count(model:nlayers(), "layer")))
end
train { model = model, schedule = args.schedule, microbatches = args.microbatches,
  chunks = args.chunks, data = data, steps = args.steps, seed = args.seed,
  optimizer = { kind = "adamw", lr = args.lr, weight_decay = 0 },
  partition = args.partition, trace = args.trace,
  checkpoint = args.checkpoint and { dir = args.checkpoint, every = args.every } or nil,
  resume = args.resume or nil, device = args.device,
  precision = args.precision }
