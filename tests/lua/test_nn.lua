-- luapipe.nn and luapipe.train on one process: tensors, layers and their
-- parameters as Lua tables, shape checks, partitioning (by layers, by cost
-- measured one layer at a time, given bounds, train{}'s cost default, and
-- the too-many-stages error), split-independent initialisation, and
-- single-rank training against the reference.
local lu = require("luaunit")
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local core = require("luapipe.core")

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local error_of = dofile(here .. "errors.lua").error_of

local function mlp()
  return nn.sequential {
    nn.linear(4, 8), nn.gelu(), nn.mlp_block(8, 16), nn.linear(8, 8), nn.silu(),
    nn.rmsnorm(8), nn.residual(nn.linear(8, 8)), nn.linear(8, 2), loss = "mse",
  }
end

local function data(step, mb)
  local x, y = {}, {}
  for i = 1, 12 do x[i] = math.sin(step * 0.9 + mb * 1.7 + i * 0.31) end
  for i = 1, 6 do y[i] = math.cos(step * 0.4 + mb * 0.6 + i) end
  return nn.tensor({ 3, 4 }, x), nn.tensor({ 3, 2 }, y)
end

function test_tensor_roundtrip()
  local t = nn.tensor({ 2, 3 }, { 1, 2, 3, 4, 5, 6.5 })
  lu.assertEquals(t:shape(), { 2, 3 })
  lu.assertEquals(t:numel(), 6)
  lu.assertEquals(t:totable(), { 1, 2, 3, 4, 5, 6.5 })
  lu.assertEquals(nn.tensor({ 2 }):totable(), { 0, 0 })
  lu.assertEquals(tostring(t), "luapipe.Tensor [2, 3]")
  lu.assertStrContains(error_of(nn.tensor, { 2, 2 }, { 1, 2, 3 }),
    "tensor: 3 values given for a shape of 4 elements")
  t:close()
  lu.assertStrContains(error_of(t.shape, t), "attempt to use a closed luapipe.Tensor")
end

-- A chunk with bf16 boundaries rounds each layer's output but the last to
-- bf16 values before the next layer (where a pipeline stage may end), and
-- nothing else: 1 + 2^-10 is not a bf16 value (8 bits of mantissa), so it
-- becomes 1 between the layers; the last output 1 + 2^-12 stays.
function test_chunk_bf16_boundary()
  local function two(boundary)
    local a = core.nn_layer(nn.linear(1, 1), "a", 1)
    local b = core.nn_layer(nn.linear(1, 1), "b", 1)
    a:set_params { ["a.weight"] = { 1 }, ["a.bias"] = { 2 ^ -10 } }
    b:set_params { ["b.weight"] = { 1 }, ["b.bias"] = { 2 ^ -12 } }
    return core.nn_chunk("c", { a, b }, boundary)
  end
  local x = nn.tensor({ 1, 1 }, { 1 })
  lu.assertEquals(two():forward(x):totable(), { 1 + 2 ^ -10 + 2 ^ -12 })
  lu.assertEquals(two("f32"):forward(x):totable(), { 1 + 2 ^ -10 + 2 ^ -12 })
  lu.assertEquals(two("bf16"):forward(x):totable(), { 1 + 2 ^ -12 })
  lu.assertStrContains(error_of(core.nn_chunk, "c", { core.nn_layer(nn.linear(1, 1), "a", 1) },
    "fp8"), 'boundary must be "f32" or "bf16", got "fp8"')
end

