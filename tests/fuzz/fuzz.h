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
 * argument #2 to", a traceback). The message is judged without the input
 * it quotes back: an entry '0.lua:' or an event named "stestack
 * traceback" is the user's own text, not a leak. */
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

/* Does s[0, n) occur in the input as it is? (A quote the message cut
 * short with "..." is judged without the dots.) */
static inline int fuzz_in_input(const char *s, size_t n, const uint8_t *in, size_t size) {
  if (n >= 3 && !memcmp(s + n - 3, "...", 3)) n -= 3;
  if (n == 0) return 1;
  for (size_t i = 0; i + n <= size; i++)
    if (in[i] == (uint8_t)s[0] && !memcmp(in + i, s, n)) return 1;
  return 0;
}

/* Is the hit msg[hit, hit + len) inside a quote of the input: between a
 * quote mark (' or ") before it and the same mark after it, the text
 * between them occurring in the input? */
static inline int fuzz_quoted_input(const char *msg, const char *hit, size_t len,
                                    const uint8_t *in, size_t size) {
  const char *open = NULL;
  for (const char *q = hit; q > msg; q--)
    if (q[-1] == '\'' || q[-1] == '"') {
      open = q - 1;
      break;
    }
  const char *close = open ? strchr(hit + len, *open) : NULL;
  return close && fuzz_in_input(open + 1, (size_t)(close - open - 1), in, size);
}

/* In strict mode: msg must not read as Lua internals; the input it quotes
 * back (in, size: what the reader was given) is not judged. */
static inline void fuzz_check_message(const char *msg, const uint8_t *in, size_t size) {
  static const char *const internal[] = {"attempt to ", "bad argument #", "stack traceback",
                                         ".lua:", "(a nil value)", NULL};
  if (!fuzz_strict()) return;
  for (int i = 0; internal[i]; i++) {
    size_t len = strlen(internal[i]);
    for (const char *hit = strstr(msg, internal[i]); hit; hit = strstr(hit + 1, internal[i]))
      if (!fuzz_quoted_input(msg, hit, len, in, size))
        FUZZ_FAIL("error message leaks internals: %s", msg);
  }
}

/* A private temporary folder for harnesses whose reader takes a path;
 * created once, removed at exit. */
const char *fuzz_tmpdir(void);
