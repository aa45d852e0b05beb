-- dp_train.lua KEY=VALUE ... — scripts/bench/dp's driver (under mpirun): an
-- MLP of `layers` linear layers of width `dim` (GELU between, MSE loss,
-- AdamW) trained with 1F1B at pp = 1 x dp = the job's ranks, `mb`
-- micro-batches of `rows` rows per DP rank (the global batch grows with dp:
-- weak scaling), `steps` steps (the first is warm-up), zero= and link= as
-- given. Rank 0 prints one line of figures: step_ms (the summary's mean
-- measured step), optim_bytes per rank, and the DP sums' count, ms each,
-- hidden share and link model ms per rank.
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local comm = require("luapipe.comm")

local o = { dim = 512, layers = 4, rows = 64, mb = 4, steps = 6, zero = 0 }
for i = 1, #arg do
  local k, v = arg[i]:match("^(%w+)=(.*)$")
  o[k] = math.tointeger(tonumber(v)) or tonumber(v) or v
end
local dp = comm.size()
local layers = {}
for l = 1, o.layers do
  layers[#layers + 1] = nn.linear(o.dim, o.dim)
  if l < o.layers then layers[#layers + 1] = nn.gelu() end
end
layers.loss = "mse"
local model = nn.sequential(layers)
local rows = o.rows * dp
-- the micro-batches are made once (data() stays cheap: every DP rank asks
-- for the whole micro-batch and keeps its share)
local cache = {}
local function data(_, mb)
  if not cache[mb] then
    local x, y = {}, {}
    for i = 1, rows * o.dim do
      x[i] = math.sin(0.01 * i + 0.3 * mb)
      y[i] = 0.5 * math.cos(0.02 * i + mb)
    end
    cache[mb] = { nn.tensor({ rows, o.dim }, x), nn.tensor({ rows, o.dim }, y) }
  end
  return cache[mb][1], cache[mb][2]
end
local r = train { model = model, schedule = "1f1b", pp = 1, dp = dp, microbatches = o.mb, data = data,
  steps = o.steps, seed = 1, quiet = true, partition = "layers", zero = o.zero,
  link = o.link ~= "none" and o.link or nil,
  optimizer = { kind = "adamw", lr = 1e-3 } }
local d = r.summary.dp
if comm.rank() == 0 then
  print(string.format("step_ms %.3f optim_bytes %.0f dp_n %d dp_ms %.3f dp_hidden_pct %.1f dp_link_ms %.3f",
    r.summary.step_ms, d.optim_bytes, d.n, d.n > 0 and 1e3 * d.s / d.n or 0,
    d.s > 0 and 100 * d.hidden / d.s or 0, d.n > 0 and 1e3 * d.link / d.n or 0))
end
