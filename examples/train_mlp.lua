-- train_mlp.lua — pipeline-parallel training of a residual MLP on a
-- synthetic regression task (targets from a fixed random "teacher").
--
--   mpirun --oversubscribe -np 4 luapipe examples/train_mlp.lua --schedule dualpipe \
--     --microbatches 8 --steps 20 --seed 1
--   (add --checkpoint DIR --every 10 to save; rerun with --resume to continue;
--   the options every example takes: luapipe.cli.train_options)
--
-- Rank 0 prints "step K loss X" (with samples/s and the measured bubble).
local argparse = require("argparse")
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local comm = require("luapipe.comm")
local cli = require("luapipe.cli")
local topts = require("luapipe.cli.train_options") -- the options every example takes
local count = require("luapipe.util").count -- "1 rank", "2 ranks"
-- options: the CLI's converters (a bad value is one line, exit 2)
local int = cli.int_option

local parser = argparse("train_mlp.lua", "Train a residual MLP with a pipeline schedule.")
topts.add(parser, { schedule = "1f1b", microbatches = 8, steps = 20 })
parser:option("--layers", "Residual MLP blocks.", "8"):convert(int("--layers", 1, 4096))
parser:option("--width", "Model width.", "64"):convert(int("--width", 1, 65536))
parser:option("--batch", "Samples per micro-batch.", "16"):convert(int("--batch", 1, 65536))
parser:option("--lr", "AdamW learning rate.", "0.003"):convert(cli.number_option("--lr", 0, math.huge))
local args = cli.parse(parser, arg, "train_mlp.lua", comm.rank() ~= 0) or cli.usage_exit("train_mlp.lua")
topts.check(args, "train_mlp.lua")

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

local result = train(topts.train_fields(args, { model = model, data = data,
  optimizer = { kind = "adamw", lr = args.lr, weight_decay = 0 },
  announce = function(info) -- rank 0, once train{} has checked the options
    print(string.format("train_mlp: %s on %s, %s of %d, %s", args.schedule, count(comm.size(), "rank"),
      count(info.microbatches, "micro-batch"), args.batch, count(model:nlayers(), "layer")))
  end }))
topts.finish(args, result)