function test_layer_params_in_and_out()
  local l = core.nn_layer(nn.linear(3, 2), "layers.0", 7)
  local p = l:params()
  lu.assertEquals(#p, 2)
  lu.assertEquals(p[1].name, "layers.0.weight")
  lu.assertEquals(p[1].shape, { 2, 3 })
  lu.assertEquals(p[2].value, { 0, 0 })
  l:set_params { ["layers.0.weight"] = { 1, 0, 0, 0, 1, 0 }, ["layers.0.bias"] = { 0.5, -1 } }
  local y = l:forward(nn.tensor({ 1, 3 }, { 2, 3, 4 }))
  lu.assertEquals(y:totable(), { 2.5, 2 })
  lu.assertStrContains(error_of(l.set_params, l, { nope = { 1 } }),
    "set_params: no parameter 'nope'")
  lu.assertStrContains(error_of(core.nn_layer, { kind = "conv" }, "x", 1),
    "unknown layer kind 'conv'")
  lu.assertStrContains(error_of(core.nn_layer, { kind = "linear", din = 3 }, "x", 1),
    "layer 'linear': field 'dout' must be a positive integer")
  lu.assertStrContains(error_of(core.nn_layer, { kind = "mlp_block", d_model = 4, d_hidden = 8,
    act = "relu" }, "x", 1), "act must be \"gelu\" or \"silu\", got \"relu\"")
  local attn = core.nn_layer(nn.attention(8, 2), "blocks.0.attn", 1)
  local names = {}
  for _, q in ipairs(attn:params()) do names[#names + 1] = q.name end
  lu.assertEquals(names, { "blocks.0.attn.wq", "blocks.0.attn.wk", "blocks.0.attn.wv",
    "blocks.0.attn.wo" })
  attn:close()
  attn:close() -- idempotent
  lu.assertStrContains(error_of(attn.params, attn), "attempt to use a closed luapipe.Layer")
  -- the same name and seed give the same numbers
  local a = core.nn_layer(nn.linear(3, 2), "layers.0", 7):params()[1].value
  local b = core.nn_layer(nn.linear(3, 2), "layers.0", 7):params()[1].value
  lu.assertEquals(a, b)
end

function test_shapes_and_mismatch()
  local m = mlp()
  local s = m:shapes({ 3, 4 })
  lu.assertEquals(s[1], { 3, 8 })
  lu.assertEquals(s[8], { 3, 2 })
  local bad = nn.sequential { nn.linear(4, 8), nn.linear(7, 2) }
  lu.assertEquals(error_of(bad.shapes, bad, { 3, 4 }),
    "model layer 2 (linear 7->2) expects inputs [..., 7], got [3, 8]")
  local lm = nn.sequential { nn.embedding(10, 6), nn.transformer_block(6, 2, 12), nn.linear(6, 10) }
  lu.assertEquals(lm:shapes({ 2, 5 })[3], { 2, 5, 10 })
end

function test_partition_by_layers()
  local m = mlp()
  local p = m:partition { stages = 3 }
  lu.assertEquals(p.bounds, { { first = 1, last = 3 }, { first = 4, last = 6 },
    { first = 7, last = 8 } })
  lu.assertEquals(m:stage_input_shapes(p, { 3, 4 }), { [1] = { 3, 8 }, [2] = { 3, 8 } })
  lu.assertEquals(error_of(m.partition, m, { stages = 16 }),
    "partition: the schedule wants 16 model stages, but the model has only 8 layers (each stage"
    .. " needs at least one layer): use a deeper model, or fewer stages (fewer ranks or chunks)")
end

function test_partition_by_cost()
  local m = mlp()
  local p = m:partition { stages = 3, by = "cost", costs = { 1, 1, 1, 10, 1, 1, 1, 1 } }
  lu.assertEquals(p.bounds, { { first = 1, last = 3 }, { first = 4, last = 4 },
    { first = 5, last = 8 } })
  local q = m:partition { stages = 4, by = "cost", input_shape = { 3, 4 }, reps = 1 }
  lu.assertEquals(#q.bounds, 4)
  lu.assertEquals(#q.costs, 8)
  lu.assertEquals(q.bounds[1].first, 1)
  lu.assertEquals(q.bounds[4].last, 8)
  for s = 2, 4 do lu.assertEquals(q.bounds[s].first, q.bounds[s - 1].last + 1) end
end

-- The score luapipe.train gives a split: schedule s's simulated step with
-- a stage's F a third of its cost, B two thirds, I and W a third each.
local function simulated_step(s)
  return function(stage_costs)
    local st = {}
    for k, c in ipairs(stage_costs) do
      st[k - 1] = { F = c / 3, B = 2 * c / 3, I = c / 3, W = c / 3 }
    end
    return assert(s:simulate({ stages = st })):makespan()
  end
end

-- bounds -> each stage's summed layer costs
local function stage_sums(costs)
  return function(bounds)
    local sc = {}
    for k, b in ipairs(bounds) do
      sc[k] = 0
      for i = b.first, b.last do sc[k] = sc[k] + costs[i] end
    end
    return sc
  end
end

-- by = "cost" with a score (what luapipe.train gives: the schedule's
-- simulated step): on ZB-V (rank 0 holds stages 0 and 3, rank 1 stages 1
-- and 2) a char-LM-like model (a free embedding, six equal blocks, a light
-- head) split for the largest stage leaves rank 1 four blocks and rank 0
-- two; the scored split is the best of every split (enumerated here) and
-- gives each rank three
function test_partition_by_cost_with_a_score()
  local schedule = require("luapipe.schedule")
  local s = schedule.build("zbv", { pp = 2, microbatches = 8 })
  local costs = { 0.01, 3, 3, 3, 3, 3, 3, 0.02, 0.2 }
  local m = nn.sequential { nn.linear(2, 2), nn.linear(2, 2), nn.linear(2, 2), nn.linear(2, 2),
    nn.linear(2, 2), nn.linear(2, 2), nn.linear(2, 2), nn.linear(2, 2), nn.linear(2, 2) }
  local step, of = simulated_step(s), stage_sums(costs)
  local plain = m:partition { stages = 4, by = "cost", costs = costs }
  local scored = m:partition { stages = 4, by = "cost", costs = costs, score = step }
  local best = math.huge
  for a = 1, 6 do
    for b = a + 1, 7 do
      for c = b + 1, 8 do
        best = math.min(best, step(of({ { first = 1, last = a }, { first = a + 1, last = b },
          { first = b + 1, last = c }, { first = c + 1, last = 9 } })))
      end
    end
  end
  lu.assertAlmostEquals(step(of(scored.bounds)), best, 1e-12)
  lu.assertTrue(step(of(scored.bounds)) < 0.9 * step(of(plain.bounds)),
    string.format("scored %.3f, plain %.3f", step(of(scored.bounds)), step(of(plain.bounds))))
  local sc = of(scored.bounds)
  lu.assertAlmostEquals(sc[1] + sc[4], 9.22, 0.5) -- rank 0: three blocks (and the light layers)
  lu.assertAlmostEquals(sc[2] + sc[3], 9, 0.5)    -- rank 1: three blocks
  -- too many splits to try them all (C(23, 7)): moves from the balanced
  -- split, never worse than it
  local s4 = schedule.build("zbv", { pp = 4, microbatches = 8 })
  local big, layers = {}, {}
  for i = 1, 24 do big[i], layers[i] = (i % 5 == 0) and 0.1 or 1, nn.linear(2, 2) end
  local step4, of4 = simulated_step(s4), stage_sums(big)
  local m24 = nn.sequential(layers)
  local p24 = m24:partition { stages = 8, by = "cost", costs = big }
  local q24 = m24:partition { stages = 8, by = "cost", costs = big, score = step4 }
  lu.assertTrue(step4(of4(q24.bounds)) <= step4(of4(p24.bounds)) + 1e-12)
  -- out of time at once: the balanced split, as it is
  local z24 = m24:partition { stages = 8, by = "cost", costs = big, score = step4,
    score_seconds = 0 }
  lu.assertEquals(z24.bounds, p24.bounds)
  local z = m:partition { stages = 4, by = "cost", costs = costs, score = step, score_seconds = 0 }
  lu.assertEquals(z.bounds, plain.bounds)
  lu.assertEquals(error_of(m.partition, m, { stages = 4, by = "cost", costs = costs, score = 3 }),
    "partition: score must be a function(stage_costs) -> number, got 3")
  lu.assertStrContains(error_of(m.partition, m, { stages = 4, by = "cost", costs = costs,
    score = function() return "x" end }), "partition: score must return a number, got \"x\"")
end

-- by = "cost" builds, times and closes one layer at a time: when layer i
-- is built, layer i-1 is already closed (peak memory = one layer)
function test_partition_by_cost_builds_one_layer_at_a_time()
  local m = mlp()
  local built, order, open_before = {}, {}, 0
  m.build_layer = function(self, i, seed)
    for _, l in ipairs(built) do
      if pcall(l.numel, l) then open_before = open_before + 1 end
    end
    local l = nn.Model.build_layer(self, i, seed)
    built[#built + 1], order[#order + 1] = l, i
    return l
  end
  local p = m:partition { stages = 3, by = "cost", input_shape = { 3, 4 }, reps = 2 }
  -- the warm-up (up to all 8 layers of this small model), then the timed pass
  lu.assertTrue(#built > 8 and #built <= 16, "built " .. #built .. " layers")
  lu.assertEquals(table.move(order, #order - 7, #order, 1, {}), { 1, 2, 3, 4, 5, 6, 7, 8 })
  lu.assertEquals(open_before, 0, "a layer was still open when the next was built")
  for _, l in ipairs(built) do
    lu.assertFalse(pcall(l.numel, l), "a measured layer was left open")
  end
  lu.assertEquals(#p.costs, 8)
  for i = 1, 8 do lu.assertTrue(p.costs[i] > 0, "layer " .. i .. " has no measured cost") end
  lu.assertTrue(p.seconds >= 0 and p.seconds < 10)
  -- one layer's timing: seconds and its output (the next layer's input)
  local l = m:build_layer(1, 0)
  local t, y = core.nn_time_layer(l, nn.tensor({ 3, 4 }), 1, false)
  lu.assertTrue(t > 0)
  lu.assertEquals(y:shape(), { 3, 8 })
  l:close()
end

-- given bounds (a checkpoint's) are used as they are, and checked
function test_partition_given_bounds()
  local m = mlp()
  local p = m:partition { stages = 2, by = "cost", bounds = { { 1, 6 }, { 7, 8 } } }
  lu.assertEquals(p.bounds, { { first = 1, last = 6 }, { first = 7, last = 8 } })
  lu.assertEquals(p.by, "cost")
  lu.assertNil(p.costs) -- nothing measured
  lu.assertEquals(nn.bounds_text(p.bounds), "1-6 | 7-8")
  lu.assertEquals(error_of(m.partition, m, { stages = 2, bounds = { { 1, 6 }, { 8, 8 } } }),
    "partition: bounds: stage 1 holds layers 8..8, but it must start at layer 7 and "
    .. "hold at least one")
  lu.assertEquals(error_of(m.partition, m, { stages = 3, bounds = { { 1, 6 }, { 7, 8 } } }),
    "partition: bounds: 2 stages for 3 model stages")
  lu.assertEquals(error_of(m.partition, m, { stages = 2, bounds = { { 1, 3 }, { 4, 7 } } }),
    "partition: bounds: the stages end at layer 7, but the model has 8 layers")
end

-- train{} splits by measured cost unless told partition = "layers"
function test_train_partition_default_is_cost()
  local m = mlp()
  local r = train { model = m, schedule = "gpipe", pp = 1, microbatches = 1, data = data, steps = 1,
    quiet = true }
  lu.assertEquals(r.partition.by, "cost")
  lu.assertEquals(#r.partition.costs, 8)
  local q = train { model = m, schedule = "gpipe", pp = 1, microbatches = 1, data = data, steps = 1,
    quiet = true, partition = "layers" }
  lu.assertEquals(q.partition.by, "layers")
  lu.assertNil(q.partition.costs)
  lu.assertEquals(error_of(train, { model = m, schedule = "gpipe", pp = 1, microbatches = 1,
    data = data, partition = "flops" }),
    "luapipe.train: 'partition' must be \"cost\" or \"layers\", got \"flops\"")
end

-- Every stage of the partition starts with the full model's numbers.
local function assert_split_init(m, popts)
  local full = {}
  for _, p in ipairs(m:build(3):params()) do full[p.name] = p.value end
  local part = m:partition(popts)
  local n = 0
  for s = 0, part.stages - 1 do
    for _, p in ipairs(m:build_stage(part, s, 3):params()) do
      lu.assertEquals(p.value, full[p.name])
      n = n + 1
    end
  end
  lu.assertEquals(n, #m:build(3):params())
  return part
end

function test_split_does_not_change_init()
  assert_split_init(mlp(), { stages = 4 })
end

function test_train_one_rank_matches_reference()
  local m = mlp()
  local opt = { kind = "adamw", lr = 0.01 }
  for _, fam in ipairs({ "gpipe", "1f1b", "zb1p" }) do
    local r = train { model = m, schedule = fam, pp = 1, microbatches = 3, data = data, steps = 2,
      seed = 9, optimizer = opt, quiet = true }
    local ref = train.reference { model = m, microbatches = 3, data = data, steps = 2, seed = 9,
      optimizer = opt }
    lu.assertEquals(r.losses, ref.losses)
    local got, want = r.params(), ref.params()
    for name, v in pairs(want) do lu.assertEquals(got[name], v) end
  end
end

function test_train_errors()
  local m = mlp()
  lu.assertEquals(error_of(train, { model = m, schedule = "1f1b", pp = 2, microbatches = 4,
    data = data }),
    "schedule '1f1b' needs 2 ranks, but this is one process (run it with mpirun -np 2)")
  lu.assertStrContains(error_of(train, { model = m, schedule = "nope", pp = 1, data = data }),
    "unknown schedule 'nope'")
  lu.assertStrContains(error_of(train, { model = {}, schedule = "1f1b", data = data }),
    "'model' must be a luapipe.nn model")
  local bad = function(step, mb) return nn.tensor({ 3, 4 }), nn.tensor({ 3, 5 }) end
  lu.assertStrContains(error_of(train, { model = m, schedule = "gpipe", pp = 1, microbatches = 1,
    data = bad, quiet = true }), "loss of micro-batch 0 failed")
  -- a schedule whose messages deadlock is refused before anything runs
  local dl = require("luapipe.schedule").new { ranks = 2, stages = 2, microbatches = 1,
    actions = { [0] = { "0F0", "0RECV_B0", "0B0", "0SEND_F0" }, [1] = { "1RECV_F0", "1F0", "1B0",
    "1SEND_B0" } } }
  lu.assertEquals(error_of(train, { model = m, schedule = dl, microbatches = 1, data = data }),
    "luapipe.train: the schedule is invalid: deadlock under non-blocking sends and receives (a "
    .. "compute waits for the sends of its inputs): rank 0 waits at action 2 (0B0) for rank 1 to "
    .. "reach action 3 (1SEND_B0); rank 1 waits at action 1 (1F0) for rank 0 to reach "
    .. "action 3 (0SEND_F0)")
end

function test_overlapped_fb_hook()
  local m = mlp()
  local calls = 0
  local function hook(exec, pair)
    calls = calls + 1
    lu.assertStrContains(pair.text, "OVERLAP_F_B")
    assert(exec:run_half("F", pair.f_stage, pair.f_mb))
    assert(exec:run_half(pair.b_type, pair.b_stage, pair.b_mb))
  end
  local opt = { kind = "sgd", lr = 0.1 }
  local r = train { model = m, schedule = "dualpipev", pp = 1, microbatches = 4, data = data,
    steps = 2, seed = 2, optimizer = opt, quiet = true, overlapped_fb = hook }
  lu.assertTrue(calls > 0)
  local ref = train.reference { model = m, microbatches = 4, data = data, steps = 2, seed = 2,
    optimizer = opt }
  for k = 1, 2 do lu.assertAlmostEquals(r.losses[k], ref.losses[k], 1e-6 * ref.losses[k]) end
  -- a failing hook fails the step with its message
  local err = error_of(train, { model = m, schedule = "dualpipev", pp = 1, microbatches = 4,
    data = data, steps = 1, quiet = true,
    overlapped_fb = function() error("no overlap today") end })
  lu.assertStrContains(err, "overlapped_fb hook failed on (")
  lu.assertStrContains(err, "no overlap today")
  -- run_half outside a hook is misuse
  lu.assertStrContains(error_of(r.exec.run_half, r.exec, "F", 0, 0),
    "exec:run_half is only allowed inside an overlapped_fb hook")
end

-- an error after exec_new took the build function (here: a bad loss name)
-- must not pin it (and the model it closes over) in the registry
function test_exec_new_error_releases_build()
  local schedule = require("luapipe.schedule")
  local s = schedule.build("1f1b", { pp = 1, microbatches = 1 })
  local collected = false
  do
    local guard = setmetatable({}, { __gc = function() collected = true end })
    local build = function() return guard end
    lu.assertStrContains(error_of(core.exec_new, s, { build = build, data = data, loss = "hinge" }),
      'loss must be "mse" or "cross_entropy", got "hinge"')
  end
  collectgarbage()
  collectgarbage()
  lu.assertTrue(collected, "the build function stayed referenced after the error")
end


-- a chunk builder that raises (or returns no open Layer) after another
-- chunk was built: exec_new returns its message with the stage, frees the
-- half-built executor (the ASan run checks), and the process goes on
function test_exec_new_build_error_is_returned()
  local schedule = require("luapipe.schedule")
  local s = schedule.build("zbv", { pp = 1, microbatches = 2 }) -- two chunks on this rank
  local m = mlp()
  local part = m:partition { stages = 2, input_shape = { 3, 4 } }
  local shapes = { [1] = { 3, 8 } }
  local function exec_with(build)
    return core.exec_new(s, { build = build, data = data, loss = "mse", act_shapes = shapes })
  end
  local closed = m:build_stage(part, 1, 1)
  closed:close()
  local cases = {
    { function() error("stage 1 is broken", 0) end,
      "rank 0: building model stage 1: the build function raised: stage 1 is broken" },
    { function() error({ code = 7 }) end,
      "the build function raised: (error object is a table value)" },
    { function() return 42 end, "rank 0: building model stage 1: the build function must return a "
      .. "luapipe.Layer, got number" },
    { function() return closed end, "the build function must return a luapipe.Layer, got a closed "
      .. "luapipe.Layer" },
  }
  for _, c in ipairs(cases) do
    local exec, err = exec_with(function(stage)
      if stage == 0 then return m:build_stage(part, 0, 1) end
      return c[1]()
    end)
    lu.assertNil(exec)
    lu.assertStrContains(err, c[2])
    lu.assertNil(err:find("\n"), "one line: " .. err)
  end
  -- and through luapipe.train, in the train layer's words
  local broken = mlp()
  local orig = broken.build_stage
  broken.build_stage = function(self, p, stage, seed)
    if stage == 1 then error("stage 1 is broken", 0) end
    return orig(self, p, stage, seed)
  end
  lu.assertEquals(error_of(train, { model = broken, schedule = "zbv", pp = 1, microbatches = 2,
    data = data, quiet = true }),
    "luapipe.train: rank 0: building model stage 1: the build function raised: stage 1 is broken")
end

-- a family constraint the job breaks, worded from schedules.problem's
-- fields in terms of the processes mpirun started
function test_in_rank_terms()
  local schedules = require("luapipe.schedules")
  local odd = schedules.problem("dualpipe", 3, 8)
  lu.assertEquals(train.in_rank_terms(schedules.problem("dualpipe", 1, 8), 1, 1),
    "DualPipe needs an even number of ranks; this is one process (start it with mpirun "
    .. "-np 2 or more)")
  lu.assertEquals(train.in_rank_terms(odd, 3, 1), "DualPipe needs an even number of ranks; "
    .. "mpirun started 3")
  lu.assertEquals(train.in_rank_terms(odd, 6, 2),
    "DualPipe needs an even number of pipeline ranks; mpirun started 6 = pp 3 x ep 2")
  lu.assertEquals(train.in_rank_terms(schedules.problem("dualpipev", 4, 6), 4, 1),
    "DualPipeV needs at least 2 micro-batches per rank: 8 micro-batches on 4 ranks, got 6")
  lu.assertEquals(train.in_rank_terms(schedules.problem("chimera", 4, 6), 4, 1),
    "Chimera: microbatches must be a multiple of pp = 4, got 6")
  -- and through luapipe.train on this one process
  lu.assertEquals(error_of(train, { model = mlp(), schedule = "dualpipev", microbatches = 1,
    data = data, quiet = true }),
    "DualPipeV needs at least 2 micro-batches per rank: 2 micro-batches on 1 rank, got 1")
end
-- ---- mixture of experts ----

-- A small character-level MoE LM: two MoE transformer blocks (a sigmoid
-- router with groups and a shared expert; a softmax router with the
-- balance loss) between an embedding and the head.
local text = "the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. "
local chars, index = {}, {}
for c in text:gmatch(".") do
  if not index[c] then chars[#chars + 1] = c; index[c] = true end
end
table.sort(chars)
for i, c in ipairs(chars) do index[c] = i - 1 end
local V, T = #chars, 8

local function moe_lm()
  return nn.sequential {
    nn.embedding(V, 16),
    nn.moe_block { dim = 16, heads = 2, hidden = 16, experts = 4, topk = 2, groups = 2,
      topk_groups = 1, shared = 1, route_scale = 1.5, bias_speed = 0.001 },
    nn.moe_block { dim = 16, heads = 2, hidden = 16, experts = 4, topk = 2, router = "softmax",
      balance_alpha = 0.01 },
    nn.rmsnorm(16), nn.linear(16, V),
    loss = "cross_entropy",
  }
end

local function char_data(step, mb)
  local x, y = {}, {}
  for b = 0, 1 do
    local start = (step * 7 + mb * 13 + b * 29) % (#text - T - 1)
    for i = 1, T do
      x[b * T + i] = index[text:sub(start + i, start + i)]
      y[b * T + i] = index[text:sub(start + i + 1, start + i + 1)]
    end
  end
  return nn.tensor({ 2, T }, x), nn.tensor({ 2, T }, y)
end

function test_moe_spec()
  local s = nn.moe { dim = 8, hidden = 4, experts = 4, topk = 2, router = "softmax" }
  lu.assertEquals(s.kind, "moe")
  lu.assertEquals(s.topk, 2)
  lu.assertEquals(nn.moe { dim = 8, hidden = 4, experts = 4 }.topk, 1)
  lu.assertEquals(error_of(nn.moe, { dim = 8, hidden = 4, experts = 4, topk = 5 }),
    "nn.moe: topk (5) is more than experts (4)")
  lu.assertEquals(error_of(nn.moe, { dim = 8, hidden = 4, experts = 4, topk_group = 1 }),
    "nn.moe: unknown option 'topk_group'")
  lu.assertEquals(error_of(nn.moe, { dim = 8, hidden = 4, experts = 4, heads = 2 }),
    "nn.moe: unknown option 'heads'")
  lu.assertEquals(error_of(nn.moe_block, { dim = 8, hidden = 0, experts = 4 }),
    "nn.moe_block: 'hidden' must be a positive integer, got 0")
  lu.assertEquals(error_of(nn.moe, { dim = 8, hidden = 4, experts = 4, router = "relu" }),
    "nn.moe: router must be \"sigmoid\" or \"softmax\", got \"relu\"")
  -- the C side checks what needs the whole option set
  lu.assertStrContains(error_of(core.nn_layer, nn.moe { dim = 8, hidden = 4, experts = 6,
    groups = 4 }, "m", 1), "layer 'moe': 6 experts do not split into 4 groups")
  lu.assertStrContains(error_of(core.nn_layer, nn.moe { dim = 8, hidden = 4, experts = 6, topk = 3,
    groups = 3, topk_groups = 1 }, "m", 1),
    "topk_groups = 1 of 3 groups (2 experts each) cannot give topk = 3 experts")
  -- shapes and the mismatch message
  local m = moe_lm()
  lu.assertEquals(m:shapes({ 2, T })[2], { 2, T, 16 })
  local bad = nn.sequential { nn.embedding(V, 8), nn.moe { dim = 16, hidden = 4, experts = 2 } }
  lu.assertEquals(error_of(bad.shapes, bad, { 2, T }),
    "model layer 2 (moe 2 experts top-1) expects inputs [..., 16], got [2, 8, 8]")
end

function test_moe_layer_params_and_loads()
  local l = core.nn_layer(nn.moe { dim = 4, hidden = 3, experts = 4, topk = 2, shared = 1 },
    "layers.1", 5)
  local names = {}
  for _, p in ipairs(l:params()) do names[#names + 1] = p.name end
  lu.assertEquals(names[1], "layers.1.router.weight")
  lu.assertEquals(names[2], "layers.1.shared.w1")
  lu.assertEquals(names[5], "layers.1.experts.0.w1")
  lu.assertEquals(names[7], "layers.1.experts.0.w2")
  lu.assertEquals(#names, 1 + 3 + 4 * 3)
  lu.assertEquals(l:moe_count(), 1)
  local y = l:forward(nn.tensor({ 5, 4 }, { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
    17, 18, 19, 20 }))
  lu.assertEquals(y:shape(), { 5, 4 })
  local load = l:expert_load(1, true)
  lu.assertEquals(load[1] + load[2] + load[3] + load[4], 10)
  lu.assertEquals(l:expert_load(1), { 0, 0, 0, 0 })
  l:update_bias(1, { 9, 1, 0, 0 })
  lu.assertEquals(l:moe_bias(1), { 0, 0, 0, 0 }) -- bias_speed = 0: never moves
  lu.assertStrContains(error_of(l.expert_load, l, 2),
    "layer 'layers.1' has no MoE layer 2 (it has 1)")
  local lm = moe_lm():build(1)
  lu.assertEquals(lm:moe_count(), 2)
  lm:update_bias(1, { 5, 1, 1, 1 })
  local b = lm:moe_bias(1)
  for e, want in ipairs({ -0.001, 0.001, 0.001, 0.001 }) do
    lu.assertAlmostEquals(b[e], want, 1e-9)
  end
  lu.assertEquals(lm:moe_bias(2), { 0, 0, 0, 0 })
end

-- DeepSeek-V3's gate (its inference/model.py Gate.forward), written out
-- here from its definition: scores = sigmoid(x W^T) (softmax with
-- o.router = "softmax"); the bias only selects (scores + bias); with
-- groups, a group scores the sum of its two best biased scores (its best
-- score when bias is nil: a Gate without one) and the topk_groups best
-- groups stay eligible; the top-k eligible experts by biased score,
-- highest first; weights = their unbiased scores over the selected
-- scores' sum (not divided with o.norm_topk = false), times route_scale.
-- x: list of rows, W: list of E rows of D, bias: E numbers or nil.
local function deepseek_gate(x, W, bias, o)
  local E, G = #W, o.groups or 1
  local gs, TG = E // G, o.topk_groups or G
  local out = {}
  for t, row in ipairs(x) do
    local s, v, zmax = {}, {}, -math.huge
    for e = 1, E do
      local z = 0
      for d = 1, #row do z = z + row[d] * W[e][d] end
      s[e] = z
      zmax = math.max(zmax, z)
    end
    local zsum = 0
    for e = 1, E do zsum = zsum + math.exp(s[e] - zmax) end
    for e = 1, E do
      if o.router == "softmax" then
        s[e] = math.exp(s[e] - zmax) / zsum
      else
        s[e] = 1 / (1 + math.exp(-s[e]))
      end
      v[e] = s[e] + (bias and bias[e] or 0)
    end
    local eligible = {}
    if G > 1 then
      local gscore, order = {}, {}
      for g = 1, G do
        local vals = {}
        for e = (g - 1) * gs + 1, g * gs do vals[#vals + 1] = v[e] end
        table.sort(vals, function(a, b) return a > b end)
        gscore[g] = bias and vals[1] + (vals[2] or 0) or vals[1]
        order[g] = g
      end
      table.sort(order, function(a, b)
        if gscore[a] ~= gscore[b] then return gscore[a] > gscore[b] end
        return a < b
      end)
      for i = 1, TG do
        for e = (order[i] - 1) * gs + 1, order[i] * gs do eligible[e] = true end
      end
    else
      for e = 1, E do eligible[e] = true end
    end
    local cand = {}
    for e = 1, E do if eligible[e] then cand[#cand + 1] = e end end
    table.sort(cand, function(a, b)
      if v[a] ~= v[b] then return v[a] > v[b] end
      return a < b
    end)
    local experts, weights, sum = {}, {}, 0
    for k = 1, o.topk do sum = sum + s[cand[k]] end
    if o.norm_topk == false then sum = 1 end
    for k = 1, o.topk do
      experts[k] = cand[k] - 1 -- 0-based ids, as DeepSeek's indices
      weights[k] = (o.route_scale or 1) * s[cand[k]] / sum
    end
    out[t] = { experts = experts, weights = weights, scores = s }
  end
  return out
end

local function assert_routes_equal(got, want, tol)
  lu.assertEquals(#got, #want)
  for t = 1, #want do
    lu.assertEquals(got[t].experts, want[t].experts, "token " .. t)
    for k = 1, #want[t].weights do
      lu.assertAlmostEquals(got[t].weights[k], want[t].weights[k], tol)
    end
    for e = 1, #want[t].scores do
      lu.assertAlmostEquals(got[t].scores[e], want[t].scores[e], tol)
    end
  end
end

function test_moe_route_is_deepseek_v3_gate_by_hand()
  -- 8 experts in 4 groups of 2, 2 groups eligible, top-2, route_scale 2.5;
  -- dim 2 and x = (1, 0), so the logits are W's first column
  local opts = { dim = 2, hidden = 3, experts = 8, topk = 2, groups = 4, topk_groups = 2,
    route_scale = 2.5 }
  local l = core.nn_layer(nn.moe(opts), "m", 1)
  local logit = { 3.0, -3.0, 1.0, 1.2, 0.5, 0.5, -1.0, -1.0 }
  local w = {}
  for e = 1, 8 do w[2 * e - 1], w[2 * e] = logit[e], 0.25 * e end
  l:set_params { ["m.router.weight"] = w }
  local function sig(z) return 1 / (1 + math.exp(-z)) end
  local x = nn.tensor({ 1, 2 }, { 1, 0 })
  -- group scores (top-2 sums): g0 = s(3)+s(-3) = 1, g1 = s(1)+s(1.2) = 1.50,
  -- g2 = 2 s(0.5) = 1.245, g3 = 2 s(-1) = 0.54: groups 1 and 2 are eligible,
  -- so expert 0, the best single score, is not; the top 2 are 3 then 2
  local r = l:route(1, x)
  lu.assertEquals(#r, 1)
  lu.assertEquals(r[1].experts, { 3, 2 })
  local s3, s2 = sig(1.2), sig(1.0)
  lu.assertAlmostEquals(r[1].weights[1], 2.5 * s3 / (s3 + s2), 1e-6)
  lu.assertAlmostEquals(r[1].weights[2], 2.5 * s2 / (s3 + s2), 1e-6)
  for e = 1, 8 do lu.assertAlmostEquals(r[1].scores[e], sig(logit[e]), 1e-6) end
  -- a bias of 0.5 on expert 4 selects it first (biased 1.12 > 0.77), but
  -- its weight comes from its unbiased score
  l:set_moe_bias(1, { 0, 0, 0, 0, 0.5, 0, 0, 0 })
  lu.assertAlmostEquals(l:moe_bias(1)[5], 0.5, 1e-7)
  r = l:route(1, x)
  lu.assertEquals(r[1].experts, { 4, 3 })
  local s4 = sig(0.5)
  lu.assertAlmostEquals(r[1].weights[1], 2.5 * s4 / (s4 + s3), 1e-6)
  lu.assertAlmostEquals(r[1].weights[2], 2.5 * s3 / (s4 + s3), 1e-6)
  lu.assertAlmostEquals(r[1].scores[5], s4, 1e-6) -- scores stay unbiased
  -- a bias of 2 on expert 1 lifts group 0 (s(3) + s(-3) + 2 = 3) above the
  -- rest: groups 0 and 2 (1.12 + 0.62) are eligible; then experts 1
  -- (biased 2.05) and 4 (1.12), ahead of expert 0 (0.95); expert 1's
  -- weight is still its small unbiased score's share
  l:set_moe_bias(1, { 0, 2, 0, 0, 0.5, 0, 0, 0 })
  r = l:route(1, x)
  lu.assertEquals(r[1].experts, { 1, 4 })
  local s1 = sig(-3)
  lu.assertAlmostEquals(r[1].weights[1], 2.5 * s1 / (s1 + s4), 1e-6)
  lu.assertAlmostEquals(r[1].weights[2], 2.5 * s4 / (s1 + s4), 1e-6)
  -- the route asks nothing of the loads
  lu.assertEquals(l:expert_load(1), { 0, 0, 0, 0, 0, 0, 0, 0 })
end

function test_moe_route_matches_deepseek_v3_gate()
  local opts = { dim = 6, hidden = 4, experts = 16, topk = 4, groups = 4, topk_groups = 2,
    route_scale = 2.5 }
  local l = core.nn_layer(nn.moe(opts), "layers.3", 11)
  local W, Wv = {}, l:params()[1].value
  for e = 1, 16 do
    W[e] = {}
    for d = 1, 6 do W[e][d] = Wv[(e - 1) * 6 + d] end
  end
  local rows, flat = {}, {}
  for t = 1, 24 do
    rows[t] = {}
    for d = 1, 6 do
      local v = 3 * math.sin(1.7 * t + 0.9 * d)
      rows[t][d] = v
      flat[#flat + 1] = v
    end
  end
  local bias = {}
  for e = 1, 16 do bias[e] = 0.05 * math.cos(2.3 * e) end
  l:set_moe_bias(1, bias)
  local stored = l:moe_bias(1)
  for e = 1, 16 do bias[e] = stored[e] end -- the float32 values the layer holds
  local got = l:route(1, nn.tensor({ 24, 6 }, flat))
  assert_routes_equal(got, deepseek_gate(rows, W, bias, opts), 1e-5)
  -- the group limit and the bias both change selections here (else this
  -- test could not see them)
  local zero = {}
  for e = 1, 16 do zero[e] = 0 end
  local plain = deepseek_gate(rows, W, zero, { topk = 4 })
  local grouped = deepseek_gate(rows, W, zero, opts)
  local biased = deepseek_gate(rows, W, bias, { topk = 4 })
  local dg, db = 0, 0
  for t = 1, 24 do
    local p = table.concat(plain[t].experts, ",")
    if table.concat(grouped[t].experts, ",") ~= p then dg = dg + 1 end
    if table.concat(biased[t].experts, ",") ~= p then db = db + 1 end
  end
  lu.assertTrue(dg > 5 and db > 5, string.format("groups changed %d tokens, bias %d", dg, db))
  -- [batch, seq, dim] is the same tokens in order
  assert_routes_equal(l:route(1, nn.tensor({ 4, 6, 6 }, flat)), got, 0)
  -- without groups
  local flat_opts = { dim = 6, hidden = 4, experts = 16, topk = 3 }
  local u = core.nn_layer(nn.moe(flat_opts), "layers.3", 11)
  assert_routes_equal(u:route(1, nn.tensor({ 24, 6 }, flat)),
    deepseek_gate(rows, W, zero, flat_opts), 1e-5)
  -- the forward routes the same way: its loads are the route's counts
  l:forward(nn.tensor({ 24, 6 }, flat))
  local count = {}
  for e = 1, 16 do count[e] = 0 end
  for _, t in ipairs(got) do
    for _, e in ipairs(t.experts) do count[e + 1] = count[e + 1] + 1 end
  end
  lu.assertEquals(l:expert_load(1), count)
  -- softmax affinities: scores sum to 1, the weights are normalised and scaled
  local sm = core.nn_layer(nn.moe { dim = 6, hidden = 4, experts = 16, topk = 2, router = "softmax",
    route_scale = 2 }, "layers.3", 11)
  for _, t in ipairs(sm:route(1, nn.tensor({ 24, 6 }, flat))) do
    local sum = 0
    for e = 1, 16 do sum = sum + t.scores[e] end
    lu.assertAlmostEquals(sum, 1, 1e-5)
    lu.assertAlmostEquals(t.weights[1] + t.weights[2], 2, 1e-5)
    lu.assertTrue(t.scores[t.experts[1] + 1] >= t.scores[t.experts[2] + 1])
  end
end

-- The Gate's other modes through nn.moe's options: without a correction
-- bias (groups scored by their best score: DeepSeek-V2's softmax gate with
-- raw weights), softmax with a bias and raw weights, sigmoid without a
-- bias; each against the written-out gate, and the group rule matters here
function test_moe_route_gate_options()
  local rows, flat = {}, {}
  for t = 1, 24 do
    rows[t] = {}
    for d = 1, 6 do
      local v = 3 * math.sin(1.3 * t + 0.7 * d)
      rows[t][d] = v
      flat[#flat + 1] = v
    end
  end
  local bias = {}
  for e = 1, 16 do bias[e] = 0.02 * math.cos(1.9 * e) end
  local base = { dim = 6, hidden = 4, experts = 16, topk = 3, groups = 4, topk_groups = 2 }
  local modes = {
    { router = "softmax", correction_bias = false, norm_topk = false, route_scale = 16 },
    { router = "softmax", norm_topk = false, route_scale = 2.5 },
    { correction_bias = false, route_scale = 2.5 },
  }
  for i, mode in ipairs(modes) do
    local opts = {}
    for k, v in pairs(base) do opts[k] = v end
    for k, v in pairs(mode) do opts[k] = v end
    local l = core.nn_layer(nn.moe(opts), "layers.2", 7)
    local W, Wv = {}, l:params()[1].value
    for e = 1, 16 do
      W[e] = {}
      for d = 1, 6 do W[e][d] = Wv[(e - 1) * 6 + d] end
    end
    local b = nil
    if mode.correction_bias ~= false then
      l:set_moe_bias(1, bias)
      b = l:moe_bias(1)
    end
    local got = l:route(1, nn.tensor({ 24, 6 }, flat))
    assert_routes_equal(got, deepseek_gate(rows, W, b, opts), 1e-5)
    if not b then
      -- the other group rule (two best) would route some tokens elsewhere
      local zero = {}
      for e = 1, 16 do zero[e] = 0 end
      local other, n = deepseek_gate(rows, W, zero, opts), 0
      for t = 1, 24 do
        if table.concat(other[t].experts, ",") ~= table.concat(got[t].experts, ",") then
          n = n + 1
        end
      end
      lu.assertTrue(n > 0, "mode " .. i .. ": the group rule changed no token")
    end
  end
  -- a layer without a bias takes only zeros; bad values are one line
  local l = core.nn_layer(nn.moe { dim = 4, hidden = 3, experts = 4, topk = 2,
    correction_bias = false }, "layers.1", 5)
  l:set_moe_bias(1, { 0, 0, 0, 0 })
  lu.assertEquals(error_of(l.set_moe_bias, l, 1, { 0, 0.5, 0, 0 }),
    "set_moe_bias: MoE layer 1 of 'layers.1' has no correction bias (correction_bias = false), "
      .. "but bias[2] is 0.5")
  lu.assertEquals(error_of(nn.moe, { dim = 4, hidden = 3, experts = 4, norm_topk = 1 }),
    "nn.moe: 'norm_topk' must be true or false, got 1")
  lu.assertEquals(error_of(nn.moe, { dim = 4, hidden = 3, experts = 4, correction_bias = false,
    bias_speed = 0.01 }),
    "nn.moe: bias_speed = 0.01 moves a correction bias the layer does not have "
      .. "(correction_bias = false)")
end

function test_moe_route_errors()
  local l = core.nn_layer(nn.moe { dim = 4, hidden = 3, experts = 4, topk = 2 }, "layers.1", 5)
  lu.assertEquals(error_of(l.route, l, 1, nn.tensor({ 3, 5 })),
    "route: MoE layer 1 of 'layers.1' takes x as [tokens, 4] or [batch, seq, 4], got [3, 5]")
  lu.assertStrContains(error_of(l.route, l, 2, nn.tensor({ 3, 4 })),
    "layer 'layers.1' has no MoE layer 2 (it has 1)")
  lu.assertEquals(error_of(l.set_moe_bias, l, 1, { 0, 0, 0 }),
    "set_moe_bias: MoE layer 1 of 'layers.1' has 4 experts, but the bias has 3 entries")
  lu.assertEquals(error_of(l.set_moe_bias, l, 1, { 0, "x", 0, 0 }),
    "set_moe_bias: bias[2] (expert 1) must be a finite number, got string")
  lu.assertEquals(error_of(l.set_moe_bias, l, 1, 0.5),
    "set_moe_bias: the bias must be a list of 4 numbers (one per expert), got a number")
  lu.assertEquals(l:route(1, nn.tensor({ 0, 4 })), {})
  -- a whole model: the MoE layers inside, counted from 1
  local lm = moe_lm():build(1)
  lm:set_moe_bias(2, { 0.1, 0, 0, -0.1 })
  lu.assertAlmostEquals(lm:moe_bias(2)[1], 0.1, 1e-7)
  lu.assertEquals(lm:moe_bias(1), { 0, 0, 0, 0 })
  lu.assertEquals(#lm:route(2, nn.tensor({ 2, 3, 16 }))[6].experts, 2)
end

function test_moe_partition_and_split_init()
  local m = moe_lm()
  local p = m:partition { stages = 2 }
  lu.assertEquals(p.bounds, { { first = 1, last = 3 }, { first = 4, last = 5 } })
  local q = assert_split_init(m, { stages = 3, by = "cost", input_shape = { 2, T }, reps = 1 })
  lu.assertEquals(#q.costs, 5)
end

function test_moe_lm_trains_on_one_rank()
  local m = moe_lm()
  local opt = { kind = "adamw", lr = 0.02 }
  local r = train { model = m, schedule = "1f1b", pp = 1, microbatches = 2, data = char_data,
    steps = 40, seed = 4, optimizer = opt, quiet = true }
  local first, last = r.losses[1], r.losses[40]
  print(string.format("# moe lm: loss %.4f -> %.4f over 40 steps", first, last))
  lu.assertTrue(last < 0.6 * first)
  -- the same steps without the executor (reference) agree
  local ref = train.reference { model = m, microbatches = 2, data = char_data, steps = 3, seed = 4,
    optimizer = opt }
  for k = 1, 3 do lu.assertAlmostEquals(r.losses[k], ref.losses[k], 1e-6 * ref.losses[k]) end
end

-- EPLB in the loop on one rank (ep = 1, two redundant slots): plans every
-- 2 steps, replicas of hot experts; the losses stay the reference's
function test_moe_eplb_one_rank()
  local m = moe_lm()
  local opt = { kind = "adamw", lr = 0.02 }
  local r = train { model = m, schedule = "1f1b", pp = 1, microbatches = 2, data = char_data,
    steps = 6, seed = 4, optimizer = opt, quiet = true, eplb = { every = 2, redundant = 2 } }
  local ref = train.reference { model = m, microbatches = 2, data = char_data, steps = 6, seed = 4,
    optimizer = opt }
  for k = 1, 6 do lu.assertAlmostEquals(r.losses[k], ref.losses[k], 1e-5 * ref.losses[k]) end
  lu.assertEquals(r.summary.eplb.plans, 3)
  lu.assertEquals(#r.summary.eplb.placements[1], 4 + 2) -- 4 experts + 2 redundant slots
  lu.assertEquals(r.summary.eplb.before, 1) -- one EP rank: always balanced
  lu.assertStrContains(error_of(train, { model = m, schedule = "1f1b", data = char_data,
    eplb = { every = 0 } }), "eplb.every must be a positive integer, got 0")
  lu.assertStrContains(error_of(train, { model = m, schedule = "1f1b", data = char_data, ep = 2 }),
    "ep = 2 needs a multiple of 2 ranks (pp x ep), but this is one process")
  lu.assertStrContains(error_of(train, { model = m, schedule = "1f1b", data = char_data, pp = 1,
    ep = 2 }), "pp x ep = 1 x 2 needs 2 ranks, but this is one process (run it with mpirun -np 2)")
end

-- train's failures are luapipe.Error values: the text as before (tostring),
-- the option and the user's line as fields; nothing ends the process.
function test_train_errors_are_values()
  local ok, e = pcall(train, { model = mlp(), schedule = "1f1b", data = data, steps = "ten" })
  lu.assertFalse(ok)
  lu.assertTrue(require("luapipe.util").is_error(e))
  lu.assertEquals(e.option, "steps")
  lu.assertEquals(e.what, "luapipe.train: 'steps' must be a non-negative integer, got \"ten\"")
  lu.assertStrContains(e.file, "test_nn.lua")
  lu.assertEquals(tostring(e), string.format("%s:%d: %s", e.file, e.line, e.what))
  ok, e = pcall(train, { model = mlp(), schedule = "1f1b", data = data, partition = "even" })
  lu.assertFalse(ok)
  lu.assertEquals(e.option, "partition")
  lu.assertNil(e.file) -- found after the checks of the call itself: no line of the user's to name
  lu.assertEquals(tostring(e), "luapipe.train: 'partition' must be \"cost\" or \"layers\", "
    .. "got \"even\"")
  lu.assertNil(e.stranded) -- one process: nothing waits
end

-- Layer constructors check their arguments: the message names the
-- constructor and the argument as the user wrote it, raised at the caller
-- (never an internal "attempt to ..." from deep in luapipe).
function test_constructor_arguments()
  local cases = {
    { function() local s = nn.linear("a", 3); return s end,
      'nn.linear: din (argument 1) must be a positive integer, got "a"' },
    { function() local s = nn.linear(4, 1.5); return s end,
      "nn.linear: dout (argument 2) must be a positive integer, got 1.5" },
    { function() local s = nn.linear(0, 3); return s end,
      "nn.linear: din (argument 1) must be a positive integer, got 0" },
    { function() local s = nn.linear(2 ^ 40, 3); return s end,
      "nn.linear: din (argument 1) must be a positive integer" },
    { function() local s = nn.linear(4, 3, 5); return s end,
      "nn.linear: opts (argument 3) must be nil or {bias = true|false}, got 5" },
    { function() local s = nn.rmsnorm("x"); return s end,
      'nn.rmsnorm: dim (argument 1) must be a positive integer, got "x"' },
    { function() local s = nn.rmsnorm(4, "e"); return s end,
      'nn.rmsnorm: eps (argument 2) must be a positive number (or nil), got "e"' },
    { function() local s = nn.embedding(10); return s end,
      "nn.embedding: dim (argument 2) must be a positive integer, got nil" },
    { function() local s = nn.mlp_block(4, 8, "relu"); return s end,
      'nn.mlp_block: act (argument 3) must be "gelu" or "silu"' },
    { function() local s = nn.attention(4, 3); return s end,
      "nn.attention: d_model (4) must be a multiple of heads (3)" },
    { function() local s = nn.transformer_block(8, "2", 16); return s end,
      'nn.transformer_block: heads (argument 2) must be a positive integer, got "2"' },
    { function() local s = nn.residual(5); return s end,
      "nn.residual: inner (argument 1) must be a layer spec" },
    { function() local s = nn.moe { dim = 4, hidden = 4, experts = 2, topk = "x" }; return s end,
      "nn.moe: 'topk' must be a positive integer, got \"x\"" },
  }
  for _, c in ipairs(cases) do
    local ok, err = pcall(c[1])
    lu.assertFalse(ok)
    lu.assertStrContains(err, c[2])
    -- raised at this file's line (no tail call in the cases), not inside nn.lua
    lu.assertStrContains(err, "test_nn.lua:")
  end
  -- whole floats are integers; a good spec still builds
  lu.assertEquals(nn.linear(4.0, 3).din, 4)
  lu.assertEquals(math.type(nn.linear(4.0, 3).din), "integer")
  local layer = nn.sequential { nn.attention(8, 2), loss = "mse" }:build_layer(1, 0)
  lu.assertNotNil(layer)
end

os.exit(lu.LuaUnit.run())
