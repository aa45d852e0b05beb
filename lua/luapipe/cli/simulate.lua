-- `luapipe simulate`: simulate a schedule under a cost model and report the
-- timeline, bubbles and memory; optionally write an SVG and a trace.
local common = require("luapipe.cli.common")
local cli = require("luapipe.cli")

local M = {}

function M.parser(p)
  p:description("Simulate a schedule under a cost model: per-rank timeline, makespan, busy "
    .. "time, bubble (makespan - busy), bubble ratio, peak activations. Costs are per action of "
    .. "one model stage (a chunk), DeepSeek's convention: a family that cuts the model into "
    .. "more stages (interleaved 1F1B's v chunks per rank, ZB-V's and DualPipeV's two) runs "
    .. "a bigger model under the same --cost; to compare families on one model divide its "
    .. "costs by the chunks per rank (luapipe bubbles does: every family on one model).")
  common.add_schedule_options(p)
  p:option("--cost -c", "costs, e.g. F=1,B=2,W=1,FB=2.5,latency=0 (B = I + W); "
    .. "per model stage: F[3]=2", "F=1,B=2,W=1")
  p:option("--format -f", "text or json", "text"):choices { "text", "json" }
  p:option("--link", "emulated link: every cross-rank message also takes lat + bytes/bw, "
    .. "e.g. lat=50us,bw=2GB/s (us|ms|s; GB/s|MB/s|KB/s); message size: bytes= in --cost; "
    .. "costs in seconds")
  p:option("--precision", "f32 or bf16: the bytes of an activation value (4 or 2) for values= "
    .. "in --cost (values in one activation): message sizes and the peak activation bytes")
    :choices { "f32", "bf16" }
  p:option("--svg", "write the timeline as SVG to FILE")
  p:option("--trace", "write a Chrome/Perfetto trace (JSON) to FILE")
  p:flag("--no-gantt", "text format: leave out the Gantt chart")
  p:epilog("Examples:\n  luapipe simulate dualpipe --pp 8 --microbatches 20 --cost "
    .. "F=1,B=2,W=1,FB=3\n"
    .. "  luapipe simulate zb1p -p 4 -m 8 --svg zb1p.svg --trace zb1p.json")
end

local function result_json(s, res, cost)
  local json = require("luapipe.json")
  local info = s:info()
  local ranks = {}
  for i, r in ipairs(res:ranks()) do
    local mem = s:memory(r.rank)
    ranks[i] = { rank = r.rank, busy = r.busy, bubble = r.bubble, bubble_ratio = r.bubble_ratio,
      finish = r.finish, peak_activations = r.peak_live, peak_pending_w = r.peak_pending_w,
      param_stages = mem.param_stages,
      peak_activation_bytes = r.peak_act_bytes > 0 and r.peak_act_bytes or nil }
  end
  local timeline = {}
  for i, e in ipairs(res:events()) do
    timeline[i] = { rank = e.rank, action = e.text, start = e.start, finish = e.finish }
  end
  return json.encode({ schedule = info.name, ranks = info.ranks, stages = info.stages,
    microbatches = info.microbatches, cost = cost, makespan = res:makespan(),
    max_bubble = res:max_bubble(), per_rank = ranks, timeline = timeline },
    { indent = true, keyorder = { "schedule", "ranks", "stages", "microbatches", "cost",
      "makespan", "max_bubble", "per_rank", "timeline" } })
end

function M.run(args)
  local cost, cerr = common.parse_cost(args.cost)
  if not cost then return cli.fail("simulate", cerr, 2) end
  if args.link then
    local l, lerr = require("luapipe.comm").parse_link(args.link)
    if not l then return cli.fail("simulate", "--link: " .. lerr, 2) end
    cost.link = args.link
  end
  if args.precision then
    if not cost.values then
      return cli.fail("simulate", "--precision needs values= in --cost (values in one "
        .. "activation: what it sizes in bytes)", 2)
    end
    cost.precision = args.precision
  end
  local s, err, code = common.load_schedule(args)
  if not s then return cli.fail("simulate", err, code) end
  local res, serr, scode = common.simulate(s, cost)
  if not res then return cli.fail("simulate", serr, scode) end
  if args.format == "json" then
    io.write(result_json(s, res, cost), "\n")
  else
    io.write(tostring(s), "\n")
    if not args.no_gantt then io.write(res:gantt(), "\n") end
    io.write(res:summary(), "\n")
  end
  local out = args.format == "json" and io.stderr or io.stdout
  if args.svg then
    local wok, werr = res:write_svg(args.svg)
    if not wok then return cli.fail("simulate", werr) end
    out:write("wrote SVG timeline to ", args.svg, "\n")
  end
  if args.trace then
    local wok, werr = res:write_trace(args.trace)
    if not wok then return cli.fail("simulate", werr) end
    out:write("wrote Chrome/Perfetto trace to ", args.trace,
      " (open in ui.perfetto.dev or chrome://tracing)\n")
  end
  return 0
end

return M
