-- Schedules from other tools and from users: PyTorch's CSV spellings and
-- actions (tests/lua/data holds our own fixtures in PyTorch's format), the
-- send models of validation, and the errors for malformed JSON, out-of-range
-- counts and misused arguments.
local lu = require("luaunit")
local core = require("luapipe.core")
local schedule = require("luapipe.schedule")

local DATA = (arg and arg[0] and arg[0]:match("^(.*)/[^/]*$") or ".") .. "/data/"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local error_of = dofile(here .. "errors.lua").error_of

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
    "validate: option 'sends' must be \"nonblocking\", \"buffered\" or \"rendezvous\", got eager")
  -- the simulator runs it too
  lu.assertNotNil(s:simulate { F = 1, B = 2 })
end

-- PyTorch's test_defer_recv_ops schedules (test/distributed/pipelining/
-- test_schedule.py): explicit SEND/RECV on two ranks, receives placed
-- early (the inputs) or deferred to just before their use (the expected
-- outputs), full backward or the I/W split. A RECV only posts; the first
-- compute that uses the message waits for it.
local DEFER = "defer_recv/"
local defer_names = { "simple_2_rank_2_stage_no_overlap", "v_2_rank_4_stage_no_overlap",
  "simple_2_rank_2_stage_iw_split" }

function test_pytorch_defer_recv_schedules_validate()
  for _, name in ipairs(defer_names) do
    for _, which in ipairs { "input", "expected" } do
      local f = DEFER .. name .. "_" .. which .. ".csv"
      local s = load_csv(f)
      lu.assertEquals({ s:validate() }, { true }, f)
      lu.assertEquals({ s:validate { sends = "nonblocking" } }, { true }, f)
      lu.assertNotNil(s:simulate { F = 1, B = 2 }, f)
    end
  end
  -- the schedule of issue 13: a blocking RECV (buffered) would deadlock
  local s = load_csv(DEFER .. "simple_2_rank_2_stage_iw_split_input.csv")
  local ok, err = s:validate { sends = "buffered" }
  lu.assertNil(ok)
  lu.assertEquals(err, "deadlock under buffered sends (a send does not wait for its receive): "
    .. "rank 0 waits at action 0 (0RECV_B0) for rank 1 to reach action 4 (1SEND_B0); "
    .. "rank 1 waits at action 0 (1RECV_F0) for rank 0 to reach action 2 (0SEND_F0)")
  -- the no-overlap inputs also hold under the stricter models
  for _, m in ipairs { "buffered", "rendezvous" } do
    lu.assertEquals({ load_csv(DEFER .. "v_2_rank_4_stage_no_overlap_input.csv"):validate { sends = m } },
      { true }, m)
  end
  -- PyTorch's OVERLAP_F_B case is a fragment (micro-batch 1 never reaches
  -- stage 2): refused when read, naming why
  for _, which in ipairs { "input", "expected" } do
    local f = DATA .. DEFER .. "v_2_rank_4_stage_overlap_f_b_" .. which .. ".csv"
    local t, e = schedule.from_csv(f)
    lu.assertNil(t)
    lu.assertEquals(e, f .. ": stage 3 is at position 3 of micro-batch 0's route but at "
      .. "position 2 of micro-batch 1's route (a route is the stages that forward a "
      .. "micro-batch, in increasing id order)")
  end
end

function test_pytorch_defer_recv_simulated_waits_at_use()
  -- F = 1, I = W = 1 (B = 2): rank 0 posts 0RECV_B0 first and runs 0F0,
  -- 0F1 at once; 0I0 waits for 1SEND_B0 (rank 1: 1F0 at 1, 1I0 at 2..3)
  local s = load_csv(DEFER .. "simple_2_rank_2_stage_iw_split_input.csv")
  local r = assert(s:simulate { F = 1, B = 2 })
  local start = {}
  for _, e in ipairs(r:events()) do start[e.text] = e.start end
  lu.assertEquals(start["0F1"], 1)
  lu.assertEquals(start["1F0"], 1)
  lu.assertEquals(start["0I0"], 3)
  lu.assertEquals(start["1F1"], 4)
  lu.assertEquals(start["0I1"], 6)
  lu.assertEquals(r:makespan(), 8)
  -- PyTorch's deferred placement: the same timeline
  local d = assert(load_csv(DEFER .. "simple_2_rank_2_stage_iw_split_expected.csv"):simulate { F = 1, B = 2 })
  lu.assertEquals(d:makespan(), 8)
