-- luapipe.models.checkpoint: DeepSeek-V3 checkpoint folders in and out.
--
-- Two layouts, told apart by config.json's keys:
--   "deepseek": model.py's ModelArgs keys, model0-mp1.safetensors (DeepSeek's
--     inference/convert.py with --model-parallel 1), model.py's names, FP8
--     weights with a "<name>.scale" tensor;
--   "hf": Hugging Face's keys, model.safetensors or shards listed by
--     model.safetensors.index.json, HF names, FP8 weights with
--     "<name>_scale_inv".
-- load() checks every tensor the config needs against the headers (present,
-- shape, FP8 scale shape) before anything is built; the data is read when
-- a stage is built, so a rank reads only its stages' tensors (with EP, of
-- the routed experts only its own). Tensors no layer uses (the MTP layers,
-- num_nextn_predict_layers) are listed in model.unused.
local core = require("luapipe.core")
local json = require("luapipe.json")
local util = require("luapipe.util")
local config = require("luapipe.models.config")
local names = require("luapipe.models.names")

local M = {}

local function fail(msg) error(msg, 0) end
local function shape_text(s) return "[" .. table.concat(s, ", ") .. "]" end
local function numel(s)
  local n = 1
  for _, d in ipairs(s) do n = n * d end
  return n
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function read_json(path)
  local text = util.read_file(path)
  if not text then fail(path .. ": cannot be read") end
  local ok, v = pcall(json.decode, text, true)
  if not ok then fail(path .. ": not valid JSON: " .. tostring(v):gsub("\n.*", "")) end
  return v
end

-- The checkpoint object: stored name <-> model.py name, open files.
local Ckpt = {}
Ckpt.__index = Ckpt

local function stored_name(self, mname)
  if self.form == "hf" then return names.to_hf(mname) end
  return mname
end

