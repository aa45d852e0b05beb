# Shared helpers for the shell tests: `check NAME CONDITION-COMMAND...`.
LP=${1:?usage: $0 path/to/luapipe}
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
# expect_rc NAME WANT CMD... : runs CMD, stdout to $tmp/out, stderr to $tmp/err
expect_rc() {
  local name=$1 want=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -eq "$want" ]; then ok "$name (exit $rc)"; else
    bad "$name: exit $rc, expected $want"; sed 's/^/  | /' "$tmp/out" "$tmp/err" | head -20; fi
}
# expect_in NAME FILE TEXT : FILE ($tmp/out or $tmp/err) contains TEXT
expect_in() {
  if grep -qF -- "$3" "$2"; then ok "$1"; else
    bad "$1: '$3' not in $(basename "$2")"; sed 's/^/  | /' "$2" | head -20; fi
}
finish() {
  if [ "$fails" -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
  echo "all checks passed"
}
