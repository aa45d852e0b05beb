-- How the REPL shows values (luapipe.repl.show, luapipe.util.pretty):
-- tables as constructors, depth-limited, cycles safe, long ones one entry
-- per line; values with __tostring as tostring gives them.
local lu = require("luaunit")
local util = require("luapipe.util")

function test_pretty_tables()
  lu.assertEquals(util.pretty({ 1, 2, x = { y = 3 } }), "{1, 2, x = {y = 3}}")
  lu.assertEquals(util.pretty({}), "{}")
  lu.assertEquals(util.pretty({ "a\nb", [10] = true, ["a b"] = 2.0, [1.5] = 0 }),
    '{"a\\nb", [1.5] = 0, [10] = true, ["a b"] = 2.0}')
  -- cycles: a table inside itself
  local t = { name = "t" }
  t.self = t
  lu.assertEquals(util.pretty(t), '{name = "t", self = <cycle>}')
  -- a table seen twice (not a cycle) is shown both times
  local shared = { 1 }
  lu.assertEquals(util.pretty({ a = shared, b = shared }), "{a = {1}, b = {1}}")
  -- depth
  lu.assertEquals(util.pretty({ a = { b = { c = { d = 1 } } } }),
    "{a = {b = {c = {...} (1 entry)}}}")
  lu.assertEquals(util.pretty({ a = { b = 1 } }, { depth = 1 }), "{a = {...} (1 entry)}")
  -- many entries: the first items, then a count
  local big = {}
  for i = 1, 60 do big[i] = i end
  local text = util.pretty(big, { width = 1000 })
  lu.assertStrContains(text, "49, 50, ... (10 more)}")
  -- too wide: one entry per line, nested ones indented
  local wide = { alpha = string.rep("x", 40), beta = { string.rep("y", 40), 2 } }
  lu.assertEquals(util.pretty(wide), '{\n  alpha = "' .. string.rep("x", 40) .. '",\n  beta = {"'
    .. string.rep("y", 40) .. '", 2}\n}')
  -- values with __tostring (schedules, tensors): as tostring gives them
  local s = require("luapipe.schedule").build("1f1b", { pp = 2, microbatches = 2 })
  lu.assertEquals(util.pretty({ s = s }, { width = 200 }), "{s = " .. tostring(s) .. "}")
  lu.assertStrContains(util.pretty({ t = require("luapipe.nn").tensor({ 2, 3 }) }),
    "luapipe.Tensor [2, 3]")
end

function test_repl_show()
  local written, real = {}, io.write
  io.write = function(...) for _, v in ipairs { ... } do written[#written + 1] = tostring(v) end end
  local ok, err = pcall(function()
    local repl = require("luapipe.repl")
    repl.show({ 1, { 2 } }, "text", nil, 3)
  end)
  io.write = real
  lu.assertTrue(ok, tostring(err))
  lu.assertEquals(table.concat(written), "{1, {2}}\ttext\tnil\t3\n")
end

os.exit(lu.LuaUnit.run())
