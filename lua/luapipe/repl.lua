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

-- ---- Tab completion ----

local keywords = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function",
  "goto", "if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until",
  "while" }

-- Names of a value that `v.` completes: a table's string keys (for a
-- guarded one, util.known_names: the names "did you mean" chooses from,
-- luapipe's modules before they load included), then those its __index
-- table offers.
local function fields(v)
  local names, seen = {}, {}
  local function add(list)
    for _, n in ipairs(list) do
      if not seen[n] then seen[n] = true; names[#names + 1] = n end
    end
  end
  if type(v) == "table" then add(util.known_names(v)) end
  local mt = getmetatable(v)
  local index = type(mt) == "table" and rawget(mt, "__index")
  if type(index) == "table" then add(util.known_names(index)) end
  return names
end

-- Names of a value that `v:` completes: its methods (the functions among
-- its fields: a Schedule's, a SimResult's, a Balancer's ...).
local function methods(v)
  local names = {}
  for _, n in ipairs(fields(v)) do
    local ok, f = pcall(function() return v[n] end)
    if ok and type(f) == "function" then names[#names + 1] = n end
  end
  return names
end

-- repl.complete(word[, env]) -> the sorted completions of word, the text
-- before the cursor back to a space or a bracket: a global name or a
-- keyword ("lua" -> "luapipe"), a field of a value reached by names
-- ("luapipe.sch" -> "luapipe.schedule", "luapipe.schedules"), or a method
-- ("s:val" -> "s:validate"). env: where names are looked up (default the
-- globals). What the REPL's Tab calls; an expression it cannot reach by
-- plain names (a call, an index by a key) completes to nothing.
function M.complete(word, env)
  env = env or _G
  if type(word) ~= "string" then return {} end
  local path, sep, part = word:match("^(.*)([.:])([%a_]?[%w_]*)$")
  local names
  if not path then
    if not word:match("^[%a_]?[%w_]*$") then return {} end
    path, sep, part = "", "", word
    names = fields(env)
    for _, k in ipairs(keywords) do names[#names + 1] = k end
  else
    if not path:match("^[%a_][%w_]*$") and not path:match("^[%a_][%w_]*%.[%a_][%w_.]*[%w_]$") then
      return {}
    end
    local ok, v = pcall(function()
      local x = env
      for name in path:gmatch("[^.]+") do
        if type(x) ~= "table" and type(x) ~= "userdata" then return nil end
        x = x[name]
      end
      return x
    end)
    if not ok or v == nil then return {} end
    names = sep == ":" and methods(v) or fields(v)
  end
  local out, seen = {}, {}
  for _, n in ipairs(names) do
    if type(n) == "string" and n:sub(1, #part) == part and n:match("^[%a_][%w_]*$") and not seen[n] then
      seen[n] = true
      out[#out + 1] = path .. sep .. n
    end
  end
  table.sort(out)
  return out
end

return M
