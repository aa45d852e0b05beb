/* repl.c — the interactive REPL: readline editing and history, expressions
 * printed (`1+1` prints 2, `=x` too; tables shown by luapipe.repl), statements continued while the parser
 * reports an unfinished chunk, errors printed with a traceback, Tab
 * completing names (luapipe.repl.complete). */
#define _GNU_SOURCE /* ppoll */
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <poll.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"
#include "lp_base.h"

#define PROMPT "luapipe> "
#define PROMPT2 "      >> "

static char history_path[4096];

static void history_open(void) {
  const char *p = getenv("LUAPIPE_HISTORY");
  if (p && !*p) return; /* explicitly disabled */
  if (p) {
    snprintf(history_path, sizeof history_path, "%s", p);
  } else {
    const char *home = getenv("HOME");
    if (!home) return;
    snprintf(history_path, sizeof history_path, "%s/.luapipe_history", home);
  }
  read_history(history_path);
}

static void history_add(const char *line) {
  if (!*line) return;
  add_history(line);
  if (history_path[0]) {
    if (append_history(1, history_path) != 0) write_history(history_path);
    history_truncate_file(history_path, 1000);
  }
}

/* Is the syntax error on top of the stack "unexpected end of input"? */
static int incomplete(lua_State *L, int status) {
  if (status != LUA_ERRSYNTAX) return 0;
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len);
  static const char mark[] = "<eof>";
  size_t ml = sizeof mark - 1;
  if (len >= ml && strcmp(msg + len - ml, mark) == 0) {
    lua_pop(L, 1);
    return 1;
  }
  return 0;
}

/* Compiles `return <line>`; leaves the function or nothing. */
static int try_expression(lua_State *L, const char *line) {
  const char *expr = line[0] == '=' ? line + 1 : line;
  const char *ret = lua_pushfstring(L, "return %s;", expr);
  int st = luaL_loadbuffer(L, ret, strlen(ret), "=stdin");
  lua_remove(L, -2); /* the string */
  if (st != LUA_OK) lua_pop(L, 1);
  return st;
}

/* ---- Ctrl-C at the prompt ----
 * readline's own signal handling is off, and it reads keys through
 * wait_key: a Ctrl-C that came while waiting (or just before: SIGINT is
 * blocked from the check until ppoll waits) clears the line, and an
 * unfinished statement, and shows a fresh prompt, as in a shell. */

static int dropped; /* Ctrl-C dropped the statement being typed */

static int wait_key(FILE *in) {
  sigset_t sigint, outside;
  sigemptyset(&sigint);
  sigaddset(&sigint, SIGINT);
  for (;;) {
    sigprocmask(SIG_BLOCK, &sigint, &outside);
    if (host_interrupt_take()) {
      sigprocmask(SIG_SETMASK, &outside, NULL);
      dropped = 1;
      rl_replace_line("", 0);
      rl_set_prompt(PROMPT);
      rl_crlf();
      rl_on_new_line();
      rl_redisplay();
      continue;
    }
    struct pollfd p = {fileno(in), POLLIN, 0};
    int r = ppoll(&p, 1, NULL, &outside); /* SIGINT deliverable only while waiting */
    sigprocmask(SIG_SETMASK, &outside, NULL);
    if (r < 0 && errno == EINTR) continue;
    return rl_getc(in);
  }
}

static char *read_line(const char *prompt) {
  host_interrupt_take(); /* a Ctrl-C between chunks is spent */
  char *line = readline(prompt);
  if (host_interrupt_take()) dropped = 1;
  return line;
}

/* Reads one chunk, continuing lines until it is complete; leaves the
 * compiled function or an error message, returns the load status, or -1
 * at end of input. */
static int read_chunk(lua_State *L) {
  dropped = 0;
  char *line = read_line(PROMPT);
  if (!line) return -1;
  if (try_expression(L, line) == LUA_OK) {
    history_add(line);
    free(line);
    return LUA_OK;
  }
  lua_pushstring(L, line); /* [code] */
  free(line);
  for (;;) {
    size_t len;
    const char *code = lua_tolstring(L, -1, &len);
    int st = luaL_loadbuffer(L, code, len, "=stdin"); /* [code, fn|err] */
    if (!incomplete(L, st)) {
      history_add(lua_tostring(L, -2));
      lua_remove(L, -2);
      return st;
    }
    dropped = 0;
    char *more = read_line(PROMPT2);
    if (!more) { /* end of input inside a statement */
      lua_pop(L, 1);
      return -1;
    }
    if (dropped) { /* Ctrl-C: forget the statement, start over with this line */
      lua_pop(L, 1);
      if (try_expression(L, more) == LUA_OK) {
        history_add(more);
        free(more);
        return LUA_OK;
      }
      lua_pushstring(L, more);
      free(more);
      continue;
    }
    lua_pushstring(L, "\n");
    lua_pushstring(L, more);
    free(more);
    lua_concat(L, 3); /* [code .. "\n" .. more] */
  }
}

