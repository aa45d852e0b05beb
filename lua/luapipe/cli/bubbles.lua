-- `luapipe bubbles`: DualPipe's comparison table, measured. For each family
-- the simulated largest per-rank bubble next to the published formula, the
-- parameter copies and the peak activations per rank.
local cli = require("luapipe.cli")
local common = require("luapipe.cli.common")
local schedule = require("luapipe.schedule")

local M = {}

function M.parser(p)
  p:description("Measure DualPipe's bubble table: for every schedule family, the simulated "
    .. "largest per-rank bubble (makespan - busy), the published formula's value, parameter "
    .. "copies per rank (in model stages) and peak activations per rank (in micro-batch-stage "
    .. "activations).")
  common.add_count_options(p, "8", "20", "2", "chunks per rank for interleaved1f1b")
  p:option("--cost -c", "costs, e.g. F=1,B=2,W=1,FB=3 (FB is F&B)", "F=1,B=2,W=1,FB=3")
  p:option("--format -f", "text or json", "text"):choices { "text", "json" }
  p:option("--link", "emulated link: every cross-rank message also takes lat + bytes/bw, "
    .. "e.g. lat=50us,bw=2GB/s (us|ms|s; GB/s|MB/s|KB/s); message size: bytes= in --cost; costs in seconds")
  p:epilog("Example (DualPipe README setting):\n"
    .. "  luapipe bubbles --pp 8 --microbatches 20 --cost F=1,B=2,W=1,FB=3")
end

