#!/usr/bin/env bash
# test_blas_core.sh LUAPIPE — the OpenBLAS kernel set the program runs:
# `luapipe -v` names it; OPENBLAS_CORETYPE, when set, is what runs (and is
# said to be the user's); when OpenBLAS fell back to its generic kernels on
# a CPU it does not know and the CPU has AVX-512 or AVX2, luapipe restarted
# itself with a set for it (said so), and LUAPIPE_BLAS_CORE=keep stops
# that; a typo in LUAPIPE_BLAS_CORE is one line naming it, exit 2.
set -u
luapipe=${1:?usage: test_blas_core.sh path/to/luapipe}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

out=$(OPENBLAS_CORETYPE=Haswell "$luapipe" -v | sed -n 2p)
[ "$out" = "BLAS: OpenBLAS, Haswell kernels (OPENBLAS_CORETYPE)" ] || fail "OPENBLAS_CORETYPE=Haswell: '$out'"

kept=$(env -u OPENBLAS_CORETYPE LUAPIPE_BLAS_CORE=keep "$luapipe" -v | sed -n 2p)
auto=$(env -u OPENBLAS_CORETYPE "$luapipe" -v | sed -n 2p)
echo "keep: $kept"
echo "auto: $auto"
case $kept in
  "BLAS: OpenBLAS, Prescott kernels" | "BLAS: OpenBLAS, Core2 kernels" | "BLAS: OpenBLAS, Katmai kernels")
    # OpenBLAS does not know this CPU: auto must have chosen for its vector units
    if grep -qw avx512bw /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo; then
      want="BLAS: OpenBLAS, SkylakeX kernels (set by luapipe: OpenBLAS does not know this CPU)"
    elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
      want="BLAS: OpenBLAS, Haswell kernels (set by luapipe: OpenBLAS does not know this CPU)"
    else
      want=$kept
    fi
    [ "$auto" = "$want" ] || fail "auto on a CPU OpenBLAS does not know: '$auto', want '$want'"
    ;;
  "BLAS: OpenBLAS, "*" kernels")
    [ "$auto" = "$kept" ] || fail "auto changed OpenBLAS's own choice: '$kept' -> '$auto'" ;;
  *) fail "keep: '$kept'" ;;
esac

msg=$(LUAPIPE_BLAS_CORE=kep "$luapipe" -v 2>&1)
rc=$?
[ "$rc" -eq 2 ] && [ "$msg" = "luapipe: LUAPIPE_BLAS_CORE='kep': use auto (a kernel set for this CPU when OpenBLAS does not know it) or keep" ] \
  || fail "a typo: rc $rc, '$msg'"

if [ "$fails" -ne 0 ]; then
  echo "test_blas_core: $fails failure(s)"
  exit 1
fi
echo "test_blas_core: all passed"
