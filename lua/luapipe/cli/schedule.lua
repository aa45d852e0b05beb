-- `luapipe schedule`: build (or load) a schedule, validate it, and print,
-- draw or export it.
local common = require("luapipe.cli.common")
local cli = require("luapipe.cli")

local M = {}

function M.parser(p)
  p:description("Build a schedule (a family or a file), validate it, and print its per-rank "
    .. "action lists, a Gantt chart, or export it as CSV (PyTorch format) or JSON.")
  common.add_schedule_options(p)
  p:option("--format -f", "text (per-rank actions), gantt, csv or json", "text")
    :choices { "text", "gantt", "csv", "json" }
  p:flag("--lower", "insert SEND/RECV so it runs under blocking point-to-point")
  p:option("--output -o", "write to FILE instead of standard output")
  p:epilog("Examples:\n  luapipe schedule dualpipe --pp 4 --microbatches 8\n"
    .. "  luapipe schedule 1f1b -p 4 -m 8 --format csv -o 1f1b.csv\n"
    .. "  luapipe schedule examples/eager_1f1b.lua -p 4 -m 8 --format gantt\n"
    .. "A schedule file (.lua) is run with the options {pp =, microbatches =, chunks =} as `...`\n"
    .. "(--pp, --microbatches, --chunks as typed or defaulted) and returns the schedule.")
end

local function text_listing(s)
  local info = s:info()
  local lines = { tostring(s) }
  for r = 0, info.ranks - 1 do
    lines[#lines + 1] = string.format("rank %d: %s", r, table.concat(s:actions(r), " "))
  end
  return table.concat(lines, "\n") .. "\n"
end

function M.run(args)
  local s, err, code = common.load_schedule(args)
  if not s then return cli.fail("schedule", err, code) end
  if args.lower then
    local lowered, lerr = s:lower()
    if not lowered then return cli.fail("schedule", lerr) end
    s = lowered
  end
  local text
  if args.format == "csv" then
    text = s:to_csv()
  elseif args.format == "json" then
    text = s:to_json()
  elseif args.format == "gantt" then
    text = s:gantt()
  else
    text = text_listing(s)
  end
  local ok, werr = common.emit(text, args.output)
  if not ok then return cli.fail("schedule", werr) end
  if args.output then io.stderr:write("wrote ", args.output, "\n") end
  return 0
end

return M
