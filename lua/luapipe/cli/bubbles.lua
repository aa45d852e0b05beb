-- `luapipe bubbles`: DualPipe's comparison table, measured. For each family
-- the simulated largest per-rank bubble next to the published formula, the
-- parameters and the peak activations per rank, every family on the same
-- model (a chunk costs P/S of --cost, S model stages) unless --per-chunk
-- (DeepSeek's convention: every chunk costs --cost).
local cli = require("luapipe.cli")
local common = require("luapipe.cli.common")
local util = require("luapipe.util")
local schedule = require("luapipe.schedule")
local sim = require("luapipe.sim")

local M = {}

function M.parser(p)
  p:description("Measure DualPipe's bubble table: for every schedule family, the simulated "
    .. "largest per-rank bubble (makespan - busy), the published formula's value, parameters "
    .. "and peak activations per rank. Every family runs the same model: F, B, W and FB are "
    .. "the times of one rank's share of it (1/P of the model, a 1F1B stage), and a family "
    .. "that cuts the model into S model stages gets F x P/S per chunk (interleaved 1F1B: "
    .. "1/v; ZB-V and DualPipeV: 1/2; the 'chunk' column). --per-chunk gives DeepSeek's "
    .. "convention instead (the DualPipe README's F and B are one chunk's times): every chunk "
    .. "costs F, so ZB-V and DualPipeV run a model of 2P stages, interleaved of P x v.")
  common.add_count_options(p, "8", "20", "2", "chunks per rank for interleaved1f1b")
  p:option("--cost -c", "costs of one rank's share of the model (with --per-chunk: of one "
    .. "chunk), e.g. F=1,B=2,W=1,FB=3 (FB is F&B)", "F=1,B=2,W=1,FB=3")
  p:flag("--per-chunk", "DeepSeek's convention: every chunk (model stage) costs --cost, "
    .. "whatever the number of chunks per rank; params and activations in chunks")
  p:option("--format -f", "text or json", "text"):choices { "text", "json" }
  p:option("--link", "emulated link: every cross-rank message also takes lat + bytes/bw, "
    .. "e.g. lat=50us,bw=2GB/s (us|ms|s; GB/s|MB/s|KB/s); message size: bytes= in --cost; "
    .. "costs in seconds")
  p:epilog("Examples:\n"
    .. "  # the DualPipe README's setting, every family on one model\n"
    .. "  luapipe bubbles --pp 8 --microbatches 20 --cost F=1,B=2,W=1,FB=3\n"
    .. "  # DeepSeek's convention: every chunk costs F=1, B=2, ...\n"
    .. "  luapipe bubbles --pp 8 --microbatches 20 --per-chunk")
end

-- Published bubble formulas, as published: F, B, W, F&B are one chunk's
-- times (DeepSeek's convention; c below: the costs of one chunk), PP the
-- model stages (DualPipeV: PP = 2P on P ranks) and ranks for the others;
-- interleaved 1F1B's formula (Narayanan et al.) takes one rank's times,
-- v chunks of it (c times v).
local formulas = {
  gpipe = { "(PP-1)(F+B)", function(c, P) return (P - 1) * (c.F + c.B) end },
  ["1f1b"] = { "(PP-1)(F+B)", function(c, P) return (P - 1) * (c.F + c.B) end },
  interleaved1f1b = { "(PP-1)(F+B)/v, F,B of a rank",
    function(c, P, v) return (P - 1) * (c.F * v + c.B * v) / v end },
  zb1p = { "(PP-1)(F+B-2W)", function(c, P) return (P - 1) * (c.F + c.B - 2 * c.W) end },
  zbv = nil,
  dualpipe = { "(PP/2-1)(F&B+B-3W)",
    function(c, P) return (P / 2 - 1) * (c.FB + c.B - 3 * c.W) end },
  dualpipev = { "(PP/2-1)(F&B+B-3W), PP=2P",
    function(c, P) return (P - 1) * (c.FB + c.B - 3 * c.W) end },
  chimera = { "(M/PP)(PP/2-1)(F+B), F=B",
    function(c, P, _, Mb) return Mb // P * (P / 2 - 1) * (c.F + c.B) end },
}

local schedules = require("luapipe.schedules")
local order = schedules.list() -- the one family list
local labels = setmetatable({}, { __index = function(_, name) return schedules.label(name) end })

local function fmt(x)
  if x == nil then return "-" end
  if x == math.floor(x) then return string.format("%d", x) end
  return string.format("%.2f", x)
end

-- The costs scaled by f (a chunk's share of a rank's); latency, the link
-- and message sizes stay.
local function scaled(cost, f)
  local c = {}
  for k, x in pairs(cost) do
    c[k] = (k == "latency" or k == "link" or k == "bytes" or k == "values" or type(x) ~= "number")
      and x or x * f
  end
  return c
end

-- "1", "1/2", "1/4", or the number
local function fraction(f)
  if f == 1 then return "1" end
  local d = 1 / f
  if math.abs(d - math.floor(d + 0.5)) < 1e-9 then
    return string.format("1/%d", math.floor(d + 0.5))
  end
  return fmt(f)
end

-- Measures one family; returns a row table (row.error set when the family
-- cannot be built with these parameters). per_chunk: DeepSeek's
-- convention (every chunk costs cost); else one model for every family
-- (a chunk costs cost x P/S, S the family's model stages).
function M.measure(family, P, Mb, v, cost, per_chunk)
  local row = { family = family, label = labels[family] }
  local ok, s = pcall(schedule.build, family, { pp = P, microbatches = Mb, chunks = v })
  if not ok then
    row.error = util.message(s)
    return row
  end
  local S = s:info().stages
  local f = per_chunk and 1 or P / S -- a chunk's cost, per unit of cost
  row.stages, row.chunk_cost = S, f
  local chunk = scaled(cost, f)
  local res, err, code = common.simulate(s, chunk)
  if not res then
    row.error, row.usage = err, code == 2
    return row
  end
  row.bubble = res:max_bubble()
  row.makespan = res:makespan()
  local fm = formulas[family]
  if fm then
    row.formula = fm[1]
    row.formula_value = fm[2](chunk, P, family == "interleaved1f1b" and v or 1, Mb)
  end
  -- params and activations in units of a rank's share (1/P of the model;
  -- per chunk: of a chunk)
  local amax, amin, params = 0, math.huge, 0
  for r = 0, P - 1 do
    local mem = s:memory(r)
    amax = math.max(amax, mem.peak_live)
    amin = math.min(amin, mem.peak_live)
    params = math.max(params, mem.param_stages)
  end
  row.param_stages = params
  row.params = params * f
  row.activations_max, row.activations_min = amax * f, amin * f
  return row
end


function M.run(args)
  local cost, cerr = common.parse_cost(args.cost)
  if not cost then return cli.fail("bubbles", cerr, 2) end
  if cost.stages then
    return cli.fail("bubbles", "--cost: per-stage costs (such as B[3]=...) do not apply here: the "
      .. "table compares one cost per kind with the published formulas", 2)
  end
  local full = sim.resolve_cost(cost)
  if not full then -- only B with I or W larger than it
    local k = cost.W and "W" or "I"
    return cli.fail("bubbles", string.format("--cost: B = %s is less than %s = %s (B = I + W)",
      fmt(cost.B), k, fmt(cost[k])), 2)
  end
  full.FB = full.FB or (full.F + full.B)
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
    local row = M.measure(fam, P, Mb, v, full, args.per_chunk)
    if row.usage then return cli.fail("bubbles", row.error, 2) end
    rows[#rows + 1] = row
  end
  local convention = args.per_chunk and "per chunk" or "same model"
  if args.format == "json" then
    local json = require("luapipe.json")
    io.write(json.encode({ pp = P, microbatches = Mb, chunks = v, cost = full,
      convention = convention, rows = rows }, { indent = true }), "\n")
    return 0
  end
  print(string.format("P=%d ranks, M=%d micro-batches, cost F=%s B=%s W=%s F&B=%s latency=%s %s",
    P, Mb, fmt(full.F), fmt(full.B), fmt(full.W), fmt(full.FB), fmt(full.latency),
    args.per_chunk and "per chunk (DeepSeek's convention: the model grows with the chunks)"
      or "per rank's share of one model (every family runs it)"))
  print(string.format("%-17s %8s %6s  %-30s %8s  %6s  %s", "schedule", "bubble", "chunk", "formula",
    "= value", "params", "activations/rank (max..min)"))
  for _, r in ipairs(rows) do
    if r.error then
      print(string.format("%-17s %s", r.label, "not built: " .. r.error))
    else
      print(string.format("%-17s %8s %6s  %-30s %8s  %5sx  %s", r.label, fmt(r.bubble),
        fraction(r.chunk_cost), r.formula or "(none published)", fmt(r.formula_value),
        fmt(r.params), r.activations_max == r.activations_min
          and string.format("%s (every rank)", fmt(r.activations_max))
          or string.format("%s..%s", fmt(r.activations_max), fmt(r.activations_min))))
    end
  end
  local legend = {
    { "bubble", "largest per-rank makespan - busy, in the time unit of --cost" },
    { "chunk", args.per_chunk and "one chunk's (model stage's) cost as a share of --cost: 1, "
      .. "DeepSeek's convention (families with more chunks run a bigger model)"
      or "one chunk's (model stage's) cost as a share of --cost: P / model stages, so that "
      .. "every family runs the same model (--per-chunk: 1, DeepSeek's convention)" },
    { "formula", "as published: F, B, W, F&B one chunk's times (DeepSeek's convention; "
      .. "interleaved's F, B a rank's), evaluated at chunk x --cost; PP = model stages for "
      .. "DualPipe and DualPipeV, ranks for the others" },
    { "params", args.per_chunk and "parameters per rank, in chunks (model-stage copies, "
      .. "DeepSeek's table)" or "parameters per rank, in ranks' shares of the model (1/P of it; "
      .. "DeepSeek's table counts chunks: --per-chunk)" },
    { "activations", "peak activations held per rank (F done, B/I not yet), in " .. (args.per_chunk
      and "one chunk's for one micro-batch" or "one rank's share's for one micro-batch (1/P of a "
      .. "micro-batch's)") },
  }
  local lines = {}
  for i, l in ipairs(legend) do lines[i] = string.format("  %-12s %s", l[1], l[2]) end
  io.write(require("luapipe.cli.help").wrap(table.concat(lines, "\n") .. "\n"))
  return 0
end

return M
