-- test_help.lua — the Lua API help topics (luapipe.help / `luapipe help
-- <topic>`): every call a topic's signatures write exists in the library,
-- every module of the library has a topic, unknown topics answer in one
-- line and never raise, and help prints nothing for the REPL to echo.
local lu = require("luaunit")
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local core = require("luapipe.core")
local help = require("luapipe.cli.help")
local cli = require("luapipe.cli")
local nn = require("luapipe.nn")
local eplb = require("luapipe.eplb")

-- What a signature's receiver names stand for.
local model = nn.sequential { nn.linear(2, 2), loss = "mse" }
local balancer = eplb.balancer { replicas = 4, gpus = 2, on_warning = function() end }
local data = require("luapipe.data")
local dpath = os.tmpname()
data.write_tokens(dpath, { 0, 1, 2, 3, 4, 5, 6, 7 })
local dataset = data.tokens(dpath, { seq_len = 2 })
os.remove(dpath) -- (mapped: it stays readable)
local receivers = {
  s = core.Schedule, res = core.SimResult, t = core.Tensor, layer = core.Layer, exec = core.Exec,
  model = model, b = balancer, ds = dataset,
}

local function lookup(path, name)
  local v
  if receivers[path] then
    v = receivers[path]
  else
    local mod, rest = path:match("^([%w_]+)%.?(.*)$")
    local ok, m = pcall(require, "luapipe." .. mod)
    if not ok then return nil end
    v = m
    for k in rest:gmatch("[^.]+") do v = type(v) == "table" and v[k] or nil end
  end
  if name == nil then return v end
  return (type(v) == "table" or type(v) == "userdata") and v[name] or nil
end

