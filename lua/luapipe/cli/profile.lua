-- `luapipe profile`: read profile traces (PyTorch profiler, luapipe) and
-- report, per rank, GPU busy time per class and stream, communication
-- overlapped by computation, idle time and phases; optionally the costs
-- they give the simulator, and what a schedule would do with them.
local cli = require("luapipe.cli")
local common = require("luapipe.cli.common")
local util = require("luapipe.util")

local M = {}

function M.parser(p)
  p:description("Read Chrome-format profile traces (.json, .json.gz, a folder of per-rank "
    .. "traces, or a trace luapipe wrote) and report per rank: GPU busy time per class "
    .. "(compute, communication, memory) and per stream as unions of intervals, communication "
    .. "overlapped by computation and exposed, idle time, span, and phases (innermost "
    .. "record_function annotations) with the GPU time of the kernels each launched. "
    .. "Bad input: one line naming the file (and event), exit 2.")
  p:argument("paths", "trace files or folders"):args("+")
  p:option("--format -f", "text or json", "text"):choices { "text", "json" }
  p:option("--output -o", "write the report to FILE instead of standard output")
  p:option("--svg", "write the GPU timeline per stream, phases coloured, as SVG to FILE")
  p:option("--rules", "a Lua file returning classification rules put before the defaults "
    .. "(or {rules=, replace=true, mapping=}); see `luapipe help luapipe.profile`")
  p:option("--rank", "the rank --costs, --simulate and --svg use (default: the first)")
    :convert(cli.int_option("--rank", 0, 1 << 30))
  p:option("--beside", "a second trace (DeepSeek's, say) whose phase table (of its first rank) "
    .. "is printed beside the --rank one's, with the order of one layer of the pair in each")
  p:flag("--costs", "print the cost table the phases give (F, B, I, W, FB in ms) for "
    .. "simulate, bubbles and search (--cost)")
  p:flag("--no-exchanges", "--costs/--simulate: F, I, W without the exchanges' time (as if every "
    .. "dispatch and combine were hidden)")
  p:option("--pairs", "F&B chunk pairs the trace holds (costs are per pair)", "1")
    :convert(cli.int_option("--pairs", 1, 1 << 20))
  p:option("--simulate", "simulate a schedule family, 'search' (the best schedule luapipe.search "
    .. "finds for the trace's costs) or 'all' (every family and the search) with the trace's costs")
  common.add_count_options(p, "16", "32", "2", "chunks per rank for interleaved1f1b")
  p:option("--memory", "--simulate search/all: the search's memory limit per rank in activations "
    .. "(default: DualPipe's peak at this --pp and --microbatches, the schedule DeepSeek's pair "
    .. "comes from)"):convert(cli.number_option("--memory", 1e-9, math.huge))
  p:option("--placement", "--simulate search/all: the search's placement (linear, interleaved:V, "
    .. "v, bidirectional or any)", "any")
  p:option("--time", "--simulate search/all: seconds of search", "1")
    :convert(cli.number_option("--time", 0, 86400))
  p:epilog("Examples:\n"
    .. "  luapipe profile ../shared/data/deepseek-profile/train.json\n"
    .. "  luapipe profile traces/ --format json -o report.json\n"
    .. "  luapipe profile train.json --costs --simulate dualpipe --pp 16 --microbatches 32\n"
    .. "  luapipe profile train.json --simulate search --pp 16 --microbatches 32 --time 2\n"
    .. "  luapipe profile train.json --svg timeline.svg\n"
    .. "  luapipe profile trace.json --beside ../shared/data/deepseek-profile/train.json")
end

local function fmt(x)
  if x == nil then return "-" end
  return string.format("%.3f", x)
end

-- The row of the best searched schedule (luapipe.search with these costs
-- at P, M): the row, and the note line under the table; or nil, message.
local function search_row(cost, args, bubbles)
  local search = require("luapipe.search")
  local mem, why = args.memory, "--memory"
  if not mem then
    local dp = bubbles.measure("dualpipe", args.pp, args.microbatches, args.chunks, cost)
    if dp.error then
      why = "unlimited: DualPipe is not built here (" .. dp.error .. ")"
    else
      mem, why = dp.activations_max, "DualPipe's peak"
    end
  end
  local ok, r, err, reason = pcall(search.search, { pp = args.pp, microbatches = args.microbatches,
    cost = cost, memory = mem, placement = args.placement, time = args.time })
  if not ok then return nil, util.is_error(r) and r.reason or util.message(r) end
  if not r then return nil, reason or err end
  local s = r:schedule()
  local f = args.pp / s:info().stages
  local c = r.cost
  local res = assert(s:simulate { F = c.F * f, B = c.B * f, I = c.I * f, W = c.W * f,
    FB = c.FB and c.FB * f, latency = c.latency })
  local params = 0
  for rk = 0, args.pp - 1 do params = math.max(params, s:memory(rk).param_stages) end
  local act = 0
  for _, v in ipairs(r:peak_memory()) do act = math.max(act, v) end
  local num = require("luapipe.sim").format_number
  local row = string.format("%-22s %10s %10s %7.1f%% %7dx  %s",
    "search (" .. r.placement_name .. ")",
    fmt(res:makespan()), fmt(res:max_bubble()), 100 * res:max_bubble() / res:makespan(),
    params, num(act))
  local note = string.format("search: memory limit %s activations per rank (%s), placement %s, "
    .. "%s s: lower bound %s, gap %.1f%%, best from %s", mem and num(mem) or "none", why,
    args.placement, num(args.time), fmt(r:lower_bound()), 100 * r:gap(), r.stats.label)
  return row, note
