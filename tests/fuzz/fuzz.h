/* fuzz.h — shared by the fuzz harnesses (tests/fuzz/fuzz_*.c). Each harness
 * defines LLVMFuzzerTestOneInput, the libFuzzer entry point: built with
 * clang -fsanitize=fuzzer by scripts/fuzz.sh, or with the normal compiler
 * and replay_main.c into a plain program that feeds it the corpus files
 * (ctest fuzz_corpus_replay). A harness checks its reader's contract and
 * aborts with FUZZ_FAIL when it is broken; the sanitizers (the ASan/UBSan
 * build, or fuzz.sh) catch memory errors and undefined behaviour.
 *
 * LUAPIPE_FUZZ_STRICT=1 adds the message checks: an error must read in
 * the user's terms, never as Lua internals ("attempt to index", "bad
 * argument #2 to", a traceback). */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_FAIL(...)                                                         \
  do {                                                                         \
    fprintf(stderr, "fuzz: %s:%d: contract broken: ", __FILE__, __LINE__);     \
    fprintf(stderr, __VA_ARGS__);                                              \
    fputc('\n', stderr);                                                       \
    abort();                                                                   \
  } while (0)

/* A NUL-terminated copy of the input (malloc; the caller frees). */
static inline char *fuzz_text(const uint8_t *data, size_t size) {
  char *t = malloc(size + 1);
  if (!t) abort();
  memcpy(t, data, size);
  t[size] = '\0';
  return t;
}

static inline int fuzz_strict(void) {
  const char *s = getenv("LUAPIPE_FUZZ_STRICT");
  return s && *s && strcmp(s, "0") != 0;
}

/* In strict mode: msg must not read as Lua internals. */
static inline void fuzz_check_message(const char *msg) {
  static const char *const internal[] = {"attempt to ", "bad argument #", "stack traceback",
                                         ".lua:", "(a nil value)", NULL};
  if (!fuzz_strict()) return;
  for (int i = 0; internal[i]; i++)
    if (strstr(msg, internal[i])) FUZZ_FAIL("error message leaks internals: %s", msg);
}

/* A private temporary folder for harnesses whose reader takes a path;
 * created once, removed at exit. */
const char *fuzz_tmpdir(void);
