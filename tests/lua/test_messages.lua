-- What the library says in words: counted nouns ("1 rank", "2 ranks"),
-- interleaved1f1b's note when its counts leave no 1F1B steady state, and
-- the CLI's refusal of --chunks for a family without chunks.
local lu = require("luaunit")
local schedule = require("luapipe.schedule")

function test_counted_nouns_in_summaries()
  local s = schedule.new { ranks = 1, stages = 1, microbatches = 1,
    actions = { [0] = { "0F0", "0B0" } } }
  lu.assertEquals(tostring(s), "schedule (unnamed): 1 rank, 1 stage (1 virtual), 1 micro-batch, "
    .. "2 actions, valid")
  local res = s:simulate()
  lu.assertStrContains(res:summary(), "simulated schedule: 1 rank, 1 micro-batch: makespan")
  local t = schedule.build("1f1b", { pp = 2, microbatches = 3 })
  lu.assertStrContains(tostring(t), "2 ranks, 2 stages (2 virtual), 3 micro-batches, 12 actions")
end

function test_interleaved_note()
  local s = schedule.build("interleaved1f1b", { pp = 4, microbatches = 6 })
  lu.assertEquals(s:note(), "with 6 micro-batches on 4 ranks, rank 0 runs every forward before any "
    .. "backward (GPipe's order: no 1F1B steady state, all 6 x 2 activations held); use 8 "
    .. "micro-batches or more (a multiple of pp) for interleaved 1F1B's steady state")
  lu.assertStrContains(tostring(s), "\nnote: with 6 micro-batches on 4 ranks")
  -- what the note says is what the schedule does: rank 0 runs all its forwards first
  local acts = s:actions(0)
  for i = 1, 12 do lu.assertStrContains(acts[i], "F") end
  -- every rank with a steady state: no note
  lu.assertNil(schedule.build("interleaved1f1b", { pp = 4, microbatches = 8 }):note())
  lu.assertNil(schedule.build("1f1b", { pp = 4, microbatches = 2 }):note())
  -- several ranks without one, and the count named has a steady state
  local t = schedule.build("interleaved1f1b", { pp = 4, microbatches = 4, chunks = 3 })
  lu.assertStrContains(t:note(), "ranks 0-")
  local need = tonumber(t:note():match("use (%d+) micro%-batches"))
  lu.assertNil(schedule.build("interleaved1f1b", { pp = 4, microbatches = need,
    chunks = 3 }):note())
  lu.assertNotNil(schedule.build("interleaved1f1b", { pp = 4, microbatches = need - 4,
    chunks = 3 }):note())
end

local function run(args)
  local exe = arg[-1] or "luapipe"
  local f = assert(io.popen(string.format("%q %s 2>&1; echo \"rc=$?\"", exe, args)))
  local out = f:read("a")
  f:close()
  return out
end

function test_cli_chunks_and_note()
  local out = run("schedule gpipe --chunks 3")
  lu.assertStrContains(out, "luapipe schedule: --chunks applies to interleaved1f1b only; "
    .. "gpipe has a fixed placement (one model stage per rank)")
  lu.assertStrContains(out, "rc=2")
  lu.assertStrContains(run("schedule zbv --chunks 2"),
    "zbv has a fixed placement (two chunks per rank)")
  lu.assertStrContains(run("schedule interleaved1f1b --chunks 3 -p 2 -m 4"), "rc=0")
  -- the note: in the summary of the text form, on stderr for the others (once)
  local text = run("schedule interleaved1f1b -p 4 -m 6")
  local _, n = text:gsub("note: with 6 micro%-batches", "")
  lu.assertEquals(n, 1)
  lu.assertStrContains(run("schedule interleaved1f1b -p 4 -m 6 -f csv"),
    "luapipe: note: with 6 micro-batches")
end

-- Action numbers are 0-based everywhere, as ranks, stages and micro-batches
-- are: the validator's "action 0 (0B0)" is s:action(0, 0).
function test_action_numbers_are_zero_based()
  local s = schedule.new { ranks = 2, stages = 2, microbatches = 1,
    actions = { [0] = { "0B0", "0F0" }, [1] = { "1F0", "1B0" } } }
  local ok, err = s:validate()
  lu.assertNil(ok)
  local rank, i, text = err:match("^rank (%d+), action (%d+) %(([^)]+)%)")
  lu.assertEquals({ rank, i, text }, { "0", "0", "0B0" })
  lu.assertEquals(s:action(tonumber(rank), tonumber(i)).text, text)
  lu.assertEquals(s:action(1, 1).text, "1B0")
  lu.assertNil(s:action(1, 2))  -- past the end
  lu.assertNil(s:action(1, -1))
  lu.assertEquals(s:actions(1)[1 + 1], "1B0") -- a Lua list: action i is entry i + 1
end

os.exit(lu.LuaUnit.run())