end

local placements = { linear = true, v = true, bidirectional = true, any = true, interleaved = true }

-- The --simulate table: family, bubble, step, peak activations.
local function simulate_text(cost, args)
  local bubbles = require("luapipe.cli.bubbles")
  local schedules = require("luapipe.schedules")
  local fams, with_search = {}, args.simulate == "search" or args.simulate == "all"
  if args.simulate == "all" then
    fams = schedules.list()
  elseif args.simulate ~= "search" then
    local name, ferr = common.family(args.simulate)
    if not name or name:find("[./]") then
      return nil, ferr or ("--simulate takes a family name, 'search' or 'all', got '"
        .. args.simulate .. "'")
    end
    fams = { name }
  end
  if not with_search and (args.memory or args.placement ~= "any" or args.time ~= 1) then
    return nil, "--memory, --placement and --time apply to --simulate search (or all)"
  end
  if with_search and not (placements[args.placement]
    or args.placement:match("^interleaved:%d+$")) then
    return nil, string.format("--placement '%s': expected linear, interleaved:V, v, bidirectional "
      .. "or any", args.placement)
  end
  local serr = common.check_size(args.pp, args.microbatches, args.chunks)
  if serr then return nil, serr end
  local L = {}
  L[#L + 1] = string.format("simulated with these costs: P=%d ranks, M=%d micro-batches (ms)",
    args.pp, args.microbatches)
  L[#L + 1] = string.format("%-22s %10s %10s %8s %8s  %s", "schedule", "step", "bubble", "bubble%",
    "params", "activations/rank (max)")
  for _, fam in ipairs(fams) do
    local row = bubbles.measure(fam, args.pp, args.microbatches, args.chunks, cost)
    if row.error then
      if #fams == 1 and not with_search then return nil, row.error end
      L[#L + 1] = string.format("%-22s not built: %s", row.label, row.error)
    else
      L[#L + 1] = string.format("%-22s %10s %10s %7.1f%% %7dx  %s", row.label, fmt(row.makespan),
        fmt(row.bubble), 100 * row.bubble / row.makespan, row.param_stages,
        require("luapipe.sim").format_number(row.activations_max))
    end
  end
  local note
  if with_search then
    local row, nerr = search_row(cost, args, bubbles)
    if not row then
      if #fams == 0 then return nil, "search: " .. nerr end
      L[#L + 1] = string.format("%-22s none found: %s", "search", nerr)
    else
      L[#L + 1], note = row, nerr
    end
  end
  L[#L + 1] = "step = makespan; bubble = largest per-rank (makespan - busy); params = model-stage "
    .. "copies per rank; activations = peak micro-batch activations per rank."
  if note then L[#L + 1] = note end
  return table.concat(L, "\n") .. "\n"
end

function M.run(args)
  local profile = require("luapipe.profile")
  local rules, mapping
  if args.rules then
    local r, m = profile.load_rules(args.rules)
    if not r then return cli.fail("profile", "--rules: " .. tostring(m), 2) end
    rules, mapping = r, m
  end
  local rep, err = profile.read(args.paths, { rules = rules })
  if not rep then return cli.fail("profile", err, 2) end
  local rank = rep.ranks[1]
  if args.rank then
    rank = nil
    for _, r in ipairs(rep.ranks) do
      if r.rank == args.rank then rank = r end
    end
    if not rank then
      local have = {}
      for _, r in ipairs(rep.ranks) do have[#have + 1] = tostring(r.rank) end
      return cli.fail("profile", string.format("--rank %d: the traces hold ranks %s", args.rank,
        table.concat(have, ", ")), 2)
    end
  end
  local out = {}
  if args.format == "json" then
    out[#out + 1] = profile.json(rep) .. "\n"
  else
    out[#out + 1] = profile.text(rep)
  end
  if args.beside then
    local rb, berr = profile.read({ args.beside }, { rules = rules })
    if not rb then return cli.fail("profile", "--beside: " .. berr, 2) end
    out[#out + 1] = profile.beside(rank, rb.ranks[1])
  end
  local cost
  if args.costs or args.simulate then
    local c, cerr = profile.costs(rank, { mapping = mapping, pairs = args.pairs,
      exchanges = not args.no_exchanges })
    if not c then return cli.fail("profile", cerr, 2) end
    cost = c
    if args.costs then out[#out + 1] = profile.costs_text(c) end
  end
  if args.simulate then
    local text, serr = simulate_text(cost.sim, args)
    if not text then return cli.fail("profile", "--simulate: " .. serr, 2) end
    out[#out + 1] = text
  end
  local svg
  if args.svg then
    local s, serr = profile.svg(rep, rank)
    if not s then return cli.fail("profile", serr, 1) end
    svg = s
  end
  -- everything computed: now write (each file atomically)
  local text = table.concat(out)
  if args.output and args.output ~= "-" then
    local ok, werr = require("luapipe.util").write_file(args.output, text)
    if not ok then return cli.fail("profile", werr, 1) end
    io.stderr:write("wrote ", args.output, "\n")
  else
    io.write(text)
  end
  if svg then
    local ok, werr = require("luapipe.util").write_file(args.svg, svg)
    if not ok then return cli.fail("profile", werr, 1) end
    -- (after a text report on stdout, there, as search does; else on stderr)
    local where = (args.format == "text" and not (args.output and args.output ~= "-")) and io.stdout
      or io.stderr
    where:write("wrote SVG timeline of rank ", rank.rank, " to ", args.svg, "\n")
  end
  return 0
end

return M
