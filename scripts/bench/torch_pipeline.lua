-- scripts/bench/torch_pipeline.lua OUT [--seed N] [--blocks N] [--dim N] [--heads N] [--text PATH]
-- The luapipe half of the char-LM model check of scripts/bench/torch_pipeline:
-- builds examples/train_char_lm.lua's model (the same vocabulary from the
-- same text, the same layer specs) in one process with the seed train{}
-- initialises it with, writes its initial parameters to OUT (safetensors,
-- float32, luapipe's names, which torch_pipeline.py's modules share) and
-- prints "params N vocab V". Parameters are initialised per name and seed
-- (not per partition), so they are the weights every rank of the example
-- starts from.
local nn = require("luapipe.nn")
local core = require("luapipe.core")

local out = arg[1]
local o = { seed = 1, blocks = 6, dim = 64, heads = 4, text = "/usr/share/common-licenses/GPL-3" }
for i = 2, #arg, 2 do
  local k = arg[i]:match("^%-%-(%a+)$")
  if not k or o[k] == nil or arg[i + 1] == nil then
    error("usage: torch_pipeline.lua OUT [--seed N] [--blocks N] [--dim N] [--heads N] "
      .. "[--text PATH]")
  end
  o[k] = k == "text" and arg[i + 1] or math.tointeger(tonumber(arg[i + 1]))
end
if not out then error("usage: torch_pipeline.lua OUT [--seed N] ...") end
local f = assert(io.open(o.text, "rb"))
local text = f:read("a")
f:close()
local seen, V = {}, 0
for c in text:gmatch(".") do
  if not seen[c] then seen[c] = true; V = V + 1 end
end
-- the example's model (examples/train_char_lm.lua)
local specs = { nn.embedding(V, o.dim) }
for _ = 1, o.blocks do
  specs[#specs + 1] = nn.transformer_block(o.dim, o.heads, 4 * o.dim, "gelu")
end
specs[#specs + 1] = nn.rmsnorm(o.dim)
specs[#specs + 1] = nn.linear(o.dim, V)
specs.loss = "cross_entropy"
local layer = nn.sequential(specs):build(o.seed)
local tensors, n = {}, 0
for _, p in ipairs(layer:params()) do
  tensors[p.name] = core.tensor(p.shape, p.value)
  n = n + #p.value
end
assert(core.safetensors_write(out, tensors))
print(string.format("params %d vocab %d", n, V))
