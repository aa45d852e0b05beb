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
-- --eval-every N holds out the text's last tenth and prints the loss on it
-- ("eval after step K: held-out loss X") every N steps; --sample N prints N
-- generated characters at the end. --checkpoint DIR --every N saves (and
-- after the last step), --resume continues: the options every example
-- takes, luapipe.cli.train_options.
local argparse = require("argparse")
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local comm = require("luapipe.comm")
local cli = require("luapipe.cli")
local topts = require("luapipe.cli.train_options") -- the options every example takes
local count = require("luapipe.util").count -- "1 rank", "2 ranks"
-- options: the CLI's converters (a bad value is one line, exit 2)
local int, INT32 = cli.int_option, 0x7fffffff

local parser = argparse("train_char_lm.lua", "Train a char-level transformer with a pipeline schedule.")
topts.add(parser, { schedule = "1f1b", microbatches = 8, steps = 150 })
parser:option("--blocks", "Transformer blocks.", "6"):convert(int("--blocks", 1, 4096))
parser:option("--dim", "Model width.", "64"):convert(int("--dim", 1, 65536))
parser:option("--heads", "Attention heads.", "4"):convert(int("--heads", 1, 65536))
parser:option("--context", "Characters per sequence.", "64"):convert(int("--context", 1, 65536))
parser:option("--batch", "Sequences per micro-batch.", "4"):convert(int("--batch", 1, 65536))
parser:option("--lr", "AdamW learning rate.", "0.005"):convert(cli.number_option("--lr", 0, math.huge))
parser:option("--text", "Training text.", "/usr/share/common-licenses/GPL-3")
parser:option("--eval-every", "Hold out the text's last tenth (training reads the rest) and print the "
  .. "model's loss on it every N steps and after the last.")
  :convert(int("--eval-every", 1, INT32))
parser:option("--sample", "After training, print N characters the model generates (after a prompt: "
  .. "the text before its last tenth).")
  :convert(int("--sample", 1, 100000))
parser:option("--temperature", "--sample: 0 picks the likeliest character (greedy); above 0 draws "
  .. "from the softmax of logits / temperature, with --seed.", "0")
  :convert(cli.number_option("--temperature", 0, 100))
parser:option("--write-tokens", "Write the text's character ids as a token file (uint16, nanoGPT's "
  .. "train.bin format) to this path and stop: the file --data reads.")
parser:option("--data", "Train from this token file (nanoGPT's uint16 train.bin or an llm.c shard, "
  .. "made by --write-tokens from the same --text, which gives the vocabulary): memory-mapped, "
  .. "sequences in a seeded order, a resume continues where the run stopped.")
