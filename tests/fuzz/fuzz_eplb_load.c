/* fuzz_eplb_load.c — the EPLB load reader, through the public entry point
 * of `luapipe eplb`: the command itself (luapipe.cli main, in an embedded
 * Lua state) on the input as its --loads file, 64 slots on 8 GPUs of 2
 * nodes. Contract: it never raises; it exits 0 and writes the plan, or
 * exits 1 or 2 with one message on stderr that names the load file. */
#include <unistd.h>

#include "fuzz_lua.h"

static const char chunk[] =
    "local text, dir = ...\n"
    "local loads, plan = dir .. '/loads', dir .. '/plan'\n"
    "local f = assert(io.open(loads, 'wb')); f:write(text); f:close()\n"
    "os.remove(plan)\n"
    "local err = {}\n"
    "local real, write = io.stderr, io.write\n"
    "io.write = function() end\n"
    "io.stderr = { write = function(self, ...) for _, s in ipairs { ... } do err[#err + 1] = s end\n"
    "  return self end }\n"
    "local ok, code = pcall(require('luapipe.cli').main, { 'eplb', '--loads', loads,\n"
    "  '--replicas', '64', '--gpus', '8', '--nodes', '2', '--groups', '4', '--output', plan })\n"
    "io.stderr, io.write = real, write\n"
    "assert(ok, code)\n"
    "local msg = table.concat(err)\n"
    "if code == 0 then\n"
    "  assert(io.open(plan), 'exit 0 without a plan'):close()\n"
    "else\n"
    "  assert(code == 1 or code == 2, 'exit code ' .. tostring(code))\n"
    "  assert(msg ~= '', 'exit ' .. code .. ' without a message')\n"
    "  assert(select(2, msg:gsub('\\n', '')) == 1, 'more than one line: ' .. msg)\n"
    "  fuzz_check_message(msg, text)\n"
    "  assert(io.open(plan) == nil, 'a plan was written on failure')\n"
    "end\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_lua_run("fuzz_eplb_load", chunk, data, size, fuzz_tmpdir());
  return 0;
}