/* Pushes the function that shows results: luapipe.repl's show (tables
 * pretty-printed, depth-limited), or print when that module cannot load. */
static void push_printer(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "luapipe.repl");
  if (host_docall(L, 1, 1) == LUA_OK && lua_istable(L, -1)) {
    lua_getfield(L, -1, "show"); /* [repl, show] */
    lua_remove(L, -2);
    if (lua_isfunction(L, -1)) return;
  }
  lua_pop(L, 1);
  lua_getglobal(L, "print");
}

/* Prints every value left by the chunk (see push_printer). */
static void print_results(lua_State *L, int base) {
  int n = lua_gettop(L) - base;
  if (n <= 0) return;
  luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
  push_printer(L);
  lua_insert(L, base + 1);
  int st = host_docall(L, n, 0);
  if (st != LUA_OK)
    fprintf(stderr, "luapipe: error calling print (%s)\n", lua_tostring(L, -1));
  host_report(L, st);
}

/* ---- Tab completion ----
 * readline asks for the matches of the word before the cursor (words
 * break at spaces, brackets and operators, not at '.' or ':', so the word
 * is a path such as `luapipe.sch` or `s:val`); luapipe.repl's complete
 * gives them, from the names "did you mean" chooses from. */

static lua_State *complete_L; /* the REPL's state, for readline's hooks */
static int complete_ref = LUA_NOREF; /* this word's matches (a Lua list) */
static lua_Integer complete_next;

/* Leaves complete(text)'s list in complete_ref (an empty one on any
 * failure: Tab then does nothing). */
static void complete_compute(const char *text) {
  lua_State *L = complete_L;
  int top = lua_gettop(L);
  luaL_unref(L, LUA_REGISTRYINDEX, complete_ref);
  complete_ref = LUA_NOREF;
  lua_getglobal(L, "require");
  lua_pushstring(L, "luapipe.repl");
  if (host_docall(L, 1, 1) == LUA_OK && lua_istable(L, -1)) {
    lua_getfield(L, -1, "complete"); /* [repl, complete] */
    lua_pushstring(L, text);
    if (host_docall(L, 1, 1) == LUA_OK && lua_istable(L, -1))
      complete_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_settop(L, top);
}

/* readline's generator: the state-th match (malloc'd), NULL after the last. */
static char *complete_match(const char *text, int state) {
  if (state == 0) {
    complete_compute(text);
    complete_next = 1;
  }
  if (complete_ref == LUA_NOREF) return NULL;
  lua_State *L = complete_L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, complete_ref);
  lua_rawgeti(L, -1, complete_next++);
  const char *m = lua_tostring(L, -1);
  char *out = m ? strdup(m) : NULL;
  lua_pop(L, 2);
  return out;
}

static char **complete(const char *text, int start, int end) {
  (void)start;
  (void)end;
  rl_attempted_completion_over = 1; /* never file names */
  rl_completion_append_character = '\0';
  return rl_completion_matches(text, complete_match);
}

void host_repl(lua_State *L) {
  printf("luapipe %s, %s: the library is `luapipe`; try luapipe.help()\n",
         LP_VERSION, LUA_RELEASE);
  history_open();
  rl_catch_signals = 0;
  rl_getc_function = wait_key;
  rl_readline_name = "luapipe";
  complete_L = L;
  rl_attempted_completion_function = complete;
  rl_basic_word_break_characters = " \t\n\"'`@$><=;|&{}()[],+-*/%^#~";
  for (;;) {
    int base = lua_gettop(L);
    int st = read_chunk(L);
    if (st == -1) break;
    if (st == LUA_OK) st = host_docall(L, 0, LUA_MULTRET);
    if (st == LUA_OK)
      print_results(L, base);
    else
      host_report(L, st);
    lua_settop(L, base);
  }
  luaL_unref(L, LUA_REGISTRYINDEX, complete_ref);
  complete_ref = LUA_NOREF;
  lua_settop(L, 0);
  putchar('\n');
}
