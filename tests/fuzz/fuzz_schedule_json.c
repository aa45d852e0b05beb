/* fuzz_schedule_json.c — the schedule JSON reader, schedule.from_json (what
 * `luapipe simulate file.json` uses; Lua, run in an embedded state).
 * Contract: it returns a Schedule, or nil and a message that starts with
 * the origin; it never raises. A schedule it accepts writes JSON that
 * reads back to the same JSON. */
#include "fuzz_lua.h"

static const char chunk[] =
    "local text = ...\n"
    "local schedule = require('luapipe.schedule')\n"
    "local s, err = schedule.from_json(text, 'fuzz.json')\n"
    "if not s then\n"
    "  assert(type(err) == 'string' and err:sub(1, 9) == 'fuzz.json',\n"
    "    'error does not name the source: ' .. tostring(err))\n"
    "  -- the user's text is the JSON's strings as decoded (escapes undone)\n"
    "  local quoted, seen = { text }, {}\n"
    "  local function strings(v)\n"
    "    if type(v) == 'string' then quoted[#quoted + 1] = v\n"
    "    elseif type(v) == 'table' and not seen[v] then\n"
    "      seen[v] = true\n"
    "      for k, x in pairs(v) do strings(k); strings(x) end\n"
    "    end\n"
    "  end\n"
    "  strings(require('luapipe.json').decode(text))\n"
    "  return fuzz_check_message(err, table.concat(quoted, '\\0'))\n"
    "end\n"
    "local again = assert(schedule.from_json(s:to_json(), 'rewritten.json'))\n"
    "assert(again:to_json() == s:to_json(), 'JSON round trip differs')\n"
    "s:validate()\n"
    "again:close(); s:close()\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_lua_run("fuzz_schedule_json", chunk, data, size, NULL);
  return 0;
}
