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

/* Where needle (n bytes) first occurs in hay[0, size), or NULL. */
static inline const char *fuzz_find(const char *hay, size_t size, const char *needle, size_t n) {
  if (n == 0) return hay;
  for (size_t i = 0; i + n <= size; i++)
    if (hay[i] == needle[0] && !memcmp(hay + i, needle, n)) return hay + i;
  return NULL;
}

/* Does s[0, n) occur in the input as it is? (A quote the message cut
 * short with "..." is judged without the dots.) */
static inline int fuzz_in_input(const char *s, size_t n, const uint8_t *in, size_t size) {
  if (n >= 3 && !memcmp(s + n - 3, "...", 3)) n -= 3;
  return fuzz_find((const char *)in, size, s, n) != NULL;
}

/* Is msg[hit, hit + len) inside a quote of the input: between some quote
 * mark (' or ") before it and the same mark after it, with the text
 * between them occurring in the input? (The quoted text may hold quote
 * marks of its own: every mark before the hit is tried.) */
static inline int fuzz_quoted_input(const char *msg, size_t mlen, const char *hit, size_t len,
                                    const uint8_t *in, size_t size) {
  const char *end = msg + mlen;
  for (const char *q = hit; q > msg; q--) {
    char mark = q[-1];
    if (mark != '\'' && mark != '"') continue;
    for (const char *c = hit + len; c < end; c++)
      if (*c == mark && fuzz_in_input(q, (size_t)(c - q), in, size)) return 1;
  }
  return 0;
}

/* In strict mode: msg (mlen bytes) must not read as Lua internals; the
 * input it quotes back (in, size: what the reader was given) is not
 * judged. */
static inline void fuzz_check_message_n(const char *msg, size_t mlen, const uint8_t *in,
                                        size_t size) {
  static const char *const internal[] = {"attempt to ", "bad argument #", "stack traceback",
                                         ".lua:", "(a nil value)", NULL};
  if (!fuzz_strict()) return;
  for (int i = 0; internal[i]; i++) {
    size_t len = strlen(internal[i]);
    for (const char *hit = fuzz_find(msg, mlen, internal[i], len); hit;
         hit = fuzz_find(hit + 1, mlen - (size_t)(hit + 1 - msg), internal[i], len))
      if (!fuzz_quoted_input(msg, mlen, hit, len, in, size))
        FUZZ_FAIL("error message leaks internals: %s", msg);
  }
}

static inline void fuzz_check_message(const char *msg, const uint8_t *in, size_t size) {
  fuzz_check_message_n(msg, strlen(msg), in, size);
}

/* A private temporary folder for harnesses whose reader takes a path;
 * created once, removed at exit. */
const char *fuzz_tmpdir(void);