parser:flag("--show", "Print the schedule (simulated Gantt chart) before training.")
local args = cli.parse(parser, arg, "train_char_lm.lua", comm.rank() ~= 0) or cli.usage_exit("train_char_lm.lua")
topts.check(args, "train_char_lm.lua")

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
-- --eval-every: the last tenth of the text is held out (never trained on)
local ntrain = args.eval_every and #ids - #ids // 10 or #ids
if ntrain < T + 2 or (args.eval_every and #ids - ntrain < T + 1) then
  cli.usage_exit("train_char_lm.lua", string.format("the text %s (%d characters) is too short for"
    .. " --context %d%s", args.text, #ids, T, args.eval_every and " with a tenth held out" or ""))
end

if args.write_tokens then -- the token file of this text, then stop
  if comm.rank() == 0 then
    local zero = {}
    for i = 1, #ids do zero[i] = ids[i] end
    require("luapipe.data").write_tokens(args.write_tokens, zero)
    print(string.format("wrote %s: %d tokens (uint16), vocabulary %d from %s", args.write_tokens, #ids, V,
      args.text))
  end
  os.exit(0)
end
if args.data and args.eval_every then
  cli.usage_exit("train_char_lm.lua", "--eval-every holds out the tail of --text; with --data the "
    .. "held-out text would be a separate file: use one or the other")
end

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
  return x % (ntrain - T - 1)
end

local data
local function text_data(step, mb)
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
data = text_data
if args.data then -- a token file: its ids must be this text's characters
  local ok, ds = pcall(require("luapipe.data").tokens, args.data,
    { seq_len = T, vocab = V, shuffle = true, seed = args.seed })
  if not ok then cli.usage_exit("train_char_lm.lua", require("luapipe.util").message(ds)) end
  local m = topts.microbatches(args) -- nil: a schedule file's own count
  if not m then
    local s = require("luapipe.schedule").load(args.schedule, { pp = comm.size() })
    m = s and s:info().microbatches or 2 * comm.size()
  end
  data = ds:batches { microbatches = m, rows = args.batch }
end

-- the held-out loss: mean cross-entropy (nats per character) of the
-- whole model over up to 16 windows spread evenly over the held-out tail
local function held_out_loss(layer)
  local n = math.min(16, (#ids - ntrain) // (T + 1))
  local stride = (#ids - ntrain - T - 1) // math.max(1, n - 1)
  local x, y = {}, {}
  for w = 0, n - 1 do
    local o = ntrain + w * stride
    for t = 1, T do x[w * T + t], y[w * T + t] = ids[o + t], ids[o + t + 1] end
  end
  local logits = layer:forward(nn.tensor({ n, T }, x)):totable()
  local sum = 0
  for p = 0, n * T - 1 do
    local mx = -math.huge
    for v = 1, V do mx = math.max(mx, logits[p * V + v]) end
    local z = 0
    for v = 1, V do z = z + math.exp(logits[p * V + v] - mx) end
    sum = sum + math.log(z) + mx - logits[p * V + y[p + 1] + 1]
  end
  return sum / (n * T), n * T
end

-- --sample N: N characters after a prompt (the T characters where the
-- text's last tenth starts): each the likeliest next one, or drawn with
-- --temperature and --seed
local function sample(layer, n)
  local ctx, at = {}, #ids - #ids // 10
  for i = at - T + 1, at do ctx[#ctx + 1] = ids[i] end
  local state, out = args.seed, {}
  for _ = 1, n do
    local w = math.min(#ctx, T)
    local logits = layer:forward(nn.tensor({ 1, w }, table.move(ctx, #ctx - w + 1, #ctx, 1, {}))):totable()
    local base, pick = (w - 1) * V, 0
    if args.temperature == 0 then
      for v = 1, V - 1 do if logits[base + v + 1] > logits[base + pick + 1] then pick = v end end
    else
      local mx, p, z = -math.huge, {}, 0
      for v = 1, V do mx = math.max(mx, logits[base + v]) end
      for v = 1, V do p[v] = math.exp((logits[base + v] - mx) / args.temperature); z = z + p[v] end
      state = (state * 6364136223846793005 + 1442695040888963407) & 0x7fffffffffffffff
      local u, acc = ((state >> 11) / (1 << 52)) * z, 0
      pick = V - 1
      for v = 1, V do
        acc = acc + p[v]
        if u < acc then pick = v - 1; break end
      end
    end
    ctx[#ctx + 1] = pick
    out[#out + 1] = chars[pick + 1]
  end
  return table.concat(out)
end

local function announce(info) -- rank 0, once train{} has checked the options
  print(string.format("train_char_lm: %s on %s, vocab %d (ln V = %.3f), %s, %s of %dx%d chars",
    args.schedule, count(comm.size(), "rank"), V, math.log(V), count(model:nlayers(), "layer"),
    count(info.microbatches, "micro-batch"), args.batch, T))
  if args.show then
    local s = require("luapipe.schedule").load(args.schedule, { pp = info.ranks,
      microbatches = info.microbatches, chunks = args.chunks })
    if s then
      print("the schedule, simulated with the default costs (F=1 B=2 I=W=1):")
      print(s:gantt())
    end
  end
end
local result = train(topts.train_fields(args, { model = model, data = data,
  optimizer = { kind = "adamw", lr = args.lr, weight_decay = 0.01 }, announce = announce,
  eval = args.eval_every and { every = args.eval_every, fn = function(step, layer)
    local loss, n = held_out_loss(layer)
    print(string.format("eval after step %d: held-out loss %.6f (%d characters)", step, loss, n))
    io.stdout:flush()
  end } or nil }))
topts.finish(args, result)
if args.sample then
  local layer = result.model() -- collective: the whole model on rank 0
  if layer then
    print(string.format("sample (%s, %s):", count(args.sample, "character"), args.temperature == 0
      and "greedy" or string.format("temperature %g, seed %d", args.temperature, args.seed)))
    print(sample(layer, args.sample))
  end
end
