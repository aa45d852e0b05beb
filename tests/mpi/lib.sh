# The start every multi-rank shell test shares, sourced as
# `. "$(dirname "$0")/lib.sh"` with the test's own arguments ($1: the
# luapipe program): exits 77 (skipped) without mpirun; ranks may run as root,
# one OpenBLAS thread each; $tmp (removed at exit), `fail TEXT` counting
# into $fails.
set -u
luapipe=${1:?usage: $(basename "$0") path/to/luapipe}
command -v mpirun >/dev/null || { echo "skip: no mpirun"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
