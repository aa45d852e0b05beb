-- test_profile.lua — luapipe.profile (the C trace reader and analysis)
-- against hand-computed figures of the small traces in tests/profile/, and
-- against an independent reading of DeepSeek's training trace (decoded
-- whole with cjson; unions by a sweep over interval ends instead of the
-- C merge; phases by scanning every annotation) when that trace is present
-- (../shared/data/deepseek-profile/train.json, or LUAPIPE_DEEPSEEK_TRACE).
local lu = require("luaunit")
local profile = require("luapipe.profile")
local core = require("luapipe.core")

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local data = here .. "../profile/"

local function read1(path, opts)
  local rep, err = profile.read({ path }, opts)
  lu.assertNotNil(rep, err)
  return rep
end

TestProfileSmall = {}

-- tests/profile/small.json, by hand (us): compute [100,110) [115,125)
-- [150.5,155) [160,164) = 28.5; communication (NCCL [105,120), DeepEP
-- dispatch [140,160)) = 35; memory [130,135) = 5; span 100..164 = 64;
-- overlap [105,110) [115,120) [150.5,155) = 14.5; all busy 25 + 5 + 24 = 54.
function TestProfileSmall:test_figures()
  local rep = read1(data .. "small.json")
  lu.assertEquals(#rep.ranks, 1)
  local r = rep.ranks[1]
  lu.assertEquals(r.rank, 3) -- distributedInfo.rank
  lu.assertEquals(r.span_us, 64)
  lu.assertEquals(r.busy_us.compute, 28.5)
  lu.assertEquals(r.busy_us.communication, 35)
  lu.assertEquals(r.busy_us.memory, 5)
  lu.assertEquals(r.comm_overlap_us, 14.5)
  lu.assertEquals(r.comm_exposed_us, 20.5)
  lu.assertAlmostEquals(r.comm_overlap_ratio, 14.5 / 35, 1e-12)
  lu.assertEquals(r.idle_us, 10)
  lu.assertEquals(r.ops, 7)
  local streams = {}
  for _, s in ipairs(r.streams) do streams[s.stream] = s end
  lu.assertEquals(streams[7].busy_us.compute, 28.5)
  lu.assertEquals(streams[7].busy_us.memory, 5)
  lu.assertEquals(streams[20].busy_us.communication, 15)
  lu.assertEquals(streams[21].busy_us.communication, 20)
  -- get_dispatch_layout is DeepEP's local computation, not an exchange
  local un = {}
  for _, u in ipairs(r.unclassified) do un[u.name] = u.count end
  lu.assertEquals(un["void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*)"], 1)
  lu.assertEquals(un.compute_a, 1)
end

-- phases: innermost annotations (not "step"); mlp(B)'s kernels were
-- launched from the autograd thread (tid 1001) while the main thread was
-- inside it
function TestProfileSmall:test_phases()
  local r = read1(data .. "small.json").ranks[1]
  lu.assertEquals(#r.phases, 3)
  local want = { { "attn(F)", 20, 35, 3 }, { "dispatch(F)", 10, 25, 2 }, { "mlp(B)", 30, 8.5, 2 } }
  for i, w in ipairs(want) do
    local ph = r.phases[i]
    lu.assertEquals({ ph.name, ph.cpu_us, ph.gpu_us, ph.ops }, w)
  end
  lu.assertEquals(r.phases[1].class_us.communication, 15)
  lu.assertEquals(r.phases[2].class_us.memory, 5)
  lu.assertEquals(r.phase_totals["mlp(B)"].count, 1)
  lu.assertEquals(r.unattributed_ops, 0)
end

function TestProfileSmall:test_gzip_same_figures()
  local a = read1(data .. "small.json").ranks[1]
  local b = read1(data .. "small.json.gz").ranks[1]
  for _, k in ipairs({ "span_us", "idle_us", "comm_overlap_us", "comm_exposed_us", "ops" }) do
    lu.assertEquals(b[k], a[k], k)
  end
  lu.assertEquals(b.busy_us.compute, a.busy_us.compute)
  lu.assertEquals(#b.phases, #a.phases)
end

-- a folder: files in natural order (rank2 before rank10), ranks by order;
-- a bare JSON array of events is a trace too
function TestProfileSmall:test_folder_ranks()
  local rep = read1(data .. "ranks")
  lu.assertEquals(#rep.ranks, 2)
  lu.assertStrContains(rep.ranks[1].file, "rank2.json")
  lu.assertEquals(rep.ranks[1].rank, 0)
  lu.assertEquals(rep.ranks[1].busy_us.communication, 6)
  lu.assertEquals(rep.ranks[1].comm_overlap_us, 3) -- [12,15)
  lu.assertEquals(rep.ranks[2].rank, 1)
  lu.assertEquals(rep.ranks[2].busy_us.memory, 1)
  lu.assertEquals(rep.ranks[2].idle_us, 3)
end

function TestProfileSmall:test_rules_extend_and_replace()
  -- a user rule first: compute_b becomes communication
  local rules = { { match = "^compute_b$", class = "communication" } }
  for _, r in ipairs(profile.rules) do rules[#rules + 1] = r end
  local r = read1(data .. "small.json", { rules = rules }).ranks[1]
  lu.assertEquals(r.busy_us.communication, 40) -- [105,125) + [140,160)
  lu.assertEquals(r.busy_us.compute, 18.5)
  -- replace: a function rule only (memcpy then counts as compute)
  local r2 = read1(data .. "small.json", { rules = { function(name)
    if name:find("nccl") then return "communication" end
  end } }).ranks[1]
  lu.assertEquals(r2.busy_us.communication, 15)
  lu.assertEquals(r2.busy_us.memory, 0)
  -- ignore drops operations from every figure
  local r3 = read1(data .. "small.json", { rules = { { cat = "gpu_memcpy", class = "ignore" } } })
    .ranks[1]
  lu.assertEquals(r3.ops, 6)
  lu.assertEquals(r3.idle_us, 15)
  -- bad rules are reported, not raised
  local rep, err = profile.read({ data .. "small.json" },
    { rules = { { match = "x", class = "gpu" } } })
  lu.assertNil(rep)
  lu.assertStrContains(err, "rule 1: class must be one of")
  rep, err = profile.read({ data .. "small.json" }, { rules = { function() return "nope" end } })
  lu.assertNil(rep)
  lu.assertStrContains(err, "rule 1 returned 'nope'")
end

function TestProfileSmall:test_default_classes()
  local c = profile.classify
  lu.assertEquals(c("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*)", "kernel"),
    "communication")
  lu.assertEquals(c("void dpsk::ep::internode::cached_notify<false>(int)", "kernel"),
    "communication")
  lu.assertEquals(c("void deep_ep::intranode::combine<8>(float*)", "kernel"), "communication")
  lu.assertEquals(c("void deep_ep::internode_ll::dispatch<3>()", "kernel"), "communication")
  lu.assertEquals(c("void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*)", "kernel"),
    nil)
  lu.assertEquals(c("ncclDevKernel_AllGather_RING_LL", "kernel"), "communication")
  lu.assertEquals(c("Memcpy DtoD (Device -> Device)", "gpu_memcpy"), "memory")
  lu.assertEquals(c("all-to-all wait: dispatch", "a2a"), "wait")
  lu.assertEquals(c("all-to-all", "a2a"), "communication")
  lu.assertEquals(c("0F3", "F"), "compute")
end

function TestProfileSmall:test_costs()
  local r = read1(data .. "small.json").ranks[1]
  local c = assert(profile.costs(r))
  -- F: attn(F) + dispatch(F): compute 20 + memcpy 5, exchanges 15 + 20
  lu.assertAlmostEquals(c.parts.F.compute, 0.025, 1e-12)
  lu.assertAlmostEquals(c.parts.F.exchange, 0.035, 1e-12)
  lu.assertAlmostEquals(c.parts.F.dispatch, 0.020, 1e-12)
  lu.assertAlmostEquals(c.F, 0.060, 1e-12)
  lu.assertAlmostEquals(c.I, 0.0085, 1e-12)
  lu.assertAlmostEquals(c.FB, 0.064, 1e-12)
  -- a user mapping: mlp(B) left out -> no backward
  local c2, err = profile.costs(r, { mapping = { ["mlp(B)"] = false } })
  lu.assertNil(c2)
  lu.assertStrContains(err, "no phases map to a forward and a backward")
  -- the cost text parses for the simulator
  local sim = require("luapipe.sim")
  local cost = sim.parse_cost(c.text)
  lu.assertEquals(cost.FB, 0.064)
end

function TestProfileSmall:test_svg()
  local rep = read1(data .. "small.json")
  local svg = assert(profile.svg(rep, rep.ranks[1]))
  lu.assertStrContains(svg, "<svg")
  lu.assertStrContains(svg, ">stream 21</text>")
  lu.assertStrContains(svg, "attn(F)")
  lu.assertStrContains(svg, 'stroke="black"') -- communication outlined
end

function TestProfileSmall:test_json_keys()
  local json = require("luapipe.json")
  local v = assert(json.decode(profile.json(read1(data .. "small.json"))))
  local r = v.ranks[1]
  for _, k in ipairs({ "rank", "span_us", "idle_us", "busy_us", "comm_overlap_us",
    "comm_exposed_us",
    "comm_overlap_ratio", "streams", "phases", "phase_totals", "unclassified" }) do
    lu.assertNotNil(r[k], k)
  end
  lu.assertEquals(r.busy_us.compute, 28.5)
  lu.assertEquals(r.streams[1].busy_us.memory, 5)
  lu.assertEquals(r.phases[3].gpu_us, 8.5)
  lu.assertEquals(r.phase_totals["attn(F)"].count, 1)
end

-- a trace luapipe wrote (the simulator's): ranks from its processes, the
-- actions' union is the simulator's busy time of each rank
function TestProfileSmall:test_luapipe_sim_trace()
  local schedule = require("luapipe.schedule")
  local s = schedule.build("dualpipe", { pp = 4, microbatches = 8 })
  local res = assert(s:simulate({ F = 1, B = 2, W = 1, FB = 2.5, latency = 0.25 }))
  local base = os.tmpname()
  local path = base .. ".json"
  assert(res:write_trace(path))
  local rep = read1(path)
  os.remove(path)
  os.remove(base)
  local sr = res:ranks()
  lu.assertEquals(#rep.ranks, 4)
  for i, r in ipairs(rep.ranks) do
    lu.assertEquals(r.rank, i - 1)
    lu.assertAlmostEquals(r.busy_us.compute, sr[i].busy * 1000, 1e-6)
    lu.assertTrue(r.busy_us.communication > 0) -- messages take the latency
    lu.assertEquals(#r.phases, 0)
    lu.assertEquals(#r.unclassified, 0)
  end
end

-- ---- bad input: one line naming the file and the event ------------------

TestProfileBad = {}

local function tmpfile(text, suffix)
  local base = os.tmpname()
  os.remove(base)
  local path = base .. (suffix or ".json")
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

local function bad(text, want, suffix)
  local path = tmpfile(text, suffix)
  local rep, err = profile.read({ path })
  os.remove(path)
  lu.assertNil(rep)
  lu.assertEquals(err, path .. ": " .. want)
end

function TestProfileBad:test_messages()
  local k = '{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7'
  bad('{"traceEvents":[' .. k .. ',"ts":1', "truncated: the JSON ends early (after "
    .. (#k + 23) .. " bytes)")
  bad("hello", "not JSON: lexical error: invalid char in json text (at byte 1)")
  bad('{"foo": 1}', 'not a trace: no "traceEvents" array')
  bad('{"traceEvents": {}}', 'not a trace: "traceEvents" is not an array')
  bad('{"traceEvents": [3]}', "not a trace: traceEvents[0] is not an object")
  bad('{"traceEvents":[{"ph":"M"},' .. k .. ',"dur":3}]}',
    'traceEvents[1] ("k"): a complete event ("ph": "X") without "ts"')
  bad('{"traceEvents":[' .. k .. ',"ts":3}]}',
    'traceEvents[0] ("k"): a complete event ("ph": "X") without "dur"')
  bad('{"traceEvents":[' .. k .. ',"ts":3,"dur":-2}]}',
    'traceEvents[0] ("k"): negative "dur" (-2.000 us)')
  bad('{"traceEvents":[' .. k .. ',"ts":"3","dur":2}]}',
    'traceEvents[0] ("k"): "ts" is not a number in range')
  bad("", "empty file")
  bad('{"traceEvents": []}', 'no GPU operations (no "kernel", "gpu_memcpy" or "gpu_memset" events, '
    .. "and not a trace luapipe wrote)")
  bad("not gzip", "not a gzip file (the name ends in .gz)", ".json.gz")
end

function TestProfileBad:test_truncated_gzip_and_folders()
  local f = assert(io.open(data .. "small.json.gz", "rb"))
  local gz = f:read("a")
  f:close()
  bad(gz:sub(1, #gz // 2), "damaged gzip data: unexpected end of file", ".json.gz")
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir " .. dir)
  local rep, err = profile.read({ dir })
  os.execute("rmdir " .. dir)
  lu.assertNil(rep)
  lu.assertEquals(err, dir .. ": no trace files (*.json, *.json.gz) in this folder")
  rep, err = profile.read({ data .. "small.json", data .. "small.json.gz" })
  lu.assertNil(rep)
  lu.assertStrContains(err, "rank 3 is in two files")
end

-- ---- DeepSeek's trace, read independently --------------------------------

local function deepseek_path()
  local p = os.getenv("LUAPIPE_DEEPSEEK_TRACE")
    or (here .. "../../../shared/data/deepseek-profile/train.json")
  local f = io.open(p, "rb")
  if not f then
    p = here .. "../../../../shared/data/deepseek-profile/train.json" -- from a worktree
    f = io.open(p, "rb")
  end
  if not f then return nil end
  f:close()
  return p
end

-- The reference: sweep over interval ends, counting open intervals per class.
local function sweep(ops)
  local ev = {}
  for _, o in ipairs(ops) do
    ev[#ev + 1] = { o.s, 1, o.c }
    ev[#ev + 1] = { o.e, -1, o.c }
  end
  table.sort(ev, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end return a[2] < b[2] end)
  local open = { compute = 0, communication = 0, memory = 0 }
  local t = { compute = 0, communication = 0, memory = 0, both = 0, any = 0 }
  local prev
  for _, e in ipairs(ev) do
    if prev then
      local dt = e[1] - prev
      for k, n in pairs(open) do if n > 0 then t[k] = t[k] + dt end end
      if open.compute > 0 and open.communication > 0 then t.both = t.both + dt end
      if open.compute + open.communication + open.memory > 0 then t.any = t.any + dt end
    end
    open[e[3]] = open[e[3]] + e[2]
    prev = e[1]
  end
  return t
end

TestProfileDeepSeek = {}

function TestProfileDeepSeek:test_matches_independent_reading()
  local path = deepseek_path()
  if not path then
    lu.skip("DeepSeek's trace is absent (../shared/data/deepseek-profile/train.json)")
  end
  local cjson = require("cjson")
  local f = assert(io.open(path, "rb"))
  local doc = cjson.decode(f:read("a"))
  f:close()
  local ops, calls, anns = {}, {}, {}
  local first, last = math.huge, -math.huge
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == "X" then
      if e.cat == "kernel" or e.cat == "gpu_memcpy" or e.cat == "gpu_memset" then
        local c = (e.cat ~= "kernel") and "memory"
          or ((e.name:find("dpsk::ep::internode::", 1, true)
            and not e.name:find("layout", 1, true)) and "communication") or "compute"
        ops[#ops + 1] = { s = e.ts, e = e.ts + e.dur, c = c, corr = e.args.correlation, d = e.dur }
        first, last = math.min(first, e.ts), math.max(last, e.ts + e.dur)
      elseif e.cat == "cuda_runtime" or e.cat == "cuda_driver" then
        if e.args and e.args.correlation then calls[e.args.correlation] = e end
      elseif e.cat == "user_annotation" then
        anns[#anns + 1] = e
      end
    end
  end
  local t = sweep(ops)
  local r = read1(path).ranks[1]
  lu.assertEquals(r.rank, 0)
  lu.assertEquals(#ops, 983)
  lu.assertEquals(r.ops, 983)
  lu.assertEquals(r.span_us, last - first)
  lu.assertEquals(r.busy_us.compute, t.compute)
  lu.assertEquals(r.busy_us.communication, t.communication)
  lu.assertEquals(r.busy_us.memory, t.memory)
  lu.assertEquals(r.comm_overlap_us, t.both)
  lu.assertEquals(r.idle_us, (last - first) - t.any)
  -- phases: annotations with no other annotation of their thread inside
  local leaves = {}
  for _, a in ipairs(anns) do
    local inner = false
    for _, b in ipairs(anns) do
      if b ~= a and b.tid == a.tid and b.ts >= a.ts and b.ts + b.dur <= a.ts + a.dur then
        inner = true
      end
    end
    if not inner then leaves[#leaves + 1] = a end
  end
  table.sort(leaves, function(a, b) return a.ts < b.ts end)
  lu.assertEquals(#r.phases, 40)
  lu.assertEquals(#leaves, 40)
  local gpu, n = {}, {}
  for _, o in ipairs(ops) do
    local c = calls[o.corr]
    local owner
    for i, a in ipairs(leaves) do -- same thread first
      if c and c.tid == a.tid and c.ts >= a.ts and c.ts < a.ts + a.dur then owner = i end
    end
    for i, a in ipairs(leaves) do
      if c and not owner and c.pid == a.pid and c.ts >= a.ts and c.ts < a.ts + a.dur then
        owner = i
      end
    end
    if owner then
      gpu[owner] = (gpu[owner] or 0) + o.d
      n[owner] = (n[owner] or 0) + 1
    end
  end
  for i, a in ipairs(leaves) do
    local ph = r.phases[i]
    lu.assertEquals(ph.name, a.name, "phase " .. i)
    lu.assertEquals(ph.cpu_us, a.dur, "phase " .. i)
    lu.assertEquals(ph.gpu_us, gpu[i] or 0, "phase " .. i .. " " .. a.name)
    lu.assertEquals(ph.ops, n[i] or 0, "phase " .. i)
  end
  -- the figures the README quotes
  lu.assertEquals(r.span_us, 129012)
  lu.assertEquals(r.busy_us.communication, 113030)
  lu.assertEquals(r.comm_overlap_us, 108868)
end

os.exit(lu.LuaUnit.run())
