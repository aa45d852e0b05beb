-- test_perf_format.lua — the training summary's wording (perf.format): a
-- step whose actions take under a millisecond says that the prediction
-- means nothing there (and gives no "mean costs miss" explanation), one of
-- longer actions does not.
local lu = require("luaunit")
local perf = require("luapipe.perf")

local function summary(costs, extra)
  local s = {
    steps = 19, skipped = true, ranks = 2, step_ms = 9.9, predicted_ms = 5.6, makespan_ms = 4.3,
    latency_ms = 0, ratio = 0.567, costs = costs, stages = { [0] = costs },
    bubble_pct = 55.3, sim_bubble_pct = 21.2, overhead_pct = 0.47, post_pct = 0.45, wait_pct = 50.9,
    compute_pct = 48.6,
    replay_ms = 6.2, replay_step_ms = 10.1, replay_ratio = 0.618, replay_steps = 19,
  }
  for k, v in pairs(extra or {}) do s[k] = v end
  return perf.format(s)
end

local short_note = "(too short for the prediction to mean much: the longest mean action here, F, takes 0.51 ms"

function test_short_actions_are_said()
  local text = summary({ F = 0.51, I = 0.23, W = 0.15 })
  lu.assertStrContains(text, "predicted/measured 0.567")
  lu.assertStrContains(text, short_note)
  lu.assertNotStrContains(text, "mean costs miss")
end

function test_long_actions_are_not()
  local text = summary({ F = 2.7, B = 2.38, I = 1.93, W = 0.78, FB = 4.53 },
    { step_ms = 85.1, predicted_ms = 78.7, replay_ms = 85.2, replay_step_ms = 85.9 })
  lu.assertNotStrContains(text, "too short")
  lu.assertStrContains(text, "(mean costs miss 7.6% of the step here")
end

os.exit(lu.LuaUnit.run())
