-- luapipe.util: small helpers shared by the Lua layer: files, argument
-- checks, counted nouns, "did you mean".
local core = require("luapipe.core")

local M = {}

-- ---- argument checks ----
-- Every public function of lua/luapipe/*.lua checks its arguments with
-- these, so that misuse reads, at the user's line,
--   schedule.load: spec (argument 1) must be a string (a family name or a
--   .csv, .json or .lua file), got 5
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

-- util.raise(msg): raises msg at the first Lua caller outside the library
-- (its position is the user's line), past the library's own frames and
-- any C function (pcall) between them.
function M.raise(msg)
  local level = 2 -- the caller of raise
  while internal(level) do level = level + 1 end
  error(msg, level)
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
-- ignored) when it is close enough (at most 2 edits, and fewer than half
-- the word), else nil.
function M.did_you_mean(word, names)
  if type(word) ~= "string" or word == "" or type(names) ~= "table" then return nil end
  local best, bd = nil, math.huge
  local lw = word:lower()
  for _, n in ipairs(names) do
    local d = distance(lw, tostring(n):lower())
    if d < bd then best, bd = n, d end
  end
  if best and bd <= 2 and bd * 2 < math.max(#word, 2) + 1 then return best end
  return nil
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
