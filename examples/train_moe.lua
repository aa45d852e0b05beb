-- train_moe.lua — a small character-level mixture-of-experts LM trained on
-- a pp x ep grid of ranks: the pipeline schedule over pp ranks, each MoE
-- layer's experts spread over ep ranks (tokens exchanged by all-to-all-v),
-- optionally rebalanced by EPLB during training.
--
--   mpirun --oversubscribe -np 4 luapipe examples/train_moe.lua --schedule dualpipe \
--     --pp 2 --ep 2 --steps 20 --redundant 1 --eplb-every 5 --link lat=50us,bw=2GB/s
--
-- Rank 0 prints "step K loss X" per step, then the measured-vs-simulated
-- summary, whose "all-to-all:" line gives the share of all-to-all time
-- overlapped by compute on the same rank ("P% hidden under compute") and
-- whose "expert load" line the EP ranks' token load, max over mean, before
-- and after rebalancing (with EPLB). --report FILE writes these figures as
-- key=value lines. --reference trains the same model in one process
-- instead: give it the same options (--pp sets the micro-batch count,
-- 2 x pp, as in the pipeline run) and it prints the same losses.
local argparse = require("argparse")
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local comm = require("luapipe.comm")

local cli = require("luapipe.cli")
local topts = require("luapipe.cli.train_options") -- the options every example takes
local count = require("luapipe.util").count -- "1 rank", "2 ranks"
-- options: the CLI's converters (a bad value is one line, exit 2, once)
local int, INT32 = cli.int_option, 0x7fffffff
local limits = require("luapipe.cli.common").limits

local parser = argparse("train_moe.lua", "Train a char-level MoE LM on a pp x ep grid of ranks.")
topts.add(parser, { schedule = "dualpipe", microbatches_help = "2 x pp", steps = 20,
  steps_min = 0 })
parser:option("--pp", "Pipeline ranks (default: ranks / ep).")
  :convert(int("--pp", 1, limits.pp))
parser:option("--ep", "Expert-parallel ranks per pipeline rank.", "1"):convert(int("--ep", 1, 4096))
parser:option("--experts", "Routed experts per MoE layer.", "8"):convert(int("--experts", 1, 4096))
parser:option("--topk", "Experts per token.", "2"):convert(int("--topk", 1, 4096))
parser:option("--redundant", "EPLB: extra expert slots per EP rank.", "0")
  :convert(int("--redundant", 0, 4096))
parser:option("--eplb-every", "EPLB: re-plan every N steps (0: no EPLB).", "0")
  :convert(int("--eplb-every", 0, INT32))
parser:option("--link", "Emulated link, e.g. lat=50us,bw=2GB/s (also LUAPIPE_LINK).")
parser:option("--blocks", "MoE transformer blocks.", "4"):convert(int("--blocks", 1, 4096))
parser:option("--dim", "Model width.", "32"):convert(int("--dim", 2, 65536))
parser:option("--hidden", "Hidden size of each expert.", "32"):convert(int("--hidden", 1, 65536))
parser:option("--context", "Characters per sequence.", "32"):convert(int("--context", 1, 65536))
parser:option("--batch", "Sequences per micro-batch (a multiple of ep).", "4")
  :convert(int("--batch", 1, 65536))
parser:option("--lr", "AdamW learning rate.", "0.005")
  :convert(cli.number_option("--lr", 0, math.huge))
parser:option("--text", "Training text.", "/usr/share/common-licenses/GPL-3")
parser:flag("--reference", "Train the same model in one process (no pipeline, no EP).")
parser:option("--fb-order", "Overlapped pairs: \"auto\" (the executor's default: "
  .. "whichever half can go on, weight-grads while both wait), \"deepseek\" (DeepSeek-V3's "
  .. "fixed alternation, backward first) or \"forward-first\" (fixed alternation, forward first); "
  .. "the last two by an overlapped_fb hook, for comparison.", "auto")
  :choices { "auto", "deepseek", "forward-first" }
local args = cli.parse(parser, arg, "train_moe.lua", comm.rank() ~= 0)
  or cli.usage_exit("train_moe.lua")
topts.check(args, "train_moe.lua")

