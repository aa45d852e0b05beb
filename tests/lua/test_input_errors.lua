-- Misuse of the core bindings and the Lua API: one clear error in the
-- user's words (the argument, the field, the limit), never a Lua internal
-- ("attempt to index ...", "bad argument #-2"), and the seam between the C
-- classes and the Lua layer (the binding never loads Lua modules).
local lu = require("luaunit")
local core = require("luapipe.core")
local schedule = require("luapipe.schedule")

local function error_of(f, ...)
  local ok, err = pcall(f, ...)
  lu.assertFalse(ok, "expected an error")
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

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
    "schedule.new: rank 1: action 2 is not a string")
  lu.assertEquals(new_err { ranks = 5000, stages = 2, microbatches = 1 },
    "schedule.new: ranks must be 1..4096, got 5000")
end

function test_optimizer_option_named()
  local l = core.nn_layer(require("luapipe.nn").linear(2, 1), "l", 1)
  lu.assertEquals(error_of(core.nn_optim, l, { kind = "sgd", lr = "fast" }),
    "optimizer: option 'lr' must be a number, got string")
end

os.exit(lu.LuaUnit.run())
