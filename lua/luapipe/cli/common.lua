-- luapipe.cli.common: options and steps shared by the schedule commands.
local schedule = require("luapipe.schedule")
local util = require("luapipe.util")

local M = {}

-- Adds the options that pick a schedule: NAME plus --pp/--microbatches/--chunks.
function M.add_schedule_options(p)
  p:argument("schedule", "a family (" .. table.concat(schedule.families, ", ") ..
    "), a .csv or .json schedule file, or a .lua file returning a schedule")
  p:option("--pp -p", "pipeline ranks (P)", "4"):convert(tonumber)
  p:option("--microbatches -m", "micro-batches per step (M)", "8"):convert(tonumber)
  p:option("--chunks", "model chunks per rank (interleaved1f1b)", "2"):convert(tonumber)
  p:option("--sends", "send model the validation assumes: buffered (a send never waits "
    .. "for its receive; the executor's) or rendezvous", "buffered")
    :choices { "buffered", "rendezvous" }
end

local function positive_int(name, v)
  if math.type(v) ~= "integer" and not (type(v) == "number" and v == math.floor(v)) then
    return nil, string.format("--%s must be an integer, got %s", name, tostring(v))
  end
  if v < 1 then return nil, string.format("--%s must be at least 1, got %d", name, v) end
  return math.tointeger(v)
end

-- Loads the schedule the options name and validates it.
-- Returns the schedule or nil, message.
function M.load_schedule(args)
  local opts = {}
  for _, k in ipairs { "pp", "microbatches", "chunks" } do
    local v, err = positive_int(k, args[k])
    if not v then return nil, err end
    opts[k] = v
  end
  local s, err = schedule.load(args.schedule, opts)
  if not s then return nil, err end
  local ok, verr = s:validate { sends = args.sends }
  if not ok then return nil, "invalid schedule: " .. verr end
  return s
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
