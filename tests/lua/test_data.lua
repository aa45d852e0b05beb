-- luapipe.data: token files written and read back (raw uint16/uint32 and
-- llm.c shards), micro-batches by (step, mb, DP rank), training from a
-- token file equal to training from the same sequences given by hand, and
-- the messages of bad files.
local lu = require("luaunit")
local data = require("luapipe.data")
local nn = require("luapipe.nn")
local train = require("luapipe.train")

local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. dir))

local function values(t)
  local out = {}
  for i, v in ipairs(t:totable()) do out[i] = math.tointeger(v) end
  return out
end

local function range(n, f)
  local ids = {}
  for i = 1, n do ids[i] = f and f(i - 1) or i - 1 end
  return ids
end

TestData = {}

function TestData:test_raw_uint16_batches()
  local path = data.write_tokens(dir .. "/a.bin", range(101))
  local ds = data.tokens(path, { seq_len = 4, vocab = 101 })
  lu.assertEquals(ds.info.format, "raw")
  lu.assertEquals(ds.info.tokens, 101)
  lu.assertEquals(ds.info.windows, 25)
  local batch = ds:batches { microbatches = 2, rows = 2 }
  -- step 2, mb 1: sequences (1 * 2 + 1) * 2 = 6, 7 -> windows 6, 7
  local x, y = batch(2, 1)
  lu.assertEquals(x:shape(), { 2, 4 })
  lu.assertEquals(values(x), { 24, 25, 26, 27, 28, 29, 30, 31 })
  lu.assertEquals(values(y), { 25, 26, 27, 28, 29, 30, 31, 32 })
  lu.assertEquals(ds:position(2, 2, 2), { sequence = 4, epoch = 0, window = 4 })
  ds:close()
end

function TestData:test_llmc_uint32_and_dp_shares()
  local ids = range(200, function(i) return 70000 + i end)
  local path = data.write_tokens(dir .. "/s.bin", ids, { token_bytes = 4, header = true })
  local ds = data.tokens(path, { seq_len = 3 })
  lu.assertEquals(ds.info.format, "llm.c")
  lu.assertEquals(ds.info.token_bytes, 4)
  local whole = ds:batches { microbatches = 1, rows = 4 }
  local x = whole(5, 0)
  local parts = {}
  for r = 0, 1 do
    local xr = ds:batches { microbatches = 1, rows = 4, dp = 2, dp_rank = r }(5, 0)
    lu.assertEquals(xr:shape(), { 2, 3 })
    for _, v in ipairs(values(xr)) do parts[#parts + 1] = v end
  end
  lu.assertEquals(parts, values(x))
  lu.assertEquals(values(x)[1], 70000 + 16 * 3) -- sequence (5 - 1) * 4 = 16
end

function TestData:test_shuffle_reads_each_window_once_per_epoch()
  local ds = data.tokens(data.write_tokens(dir .. "/p.bin", range(81)), { seq_len = 8, shuffle = true, seed = 3 })
  local seen, moved = {}, false
  for g = 0, 9 do
    local w = ds:window(g)
    lu.assertNil(seen[w])
    seen[w] = true
    if w ~= g then moved = true end
  end
  lu.assertTrue(moved)
end

function TestData:test_bad_files_name_the_file()
  local short = data.write_tokens(dir .. "/short.bin", range(5))
  lu.assertErrorMsgContains(short .. ": 5 tokens, too short for one sequence of 8 (it takes 9 tokens: the inputs and the next token)",
    data.tokens, short, { seq_len = 8 })
  lu.assertErrorMsgContains("cannot open " .. dir .. "/none.bin: No such file or directory",
    data.tokens, dir .. "/none.bin", { seq_len = 8 })
  local big = data.write_tokens(dir .. "/big.bin", range(40, function(i) return i == 30 and 999 or i end))
  lu.assertErrorMsgContains(big .. ": token 999 at byte offset 60 is not below the vocabulary size 100",
    data.tokens, big, { seq_len = 4, vocab = 100 }) -- every token checked at open
  local ds = data.tokens(big, { seq_len = 4, vocab = 100, check = false })
  ds:batches { microbatches = 1, rows = 2 }(1, 0) -- windows 0, 1: fine
  lu.assertErrorMsgEquals(big .. ": token 999 at byte offset 60 is not below the vocabulary size 100",
    ds:batches { microbatches = 1, rows = 2 }, 4, 0) -- windows 6, 7: token 30
  lu.assertErrorMsgContains("data.write_tokens: id 2 is -1, not an integer in 0 .. 65535",
    data.write_tokens, dir .. "/x.bin", { 1, -1 })
  lu.assertErrorMsgContains("Dataset:batches: 3 rows per micro-batch do not divide over dp = 2",
    ds.batches, ds, { microbatches = 1, rows = 3, dp = 2 })
end

-- Training from a token file gives the losses of training on the same
-- sequences handed over by a Lua function.
function TestData:test_training_from_a_token_file()
  local V, T, D = 11, 6, 8
  local ids = range(400, function(i) return (i * 7 + i // 5) % V end)
  local ds = data.tokens(data.write_tokens(dir .. "/lm.bin", ids), { seq_len = T, vocab = V })
  local function model()
    local m = nn.sequential { nn.embedding(V, D), nn.rmsnorm(D), nn.linear(D, V), loss = "cross_entropy" }
    return m
  end
  local function by_hand(step, mb)
    local x, y = {}, {}
    for r = 0, 1 do
      local g = ((step - 1) * 2 + mb) * 2 + r
      for t = 1, T do
        x[r * T + t] = ids[g * T + t]
        y[r * T + t] = ids[g * T + t + 1]
      end
    end
    return nn.tensor({ 2, T }, x), nn.tensor({ 2, T }, y)
  end
  local opts = { steps = 5, microbatches = 2, seed = 1, optimizer = { kind = "adamw", lr = 0.01 } }
  local function run(fn)
    local o = { model = model(), data = fn }
    for k, v in pairs(opts) do o[k] = v end
    return train.reference(o)
  end
  local a = run(ds:batches { microbatches = 2, rows = 2 })
  local b = run(by_hand)
  lu.assertEquals(a.losses, b.losses)
  lu.assertTrue(a.losses[5] < a.losses[1])
end

local rc = lu.LuaUnit.run()
os.execute("rm -rf " .. dir)
os.exit(rc)
