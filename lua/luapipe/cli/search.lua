-- `luapipe search`: find a schedule for the given costs and memory limit,
-- print it beside every family that fits the same limit, with the lower
-- bound and the gap (docs/search.md).
local cli = require("luapipe.cli")
local common = require("luapipe.cli.common")
local util = require("luapipe.util")

local M = {}

function M.parser(p)
  p:description("Search a schedule for your costs and memory: candidates (placement, per-rank "
    .. "priorities) decoded by a memory-gated list scheduler over the simulator's cost model "
    .. "(every candidate valid and deadlock-free), seeded with every family that fits and Zero "
    .. "Bubble's greedy, improved by local search; reports a lower bound and the gap to it. "
    .. "Times are one rank's share of the model (1/pp of it); memory is in activations of one "
    .. "micro-batch of 1/pp of the model.")
  p:option("--pp -p", "pipeline ranks (P), 1..256", "4"):convert(cli.int_option("--pp", 1, 256))
  p:option("--microbatches -m", "micro-batches per step (M), 1..4096", "8")
    :convert(cli.int_option("--microbatches", 1, 4096))
  p:option("--cost -c", "costs, e.g. F=1,B=2,W=1,FB=2.5,latency=0 (B = I + W)", "F=1,B=2,W=1")
  p:option("--memory", "memory limit per rank in activations (default: unlimited)")
    :convert(cli.number_option("--memory", 1e-9, math.huge))
  p:option("--act-values", "values in one activation (one micro-batch's activations of 1/pp "
    .. "of the model): memory figures also in bytes, 4 a value (f32) or 2 (bf16)")
    :convert(cli.number_option("--act-values", 1e-9, math.huge))
  p:option("--precision", "f32 or bf16: bytes of an activation value (needs --act-values)")
    :choices { "f32", "bf16" }
  p:option("--memory-bytes", "memory limit per rank in bytes instead of activations (needs "
    .. "--act-values; bf16 fits twice the activations)")
    :convert(cli.number_option("--memory-bytes", 1e-9, math.huge))
  p:option("--w-share", "share of an activation held from its I until its W, 0..1 (Zero "
    .. "Bubble's F +2 / I -1 / W -1 rule: 0.5)", "0"):convert(cli.number_option("--w-share", 0, 1))
  p:option("--placement", "linear, interleaved:V, v, bidirectional or any", "linear")
  p:option("--objective", "makespan (simulate's) or span (Zero Bubble's: first F to last W per "
    .. "rank)", "makespan"):choices { "makespan", "span" }
  p:option("--split", "backwards: auto (the search chooses), always (I + W) or never (B)", "auto")
    :choices { "auto", "always", "never" }
  p:option("--time", "seconds of search", "1"):convert(cli.number_option("--time", 0, 86400))
  p:option("--seed", "random seed", "1"):convert(cli.int_option("--seed", 0, 2147483647))
  p:flag("--robust", "run 4 searches, re-score each found schedule under +-10% per-stage cost "
    .. "jitter (20 draws) and keep the best 90th percentile")
  p:option("--format -f", "text or json", "text"):choices { "text", "json" }
  p:option("--output -o", "write the found schedule to FILE (.csv: PyTorch CSV; else luapipe JSON)")
  p:option("--svg", "write the found schedule's simulated timeline as SVG to FILE")
  p:epilog("Examples:\n"
    .. "  luapipe search --pp 4 --microbatches 12 --cost F=1,B=2,W=1 --memory 7 --w-share 0.5 "
    .. "--objective span\n"
    .. "  luapipe search -p 8 -m 32 --cost F=1,B=2,W=1,FB=2.2 --memory 8 --placement "
    .. "v -o found.csv\n"
    .. "  luapipe simulate found.csv --cost F=0.5,B=1,W=0.5,FB=1.1   (a V stage costs half)")
end

local num = function(x) return require("luapipe.sim").format_number(x) end

local function peaks(t)
  local out = {}
  for i, v in ipairs(t) do out[i] = num(v) end
  return table.concat(out, " ")
