-- luapipe eplb: expert placement from a load file.
--
--   luapipe eplb --loads FILE --replicas R --groups G --nodes N --gpus M
--     [--mode reference|balanced] [--spill] [--previous FILE]
--     [--max-moves K] [--format json|text] [--output FILE]
--
-- FILE is JSON (an array of layers, each an array of loads) or text (one
-- layer per line, numbers separated by spaces or commas; blank lines and
-- `#` comments are skipped). --previous takes the same formats with expert
-- ids, or the JSON this command wrote. Read errors name the file and line
-- and exit 1; bad options exit 2.
local eplb = require("luapipe.eplb")

local M = {}

local function positive(name, allow_zero)
  return function(s)
    local n = math.tointeger(tonumber(s))
    if not n or n < (allow_zero and 0 or 1) then
      return nil, string.format("%s must be a %s integer, got '%s'", name,
        allow_zero and "non-negative" or "positive", s)
    end
    return n
  end
end

function M.parser(p)
  p:option("--loads", "Load file: JSON array of layers or text, one layer per line.")
    :argname("FILE"):count(1)
  p:option("--replicas", "Physical expert slots per layer (R).")
    :argname("R"):convert(positive("--replicas")):count(1)
  p:option("--groups", "Expert groups (hierarchical policy when groups % nodes == 0).")
    :argname("G"):convert(positive("--groups")):default("1")
  p:option("--nodes", "Server nodes.")
    :argname("N"):convert(positive("--nodes")):default("1")
  p:option("--gpus", "GPUs, a multiple of nodes; R must be a multiple of it.")
    :argname("M"):convert(positive("--gpus")):count(1)
  p:option("--mode", "reference: DeepSeek's algorithm exactly; balanced: better packing.")
    :choices({ "balanced", "reference" }):default("balanced")
  p:flag("--spill", "Let redundant replicas use free slots on other nodes (balanced, hierarchical).")
  p:option("--previous", "Plan in force (physical_to_logical) to stay close to.")
    :argname("FILE")
  p:option("--max-moves", "Copy budget per layer against --previous.")
    :argname("K"):convert(positive("--max-moves", true))
  p:option("--format", "Output format."):choices({ "json", "text" }):default("json")
  p:option("-o --output", "Write to FILE instead of standard output."):argname("FILE")
  return p
end

---------------------------------------------------------------------------
-- reading files
---------------------------------------------------------------------------

-- Line of layer `layer` (0-based), or of its entry `entry`, in JSON text.
local function json_line(text, layer, entry)
  local depth, li, ei, line, i, n = 0, -1, 0, 1, 1, #text
  while i <= n do
    local c = text:sub(i, i)
    if c == "\n" then
      line = line + 1
    elseif depth == 2 and li == layer and entry and ei == entry and not c:match("[%s,%]]") then
      return line
    elseif c == '"' then
      i = i + 1
      while i <= n do
        local d = text:sub(i, i)
        if d == "\\" then i = i + 1 elseif d == '"' then break elseif d == "\n" then line = line + 1 end
        i = i + 1
      end
    elseif c == "[" or c == "{" then
      depth = depth + 1
      if depth == 2 then
        li, ei = li + 1, 0
        if li == layer and not entry then return line end
      end
    elseif c == "]" or c == "}" then
      depth = depth - 1
    elseif c == "," and depth == 2 then
      ei = ei + 1
    end
    i = i + 1
  end
  return line
end

local read_file = require("luapipe.util").read_file