-- Published bubble formulas; PP = number of model stages for DualPipe/V
-- (as in DualPipe's README), number of ranks for the others.
local formulas = {
  gpipe = { "(PP-1)(F+B)", function(c, P) return (P - 1) * (c.F + c.B) end },
  ["1f1b"] = { "(PP-1)(F+B)", function(c, P) return (P - 1) * (c.F + c.B) end },
  interleaved1f1b = { "(PP-1)(F+B)/v", function(c, P, v) return (P - 1) * (c.F + c.B) / v end },
  zb1p = { "(PP-1)(F+B-2W)", function(c, P) return (P - 1) * (c.F + c.B - 2 * c.W) end },
  zbv = nil,
  dualpipe = { "(PP/2-1)(F&B+B-3W)", function(c, P) return (P / 2 - 1) * (c.FB + c.B - 3 * c.W) end },
  dualpipev = { "(PP/2-1)(F&B+B-3W), PP=2P", function(c, P) return (P - 1) * (c.FB + c.B - 3 * c.W) end },
  chimera = { "(M/PP)(PP/2-1)(F+B), F=B", function(c, P, _, Mb) return Mb // P * (P / 2 - 1) * (c.F + c.B) end },
}

local schedules = require("luapipe.schedules")
local order = schedules.list() -- the one family list
local labels = setmetatable({}, { __index = function(_, name) return schedules.label(name) end })

local function fmt(x)
  if x == nil then return "-" end
  if x == math.floor(x) then return string.format("%d", x) end
  return string.format("%.2f", x)
end

-- Interleaved 1F1B's formula counts F and B per rank; each of its v chunks
-- per rank costs 1/v of that.
local function per_chunk(cost, v)
  local c = {}
  for k, x in pairs(cost) do c[k] = (k == "latency" or k == "link" or k == "bytes") and x or x / v end
  return c
end

-- Measures one family; returns a row table (row.error set when the family
-- cannot be built with these parameters).
function M.measure(family, P, Mb, v, cost)
  local row = { family = family, label = labels[family] }
  local ok, s = pcall(schedule.build, family, { pp = P, microbatches = Mb, chunks = v })
  if not ok then
    row.error = tostring(s):gsub("^[^:]*:%d+: ", "")
    return row
  end
  local res, err, code = common.simulate(s, family == "interleaved1f1b" and per_chunk(cost, v) or cost)
  if not res then
    row.error, row.usage = err, code == 2
    return row
  end
  row.bubble = res:max_bubble()
  row.makespan = res:makespan()
  local f = formulas[family]
  if f then
    row.formula = f[1]
    row.formula_value = f[2](cost, P, v, Mb)
  end
  local amax, amin, params = 0, math.huge, 0
  for r = 0, P - 1 do
    local mem = s:memory(r)
    amax = math.max(amax, mem.peak_live)
    amin = math.min(amin, mem.peak_live)
    params = math.max(params, mem.param_stages)
  end
  row.param_stages = params
  row.activations_max, row.activations_min = amax, amin
  return row
end

-- The cost model's defaults, as the simulator applies them (B = I + W).
local function resolve_cost(c)
  local r = { F = c.F or 1, latency = c.latency or 0 }
  local B, I, W = c.B, c.I, c.W
  if B == nil and I and W then B = I + W end
  if B and W and I == nil then I = B - W end
  if B and I and W == nil then W = B - I end
  if B and I == nil and W == nil then I, W = B / 2, B / 2 end
  r.B, r.I, r.W = B or 2, I or 1, W or 1
  r.FB = c.FB or (r.F + r.B)
  return r
end

function M.run(args)
  local cost, cerr = common.parse_cost(args.cost)
  if not cost then return cli.fail("bubbles", cerr, 2) end
  if cost.stages then
    return cli.fail("bubbles", "--cost: per-stage costs (such as B[3]=...) do not apply here: the "
      .. "table compares one cost per kind with the published formulas", 2)
  end
  local full = resolve_cost(cost)
  if full.I < 0 or full.W < 0 then
    local k = cost.W and "W" or "I"
    return cli.fail("bubbles", string.format("--cost: B = %s is less than %s = %s (B = I + W)",
      fmt(full.B), k, fmt(full[k])), 2)
  end
  if args.link then
    local l, lerr = require("luapipe.comm").parse_link(args.link)
    if not l then return cli.fail("bubbles", "--link: " .. lerr, 2) end
    full.link, full.bytes = args.link, cost.bytes
  end
  local P, Mb, v = args.pp, args.microbatches, args.chunks
  local serr = common.check_size(P, Mb, v)
  if serr then return cli.fail("bubbles", serr, 2) end
  local rows = {}
  for _, fam in ipairs(order) do
    local row = M.measure(fam, P, Mb, v, full)
    if row.usage then return cli.fail("bubbles", row.error, 2) end
    rows[#rows + 1] = row
  end
  if args.format == "json" then
    local json = require("luapipe.json")
    io.write(json.encode({ pp = P, microbatches = Mb, chunks = v, cost = full, rows = rows },
      { indent = true }), "\n")
    return 0
  end
  print(string.format("P=%d ranks, M=%d micro-batches, cost F=%s B=%s W=%s F&B=%s latency=%s",
    P, Mb, fmt(full.F), fmt(full.B), fmt(full.W), fmt(full.FB), fmt(full.latency)))
  print(string.format("%-17s %8s  %-26s %8s  %6s  %s", "schedule", "bubble", "formula",
    "= value", "params", "activations/rank (max..min)"))
  for _, r in ipairs(rows) do
    if r.error then
      print(string.format("%-17s %s", r.label, "not built: " .. r.error))
    else
      print(string.format("%-17s %8s  %-26s %8s  %5sx  %s", r.label, fmt(r.bubble),
        r.formula or "(none published)", fmt(r.formula_value), fmt(r.param_stages),
        r.activations_max == r.activations_min and string.format("%d (every rank)", r.activations_max)
          or string.format("%d..%d", r.activations_max, r.activations_min)))
    end
  end
  print("bubble = largest per-rank (makespan - busy) under the cost model (interleaved: each of "
    .. "the v chunks costs 1/v of F, B, W); params = model-stage copies per rank (the DualPipe "
    .. "README's unit); activations = peak micro-batch activations held per rank (F done, B/I "
    .. "not yet).")
  return 0
end

return M
