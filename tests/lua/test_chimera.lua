-- test_chimera.lua — the Chimera family (Li & Hoefler, SC'21): two pipelines
-- in opposite directions, each rank holding two stages; one basic unit of D
-- micro-batches has the published bubble (D/2 - 1)(F + B) with F = B, half
-- of 1F1B's; units repeat for more micro-batches; peak activations between
-- D/2+1 and D per rank; the exact lists at D = 4; clear errors.
local lu = require("luaunit")
local schedules = require("luapipe.schedules")
local schedule = require("luapipe.schedule")

TestChimera = {}

function TestChimera:test_placement_and_routes()
  local s = schedules.chimera { pp = 4, microbatches = 8 }
  local info = s:info()
  lu.assertEquals(info.stages, 4)
  lu.assertEquals(info.vstages, 8)
  for v = 0, 3 do lu.assertEquals({ s:vstage(v) }, { v, v }) end         -- down: stage v on rank v
  for k = 0, 3 do lu.assertEquals({ s:vstage(4 + k) }, { k, 3 - k }) end -- up: stage k on rank 3-k
  -- unit k: micro-batches 4k, 4k+1 go down, 4k+2, 4k+3 go up
  for mb = 0, 7 do
    lu.assertEquals(s:route(mb), mb % 4 < 2 and { 0, 1, 2, 3 } or { 4, 5, 6, 7 }, "mb " .. mb)
  end
  for r = 0, 3 do lu.assertEquals(s:memory(r).param_stages, 2, "rank " .. r) end
end

function TestChimera:test_lists_d4()
  local s = schedules.chimera { pp = 4, microbatches = 4 }
  lu.assertEquals(table.concat(s:actions(0), " "), "0F0 0F1 7F2 7B2 7F3 7B3 0B0 0B1")
  lu.assertEquals(table.concat(s:actions(1), " "), "1F0 6F2 1F1 6F3 6B2 1B0 6B3 1B1")
  lu.assertEquals(table.concat(s:actions(2), " "), "5F2 2F0 5F3 2F1 2B0 5B2 2B1 5B3")
  lu.assertEquals(table.concat(s:actions(3), " "), "4F2 4F3 3F0 3B0 3F1 3B1 4B2 4B3")
end

function TestChimera:test_published_bubble()
  for _, D in ipairs { 4, 6, 8, 10 } do
    local s = schedules.chimera { pp = D, microbatches = D }
    lu.assertTrue(s:validate())
    local res = assert(s:simulate { F = 1, B = 1, W = 0.5 })
    lu.assertEquals(res:max_bubble(), (D / 2 - 1) * 2, "D=" .. D)
    local one = assert(schedules["1f1b"] { pp = D, microbatches = D }:simulate { F = 1, B = 1,
      W = 0.5 })
    lu.assertEquals(one:max_bubble(), (D - 1) * 2, "1F1B D=" .. D)
    local lo, hi = math.huge, 0
    for r = 0, D - 1 do
      local p = s:memory(r).peak_live
      lo, hi = math.min(lo, p), math.max(hi, p)
    end
    lu.assertTrue(lo >= D / 2 + 1 and hi <= D, string.format("D=%d activations %d..%d", D, lo, hi))
  end
end

function TestChimera:test_units_repeat()
  local s = schedules.chimera { pp = 4, microbatches = 12 }
  lu.assertTrue(s:validate())
  lu.assertTrue(assert(s:lower()):validate { sends = "rendezvous" })
  local a = s:actions(0)
  lu.assertEquals(#a, 24)
  -- the third unit is the first with micro-batches 8..11
  lu.assertEquals(table.concat(a, " ", 17, 24), "0F8 0F9 7F10 7B10 7F11 7B11 0B8 0B9")
  local back = assert(schedule.from_csv_text(s:to_csv(), "chimera.csv"))
  lu.assertEquals(back:to_csv(), s:to_csv())
end

function TestChimera:test_errors()
  local ok, err = pcall(schedules.chimera, { pp = 3, microbatches = 6 })
  lu.assertFalse(ok)
  lu.assertStrContains(err, "chimera: pp must be even, got 3")
  ok, err = pcall(schedules.chimera, { pp = 4, microbatches = 6 })
  lu.assertFalse(ok)
  lu.assertStrContains(err, "chimera: microbatches must be a multiple of pp = 4, got 6")
end

os.exit(lu.LuaUnit.run())
