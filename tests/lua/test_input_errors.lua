-- Misuse of the core bindings and the Lua API: one clear error in the
-- user's words (the argument, the field, the limit), never a Lua internal
-- ("attempt to index ...", "bad argument #-2"), and the seam between the C
-- classes and the Lua layer (the binding never loads Lua modules).
local lu = require("luaunit")
local core = require("luapipe.core")
local schedule = require("luapipe.schedule")

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local error_of = dofile(here .. "errors.lua").error_of

function test_tensor_sizes()
  lu.assertEquals(error_of(core.tensor, { 2 ^ 32, 2 ^ 32 }),
    "tensor of 18446744073709551616 elements is too large")
  lu.assertEquals(error_of(core.tensor, { 2 ^ 62 }),
    "tensor of 4611686018427387904 elements is too large")
  lu.assertEquals(tostring(core.tensor({ 3, 4 })), "luapipe.Tensor [3, 4]")
  -- sizes past 2^31 are shown whole (an empty tensor: nothing allocated)
  lu.assertEquals(tostring(core.tensor({ 0, 2 ^ 33 })), "luapipe.Tensor [0, 8589934592]")
  -- empty, but dims whose dense strides would overflow int64
  lu.assertEquals(error_of(core.tensor, { 0, 2 ^ 62, 2 ^ 62 }),
    "tensor dims are too large (their product, zeros left out, overflows)")
  lu.assertEquals(error_of(core.tensor, { 2, 2 }, { 1, 2, 3 }),
    "tensor: 3 values given for a shape of 4 elements")
end


function test_set_params_names_the_argument()
  local l = core.nn_layer(require("luapipe.nn").linear(2, 1), "l", 1)
  lu.assertEquals(error_of(l.set_params, l, { [1] = { 1, 2 } }),
    "set_params: keys must be parameter names, got a number key")
  lu.assertEquals(error_of(l.set_params, l, { ["l.weight"] = 5 }),
    "set_params: 'l.weight' must be a list of 2 numbers, got a number")
  lu.assertEquals(error_of(l.set_params, l, { ["l.weight"] = { 1, "x" } }),
    "set_params: 'l.weight' value 2 is not a number")
end


function test_cost_checked_in_one_place()
  local sim = require("luapipe.sim")
  lu.assertEquals(error_of(sim.parse_cost, "F=1e308"),
    "cost item 'F=1e308': F = 1e+308 must be a number in 0..1e+15")
  lu.assertEquals(error_of(sim.parse_cost, "B[3]=-1"),
    "cost item 'B[3]=-1': B = -1 must be a number in 0..1e+15")
  local s = schedule.build("1f1b", { pp = 2, microbatches = 2 })
  lu.assertEquals(error_of(s.simulate, s, { F = 1e308 }),
    "simulate: F = 1e+308 must be a number in 0..1e+15")
  lu.assertEquals(error_of(s.simulate, s, { latency = -1 }),
    "simulate: latency = -1 must be a number in 0..1e+15")
  lu.assertEquals({ core.sim_check_time("W", 1e15) }, { true })
  local ok, err = core.sim_check_time("W", 0 / 0)
  lu.assertNil(ok)
  lu.assertStrContains(err, "must be a number in 0..1e+15")
end


function test_binding_never_loads_lua_modules()
  -- luapipe.core alone: C methods only; loading luapipe.schedule brings the
  -- Lua layer's methods (it installs them on the C classes)
  local code = [[
    local c = require("luapipe.core")
    local s = c.schedule_new(1, 1, 1)
    s:add_vstage(0, 0); s:set_route(0, { 0 }); s:push(0, { "0F0", "0B0" })
    local r = s:simulate()
    local before = tostring(r.show) .. " " .. tostring(s.show) .. " "
      .. tostring(package.loaded["luapipe.sim"])
    require("luapipe.schedule")
    io.write(before, " | ", type(r.show), " ", type(s.show), " ", type(r.summary))
  ]]
  local exe = arg[-1] or "luapipe"
  local f = assert(io.popen(string.format("%q -e %q", exe, code)))
  local out = f:read("a")
  f:close()
  lu.assertEquals(out, "nil nil nil | function function function")
end


function test_model_shapes_argument()
  local nn = require("luapipe.nn")
  local m = nn.sequential { nn.linear(2, 3) }
  lu.assertEquals(error_of(m.shapes, m, 3),
    "model:shapes: shape must be a list of 1 to 4 non-negative integers, got number")
  lu.assertEquals(error_of(m.shapes, m, { 1, "x" }),
    "model:shapes: shape entries must be non-negative integers")
  lu.assertEquals(m:shapes({ 4, 2 })[1], { 4, 3 })
