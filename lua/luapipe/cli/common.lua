-- luapipe.cli.common: options and steps shared by the schedule commands.
local schedule = require("luapipe.schedule")
local util = require("luapipe.util")
local cli = require("luapipe.cli")

local M = {}

-- Limits of the counting options (usage errors, exit 2, beyond them).
M.limits = { pp = 4096, microbatches = 65536, chunks = 64, passes = 4194304 }

-- Adds --pp/--microbatches/--chunks (integers checked by cli.int_option)
-- with the given defaults.
function M.add_count_options(p, pp, microbatches, chunks, chunks_help)
  local L = M.limits
  p:option("--pp -p", string.format("pipeline ranks (P), 1..%d", L.pp), pp)
    :convert(cli.int_option("--pp", 1, L.pp))
  p:option("--microbatches -m", string.format("micro-batches per step (M), 1..%d", L.microbatches),
    microbatches):convert(cli.int_option("--microbatches", 1, L.microbatches))
  p:option("--chunks", string.format("%s, 1..%d", chunks_help, L.chunks), chunks)
    :convert(cli.int_option("--chunks", 1, L.chunks))
end

-- Adds the options that pick a schedule: NAME plus --pp/--microbatches/--chunks.
function M.add_schedule_options(p)
  p:argument("schedule", "a family (" .. table.concat(schedule.families, ", ") ..
    "; any case), a .csv or .json schedule file, or a schedule file: a .lua file that gets "
    .. "{pp =, microbatches =, chunks =} as `...` and returns a schedule (examples/eager_1f1b.lua)")
  M.add_count_options(p, "4", "8", nil, "model chunks per rank (interleaved1f1b only; default 2)")
  p:option("--sends", "send model the validation assumes: nonblocking (SEND and RECV only "
    .. "post, a compute waits for its inputs' sends: the executor's and PyTorch's), buffered "
    .. "(a RECV waits for its send) or rendezvous (a send waits for its receive)", "nonblocking")
    :choices { "nonblocking", "buffered", "rendezvous" }
end

-- Checks the size of what the counts ask for; nil or a message.
function M.check_size(pp, microbatches, chunks)
  local n = pp * microbatches * (chunks or 1)
  if n > M.limits.passes then
    return string.format("--pp %d x --microbatches %d%s = %d micro-batch passes per stage is "
      .. "more than the limit of %d", pp, microbatches, chunks and (" x --chunks " .. chunks) or "",
      n, M.limits.passes)
  end
end

-- Resolves a family name typed in any case; returns the family, or nil,
-- message (with a suggestion). Names that look like files pass through.
function M.family(name)
  if name:find("[./]") then return name end
  local lower = name:lower()
  if schedule.is_family(lower) then return lower end
  local near = cli.suggest(lower, schedule.families)
  return nil, string.format("unknown schedule family '%s'%s (families: %s; or a .csv, .json or "
    .. ".lua file)", name, near and string.format("; did you mean '%s'?", near) or "",
    table.concat(schedule.families, ", "))
end

-- Loads the schedule the options name and validates it. Returns the
-- schedule, or nil, message, exit code (2 for a usage error: an unknown
-- family or options the family cannot be built with; 1 otherwise).
function M.load_schedule(args)
  local name, ferr = M.family(args.schedule)
  if not name then return nil, ferr, 2 end
  local fam = schedule.is_family(name)
  if fam and args.chunks and name:lower() ~= "interleaved1f1b" and name:lower() ~= "interleaved" then
    return nil, string.format("--chunks applies to interleaved1f1b only; %s has a fixed placement "
      .. "(%s)", name, (name == "zbv" or name == "dualpipev") and "two chunks per rank"
      or "one model stage per rank", name), 2
  end
  local serr = fam and M.check_size(args.pp, args.microbatches,
    name:find("interleaved") and args.chunks or nil)
  if serr then return nil, serr, 2 end
  local s, err = schedule.load(name, { pp = args.pp, microbatches = args.microbatches,
    chunks = args.chunks })
  if not s then return nil, err, fam and 2 or 1 end
  local ok, verr = s:validate { sends = args.sends }
  if not ok then return nil, "invalid schedule: " .. verr, 1 end
  -- the note: in the summary of the text formats, on stderr beside the others
  if s:note() and args.format ~= "text" then io.stderr:write("luapipe: note: ", s:note(), "\n") end
  return s
end

-- Parses --cost text with sim.parse_cost (which applies the core's one
-- cost rule, lp_sim_time_check). Returns the cost table, or nil, message
-- naming the item as the user typed it.
function M.parse_cost(text)
  local cost, err = require("luapipe.sim").read_cost(text)
  if not cost then return nil, "--cost: " .. err end
  return cost
end

-- The text of an error s:simulate raised. (The binding raises its messages
-- as "simulate: <text>" strings; the command names itself instead. This
-- one cut goes when the binding returns its errors as values.)
local function simulate_text(err)
  local msg = util.message(err)
  return msg:sub(1, 10) == "simulate: " and msg:sub(11) or msg
end

-- Which option holds the cost s:simulate refused, found by checking the
-- pieces themselves (never by reading the message): a per-stage cost of a
-- stage the schedule lacks (--cost), the link's latency under the core's
-- one cost rule (--link), the costs without the link (--cost); else the
-- two together (--cost/--link: a message's whole delay). Returns the
-- option and, when the check itself has the words, the text.
local function cost_fault(s, cost)
  local S = s:info().stages
  for k in pairs(type(cost.stages) == "table" and cost.stages or {}) do
    if math.type(k) ~= "integer" or k < 0 or k >= S then
      return "--cost", string.format("per-stage cost [%s] (as in F[%s]=...): this schedule's model "
        .. "stages are 0..%d", tostring(k), tostring(k), S - 1)
    end
  end
  if cost.link == nil then return "--cost" end
  local l = require("luapipe.comm").parse_link(cost.link)
  if l then
    local ok, why = require("luapipe.core").sim_check_time("link latency", l.latency)
    if not ok then return "--link", "cost model: " .. why end
  end
  local plain = {}
  for k, v in pairs(cost) do
    if k ~= "link" and k ~= "bytes" and k ~= "link_unit" then plain[k] = v end
  end
  if not pcall(s.simulate, s, plain) then return "--cost" end
  return "--cost/--link"
end

-- s:try_simulate(cost) with cost errors (a stage out of range, B < W, ...) as
-- nil, message, 2 instead of a raised error; other failures exit 1.
function M.simulate(s, cost)
  local ok, res, err = pcall(s.try_simulate, s, cost)
  if not ok then
    local opt, text = cost_fault(s, cost)
    return nil, opt .. ": " .. (text or simulate_text(res)), 2
  end
  if not res then return nil, err, 1 end
  return res
end

-- Writes text to path (atomically) or stdout when path is nil or "-".
function M.emit(text, path)
  if path == nil or path == "-" then
    io.write(text)
    if text:sub(-1) ~= "\n" then io.write("\n") end
    return true
  end
  return util.write_file(path, text)
end

return M
