#!/usr/bin/env bash
# replay.sh BUILD_DIR — the ctest fuzz_corpus_replay: runs every fuzz
# harness (BUILD_DIR/fuzz_<reader>, built as a plain replay program) over
# its seed corpus tests/fuzz/corpus/<reader>/. A harness aborts when a
# reader breaks its contract; under the ASan/UBSan build the sanitizers
# report memory errors and undefined behaviour.
# Strict (LUAPIPE_FUZZ_STRICT=1, unless set): the messages are judged too,
# without the input they quote (seeds quoted_*: a user's text that looks
# like a Lua internal).
set -u
build=${1:?usage: replay.sh BUILD_DIR}
export LUAPIPE_FUZZ_STRICT=${LUAPIPE_FUZZ_STRICT:-1}
corpus=$(cd "$(dirname "$0")" && pwd)/corpus
fails=0 n=0
for dir in "$corpus"/*/; do
  reader=$(basename "$dir")
  exe=$build/fuzz_$reader
  n=$((n + 1))
  if [ ! -x "$exe" ]; then
    echo "FAIL $reader: no harness $exe"
    fails=$((fails + 1))
  elif "$exe" "$dir"; then
    echo "ok   $reader"
  else
    echo "FAIL $reader (exit $?)"
    fails=$((fails + 1))
  fi
done
[ "$n" -ge 4 ] || { echo "FAIL: only $n corpora under $corpus"; exit 1; }
[ "$fails" -eq 0 ] || { echo "$fails harness(es) failed"; exit 1; }
echo "all $n corpora replayed"
