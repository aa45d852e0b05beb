-- luapipe.data: training data from token files (flat binary token ids),
-- memory-mapped by the C core (core/data, lp_data.h).
--
--   local data = require("luapipe.data")
--   local ds = data.tokens("train.bin", { seq_len = 64, vocab = 65, shuffle = true, seed = 1 })
--   train { ..., data = ds:batches { microbatches = 8, rows = 4 } }
--
-- Files: nanoGPT's train.bin (uint16 token ids, no header; token_bytes = 4
-- for uint32) and llm.c's shards (a 1024-byte header: magic 20240520,
-- version 1 = uint16 / 2 = uint32, token count), told apart by the magic.
-- The file is cut into windows of seq_len + 1 tokens (the inputs and the
-- next tokens, the targets); sequence g of a run reads window g (shuffle
-- off) or a seeded per-epoch order of the windows (shuffle on), so each
-- window is read once per epoch. Step k's micro-batch mb reads sequences
-- ((k - 1) * microbatches + mb) * rows + row: where a run is in the file
-- follows from the step alone, so a resumed run (train{resume =}) reads
-- exactly what the run that never stopped read. With data parallelism
-- (dp > 1) each DP rank takes rows [dp_rank * rows / dp, ...) of every
-- micro-batch: the ranks read disjoint sequences.
--
-- A bad file stops at data.tokens with one line naming it: missing, not a
-- whole number of tokens, a shard header that disagrees with the file's
-- size, too short for one sequence, a token id not below `vocab` (with its
-- byte offset: every token is checked at open, a few GB/s; check = false
-- leaves it to the step that reads the token, which then fails naming it).
local core = require("luapipe.core")
local util = require("luapipe.util")
local nn = require("luapipe.nn")

local M = {}

local Dataset = {}
Dataset.__index = Dataset

-- data.tokens(path, opts) -> Dataset; opts: seq_len (required), vocab
-- (token ids must be below it; default: not checked), token_bytes (2 or 4,
-- for a file without header; default 2), shuffle (default false), seed,
-- check (default true: every token checked against vocab at open).
function M.tokens(path, opts)
  util.arg("data.tokens", 1, "path", path, "string", "a token file's path")
  util.arg("data.tokens", 2, "opts", opts, "table", "{seq_len =, vocab =, ...}")
  util.int_arg("data.tokens", 2, "opts.seq_len", opts.seq_len, 1)
  if opts.vocab ~= nil then util.int_arg("data.tokens", 2, "opts.vocab", opts.vocab, 1) end
  local handle, err = core.data_open(path, {
    seq_len = opts.seq_len, vocab = opts.vocab, token_bytes = opts.token_bytes,
    shuffle = opts.shuffle, seed = opts.seed, check = opts.check ~= false,
  })
  if not handle then util.raise(err) end
  local self = setmetatable({ handle = handle, path = path, seq_len = opts.seq_len }, Dataset)
  self.info = handle:info()
  return self
end

-- ds:window(g) -> the 0-based window that sequence g of the run reads.
function Dataset:window(g) return self.handle:window(g) end

-- ds:position(step, microbatches, rows) -> {sequence =, epoch =, window =}:
-- where step `step` starts reading.
function Dataset:position(step, microbatches, rows)
  local g = (step - 1) * microbatches * rows
  return { sequence = g, epoch = g // self.info.windows, window = self.handle:window(g) }
end

-- ds:batches{microbatches =, rows =, dp = 1, dp_rank = 0} -> function(step, mb)
-- -> input, target: luapipe.Tensor of shape {rows / dp, seq_len} each,
-- the token ids as numbers (as train{data =} takes them).
function Dataset:batches(o)
  util.arg("Dataset:batches", 1, "opts", o, "table", "{microbatches =, rows =}")
  util.int_arg("Dataset:batches", 1, "opts.microbatches", o.microbatches, 1)
  util.int_arg("Dataset:batches", 1, "opts.rows", o.rows, 1)
  local dp, dpr = o.dp or 1, o.dp_rank or 0
  util.int_arg("Dataset:batches", 1, "opts.dp", dp, 1)
  util.int_arg("Dataset:batches", 1, "opts.dp_rank", dpr, 0)
  if dpr >= dp then util.raise(string.format("Dataset:batches: dp_rank %d is not below dp %d", dpr, dp)) end
  if o.rows % dp ~= 0 then
    util.raise(string.format("Dataset:batches: %d rows per micro-batch do not divide over dp = %d", o.rows, dp))
  end
  local h, T, M_, rows = self.handle, self.seq_len, o.microbatches, o.rows
  local share = rows // dp
  return function(step, mb)
    local x, y = nn.tensor({ share, T }), nn.tensor({ share, T })
    local ok, err = h:fill(step, mb, M_, rows, dp, dpr, x, y)
    if not ok then error(err, 0) end
    return x, y
  end
end

function Dataset:close() self.handle:close() end

-- data.write_tokens(path, ids, {token_bytes = 2, header = false}) writes a
-- token file (atomically: nothing is left half-written): ids is a list of
-- 0-based token ids; header = true writes llm.c's shard header (version 1
-- for uint16, 2 for uint32). For examples and tests that make a file from
-- their own text.
function M.write_tokens(path, ids, o)
  util.arg("data.write_tokens", 1, "path", path, "string", "a file path")
  util.arg("data.write_tokens", 2, "ids", ids, "table", "a list of token ids")
  o = o or {}
  local tb = o.token_bytes or 2
  if tb ~= 2 and tb ~= 4 then util.raise("data.write_tokens: token_bytes must be 2 or 4, got " .. util.shown(tb)) end
  local limit = tb == 2 and 0xffff or 0xffffffff
  local fmt = tb == 2 and "<I2" or "<I4"
  local parts = {}
  if o.header then
    parts[1] = string.pack("<i4i4i4", 20240520, tb == 2 and 1 or 2, #ids) .. string.rep("\0", 1024 - 12)
  end
  local chunk = {}
  for i, v in ipairs(ids) do
    if math.type(v) ~= "integer" or v < 0 or v > limit then
      util.raise(string.format("data.write_tokens: id %d is %s, not an integer in 0 .. %d", i, util.shown(v), limit))
    end
    chunk[#chunk + 1] = string.pack(fmt, v)
    if #chunk == 4096 then
      parts[#parts + 1] = table.concat(chunk)
      chunk = {}
    end
  end
  parts[#parts + 1] = table.concat(chunk)
  local ok, err = core.write_file(path, table.concat(parts))
  if not ok then util.raise("data.write_tokens: " .. err) end
  return path
end

return M
