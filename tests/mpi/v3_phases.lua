-- v3_phases.lua TRACE — under mpirun -np 4: a tiny DeepSeek-V3 (6 MoE
-- layers, as DeepSeek's profiled chunks; models.deepseek_v3) trained
-- with DualPipe at pp 2 x ep 2, the measured trace written to TRACE. Rank 0
-- checks the phase slices (category "phase") of every overlapped F&B pair
-- of every rank: the stage's head and embedding (dense(B), dense(F)), then
-- per layer DeepSeek's 10 phases in the order of its training profile
-- (and what is left of the longer half); every rank checks its losses and
-- parameters against train.reference (one process) within 1e-5 (losses)
-- and 1e-4 (parameters: AdamW moves an element whose gradient is float
-- noise by up to lr, as in test_v3_train.sh), so the
-- phased pair computes what running the halves one after the other does.
-- Prints "<rank>: ok" when all hold.
local comm = require("luapipe.comm")
local json = require("luapipe.json")
local models = require("luapipe.models")
local train = require("luapipe.train")

local path = assert(arg[1], "usage: v3_phases.lua TRACE")
local rank = comm.rank()
local model = models.deepseek_v3 { vocab_size = 64, dim = 32, inter_dim = 48, moe_inter_dim = 16,
  n_layers = 6, n_dense_layers = 0, n_heads = 2, n_routed_experts = 4, n_shared_experts = 1,
  n_activated_experts = 2, q_lora_rank = 16, kv_lora_rank = 16, qk_nope_head_dim = 8,
  qk_rope_head_dim = 4, v_head_dim = 8, max_seq_len = 16, score_func = "sigmoid",
  correction_bias = true }
local M = 6
local data = dofile("tests/mpi/fixtures.lua").token_data(64)
local opt = { kind = "adamw", lr = 1e-3, beta1 = 0.9, beta2 = 0.95, weight_decay = 0.1 }
local sched = require("luapipe.schedule").build("dualpipe", { pp = 2, microbatches = M })
local r = train { model = model, schedule = sched, microbatches = M, data = data, steps = 2,
  optimizer = opt, quiet = true, partition = "layers", ep = 2, trace = path }
local ref = train.reference { model = model, microbatches = M, data = data, steps = 2,
  optimizer = opt }

local fails = {}
local function close(what, got, want, tol)
  local d, w = 0, 0
  for i = 1, #want do
    d = d + (got[i] - want[i]) ^ 2
    w = w + want[i] ^ 2
  end
  local e = math.sqrt(d) / math.max(math.sqrt(w), 1e-12)
  if #got ~= #want or e > tol then
    fails[#fails + 1] = string.format("%s: relative L2 difference %.3g", what, e)
  end
end
for k = 1, 2 do close("loss of step " .. k, { r.losses[k] }, { ref.losses[k] }, 1e-5) end
local want = ref.params()
for _, vs in ipairs(r.stage_params()) do
  for name, v in pairs(vs.params) do
    close("stage " .. vs.stage .. " " .. name, v, want[name], 1e-4)
  end
end

if rank == 0 then
  local f = assert(io.open(path, "rb"))
  local t = json.decode(f:read("a"))
  f:close()
  -- phase slices per (rank, step, pair action), in start order
  local pairs_, order = {}, {}
  for _, e in ipairs(t.traceEvents) do
    if e.ph == "X" and e.cat == "phase" then
      local key = string.format("rank %d, step %d, %s", e.pid, e.args.step, e.args.action)
      if not pairs_[key] then pairs_[key] = {} order[#order + 1] = key end
      local l = pairs_[key]
      l[#l + 1] = e
    end
  end
  -- A pair of a forward over nF MoE layers and a backward over nB: the
  -- stage's head and embedding, then DeepSeek's 10 phases per layer for
  -- min(nF, nB) layers (a backward's last layer has no attn(W) slice: its
  -- finish runs that weight-grad), then what is left of the longer half.
  local L = { "combine(B)", "attn(F)", "mlp(B)", "dispatch(F)", "dispatch(B)", "mlp(W)", "mlp(F)",
    "attn(B)", "attn(W)", "combine(F)" }
  local function expect(nF, nB)
    local t = { "dense(B)", "dense(F)" }
    local common = math.min(nF, nB)
    for i = 1, common do
      for _, n in ipairs(L) do
        if not (n == "attn(W)" and i == nB) then t[#t + 1] = n end
      end
    end
    for i = common + 1, nB do
      for _, n in ipairs({ "combine(B)", "mlp(B)", "dispatch(B)", "mlp(W)", "attn(B)",
        "attn(W)" }) do
        if not (n == "attn(W)" and i == nB) then t[#t + 1] = n end
      end
    end
    for _ = common + 1, nF do
      for _, n in ipairs({ "attn(F)", "dispatch(F)", "mlp(F)", "combine(F)" }) do t[#t + 1] = n end
    end
    return table.concat(t, " ")
  end
  local two = false -- some pair overlaps two layers or more
  if #order == 0 then fails[#fails + 1] = "no phase slices in the trace" end
  local ranks = {}
  for _, key in ipairs(order) do
    local l = pairs_[key]
    table.sort(l, function(a, b) return a.ts < b.ts end)
    local names = {}
    for i, e in ipairs(l) do names[i] = e.name end
    local got = table.concat(names, " ")
    local nF, nB = select(2, got:gsub("attn%(F%)", "")), select(2, got:gsub("combine%(B%)", ""))
    if nF < 1 or nB < 1 then
      fails[#fails + 1] = string.format("%s: %d forward and %d backward MoE layers", key, nF, nB)
    end
    if math.min(nF, nB) >= 2 then two = true end
    local want = expect(nF, nB)
    if got ~= want then
      fails[#fails + 1] = key .. ": phases " .. got .. "\n  expected " .. want
    end
    ranks[tonumber(key:match("^rank (%d+)"))] = true
  end
  if not two then fails[#fails + 1] = "no pair overlaps two layers" end
  for rk = 0, 3 do
    if not ranks[rk] then fails[#fails + 1] = "no overlapped pair traced on rank " .. rk end
  end
end
if #fails == 0 then print(rank .. ": ok") else
  for _, f in ipairs(fails) do print(rank .. ": FAIL " .. f) end
end
