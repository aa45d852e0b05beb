-- scripts/bench/v3.lua MODE STEPS [PRECISION] — the DeepSeek-V3 benchmark's luapipe
-- side (scripts/bench/v3 runs it). The config (the same as v3_torch.py's):
-- dim 256, 4 layers (the first dense), 16 routed experts top 4 + 1 shared,
-- MLA without query LoRA, vocab 3072, 8.45 M parameters; micro-batches of
-- 4 sequences x 256 tokens, AdamW.
--   single    one process, one micro-batch a step: the model built whole,
--             each step forward + backward + AdamW (core.nn_reference_step,
--             what train.reference runs); prints "step_ms X" (median of
--             STEPS steps after one warm-up step) and "cpu_ms Y" (the
--             median step in the process's CPU time, os.clock: what other
--             jobs on a shared machine disturb less)
--   dualpipe  under mpirun -np 4: DualPipe at pp 2 x ep 2, 8 micro-batches
--             a step; rank 0 prints "tokens_per_s X step_ms Y" from
--             train's summary (measured step time, first step left out)
-- PRECISION: the GEMMs' precision, f32 (the default) or bf16.
local core = require("luapipe.core")
local models = require("luapipe.models")
local train = require("luapipe.train")

local mode, steps, precision = arg[1], tonumber(arg[2]) or 5, arg[3] or "f32"
if precision ~= "f32" and precision ~= "bf16" then
  io.stderr:write("v3.lua: PRECISION must be f32 or bf16, got " .. precision .. "\n")
  os.exit(2)
end
local B, T, V = 4, 256, 3072
local model = models.deepseek_v3 { vocab_size = V, dim = 256, inter_dim = 1024,
  moe_inter_dim = 128, n_layers = 4, n_dense_layers = 1, n_heads = 8, n_routed_experts = 16,
  n_shared_experts = 1, n_activated_experts = 4, n_expert_groups = 1, n_limited_groups = 1,
  q_lora_rank = 0, kv_lora_rank = 128, qk_nope_head_dim = 32, qk_rope_head_dim = 16,
  v_head_dim = 32, max_seq_len = T, score_func = "softmax", route_scale = 1.0 }
local function data(step, mb)
  local x, y = {}, {}
  local s = 12345 + step * 7919 + mb * 104729
  for i = 1, B * T do
    s = (s * 1103515245 + 12345) % 2147483648
    x[i] = s % V
    s = (s * 1103515245 + 12345) % 2147483648
    y[i] = s % V
  end
  return core.tensor({ B, T }, x), core.tensor({ B, T }, y)
end
local opt = { kind = "adamw", lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1 }

if mode == "single" then
  local total = model:counts()
  model:shapes({ B, T })
  local layer = model:build(0)
  layer:set_precision(precision)
  local optim = core.nn_optim(layer, opt)
  local times, cpu = {}, {}
  for k = 0, steps do
    local t0, c0 = core.now(), os.clock()
    local loss, err = core.nn_reference_step(layer, optim, model.loss, 1, data, k + 1, nil)
    if not loss then error(err) end
    if k > 0 then
      times[#times + 1] = (core.now() - t0) * 1000
      cpu[#cpu + 1] = (os.clock() - c0) * 1000
    end
  end
  table.sort(times)
  table.sort(cpu)
  print(string.format("params %d precision %s step_ms %.1f min_ms %.1f cpu_ms %.1f", total,
    precision, times[(#times + 1) // 2], times[1], cpu[(#cpu + 1) // 2]))
elseif mode == "dualpipe" then
  local M = 8
  local sched = require("luapipe.schedule").build("dualpipe", { pp = 2, microbatches = M })
  local r = train { model = model, schedule = sched, microbatches = M, data = data, steps = steps,
    optimizer = opt, quiet = true, partition = "layers", ep = 2, precision = precision }
  if require("luapipe.comm").rank() == 0 then
    local ms = r.summary.step_ms
    print(string.format("tokens_per_s %.0f step_ms %.1f", M * B * T / (ms / 1000), ms))
  end
else
  error("usage: v3.lua single|dualpipe STEPS [f32|bf16]")
end
