#!/usr/bin/env bash
# test_lint.sh LUAPIPE — checks any reader can run (from the repo root):
# luacheck over lua/ (.luacheckrc; Debian lua-check, installed by
# scripts/install-deps.sh), and the house rules on errors: no library code
# strips a position off a caught error (gsub("^[^:]*:%d+...")), and the
# library never ends the process (os.exit, comm.abort) outside the
# program's edge, luapipe.cli (the job policy, luapipe.cli.job, and the
# CLI's own --help).
set -u
cd "$(dirname "$0")/../.."
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

if command -v luacheck >/dev/null; then
  luacheck --formatter plain lua/ || fail "luacheck lua/ (see above)"
else
  fail "luacheck not found: install lua-check (scripts/install-deps.sh)"
fi

# a position cut off a caught error: errors are values (util.message)
hits=$(grep -rn --include='*.lua' -F 'gsub("^[^:]*:%d+' lua/ || true)
[ -z "$hits" ] || fail "an error's position stripped by gsub: $hits"
# the library never ends the process: only luapipe.cli (the program) may
hits=$(grep -rn --include='*.lua' -E '(^|[^.%w_])os\.exit|comm\.abort\(' lua/luapipe |
  grep -v '^lua/luapipe/cli/' | grep -vE '^[^:]+:[0-9]+:\s*--' || true)
[ -z "$hits" ] || fail "the library ends the process: $hits"

[ "$fails" -eq 0 ] && echo "all checks passed" || { echo "$fails check(s) failed"; exit 1; }