local ep = args.ep
local pp = args.pp or math.max(1, comm.size() // ep)
local steps, seed = args.steps, args.seed
local E, K = args.experts, args.topk
local redundant, every = args.redundant, args.eplb_every
local blocks, D = args.blocks, args.dim
local H, T, B = args.hidden, args.context, args.batch
local Mb = args.microbatches or 2 * pp -- (--reference; the pipeline run: train{}'s, the same)
local lr = args.lr
if K > E then
  cli.usage_exit("train_moe.lua", string.format("--topk %d is more than --experts %d", K, E))
end

local f = io.open(args.text, "rb")
if not f then
  cli.usage_exit("train_moe.lua", "cannot read the training text " .. args.text)
end
local text = f:read("a")
f:close()
local seen, chars = {}, {}
for c in text:gmatch(".") do
  if not seen[c] then seen[c] = true; chars[#chars + 1] = c end
end
table.sort(chars)
local id = {}
for i, c in ipairs(chars) do id[c] = i - 1 end
local V = #chars
local ids = {}
for i = 1, #text do ids[i] = id[text:sub(i, i)] end

local specs = { nn.embedding(V, D) }
for _ = 1, blocks do
  specs[#specs + 1] = nn.moe_block { dim = D, heads = 2, hidden = H, experts = E, topk = K,
    shared = 1, bias_speed = 0.001 }
end
specs[#specs + 1] = nn.rmsnorm(D)
specs[#specs + 1] = nn.linear(D, V)
specs.loss = "cross_entropy"
local model = nn.sequential(specs)

local function offset(step, mb, b)
  local x = seed
  for _, v in ipairs({ step, mb, b }) do
    x = (x * 6364136223846793005 + v * 1442695040888963407 + 1) & 0x7fffffffffffffff
    x = x ~ (x >> 31)
  end
  return x % (#ids - T - 1)
end

local function data(step, mb)
  local x, y = {}, {}
  for b = 0, B - 1 do
    local o = offset(step, mb, b)
    for t = 1, T do
      x[b * T + t] = ids[o + t]
      y[b * T + t] = ids[o + t + 1]
    end
  end
  return nn.tensor({ B, T }, x), nn.tensor({ B, T }, y)
end

local optimizer = { kind = "adamw", lr = lr, weight_decay = 0.01 }

-- --fb-order deepseek / forward-first: a fixed alternation of the two
-- halves' phases (each advance starts an exchange), scripted with the
-- overlapped_fb hook: backward first, the weight-grads of the blocks it
-- finished right after it and the forward's count exchange glued to its
-- attention (DeepSeek-V3's order), or forward first. The default (auto) is
-- the executor's own: whichever half can go on.
local overlapped_fb
if args.fb_order ~= "auto" then
  local backward_first = args.fb_order == "deepseek"
  overlapped_fb = function(exec, pair)
    assert(exec:begin_half("F", pair.f_stage, pair.f_mb))
    assert(exec:begin_half(pair.b_type, pair.b_stage, pair.b_mb))
    local function advance(which)
      local done, err = exec:advance(which)
      if done == nil then error(err, 0) end
      return done
    end
    local fd, bd = false, false
    while not (fd and bd) do
      if backward_first and not bd then
        bd = advance("B")
        while not bd and exec:weight_grad_part() do end
      end
      if not fd then fd = advance("F") end
      if backward_first and not fd and exec:phase("F") == "dispatch" then fd = advance("F") end
      if not backward_first and not bd then bd = advance("B") end
    end
  end
end

if args.reference then
  if args.device ~= "cpu" then
    cli.usage_exit("train_moe.lua", "--reference runs on the CPU only (got --device "
      .. args.device .. ")")
  end
  print(string.format("train_moe (reference, one process): %s, %s top-%d, %s of %dx%d",
    count(blocks, "MoE block"), count(E, "expert"), K, count(Mb, "micro-batch"), B, T))
  train.reference { model = model, data = data, steps = steps, microbatches = Mb, seed = seed,
    optimizer = optimizer, verbose = true, precision = args.precision }
  return
end

local r = train(topts.train_fields(args, { model = model, pp = pp, ep = ep, data = data,
  optimizer = optimizer, link = args.link,
  eplb = every > 0 and { every = every, redundant = redundant } or nil,
  overlapped_fb = overlapped_fb,
  announce = function(info) -- rank 0, once train{} has checked the options (pp x ep = the ranks)
    print(string.format("train_moe: %s on pp %d x ep %d = %s, %s, %s top-%d, "
      .. "%s of %dx%d chars%s", args.schedule, pp, ep, count(comm.size(), "rank"),
      count(blocks, "MoE block"),
      count(E, "expert"), K, count(info.microbatches, "micro-batch"), B, T,
      every > 0 and string.format(", EPLB every %s with %s per EP rank", count(every, "step"),
        count(redundant, "redundant slot")) or ""))
  end }))
-- (the summary above has the all-to-all and expert-load figures)
local e = r.summary and r.summary.eplb
topts.finish(args, r, { "steps", "step_ms", "predicted_ms", "ratio", "bubble_pct", "sim_bubble_pct",
  "compute_pct", "wait_pct", "a2a_count", "a2a_ms", "a2a_blocked_ms", "a2a_link_ms",
  "a2a_hidden_pct",
  "sim_a2a_ms", "sim_a2a_hidden_pct", "model_ms", "replay_ms", "replay_step_ms", "replay_ratio",
  "spread_ms", "spread_ratio" }, e and { "load_before=" .. tostring(e.before),
  "load_after=" .. tostring(e.after), string.format("bytes_moved=%d", e.bytes) } or nil)
