-- luapipe: pipeline-parallel schedules, simulation, execution and expert
-- placement, scriptable from Lua. This is the table the REPL and scripts
-- see as the global `luapipe`; submodules load on first use.
local core = require("luapipe.core")
local util = require("luapipe.util")

local M = {
  core = core,
  version = core.version(),
}

local lazy = {
  schedule = "luapipe.schedule",
  schedules = "luapipe.schedules",
  sim = "luapipe.sim",
  show = "luapipe.show",
  eplb = "luapipe.eplb",
  comm = "luapipe.comm",
  nn = "luapipe.nn",
  train = "luapipe.train",
  checkpoint = "luapipe.checkpoint",
  perf = "luapipe.perf",
  json = "luapipe.json",
  util = "luapipe.util",
  cli = "luapipe.cli",
  search = "luapipe.search",
  profile = "luapipe.profile",
  models = "luapipe.models",
}

local function names()
  local n = {}
  for k in pairs(lazy) do n[#n + 1] = k end
  return n
end

-- luapipe.<module> loads it; a mistyped name ("luapipe.schedul") raises
-- "luapipe has no 'schedul' (did you mean 'schedule'?)".
setmetatable(M, {
  __index = function(t, k)
    local name = lazy[k]
    if name then
      local mod = require(name)
      if type(mod) == "table" and getmetatable(mod) == nil then
        util.guard(mod, "luapipe." .. k) -- modules that do not guard themselves (show)
      end
      rawset(t, k, mod)
      return mod
    end
  end,
})
util.guard(M, "luapipe", names)

-- The REPL's help: the Lua API. The luapipe program's commands (the list
-- is luapipe.cli's) have their own, `luapipe help [command]` in a shell;
-- luapipe.help("cli") and luapipe.help("cli simulate") show it here.
local function commands_note()
  return "The luapipe program's commands (" .. require("luapipe.cli").command_list() .. ") have "
    .. "their own help: `luapipe help` and `luapipe help <command>` in a shell (here: "
    .. "luapipe.help(\"cli\"), luapipe.help(\"cli simulate\")).\n"
end

-- Entries of the API topics whose signature names `fname` (a function or
-- method: "schedule.load", "s:validate", "load"): {topic, signature,
-- summary} ..., and every such name for "did you mean".
-- A class or module name as a person writes it before a method
-- ("Schedule:push", "schedule.push", "SimResult:makespan") -> its topic.
local class_topics = { simresult = "sim", tensor = "nn", layer = "nn", model = "nn",
  balancer = "eplb", exec = "train" }

local function find_function(fname)
  local api = require("luapipe.cli.help")
  local owner, method = fname:match("^([%a_][%w_]*)[.:]([%w_]+)$")
  local owner_topic = owner and (class_topics[owner:lower()] or owner:lower())
  local hits, all, seen = {}, {}, {}
  for _, t in ipairs(api.topics) do
    for _, e in ipairs(t) do
      for path, sep, name in e[1]:gmatch("([%a_][%w_%.]*)([.:])([%w_]+)%s*[%({]") do
        local full = path .. sep .. name
        if not seen[full] then seen[full] = true; all[#all + 1] = full end
        if fname == full or fname == name or (method == name and owner_topic == t.name) then
          hits[#hits + 1] = { t.name, e[1], e[2] }
        end
      end
    end
  end
  return hits, all
end

-- Help text for the REPL (see luapipe.help), or nil, message.
function M.help_text(topic)
  local cli = require("luapipe.cli")
  local api = require("luapipe.cli.help")
  if topic == nil or topic == "" then
    return "luapipe " .. M.version .. ": the Lua API, one topic per module (luapipe.help(\"topic\"); "
      .. "luapipe.help(\"schedule.load\") for one function):\n" .. api.list()
      .. "  env        the LUAPIPE_* environment variables\n\n" .. commands_note()
  end
  if type(topic) ~= "string" then
    return nil, string.format("luapipe.help: the topic must be a string such as \"schedule\", got %s",
      util.shown(topic))
  end
  local bare = topic:match("^luapipe%.(.+)$") or topic
  if api.by_name[bare] then return api.text(bare) end
  if topic == "env" then return cli.help_text("env") end
  if topic == "cli" then return cli.help_text(nil) end
  local cmd = topic:match("^cli%s+(%S+)$")
  if cmd then return cli.help_text(cmd) end
  if cli.is_command(topic) then
    return string.format("'%s' is a command of the luapipe program, not a Lua API topic: its options "
      .. "are `luapipe help %s` in a shell (luapipe.help(\"cli %s\") here)%s.\n", topic, topic, topic,
      topic == "simulate" and "; simulating from Lua: luapipe.help(\"sim\")" or "")
  end
  local hits, all = find_function(bare)
  if #hits > 0 then
    local lines = {}
    for _, h in ipairs(hits) do
      lines[#lines + 1] = string.format("  %s\n      %s   (luapipe.help(\"%s\") for the module)", h[2], h[3], h[1])
    end
    return table.concat(lines, "\n") .. "\n"
  end
  local candidates = api.names()
  candidates[#candidates + 1] = "env"
  candidates[#candidates + 1] = "cli"
  for _, f in ipairs(all) do candidates[#candidates + 1] = f end
  local near = util.did_you_mean(bare, candidates)
  local topics = api.names()
  topics[#topics + 1] = "env"
  return nil, string.format("unknown help topic '%s'%s; topics: %s (or a function: luapipe.help(\"schedule.load\"))",
    topic, near and string.format(" (did you mean '%s'?)", near) or "", table.concat(topics, ", "))
end

-- luapipe.help([topic]) prints help text in the REPL: the API topics, or
-- one topic (schedule, sim, eplb, nn, train, comm, ...), one function
-- ("schedule.load", "s:validate"), "env", or the program's command-line
-- help ("cli", "cli simulate"). Returns nothing, so the REPL echoes
-- nothing.
function M.help(topic)
  local text, err = M.help_text(topic)
  io.write(text or (err .. "\n"))
end

return M
