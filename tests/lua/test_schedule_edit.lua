-- test_schedule_edit.lua — editing a rank's action list as a person does in
-- the REPL: s:push is all or nothing, s:pop / s:clear / s:set edit the list;
-- s:simulate raises on an invalid schedule (s:try_simulate returns nil,
-- message); luapipe.help answers for methods written as Class:method or
-- module.method; the REPL's Tab completion (luapipe.repl.complete).
local lu = require("luaunit")
local schedule = require("luapipe.schedule")
local repl = require("luapipe.repl")

local function one_rank()
  return schedule.new { ranks = 1, stages = 1, microbatches = 2 }
end

local function err_of(f, ...)
  local ok, err = pcall(f, ...)
  lu.assertFalse(ok, "expected an error")
  return tostring(err)
end

function test_push_is_all_or_nothing()
  local s = one_rank()
  s:push(0, "0F0")
  -- a bad action after good ones: none of them stays
  lu.assertStrContains(err_of(s.push, s, 0, { "0F1", "0B0", "0X1" }),
    "rank 0, action 3: action '0X1': unknown action type 'X'")
  lu.assertEquals(s:actions(0), { "0F0" })
  -- a micro-batch out of range, and an entry that is not a string
  lu.assertStrContains(err_of(s.push, s, 0, { "0F1", "0F7" }), "rank 0, action 2")
  lu.assertEquals(s:actions(0), { "0F0" })
  lu.assertEquals(err_of(s.push, s, 0, { "0F1", {} }),
    'rank 0: entry 2 of the list is a table, not an action string such as "0F3"')
  lu.assertEquals(s:actions(0), { "0F0" })
  lu.assertEquals(s:count(0), 1)
  -- a good list goes in whole
  s:push(0, { "0F1", "0B0", "0B1" })
  lu.assertEquals(s:actions(0), { "0F0", "0F1", "0B0", "0B1" })
  lu.assertTrue(s:validate())
end

function test_pop_clear_set()
  local s = one_rank()
  s:push(0, { "0F0", "0F1", "0B0", "0B1" })
  lu.assertEquals(s:pop(0), { "0B1" })
  lu.assertEquals(s:pop(0, 2), { "0F1", "0B0" })
  lu.assertEquals(s:actions(0), { "0F0" })
  lu.assertEquals(s:pop(0, 0), {})
  lu.assertEquals(err_of(s.pop, s, 0, 2), "rank 0 has 1 action: cannot pop 2")
  lu.assertEquals(s:actions(0), { "0F0" })
  lu.assertStrContains(err_of(s.pop, s, 3), "rank 3 is out of range 0..0")
  -- clear and set print nothing in the REPL: they return nothing
  lu.assertEquals(select("#", s:clear(0)), 0)
  lu.assertEquals(s:count(0), 0)
  lu.assertEquals(select("#", s:set(0, { "0F0", "0B0", "0F1", "0B1" })), 0)
  lu.assertEquals(s:actions(0), { "0F0", "0B0", "0F1", "0B1" })
  -- a bad list leaves the old one, and names the action in the new list
  lu.assertStrContains(err_of(s.set, s, 0, { "0F0", "0Q" }), "rank 0, action 1: action '0Q'")
  lu.assertEquals(s:actions(0), { "0F0", "0B0", "0F1", "0B1" })
  lu.assertStrContains(err_of(s.set, s, 0, 5), "s:set: list (argument 2) must be a list of action strings")
  lu.assertEquals(s:actions(0), { "0F0", "0B0", "0F1", "0B1" })
  lu.assertTrue(s:validate())
end

function test_simulate_raises_on_an_invalid_schedule()
  local s = one_rank()
  s:push(0, { "0F0", "0F1", "0B1" })
  local ok, err = pcall(function() return (s:simulate()) end)
  lu.assertFalse(ok)
  -- at the caller's line, with the validation message
  lu.assertStrMatches(tostring(err),
    ".*test_schedule_edit%.lua:%d+: simulate: micro%-batch 0 is never backwarded on stage 0 %(rank 0%)")
  -- the documented nil, message form
  local res, msg = s:try_simulate()
  lu.assertNil(res)
  lu.assertEquals(msg, "micro-batch 0 is never backwarded on stage 0 (rank 0)")
  s:push(0, "0B0")
  lu.assertEquals(s:simulate({ F = 1, B = 2 }):makespan(), 6)
  lu.assertEquals(s:try_simulate({ F = 1, B = 2 }):makespan(), 6)
  -- bad costs raise in both
  lu.assertStrContains(err_of(s.try_simulate, s, { Q = 1 }), "Q")
end

function test_help_for_methods()
  for _, topic in ipairs { "Schedule:push", "schedule.push", "s:push", "push" } do
    local text = assert(luapipe.help_text(topic))
    lu.assertStrContains(text, "s:push(rank, action | {actions})", false, topic)
    lu.assertStrContains(text, "all or nothing", false, topic)
  end
  lu.assertStrContains(assert(luapipe.help_text("Schedule:pop")), "s:pop(rank[, n])")
  lu.assertStrContains(assert(luapipe.help_text("SimResult:makespan")), "res:makespan()")
  lu.assertStrContains(assert(luapipe.help_text("schedule.simulate")), "an invalid schedule raises")
  lu.assertNil(luapipe.help_text("Schedule:frobnicate"))
end

function test_completion()
  local c = repl.complete
  lu.assertEquals(c("luapipe.sch"), { "luapipe.schedule", "luapipe.schedules" })
  lu.assertEquals(c("luap"), { "luapipe" })
  lu.assertEquals(c("wh"), { "while" })
  lu.assertEquals(c("luapipe.schedule.bu"), { "luapipe.schedule.build" })
  -- luapipe's modules complete before they load: the names "did you mean" uses
  lu.assertEquals(c("luapipe.prof"), { "luapipe.profile" })
  local env = { s = schedule.build("1f1b", { pp = 2, microbatches = 2 }), t = { alpha = 1, beta = { gamma = 2 } } }
  lu.assertEquals(c("s:vali", env), { "s:validate" })
  lu.assertEquals(c("s:po", env), { "s:pop" })
  lu.assertEquals(c("s:try", env), { "s:try_simulate" })
  lu.assertEquals(c("t.", env), { "t.alpha", "t.beta" })
  lu.assertEquals(c("t.beta.g", env), { "t.beta.gamma" })
  local res = env.s:simulate()
  env.r = res
  lu.assertEquals(c("r:makes", env), { "r:makespan" })
  -- what plain names cannot reach completes to nothing, and never raises
  lu.assertEquals(c("t.alpha.x", env), {})
  lu.assertEquals(c("f().x", env), {})
  lu.assertEquals(c("luapipe.schedul.x"), {})
  lu.assertEquals(c("nothing_here.x", env), {})
  lu.assertEquals(c("t:", env), {})
  lu.assertEquals(c(5), {})
end

os.exit(lu.LuaUnit.run())
