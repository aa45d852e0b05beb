-- Schedules from other tools and from users: PyTorch's CSV spellings and
-- actions (tests/lua/data holds our own fixtures in PyTorch's format), the
-- send models of validation, and the errors for malformed JSON, out-of-range
-- counts and misused arguments.
local lu = require("luaunit")
local core = require("luapipe.core")
local schedule = require("luapipe.schedule")

local DATA = (arg and arg[0] and arg[0]:match("^(.*)/[^/]*$") or ".") .. "/data/"

local function error_of(f, ...)
  local ok, err = pcall(f, ...)
  lu.assertFalse(ok, "expected an error")
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

local function load_csv(name)
  return assert(schedule.from_csv(DATA .. name))
end

-- ---- PyTorch interoperability ----

function test_eager_sends_validate_under_buffered_only()
  local s = load_csv("eager_sends_2rank.csv")
  lu.assertEquals({ s:validate() }, { true })
  lu.assertEquals({ s:validate { sends = "buffered" } }, { true })
  local ok, err = s:validate { sends = "rendezvous" }
  lu.assertNil(ok)
  lu.assertEquals(err, "deadlock under rendezvous sends (a send waits for its receive): "
    .. "rank 0 waits at action 3 (0SEND_F1) for rank 1 to reach action 4 (1RECV_F1); "
    .. "rank 1 waits at action 3 (1SEND_B0) for rank 0 to reach action 4 (0RECV_B0)")
  lu.assertEquals(error_of(s.validate, s, { sends = "eager" }),
    "validate: option 'sends' must be \"buffered\" or \"rendezvous\", got eager")
  -- the simulator runs it too
  lu.assertNotNil(s:simulate { F = 1, B = 2 })
end

function test_old_spelling_with_comms()
  -- BW = full backward; B then a later W of the same stage and mb = I,
  -- also among SEND/RECV (PyTorch's *_comms.csv)
  local s = load_csv("interleaved_2rank_2stagep_comms.csv")
  lu.assertEquals({ s:validate() }, { true })
  lu.assertEquals({ s:validate { sends = "rendezvous" } }, { true })
  local r0, r1 = s:actions(0), s:actions(1)
  lu.assertEquals(r0[14], "2B0")
  lu.assertEquals(r1[10], "3I0")
  lu.assertEquals(r1[15], "3W0")
  lu.assertEquals(s:info().stages, 4)
  -- written back in today's spelling, it reads back the same
  local t = assert(schedule.from_csv_text(s:to_csv(), "again.csv"))
  lu.assertEquals(t:to_csv(), s:to_csv())
end

function test_stage_actions_round_trip()
  local text = "0UNSHARD,0F0,0F1,0B0,0B1,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0RESHARD\n"
    .. "1UNSHARD,1F0,1F1,1B0,1B1,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1RESHARD\n"
  local s = assert(schedule.from_csv_text(text, "gpipe_fsdp.csv"))
  lu.assertEquals({ s:validate() }, { true })
  lu.assertEquals(s:to_csv(), text)
  local low = assert(s:lower())
  lu.assertEquals({ low:validate { sends = "rendezvous" } }, { true })
  local j = assert(schedule.from_json(low:to_json()))
  lu.assertEquals(j:to_csv(), low:to_csv())
  -- no time in the simulator: same makespan as without them
  local plain = assert(schedule.from_csv_text("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n", "g.csv"))
  local cost = { F = 1, B = 2 }
  lu.assertEquals(s:simulate(cost):makespan(), plain:simulate(cost):makespan())
  lu.assertEquals(core.parse_action("3WAIT_REDUCE_GRAD").type, "WAIT_REDUCE_GRAD")
end

function test_lowered_families_valid_under_both_models()
  local schedules = require("luapipe.schedules")
  for _, name in ipairs(schedules.list()) do
    local s = schedules[name] { pp = 4, microbatches = 8 }
    local low = assert(s:lower())
    lu.assertEquals({ low:validate { sends = "buffered" } }, { true }, name)
    lu.assertEquals({ low:validate { sends = "rendezvous" } }, { true }, name)
  end
end

os.exit(lu.LuaUnit.run())