end

function M.run(args)
  local search = require("luapipe.search")
  local cost, cerr = common.parse_cost(args.cost)
  if not cost then return cli.fail("search", cerr, 2) end
  if cost.stages then
    return cli.fail("search", "--cost: per-stage costs (such as F[3]=...) are not taken here; "
      .. "use luapipe.search{...} with act/stage costs", 2)
  end
  if cost.bytes then
    return cli.fail("search", "--cost: bytes= (a link model) is not searched over", 2)
  end
  local placement = args.placement
  if not (placement == "linear" or placement == "v" or placement == "bidirectional"
      or placement == "any" or placement:match("^interleaved:%d+$")
      or placement == "interleaved") then
    return cli.fail("search", string.format("--placement '%s': expected linear, interleaved:V, v, "
      .. "bidirectional or any", placement), 2)
  end
  local opts = { pp = args.pp, microbatches = args.microbatches, cost = cost, memory = args.memory,
    w_share = args.w_share, placement = placement, objective = args.objective, split = args.split,
    time = args.time, seed = args.seed, robust = args.robust or nil, act_values = args.act_values,
    precision = args.precision, memory_bytes = args.memory_bytes }
  if args.format == "json" then opts.progress = false end
  -- the command names itself: the reason is the text after the API's name
  local ok, res, err, reason = pcall(search.search, opts)
  if not ok then
    return cli.fail("search", util.is_error(res) and res.reason or util.message(res), 2)
  end
  if not res then return cli.fail("search", reason or err) end
  local s = res:schedule()
  if args.output then
    local text = args.output:match("%.csv$") and s:to_csv() or s:to_json()
    local wok, werr = common.emit(text, args.output)
    if not wok then return cli.fail("search", werr) end
  end
  if args.svg then
    local info = s:info()
    local c = res.cost
    local f = args.pp / info.stages
    local sres = assert(s:simulate { F = c.F * f, B = c.B * f, I = c.I * f, W = c.W * f,
      FB = c.FB and c.FB * f, latency = c.latency })
    local wok, werr = sres:write_svg(args.svg)
    if not wok then return cli.fail("search", werr) end
  end
  local st = res.stats
  if args.format == "json" then
    local json = require("luapipe.json")
    local sj = json.decode(s:to_json())
    io.write(json.encode({ makespan = st.makespan, span = st.span, lower_bound = st.lower_bound,
      gap = st.gap, peak_memory = res:peak_memory(), placement = res.placement_name,
      objective = args.objective, schedule = sj, evaluations = st.evaluations,
      seconds = res:seconds(), best_from = st.label,
      bounds = res.bounds, zb_greedy = st.zb_greedy ~= math.huge and st.zb_greedy or nil,
      robust = res.robust },
      { indent = true, keyorder = { "makespan", "span", "lower_bound", "gap", "peak_memory",
        "placement", "objective", "evaluations", "seconds", "best_from", "bounds",
        "zb_greedy", "robust", "schedule" } }), "\n")
  else
    local c = res.cost
    print(string.format("P=%d ranks, M=%d micro-batches, cost F=%s B=%s I=%s W=%s%s latency=%s, "
      .. "memory %s per rank, w_share %s, objective %s", args.pp, args.microbatches, num(c.F),
      num(c.B), num(c.I), num(c.W), c.FB and (" FB=" .. num(c.FB)) or "", num(c.latency),
      args.memory and num(args.memory) or args.memory_bytes and string.format("%s bytes (%s "
        .. "activations at %s)", num(args.memory_bytes),
        num(search._internal.memory_units(opts, args.pp)[1]), args.precision or "f32")
        or "unlimited", num(args.w_share), args.objective))
    print(string.format("%-22s %10s %10s %10s  %s", "schedule", "makespan", "span", "bubble",
      "peak memory per rank"))
    local bubble = 0
    local info = s:info()
    local f = args.pp / info.stages
    local sres = s:simulate { F = c.F * f, B = c.B * f, I = c.I * f, W = c.W * f,
      FB = c.FB and c.FB * f, latency = c.latency }
    local pending, pending_rank = 0, 0
    if sres then
      bubble = sres:max_bubble()
      for _, r in ipairs(sres:ranks()) do
        if (r.peak_pending_w or 0) > pending then
          pending, pending_rank = r.peak_pending_w, r.rank
        end
      end
    end
    print(string.format("%-22s %10s %10s %10s  %s", "search (" .. res.placement_name .. ")",
      num(st.makespan), num(st.span), num(bubble), peaks(res:peak_memory())))
    if res:peak_bytes() then
      print(string.format("%-22s %10s %10s %10s  %s", "  in bytes (" .. res.precision .. ")", "",
        "", "", peaks(res:peak_bytes())))
    end
    if st.zb_greedy ~= math.huge then
      print(string.format("%-22s %10s %10s %10s  %s", "Zero Bubble greedy", "-",
        args.objective == "span" and num(st.zb_greedy) or "-", "-",
        "(its best of 8 settings, " .. args.objective .. " " .. num(st.zb_greedy) .. ")"))
    end
    local rows = search.families(opts, c)
    local unfit = {}
    for _, r in ipairs(rows) do
      if r.error then
        unfit[#unfit + 1] = r.label .. " (not built)"
      elseif not r.fits then
        unfit[#unfit + 1] = string.format("%s (peak %s)", r.label,
          num(math.max(table.unpack(r.peak))))
      else
        print(string.format("%-22s %10s %10s %10s  %s", r.label, num(r.makespan), num(r.span),
          num(r.bubble), peaks(r.peak)))
      end
    end
    if #unfit > 0 then
      print("over the memory limit or not built: " .. table.concat(unfit, ", "))
    end
    if args.memory and pending > args.memory then
      -- the limit counts a pending W (an I done, its W not yet) as w_share of an activation
      print(string.format("note: the found schedule holds up to %s weight-grads pending at once "
        .. "(rank %d; an I done, its W not yet), more than the memory limit of %s: %s",
        num(pending), pending_rank, num(args.memory), args.w_share == 0
        and "with --w-share 0 a pending W counts as no memory, so the limit does not bound them "
          .. "(Zero Bubble's rule counts half an activation: --w-share 0.5)"
        or string.format("--w-share %s counts each as %s of an activation", num(args.w_share),
          num(args.w_share))))
    end
    -- the parts of the bound that bound this objective (docs/search.md):
    -- span is bounded by work, critical path and memory-time; makespan
    -- also by start skew and warm-up
    local b = res.bounds
    local parts = { "work " .. num(b.work) }
    if args.objective ~= "span" then parts[#parts + 1] = "start skew " .. num(b.skew) end
    parts[#parts + 1] = "critical path " .. num(b.path)
    parts[#parts + 1] = "memory-time " .. num(b.memory_time)
    if args.objective ~= "span" and (b.warmup or 0) > 0 then
      parts[#parts + 1] = "warm-up " .. num(b.warmup)
    end
    print(string.format("lower bound (%s) %s: %s", args.objective, num(st.lower_bound),
      table.concat(parts, ", ")))
    print(string.format("gap %.2f%%%s; %d evaluations in %.2f s; best from %s", 100 * st.gap,
      st.gap == 0 and " (optimal for this cost model)" or "", st.evaluations, res:seconds(),
      st.label))
    if res.robust then
      print(string.format("robust: kept the best 90th percentile under +-%g%% cost jitter of %d "
        .. "candidates: p90 %s (nominal %s)", 100 * res.robust.jitter, res.robust.candidates,
        num(res.robust.p90), num(res.robust.nominal)))
    end
    if res.interrupted then print("(interrupted: the best so far)") end
  end
  local out = args.format == "json" and io.stderr or io.stdout
  if args.output then out:write("wrote ", args.output, "\n") end
  if args.svg then out:write("wrote SVG timeline to ", args.svg, "\n") end
  return 0
end

return M
