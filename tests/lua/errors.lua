-- errors.lua — test helper (not a test): what a raised error says, for the
-- specs that assert exact error text. Load it beside the test:
--   local errors = dofile(here .. "errors.lua")
--   local error_of = errors.error_of
local lu = require("luaunit")
local util = require("luapipe.util")

local M = {}

-- error_of(f, ...) -> the text of the error f(...) raises, without the
-- place it names: a luapipe.Error's what (its place is in its fields), a
-- string error without the "file:line: " Lua's error(msg, level) put in
-- front (the core's errors have none). Fails the test when f returns.
function M.error_of(f, ...)
  local ok, err = pcall(f, ...)
  lu.assertFalse(ok, "expected an error")
  if util.is_error(err) then return util.message(err) end
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

-- text_of(f, ...) -> the whole text of the error f(...) raises, as the
-- luapipe program prints it (tostring: with its place).
function M.text_of(f, ...)
  local ok, err = pcall(f, ...)
  lu.assertFalse(ok, "expected an error")
  return tostring(err)
end

return M
