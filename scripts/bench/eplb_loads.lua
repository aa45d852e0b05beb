-- Writes a seeded load file for scripts/bench/eplb (run by luapipe):
--   luapipe eplb_loads.lua LAYERS EXPERTS SEED OUT.json
-- Each layer: 131072 tokens spread over the experts by log-normal
-- (sigma 1) popularity, rounded to whole tokens. Same seed, same file.
local L, E, seed, out = math.tointeger(tonumber(arg[1])), math.tointeger(tonumber(arg[2])),
  math.tointeger(tonumber(arg[3])), arg[4]
assert(L and E and seed and out, "usage: eplb_loads.lua LAYERS EXPERTS SEED OUT.json")
math.randomseed(seed)
local rows = {}
for l = 1, L do
  local w, sum = {}, 0
  for e = 1, E do
    local z = math.sqrt(-2 * math.log(1 - math.random())) * math.cos(2 * math.pi * math.random())
    w[e] = math.exp(z)
    sum = sum + w[e]
  end
  for e = 1, E do w[e] = string.format("%d", math.floor(131072 * w[e] / sum + 0.5)) end
  rows[l] = "[" .. table.concat(w, ",") .. "]"
end
assert(require("luapipe.util").write_file(out, "[\n" .. table.concat(rows, ",\n") .. "\n]\n"))
