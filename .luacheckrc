-- .luacheckrc: luacheck over lua/ (Debian lua-check; the ctest test
-- cli_test_lint runs `luacheck lua/`). Lua 5.4, no globals.
std = "lua54"
-- lines are at most 100 columns, as in the C code (.clang-format)
max_line_length = 100
files["lua/luapipe/cli/help.lua"] = {
  max_line_length = false, -- the help topics: rows of text, one string each
}
-- to be rewrapped to 100 columns (they were being edited in parallel when
-- the limit went from 120 to 100); until then they keep the old limit
for _, f in ipairs {
  "lua/luapipe/checkpoint.lua", "lua/luapipe/cli/profile.lua",
  "lua/luapipe/cli/train_options.lua", "lua/luapipe/models/checkpoint.lua",
  "lua/luapipe/models/config.lua", "lua/luapipe/models/init.lua",
  "lua/luapipe/models/names.lua", "lua/luapipe/nn.lua", "lua/luapipe/perf.lua",
  "lua/luapipe/profile.lua", "lua/luapipe/train.lua",
} do
  files[f] = { max_line_length = 120 }
end
