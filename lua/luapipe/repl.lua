-- luapipe.repl: how the REPL shows the values an expression gives.
--
--   luapipe> {1, 2, x = {y = 3}}
--   {1, 2, x = {y = 3}}
--   luapipe> luapipe.schedule.build("1f1b", {pp = 2, microbatches = 2})
--   schedule '1f1b': 2 ranks, 2 stages (2 virtual), 2 micro-batches, 8 actions, valid
--
-- Tables are shown with util.pretty (depth 3, cycles as <cycle>); values
-- with a __tostring, strings and the rest as print shows them; several
-- values are separated by tabs, as print does.
local util = require("luapipe.util")

local M = {}

-- repl.show(...): writes the values, one line (or one block) in all.
function M.show(...)
  local n = select("#", ...)
  local out = {}
  for i = 1, n do
    local v = select(i, ...)
    local mt = getmetatable(v)
    if type(v) == "table" and not (type(mt) == "table" and rawget(mt, "__tostring")) then
      out[i] = util.pretty(v)
    else
      out[i] = tostring(v)
    end
  end
  io.write(table.concat(out, "\t"), "\n")
  io.flush()
end

return M
