-- .luacheckrc: luacheck over lua/ (Debian lua-check; the ctest test
-- lua_luacheck runs `luacheck lua/`). Lua 5.4, no globals.
std = "lua54"
-- the C code's limit is 100 (.clang-format); Lua lines may run to 120,
-- luacheck's default (250 of 8,650 lines are 101..120 wide today)
max_line_length = 120
files["lua/luapipe/cli/help.lua"] = {
  max_line_length = false, -- the help topics: rows of text, one string each
}
