-- dp_check.lua MODE DIR [key=value ...] — run under mpirun by test_train_dp.sh.
-- The small transformer LM of fixtures.lua (AdamW, 1F1B with 2 x pp
-- micro-batches; pp=N, else pp = 1 and dp = the job's ranks) trained at
-- dp = the job's ranks / pp (zero=1: ZeRO-1; rows=N: N
-- sequences per micro-batch, default 4; ep=, dp= and zero= go to train{}
-- as given, for the error cases). Every rank writes exact figures to
-- DIR/<MODE>.rank<R>.txt: the losses (%.17g), a checksum of its final
-- parameters, its optimizer bytes; rank 0 also the summary's data-parallel
-- line.
-- MODE:
--   run     STEPS = 3 steps (steps=N) from the start
--   part    2 steps with checkpoint = {dir = DIR/ckpt, every = 1}
--   resume  resume = true from DIR/ckpt up to 3 steps
local train = require("luapipe.train")
local comm = require("luapipe.comm")
local nn = require("luapipe.nn")
local perf = require("luapipe.perf")
local fx = dofile("tests/mpi/fixtures.lua")

local mode, dir = arg[1], arg[2]
local kv = {}
for i = 3, #arg do
  local k, v = arg[i]:match("^(%w+)=(.*)$")
  kv[k] = math.tointeger(tonumber(v)) or tonumber(v) or v
end
local rank, P = comm.rank(), comm.size()
local pp = kv.pp -- (nil: the job's ranks / dp)
local rows = kv.rows or 4
local T, V = 5, 12
-- the global batch is the same whatever dp is: `rows` sequences per
-- micro-batch, each DP rank taking rows / dp of them
local function data(step, mb)
  local x, y = {}, {}
  for i = 1, rows * T do
    x[i] = (step * 5 + mb * 3 + i * 7) % V
    y[i] = (x[i] * 3 + 1) % V
  end
  return nn.tensor({ rows, T }, x), nn.tensor({ rows, T }, y)
end

local opts = { model = fx.lm(), schedule = "1f1b", pp = pp, microbatches = 2 * (pp or 1), data = data,
  steps = kv.steps or 3, seed = 5, quiet = true, partition = "layers",
  optimizer = { kind = "adamw", lr = 0.01, weight_decay = 0.01 },
  dp = kv.dp or P // (pp or 1), ep = kv.ep, zero = kv.zero, clip = kv.clip, link = kv.link }
if mode == "part" then
  opts.steps = 2
  opts.checkpoint = { dir = dir .. "/ckpt", every = 1 }
elseif mode == "resume" then
  opts.steps = 3
  opts.checkpoint = { dir = dir .. "/ckpt", every = 1 }
  opts.resume = true
end
local r = train(opts)

local f = assert(io.open(string.format("%s/%s.rank%d.txt", dir, mode, rank), "w"))
for k = r.first_step, opts.steps do f:write(string.format("loss %d %.17g\n", k, r.losses[k])) end
local s1, s2 = 0, 0
local names = {}
local params = r.params()
for name in pairs(params) do names[#names + 1] = name end
table.sort(names)
for _, name in ipairs(names) do
  for i, x in ipairs(params[name]) do
    s1 = s1 + x
    s2 = s2 + x * ((i % 97) + 1)
  end
end
f:write(string.format("params %.17g %.17g\n", s1, s2))
f:write(string.format("optim_bytes %d\n", r.exec:optim_bytes()))
f:close()
if rank == 0 and r.summary then
  for line in perf.format(r.summary):gmatch("[^\n]+") do
    if line:match("data parallel") or line:match("gradient sums over dp") then print(line) end
  end
end
