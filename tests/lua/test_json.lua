-- luapipe.json (lua-cjson underneath): strict decoding with integers kept
-- as integers, errors naming the line, null, and the ordered encoder.
local lu = require("luaunit")
local json = require("luapipe.json")

TestJson = {}

function TestJson:test_decode_numbers()
  local v = assert(json.decode('{"a": [1, 2.5, -3, 4.0, 1e3], "b": 9007199254740993}'))
  lu.assertEquals(math.type(v.a[1]), "integer")
  lu.assertEquals(math.type(v.a[2]), "float")
  lu.assertEquals(v.a[3], -3)
  lu.assertEquals(math.type(v.a[3]), "integer")
  lu.assertEquals(math.type(v.a[5]), "integer") -- integral values come back as integers
  lu.assertEquals(math.type(v.b), "float")      -- beyond 2^53: left a float
  local f = assert(json.decode("[1, 2]", true))
  lu.assertEquals(math.type(f[1]), "float")
  lu.assertEquals(json.decode("7"), 7)
  lu.assertEquals(math.type(json.decode("7")), "integer")
end

function TestJson:test_decode_errors_name_the_line()
  local v, pos, err = json.decode('[[1, 2],\n [3,\n')
  lu.assertNil(v)
  lu.assertEquals(json.line_of('[[1, 2],\n [3,\n', pos), 3)
  lu.assertStrContains(err, "at line 3")
  v, pos, err = json.decode('{"a": 1,\n "b": NaN}')
  lu.assertNil(v)
  lu.assertStrContains(err, "at line 2") -- strict: no NaN / Infinity
  lu.assertEquals(pos, 16) -- the N
  v, _, err = json.decode(42)
  lu.assertNil(v)
  lu.assertStrContains(err, "expected JSON text")
end

function TestJson:test_null()
  local v = assert(json.decode('{"a": null, "c": 1}'))
  lu.assertNil(v.a) -- an absent field
  lu.assertEquals(v.c, 1)
  lu.assertEquals(assert(json.decode('{"a": null}', true)).a, json.null)
  lu.assertNil(json.decode("null"))
  lu.assertEquals(json.encode({ a = json.null }), '{"a":null}')
end

function TestJson:test_encode()
  lu.assertEquals(json.encode({ 1, 2, 3 }), "[1,2,3]")
  lu.assertEquals(json.encode({ 1.5, 2, 1 / 0, 0 / 0 }), "[1.5,2,null,null]")
  lu.assertEquals(json.encode({}), "[]")
  lu.assertEquals(json.encode({ b = 1, a = 2, c = { x = true } }), '{"a":2,"b":1,"c":{"x":true}}')
  lu.assertEquals(json.encode({ b = 1, a = 2 }, { keyorder = { "b" } }), '{"b":1,"a":2}')
  lu.assertEquals(json.encode(setmetatable({ b = 1, a = 2 }, { __jsonorder = { "b", "a" } })),
    '{"b":1,"a":2}')
  lu.assertEquals(json.encode({ s = 'q"\\\n\1' }), '{"s":"q\\"\\\\\\n\\u0001"}')
  lu.assertEquals(json.encode({ a = { 1, 2 }, b = { c = 1 } }, { indent = true }),
    '{\n  "a":[1,2],\n  "b":{\n    "c":1\n  }\n}')
  -- round trip
  local t = { name = "x", list = { 1, 2.25, -7 }, nested = { { k = "v" } } }
  lu.assertEquals(json.decode(json.encode(t)), t)
  lu.assertErrorMsgContains("cannot encode a function", json.encode, { f = print })
end

os.exit(lu.LuaUnit.run())
