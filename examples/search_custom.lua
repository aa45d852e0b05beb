-- search_custom.lua — a schedule search with a placement generator and an
-- objective of its own.
--
--   luapipe examples/search_custom.lua [--pp 4] [--microbatches 16] [--memory 4] [--time 1]
--
-- The placement: a "W" — the model in 3P stages that goes down the ranks,
-- back up, and down again (rank r holds stages r, 2P-1-r and 2P+r), so the
-- first and last ranks each hold an end of the model. The objective:
-- makespan plus the worst rank's idle time (a schedule that keeps every
-- rank busy is worth more than one that only ends early). The result is
-- printed beside the best V placement found for the same problem, then
-- written as PyTorch CSV (found.csv) for `luapipe simulate` or training.
local argparse = require("argparse")
local search = require("luapipe.search")

local p = argparse("search_custom.lua", "schedule search with an own placement and objective")
p:option("--pp", "ranks", "4"):convert(tonumber)
p:option("--microbatches", "micro-batches", "16"):convert(tonumber)
p:option("--memory", "activations per rank", "4"):convert(tonumber)
p:option("--time", "seconds per search", "1"):convert(tonumber)
p:option("--cost", "costs", "F=1,B=2,W=1,FB=2.4")
p:option("-o --output", "write the found schedule as CSV", "found.csv")
local args = p:parse(arg)

local function w_placement(pp)
  local ranks = {}
  for k = 0, 3 * pp - 1 do
    local leg, i = k // pp, k % pp
    ranks[k + 1] = leg == 1 and pp - 1 - i or i
  end
  return ranks
end

local function busy_objective(e)
  local idle = 0
  for _, r in ipairs(e.ranks) do idle = math.max(idle, e.makespan - r.busy) end
  return e.makespan + idle
end

local common = { pp = math.tointeger(args.pp), microbatches = math.tointeger(args.microbatches),
  cost = args.cost, memory = args.memory, w_share = 0.5, objective = busy_objective,
  time = args.time, seed = 7 }

local function run(placement)
  local o = {}
  for k, v in pairs(common) do o[k] = v end
  o.placement = placement
  local r, err = search.search(o)
  if not r then error(err, 0) end
  return r
end

local w = run(w_placement)
local v = run("v")
for _, x in ipairs { { "W (own generator)", w }, { "V", v } } do
  local r = x[2]
  print(string.format("%-18s objective %-8g makespan %-8g span %-8g peak %s  (%d evaluations)",
    x[1], r:objective(), r:makespan(), r:span(), table.concat(r:peak_memory(), " "),
    r:evaluations()))
end
local best = w:objective() <= v:objective() and w or v
assert(best:schedule():write_csv(args.output))
print("wrote " .. args.output .. " (" .. best.placement_name .. " placement)")
