-- test_safetensors.lua — core.safetensors_open / core.safetensors_write
-- (core/safetensors through lb_safetensors.c): F32 written and read back
-- bitwise; BF16 rounded to nearest even, checked against hand-computed bit
-- patterns and against the reference library's rounding; the reference
-- file tests/data/safetensors/reference.safetensors (written by the
-- `safetensors` Python package, scripts/safetensors_fixture.py) read to
-- numpy's values, FP8 block scales included; a read touches only its own
-- tensor's bytes; broken files and missing tensors come back as nil,
-- message naming the file and tensor; misuse raises.
local lu = require("luaunit")
local core = require("luapipe.core")

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local reference = here .. "../data/safetensors/reference.safetensors"

local tmp = os.tmpname()
local path = tmp .. ".safetensors"

local function f32_bits(x) return string.unpack("<I4", string.pack("<f", x)) end
local function from_bits(u) return (string.unpack("<f", string.pack("<I4", u))) end

local function read_bytes(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- the data section's offset: 8 + the header length stored in the first 8 bytes
local function data_offset(p) return 8 + string.unpack("<I8", read_bytes(p)) end

local function error_of(f, ...)
  local ok, err = pcall(f, ...)
  lu.assertFalse(ok, "expected an error")
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

-- every element of a and b has the same float32 bits
local function assert_bitwise(a, b, what)
  local x, y = a:totable(), b:totable()
  lu.assertEquals(#x, #y, what)
  for i = 1, #x do
    if f32_bits(x[i]) ~= f32_bits(y[i]) then
      lu.fail(string.format("%s[%d]: %.9g (0x%08x) ~= %.9g (0x%08x)", what, i, x[i],
        f32_bits(x[i]), y[i], f32_bits(y[i])))
    end
  end
end

TestSafetensors = {}

function TestSafetensors:tearDown()
  os.remove(path)
  os.remove(tmp)
end

function TestSafetensors:test_f32_round_trip_bitwise()
  local a = core.tensor({ 2, 3 }, { 1.5, -0.0, from_bits(0x00000003), math.huge, -2.25, 1e30 })
  local b = core.tensor({ 4 }, { 0.1, 0.2, 0.3, -1 / 3 })
  local c = core.tensor({ 1, 1, 2, 1 }, { 7, 8 })
  lu.assertTrue(core.safetensors_write(path, { ["layers.0.w"] = a, b = b, c = c },
    { metadata = { format = "pt", step = "12" } }))
  local st = assert(core.safetensors_open(path))
  lu.assertEquals(st:path(), path)
  lu.assertEquals(st:metadata(), { format = "pt", step = "12" })
  -- sorted by name without an order
  lu.assertEquals(st:names(), { "b", "c", "layers.0.w" })
  local info = st:tensors()
  lu.assertEquals(info["layers.0.w"], { dtype = "F32", shape = { 2, 3 }, offsets = { 24, 48 } })
  lu.assertEquals(info.c.shape, { 1, 1, 2, 1 })
  local off = data_offset(path)
  lu.assertEquals(off % 8, 0)
  lu.assertEquals(st:bytes_read(), off) -- the header only
  local ra = assert(st:read("layers.0.w"))
  lu.assertEquals(st:bytes_read(), off + 24) -- and that tensor's 24 bytes
  assert_bitwise(ra, a, "layers.0.w")
  lu.assertEquals(ra:shape(), { 2, 3 })
  assert_bitwise(assert(st:read("b")), b, "b")
  assert_bitwise(assert(st:read("c")), c, "c")
  lu.assertEquals(st:bytes_read(), off + 48)
  st:close()
  st:close() -- idempotent
  lu.assertStrContains(error_of(st.read, st, "b"), "attempt to use a closed luapipe.Safetensors")
end

function TestSafetensors:test_order_kept()
  local t = {}
  for _, n in ipairs({ "z", "a", "m" }) do t[n] = core.tensor({ 1 }, { #n }) end
  assert(core.safetensors_write(path, t, { order = { "z", "a", "m" } }))
  local st <close> = assert(core.safetensors_open(path))
  lu.assertEquals(st:names(), { "z", "a", "m" })
end

function TestSafetensors:test_many_tensors()
  -- more tensors than a Lua C function's stack has slots, in a given order
  local t, order = {}, {}
  for i = 1, 300 do
    local n = string.format("layers.%d.ffn.experts.%d.w1.weight", i // 10, i % 10)
    t[n] = core.tensor({ 2 }, { i, -i })
    order[301 - i] = n
  end
  assert(core.safetensors_write(path, t, { order = order, dtype = "bf16" }))
  local st <close> = assert(core.safetensors_open(path))
  lu.assertEquals(st:names(), order)
  lu.assertEquals(assert(st:read(order[1])):totable(), { 300, -300 })
  lu.assertEquals(st:bytes_read(), data_offset(path) + 4)
end

-- bit patterns in, by hand: keep the top 16 bits and add one when the rest
-- is over half, or exactly half with the kept part odd; NaN is 0x7fc0
local bf16_cases = {
  { 0x3f800000, 0x3f80 }, -- 1
  { 0x3f808000, 0x3f80 }, -- halfway, 0x3f80 even: down
  { 0x3f818000, 0x3f82 }, -- halfway, 0x3f81 odd: up
  { 0x3f808001, 0x3f81 }, -- just over half: up
  { 0x3f807fff, 0x3f80 }, -- just under half: down
  { 0xbf80c000, 0xbf81 }, -- negative, over half
  { 0x7f7fffff, 0x7f80 }, -- the largest float rounds to infinity
  { 0xff800000, 0xff80 }, -- -inf
  { 0x80000000, 0x8000 }, -- -0
  { 0x7fc00000, 0x7fc0 }, -- NaN
  { 0x00018000, 0x0002 }, -- a subnormal, halfway with odd kept part
  { 0x40490fdb, 0x4049 }, -- pi: 0x0fdb < 0x8000, down
  { 0x3eaaaaab, 0x3eab }, -- 1/3: 0xaaab > 0x8000, up
}

function TestSafetensors:test_bf16_rounding_by_hand()
  local vals = {}
  for i, c in ipairs(bf16_cases) do vals[i] = from_bits(c[1]) end
  local x = core.tensor({ #vals }, vals)
  assert(core.safetensors_write(path, { x = x }, { dtype = "bf16" }))
  local bytes, off = read_bytes(path), data_offset(path)
  lu.assertEquals(#bytes, off + 2 * #vals)
  local st <close> = assert(core.safetensors_open(path))
  lu.assertEquals(st:tensors().x.dtype, "BF16")
  local back = assert(st:read("x")):totable()
  for i, c in ipairs(bf16_cases) do
    local got = string.unpack("<I2", bytes, off + 2 * (i - 1) + 1)
    lu.assertEquals(got, c[2], string.format("case %d: 0x%08x -> 0x%04x, want 0x%04x", i, c[1],
      got, c[2]))
    lu.assertEquals(f32_bits(back[i]), c[2] << 16, "read back, case " .. i)
  end
end

function TestSafetensors:test_reference_file()
  local st <close> = assert(core.safetensors_open(reference))
  lu.assertEquals(st:metadata().format, "pt")
  local info = st:tensors()
  lu.assertEquals(info.f16.dtype, "F16")
  lu.assertEquals(info["layers.0.attn.wq.weight"], { dtype = "F8_E4M3", shape = { 129, 131 },
    offsets = info["layers.0.attn.wq.weight"].offsets })
  lu.assertEquals(info["layers.0.attn.wq.scale"].shape, { 2, 2 })
  local f32 = assert(st:read("f32")):totable()
  lu.assertEquals(f32_bits(f32[2]), 0x80000000) -- -0
  lu.assertEquals(f32_bits(f32[6]), f32_bits(1e30))
  for _, n in ipairs({ "f16", "bf16" }) do
    assert_bitwise(assert(st:read(n)), assert(st:read(n .. ".expected")), n)
  end
  -- FP8 with DeepSeek's block scales (blocks of 128, partial edge blocks)
  local before = st:bytes_read()
  local w = assert(st:read("layers.0.attn.wq.weight", { scale = "layers.0.attn.wq.scale" }))
  lu.assertEquals(st:bytes_read() - before, 129 * 131 + 2 * 2 * 4) -- the weight and its scale
  assert_bitwise(w, assert(st:read("layers.0.attn.wq.weight.expected")), "wq")
  -- Hugging Face's name for the scale, blocks of 4
  local hf = "model.layers.0.self_attn.q_proj.weight"
  assert_bitwise(assert(st:read(hf, { scale = hf .. "_scale_inv", block = 4 })),
    assert(st:read(hf .. ".expected")), "q_proj")
  -- the wrong block size: the scale's shape does not fit
  local t, err = st:read(hf, { scale = hf .. "_scale_inv" })
  lu.assertNil(t)
  lu.assertEquals(err, reference .. ": tensor '" .. hf .. "': scale '" .. hf .. "_scale_inv' " ..
    "has shape [2, 3]; blocks of 128 over [6, 10] need [1, 1]")
end

-- DeepSeek-V3 in Hugging Face's form, written by PyTorch (the fixtures of
-- tests/data/v3/hf_fp8, two shards): every FP8 weight reads with its
-- weight_scale_inv, found in whichever shard holds it; each 128 x 128 block's
-- largest |w| is 448 * its scale (the fixture quantised each block by its
-- max |w| / 448, so its largest element is E4M3's 448)
function TestSafetensors:test_hf_fp8_shards()
  local dir = here .. "../data/v3/hf_fp8/checkpoint/"
  local shards = {
    assert(core.safetensors_open(dir .. "model-00001-of-00002.safetensors")),
    assert(core.safetensors_open(dir .. "model-00002-of-00002.safetensors")),
  }
  local where = {}
  for _, sh in ipairs(shards) do
    for n in pairs(sh:tensors()) do where[n] = sh end
  end
  local weights, across = 0, 0
  for _, sh in ipairs(shards) do
    for name, info in pairs(sh:tensors()) do
      if info.dtype == "F8_E4M3" then
        local sname = name .. "_scale_inv"
        local ssh = assert(where[sname], "no scale for " .. name)
        local w = assert(sh:read(name, { scale = sname, scale_file = ssh, block = 128 }))
        local s = assert(ssh:read(sname))
        local rows, cols = info.shape[1], info.shape[2]
        local sv, wv, bc = s:totable(), w:totable(), s:shape()[2]
        local maxabs = {}
        for r = 0, rows - 1 do
          for c = 0, cols - 1 do
            local b = (r // 128) * bc + c // 128 + 1
            maxabs[b] = math.max(maxabs[b] or 0, math.abs(wv[r * cols + c + 1]))
          end
        end
        for b = 1, #sv do
          lu.assertEquals(f32_bits(maxabs[b]), f32_bits(448 * sv[b]),
            string.format("%s block %d", name, b))
        end
        weights = weights + 1
        if ssh ~= sh then across = across + 1 end
      end
    end
  end
  lu.assertTrue(weights >= 20, weights)
  lu.assertEquals(across, 1) -- model.layers.0.mlp.up_proj.weight: its scale is in shard 2
  for _, sh in ipairs(shards) do sh:close() end
end

-- every file of the DeepSeek-V3 fixtures (PyTorch's writer: F32, BF16,
-- FP8, F32 references) opens, and reading each tensor once reads the file
-- exactly once, header included
function TestSafetensors:test_v3_fixture_files_read_whole()
  local v3 = here .. "../data/v3/"
  local files = {
    "v3_f32/checkpoint/model0-mp1.safetensors", "v3_f32/ref.safetensors",
    "v2lite_bf16/checkpoint/model0-mp1.safetensors", "v2lite_bf16/ref.safetensors",
    "hf_fp8/checkpoint/model-00001-of-00002.safetensors",
    "hf_fp8/checkpoint/model-00002-of-00002.safetensors", "hf_fp8/ref.safetensors",
  }
  local dtypes = {}
  for _, f in ipairs(files) do
    local st <close> = assert(core.safetensors_open(v3 .. f))
    for name, info in pairs(st:tensors()) do
      local t = assert(st:read(name))
      if #info.shape > 0 then lu.assertEquals(t:shape(), info.shape, name) end
      dtypes[info.dtype] = true
    end
    lu.assertEquals(st:bytes_read(), #read_bytes(v3 .. f), f)
  end
  lu.assertEquals(dtypes, { F32 = true, BF16 = true, F8_E4M3 = true })
end

function TestSafetensors:test_writer_rounds_as_reference()
  -- luapipe's BF16 of bf16.source has the bytes of the reference's bf16.rounded
  local ref <close> = assert(core.safetensors_open(reference))
  local src = assert(ref:read("bf16.source"))
  assert(core.safetensors_write(path, { r = src }, { dtype = "bf16" }))
  local o = ref:tensors()["bf16.rounded"].offsets
  local rbytes, roff = read_bytes(reference), data_offset(reference)
  local mine, moff = read_bytes(path), data_offset(path)
  lu.assertEquals(mine:sub(moff + 1), rbytes:sub(roff + o[1] + 1, roff + o[2]))
end

function TestSafetensors:test_errors()
  -- a missing tensor, named
  assert(core.safetensors_write(path, { w = core.tensor({ 2 }, { 1, 2 }) }))
  local st <close> = assert(core.safetensors_open(path))
  local t, err = st:read("layers.3.ffn.experts.7.w1.weight")
  lu.assertNil(t)
  lu.assertEquals(err, path .. ": no tensor 'layers.3.ffn.experts.7.w1.weight' in the file")
  t, err = st:read("w", { scale = "w.scale" })
  lu.assertEquals(err, path .. ": tensor 'w': its scale tensor 'w.scale' is not in the file")
  -- a broken file
  local f = assert(io.open(path, "wb"))
  f:write(string.pack("<I8", 4096), "{}")
  f:close()
  t, err = core.safetensors_open(path)
  lu.assertNil(t)
  lu.assertEquals(err, path .. ": the header length 4096 runs beyond the file (10 bytes; " ..
    "truncated, or not a safetensors file)")
  t, err = core.safetensors_open(tmp .. ".none")
  lu.assertNil(t)
  lu.assertEquals(err, "cannot open " .. tmp .. ".none: No such file or directory")
  -- a failed write leaves nothing
  t, err = core.safetensors_write(tmp .. ".d/x.safetensors", { w = core.tensor({ 1 }) })
  lu.assertNil(t)
  lu.assertStrContains(err, "there is no folder " .. tmp .. ".d")
  -- misuse raises
  local x = core.tensor({ 1 })
  lu.assertStrContains(error_of(core.safetensors_write, path, { w = x }, { dtype = "f16" }),
    'dtype must be "f32" or "bf16", got f16')
  lu.assertStrContains(error_of(core.safetensors_write, path, { w = { 1, 2 } }),
    "'w' is a table, not a luapipe.Tensor")
  lu.assertStrContains(error_of(core.safetensors_write, path, { w = x }, { order = { "v" } }),
    "order[1] is not a tensor of the table")
  lu.assertStrContains(error_of(core.safetensors_write, path, { w = x }, { order = {} }),
    "order lists 0 names for 1 tensors")
  lu.assertStrContains(error_of(core.safetensors_write, path, { w = x }, { metadata = { k = 1 } }),
    "metadata keys and values must be strings")
  lu.assertStrContains(error_of(st.read, st, "w", { block = 0 }), "block must be a positive integer")
end

os.exit(lu.LuaUnit.run())
