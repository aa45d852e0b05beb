-- luapipe.cli: the `luapipe <command>` subcommands. Each command is a module
-- luapipe.cli.<name> returning {summary=, parser=function(argparse) -> p,
-- run=function(args) -> exit code}.
local M = {}

M.commands = {
  { name = "schedule", summary = "build a schedule and print, check or export it" },
  { name = "simulate", summary = "simulate a schedule under a cost model; text, JSON, SVG, trace" },
  { name = "bubbles", summary = "DualPipe's bubble table measured for every family" },
  { name = "eplb", summary = "expert placement (DeepSeek EPLB) from a load file" },
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
  p:add_help("-h --help")
  if cmd.parser then cmd.parser(p) end
  return p, cmd
end

function M.help_text(topic)
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
    lines[#lines + 1] = "Run `luapipe help <command>` for a command's options,"
    lines[#lines + 1] = "`luapipe help env` for the LUAPIPE_* environment variables."
    lines[#lines + 1] = "With no arguments luapipe starts a REPL; `luapipe --help` lists its options."
    return table.concat(lines, "\n") .. "\n"
  elseif topic == "env" then
    local core = require("luapipe.core")
    local lines = { "Environment variables:" }
    for _, k in ipairs(core.env_knobs()) do
      lines[#lines + 1] = string.format("  %-18s %s (default: %s)", k.name, k.summary,
        k.default == "" and "unset" or k.default)
    end
    return table.concat(lines, "\n") .. "\n"
  elseif by_name[topic] and topic ~= "help" then
    return (make_parser(topic):get_help()) .. "\n"
  elseif topic == "help" then
    return "usage: luapipe help [command | env]\n"
  end
  return nil, "unknown help topic '" .. tostring(topic) .. "'"
end

-- Runs `luapipe <argv[1]> argv[2..]`; returns the exit code.
function M.main(argv)
  local name = argv[1]
  local rest = { table.unpack(argv, 2) }
  if name == "help" then
    local text, err = M.help_text(rest[1])
    if not text then
      io.stderr:write("luapipe help: ", err, "\n", M.help_text())
      return 2
    end
    io.write(text)
    return 0
  end
  local parser, cmd = make_parser(name)
  local ok, args = parser:pparse(rest)
  if not ok then
    io.stderr:write(parser:get_usage(), "\n\nError: ", args, "\n")
    return 2
  end
  local code = cmd.run(args)
  return code or 0
end

-- Helper for commands: print "luapipe <cmd>: msg" to stderr, return code.
function M.fail(cmd, msg, code)
  io.stderr:write("luapipe ", cmd, ": ", tostring(msg), "\n")
  return code or 1
end

return M
