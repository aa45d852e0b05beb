-- .luacheckrc: luacheck over lua/ (Debian lua-check; the ctest test
-- cli_test_lint runs `luacheck lua/`). Lua 5.4, no globals.
std = "lua54"
-- lines are at most 100 columns, as in the C code (.clang-format)
max_line_length = 100
files["lua/luapipe/cli/help.lua"] = {
  max_line_length = false, -- the help topics: rows of text, one string each
}
