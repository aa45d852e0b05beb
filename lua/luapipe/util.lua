-- luapipe.util: small helpers shared by the Lua layer: argument checks,
-- counted nouns, "did you mean", the REPL's pretty printer, files.
local core = require("luapipe.core")

local M = {}

-- ---- argument checks ----
-- Every public function of lua/luapipe/*.lua checks its arguments with
-- these, so that misuse reads, at the user's line,
--   schedule.load: spec (argument 1) must be a family name or a .csv, .json
--   or .lua file name, got 5
-- and never as a Lua internal from inside the library ("attempt to index
-- a number value (local 'spec')").

-- The folder of the library's own Lua files ("/.../lua/luapipe/"): frames
-- from there are the library, the first frame outside is the user's code.
local here = debug.getinfo(1, "S").source:match("^@(.*[/\\])util%.lua$")

local function internal(level)
  local info = debug.getinfo(level + 1, "S")
  if not info then return false end
  if info.what == "C" then return debug.getinfo(level + 2, "S") ~= nil end -- pcall inside the library
  local src = info.source
  return here ~= nil and src:sub(1, 1) == "@" and src:sub(2, #here + 1) == here
end

-- ---- errors as values ----
-- A luapipe.Error is a table of fields:
--   what      the text in the user's terms ("schedule.load: spec (argument
--             1) must be ...", "search: the memory limit of rank 0 ...")
--   file, line  the user's line it was raised at (nil: no place)
--   rank, action, option  where, when the raiser knows (optional)
--   status    the exit status the program should end with (default 1)
--   everywhere  true: every rank of the job raised it alike (the program
--             prints it once, on rank `speaker`, default 0)
--   stranded  true: other ranks may be left waiting on this one (the
--             program must take the whole job down)
-- tostring(e) is "file:line: what" (or "what"): the text Lua's error(msg,
-- level) would have made. Code that catches one reads e.what and the other
-- fields; nothing parses the text back. The program's edge (the luapipe
-- host, luapipe.cli.job) prints it and decides what the job does.
local Error = { __name = "luapipe.Error" }
function Error.__tostring(e)
  if e.file then return string.format("%s:%s: %s", e.file, tostring(e.line), tostring(e.what)) end
  return tostring(e.what)
end
function Error.__concat(a, b) return tostring(a) .. tostring(b) end
-- err:match(...), err:find(...) read the text, as they did when errors
-- were strings
function Error.__index(_, k)
  local f = string[k]
  if f then return function(self, ...) return f(tostring(self), ...) end end
end

-- Raises the text msg (a misuse of these helpers) at the first Lua caller
-- outside the library.
local function misuse(msg)
  local level = 2
  while internal(level) do level = level + 1 end
  error(msg, level)
end

-- util.error(fields) -> a luapipe.Error (fields.what: the text, a string;
-- the other fields as above). A string is {what = string}.
function M.error(fields)
  if type(fields) == "string" then fields = { what = fields } end
  if type(fields) ~= "table" or getmetatable(fields) ~= nil or type(fields.what) ~= "string" then
    misuse("util.error: fields (argument 1) must be a message or a table with what = message, got "
      .. M.shown(fields))
  end
  return setmetatable(fields, Error)
end

-- util.is_error(v) -> true when v is a luapipe.Error
function M.is_error(v) return getmetatable(v) == Error end

-- util.message(err) -> the text of a caught error without its position:
-- a luapipe.Error's what; any other value as tostring gives it (errors of
-- the C binding carry no position; a user's own error keeps its own).
function M.message(err)
  if getmetatable(err) == Error then return tostring(err.what) end
  local ok, s = pcall(tostring, err)
  return ok and s or "(error object is not printable)"
end

-- Places a luapipe.Error at `level` (as error(msg, level) would: 1 is the
-- function that calls this one's caller) and raises it.
local function raise_at(e, level)
  local info = debug.getinfo(level + 1, "Sl")
  if info and info.currentline and info.currentline > 0 then
    e.file, e.line = info.short_src, info.currentline
  end
  error(e, 0)
end

-- util.fail(msg_or_fields[, level]): raises a luapipe.Error placed at level
-- as error(msg, level) places it (1, the default: the line that calls
-- fail; 2: that function's caller; 0: no place).
function M.fail(fields, level)
  local e = M.error(fields)
  level = level or 1
  if level <= 0 then error(e, 0) end
  raise_at(e, level + 1)
end

-- util.raise(msg_or_fields): raises a luapipe.Error at the first Lua caller
-- outside the library (its position is the user's line), past the
-- library's own frames and any C function (pcall) between them.
function M.raise(msg)
  local e = M.error(msg)
  local level = 2 -- the caller of raise
  while internal(level) do level = level + 1 end
  raise_at(e, level)
end

-- util.shown(v) -> v as an error message shows it: 5, "x", nil, true,
-- a table, a function, a luapipe.Schedule.
function M.shown(v)
  local t = type(v)
  if t == "string" then return string.format("%q", v) end
  if t == "number" or t == "boolean" or t == "nil" then return tostring(v) end
  local mt = getmetatable(v)
  local name = type(mt) == "table" and rawget(mt, "__name")
  if type(name) == "string" then return "a " .. name end
  return "a " .. t
end

local function is_type(v, want)
  if want == "integer" then return math.type(v) == "integer" end
  if want == "number" then return type(v) == "number" and v == v end
  if want == "schedule" then want = "luapipe.Schedule" end
  if want:find("^luapipe%.") then -- a class of the C binding, by its metatable's __name
    local mt = getmetatable(v)
    return type(v) == "userdata" and type(mt) == "table" and rawget(mt, "__name") == want
  end
  return type(v) == want
end

local nouns = { string = "a string", table = "a table", ["function"] = "a function",
  number = "a number", integer = "an integer", boolean = "true or false",
  schedule = "a luapipe.Schedule" }

-- util.arg(fn, pos, name, v, want[, what]) -> v. want: "string", "table",
-- "function", "number", "integer", "boolean", "userdata", "schedule" (a
-- luapipe.Schedule) or a class name ("luapipe.Exec"); a leading "?"
-- allows nil. what says in words what is
-- expected (default: the type's noun). Raises at the user's line:
-- "<fn>: <name> (argument <pos>) must be <what>, got <v>".
function M.arg(fn, pos, name, v, want, what)
  if type(want) ~= "string" then error("util.arg: want (argument 5) must be a type name, got " .. M.shown(want), 2) end
  local optional = want:sub(1, 1) == "?"
  if optional then
    want = want:sub(2)
    if v == nil then return v end
  end
  if not is_type(v, want) then
    what = what or nouns[want] or (want:find("^luapipe%.") and "a " .. want) or want
    if optional then what = what .. " (or nil)" end
    M.raise(string.format("%s: %s (argument %s) must be %s, got %s", fn, name, pos, what, M.shown(v)))
  end
  return v
end

-- util.int_arg(fn, pos, name, v, min[, max]) -> v, an integer in min..max
-- (a float with an integral value is taken as that integer).
function M.int_arg(fn, pos, name, v, min, max)
  local n = type(v) == "number" and math.tointeger(v) or nil
  if not n or (min and n < min) or (max and n > max) then
    local what
    if min and max then what = string.format("an integer from %d to %d", min, max)
    elseif min == 0 then what = "an integer >= 0"
    elseif min == 1 then what = "a positive integer"
    elseif min then what = string.format("an integer >= %d", min)
    else what = "an integer" end
    M.raise(string.format("%s: %s (argument %s) must be %s, got %s", fn, name, pos, what, M.shown(v)))
  end
  return n
end

-- ---- words ----

-- util.count(n, noun[, plural]) -> "1 rank", "2 ranks", "0 ranks"
-- ("1 micro-batch", "3 micro-batches": plural defaults to noun .. "s",
-- or noun .. "es" after s, x, ch, sh).
function M.count(n, noun, plural)
  M.arg("util.count", 1, "n", n, "number")
  M.arg("util.count", 2, "noun", noun, "string")
  M.arg("util.count", 3, "plural", plural, "?string")
  if n == 1 then return "1 " .. noun end
  if not plural then
    plural = (noun:match("[sx]$") or noun:match("[cs]h$")) and noun .. "es" or noun .. "s"
  end
  return tostring(n) .. " " .. plural
end

-- Edit distance (Levenshtein) between two short strings.
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

-- util.did_you_mean(word, names) -> the name closest to word (case
-- ignored) when it is a plausible typo (at most 2 edits, and at most half
-- the word), else nil.
function M.did_you_mean(word, names)
  if type(word) ~= "string" or word == "" or type(names) ~= "table" then return nil end
  local best, bd = nil, math.huge
  local lw = word:lower()
  for _, n in ipairs(names) do
    local d = distance(lw, tostring(n):lower())
    if d < bd then best, bd = n, d end
  end
  if best and bd <= 2 and bd <= #word / 2 then return best end
  return nil
end

-- util.guard(t, name[, names]): indexing t with a missing key that is a
-- plausible typo of one of its own (or names()) raises at the user's line
-- "luapipe.schedule has no 'buld' (did you mean 'build'?)"; any other
-- missing key is nil as usual. Keys starting with "_" are never guarded.
-- Keeps an existing metatable's other fields (__call).
local more_names = setmetatable({}, { __mode = "k" }) -- guarded table -> its names function

-- util.known_names(t) -> the sorted names a guarded table answers to (its
-- own string keys not starting with "_", and those of its names
-- function: luapipe's modules before they load): what "did you mean"
-- chooses from, and what the REPL's Tab completes.
function M.known_names(t)
  M.arg("util.known_names", 1, "t", t, "table")
  local known, seen = {}, {}
  local function add(key)
    if type(key) == "string" and key:sub(1, 1) ~= "_" and not seen[key] then
      seen[key] = true
      known[#known + 1] = key
    end
  end
  for key in next, t do add(key) end
  if more_names[t] then for _, n in ipairs(more_names[t]()) do add(n) end end
  table.sort(known)
  return known
end

function M.guard(t, name, names)
  M.arg("util.guard", 1, "t", t, "table")
  M.arg("util.guard", 2, "name", name, "string", "the table's name for messages")
  M.arg("util.guard", 3, "names", names, "?function", "a function returning more names")
  more_names[t] = names or more_names[t]
  local mt = getmetatable(t) or {}
  local inner = mt.__index
  mt.__index = function(tbl, k)
    if inner then
      local v
      if type(inner) == "function" then v = inner(tbl, k) else v = inner[k] end
      if v ~= nil then return v end
    end
    if type(k) ~= "string" or k:sub(1, 1) == "_" then return nil end
    local near = M.did_you_mean(k, M.known_names(tbl))
    if near and near ~= k then
      M.raise(string.format("%s has no '%s' (did you mean '%s'?)", name, k, near))
    end
    return nil
  end
  return setmetatable(t, mt)
end

-- ---- pretty printing ----

local function quote_string(v)
  return '"' .. v:gsub('[%c"\\]', function(c)
    local named = { ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r", ['"'] = '\\"', ["\\"] = "\\\\" }
    return named[c] or string.format("\\%d", c:byte())
  end) .. '"'
end

local function key_order(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then
    if ta == "number" then return true end
    if tb == "number" then return false end
    if ta == "string" then return true end
    if tb == "string" then return false end
    return ta < tb
  end
  if ta == "number" or ta == "string" then return a < b end
  return tostring(a) < tostring(b)
end

-- util.pretty(v[, opts]) -> text: v as a Lua constructor, the way the
-- REPL shows a table: {1, 2, name = "x", sub = {a = 1}}; one line when it
-- fits opts.width (80), else one entry per line, indented. Nested tables
-- deeper than opts.depth (3) show as {...} with their entry count, at most
-- opts.items (50) entries per table are shown, a table inside itself shows
-- as <cycle>. Values with a __tostring (schedules, results, tensors) show
-- as tostring gives them; other non-table values as Lua literals.
function M.pretty(v, opts)
  opts = M.arg("util.pretty", 2, "opts", opts, "?table", "a table {depth =, width =, items =}") or {}
  local max_depth, width, max_items = opts.depth or 3, opts.width or 80, opts.items or 50
  local on_path = {}
  local function scalar(x)
    local t = type(x)
    if t == "string" then return quote_string(x) end
    if t == "number" then
      if math.type(x) == "float" and x == math.floor(x) and x > -1e15 and x < 1e15 then
        return string.format("%.1f", x)
      end
      return tostring(x)
    end
    local mt = getmetatable(x)
    if type(mt) == "table" and rawget(mt, "__tostring") then
      local ok, text = pcall(tostring, x)
      if ok and type(text) == "string" then return text end
    end
    return tostring(x)
  end
  local function render(x, depth, indent)
    local mt = getmetatable(x)
    if type(x) ~= "table" or (type(mt) == "table" and rawget(mt, "__tostring")) then return scalar(x) end
    if on_path[x] then return "<cycle>" end
    local keys, n = {}, 0
    while rawget(x, n + 1) ~= nil do n = n + 1 end
    local total = n
    for k in next, x do
      if not (math.type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k; total = total + 1 end
    end
    if total == 0 then return "{}" end
    if depth >= max_depth then return string.format("{...} (%s)", M.count(total, "entry", "entries")) end
    table.sort(keys, key_order)
    on_path[x] = true
    local parts = {}
    local shown = 0
    for i = 1, n do
      if shown >= max_items then break end
      parts[#parts + 1] = render(rawget(x, i), depth + 1, indent .. "  ")
      shown = shown + 1
    end
    for _, k in ipairs(keys) do
      if shown >= max_items then break end
      local ks = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or ("[" .. scalar(k) .. "]")
      parts[#parts + 1] = ks .. " = " .. render(rawget(x, k), depth + 1, indent .. "  ")
      shown = shown + 1
    end
    if shown < total then parts[#parts + 1] = string.format("... (%d more)", total - shown) end
    on_path[x] = nil
    local one = "{" .. table.concat(parts, ", ") .. "}"
    if #one + #indent <= width and not one:find("\n") then return one end
    return "{\n" .. indent .. "  " .. table.concat(parts, ",\n" .. indent .. "  ") .. "\n" .. indent .. "}"
  end
  return render(v, 0, "")
end

-- ---- files ----

-- util.read_file(path) -> text | nil, "path: reason"
function M.read_file(path)
  M.arg("read_file", 1, "path", path, "string")
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local text = f:read("a")
  f:close()
  return text
end

-- util.write_file(path, text) -> true | nil, message. Atomic (a temporary
-- file renamed over path): a failure never leaves a half-written file.
function M.write_file(path, text)
  M.arg("write_file", 1, "path", path, "string")
  M.arg("write_file", 2, "text", text, "string")
  return core.write_file(path, text)
end

return M
