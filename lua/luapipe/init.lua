-- luapipe: pipeline-parallel schedules, simulation, execution and expert
-- placement, scriptable from Lua. This is the table the REPL and scripts
-- see as the global `luapipe`; submodules load on first use.
local core = require("luapipe.core")

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
  cli = "luapipe.cli",
  search = "luapipe.search",
}

setmetatable(M, {
  __index = function(t, k)
    local name = lazy[k]
    if name then
      local mod = require(name)
      rawset(t, k, mod)
      return mod
    end
  end,
})

-- luapipe.help([topic]) prints help text in the REPL: the commands and
-- API topics, or one topic (schedule, sim, eplb, nn, train, comm, ...).
-- Returns nothing, so the REPL echoes nothing.
function M.help(topic)
  local cli = require("luapipe.cli")
  local text, err = cli.help_text(topic, true)
  io.write(text or (err .. "\n"))
end

return M
