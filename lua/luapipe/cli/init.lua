-- luapipe.cli: the `luapipe <command>` subcommands. Each command is a module
-- luapipe.cli.<name> returning {summary=, parser=function(argparse) -> p,
-- run=function(args) -> exit code}.
local M = {}

M.commands = {
  { name = "schedule", summary = "build a schedule and print, check or export it" },
  { name = "simulate", summary = "simulate a schedule under a cost model; text, JSON, SVG, trace" },
  { name = "bubbles", summary = "DualPipe's bubble table measured for every family" },
  { name = "eplb", summary = "expert placement (DeepSeek EPLB) from a load file" },
  { name = "search", summary = "search a schedule for your costs and memory; lower bound and gap" },
  { name = "profile", summary = "read profiler traces: compute/communication overlap, phases, costs" },
  { name = "model", summary = "a DeepSeek-V3 checkpoint: info, forward logits, gradients" },
  { name = "help", summary = "help on a command, or on environment variables (help env)" },
}

local by_name = {}
for _, c in ipairs(M.commands) do by_name[c.name] = c end

function M.is_command(name)
  return by_name[name] ~= nil
end

local function load_command(name)
  return require("luapipe.cli." .. name)
end

-- Builds the argparse parser of command `name`.
local function make_parser(name)
  local argparse = require("argparse")
  local cmd = load_command(name)
  local p = argparse("luapipe " .. name, by_name[name].summary)
  -- --help wraps like `luapipe help NAME` (luapipe.cli.help.wrap, after
  -- argparse has laid the options out to the same width, so that a wrapped
  -- description stays beside its option's names)
  p:help_max_width(require("luapipe.cli.help").width())
  p:add_help { "-h --help", action = function()
    io.write(require("luapipe.cli.help").wrap(p:get_help() .. "\n"))
    os.exit(0)
  end }
  if cmd.parser then cmd.parser(p) end
  return p, cmd
end

-- The candidate closest to word (case-insensitive) when it is a plausible
-- typo (at most 2 edits, and fewer than half the word); else nil. (The
-- library's one "did you mean": luapipe.util.did_you_mean.)
function M.suggest(word, candidates)
  return require("luapipe.util").did_you_mean(tostring(word), candidates)
end

local function command_names()
  local names = {}
  for _, c in ipairs(M.commands) do names[#names + 1] = c.name end
  return names
end

-- cli.command_list() -> "schedule, simulate, ..., help": the one list of
-- the program's commands that `luapipe --help`, `luapipe help`, the
-- REPL's luapipe.help() and the README's synopsis show
-- (tests/cli/test_command_lists.sh holds them equal).
function M.command_list()
  return table.concat(command_names(), ", ")
end

local function help_topics()
  local names, seen = command_names(), {}
  names[#names + 1] = "env"
  for _, n in ipairs(names) do seen[n] = true end
  for _, n in ipairs(require("luapipe.cli.help").names()) do
    names[#names + 1] = seen[n] and ("luapipe." .. n) or n
  end
  return names
end

-- Help text of topic: nil for the overview; a command (its options), "env",
-- or a Lua API topic ("sim", or "luapipe.sim"). A name that is both a
-- command and an API topic (schedule, eplb) gives the command, unless
-- prefer_api (luapipe.help in the REPL). Returns text or nil, message.
local help_text -- below; M.help_text wraps what it returns

function M.help_text(topic, prefer_api)
  local text, err = help_text(topic, prefer_api)
  if not text then return nil, err end
  return require("luapipe.cli.help").wrap(text)
end

help_text = function(topic, prefer_api)
  local api = require("luapipe.cli.help")
  if type(topic) == "string" then
    local bare = topic:match("^luapipe%.(.+)$")
    if bare and api.by_name[bare] then return api.text(bare) end
    if prefer_api and api.by_name[topic] then return api.text(topic) end
  end
  if topic == nil or topic == "" then
    local lines = {
      "usage: luapipe [options] [script.lua [args]]",
      "       luapipe <command> [options]",
      "",
      "Commands:",
    }
    for _, c in ipairs(M.commands) do
      lines[#lines + 1] = string.format("  %-10s %s", c.name, c.summary)
    end
    lines[#lines + 1] = ""
    lines[#lines + 1] = "Lua API topics (luapipe.help(\"topic\") in the REPL, `luapipe help <topic>` here):"
    lines[#lines + 1] = api.list()
      .. "  (schedule and eplb are commands too: `luapipe help luapipe.schedule` for the Lua API)\n"
    lines[#lines + 1] = "Run `luapipe help <command>` for a command's options,"
    lines[#lines + 1] = "`luapipe help env` for the LUAPIPE_* environment variables."
    lines[#lines + 1] = "With no arguments luapipe starts a REPL; `luapipe --help` lists its options."
    return table.concat(lines, "\n") .. "\n"
  elseif topic == "env" then
    local core = require("luapipe.core")
    local rows = {}
    for _, k in ipairs(core.env_knobs()) do
      rows[#rows + 1] = { k.name, string.format("%s (default: %s)", k.summary,
        k.default == "" and "unset" or k.default) }
    end
    rows[#rows + 1] = { "LUAPIPE_COLOR",
      "auto, always or never: ANSI colour (luapipe --color=WHEN sets it) (default: auto)" }
    rows[#rows + 1] = { "NO_COLOR",
      "set and not empty: no colour under auto (colour only when output ends at a terminal)" }
    rows[#rows + 1] = { "LUAPIPE_CHARSET", "auto, utf-8 or ascii: the characters of terminal "
      .. "pictures (the EPLB heat map); auto reads the locale, the first of LC_ALL, LC_CTYPE "
      .. "and LANG that is set: UTF-8 there gives block characters, anything else (the C "
      .. "locale) ASCII (default: auto)" }
    rows[#rows + 1] = { "COLUMNS", "the width help text wraps to (default: the terminal's, or 80)" }
    local w = 0
    for _, r in ipairs(rows) do w = math.max(w, #r[1]) end
    local lines = { "Environment variables:" }
    for _, r in ipairs(rows) do lines[#lines + 1] = string.format("  %-" .. w .. "s  %s", r[1], r[2]) end
    return table.concat(lines, "\n") .. "\n"
  elseif type(topic) == "string" and by_name[topic] and topic ~= "help" then
    local text = make_parser(topic):get_help() .. "\n"
    if api.by_name[topic] then
      text = text .. string.format("\nLua API: `luapipe help luapipe.%s` (luapipe.help(\"%s\") in the REPL)\n",
        topic, topic)
    end
    return text
  elseif topic == "help" then
    return "usage: luapipe help [command | env | topic]\n"
  elseif type(topic) == "string" and api.by_name[topic] then
    return api.text(topic)
  end
  local near = M.suggest(tostring(topic), help_topics())
  return nil, string.format("unknown help topic '%s'%s; topics: %s", tostring(topic),
    near and string.format(" (did you mean '%s'?)", near) or "", table.concat(help_topics(), ", "))
end

-- Messages of the option converters below: main prints such a message as
-- one line ("luapipe CMD: --pp must be ..."), without the usage text.
local value_errors = {}

local function value_error(msg)
  value_errors[msg] = true
  return nil, msg
end

-- Integer option converter for argparse's :convert: accepts an integer
-- written in decimal (or 1e3 style when it is a whole number; never hex)
-- in [min, max]; the message names the option and the range.
function M.int_option(option, min, max)
  return function(text)
    local v = not tostring(text):find("[xX]") and tonumber(text)
    local n = v and math.tointeger(v)
    if not n then
      return value_error(string.format("%s must be an integer from %d to %d, got '%s'", option,
        min, max, tostring(text)))
    end
    if n < min or n > max then
      return value_error(string.format("%s must be from %d to %d, got '%s'", option, min, max,
        tostring(text)))
    end
    return n
  end
end

-- Number option converter: a finite decimal number in [min, max] (max
-- may be math.huge); the message names the option and the range.
function M.number_option(option, min, max)
  return function(text)
    local v = not tostring(text):find("[xX]") and tonumber(text)
    local range = max == math.huge and string.format("%s or more", tostring(min))
      or string.format("from %s to %s", tostring(min), tostring(max))
    if not v or v ~= v or v == math.huge or v == -math.huge then
      return value_error(string.format("%s must be a number %s, got '%s'", option, range,
        tostring(text)))
    end
    if v < min or v > max then
      return value_error(string.format("%s must be %s, got '%s'", option, range, tostring(text)))
    end
    return v
  end
end

-- Parses argv with an argparse parser (a command's, or a script's own):
-- returns the arguments, or nil, exit code 2 after printing the error to
-- stderr (a bad option value as one line "PROG: message"; any other usage
-- error with the usage text; nothing when quiet, e.g. on ranks other than
-- 0). --help prints and exits 0 as argparse does.
function M.parse(parser, argv, prog, quiet)
  local ok, args = parser:pparse(argv)
  if ok then return args end
  if not quiet and value_errors[args] then
    io.stderr:write(prog or parser._name, ": ", args, "\n")
  elseif not quiet then
    io.stderr:write(parser:get_usage(), "\n\nError: ", args, "\n")
  end
  return nil, 2
end

-- For scripts: a usage error every rank found alike (the job policy,
-- luapipe.cli.job.usage_exit). Does not return.
function M.usage_exit(prog, msg)
  return require("luapipe.cli.job").usage_exit(prog, msg)
end

-- Runs `luapipe <argv[1]> argv[2..]`; returns the exit code.
function M.main(argv)
  local name = argv[1]
  local rest = { table.unpack(argv, 2) }
  if name == "help" then
    local text, err = M.help_text(rest[1])
    if not text then
      io.stderr:write("luapipe help: ", err, "\n")
      return 2
    end
    io.write(text)
    return 0
  end
  if not by_name[name] then
    local near = M.suggest(name, command_names())
    io.stderr:write(string.format("luapipe: '%s' is neither a command nor a file%s\n", name,
      near and string.format(" (did you mean '%s'?)", near) or ""))
    io.stderr:write("Commands: ", M.command_list(),
      " (`luapipe help` for more; `luapipe FILE.lua` runs a script)\n")
    return 2
  end
  local parser, cmd = make_parser(name)
  local args, usage_code = M.parse(parser, rest, "luapipe " .. name)
  if not args then return usage_code end
  local code = cmd.run(args)
  return code or 0
end

-- Helper for commands: print "luapipe <cmd>: msg" to stderr, return code.
function M.fail(cmd, msg, code)
  io.stderr:write("luapipe ", cmd, ": ", tostring(msg), "\n")
  return code or 1
end

return M
