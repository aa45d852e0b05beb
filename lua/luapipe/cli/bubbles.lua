-- `luapipe bubbles`: DualPipe's comparison table, measured. For each family
-- the simulated largest per-rank bubble next to the published formula, the
-- parameter copies and the peak activations per rank.
local cli = require("luapipe.cli")
local schedule = require("luapipe.schedule")

local M = {}

function M.parser(p)
  p:description("Measure DualPipe's bubble table: for every schedule family, the simulated "
    .. "largest per-rank bubble (makespan - busy), the published formula's value, parameter "
    .. "copies per rank (in model stages) and peak activations per rank (in micro-batch-stage "
    .. "activations).")
  p:option("--pp -p", "pipeline ranks (P)", "8"):convert(tonumber)
  p:option("--microbatches -m", "micro-batches per step (M)", "20"):convert(tonumber)
  p:option("--chunks", "chunks per rank for interleaved1f1b", "2"):convert(tonumber)
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
}

local order = { "gpipe", "1f1b", "interleaved1f1b", "zb1p", "zbv", "dualpipe", "dualpipev" }
local labels = { gpipe = "GPipe", ["1f1b"] = "1F1B", interleaved1f1b = "Interleaved 1F1B",
  zb1p = "ZB1P", zbv = "ZB-V", dualpipe = "DualPipe", dualpipev = "DualPipeV" }

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
  local res, err = s:simulate(family == "interleaved1f1b" and per_chunk(cost, v) or cost)
  if not res then
    row.error = err
    return row
  end
  row.bubble = res:max_bubble()
  row.makespan = res:makespan()
  local f = formulas[family]
  if f then
    row.formula = f[1]
    row.formula_value = f[2](cost, P, v)
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
  local sim = require("luapipe.sim")
  local ok, cost = pcall(sim.parse_cost, args.cost)
  if not ok then return cli.fail("bubbles", (tostring(cost):gsub("^[^:]*:%d+: ", "")), 2) end
  local full = resolve_cost(cost)
  if args.link then
    local l, lerr = require("luapipe.comm").parse_link(args.link)
    if not l then return cli.fail("bubbles", "--link: " .. lerr, 2) end
    full.link, full.bytes = args.link, cost.bytes
  end
  local P, Mb, v = math.tointeger(args.pp), math.tointeger(args.microbatches), math.tointeger(args.chunks)
  if not P or P < 1 or not Mb or Mb < 1 or not v or v < 1 then
    return cli.fail("bubbles", "--pp, --microbatches and --chunks must be positive integers", 2)
  end
  local rows = {}
  for _, fam in ipairs(order) do rows[#rows + 1] = M.measure(fam, P, Mb, v, full) end
  if args.format == "json" then
    local json = require("dkjson")
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
