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
    "  return fuzz_check_message(err, text)\n"
    "end\n"
    "local again = assert(schedule.from_json(s:to_json(), 'rewritten.json'))\n"
    "assert(again:to_json() == s:to_json(), 'JSON round trip differs')\n"
    "s:validate()\n"
    "again:close(); s:close()\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_lua_run("fuzz_schedule_json", chunk, data, size, NULL);
  return 0;
}