end

function test_sim_messages_leave_at_their_send()
  -- rank 0 computes F1 before sending F0: rank 1's F0 starts at 2, not 1
  local function sched(r0, r1)
    return schedule.new { ranks = 2, stages = 2, microbatches = 2, actions = { [0] = r0, [1] = r1 } }
  end
  local late = sched({ "0F0", "0F1", "0SEND_F0", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1" },
    { "1RECV_F0", "1RECV_F1", "1F0", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1" })
  local r = assert(late:simulate { F = 1, B = 2 })
  local start = {}
  for _, e in ipairs(r:events()) do start[e.text] = e.start end
  lu.assertEquals(start["1F0"], 2)
  lu.assertEquals(start["0B0"], 5)
  lu.assertEquals(r:makespan(), 10)
  local sent = {}
  for _, m in ipairs(r:messages()) do sent[m.text] = m.sent end
  lu.assertEquals(sent["0F0"], 2)
  lu.assertEquals(sent["1B0"], 5)
  -- the same compute order without SEND/RECV: each message leaves when made
  local bare = sched({ "0F0", "0F1", "0B0", "0B1" }, { "1F0", "1B0", "1F1", "1B1" })
  lu.assertEquals(assert(bare:simulate { F = 1, B = 2 }):makespan(), 9)
end

function test_json_without_routes_takes_the_natural_route()
  -- one virtual stage per model stage, listed out of stage order
  local s = assert(schedule.from_json('{"ranks":2,"stages":2,"microbatches":2,'
    .. '"virtual_stages":[{"id":0,"stage":1,"rank":1},{"id":1,"stage":0,"rank":0}],'
    .. '"actions":[["1F0","1F1","1B0","1B1"],["0F0","0B0","0F1","0B1"]]}', "s.json"))
  lu.assertEquals(s:route(0), { 1, 0 })
  lu.assertEquals(s:route(1), { 1, 0 })
  lu.assertEquals({ s:validate() }, { true })
  -- no virtual_stages either: stage i on rank i, as schedule.new does
  local t = assert(schedule.from_json('{"ranks":2,"stages":2,"microbatches":1,'
    .. '"actions":[["0F0","0SEND_F0","0RECV_B0","0B0"],["1RECV_F0","1F0","1B0","1SEND_B0"]]}'))
  lu.assertEquals(t:route(0), { 0, 1 })
  lu.assertEquals({ t:validate() }, { true })
  local VS2 = '"virtual_stages":[{"id":0,"stage":0,"rank":0},{"id":1,"stage":0,"rank":1}]'
  for _, c in ipairs {
    { '{"ranks":2,"stages":2,"microbatches":2,' .. VS2 .. '}',
      "routes is missing, and model stage 0 has two virtual stages (0 and 1): give each "
      .. "micro-batch's route" },
    { '{"ranks":2,"stages":3,"microbatches":2,"virtual_stages":[{"id":0,"stage":0,"rank":0},'
      .. '{"id":1,"stage":1,"rank":1}]}',
      "routes is missing, and model stage 2 has no virtual stage: the natural route needs one "
      .. "virtual stage per model stage" },
    { '{"ranks":2,"stages":2,"microbatches":2,"virtual_stages":[{"id":0,"stage":0,"rank":0},'
      .. '{"id":1,"stage":5,"rank":1}]}',
      "virtual_stages[1].stage is 5, but the schedule has stages 0..1" },
    { '{"ranks":2,"stages":3,"microbatches":2}',
      "virtual_stages is missing; without it stage i goes on rank i, which needs stages = "
      .. "ranks (got 3 stages, 2 ranks)" },
  } do
    local x, err = schedule.from_json(c[1], "s.json")
    lu.assertNil(x, c[1])
    lu.assertEquals(err, "s.json: " .. c[2])
  end
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

function test_lowered_families_valid_under_every_model()
  local schedules = require("luapipe.schedules")
  for _, name in ipairs(schedules.list()) do
    local s = schedules[name] { pp = 4, microbatches = 8 }
    local low = assert(s:lower())
    lu.assertEquals({ low:validate { sends = "buffered" } }, { true }, name)
    lu.assertEquals({ low:validate { sends = "rendezvous" } }, { true }, name)
    lu.assertEquals({ low:validate { sends = "nonblocking" } }, { true }, name)
    -- messages leave right after their producer: the simulator's timeline
    -- is the compute-only schedule's
    lu.assertEquals(assert(low:simulate { F = 1, B = 2, W = 1 }):makespan(),
      assert(s:simulate { F = 1, B = 2, W = 1 }):makespan(), name)
  end
end

-- ---- bad input: one clear error naming the field, the count or the limit ----

local VS = '"virtual_stages":[{"id":0,"stage":0,"rank":0},{"id":1,"stage":1,"rank":1}]'

function test_json_fields_named()
  local cases = {
    { '{"ranks":2,"stages":2,"microbatches":2,"virtual_stages":[5]}',
      "virtual_stages[0] must be an object, got number" },
    { '{"ranks":2,"stages":2,"microbatches":2,"virtual_stages":{"a":1}}',
      "virtual_stages must be a list of objects, got an object" },
    { '{"ranks":2,"stages":2,"microbatches":2,"virtual_stages":[{"id":0,"stage":"0","rank":0}]}',
      'virtual_stages[0].stage must be an integer, got "0"' },
    { '{"ranks":2,"stages":2,"microbatches":2,"virtual_stages":[{"id":1,"stage":0,"rank":0}]}',
      "virtual_stages[0] has id 1, expected 0" },
    { '{"ranks":"2","stages":2,"microbatches":2}', 'ranks must be an integer, got "2"' },
    { '{"ranks":2.5,"stages":2,"microbatches":2}', "ranks must be an integer, got 2.5" },
    { '{"stages":2,"microbatches":2}', "ranks is missing" },
    { '{"ranks":2,"stages":2,"microbatches":2,' .. VS .. ',"routes":[[0,1],7]}',
      "routes[1] must be a list of virtual stage ids, got number" },
    { '{"ranks":2,"stages":2,"microbatches":2,' .. VS .. ',"routes":[[0,1],[0,"x"]]}',
      'routes[1][1] must be an integer, got "x"' },
    { '{"ranks":2,"stages":2,"microbatches":2,' .. VS .. ',"routes":[[0,1]]}',
      "routes has 1 entries, expected one per micro-batch (2)" },
    { '{"ranks":2,"stages":2,"microbatches":2,' .. VS .. ',"routes":[[0,1],[0,1]],"actions":[[1]]}',
      'actions[0][0] must be an action string such as "0F3", got number' },
    { '{"ranks":2,"stages":2,"microbatches":2,' .. VS .. ',"routes":[[0,1],[0,1]],"actions":[["0X0"]]}',
      "rank 0, action 0: action '0X0': unknown action type 'X' (expected F, B, I, W, SEND_F, "
      .. "RECV_F, SEND_B, RECV_B, REDUCE_GRAD, WAIT_REDUCE_GRAD, UNSHARD, RESHARD or an "
      .. "OVERLAP_F_B pair)" },
    { '[1, 2]', "the top level must be an object, got a list" },
    { '{"ranks":4294967298,"stages":2,"microbatches":2}', "ranks must be 1..4096, got 4294967298" },
    { '{"ranks":1e8,"stages":2,"microbatches":2}', "ranks must be 1..4096, got 100000000" },
    { '{"ranks":4,"stages":4096,"microbatches":65536}',
      "stages x microbatches = 4096 x 65536 is over the limit of 67108864" },
  }
  for _, c in ipairs(cases) do
    local s, err = schedule.from_json(c[1], "s.json")
    lu.assertNil(s, c[1])
    lu.assertEquals(err, "s.json: " .. c[2])
  end
  -- and what to_json writes reads back
  local s = schedule.build("dualpipe", { pp = 4, microbatches = 8 })
  lu.assertEquals(assert(schedule.from_json(s:to_json())):to_csv(), s:to_csv())
end

function test_counts_bounded_before_building()
  local limits = core.schedule_limits()
  lu.assertEquals(limits.ranks, 4096)
  lu.assertEquals(limits.microbatches, 65536)
  lu.assertEquals(error_of(core.schedule_new, 4294967298, 2, 2),
    "ranks must be 1..4096, got 4294967298")
  lu.assertEquals(error_of(schedule.new, { ranks = 2, stages = 2, microbatches = 100000000 }),
    "schedule.new: microbatches must be 1..65536, got 100000000")
  lu.assertEquals(error_of(schedule.build, "1f1b", { pp = 4, microbatches = 1000000000 }),
    "1f1b: microbatches must be at most 65536, got 1000000000")
  lu.assertEquals(error_of(schedule.build, "gpipe", { pp = 9223372036854775807, microbatches = 2 }),
    "gpipe: pp must be at most 4096, got 9223372036854775807")
  lu.assertEquals(error_of(schedule.build, "zbv", { pp = 4096, microbatches = 65536 }),
    "zbv: pp = 4096 with 65536 micro-batches needs about 1610612736 actions, over the limit "
    .. "of 67108864")
  lu.assertEquals(error_of(schedule.build, "interleaved1f1b",
      { pp = 4, microbatches = 8, chunks = 1000000000 }),
    "interleaved1f1b: pp x chunks must be at most 65536 model stages, got 4 x 1000000000")
  local rows = {}
  for r = 0, 4096 do rows[#rows + 1] = string.format("%dF0,%dB0", r, r) end
  lu.assertEquals({ schedule.from_csv_text(table.concat(rows, "\n"), "wide.csv") },
    { nil, "wide.csv: ranks must be 1..4096, got 4097 (rows are ranks)" })
  -- ids are never truncated to int
  local s = core.schedule_new(1, 1, 1)
  lu.assertStrContains(error_of(s.set_route, s, 4294967296, { 0 }), "4294967296 is out of range")
  lu.assertStrContains(error_of(s.push_op, s, 0, "F", 4294967296, 0), "4294967296 is out of range")
end

function test_push_ops()
  local s = schedule.new { ranks = 1, stages = 1, microbatches = 2 }
  local C = core.action_codes
  s:push_ops(0, { C.F, 0, 0, C.F, 0, 1, C.FB, 0, 1, C.B, 0, 0 })
  s:push_ops(0, { C.B, 0, 1, C.REDUCE_GRAD, 0, -1 })
  lu.assertEquals(s:actions(0), { "0F0", "0F1", "(0F1;0B0)OVERLAP_F_B", "0B1", "0REDUCE_GRAD" })
  lu.assertEquals(error_of(s.push_ops, s, 0, { C.W, 0 }),
    "push_ops: entry 1: the list ends inside an action")
  lu.assertEquals(error_of(s.push_ops, s, 0, { C.W, 0, 5 }),
    "rank 0, action 5 (0W5): micro-batch 5 is out of range 0..1")
end

function test_long_routes()
  -- more than 256 virtual stages on a route (the old binding's limit)
  local s = schedule.build("interleaved1f1b", { pp = 160, microbatches = 160, chunks = 2 })
  lu.assertEquals(#s:route(0), 320)
  lu.assertEquals({ s:validate() }, { true })
end

function test_family_list_in_one_place()
  local schedules = require("luapipe.schedules")
  lu.assertEquals(schedule.families, schedules.list())
  lu.assertEquals(schedules.canonical("ZB-H1"), "zb1p")
  lu.assertEquals(schedules.canonical("DualPipe"), "dualpipe")
  lu.assertEquals(schedules.canonical("Interleaved 1F1B"), "interleaved1f1b")
  lu.assertNil(schedules.canonical("frobnicate"))
  lu.assertEquals(schedules.label("dualpipev"), "DualPipeV")
  lu.assertEquals(schedule.build("DualPipeV", { pp = 2, microbatches = 4 }):info().name, "dualpipev")
  lu.assertEquals(error_of(schedule.build, "nope", { pp = 2, microbatches = 4 }),
    "unknown schedule 'nope' (families: " .. table.concat(schedules.list(), ", ") .. ")")
end

os.exit(lu.LuaUnit.run())
