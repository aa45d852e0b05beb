-- luapipe.util: small file helpers shared by the Lua layer.
local core = require("luapipe.core")

local M = {}

-- util.read_file(path) -> text | nil, "path: reason"
function M.read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local text = f:read("a")
  f:close()
  return text
end

-- util.write_file(path, text) -> true | nil, message. Atomic (a temporary
-- file renamed over path): a failure never leaves a half-written file.
M.write_file = core.write_file

return M