-- The calls written in a signature: {"schedule.build", ...}, with "/ name("
-- continuing the previous receiver.
local function calls(sig)
  local out, prefix = {}, nil
  local pos = 1
  while true do
    local s, e, path, sep, name = sig:find("([%a_][%w_%.]*)([.:])([%w_]+)%s*[%({]", pos)
    local cs, ce, cname = sig:find("/%s+([%a_][%w_]*)%s*%(", pos)
    if cs and (not s or cs < s) and prefix and cname ~= "print" then
      out[#out + 1] = { prefix[1], prefix[2], cname }
      pos = ce + 1
    elseif s then
      out[#out + 1] = { path, sep, name }
      prefix = { path, sep }
      pos = e + 1
    else
      break
    end
  end
  local bare = sig:match("^([%a_][%w_]*)%s*{")
  if bare then out[#out + 1] = { bare } end
  return out
end

TestHelp = {}

function TestHelp.test_every_written_call_exists()
  local checked = 0
  for _, t in ipairs(help.topics) do
    for _, e in ipairs(t) do
      for _, c in ipairs(calls(e[1])) do
        local v = lookup(c[1], c[3])
        local what = c[3] and (c[1] .. c[2] .. c[3]) or c[1]
        local callable = type(v) == "function" or (getmetatable(v) or {}).__call ~= nil
        lu.assertTrue(callable, string.format("help topic '%s' names %s, which does not exist",
          t.name, what))
        checked = checked + 1
      end
    end
  end
  lu.assertTrue(checked >= 60, "only " .. checked .. " calls found in the help signatures")
end

function TestHelp.test_every_module_has_a_topic()
  for _, mod in ipairs { "schedule", "schedules", "sim", "show", "eplb", "nn", "train", "comm",
    "checkpoint", "perf" } do
    lu.assertNotNil(help.by_name[mod], "no help topic for luapipe." .. mod)
    lu.assertStrContains(help.text(mod), "luapipe." .. mod .. ":")
  end
end

function TestHelp.test_topic_text()
  local text = cli.help_text("train", true)
  lu.assertStrContains(text, "train{model=, schedule=, microbatches=, data=, steps=")
  lu.assertStrContains(text, "mpirun")
  lu.assertStrContains(cli.help_text("sim", true), "sim.parse_cost(")
  -- the command wins from the command line, the API topic in the REPL
  lu.assertStrContains(cli.help_text("schedule"), "Usage: luapipe schedule")
  lu.assertStrContains(cli.help_text("schedule"), "luapipe help luapipe.schedule")
  lu.assertStrContains(cli.help_text("schedule", true), "schedule.build(")
  lu.assertStrContains(cli.help_text("luapipe.schedule"), "schedule.build(")
  lu.assertStrContains(cli.help_text(), "checkpoint ")
end

-- What a user looks for is in the topics: MoE layers, optimizers, device
-- and partition, the cost keys of links and exchanges, the summary's columns.
function TestHelp.test_topics_cover_the_options()
  local nn_text, train_text, sim_text = help.text("nn"), help.text("train"), help.text("sim")
  for _, want in ipairs { "nn.moe{dim=, hidden=, experts=, topk=", "nn.moe_block{dim=, heads=" } do
    lu.assertStrContains(nn_text, want)
  end
  for _, want in ipairs { 'optimizer = {kind = "sgd", lr=, momentum=, weight_decay=}',
    'optimizer = {kind = "adamw", lr=, beta1=, beta2=, eps=, weight_decay=}',
    'partition = "cost" | "layers"', "measured layer", "whose simulated", "or equal layer counts", 'device = "cpu" | "cuda" | "cuda:N"', "chunks for interleaved1f1b only" } do
    lu.assertStrContains(train_text, want)
  end
  -- luapipe.train's manual (once its file's header): result, checkpoints,
  -- partition, MoE, overlapped_fb, devices, failures
  for _, want in ipairs { "r.stage_params() = {{id =, stage =, params =", "resume = true (or resume = \"dir\")",
    "Partition: by \"cost\" (the default)", "rank = pipeline rank * E + EP index",
    "exec:weight_grad_part() runs one weight-grad piece", "rank r of a node (mpirun's local rank)",
    "pcall(train, ...) returns on every rank" } do
    lu.assertStrContains(train_text, want)
  end
  for _, want in ipairs { 'link = "lat=50us,bw=2GB/s"', "bytes = N", "exchanges = {[stage] = {F = {n =, "
    .. "bytes_out =, bytes_in =}", "link_unit", "pending W (peak weight-grads waiting" } do
    lu.assertStrContains(sim_text, want)
  end
  lu.assertStrContains(help.text("schedule"), "gets opts {pp=, microbatches=, chunks=} as `...`")
  lu.assertStrContains(help.text("schedule"), "action i counts from 0")
end

function TestHelp.test_unknown_topics()
  local text, err = cli.help_text("schedulez", true)
  lu.assertNil(text)
  lu.assertStrContains(err, "unknown help topic 'schedulez' (did you mean 'schedule")
  lu.assertStrContains(err, "topics: schedule, simulate")
  lu.assertNil(err:find("\n"))
  text, err = cli.help_text(42, true)
  lu.assertNil(text)
  lu.assertStrContains(err, "unknown help topic '42'")
end

-- luapipe.help writes the text (through io.write) and returns nothing,
-- whatever the topic.
function TestHelp.test_luapipe_help_prints()
  local written, real = {}, io.write
  io.write = function(...)
    for _, v in ipairs { ... } do written[#written + 1] = tostring(v) end
  end
  local ok, counts = pcall(function()
    return { select("#", luapipe.help("schedules")), select("#", luapipe.help("no such thing")),
      select("#", luapipe.help()) }
  end)
  io.write = real
  lu.assertTrue(ok, tostring(counts))
  lu.assertEquals(counts, { 0, 0, 0 })
  local printed = table.concat(written)
  lu.assertStrContains(printed, "schedules.list()")
  lu.assertStrContains(printed, "unknown help topic 'no such thing'")
  lu.assertStrContains(printed, "the Lua API, one topic per module")
end

-- The REPL's help is the Lua API's: a command name says it is a command and
-- how to get its options; one function can be asked for; a typo gets a
-- "did you mean".
function TestHelp.test_repl_help_is_the_api()
  local text = luapipe.help_text()
  lu.assertStrContains(text, "  schedule   build, load, check and export schedules")
  lu.assertStrContains(text, "`luapipe help <command>` in a shell")
  lu.assertNil(text:find("usage: luapipe", 1, true))
  text = luapipe.help_text("simulate")
  lu.assertStrContains(text, "'simulate' is a command of the luapipe program, not a Lua API topic: "
    .. "its options are `luapipe help simulate` in a shell")
  lu.assertStrContains(text, "luapipe.help(\"sim\")")
  lu.assertNil(text:find("--cost", 1, true))
  lu.assertStrContains(luapipe.help_text("cli simulate"), "--cost")
  lu.assertStrContains(luapipe.help_text("cli"), "Commands:")
  lu.assertStrContains(luapipe.help_text("schedule"), "schedule.build(")
  lu.assertStrContains(luapipe.help_text("luapipe.eplb"), "eplb.rebalance{")
  lu.assertStrContains(luapipe.help_text("env"), "LUAPIPE_TIMEOUT")
  lu.assertStrContains(luapipe.help_text("schedule.load"), "schedule.load(spec, opts)")
  lu.assertStrContains(luapipe.help_text("validate"), "s:validate(")
  local _, err = luapipe.help_text("schedul")
  lu.assertStrContains(err, "unknown help topic 'schedul' (did you mean 'schedule'?)")
  _, err = luapipe.help_text("schedule.laod")
  lu.assertStrContains(err, "(did you mean 'schedule.load'?)")
  _, err = luapipe.help_text(7)
  lu.assertStrContains(err, "the topic must be a string")
end

-- A mistyped name of the library gets a "did you mean" where it is used;
-- other missing names stay nil.
function TestHelp.test_did_you_mean_on_names()
  local err_of = dofile(here .. "errors.lua").error_of
  lu.assertEquals(err_of(function() return luapipe.schedul end), "luapipe has no 'schedul' (did you mean 'schedule'?)")
  lu.assertEquals(err_of(function() return luapipe.schedule.buld end),
    "luapipe.schedule has no 'buld' (did you mean 'build'?)")
  lu.assertEquals(err_of(function() return require("luapipe.sim").parse_cots end),
    "luapipe.sim has no 'parse_cots' (did you mean 'parse_cost'?)")
  lu.assertEquals(err_of(function() return luapipe.schedules.dualpip end),
    "luapipe.schedules has no 'dualpip' (did you mean 'dualpipe'?)")
  lu.assertEquals(err_of(function() return luapipe.nn.lienar end), "luapipe.nn has no 'lienar' (did you mean 'linear'?)")
  lu.assertEquals(err_of(function() return luapipe.train.refrence end),
    "luapipe.train has no 'refrence' (did you mean 'reference'?)")
  local s = luapipe.schedule.build("1f1b", { pp = 2, microbatches = 2 })
  lu.assertEquals(err_of(function() return s:valdate() end),
    "luapipe.Schedule has no 'valdate' (did you mean 'validate'?)")
  local res = s:simulate()
  lu.assertEquals(err_of(function() return res:makspan() end),
    "luapipe.SimResult has no 'makspan' (did you mean 'makespan'?)")
  lu.assertNil(luapipe.frobnicate)
  lu.assertNil(luapipe.schedule.something_else)
  lu.assertEquals(type(luapipe.schedules.dualpipe), "function")
end

function TestHelp.test_suggest()
  lu.assertEquals(cli.suggest("simulte", { "schedule", "simulate" }), "simulate")
  lu.assertEquals(cli.suggest("DualPip", { "dualpipe", "dualpipev" }), "dualpipe")
  lu.assertNil(cli.suggest("frobnicate", { "schedule", "simulate", "bubbles" }))
  lu.assertNil(cli.suggest("x", { "zbv" }))
end

-- The one wrapping routine: lines within the width, broken between words
-- (every word kept whole, in order), continuation under the description
-- column; short lines untouched.
function TestHelp.test_wrap()
  local help = require("luapipe.cli.help")
  local line = "   --loads FILE          Load file: JSON array of layers or text, one layer per line, "
    .. "numbers separated by spaces or commas"
  local out = help.wrap(line .. "\nshort\n", 50)
  local lines = {}
  for l in out:gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  lu.assertEquals(lines[1], "   --loads FILE          Load file: JSON array of")
  lu.assertEquals(lines[#lines], "short")
  local words = {}
  for i = 1, #lines - 1 do
    lu.assertTrue(#lines[i] <= 50, lines[i])
    if i > 1 then lu.assertEquals(lines[i]:match("^ *"), string.rep(" ", 25)) end
    for w in lines[i]:gmatch("%S+") do words[#words + 1] = w end
  end
  local want = {}
  for w in line:gmatch("%S+") do want[#want + 1] = w end
  lu.assertEquals(words, want)
  -- a word longer than the room stays whole
  lu.assertEquals(help.wrap("  x " .. string.rep("y", 60), 40), "  x\n  " .. string.rep("y", 60))
  -- a plain paragraph
  lu.assertEquals(help.wrap("aa bb cc dd", 5), "aa bb\ncc dd")
  -- a comment goes on as a comment
  lu.assertEquals(help.wrap("  # one two three four five six", 20), "  # one two three\n  # four five six")
  -- a command goes on with a backslash
  lu.assertEquals(help.wrap("  luapipe eplb --loads x.json --gpus 8", 24),
    "  luapipe eplb --loads \\\n      x.json --gpus 8")
end

-- Every help text goes through it: no line beyond COLUMNS, the env table's
-- descriptions in one column.
function TestHelp.test_help_wraps_to_columns()
  local real = os.getenv
  os.getenv = function(k) if k == "COLUMNS" then return "60" end return real(k) end
  local ok, err = pcall(function()
    for _, topic in ipairs { "env", "eplb", "bubbles", "simulate", "luapipe.eplb", "sim" } do
      local text = assert(cli.help_text(topic))
      for l in text:gmatch("[^\n]+") do
        lu.assertTrue(#l <= 60 or not l:find("%s"), topic .. ": " .. l)
      end
    end
    local env = cli.help_text("env")
    local cols = {}
    for name, gap in env:gmatch("\n  (LUAPIPE_[%u_]+)( +)") do cols[#cols + 1] = #name + #gap end
    lu.assertTrue(#cols >= 5)
    for _, c in ipairs(cols) do lu.assertEquals(c, cols[1]) end
  end)
  os.getenv = real
  lu.assertTrue(ok, tostring(err))
end

os.exit(lu.LuaUnit.run())