-- Parses a matrix file. want = "number" (loads) or "integer" (expert ids).
-- Returns rows, nil or nil, "FILE:LINE: message". JSON objects are read
-- through their "physical_to_logical" (this command's own output).
local function read_matrix(path, want)
  local text, err = read_file(path)
  if not text then return nil, "cannot read " .. path .. ": " .. err end
  local rows, lines = {}, {}
  local what = want == "integer" and "expert id" or "load"
  local function check(v, where)
    if want == "integer" then
      if math.type(v) ~= "integer" and not (type(v) == "number" and v == math.floor(v)) then
        return nil, string.format("%s is not an integer expert id", where)
      end
    elseif type(v) ~= "number" then
      return nil, string.format("%s is not a number", where)
    elseif v ~= v or v < 0 or v == math.huge then
      return nil, string.format("%s: load %s is not a non-negative finite number", where, tostring(v))
    end
    return true
  end
  local first = text:match("^%s*(%S)")
  if first == "[" or first == "{" then
    local json = require("dkjson")
    local obj, pos, jerr = json.decode(text, 1, nil)
    if jerr then
      local line = jerr:match("at line (%d+)") or json_line(text:sub(1, pos or #text), 1e9)
      return nil, string.format("%s:%s: invalid JSON: %s", path, line, jerr)
    end
    local object = type(obj) == "table" and obj.physical_to_logical ~= nil
    if object then obj = obj.physical_to_logical end
    if type(obj) ~= "table" or #obj == 0 then
      return nil, string.format("%s:1: expected an array of layers (arrays of %ss)", path, what)
    end
    for l = 1, #obj do
      local row = obj[l]
      local line = object and "1" or tostring(json_line(text, l - 1))
      if type(row) ~= "table" then
        return nil, string.format("%s:%s: layer %d is not an array of %ss", path, line, l - 1, what)
      end
      for e = 1, #row do
        local ok, cerr = check(row[e], string.format("layer %d, entry %d", l - 1, e - 1))
        if not ok then
          return nil, string.format("%s:%d: %s", path, object and 1 or json_line(text, l - 1, e - 1), cerr)
        end
        row[e] = want == "integer" and math.tointeger(row[e]) or row[e]
      end
      rows[l], lines[l] = row, line
    end
  else
    local n = 0
    for raw in (text .. "\n"):gmatch("([^\n]*)\n") do
      n = n + 1
      local s = raw:gsub("#.*", "")
      if s:match("%S") then
        local row = {}
        for tok in s:gmatch("[^%s,]+") do
          local v = tonumber(tok)
          local ok, cerr = check(v, string.format("layer %d, entry %d ('%s')", #rows, #row, tok))
          if not ok then return nil, string.format("%s:%d: %s", path, n, cerr) end
          row[#row + 1] = want == "integer" and math.tointeger(v) or v
        end
        rows[#rows + 1], lines[#rows + 1] = row, tostring(n)
      end
    end
    if #rows == 0 then return nil, path .. ":1: no layers (the file is empty)" end
  end
  for l = 2, #rows do
    if #rows[l] ~= #rows[1] then
      return nil, string.format("%s:%s: layer %d has %d entries, layer 0 has %d", path, lines[l],
        l - 1, #rows[l], #rows[1])
    end
  end
  if #rows[1] == 0 then return nil, string.format("%s:%s: layer 0 is empty", path, lines[1]) end
  return rows, lines
end

---------------------------------------------------------------------------
-- output
---------------------------------------------------------------------------

local function to_json(r)
  local json = require("dkjson")
  local per_layer = {}
  for l, s in ipairs(r.stats.per_layer) do
    per_layer[l] = setmetatable({
      balancedness = s.balancedness, gpu_max_over_mean = s.gpu_max_over_mean,
      node_max_over_mean = s.node_max_over_mean, max_load = s.max_load, mean_load = s.mean_load,
      copies = s.copies or json.null, off_node_load = s.off_node_load, duplicates = s.duplicates,
      gpu_copies = r.gpu_copies and r.gpu_copies[l] or nil,
    }, { __jsonorder = { "balancedness", "gpu_max_over_mean", "node_max_over_mean", "max_load",
      "mean_load", "copies", "gpu_copies", "off_node_load", "duplicates" } })
  end
  local stats = setmetatable({
    balancedness = r.stats.balancedness, gpu_max_over_mean = r.stats.gpu_max_over_mean,
    node_max_over_mean = r.stats.node_max_over_mean, per_layer = per_layer,
    copies = r.stats.copies or json.null, off_node_load = r.stats.off_node_load,
    duplicates = r.stats.duplicates, solve_ms = r.stats.solve_ms, policy = r.policy, mode = r.mode,
  }, { __jsonorder = { "balancedness", "gpu_max_over_mean", "node_max_over_mean", "copies",
    "off_node_load", "duplicates", "solve_ms", "policy", "mode", "per_layer" } })
  local doc = setmetatable({
    physical_to_logical = r.physical_to_logical, logical_to_physical = r.logical_to_physical,
    logical_count = r.logical_count, stats = stats,
  }, { __jsonorder = { "physical_to_logical", "logical_to_physical", "logical_count", "stats" } })
  return json.encode(doc, { indent = true }) .. "\n"
end

local shades = { "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█" }

local function to_text(r)
  local out = {}
  local function add(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  local s = r.stats
  add("EPLB plan: %d layers, %d experts -> %d slots on %d GPUs over %d nodes (%s policy, %s mode)",
    r.layers, r.experts, r.replicas, r.gpus, r.nodes, r.policy, r.mode)
  add("balancedness %.4f  gpu max/mean %.4f  node max/mean %.4f  copies %s  off-node load %.6g  solve %.3f ms",
    s.balancedness, s.gpu_max_over_mean, s.node_max_over_mean, s.copies and tostring(s.copies) or "-",
    s.off_node_load, s.solve_ms)
  add("")
  add("%5s %12s %12s %13s %12s %12s %7s %10s", "layer", "balancedness", "gpu max/mean",
    "node max/mean", "max load", "mean load", "copies", "off-node")
  for l, p in ipairs(s.per_layer) do
    add("%5d %12.4f %12.4f %13.4f %12.6g %12.6g %7s %10.6g", l - 1, p.balancedness,
      p.gpu_max_over_mean, p.node_max_over_mean, p.max_load, p.mean_load,
      p.copies and tostring(p.copies) or "-", p.off_node_load)
  end
  local lo, hi = math.huge, 0
  for _, row in ipairs(r.gpu_load) do
    for _, v in ipairs(row) do
      if v < lo then lo = v end
      if v > hi then hi = v end
    end
  end
  add("")
  add("GPU load heat map: a row per layer, a column per GPU (nodes apart); %s = %.6g .. %s = %.6g",
    shades[1], lo, shades[#shades], hi)
  local gpn = r.gpus // r.nodes
  for l, row in ipairs(r.gpu_load) do
    local cells = {}
    for g, v in ipairs(row) do
      local level = hi > lo and math.floor((v - lo) / (hi - lo) * (#shades - 1) + 0.5) + 1 or #shades
      cells[#cells + 1] = shades[level]
      if g % gpn == 0 and g < #row and r.nodes > 1 then cells[#cells + 1] = " " end
    end
    add("%5d %s", l - 1, table.concat(cells))
  end
  return table.concat(out, "\n") .. "\n"
end

---------------------------------------------------------------------------

local function fail(msg, code)
  io.stderr:write("luapipe eplb: ", msg, "\n")
  return code or 1
end

function M.run(args)
  local load, err = read_matrix(args.loads, "number")
  if not load then return fail(err) end
  local ok
  ok, err = eplb.check(#load[1], args.replicas, args.groups, args.nodes, args.gpus)
  if not ok then return fail(err, 2) end
  if args.max_moves and not args.previous then return fail("--max-moves needs --previous", 2) end
  if args.spill and args.mode == "reference" then
    return fail("--spill needs --mode balanced (reference is DeepSeek's algorithm exactly)", 2)
  end
  local previous
  if args.previous then
    local lines
    previous, lines = read_matrix(args.previous, "integer")
    if not previous then return fail(lines) end
    if #previous ~= #load then
      return fail(string.format("%s: %d layers, but %s has %d", args.previous, #previous, args.loads,
        #load))
    end
    for l, row in ipairs(previous) do
      if #row ~= args.replicas then
        return fail(string.format("%s:%s: layer %d has %d slots, expected --replicas %d",
          args.previous, lines[l], l - 1, #row, args.replicas))
      end
    end
  end
  local r
  r, err = eplb.rebalance{ load = load, replicas = args.replicas, groups = args.groups,
    nodes = args.nodes, gpus = args.gpus, mode = args.mode, spill = args.spill or nil,
    previous = previous, max_moves = args.max_moves }
  if not r then return fail(err) end
  local text = args.format == "text" and to_text(r) or to_json(r)
  if args.output then
    local ok, oerr = require("luapipe.util").write_file(args.output, text)
    if not ok then return fail("cannot write " .. oerr) end
    io.write("wrote ", args.format, " plan to ", args.output, "\n")
  else
    io.write(text)
  end
  return 0
end

M.summary = "expert placement (DeepSeek EPLB) from a load file"

return M
