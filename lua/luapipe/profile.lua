-- luapipe.profile: profile traces in. Reads Chrome-format JSON traces (the
-- PyTorch profiler's .json / .json.gz, a folder of per-rank traces, or a
-- trace luapipe wrote) through the C reader (core/profile), classifies
-- every GPU operation by the rules below, and reports per rank.
--
--   local profile = require("luapipe.profile")
--   local rep = assert(profile.read({ "train.json" }))  -- or nil, message
--   print(profile.text(rep))                             -- the table
--   print(profile.json(rep))                             -- stable keys
--   local c = profile.costs(rep.ranks[1])                -- simulator costs
--
-- Classification: profile.rules is a list tried in order, the first match
-- wins. A rule is {class = C, cat = "gpu_memcpy"} (category equals),
-- {class = C, match = "lua pattern"} (on the name), {class = C,
-- plain = "text"} (substring, case-insensitive), or a function(name, cat)
-- that returns a class or nil. Classes: "compute", "communication",
-- "memory", "wait" (time a luapipe rank sat blocked inside an action: taken
-- out of compute) and "ignore" (left out of every figure). An operation no
-- rule names counts as compute and is listed as unclassified.
--
-- Figures (per rank, microseconds; the definitions of Holistic Trace
-- Analysis, HTA, where it has one):
--   span_us            last end - first start of the GPU operations (HTA's
--                      "kernel time" of its temporal breakdown)
--   busy_us.<class>    union of that class's intervals over all streams
--                      (busy_us.compute is HTA's compute_time)
--   idle_us            span - union of all operations (HTA's idle_time)
--   comm_overlap_us    |union(communication) ∩ union(compute)|
--   comm_overlap_ratio comm_overlap_us / busy_us.communication (HTA's
--                      comp_comm_overlap_ratio, with our classes)
--   comm_exposed_us    busy_us.communication - comm_overlap_us
--   comm_ops_us, comm_ops_overlap_us  the same per operation: summed
--                      durations of the communication operations, and the
--                      summed |operation ∩ union(compute)| (the share
--                      luapipe's training summary calls "hidden")
--   phases             innermost user annotations (record_function
--                      ranges containing no other annotation of their
--                      thread), in CPU order: cpu_us = its duration,
--                      gpu_us = summed durations of the operations it
--                      launched: a kernel's launching runtime call (same
--                      args.correlation) lies in the annotation's CPU
--                      interval on the same thread, else (the autograd
--                      thread) on another thread of the same process
local core = require("luapipe.core")
local util = require("luapipe.util")

local M = {}

-- What M.read made and M.costs computed (weak keys): the functions that
-- take a rank of a report or a costs table check their argument against
-- these, so misuse says what is wanted instead of failing inside.
local made_ranks = setmetatable({}, { __mode = "k" })
local made_costs = setmetatable({}, { __mode = "k" })

local function report_arg(fn, pos, rep)
  local ok = type(rep) == "table" and type(rep.ranks) == "table"
  if ok then
    for _, r in ipairs(rep.ranks) do if not made_ranks[r] then ok = false end end
  end
  if not ok then
    util.raise(string.format("%s: report (argument %d) must be a report from profile.read, got %s",
      fn, pos, util.shown(rep)))
  end
  return rep
end

local function rank_arg(fn, pos, r)
  if not made_ranks[r] then
    util.raise(string.format("%s: rank (argument %d) must be a rank of a report from profile.read "
      .. "(report.ranks[i]), got %s", fn, pos, util.shown(r)))
  end
  return r
end

M.classes = { "compute", "communication", "memory", "wait", "ignore" }
local is_class = {}
for _, c in ipairs(M.classes) do is_class[c] = true end

-- DeepEP's all-to-all kernels: dispatch, combine and their notify/layout
-- exchanges in the internode, intranode and low-latency namespaces
-- (deep_ep::..., DeepSeek's own build dpsk::ep::...); get_dispatch_layout
-- (a local computation) is not among them.
local function deepep(name)
  for _, ns in ipairs({ "::internode::", "::intranode::", "::internode_ll::" }) do
    local i = name:find(ns, 1, true)
    if i then
      local id = name:match("^([%w_]+)", i + #ns)
      if id and (id:find("dispatch") or id:find("combine") or id:find("notify")) then
        return "communication"
      end
    end
  end
  return nil
end

-- The default rules (a copy is taken by each read; change M.rules to
-- change the defaults in a script).
M.rules = {
  { cat = "gpu_memcpy", class = "memory" },
  { cat = "gpu_memset", class = "memory" },
  { plain = "nccl", class = "communication" },
  { plain = "rccl", class = "communication" },
  deepep,
  { plain = "c10d::", class = "communication" },
  { plain = "nvshmem", class = "communication" },
  { match = "[Aa]ll_?[Tt]o_?[Aa]ll", class = "communication" },
  { match = "[Aa]ll_?[Rr]educe", class = "communication" },
  { match = "[Aa]ll_?[Gg]ather", class = "communication" },
  { match = "[Rr]educe_?[Ss]catter", class = "communication" },
  { plain = "cross_device_reduce", class = "communication" },
  -- traces luapipe wrote: an exchange, the part of it a rank sat blocked
  -- in, messages, and actions
  { cat = "phase", class = "ignore" }, -- a pair's phases: inside its FB slice (see M.read)
  { cat = "a2a", match = "^all%-to%-all wait", class = "wait" },
  { cat = "a2a", class = "communication" },
  { cat = "comm", class = "communication" },
  { cat = "F", class = "compute" }, { cat = "B", class = "compute" },
  { cat = "I", class = "compute" }, { cat = "W", class = "compute" },
  { cat = "FB", class = "compute" }, { cat = "optim", class = "compute" },
  { cat = "compute", class = "compute" },
  -- well-known computation (so that what is listed as unclassified is
  -- what no rule knows)
  { plain = "gemm", class = "compute" },
  { plain = "cutlass", class = "compute" },
  { plain = "flash", class = "compute" },
  { plain = "at::native::", class = "compute" },
  { plain = "triton", class = "compute" },
  { plain = "cublas", class = "compute" },
  { plain = "cudnn", class = "compute" },
  { plain = "layer_norm", class = "compute" },
}

-- Checks a rule list; returns it or nil, message.
function M.check_rules(rules)
  if type(rules) ~= "table" then return nil, "rules must be a list, got " .. type(rules) end
  for i, r in ipairs(rules) do
    if type(r) == "table" then
      if not is_class[r.class] then
        return nil, string.format("rule %d: class must be one of %s, got %s", i,
          table.concat(M.classes, ", "), tostring(r.class))
      end
      if r.match == nil and r.plain == nil and r.cat == nil then
        return nil, string.format("rule %d: needs match, plain or cat", i)
      end
      if r.match ~= nil and type(r.match) ~= "string" then
        return nil, string.format("rule %d: match must be a Lua pattern string", i)
      end
      for _, k in ipairs({ "plain", "cat" }) do
        if r[k] ~= nil and type(r[k]) ~= "string" then
          return nil, string.format("rule %d: %s must be a string, got %s", i, k, util.shown(r[k]))
        end
      end
      if r.match then
        local ok, err = pcall(string.find, "", r.match)
        if not ok then return nil, string.format("rule %d: bad pattern '%s': %s", i, r.match,
          util.message(err)) end
      end
    elseif type(r) ~= "function" then
      return nil, string.format("rule %d: a table or a function, got %s", i, type(r))
    end
  end
  return rules
end

-- classify(name, cat, rules) -> class, rule index; nil when no rule names
-- it (then it counts as compute). A function rule that fails or returns
-- something other than a class raises an error naming the rule.
local function classify(name, cat, rules)
  local lname
  for i, r in ipairs(rules) do
    if type(r) == "function" then
      local ok, c = pcall(r, name, cat)
      if not ok then error(string.format("rule %d failed on '%s': %s", i, name, tostring(c)), 0) end
      if c ~= nil then
        if not is_class[c] then
          error(string.format("rule %d returned '%s' for '%s', not a class (%s)", i, tostring(c),
            name, table.concat(M.classes, ", ")), 0)
        end
        return c, i
      end
    else
      local ok = r.cat == nil or r.cat == cat
      if ok and r.match then ok = name:find(r.match) ~= nil end
      if ok and r.plain then
        lname = lname or name:lower()
        ok = lname:find(r.plain:lower(), 1, true) ~= nil
      end
      if ok then return r.class, i end
    end
  end
  return nil
end

-- M.classify(name, cat[, rules]) -> class, rule index, or nil (as
-- classify above; rules default M.rules, checked as M.read checks them).
function M.classify(name, cat, rules)
  util.arg("profile.classify", 1, "name", name, "string", "an operation name")
  util.arg("profile.classify", 2, "cat", cat, "?string", "a category such as \"kernel\"")
  util.arg("profile.classify", 3, "rules", rules, "?table", "a list of rules")
  rules = rules or M.rules
  local ok, err = M.check_rules(rules)
  if not ok then util.raise("profile.classify: rules (argument 3): " .. err) end
  local cok, c, i = pcall(classify, name, cat, rules)
  if not cok then util.raise("profile.classify: " .. tostring(c)) end
  return c, i
end

-- Loads a rules file (`luapipe profile --rules FILE`): a Lua chunk that
-- returns a list of rules put before the defaults, or a table
-- {rules = {...}, replace = true (drop the defaults), mapping = {...}}.
-- Returns rules, mapping or nil, message.
function M.load_rules(path)
  util.arg("profile.load_rules", 1, "path", path, "string", "a file name")
  local chunk, err = loadfile(path, "t")
  if not chunk then return nil, tostring(err) end
  local ok, t = pcall(chunk)
  if not ok then return nil, path .. ": " .. tostring(t) end
  if type(t) ~= "table" then return nil, path .. ": must return a table of rules" end
  local list, mapping = t, nil
  if t.rules or t.mapping or t.replace then
    list, mapping = t.rules or {}, t.mapping
  end
  local rules = {}
  for _, r in ipairs(list) do rules[#rules + 1] = r end
  if not t.replace then
    for _, r in ipairs(M.rules) do rules[#rules + 1] = r end
  end
  local cr, cerr = M.check_rules(rules)
  if not cr then return nil, path .. ": " .. cerr end
  if mapping ~= nil and type(mapping) ~= "table" and type(mapping) ~= "function" then
    return nil, path .. ": mapping must be a table or a function"
  end
  return rules, mapping
end

local orders = {
  rank = { "rank", "file", "span_us", "idle_us", "busy_us", "comm_overlap_us", "comm_exposed_us",
    "comm_overlap_ratio", "comm_ops_us", "comm_ops_overlap_us", "streams", "phases",
    "phase_totals", "unclassified" },
  busy = { "compute", "communication", "memory" },
  stream = { "stream", "device", "busy_us", "ops" },
  phase = { "name", "cpu_us", "gpu_us", "ops" },
}
local function ordered(t, o) return setmetatable(t, { __jsonorder = orders[o] }) end

-- The phases of a trace luapipe wrote: the slices of category "phase"
-- (an overlapped pair's advances and weight-grad pieces, named as
-- DeepSeek's profile names its phases: core/exec/pairs.c), per file and
-- rank, in start order, each as a phase of a PyTorch trace would be: its
-- duration is CPU work of that rank (waits for the exchange it finishes
-- included), counted as compute. Read from the files again (luapipe's
-- traces are small); {} when no name has that category.
local function luapipe_phases(ranks, names)
  local out, any = {}, false
  for _, n in ipairs(names) do if n.cat == "phase" then any = true end end
  if not any then return out end
  local json = require("luapipe.json")
  for _, r in ipairs(ranks) do
    if not out[r.file] then
      out[r.file] = {}
      local f = io.open(r.file, "rb")
      local text = f and f:read("a")
      if f then f:close() end
      local ok, t = pcall(json.decode, text or "")
      local evs = ok and type(t) == "table" and t.traceEvents or {}
      local by = out[r.file]
      for _, e in ipairs(evs) do
        if e.cat == "phase" and e.ph == "X" then
          local rk = math.tointeger(e.pid) or e.pid
          by[rk] = by[rk] or {}
          local l = by[rk]
          l[#l + 1] = { name = e.name, cpu_us = e.dur, gpu_us = e.dur, ops = 1, ts = e.ts,
            gpu_first_us = e.ts, gpu_last_us = e.ts + e.dur,
            class_us = { compute = e.dur, communication = 0, memory = 0 } }
        end
      end
      for _, l in pairs(by) do
        table.sort(l, function(a, b) return a.ts < b.ts end)
        for _, ph in ipairs(l) do ph.ts = nil end
      end
    end
  end
  return out
end

-- M.read(paths[, opts]) -> report | nil, message. opts.rules: the rule
-- list (default M.rules). The report: {ranks = {...}, bytes =, events =,
-- files = paths, profile = the luapipe.Profile (for M.svg)}; each rank as
-- in the JSON output (keys above), plus ops, t0_us, unattributed_ops.
function M.read(paths, opts)
  if type(paths) == "string" then paths = { paths } end
  local ok = type(paths) == "table" and #paths > 0
  if ok then
    for i = 1, #paths do if type(paths[i]) ~= "string" then ok = false end end
  end
  if not ok then
    util.raise("profile.read: paths (argument 1) must be a list of trace file or folder names, got "
      .. util.shown(paths))
  end
  opts = util.arg("profile.read", 2, "opts", opts, "?table", "a table {rules =}") or {}
  local rules = opts.rules or M.rules
  local cr, cerr = M.check_rules(rules)
  if not cr then return nil, cerr end
  local p, err = core.profile_read(paths)
  if not p then return nil, err end
  local names = p:names()
  local classes, unnamed = {}, {}
  for i, n in ipairs(names) do
    local cok, c = pcall(classify, n.name, n.cat, rules)
    if not cok then return nil, tostring(c) end
    classes[i] = c or "compute"
    if not c then unnamed[i] = true end
  end
  p:set_classes(classes)
  local ranks, aerr = p:analyze()
  if not ranks then return nil, aerr end
  local own_phases = luapipe_phases(ranks, names)
  for ri, r in ipairs(ranks) do
    if #r.phases == 0 and own_phases[r.file] and own_phases[r.file][r.rank] then
      r.phases = own_phases[r.file][r.rank]
      r.unattributed_ops = r.unattributed_ops or 0
    end
    made_ranks[r] = true
    ordered(r, "rank")
    ordered(r.busy_us, "busy")
    r.comm_overlap_ratio = r.busy_us.communication > 0
      and r.comm_overlap_us / r.busy_us.communication or 0
    for _, s in ipairs(r.streams) do
      ordered(s, "stream")
      ordered(s.busy_us, "busy")
    end
    local totals, order = {}, {}
    for _, ph in ipairs(r.phases) do
      ordered(ph, "phase")
      ordered(ph.class_us, "busy")
      local t = totals[ph.name]
      if not t then
        t = setmetatable({ count = 0, gpu_us = 0, cpu_us = 0 },
          { __jsonorder = { "count", "gpu_us", "cpu_us" } })
        totals[ph.name] = t
        order[#order + 1] = ph.name
      end
      t.count = t.count + 1
      t.gpu_us = t.gpu_us + ph.gpu_us
      t.cpu_us = t.cpu_us + ph.cpu_us
    end
    r.phase_totals = setmetatable(totals, { __jsonorder = order })
    r.phase_order = order
    -- unclassified names of this rank's operations
    local un = {}
    for i, st in pairs(p:name_stats(ri)) do
      if unnamed[i] then
        un[#un + 1] = setmetatable({ name = names[i].name, count = st.ops, gpu_us = st.us },
          { __jsonorder = { "name", "count", "gpu_us" } })
      end
    end
    table.sort(un, function(a, b)
      if a.gpu_us ~= b.gpu_us then return a.gpu_us > b.gpu_us end
      return a.name < b.name
    end)
    r.unclassified = require("luapipe.json").array(un)
  end
  local bytes, events = p:stats()
  -- a trace luapipe wrote (its slices carry luapipe's categories: F, B,
  -- comm, a2a, ...) holds what each rank timed, not GPU kernels
  local gpu_cat = { kernel = true, gpu_memcpy = true, gpu_memset = true }
  local source = "profiler"
  for _, n in ipairs(names) do
    if not gpu_cat[n.cat] then source = "luapipe" break end
  end
  return { ranks = ranks, bytes = bytes, events = events, files = paths, profile = p, names = names,
    source = source }
end

-- ---- output -------------------------------------------------------------

local function ms(us) return string.format("%.3f", us / 1000) end
local function pct(a, b) return b > 0 and string.format("%.1f%%", 100 * a / b) or "-" end

-- M.text(report[, opts]) -> the tables a person reads (times in ms with
-- three decimals: exact microseconds). opts.unclassified: how many
-- unclassified names to list (default 8).
function M.text(rep, opts)
  report_arg("profile.text", 1, rep)
  opts = util.arg("profile.text", 2, "opts", opts, "?table", "a table {unclassified =}") or {}
  if opts.unclassified ~= nil then
    util.int_arg("profile.text", 2, "opts.unclassified", opts.unclassified, 0)
  end
  local L = {}
  local function add(...) L[#L + 1] = string.format(...) end
  -- a trace luapipe wrote: operations are what each rank timed (actions,
  -- messages, all-to-alls), on its tracks; on a CPU run, CPU work
  local own = rep.source == "luapipe"
  if own then
    add("a trace luapipe wrote: its operations are the actions, messages and all-to-alls each "
      .. "rank timed (CPU work on a CPU run, not GPU kernels), its streams the rank's tracks")
  end
  for _, r in ipairs(rep.ranks) do
    add("rank %d (%s): %d %s on %d %s, span %s ms", r.rank, r.file, r.ops,
      own and "timed operations" or "GPU operations", #r.streams, own and "tracks" or "streams",
      ms(r.span_us))
    add("  %-28s %12s %8s", "busy (union of intervals)", "ms", "of span")
    for _, c in ipairs({ "compute", "communication", "memory" }) do
      add("  %-28s %12s %8s", c, ms(r.busy_us[c]), pct(r.busy_us[c], r.span_us))
    end
    add("  %-28s %12s %8s", "idle", ms(r.idle_us), pct(r.idle_us, r.span_us))
    add("  %-28s %12s %8s", "communication overlapped", ms(r.comm_overlap_us),
      pct(r.comm_overlap_us, r.busy_us.communication) .. "")
    add("  %-28s %12s %8s", "communication exposed", ms(r.comm_exposed_us),
      pct(r.comm_exposed_us, r.busy_us.communication))
    add("  (overlapped/exposed: share of communication time; comm_overlap_ratio %.4f)",
      r.comm_overlap_ratio)
    if r.comm_ops_us ~= r.busy_us.communication then
      add("  per operation (summed, not a union): communication %s ms, %s of it overlapped",
        ms(r.comm_ops_us), pct(r.comm_ops_overlap_us, r.comm_ops_us))
    end
    add("  %-10s %12s %14s %10s %8s", own and "track" or "stream", "compute ms", "communication",
      "memory", "ops")
    local track_compute = 0
    for _, s in ipairs(r.streams) do
      add("  %-10s %12s %14s %10s %8d", (#r.streams > 0 and s.device ~= r.streams[1].device)
        and (s.device .. ":" .. s.stream) or tostring(s.stream), ms(s.busy_us.compute),
        ms(s.busy_us.communication), ms(s.busy_us.memory), s.ops)
      track_compute = math.max(track_compute, s.busy_us.compute)
    end
    if track_compute > r.busy_us.compute + 0.5 then
      -- luapipe's traces: an action's slice includes the time its rank sat
      -- blocked in an exchange ("wait"), which the union above leaves out
      add("  (per %s, compute counts each action's whole slice, including the time the rank sat "
        .. "blocked in exchanges, %s ms here; the busy compute above leaves that time out)",
        own and "track" or "stream", ms(track_compute - r.busy_us.compute))
    end
    if #r.phases > 0 and own then
      add("  phases (an overlapped pair's advances and weight-grad pieces, in order; CPU time of "
        .. "the rank, waits included, in both time columns)")
    elseif #r.phases > 0 then
      add("  phases (innermost annotations, CPU order; GPU = summed durations of what "
        .. "each launched)")
      add("  %4s %-24s %10s %10s %10s %10s %6s", "#", "phase", "CPU ms", "GPU ms", "compute",
        "comm", "ops")
      for i, ph in ipairs(r.phases) do
        add("  %4d %-24s %10s %10s %10s %10s %6d", i, ph.name, ms(ph.cpu_us), ms(ph.gpu_us),
          ms(ph.class_us.compute + ph.class_us.memory), ms(ph.class_us.communication), ph.ops)
      end
      add("  %-24s %6s %10s %10s", "phase totals", "count", "GPU ms", "CPU ms")
      for _, name in ipairs(r.phase_order) do
        local t = r.phase_totals[name]
        add("  %-24s %6d %10s %10s", name, t.count, ms(t.gpu_us), ms(t.cpu_us))
      end
      if r.unattributed_ops > 0 then
        add("  %d operations launched outside every phase", r.unattributed_ops)
      end
    end
    local un = r.unclassified
    if #un > 0 then
      local n = opts.unclassified or 8
      add("  unclassified (no rule names them; counted as compute): %d names%s", #un,
        #un > n and string.format(", the %d longest:", n) or ":")
      for i = 1, math.min(n, #un) do
        local nm = un[i].name
        if #nm > 90 then nm = nm:sub(1, 87) .. "..." end
        add("    %10s ms %5dx  %s", ms(un[i].gpu_us), un[i].count, nm)
      end
    end
  end
  return table.concat(L, "\n") .. "\n"
end

-- The names of one layer of an overlapped pair in a rank's phases: the
-- first run of DeepSeek's 10 names (from the first combine(B) on) that
-- holds each of them once, or the first 10 phases from the first
-- combine(B) (or the start) when none does.
local layer_names = { "combine(B)", "attn(F)", "mlp(B)", "dispatch(F)", "dispatch(B)", "mlp(W)",
  "mlp(F)", "attn(B)", "attn(W)", "combine(F)" }
M.deepseek_layer = layer_names
local function one_layer(r)
  local ph, want = r.phases, {}
  for _, n in ipairs(layer_names) do want[n] = true end
  local first
  for i = 1, #ph do
    if ph[i].name == "combine(B)" then
      first = first or i
      local seen, ok = {}, true
      for j = i, i + #layer_names - 1 do
        local n = ph[j] and ph[j].name
        if not n or not want[n] or seen[n] then ok = false break end
        seen[n] = true
      end
      if ok then
        local t = {}
        for j = i, i + #layer_names - 1 do t[#t + 1] = ph[j].name end
        return t
      end
    end
  end
  local t = {}
  for j = first or 1, math.min(#ph, (first or 1) + #layer_names - 1) do t[#t + 1] = ph[j].name end
  return t
end

-- M.beside(rank_a, rank_b) -> text: the phase tables of two ranks (of two
-- reports: luapipe's own trace and DeepSeek's, say) side by side: per
-- phase name (a's order, then b's others) count and ms in each (GPU ms of
-- a profiler trace, CPU ms of a trace luapipe wrote), and the order of one
-- layer of the overlapped pair in each, checked against DeepSeek's.
function M.beside(a, b)
  rank_arg("profile.beside", 1, a)
  rank_arg("profile.beside", 2, b)
  local L = {}
  local function add(...) L[#L + 1] = string.format(...) end
  local function label(r) return string.format("rank %d of %s", r.rank, r.file) end
  add("phases beside: A = %s, B = %s", label(a), label(b))
  add("  %-14s %8s %12s %8s %12s", "phase", "A count", "A ms", "B count", "B ms")
  local names, seen = {}, {}
  for _, r in ipairs({ a, b }) do
    for _, n in ipairs(r.phase_order or {}) do
      if not seen[n] then seen[n] = true names[#names + 1] = n end
    end
  end
  local function cell(r, n)
    local t = r.phase_totals and r.phase_totals[n]
    if not t then return "-", "-" end
    local us = t.gpu_us > 0 and t.gpu_us or t.cpu_us
    return tostring(t.count), ms(us)
  end
  for _, n in ipairs(names) do
    local ac, am = cell(a, n)
    local bc, bm = cell(b, n)
    add("  %-14s %8s %12s %8s %12s", n, ac, am, bc, bm)
  end
  local oa, ob = one_layer(a), one_layer(b)
  local function same(t)
    if #t ~= #layer_names then return false end
    for i, n in ipairs(layer_names) do if t[i] ~= n then return false end end
    return true
  end
  add("  one layer of the pair, A: %s%s", table.concat(oa, ", "),
    same(oa) and " (DeepSeek's order)" or "")
  add("  one layer of the pair, B: %s%s", table.concat(ob, ", "),
    same(ob) and " (DeepSeek's order)" or "")
  return table.concat(L, "\n") .. "\n"
end

-- M.json(report) -> JSON text with the stable keys (see the top).
function M.json(rep)
  report_arg("profile.json", 1, rep)
  local json = require("luapipe.json")
  local ranks = {}
  for i, r in ipairs(rep.ranks) do
    local o = {}
    for _, k in ipairs(orders.rank) do o[k] = r[k] end
    local phases = {}
    for j, ph in ipairs(r.phases) do
      phases[j] = ordered({ name = ph.name, cpu_us = ph.cpu_us, gpu_us = ph.gpu_us, ops = ph.ops },
        "phase")
    end
    o.phases = json.array(phases)
    o.streams = json.array(r.streams)
    local streams = {}
    for j, s in ipairs(r.streams) do
      streams[j] = ordered({ stream = s.stream, device = s.device, busy_us = s.busy_us,
        ops = s.ops }, "stream")
    end
    o.streams = json.array(streams)
    ranks[i] = ordered(o, "rank")
  end
  return json.encode({ ranks = json.array(ranks) }, { indent = true })
end

-- ---- from phases to the simulator's costs -------------------------------

-- M.mapping: phase name -> {kind = "F" | "I" | "W", exchange = "dispatch" |
-- "combine" | nil}, or false to leave a phase out. The default is
-- DeepSeek's names: "<part>(F)" forward, "<part>(B)" input-grad (I),
-- "<part>(W)" weight-grad, and parts dispatch / combine are the exchanges.
-- A table given to M.costs (or a rules file's `mapping`) is looked up
-- first; a function(name) -> entry may replace it.
function M.mapping(name)
  util.arg("profile.mapping", 1, "name", name, "string", "a phase name")
  local part, k = name:match("^([%w_%.%- ]+)%(([FBIW])%)$")
  if not part then return nil end
  local kind = (k == "B" or k == "I") and "I" or k
  local ex = part:lower()
  return { kind = kind, exchange = (ex == "dispatch" or ex == "combine") and ex or nil }
end

local function lookup(mapping, name)
  local m
  if type(mapping) == "function" then
    m = mapping(name)
  elseif type(mapping) == "table" and mapping[name] ~= nil then
    m = mapping[name]
  else
    return M.mapping(name)
  end
  if m == false or m == nil then return nil end
  if type(m) ~= "table" then
    return nil, string.format("mapping of phase '%s': must be a table {kind =, exchange =} or "
      .. "false, got %s", name, util.shown(m))
  end
  return m
end

-- M.costs(rank[, opts]) -> costs | nil, message. From the phases of one
-- rank of a report: per kind (F, I, W) the computation (compute + memory
-- classes) and the exchanges (communication) of the operations its phases
-- launched, in ms, per F&B pair (opts.pairs, default 1); F = its compute +
-- exchanges (run alone, nothing hides them), B = I + W; FB = the measured
-- overlapped pair: first start to last end of the operations of every
-- mapped phase. opts.exchanges = false leaves the exchanges out of F, I
-- and W (as if every one were hidden). costs.sim is the cost table for
-- s:simulate and costs.text the --cost text.
function M.costs(r, opts)
  rank_arg("profile.costs", 1, r)
  opts = util.arg("profile.costs", 2, "opts", opts, "?table",
    "a table {mapping =, pairs =, exchanges =}")
    or {}
  local pairs_ = opts.pairs == nil and 1 or util.int_arg("profile.costs", 2, "opts.pairs",
    opts.pairs, 1)
  local mt = type(opts.mapping)
  if opts.mapping ~= nil and mt ~= "table" and mt ~= "function" then
    util.raise("profile.costs: opts.mapping (argument 2) must be a table {phase name = {kind =, "
      .. "exchange =} or false} or a function(name), got " .. util.shown(opts.mapping))
  end
  local acc = {}
  for _, k in ipairs({ "F", "I", "W" }) do
    acc[k] = { compute = 0, exchange = 0, dispatch = 0, combine = 0, phases = 0 }
  end
  local first, last
  for _, ph in ipairs(r.phases) do
    local m, merr = lookup(opts.mapping, ph.name)
    if merr then return nil, merr end
    if m then
      local a = acc[m.kind == "B" and "I" or m.kind]
      if not a then
        return nil, string.format("mapping of phase '%s': kind must be F, I (or B) or W, got %s",
          ph.name, tostring(m.kind))
      end
      a.phases = a.phases + 1
      a.compute = a.compute + ph.class_us.compute + ph.class_us.memory
      a.exchange = a.exchange + ph.class_us.communication
      if m.exchange == "dispatch" or m.exchange == "combine" then
        a[m.exchange] = a[m.exchange] + ph.class_us.communication
      end
      if ph.ops > 0 then
        first = first and math.min(first, ph.gpu_first_us) or ph.gpu_first_us
        last = last and math.max(last, ph.gpu_last_us) or ph.gpu_last_us
      end
    end
  end
  if acc.F.phases == 0 or (acc.I.phases == 0 and acc.W.phases == 0) then
    return nil, string.format("rank %d: no phases map to a forward and a backward (the mapping "
      .. "knows names such as attn(F), mlp(B), dispatch(F), attn(W); phases here: %s)", r.rank,
      #r.phases > 0 and table.concat(r.phase_order, ", ") or "none")
  end
  local function v(x) return x / 1000 / pairs_ end
  local c = { rank = r.rank, pairs = pairs_, parts = {} }
  for k, a in next, acc do
    c.parts[k] = { compute = v(a.compute), exchange = v(a.exchange), dispatch = v(a.dispatch),
      combine = v(a.combine), phases = a.phases }
  end
  local x = opts.exchanges == false and 0 or 1 -- false: as if every exchange were hidden
  local F = v(acc.F.compute + x * acc.F.exchange)
  local I = v(acc.I.compute + x * acc.I.exchange)
  local W = v(acc.W.compute + x * acc.W.exchange)
  c.exchanges = x == 1
  local FB = v(last - first)
  c.F, c.I, c.W, c.B, c.FB = F, I, W, I + W, FB
  local function r3(n) return math.floor(n * 1000 + 0.5) / 1000 end
  c.sim = { F = r3(F), B = r3(I) + r3(W), W = r3(W), FB = r3(FB) }
  c.text = string.format("F=%.3f,B=%.3f,W=%.3f,FB=%.3f", c.sim.F, c.sim.B, c.sim.W, c.sim.FB)
  made_costs[c] = true
  return c
end

-- M.costs_text(costs) -> the --costs table.
function M.costs_text(c)
  if not made_costs[c] then
    util.raise("profile.costs_text: costs (argument 1) must be costs from profile.costs, got "
      .. util.shown(c))
  end
  local L = {}
  local function add(...) L[#L + 1] = string.format(...) end
  add("costs from rank %d's phases (ms per F&B pair%s; one simulator unit = 1 ms):", c.rank,
    c.pairs > 1 and string.format(", the trace's totals / %d", c.pairs) or "")
  add("  %-4s %10s %10s %10s %10s %10s %7s", "kind", "cost", "compute", "exchanges", "dispatch",
    "combine", "phases")
  for _, k in ipairs({ "F", "I", "W" }) do
    local p = c.parts[k]
    add("  %-4s %10.3f %10.3f %10.3f %10.3f %10.3f %7d", k, c[k], p.compute, p.exchange,
      p.dispatch, p.combine, p.phases)
  end
  add("  %-4s %10.3f  = I + W", "B", c.B)
  add("  %-4s %10.3f  measured overlapped pair (first start to last end of its GPU work); "
    .. "F + B = %.3f, the pair takes %.1f%% of that", "FB", c.FB, c.F + c.B,
    c.F + c.B > 0 and 100 * c.FB / (c.F + c.B) or 0)
  add(c.exchanges and "  (cost = compute + exchanges, as if nothing hid them; "
    .. "compute and exchanges are summed operation durations)"
    or "  (cost = compute only, as if every exchange were hidden (--no-exchanges); "
    .. "summed operation durations)")
  add("--cost %s", c.text)
  return table.concat(L, "\n") .. "\n"
end

-- ---- SVG timeline -----------------------------------------------------------

local palette = { "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
  "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#2ca02c", "#d62728", "#9467bd" }

local function esc(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
    ['"'] = "&quot;" }))
end

-- M.svg(report, rank) -> SVG text: one lane per stream of the rank's GPU
-- operations, filled with the colour of the phase that launched them
-- (grey: none), communication outlined in black; a lane above with the
-- phases' CPU intervals. Operations narrower than a pixel are merged with
-- their neighbours of the same phase and class.
function M.svg(rep, r)
  report_arg("profile.svg", 1, rep)
  util.arg("profile.svg", 1, "report.profile", rep.profile, "luapipe.Profile",
    "the luapipe.Profile of a report from profile.read")
  rank_arg("profile.svg", 2, r)
  local ri
  for i, x in ipairs(rep.ranks) do if x == r then ri = i end end
  if not ri then return nil, "svg: not a rank of this report" end
  local W, left, lane, top = 1600, 110, 28, 40
  -- time axis: from the earliest of the first GPU operation and the first
  -- phase's CPU start (0 = the first GPU operation) to the latest end
  local t0, t1 = 0, r.span_us
  for _, ph in ipairs(r.phases) do
    t0 = math.min(t0, ph.cpu_start_us)
    t1 = math.max(t1, ph.cpu_start_us + ph.cpu_us)
  end
  local span = r.span_us
  local scale = (W - left - 20) / math.max(t1 - t0, 1e-9)
  left = left - t0 * scale
  local colour, legend = {}, {}
  for _, name in ipairs(r.phase_order) do
    colour[name] = palette[(#legend % #palette) + 1]
    legend[#legend + 1] = name
  end
  local nl = #r.streams + (#r.phases > 0 and 1 or 0)
  local axis_h = 30 -- the time axis under the lanes
  local H = top + nl * lane + axis_h + 30 + 18 * math.ceil(#legend / 6) + 20
  local out = {}
  local function put(...) for _, x in ipairs({ ... }) do out[#out + 1] = x end end
  local function f2(x) return string.format("%.2f", x) end
  put('<svg xmlns="http://www.w3.org/2000/svg" width="', f2(W), '" height="', f2(H),
    '" font-family="sans-serif" font-size="11">\n')
  put('<rect width="100%" height="100%" fill="white"/>\n')
  put('<text x="10" y="18" font-size="13">rank ', tostring(r.rank), ': GPU operations per stream, ',
    'coloured by the phase that launched them (span ', string.format("%.3f", span / 1000),
    ' ms; black outline: communication)</text>\n')
  local y0 = top
  if #r.phases > 0 then
    put('<text x="10" y="', f2(y0 + lane * 0.65), '">CPU (phases)</text>\n')
    for _, ph in ipairs(r.phases) do
      local x = left + ph.cpu_start_us * scale
      local w = math.max(ph.cpu_us * scale, 0.5)
      put('<rect x="', f2(x), '" y="', f2(y0 + 4), '" width="', f2(w), '" height="', f2(lane - 8),
        '" fill="', colour[ph.name], '" opacity="0.6"><title>', esc(ph.name), ' CPU ',
        string.format("%.3f", ph.cpu_us / 1000), ' ms</title></rect>\n')
    end
    y0 = y0 + lane
  end
  for si, s in ipairs(r.streams) do
    local y = y0 + (si - 1) * lane
    put('<text x="10" y="', f2(y + lane * 0.65), '">stream ', tostring(s.stream), '</text>\n')
  end
  -- runs per stream of the same phase and class closer than a pixel (merged in C)
  for _, u in ipairs(rep.profile:runs(ri, 1 / scale)) do
    local y = y0 + (u.stream - 1) * lane
    local name = u.phase and r.phases[u.phase].name
    local fill = name and colour[name] or "#c8c8c8"
    local x, w = left + u.start * scale, math.max((u.finish - u.start) * scale, 0.5)
    put('<rect x="', f2(x), '" y="', f2(y + 4), '" width="', f2(w), '" height="', f2(lane - 8),
      '" fill="', fill, '"', u.class == "communication" and ' stroke="black" stroke-width="0.8"'
      or "", '><title>', esc(name or "no phase"), ' ', u.class, ' ', tostring(u.ops), ' ops ',
      string.format("%.3f", (u.finish - u.start) / 1000), ' ms</title></rect>\n')
  end
  -- time axis in ms (0 = the first GPU operation): ticks 1, 2 or 5 x 10^k
  -- ms apart, at least 60 px
  local yb, px_ms = y0 + #r.streams * lane, scale * 1000
  local step = 10 ^ math.floor(math.log(60 / px_ms, 10))
  for _, m in ipairs { 1, 2, 5, 10 } do
    if m * step * px_ms >= 60 then step = m * step; break end
  end
  put('<g font-size="10" fill="#555">\n')
  for k = math.ceil(t0 / 1000 / step - 1e-9), math.floor(t1 / 1000 / step + 1e-9) do
    local x = left + k * step * 1000 * scale
    put('<line x1="', f2(x), '" y1="', f2(top), '" x2="', f2(x), '" y2="', f2(yb + 4),
      '" stroke="#ddd" stroke-width="1"/><text x="', f2(x), '" y="', f2(yb + 14),
      '" text-anchor="middle">', (string.format("%.6f", k * step):gsub("0+$", ""):gsub("%.$", "")),
      '</text>\n')
  end
  put('<text x="', f2(W - 20), '" y="', f2(yb + 26), '" text-anchor="end">time (ms)</text>\n</g>\n')
  local ly = yb + axis_h + 24
  for i, name in ipairs(legend) do
    local x = 110 + ((i - 1) % 6) * 230
    local y = ly + math.floor((i - 1) / 6) * 18
    put('<rect x="', f2(x), '" y="', f2(y - 10), '" width="12" height="12" fill="', colour[name],
      '"/><text x="', f2(x + 16), '" y="', f2(y), '">', esc(name), '</text>\n')
  end
  put('</svg>\n')
  return table.concat(out)
end

return M