end

function test_schedule_new_names_the_option()
  local function new_err(o) return error_of(schedule.new, o) end
  local base = function(extra)
    local o = { ranks = 2, stages = 2, microbatches = 1 }
    for k, v in pairs(extra) do o[k] = v end
    return o
  end
  lu.assertEquals(new_err(base { routes = { 5 } }),
    "schedule.new: the route of micro-batch 0 must be a list of virtual stage ids, got number")
  lu.assertEquals(new_err(base { name = 3 }), "schedule.new: 'name' must be a string, got number")
  lu.assertEquals(new_err(base { actions = { [0] = 5 } }),
    "schedule.new: actions[0] must be a list of action strings, got number")
  lu.assertEquals(new_err(base { placement = { { stage = 0, rank = 7 } } }),
    "schedule.new: virtual stage 0: rank 7 is out of range 0..1")
  lu.assertEquals(new_err(base { actions = { [1] = { "1F0", true } } }),
    "schedule.new: rank 1: entry 2 of the list is a boolean, not an action string such as \"0F3\"")
  lu.assertEquals(new_err { ranks = 5000, stages = 2, microbatches = 1 },
    "schedule.new: ranks must be 1..4096, got 5000")
end

function test_optimizer_option_named()
  local l = core.nn_layer(require("luapipe.nn").linear(2, 1), "l", 1)
  lu.assertEquals(error_of(core.nn_optim, l, { kind = "sgd", lr = "fast" }),
    "optimizer: option 'lr' must be a number, got string")
end

