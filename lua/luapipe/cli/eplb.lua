-- luapipe eplb: expert placement from a load file.
--
--   luapipe eplb --loads FILE --replicas R --groups G --nodes N --gpus M
--     [--mode reference|balanced] [--spill] [--previous FILE]
--     [--max-moves K] [--format json|text] [--padded] [--output FILE]
--
-- FILE is JSON (an array of layers, each an array of loads) or text (one
-- layer per line, numbers separated by spaces or commas; blank lines and
-- `#` comments are skipped). --previous takes the same formats with expert
-- ids, or the JSON this command wrote. Read errors name the file, line and
-- entry as written and exit 1; bad options are one line and exit 2 (counts
-- are integers from 1 to 2^20, --max-moves from 0), and so is a plan over
-- the size limits (eplb.limits: 2^20 slots per layer, 2^22 slots in all,
-- layers x --replicas; 4096 GPUs with --previous).
--
-- The JSON output has one line per layer for each map; logical_to_physical
-- lists each expert's slots without DeepSeek's -1 padding (logical_count
-- gives their number), so output size and time follow the plan; --padded
-- gives DeepSeek's layout (R - E + 1 entries per expert, -1 after its slots).
local eplb = require("luapipe.eplb")

local M = {}

-- Counts are integers from 1 to 2^20 (--max-moves from 0), checked by the
-- CLI's one integer converter (cli.int_option): a bad one is one line
-- naming the option, the range and the text as typed, exit 2.
local MAX_COUNT = 1 << 20
local int_option = require("luapipe.cli").int_option

function M.parser(p)
  p:option("--loads", "Load file: JSON array of layers or text, one layer per line.")
    :argname("FILE"):count(1)
  p:option("--replicas", "Physical expert slots per layer (R).")
    :argname("R"):count(1):convert(int_option("--replicas", 1, eplb.limits.replicas))
  p:option("--groups", "Expert groups (hierarchical policy when groups % nodes == 0).")
    :argname("G"):default("1"):convert(int_option("--groups", 1, MAX_COUNT))
  p:option("--nodes", "Server nodes.")
    :argname("N"):default("1"):convert(int_option("--nodes", 1, MAX_COUNT))
  p:option("--gpus", "GPUs, a multiple of nodes; R must be a multiple of it.")
    :argname("M"):count(1):convert(int_option("--gpus", 1, MAX_COUNT))
  p:option("--mode", "reference: DeepSeek's algorithm exactly; balanced: better packing.")
    :choices({ "balanced", "reference" }):default("balanced")
  p:flag("--spill", "Let redundant replicas use free slots on other nodes (balanced, hierarchical).")
  p:option("--previous", "Plan in force (physical_to_logical) to stay close to.")
    :argname("FILE")
  p:option("--max-moves", "Copy budget per layer against --previous: at most K slots change "
    .. "expert. The hierarchical policy keeps each group on the node --previous has it on "
    .. "(moving a group costs all its slots), unless --spill lets new replicas go to any node; "
    .. "0 keeps the plan in force and reports its figures.")
    :argname("K"):convert(int_option("--max-moves", 0, MAX_COUNT))
  p:option("--format", "Output format: json (the maps and statistics) or text (statistics per "
    .. "layer and a GPU load heat map; ASCII unless the locale is UTF-8, see `luapipe help env`)")
    :choices({ "json", "text" }):default("json")
  p:flag("--padded", "JSON logical_to_physical as DeepSeek's rebalance_experts returns it: every "
    .. "expert's row padded with -1 to R - E + 1 entries (a rectangular array, e.g. for "
    .. "torch.tensor). Default: ragged, each expert's slots only (logical_count gives their "
    .. "number), so the output grows with the plan, not with experts x R.")
  p:option("--output -o", "Write to FILE instead of standard output."):argname("FILE")
  p:epilog("Examples:\n"
    .. "  # DeepSeek's README example: 2 layers, 12 experts, 16 slots, 4 groups,\n"
    .. "  # 2 nodes, 8 GPUs\n"
    .. "  luapipe eplb --loads loads.json --replicas 16 --groups 4 --nodes 2 \\\n"
    .. "      --gpus 8 --mode reference\n"
    .. "  # statistics and a heat map instead of JSON\n"
    .. "  luapipe eplb --loads loads.txt --replicas 16 --groups 4 --nodes 2 \\\n"
    .. "      --gpus 8 --format text\n"
    .. "  # re-plan against the plan in force, copying at most 4 slots per layer\n"
    .. "  luapipe eplb --loads new.json --replicas 16 --groups 4 --nodes 2 \\\n"
    .. "      --gpus 8 --previous plan.json --max-moves 4 -o next.json\n"
    .. "  # logical_to_physical padded as DeepSeek's rebalance_experts returns it\n"
    .. "  luapipe eplb --loads loads.json --replicas 16 --groups 4 --nodes 2 \\\n"
    .. "      --gpus 8 --padded\n"
    .. "loads.json: [[90,132,40,...],[20,107,104,...]] (a row per layer); loads.txt: "
    .. "the same, a line per layer, numbers apart by spaces or commas.")
  return p
