-- luapipe.json: the one JSON library of luapipe, on lua-cjson (C) for
-- decoding and a small ordered encoder for output people read.
--
--   local json = require("luapipe.json")
--   local v, pos, msg = json.decode(text)   -- nil, byte position, message on error
--   json.line_of(text, pos)                 -- line number of a byte position
--   json.encode(v, { indent = true, keyorder = { "a", "b" } })
--
-- decode: strict JSON (no NaN, Infinity or hex numbers); integral numbers
-- within +-2^53 come back as Lua integers, others as floats; null leaves
-- the key out, as an absent field (json.null with `floats`, which skips
-- that pass). The error message names the line ("... at line 3").
-- encode: objects keep the keys of `keyorder` (or a metatable's
-- __jsonorder) first, the others sorted; arrays (tables with 1..n and no
-- other keys, or empty tables marked with json.array) stay on one line;
-- with indent, object members go on lines of their own. Non-finite numbers
-- and json.null become null.
local cjson = require("cjson.safe").new()
local util = require("luapipe.util")
cjson.decode_invalid_numbers(false)
cjson.decode_max_depth(1000)

local M = {}

M.null = cjson.null

-- Marks an (empty) table as an array for encode.
local array_mt = { __jsonarray = true }
function M.array(t)
  util.arg("json.array", 1, "t", t, "?table")
  return setmetatable(t or {}, array_mt)
end

-- Line (1-based) of byte position pos of text.
function M.line_of(text, pos)
  util.arg("json.line_of", 1, "text", text, "string")
  util.arg("json.line_of", 2, "pos", pos, "?integer", "a byte position")
  local line = 1
  local stop = math.min(pos or #text, #text + 1)
  local i = text:find("\n", 1, true)
  while i and i < stop do
    line = line + 1
    i = text:find("\n", i + 1, true)
  end
  return line
end

local tointeger, mtype = math.tointeger, math.type
local LIMIT = 2 ^ 53

local function integers(t)
  for k, v in pairs(t) do
    local tv = type(v)
    if v == M.null then
      t[k] = nil -- clearing a field while traversing is allowed
    elseif tv == "number" then
      if mtype(v) == "float" and v > -LIMIT and v < LIMIT then
        local i = tointeger(v)
        if i then t[k] = i end
      end
    elseif tv == "table" then
      integers(v)
    end
  end
end

-- json.decode(text[, floats]) -> value | nil, position, message. With
-- floats, every number stays a float (no pass over the value: for large
-- numeric arrays the caller converts what it needs).
function M.decode(text, floats)
  if type(text) ~= "string" then
    return nil, 1, "expected JSON text (a string), got " .. type(text)
  end
  local v, err = cjson.decode(text)
  if v == nil and err then
    local pos = tonumber(err:match("at character (%d+)")) or #text
    local msg = err:gsub(" at character %d+", ""):gsub("T_END", "the end of the text")
    return nil, pos, string.format("%s at line %d", msg, M.line_of(text, pos))
  end
  if floats then return v end
  if v == M.null then return nil, 1, "the text is just null, not a value" end
  if type(v) == "table" then
    integers(v)
  elseif mtype(v) == "float" and v > -LIMIT and v < LIMIT then
    v = tointeger(v) or v
  end
  return v
end

---------------------------------------------------------------------------
-- encode
---------------------------------------------------------------------------

local escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
  ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function quote(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return escapes[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end
function M.quote(s)
  util.arg("json.quote", 1, "s", s, "string")
  return quote(s)
end

local function number(v)
  if mtype(v) == "integer" then return string.format("%d", v) end
  if v ~= v or v == math.huge or v == -math.huge then return "null" end
  return tostring(v)
end
M.number = number

local function is_array(t)
  local n = #t
  if n == 0 then
    local mt = getmetatable(t)
    return (mt and mt.__jsonarray) or next(t) == nil, 0
  end
  local count = 0
  for _ in pairs(t) do
    count = count + 1
    if count > n then return false, n end
  end
  return count == n, n
end

-- Fast path: an array of integers is one table.concat.
local function int_array(t, n)
  for i = 1, n do
    if mtype(t[i]) ~= "integer" then return nil end
  end
  return "[" .. table.concat(t, ",", 1, n) .. "]"
end

local function encode_value(v, out, opts, depth)
  local tv = type(v)
  if tv == "string" then
    out[#out + 1] = quote(v)
  elseif tv == "number" then
    out[#out + 1] = number(v)
  elseif tv == "boolean" then
    out[#out + 1] = v and "true" or "false"
  elseif v == nil or v == M.null then
    out[#out + 1] = "null"
  elseif tv == "table" then
    if depth > 1000 then error("json.encode: tables nested too deep (a cycle?)", 0) end
    local arr, n = is_array(v)
    if arr then
      local fast = int_array(v, n)
      if fast then
        out[#out + 1] = fast
        return
      end
      out[#out + 1] = "["
      for i = 1, n do
        if i > 1 then out[#out + 1] = "," end
        encode_value(v[i], out, opts, depth + 1)
      end
      out[#out + 1] = "]"
      return
    end
    local keys, seen = {}, {}
    local mt = getmetatable(v)
    local order = (mt and mt.__jsonorder) or opts.keyorder
    if order then
      for _, k in ipairs(order) do
        if v[k] ~= nil and not seen[k] then keys[#keys + 1], seen[k] = k, true end
      end
    end
    local rest = {}
    for k in pairs(v) do
      if not seen[k] then
        if type(k) ~= "string" and mtype(k) ~= "integer" then
          error("json.encode: object key " .. tostring(k) .. " is not a string", 0)
        end
        rest[#rest + 1] = tostring(k)
      end
    end
    table.sort(rest)
    for _, k in ipairs(rest) do
      keys[#keys + 1] = v[k] ~= nil and k or tointeger(tonumber(k))
    end
    local pad = opts.indent and "\n" .. string.rep("  ", depth + 1) or ""
    out[#out + 1] = "{"
    for i, k in ipairs(keys) do
      out[#out + 1] = (i > 1 and "," or "") .. pad .. quote(tostring(k)) .. ":"
      encode_value(v[k], out, opts, depth + 1)
    end
    out[#out + 1] = (opts.indent and #keys > 0) and ("\n" .. string.rep("  ", depth) .. "}") or "}"
  else
    error("json.encode: cannot encode a " .. tv, 0)
  end
end

-- json.encode(value[, {indent = bool, keyorder = {...}}]) -> text
function M.encode(v, opts)
  local out = {}
  encode_value(v, out, opts or {}, 0)
  return table.concat(out)
end

-- a mistyped name ("luapipe.json.x") gets a "did you mean"
return require("luapipe.util").guard(M, "luapipe.json")
