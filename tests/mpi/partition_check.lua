-- partition_check.lua MODE DIR — run under mpirun (4 ranks, 1f1b) by
-- test_partition_resume.sh: the 8-layer MLP of fixtures.lua trained with
-- AdamW, 8 micro-batches.
-- MODE:
--   cost    one step with train{}'s default partition (measured cost);
--           every rank checks that all ranks got the same bounds and prints
--           "rank R: ok cost BOUNDS in SECONDS s"
--   full    4 steps, partition = "layers", no checkpoints; writes this
--           rank's losses and final parameters to DIR/full.rank<R>.lua
--   part    2 steps, partition = "layers", checkpoint = {dir = DIR/ckpt, every = 2}
--   resume  resume = true up to step 4 with partition = "cost" and the
--           costs forced so that a fresh split would be another one (the
--           last layer alone); checks, on every rank, that the run used
--           the checkpoint's bounds (layers 1-2 | 3-4 | 5-6 | 7-8) and that
--           steps 3..4 have bitwise the full run's losses and parameters;
--           prints "rank R: ok resume ..." or "rank R: FAIL ..."
--   error   the same resume, expected to fail (a checkpoint without a
--           recorded partition): the error text goes to stderr
local train = require("luapipe.train")
local comm = require("luapipe.comm")
local nn = require("luapipe.nn")

local mode, dir = arg[1], arg[2]
local rank, P = comm.rank(), comm.size()
local fx = dofile("tests/mpi/fixtures.lua")
local model = fx.mlp()
local LAYERS = "1-2 | 3-4 | 5-6 | 7-8"
local FORCED = { 1, 1, 1, 1, 1, 1, 1, 10 } -- by cost: layer 8 alone in the last stage

local base = { model = model, schedule = "1f1b", microbatches = 8, data = fx.regression_data,
  seed = 5, optimizer = { kind = "adamw", lr = 0.01 }, quiet = true }
local function run(extra)
  local o = {}
  for k, v in pairs(base) do o[k] = v end
  for k, v in pairs(extra) do o[k] = v end
  return train(o)
end

-- the last layer of every stage, the same on every rank?
local function same_on_all_ranks(bounds)
  local mine = {}
  for s, b in ipairs(bounds) do mine[s] = b.last end
  local sum = assert(comm.allreduce(mine, "comparing the partitions"))
  for s = 1, #mine do
    if sum[s] ~= P * mine[s] then return false end
  end
  return true
end

local ckdir = dir .. "/ckpt"
local full_file = string.format("%s/full.rank%d.lua", dir, rank)

if mode == "cost" then
  local r = run { steps = 1 }
  local p = r.partition
  local ok = p.by == "cost" and #p.costs == 8 and same_on_all_ranks(p.bounds)
  print(string.format("rank %d: %s cost %s, measured in %.2f ms", rank, ok and "ok" or "FAIL",
    nn.bounds_text(p.bounds), 1000 * (p.seconds or -1)))
  os.exit(ok and 0 or 1)
elseif mode == "full" then
  local r = run { steps = 4, partition = "layers" }
  local f = assert(io.open(full_file, "w"))
  f:write("return {\nlosses = {")
  for k = 1, 4 do f:write(string.format("%.17g, ", r.losses[k])) end
  f:write("},\nparams = {\n")
  for name, vals in pairs(r.params()) do
    local t = {}
    for i, x in ipairs(vals) do t[i] = string.format("%.17g", x) end
    f:write(string.format("[%q] = {%s},\n", name, table.concat(t, ",")))
  end
  f:write("}}\n")
  f:close()
  print(string.format("rank %d: ok full %s", rank, nn.bounds_text(r.partition.bounds)))
elseif mode == "part" then
  local r = run { steps = 2, partition = "layers", checkpoint = { dir = ckdir, every = 2 } }
  print(string.format("rank %d: ok part %s", rank, nn.bounds_text(r.partition.bounds)))
elseif mode == "resume" or mode == "error" then
  -- a fresh split by cost would put layer 8 alone: force those costs
  model.partition = function(self, o)
    if not o.bounds then o.costs = FORCED end
    return nn.Model.partition(self, o)
  end
  local forced = nn.bounds_text(nn.Model.partition(model,
    { stages = 4, by = "cost", costs = FORCED }).bounds)
  assert(forced ~= LAYERS, "the forced costs give the layer-count split")
  local r = run { steps = 4, partition = "cost", quiet = false, resume = true,
    checkpoint = { dir = ckdir, every = 2 } }
  if mode == "error" then
    print(string.format("rank %d: resumed without an error", rank))
    os.exit(1)
  end
  local want = assert(dofile(full_file))
  local fails = {}
  local got = nn.bounds_text(r.partition.bounds)
  if got ~= LAYERS then
    fails[#fails + 1] = string.format("split as %s, not as the checkpoint's %s (a fresh split: %s)",
      got, LAYERS, forced)
  end
  if not r.partition.recorded then
    fails[#fails + 1] = "the partition is not marked as the checkpoint's"
  end
  if not same_on_all_ranks(r.partition.bounds) then
    fails[#fails + 1] = "the ranks split differently"
  end
  if r.first_step ~= 3 then fails[#fails + 1] = "resumed at step " .. tostring(r.first_step) end
  for k = 3, 4 do
    if r.losses[k] ~= want.losses[k] then
      fails[#fails + 1] = string.format("loss of step %d: %.17g, uninterrupted %.17g", k,
        r.losses[k] or 0 / 0, want.losses[k])
    end
  end
  local n = 0
  for name, vals in pairs(r.params()) do
    local w = want.params[name]
    if not w or #w ~= #vals then
      fails[#fails + 1] = "parameter " .. name .. " is not the full run's"
    else
      for j = 1, #vals do
        if vals[j] ~= w[j] then
          fails[#fails + 1] = "parameter " .. name .. " differs"
          break
        end
      end
      n = n + 1
    end
  end
  if n == 0 then fails[#fails + 1] = "no parameters checked" end
  for _, m in ipairs(fails) do print(string.format("rank %d: FAIL resume: %s", rank, m)) end
  if #fails == 0 then
    print(string.format("rank %d: ok resume as %s (a fresh split: %s), steps 3..4 "
      .. "bitwise, %d params", rank, got, forced, n))
  end
  local total = assert(comm.allreduce({ #fails }, "gathering failure counts"))[1]
  os.exit(total == 0 and 0 or 1)
else
  error("unknown mode " .. tostring(mode))
end
