-- test_sim_link.lua — the simulator's emulated link (cost.link, cost.bytes,
-- the comm layer's lp_link model): a cross-rank message takes
-- latency + lat + bytes/bw; a chain over 2 ranks grows by exactly two such
-- delays; for every family, the link gives the same timeline as the
-- equivalent plain latency and never a shorter step; bad links raise the
-- parser's message.
local lu = require("luaunit")
local schedule = require("luapipe.schedule")
local comm = require("luapipe.comm")

TestSimLink = {}

local base = { F = 0.01, B = 0.02, W = 0.01 }
local function with(extra)
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(extra) do c[k] = v end
  return c
end

function TestSimLink:test_chain_grows_by_the_modelled_amount()
  -- GPipe, 2 ranks, 1 micro-batch: F0 -> F1 -> B1 -> B0, two messages
  local s = schedule.build("gpipe", { pp = 2, microbatches = 1 })
  local plain = assert(s:simulate(base)):makespan()
  lu.assertAlmostEquals(plain, 0.06, 1e-12)
  local l = assert(comm.parse_link("lat=1ms,bw=1GB/s"))
  lu.assertEquals(l.latency, 1e-3)
  lu.assertEquals(l.bandwidth, 1e9)
  local delay = 1e-3 + 4e6 / 1e9 -- 5 ms for a 4 MB message
  local res = assert(s:simulate(with { link = "lat=1ms,bw=1GB/s", bytes = 4e6 }))
  lu.assertAlmostEquals(res:makespan() - plain, 2 * delay, 1e-12)
  lu.assertAlmostEquals(res:info().latency, delay, 1e-15)
  -- the link adds to the cost model's own latency
  res = assert(s:simulate(with { link = "lat=1ms", latency = 0.002 }))
  lu.assertAlmostEquals(res:makespan() - plain, 2 * 0.003, 1e-12)
  -- a zero link changes nothing
  lu.assertEquals(assert(s:simulate(with { link = "none", bytes = 1e9 })):makespan(), plain)
end

function TestSimLink:test_every_family_matches_the_latency_model()
  local link, bytes = "lat=200us,bw=2GB/s", 8e6
  local delay = 200e-6 + bytes / 2e9
  for _, fam in ipairs({ "gpipe", "1f1b", "interleaved1f1b", "zb1p", "zbv", "dualpipe",
    "dualpipev" }) do
    local s = schedule.build(fam, { pp = 4, microbatches = 8, chunks = 2 })
    local c = with { FB = 0.025 }
    local plain = assert(s:simulate(c)):makespan()
    c.link, c.bytes = link, bytes
    local linked = assert(s:simulate(c))
    c.link, c.bytes, c.latency = nil, nil, delay
    local lat = assert(s:simulate(c))
    lu.assertAlmostEquals(linked:makespan(), lat:makespan(), 1e-12, fam)
    lu.assertTrue(linked:makespan() >= plain + delay - 1e-12, fam)
    local ms = linked:messages()
    lu.assertTrue(#ms > 0, fam)
    for _, m in ipairs(ms) do lu.assertAlmostEquals(m.arrived - m.sent, delay, 1e-12, fam) end
  end
end

function TestSimLink:test_exchanges()
  -- GPipe, 2 ranks, 1 micro-batch, costs in ms (link_unit = 1000): stage 0's
  -- F makes 2 exchanges of max(500, 250) B over a 1 MB/s link, 0.5 ms each
  local s = schedule.build("gpipe", { pp = 2, microbatches = 1 })
  local c = { F = 1, B = 2, link = "bw=1MB/s", link_unit = 1000,
    exchanges = { [0] = { F = { n = 2, bytes_out = 500, bytes_in = 250 } } } }
  local res = assert(s:simulate(c))
  lu.assertAlmostEquals(res:makespan(), 7, 1e-12) -- 6 + 1
  local rk = res:ranks()
  lu.assertAlmostEquals(rk[1].a2a, 1, 1e-12)
  lu.assertEquals(rk[1].a2a_hidden, 0)
  lu.assertEquals(rk[2].a2a, 0)
  -- no link: exchanges take no time
  c.link = nil
  lu.assertAlmostEquals(assert(s:simulate(c)):makespan(), 6, 1e-12)
  local function err(cc)
    local ok, e = pcall(s.simulate, s, cc)
    lu.assertFalse(ok)
    return tostring(e)
  end
  lu.assertStrContains(err { exchanges = { [2] = { F = { n = 1 } } } },
    "simulate: exchanges key 2 is not a model stage 0..1")
  lu.assertStrContains(err { exchanges = { [0] = { W = { n = 1 } } } },
    "simulate: exchanges[0]: unknown key 'W' (expected F, B, I)")
  lu.assertStrContains(err { exchanges = { [0] = { F = { n = -1 } } } },
    "simulate: exchanges[0].F: n = -1 must be a number in 0..1e+15")
end

function TestSimLink:test_bad_links()
  local s = schedule.build("gpipe", { pp = 2, microbatches = 1 })
  local ok, err = pcall(s.simulate, s, with { link = "lat=5" })
  lu.assertFalse(ok)
  lu.assertStrContains(err, "simulate: link 'lat=5': lat=5 needs a unit (us, ms or s)")
  ok, err = pcall(s.simulate, s, with { link = 5 })
  lu.assertStrContains(err, "simulate: link must be a string such as 'lat=50us,bw=2GB/s'")
  ok, err = pcall(s.simulate, s, with { bytes = -1 })
  lu.assertStrContains(err, "simulate: bytes = -1 must be a number in 0..1e+15")
  -- the one cost rule bounds the link's latency and a message's whole delay
  ok, err = pcall(s.simulate, s, with { link = "lat=1e300s,bw=1GB/s" })
  lu.assertFalse(ok)
  lu.assertStrContains(err, "simulate: cost model: link latency = 1e+300 must be a "
    .. "number in 0..1e+15")
  ok, err = pcall(s.simulate, s, with { link = "lat=1s,bw=1B/s", bytes = 1e15 })
  lu.assertFalse(ok)
  lu.assertStrContains(err, "cost model: a message takes 1000000000000001 (latency "
    .. "+ link latency + bytes / bandwidth), more than the limit of 1e+15")
  local v, perr = comm.parse_link("bw=3Gb/s")
  lu.assertNil(v)
  lu.assertEquals(perr, "link 'bw=3Gb/s': bw=3Gb/s has an unknown unit 'Gb/s' (use GB/s, "
    .. "MB/s, KB/s or B/s)")
  lu.assertEquals(assert(comm.parse_link("bw=250MB/s,lat=1.5ms")).text, "lat=1.5ms,bw=250MB/s")
end

os.exit(lu.LuaUnit.run())