-- The class: every public function of the Lua layer, given a value of the
-- wrong type, answers with its own name, the argument and what it wants,
-- never with a Lua internal raised from inside lua/luapipe/ ("attempt to
-- index a number value (local 'spec')", "bad argument #1 to 'open'").
-- (The pictures' methods, res:show/gantt/svg and s:show/gantt, live in
-- luapipe.show and are swept there.)
-- (the binding's own "bad argument #1 to 'push' (...)" names the method
-- the user called, as Lua's libraries do: that is in the user's terms)
local function internal_error(e, name)
  local fn = e:match("bad argument #%d+ to '([^']*)'")
  return e:find("attempt to ", 1, true) or (fn and fn ~= name and fn:match("[^.:]+$") ~= name)
    or e:find("lua/luapipe/[%w_/]+%.lua:%d+:")
end

local function sweep(label, f, prefix_args, pre_self, method)
  local name = method or label:match("[^.:]+$")
  -- (the string is a path nothing can be written to: write_csv("x") would write)
  local wrong = { 5, "/nonexistent/luapipe-sweep", {}, true, function() end }
  local found = {}
  for _, v in ipairs(wrong) do
    for _, lead in ipairs({ false, true }) do
      local args = {}
      if pre_self ~= nil then args[#args + 1] = pre_self end
      if lead then args[#args + 1] = prefix_args end
      args[#args + 1] = v
      local ok, err
      -- called as the user writes it, obj:method(...) or mod.fn(...) (not a
      -- tail call: Lua names the function from the calling line)
      if method then
        local call = load("local o = ...; return function(...) local r = table.pack(o:" .. method
          .. "(...)); return r end")(pre_self)
        ok, err = pcall(call, table.unpack(args, 2, #args))
      else
        local call = load(string.format("local f = ...; local m = { [%q] = f }; return function(...) "
          .. "local r = table.pack(m[%q](...)); return r end", name, name))(f)
        ok, err = pcall(call, table.unpack(args, 1, #args))
      end
      if not ok then
        local okt, e = pcall(tostring, err)
        lu.assertTrue(okt, label .. ": an error value that cannot be printed")
        if internal_error(e, name) then found[#found + 1] = label .. "(" .. type(v) .. "): " .. e:gsub("\n.*", "") end
      end
    end
  end
  return found
end

function test_every_public_function_checks_its_arguments()
  local bad = {}
  local function add(list) for _, x in ipairs(list) do bad[#bad + 1] = x end end
  local skip = { ["comm.abort"] = true }
  for _, name in ipairs({ "schedule", "sim", "eplb", "nn", "train", "comm", "checkpoint", "perf", "json", "util", "search", "profile" }) do
    local mod = require("luapipe." .. name)
    local keys = {}
    for k, v in pairs(mod) do if type(v) == "function" then keys[#keys + 1] = k end end
    table.sort(keys)
    for _, k in ipairs(keys) do
      if not skip[name .. "." .. k] then
        add(sweep(name .. "." .. k, mod[k], {}))
      end
    end
  end
  for _, fam in ipairs(require("luapipe.schedules").list()) do
    add(sweep("schedules." .. fam, require("luapipe.schedules")[fam], {}))
  end
  -- methods of a schedule (the Lua layer's and the binding's)
  local s = schedule.build("1f1b", { pp = 2, microbatches = 2 })
  local methods = getmetatable(s).__index
  local keys = {}
  for k, v in pairs(methods) do
    if type(v) == "function" and k ~= "close" and k ~= "show" and k ~= "gantt" then keys[#keys + 1] = k end
  end
  table.sort(keys)
  for _, k in ipairs(keys) do add(sweep("s:" .. k, methods[k], {}, s:clone(), k)) end
  -- a model's methods, a balancer's
  local nn = require("luapipe.nn")
  local model = nn.sequential { nn.linear(2, 2), loss = "mse" }
  for _, k in ipairs({ "partition", "build", "build_stage", "build_layer", "shapes", "stage_input_shapes" }) do
    add(sweep("model:" .. k, model[k], {}, model, k))
  end
  local b = require("luapipe.eplb").balancer { replicas = 4, gpus = 2 }
  for _, k in ipairs({ "record", "due", "plan", "step", "predict", "balancedness", "import" }) do
    add(sweep("b:" .. k, b[k], {}, b, k))
  end
  -- a search result's methods (every one; the module's helpers under
  -- search._internal are not the API and are not swept)
  local search = require("luapipe.search")
  local r = assert(search.search { pp = 2, microbatches = 2, time = 0.01, progress = false,
    families = false })
  keys = {}
  for k, v in pairs(search.SearchResult) do
    if type(v) == "function" and not k:find("^__") then keys[#keys + 1] = k end
  end
  table.sort(keys)
  lu.assertTrue(#keys >= 9, "SearchResult methods: " .. table.concat(keys, " "))
  for _, k in ipairs(keys) do add(sweep("r:" .. k, search.SearchResult[k], {}, r, k)) end
  -- a profile report's luapipe.Profile (the binding's methods)
  local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
  local rep = assert(require("luapipe.profile").read({ here .. "../profile/small.json" }))
  local pmethods = getmetatable(rep.profile).__index
  keys = {}
  for k, v in pairs(pmethods) do if type(v) == "function" and k ~= "close" then keys[#keys + 1] = k end end
  table.sort(keys)
  for _, k in ipairs(keys) do add(sweep("p:" .. k, pmethods[k], {}, rep.profile, k)) end
  lu.assertEquals(bad, {})
end

function test_argument_errors_read_in_user_terms()
  lu.assertEquals(error_of(schedule.load, 5),
    "schedule.load: spec (argument 1) must be a family name or a .csv, .json or .lua file name, got 5")
  lu.assertEquals(error_of(schedule.load, "1f1b", 3),
    "schedule.load: opts (argument 2) must be a table {pp =, microbatches =, chunks =} (or nil), got 3")
  lu.assertEquals(error_of(schedule.build, "1f1b"),
    "schedule.build: opts (argument 2) must be a table {pp =, microbatches =, chunks =}, got nil")
  lu.assertEquals(error_of(schedule.from_csv, {}), "schedule.from_csv: path (argument 1) must be a string, got a table")
  local s = schedule.build("1f1b", { pp = 2, microbatches = 2 })
  lu.assertEquals(error_of(s.write_csv, s, 7), "s:write_csv: path (argument 1) must be a file name, got 7")
  lu.assertEquals(error_of(require("luapipe.eplb").check, 8, "16"),
    "eplb.check: replicas (argument 2) must be an integer, got \"16\"")
  local nn = require("luapipe.nn")
  local model = nn.sequential { nn.linear(2, 2), nn.linear(2, 2) }
  lu.assertEquals(error_of(model.build_layer, model, 3),
    "model:build_layer: i (argument 1) must be an integer from 1 to 2, got 3")
  lu.assertEquals(error_of(model.build_stage, model, 0, 1),
    "model:build_stage: partition (argument 1) must be a table from model:partition{...}, got 0")
  lu.assertEquals(error_of(require("luapipe.comm").set_link, 50),
    "comm.set_link: text (argument 1) must be a link such as \"lat=50us,bw=2GB/s\" or \"none\", got 50")
  lu.assertEquals(error_of(require("luapipe.perf").summary, {}, s),
    "perf.summary: exec (argument 1) must be a luapipe.Exec, got a table")
  -- raised at the user's line: the position is the caller's, not the library's
  -- (a luapipe.Error: its fields hold the place, tostring gives the line)
  local ok, err = pcall(function() schedule.load(true) end)
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err), "test_input_errors.lua:")
  lu.assertNotStrContains(tostring(err), "lua/luapipe/")
  lu.assertStrContains(err.file, "test_input_errors.lua")
  lu.assertStrContains(err.what, "schedule.load: spec (argument 1) must be")
end

function test_search_and_profile_arguments_in_user_terms()
  local search = require("luapipe.search")
  lu.assertEquals(error_of(search.search, 5),
    "search.search: opts (argument 1) must be a table of options {pp =, microbatches =, ...}, got 5")
  lu.assertEquals(error_of(search.search, { pp = 2, microbatches = 2, cost = { F = "x" } }),
    "search: cost: F must be a number, got \"x\"")
  lu.assertEquals(error_of(search.search, { pp = 2, microbatches = 2, cost = { B = -1 } }),
    "search: cost: B = -1 must be a number in 0..1e+15")
  lu.assertEquals(error_of(search.placement, "linear", 2),
    "search.placement: microbatches (argument 3) must be an integer from 1 to 4096, got nil")
  lu.assertEquals(error_of(search.placement, {}, 2, 2),
    "search.placement: placement: a table of ranks needs at least one model stage")
  lu.assertEquals(error_of(search.families, { pp = 2, microbatches = 2 }, 7),
    "search.families: cost (argument 2) must be a cost table {F =, B =, W =, ...} or a string "
      .. "such as \"F=1,B=2,W=1\" (or nil: opts.cost), got 7")
  lu.assertEquals(error_of(search.families, { pp = 2, microbatches = 2, memory = 0 }),
    "search.families: memory must be a positive number of activations, got 0")
  -- the cost defaults to opts.cost (and a string is taken as --cost is)
  local rows = search.families({ pp = 2, microbatches = 2, cost = "F=1,B=2,W=1" })
  lu.assertEquals(rows, search.families({ pp = 2, microbatches = 2 }, { F = 1, B = 2, W = 1 }))
  local r = assert(search.search { pp = 2, microbatches = 2, time = 0.01, progress = false })
  lu.assertEquals(error_of(r.gap), "r:gap: call it on a search result, r:gap(), got nil")
  local profile = require("luapipe.profile")
  lu.assertEquals(error_of(profile.text, { ranks = {} }, 3),
    "profile.text: opts (argument 2) must be a table {unclassified =} (or nil), got 3")
  lu.assertEquals(error_of(profile.costs, { phases = {} }),
    "profile.costs: rank (argument 1) must be a rank of a report from profile.read "
      .. "(report.ranks[i]), got a table")
  lu.assertEquals(error_of(profile.read, { "a.json", 2 }),
    "profile.read: paths (argument 1) must be a list of trace file or folder names, got a table")
  lu.assertEquals(error_of(profile.classify, "x", "kernel", { { class = "compute", plain = 5 } }),
    "profile.classify: rules (argument 3): rule 1: plain must be a string, got 5")
  local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
  local rep = assert(profile.read(here .. "../profile/small.json")) -- one name: a list of one
  lu.assertEquals(error_of(profile.costs, rep.ranks[1], { pairs = 0 }),
    "profile.costs: opts.pairs (argument 2) must be a positive integer, got 0")
  lu.assertEquals(error_of(profile.costs_text, {}),
    "profile.costs_text: costs (argument 1) must be costs from profile.costs, got a table")
  -- a mapping entry of the wrong kind: returned, as the mapping's other errors are
  local c, err = profile.costs(rep.ranks[1], { mapping = { ["attn(F)"] = 5 } })
  lu.assertNil(c)
  lu.assertEquals(err, "mapping of phase 'attn(F)': must be a table {kind =, exchange =} or false, got 5")
  lu.assertStrContains(profile.costs_text(assert(profile.costs(rep.ranks[1]))), "--cost F=")
end

function test_util_words()
  local util = require("luapipe.util")
  lu.assertEquals({ util.count(1, "rank"), util.count(0, "rank"), util.count(4, "micro-batch") },
    { "1 rank", "0 ranks", "4 micro-batches" })
  lu.assertEquals(util.did_you_mean("simulte", { "schedule", "simulate" }), "simulate")
  lu.assertEquals(util.did_you_mean("Schedul", { "schedule", "sim" }), "schedule")
  lu.assertNil(util.did_you_mean("xyz", { "schedule", "sim" }))
end

os.exit(lu.LuaUnit.run())