end

---------------------------------------------------------------------------
-- reading files
---------------------------------------------------------------------------

-- Byte position of layer `layer` (0-based), or of its entry `entry`, in
-- JSON text: one scan, made only to report an error.
local function json_pos(text, layer, entry)
  local depth, li, ei, i, n = 0, -1, 0, 1, #text
  while i <= n do
    local c = text:sub(i, i)
    if depth == 2 and li == layer and entry and ei == entry and not c:match("[%s,%]]") then
      return i
    elseif c == '"' then
      i = text:find('[\\"]', i + 1) or n
      while text:sub(i, i) == "\\" do i = text:find('[\\"]', i + 2) or n end
    elseif c == "[" or c == "{" then
      depth = depth + 1
      if depth == 2 then
        li, ei = li + 1, 0
        if li == layer and not entry then return i end
      end
    elseif c == "]" or c == "}" then
      depth = depth - 1
    elseif c == "," and depth == 2 then
      ei = ei + 1
    end
    i = i + 1
  end
  return n
end

local read_file = require("luapipe.util").read_file
local FLT_MAX = 3.4028234663852886e38 -- loads are planned in float32 (DeepSeek's algorithm)
local json = require("luapipe.json")

-- Parses a matrix file. want = "number" (loads) or "integer" (expert ids).
-- Returns rows, line_of or nil, "FILE:LINE: message", where line_of(l)
-- gives the line of layer l (1-based) for later messages. JSON objects are
-- read through their "physical_to_logical" (this command's own output).
-- Line numbers of JSON entries are looked up only when reporting an error.
local function read_matrix(path, want)
  local text, err = read_file(path)
  if not text then return nil, "cannot read " .. err end
  local rows, lines = {}, {}
  local what = want == "integer" and "expert id" or "load"
  -- nil when v is a fine entry, else the problem after "layer L, entry E"
  local function problem(v)
    if want == "integer" then
      if math.type(v) ~= "integer" and not (type(v) == "number" and v == math.floor(v)) then
        return " is not an integer expert id"
      end
    elseif type(v) ~= "number" then
      return " is not a number"
    elseif v ~= v or v == math.huge or v == -math.huge then
      return ": the load is not a finite number"
    elseif v < 0 then
      return ": the load is negative"
    elseif v > FLT_MAX then
      return string.format(": the load is larger than a float32 holds (%.8g)", FLT_MAX)
    end
  end
  local line_of
  local first = text:match("^%s*(%S)")
  if first == "[" or first == "{" then
    local obj, pos, jerr = json.decode(text, true)
    if obj == nil then
      return nil, string.format("%s:%d: invalid JSON: %s", path, json.line_of(text, pos),
        (jerr:gsub(" at line %d+$", "")))
    end
    local object = type(obj) == "table" and obj.physical_to_logical ~= nil
    if object then obj = obj.physical_to_logical end
    line_of = function(l, e)
      return object and 1 or json.line_of(text, json_pos(text, l - 1, e and e - 1))
    end
    if type(obj) ~= "table" or #obj == 0 then
      return nil, string.format("%s:1: expected an array of layers (arrays of %ss)", path, what)
    end
    local huge = FLT_MAX
    for l = 1, #obj do
      local row = obj[l]
      if type(row) ~= "table" then
        return nil, string.format("%s:%d: layer %d is not an array of %ss", path, line_of(l), l - 1,
          what)
      end
      -- one comparison per value; a non-number makes it raise, and the
      -- slow check below then names the entry
      local fine = pcall(function()
        for e = 1, #row do
          local v = row[e]
          if not (v >= 0 and v <= huge) then return error("bad") end
        end
      end)
      if not fine or want == "integer" then
        for e = 1, #row do
          local bad = problem(row[e])
          if bad then
            local at = json_pos(text, l - 1, e - 1)
            local tok = object and "" or " ('" .. (text:match("^[^,%]%s]+", at) or "") .. "')"
            return nil, string.format("%s:%d: layer %d, entry %d%s%s", path, line_of(l, e), l - 1,
              e - 1, tok, bad)
          end
          if want == "integer" then row[e] = math.tointeger(row[e]) end
        end
      end
      rows[l] = row
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
          local bad = problem(v)
          if bad then
            return nil, string.format("%s:%d: layer %d, entry %d ('%s')%s", path, n, #rows, #row,
              tok, bad)
          end
          row[#row + 1] = want == "integer" and math.tointeger(v) or v
        end
        rows[#rows + 1], lines[#rows + 1] = row, n
      end
    end
    if #rows == 0 then return nil, path .. ":1: no layers (the file is empty)" end
    line_of = function(l) return lines[l] end
  end
  for l = 2, #rows do
    if #rows[l] ~= #rows[1] then
      return nil, string.format("%s:%d: layer %d has %d entries, layer 0 has %d", path, line_of(l),
        l - 1, #rows[l], #rows[1])
    end
  end
  if #rows[1] == 0 then return nil, string.format("%s:%d: layer 0 is empty", path, line_of(1)) end
  return rows, line_of
end

---------------------------------------------------------------------------
-- output
---------------------------------------------------------------------------

-- The plan as JSON: maps on one line per layer (logical_to_physical lists
-- each expert's slots, padded with -1 to R - E + 1 with --padded), stats
-- one per line. Time and size
-- are proportional to the plan.
local function to_json(r)
  local out = {}
  local function add(s) out[#out + 1] = s end
  local function rows(name)
    local m = r.json_rows[name]
    add('  "' .. name .. '":[\n    ')
    add(table.concat(m, ",\n    "))
    add("\n  ],\n")
  end
  add("{\n")
  rows("physical_to_logical")
  rows("logical_to_physical")
  rows("logical_count")
  local per_layer = {}
  for l, s in ipairs(r.stats.per_layer) do
    per_layer[l] = {
      balancedness = s.balancedness, gpu_max_over_mean = s.gpu_max_over_mean,
      node_max_over_mean = s.node_max_over_mean, max_load = s.max_load, mean_load = s.mean_load,
      copies = s.copies or json.null, off_node_load = s.off_node_load, duplicates = s.duplicates,
      gpu_copies = r.gpu_copies and r.gpu_copies[l] or nil,
    }
  end
  local stats = {
    balancedness = r.stats.balancedness, gpu_max_over_mean = r.stats.gpu_max_over_mean,
    node_max_over_mean = r.stats.node_max_over_mean, per_layer = per_layer,
    copies = r.stats.copies or json.null, off_node_load = r.stats.off_node_load,
    duplicates = r.stats.duplicates, solve_ms = r.stats.solve_ms, policy = r.policy, mode = r.mode,
  }
  add('  "stats":')
  add(json.encode(stats, { indent = true, keyorder = { "balancedness", "gpu_max_over_mean",
    "node_max_over_mean", "copies", "off_node_load", "duplicates", "solve_ms", "policy", "mode",
    "per_layer", "max_load", "mean_load", "gpu_copies" } }):gsub("\n", "\n  "))
  add("\n}\n")
  return table.concat(out)
end


local function plural(n, word)
  return string.format("%d %s%s", n, word, n == 1 and "" or "s")
end

local function to_text(r)
  local out = {}
  local function add(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  local s = r.stats
  add("EPLB plan: %s, %s -> %s on %s over %s (%s policy, %s mode)", plural(r.layers, "layer"),
    plural(r.experts, "expert"), plural(r.replicas, "slot"), plural(r.gpus, "GPU"),
    plural(r.nodes, "node"), r.policy, r.mode)
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
  -- block characters in a UTF-8 locale, an ASCII ramp otherwise
  -- (show.use_unicode); every cell the lowest when every load is the same
  local shades = require("luapipe.show").shades()
  local scale = hi > lo and string.format("%s = %.6g .. %s = %.6g", shades[1], lo, shades[#shades], hi)
    or string.format("every GPU's load is %.6g", hi)
  add("")
  add("GPU load heat map: a row per layer, a column per GPU (nodes apart); %s", scale)
  local gpn = r.gpus // r.nodes
  for l, row in ipairs(r.gpu_load) do
    local cells = {}
    for g, v in ipairs(row) do
      local level = hi > lo and math.floor((v - lo) / (hi - lo) * (#shades - 1) + 0.5) + 1 or 1
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
  ok, err = eplb.check(#load[1], args.replicas, args.groups, args.nodes, args.gpus, #load)
  if not ok then return fail(err, 2) end
  if args.previous and args.gpus > eplb.limits.relabel_gpus then
    return fail(string.format("--gpus %d: more than the limit of %d GPUs for re-planning against --previous",
      args.gpus, eplb.limits.relabel_gpus), 2)
  end
  if args.max_moves and not args.previous then return fail("--max-moves needs --previous", 2) end
  if args.spill and args.mode == "reference" then
    return fail("--spill needs --mode balanced (reference is DeepSeek's algorithm exactly)", 2)
  end
  local previous, lines
  if args.previous then
    previous, lines = read_matrix(args.previous, "integer")
    if not previous then return fail(lines) end
    if #previous ~= #load then
      return fail(string.format("%s: %s, but %s has %d", args.previous, plural(#previous, "layer"),
        args.loads, #load))
    end
    for l, row in ipairs(previous) do
      if #row ~= args.replicas then
        return fail(string.format("%s:%s: layer %d has %d slots, expected --replicas %d",
          args.previous, lines(l), l - 1, #row, args.replicas))
      end
    end
  end
  local r, where
  r, err, where = eplb.rebalance{ load = load, replicas = args.replicas, groups = args.groups,
    nodes = args.nodes, gpus = args.gpus, mode = args.mode, spill = args.spill or nil,
    previous = previous, max_moves = args.max_moves, json = true,
    fixed_x = args.padded and args.replicas - #load[1] + 1 or nil }
  if not r then
    -- a layer of the previous plan refused: name the file and line too
    local l = lines and where and where.layer
    if l then err = string.format("%s:%s: %s", args.previous, lines(l + 1), err) end
    return fail(err)
  end
  local text = args.format == "text" and to_text(r) or to_json(r)
  if args.output then
    local wok, oerr = require("luapipe.util").write_file(args.output, text)
    if not wok then return fail("cannot write " .. oerr) end
    io.write("wrote ", args.format, " plan to ", args.output, "\n")
  else
    io.write(text)
  end
  return 0
end

M.summary = "expert placement (DeepSeek EPLB) from a load file"

return M