-- ckpt:read(model.py name, shape) -> Tensor (f32), dequantised when FP8
function Ckpt:read(mname, shape)
  local sname = stored_name(self, mname)
  local e = self.index[sname]
  if not e then fail(string.format("%s: tensor %s is missing", self.dir, sname)) end
  local opts
  if e.info.dtype == "F8_E4M3" then
    opts = { scale = sname:gsub("weight$", self.form == "hf" and "weight_scale_inv" or "scale"),
      block = self.args.block }
  end
  local t, err
  local se = opts and self.index[opts.scale]
  if se and se.file ~= e.file then
    -- the scale is in another shard: dequantise here (q * s per block)
    local q, qerr = e.file:read(sname)
    if not q then fail(qerr) end
    local s, serr = se.file:read(opts.scale)
    if not s then q:close() fail(serr) end
    local qs, ss, b = q:shape(), s:totable(), opts.block -- totable: flat, row-major
    local v, sc = q:totable(), (qs[2] + b - 1) // b
    for i = 0, qs[1] - 1 do
      for j = 0, qs[2] - 1 do
        local k = i * qs[2] + j + 1
        v[k] = v[k] * ss[(i // b) * sc + j // b + 1]
      end
    end
    q:close() s:close()
    t = core.tensor(qs, v)
  else
    t, err = e.file:read(sname, opts)
  end
  if not t then fail(err) end
  local got = t:shape()
  if shape_text(got) ~= shape_text(shape) then
    t:close()
    fail(string.format("%s: tensor %s has shape %s, the config gives %s", e.path, sname,
      shape_text(got), shape_text(shape)))
  end
  return t
end

-- bytes of tensor data read from the files so far
function Ckpt:bytes_read()
  local n = 0
  for _, f in ipairs(self.files) do n = n + f.st:bytes_read() end
  return n
end

-- The folder's files: {{path =, name =, st =}}, index[stored name] =
-- {file =, path =, name =, info =}, and HF's index.json as read (nil
-- without one)
local function open_files(dir, form)
  local paths = {}
  local idx
  if form == "hf" then
    local ipath = dir .. "/model.safetensors.index.json"
    if exists(ipath) then
      idx = read_json(ipath)
      if type(idx.weight_map) ~= "table" then fail(ipath .. ": has no 'weight_map' object") end
      local seen = {}
      for _, f in pairs(idx.weight_map) do
        if type(f) ~= "string" then fail(ipath .. ": weight_map values must be file names") end
        if not seen[f] then seen[f] = true; paths[#paths + 1] = dir .. "/" .. f end
      end
      table.sort(paths)
    elseif exists(dir .. "/model.safetensors") then
      paths[1] = dir .. "/model.safetensors"
    else
      fail(dir .. ": no model.safetensors and no model.safetensors.index.json (Hugging "
        .. "Face's layout)")
    end
  else
    local p = dir .. "/model0-mp1.safetensors"
    if not exists(p) then
      if exists(dir .. "/model0-mp2.safetensors") then
        fail(dir .. ": model0-mp2.safetensors is split for model parallelism: convert with "
          .. "--model-parallel 1 (inference/convert.py)")
      end
      fail(dir .. ": no model0-mp1.safetensors (DeepSeek's converted layout)")
    end
    paths[1] = p
  end
  local files, index = {}, {}
  for _, p in ipairs(paths) do
    local st, err = core.safetensors_open(p)
    if not st then fail(err) end
    local name = p:sub(#dir + 2)
    files[#files + 1] = { path = p, name = name, st = st }
    for n, info in pairs(st:tensors()) do
      if index[n] then fail(string.format("%s: tensor %s is also in %s", p, n, index[n].path)) end
      index[n] = { file = st, path = p, name = name, info = info }
    end
  end
  return files, index, idx
end

-- Checks the checkpoint against the config from the headers alone; sets
-- args.correction_bias; returns the list of stored names not used.
local function check(self, model)
  local a, used = self.args, {}
  local function need(mname, shape)
    local sname = stored_name(self, mname)
    local e = self.index[sname]
    if not e then
      fail(string.format("%s: tensor %s is missing (the config's model has it)", self.dir, sname))
    end
    if shape_text(e.info.shape) ~= shape_text(shape) then
      fail(string.format("%s: tensor %s has shape %s, the config gives %s", e.path, sname,
        shape_text(e.info.shape), shape_text(shape)))
    end
    used[sname] = true
    if e.info.dtype == "F8_E4M3" then
      local scn = sname:gsub("weight$", self.form == "hf" and "weight_scale_inv" or "scale")
      local s = self.index[scn]
      if not s then
        fail(string.format("%s: FP8 tensor %s has no scale tensor %s", e.path, sname, scn))
      end
      local b = a.block
      local want = { (shape[1] + b - 1) // b, (shape[2] + b - 1) // b }
      if #shape ~= 2 or shape_text(s.info.shape) ~= shape_text(want) then
        fail(string.format("%s: scale %s has shape %s, %dx%d blocks of %s %s give %s", s.path, scn,
          shape_text(s.info.shape), b, b, sname, shape_text(shape), shape_text(want)))
      end
      used[scn] = true
    end
  end
  for _, p in ipairs(model:param_list()) do need(p.name, p.shape) end
  -- the routers' correction bias: present in every MoE layer or none
  local with, without = {}, {}
  for i = a.n_dense_layers, a.n_layers - 1 do
    local n = stored_name(self, "layers." .. i .. ".ffn.gate.bias")
    if self.index[n] then with[#with + 1] = n else without[#without + 1] = n end
  end
  if #with > 0 and #without > 0 then
    fail(string.format("%s: tensor %s is missing (%s has a router correction bias)", self.dir,
      without[1], with[1]))
  end
  a.correction_bias = #with > 0
  for i = a.n_dense_layers, a.n_layers - 1 do
    if a.correction_bias then need("layers." .. i .. ".ffn.gate.bias", { a.n_routed_experts }) end
  end
  local unused = {}
  for n in pairs(self.index) do if not used[n] then unused[#unused + 1] = n end end
  table.sort(unused)
  return unused
end

function M.loader(models, _)
  -- models.load(DIR [, {ep =}]) -> model (see luapipe.models)
  return function(dir, opts)
    if type(dir) ~= "string" then
      fail("models.load: DIR must be a folder path, got " .. util.shown(dir))
    end
    opts = opts or {}
    dir = dir:gsub("/+$", "")
    local cpath = dir .. "/config.json"
    if not exists(cpath) then fail(dir .. ": no config.json (not a checkpoint folder)") end
    local cfg = read_json(cpath)
    local args, form = config.read(cfg, cpath)
    local files, index, idx = open_files(dir, form)
    local ck = setmetatable({ dir = dir, form = form, args = args, files = files, index = index,
      index_json = idx }, Ckpt)
    -- the bias decides the model: look before building the specs
    args.correction_bias = false
    for i = args.n_dense_layers, args.n_layers - 1 do
      if index[stored_name(ck, "layers." .. i .. ".ffn.gate.bias")] then
        args.correction_bias = true
      end
    end
    local a2 = {}
    for k, v in pairs(args) do a2[k] = v end
    a2.bias_speed = opts.bias_speed
    local model = models.deepseek_v3(a2)
    model.args.block, model.args.mtp = args.block, args.mtp
    ck.args = model.args
    model.unused = check(ck, model)
    model.ckpt, model.form, model.dir, model.config_json = ck, form, dir, cfg
    model.ep = opts.ep
    -- stored dtypes: {dtype = count}
    local dt = {}
    for _, e in pairs(index) do dt[e.info.dtype] = (dt[e.info.dtype] or 0) + 1 end
    model.dtypes = dt
    return model
  end
end

-- ---- saving ----

-- {[model.py name] = {values}} of a built Layer (a whole model or stage
-- chunk holding model layers first..last), the routers' biases included.
local function held_of(model, layer, first, last)
  local out = {}
  for _, p in ipairs(layer:params()) do out[names.to_model(p.name)] = p.value end
  local k = 0
  for i = first, last do
    local spec = model.layers[i]
    if spec.kind == "mla_block" and spec.ffn.kind == "moe" then
      k = k + 1
      if model.args.correction_bias then
        out[model.layer_names[i] .. ".ffn.gate.bias"] = layer:moe_bias(k)
      end
    end
  end
  return out
end

local function entries(model)
  local list = {}
  for _, p in ipairs(model:param_list()) do list[#list + 1] = { name = p.name, shape = p.shape } end
  if model.args.correction_bias then
    for i = model.args.n_dense_layers, model.args.n_layers - 1 do
      list[#list + 1] = { name = "layers." .. i .. ".ffn.gate.bias",
        shape = { model.args.n_routed_experts } }
    end
  end
  return list
end

-- Gathers every tensor on rank 0 (each from the lowest rank holding it).
-- -> {[model.py name] = values} on rank 0, nil elsewhere.
local function gather(list, held)
  local comm = require("luapipe.comm")
  local P, r = comm.size(), comm.rank()
  if P == 1 then return held end
  local flags = {}
  for i, e in ipairs(list) do
    for q = 0, P - 1 do flags[(i - 1) * P + q + 1] = (q == r and held[e.name]) and 1 or 0 end
  end
  local all = assert(comm.allreduce(flags, "model save: who holds which tensor"))
  local owner = {}
  for i, e in ipairs(list) do
    for q = P - 1, 0, -1 do if all[(i - 1) * P + q + 1] > 0 then owner[i] = q end end
    if not owner[i] then
      -- the same answer on every rank (from the all-reduce): nobody is left waiting
      util.fail({ what = string.format("model save: no rank holds %s", e.name), everywhere = true },
        0)
    end
  end
  local TAG = 2323
  if r ~= 0 then
    for i, e in ipairs(list) do
      if owner[i] == r then assert(comm.send(0, held[e.name], TAG, "model save: " .. e.name)) end
    end
    return nil
  end
  local out = {}
  for i, e in ipairs(list) do
    if owner[i] == 0 then
      out[e.name] = held[e.name]
    else
      out[e.name] = assert(comm.recv(owner[i], numel(e.shape), TAG, "model save: " .. e.name))
    end
  end
  return out
end

local function write_folder(model, dir2, values, list, dtype)
  local ok, err = core.mkdir_p(dir2)
  if not ok then fail(string.format("model save: cannot make %s: %s", dir2, tostring(err))) end
  local cfg = {}
  for k, v in pairs(model.config_json or {}) do cfg[k] = v end
  if not model.config_json then -- a model made by deepseek_v3{...}: ModelArgs keys
    for k, v in pairs(model.args) do
      if k ~= "block" and k ~= "mtp" and k ~= "correction_bias" and k ~= "bias_speed" then
        cfg[k] = v
      end
    end
  end
  local form = model.form or "deepseek"
  if form == "hf" then
    cfg.quantization_config = nil
    cfg.torch_dtype = dtype == "bf16" and "bfloat16" or "float32"
    if cfg.num_nextn_predict_layers ~= nil then cfg.num_nextn_predict_layers = 0 end
  else
    cfg.dtype = dtype == "bf16" and "bf16" or nil
  end
  -- the files: HF with an index (model.safetensors.index.json) as it was
  -- loaded, the same shards (each tensor in the file that held it, one
  -- the folder did not have in the last shard; a shard left with no
  -- tensor, e.g. one of only MTP layers or FP8 scales, is not written);
  -- HF without one: model.safetensors; DeepSeek's: model0-mp1.safetensors
  local ck = model.ckpt
  local indexed = form == "hf" and ck and ck.index_json ~= nil
  local shards, by_name = {}, {}
  local function shard(name)
    if not by_name[name] then
      by_name[name] = { name = name, order = {}, tensors = {} }
      shards[#shards + 1] = by_name[name]
    end
    return by_name[name]
  end
  if indexed then
    for _, f in ipairs(ck.files) do shard(f.name) end -- file order (sorted names)
  end
  local last = indexed and shards[#shards].name
    or form == "hf" and "model.safetensors" or "model0-mp1.safetensors"
  local map, bytes = {}, 0
  for _, e in ipairs(list) do
    local sname = form == "hf" and names.to_hf(e.name) or e.name
    local held = indexed and ck.index[sname]
    local sh = shard(held and held.name or last)
    sh.tensors[sname] = core.tensor(e.shape, values[e.name])
    sh.order[#sh.order + 1] = sname
    map[sname] = sh.name
    bytes = bytes + numel(e.shape) * (dtype == "bf16" and 2 or 4)
  end
  -- every file first as FILE.partial (each written atomically); a failure
  -- removes those written, so the folder keeps what it had; then all are
  -- renamed into place
  local written = {}
  local function undo(msg)
    for _, w in ipairs(written) do os.remove(w .. ".partial") end
    for _, sh in ipairs(shards) do for _, t in pairs(sh.tensors) do t:close() end end
    fail("model save: " .. tostring(msg))
  end
  for _, sh in ipairs(shards) do
    if #sh.order > 0 then
      local path = dir2 .. "/" .. sh.name
      local wok, werr = core.safetensors_write(path .. ".partial", sh.tensors, { dtype = dtype,
        order = sh.order, metadata = { format = "pt" } })
      if not wok then undo(werr) end
      written[#written + 1] = path
    end
  end
  for _, sh in ipairs(shards) do for _, t in pairs(sh.tensors) do t:close() end sh.tensors = {} end
  if indexed then
    local meta = {}
    for k, v in pairs(type(ck.index_json.metadata) == "table" and ck.index_json.metadata or {}) do
      meta[k] = v
    end
    meta.total_size = bytes
    local path = dir2 .. "/model.safetensors.index.json"
    local iok, ierr = util.write_file(path .. ".partial", json.encode(
      { metadata = meta, weight_map = map }, { indent = true }) .. "\n")
    if not iok then undo(ierr) end
    written[#written + 1] = path
  end
  local cpath = dir2 .. "/config.json"
  local cok, cerr = util.write_file(cpath .. ".partial",
    json.encode(cfg, { indent = true }) .. "\n")
  if not cok then undo(cerr) end
  written[#written + 1] = cpath
  for i, w in ipairs(written) do
    local rok, rerr = os.rename(w .. ".partial", w)
    if not rok then
      for j = i, #written do os.remove(written[j] .. ".partial") end
      fail("model save: " .. tostring(rerr))
    end
  end
  return dir2
end

function M.saver(_, V3)
  -- models.save(model, DIR2 [, {from = Layer | train result, dtype = "f32" | "bf16"}])
  -- from: a Layer of the whole model (model:build()), or train{}'s result
  -- (every rank calls save: each sends its stages' tensors to rank 0,
  -- which writes); default: the model's own weights (a fresh build).
  return function(model, dir2, opts)
    opts = opts or {}
    if getmetatable(model) ~= V3 then
      fail("models.save: argument 1 must be a model of luapipe.models")
    end
    if type(dir2) ~= "string" then
      fail("models.save: DIR2 must be a folder path, got " .. util.shown(dir2))
    end
    local dtype = opts.dtype or "f32"
    if dtype ~= "f32" and dtype ~= "bf16" then
      fail("models.save: dtype must be \"f32\" or \"bf16\", got " .. util.shown(dtype))
    end
    local list, held = entries(model), {}
    local from = opts.from
    if type(from) == "table" and from.exec then
      local part = from.partition
      for _, v in ipairs(from.exec:vstages()) do
        local b = part.bounds[v.stage + 1]
        for k, val in pairs(held_of(model, v.layer, b.first, b.last)) do
          if held[k] == nil then held[k] = val end
        end
        v.layer:close()
      end
    else
      local layer = from or model:build(0)
      held = held_of(model, layer, 1, #model.layers)
      if not from then layer:close() end
    end
    local values = gather(list, held)
    if values then return write_folder(model, dir2, values, list, dtype) end
    return dir2
  end
end

return M
