/* main.c — the luapipe program: runs scripts (`luapipe FILE.lua args`),
 * code (`-e`), subcommands written in Lua (`luapipe simulate ...`) and an
 * interactive REPL. Everything runs inside one protected pmain; every chunk
 * goes through docall (traceback handler, SIGINT hook). A luapipe.Error
 * that ends a chunk goes to the job policy (luapipe.cli.job), which prints
 * it and says the exit status: the program's edge, where the job's fate is
 * decided (the library never ends the process). */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <malloc.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "host.h"
#include "lp_base.h"
#include "lp_comm.h"
#include "lp_lua.h"
#include "lp_tensor.h"

static const char *progname = "luapipe";

/* ---- SIGINT ----
 * One handler for the process's whole life (installed first thing in main,
 * even over an inherited SIG_IGN, as lua.c does for its calls). Inside a
 * call it sets a hook that raises "interrupted!" at the next Lua step; a
 * second Ctrl-C before that hook ran kills the process. Outside a call it
 * leaves the interrupt pending: the next call is interrupted at once, so an
 * early Ctrl-C is never lost. The REPL takes a pending interrupt at its
 * prompt as "drop this line" (host_interrupt_take). */

static lua_State *volatile running_L; /* the state inside host_docall, or NULL */
static volatile sig_atomic_t pending; /* Ctrl-C not yet turned into an error */
static lua_Integer interrupts;        /* Ctrl-Cs turned into errors so far */

static void stop_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  pending = 0;
  interrupts++;
  luaL_error(L, "interrupted!");
}

/* core.interrupts() -> how many Ctrl-Cs have interrupted a call so far: a
 * caller that catches errors (the search keeping its best on Ctrl-C) tells
 * an interrupt from other failures by this count, not by the message. */
static int l_interrupts(lua_State *L) {
  lua_pushinteger(L, interrupts);
  return 1;
}

/* ---- the line a stopped job leaves ----
 * A program may set one line for the process to print when a signal stops
 * it: SIGTERM (what mpirun sends every rank on Ctrl-C) or the first
 * SIGINT. luapipe.train on rank 0 sets where a resume would start. The
 * handler prints it once with write(2) from the buffer in force; setting
 * fills the other buffer and then switches, so the handler never reads a
 * line being written. */
static char note_buf[2][1024];
static volatile sig_atomic_t note_at = -1; /* the buffer in force, or -1 */

static int write_note(void) {
  int i = note_at;
  if (i < 0) return 0;
  note_at = -1;
  ssize_t w = write(STDERR_FILENO, note_buf[i], strlen(note_buf[i]));
  (void)w;
  return 1;
}

static void on_sigterm(int sig) {
  /* mpirun, taking the job down, may stop reading a rank's output as soon
   * as the rank is gone: give the line a moment to be read first */
  if (write_note()) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

/* core.set_stop_note(line | nil): the line to print if a signal stops the
 * process (nil: none). The SIGTERM handler is installed the first time. */
static int l_set_stop_note(lua_State *L) {
  static int installed;
  const char *t = luaL_optstring(L, 1, NULL);
  if (!t) {
    note_at = -1;
    return 0;
  }
  int i = note_at == 0 ? 1 : 0;
  snprintf(note_buf[i], sizeof note_buf[i], "%s\n", t);
  note_at = i;
  if (!installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    installed = 1;
  }
  return 0;
}

static void on_sigint(int sig) {
  lua_State *L = running_L;
  if (!pending) write_note();
  if (L && pending) { /* the first one is still on its way: stop hard */
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  pending = 1;
  if (L) lua_sethook(L, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

void host_sigint_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, NULL);
}

int host_interrupt_take(void) {
  int was = pending;
  pending = 0;
  return was;
}

/* The exit status the last error reported asks for (1 unless the job
 * policy said otherwise). */
static int report_status = 1;

/* An error value that is a table (a luapipe.Error: fields, not text) goes
 * to the job policy, luapipe.cli.job.failed(err), which prints it as the
 * job wants (once per job, or taking every rank down) and returns the exit
 * status. 0 when the policy itself failed (the error is still on top). */
static int job_policy(lua_State *L) {
  int err = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, "luapipe.cli.job");
  if (lp_lua_pcall(L, 1, 1) != LUA_OK || !lua_istable(L, -1)) {
    lua_settop(L, err);
    return 0;
  }
  lua_getfield(L, -1, "failed");
  lua_pushvalue(L, err);
  if (lp_lua_pcall(L, 1, 1) != LUA_OK || !lua_isinteger(L, -1)) {
    lua_settop(L, err);
    return 0;
  }
  report_status = (int)lua_tointeger(L, -1);
  lua_settop(L, err - 1);
  return 1;
}

void host_report(lua_State *L, int status) {
  if (status != LUA_OK) {
    report_status = 1;
    if (lua_type(L, -1) == LUA_TTABLE && job_policy(L)) return;
    const char *msg = luaL_tolstring(L, -1, NULL);
    fprintf(stderr, "%s: %s\n", progname, msg ? msg : "(error without a message)");
    fflush(stderr);
    lua_pop(L, 2);
  }
}

int host_docall(lua_State *L, int nargs, int nres) {
  lua_State *outer = running_L;
  running_L = L;
  if (pending) /* arrived between calls: interrupt this one at once */
    lua_sethook(L, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  int status = lp_lua_pcall_keep(L, nargs, nres); /* a luapipe.Error stays a table */
  running_L = outer;
  return status;
}

/* ---- colour: does output on fd end at a terminal? ----
 * Under mpirun a rank's stdout is a pseudo-terminal that mpirun copies to
 * its own stdout, so isatty() in the rank says yes even for `mpirun ... >
 * log`. There the answer is mpirun's own fd (the rank's parent). */

static int launched_by_mpirun(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

static int output_is_terminal(int fd) {
  if (!isatty(fd)) return 0;
  if (!launched_by_mpirun()) return 1;
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/fd/%d", (long)getppid(), fd);
  int f = open(path, O_RDONLY | O_NOCTTY | O_NONBLOCK);
  if (f < 0) return 0; /* cannot tell: no colour */
  int tty = isatty(f);
  close(f);
  return tty;
}

/* core.output_is_terminal(fd) -> boolean; luapipe.show.use_color asks it. */
static int l_output_is_terminal(lua_State *L) {
  lua_pushboolean(L, output_is_terminal((int)luaL_checkinteger(L, 1)));
  return 1;
}

/* Preloaded as luapipe.core: the bindings plus what only the program
 * knows (how it was launched). */
static int open_core(lua_State *L) {
  lua_pushcfunction(L, luaopen_luapipe_core);
  lua_call(L, 0, 1);
  lua_pushcfunction(L, l_output_is_terminal);
  lua_setfield(L, -2, "output_is_terminal");
  lua_pushcfunction(L, l_interrupts);
  lua_setfield(L, -2, "interrupts");
  lua_pushcfunction(L, l_set_stop_note);
  lua_setfield(L, -2, "set_stop_note");
  return 1;
}

/* ---- start-up ---- */

static int dir_exists(const char *p) {
  struct stat st;
  return p && *p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Where an installed copy keeps its modules: <bin>/../share/luapipe/lua,
 * found from the running binary (so `cmake --install --prefix P` works for
 * any P, and the tree can be moved). Empty when not found. */
static void exe_lua_dir(char *out, size_t n) {
  char bin[4096];
  lp_program_dir(bin, sizeof bin);
  out[0] = '\0';
  if (bin[0]) snprintf(out, n, "%s/../share/luapipe/lua", bin);
}

/* package.path = <lua dir>/?.lua;<lua dir>/?/init.lua;<default>, where the
 * lua dir is the first that exists of: the binary's own install tree, the
 * source tree it was built from, the configured install prefix; with
 * LUAPIPE_LUA_PATH in front of it. */
static void set_lua_path(lua_State *L) {
  char here[4200];
  exe_lua_dir(here, sizeof here);
  const char *dirs[4] = {getenv("LUAPIPE_LUA_PATH"), here, LUAPIPE_SOURCE_LUA_DIR,
                         LUAPIPE_INSTALL_LUA_DIR};
  luaL_Buffer b;
  lua_getglobal(L, "package");
  luaL_buffinit(L, &b);
  for (int i = 0; i < 4; i++) {
    if (!dir_exists(dirs[i])) continue;
    luaL_addstring(&b, dirs[i]);
    luaL_addstring(&b, "/?.lua;");
    luaL_addstring(&b, dirs[i]);
    luaL_addstring(&b, "/?/init.lua;");
    if (i == 0) continue; /* the env dir is added in front of the others */
    break;                /* the first of the others wins */
  }
  lua_getfield(L, -2, "path");
  luaL_addvalue(&b);
  luaL_pushresult(&b);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
}

/* Opens the standard libraries, preloads luapipe.core and sets the global
 * `luapipe` to require("luapipe"). */
static int open_luapipe(lua_State *L) {
  luaL_openlibs(L);
  set_lua_path(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, open_core);
  lua_setfield(L, -2, "luapipe.core");
  lua_pop(L, 1);
  lua_getglobal(L, "require");
  lua_pushstring(L, "luapipe");
  int st = host_docall(L, 1, 1);
  if (st != LUA_OK) return st;
  lua_setglobal(L, "luapipe");
  return LUA_OK;
}

/* arg table as in lua.c: arg[0] = script, arg[1..] = its arguments,
 * negative indices for what came before. Without a script (script == 0,
 * `luapipe`, `luapipe -e CODE`) arg[0] is the program and arg[1..] the
 * options, as lua5.4 does. */
static void create_arg_table(lua_State *L, char **argv, int argc, int script) {
  int narg = argc - (script + 1);
  lua_createtable(L, narg > 0 ? narg : 0, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

static int run_chunk(lua_State *L, int status) {
  if (status == LUA_OK) status = host_docall(L, 0, 0);
  host_report(L, status);
  return status;
}

static int run_string(lua_State *L, const char *code, const char *name) {
  return run_chunk(L, luaL_loadbuffer(L, code, strlen(code), name));
}

/* Runs a script with its arguments (arg[1..n] also passed as ...). */
static int run_script(lua_State *L, char **argv, int argc, int script) {
  const char *fname = argv[script];
  if (strcmp(fname, "-") == 0) fname = NULL; /* stdin */
  int status = luaL_loadfile(L, fname);
  if (status == LUA_OK) {
    int n = argc - script - 1;
    luaL_checkstack(L, n, "too many arguments to script");
    for (int i = script + 1; i < argc; i++) lua_pushstring(L, argv[i]);
    status = host_docall(L, n, 0);
  }
  host_report(L, status);
  return status;
}

/* `luapipe <command> ...`: require("luapipe.cli").main({args}) returns the
 * exit code. */
static int run_command(lua_State *L, char **argv, int argc, int *exit_code) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "luapipe.cli");
  int st = host_docall(L, 1, 1);
  if (st != LUA_OK) {
    host_report(L, st);
    return st;
  }
  lua_getfield(L, -1, "main");
  lua_createtable(L, argc - 1, 0);
  for (int i = 1; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  st = host_docall(L, 1, 1);
  if (st != LUA_OK) {
    host_report(L, st);
    return st;
  }
  *exit_code = lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) : 0;
  lua_pop(L, 2);
  return LUA_OK;
}

/* Is argv[1] a subcommand? Asks luapipe.cli.is_command(name): 1 or 0, or
 * -1 after reporting an error (such as an early Ctrl-C). */
static int is_command(lua_State *L, const char *name) {
  if (strchr(name, '.') || strchr(name, '/')) return 0;
  lua_getglobal(L, "require");
  lua_pushstring(L, "luapipe.cli");
  int st = host_docall(L, 1, 1);
  if (st != LUA_OK) {
    host_report(L, st);
    return -1;
  }
  lua_getfield(L, -1, "is_command");
  lua_pushstring(L, name);
  st = host_docall(L, 1, 1);
  if (st != LUA_OK) {
    host_report(L, st);
    lua_pop(L, 1);
    return -1;
  }
  int yes = lua_toboolean(L, -1);
  lua_pop(L, 2);
  return yes;
}

/* Prints the program's usage; the command list is luapipe.cli's (the one
 * list every help shows), or a pointer to `luapipe help` if it cannot load. */
static void print_usage(lua_State *L, FILE *f) {
  fprintf(f,
          "usage: %s [options] [script.lua [args]]\n"
          "       %s <command> [options]     (see `%s help`)\n"
          "Options:\n"
          "  -e CODE   run CODE\n"
          "  -i        enter the interactive REPL after running the script\n"
          "  -v        print the version\n"
          "  --color=WHEN  ANSI colour: auto (on a terminal, unless NO_COLOR), always,\n"
          "                never\n"
          "  -h, --help  show this help\n"
          "  --        stop handling options\n"
          "  -         run standard input as a script (also without arguments when\n"
          "            standard input is not a terminal)\n",
          progname, progname, progname);
  int top = lua_gettop(L);
  const char *list = NULL;
  lua_getglobal(L, "require");
  lua_pushstring(L, "luapipe.cli");
  if (host_docall(L, 1, 1) == LUA_OK && lua_istable(L, -1)) {
    lua_getfield(L, -1, "command_list");
    if (host_docall(L, 0, 1) == LUA_OK) list = lua_tostring(L, -1);
  }
  if (list)
    fprintf(f, "Commands: %s\n(`%s help` describes them).\n", list, progname);
  else
    fprintf(f, "Commands: `%s help` lists them.\n", progname);
  lua_settop(L, top);
  fprintf(f, "With no arguments, starts the REPL (the library is the global `luapipe`).\n");
}

/* --color=auto|always|never sets LUAPIPE_COLOR, which luapipe.show.use_color
 * reads (so ranks started by this process inherit it too). Returns 0 after
 * reporting a bad value. */
static int set_color(const char *opt) {
  const char *when = strncmp(opt, "--color=", 8) == 0 ? opt + 8 : NULL;
  if (!when || (strcmp(when, "auto") && strcmp(when, "always") && strcmp(when, "never"))) {
    fprintf(stderr, "%s: '%s': use --color=auto, --color=always or --color=never\n", progname,
            opt);
    return 0;
  }
  setenv("LUAPIPE_COLOR", when, 1);
  return 1;
}

typedef struct host_args {
  int argc;
  char **argv;
  int exit_code;
} host_args;

static int pmain(lua_State *L) {
  host_args *ha = lua_touserdata(L, 1);
  int argc = ha->argc;
  char **argv = ha->argv;
  int interactive = 0, version = 0, script = 0;
  ha->exit_code = 1;
  if (open_luapipe(L) != LUA_OK) {
    host_report(L, LUA_ERRRUN);
    return 0;
  }
  /* --color=WHEN first: for scripts and commands alike */
  if (argc >= 2 && strncmp(argv[1], "--color", 7) == 0) {
    if (!set_color(argv[1])) {
      ha->exit_code = 2;
      return 0;
    }
    argv[1] = argv[0];
    argv++;
    argc--;
  }
  /* subcommand? A word that is neither a command nor a file is a usage
   * error (the message lists the commands); a missing path or *.lua name
   * is a script that cannot be opened (the script runner says why). */
  int command = argc >= 2 && argv[1][0] != '-' ? is_command(L, argv[1]) : 0;
  if (command < 0) return 0;
  size_t len = argc >= 2 ? strlen(argv[1]) : 0;
  int looks_like_script = argc >= 2 && (strchr(argv[1], '/') ||
                                        (len > 4 && !strcmp(argv[1] + len - 4, ".lua")));
  if (argc >= 2 && argv[1][0] != '-' &&
      (command || (!looks_like_script && access(argv[1], F_OK) != 0))) {
    int code = 1;
    if (run_command(L, argv, argc, &code) == LUA_OK) ha->exit_code = code;
    return 0;
  }
  /* first pass: options, find the script */
  int i;
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || strcmp(a, "-") == 0) break;
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    } else if (strcmp(a, "-i") == 0) {
      interactive = 1;
    } else if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0) {
      version = 1;
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      print_usage(L, stdout);
      ha->exit_code = 0;
      return 0;
    } else if (strncmp(a, "--color", 7) == 0) {
      if (!set_color(a)) {
        ha->exit_code = 2;
        return 0;
      }
    } else if (strcmp(a, "-e") == 0) {
      if (++i >= argc) {
        fprintf(stderr, "%s: '-e' needs an argument\n", progname);
        print_usage(L, stderr);
        ha->exit_code = 2;
        return 0;
      }
    } else {
      fprintf(stderr, "%s: unrecognized option '%s'\n", progname, a);
      print_usage(L, stderr);
      ha->exit_code = 2;
      return 0;
    }
  }
  script = i < argc ? i : 0;
  if (version) {
    printf("luapipe %s (%s)\n", LP_VERSION, LUA_RELEASE);
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("BLAS: OpenBLAS, %s kernels%s\n", lp_tensor_blas_core(),
           ct && getenv("LUAPIPE_BLAS_CORE_SET")
               ? " (set by luapipe: OpenBLAS does not know this CPU)"
           : ct ? " (OPENBLAS_CORETYPE)"
                : "");
    if (run_string(L,
                   "local k = require('luapipe.core').kernels() "
                   "print(string.format('CUDA kernels: %s, %d device(s) visible', "
                   "k.cuda and 'built' or 'not built', k.devices)) "
                   "if k.cuda then print(k.module and 'CUDA module: ' .. k.module or k.error) end "
                   "if k.nccl then print(k.nccl_module and 'NCCL module: ' .. k.nccl_module "
                   "or k.nccl_error) end",
                   "=version") != LUA_OK)
      return 0;
  }
  create_arg_table(L, argv, argc, script);
  /* second pass: run -e chunks in order */
  for (int j = 1; j < (script ? script : argc); j++) {
    if (strcmp(argv[j], "-e") == 0) {
      if (run_string(L, argv[++j], "=(command line)") != LUA_OK) {
        ha->exit_code = report_status;
        return 0;
      }
    } else if (strcmp(argv[j], "--") == 0) {
      break;
    }
  }
  if (script) {
    if (run_script(L, argv, argc, script) != LUA_OK) {
      ha->exit_code = report_status;
      return 0;
    }
  }
  int ran_something = script || version;
  for (int j = 1; j < argc && !ran_something; j++)
    if (strcmp(argv[j], "-e") == 0) ran_something = 1;
  if (interactive || !ran_something) {
    if (interactive || isatty(STDIN_FILENO)) {
      host_repl(L);
    } else { /* `luapipe < file`: run stdin as a script */
      if (run_chunk(L, luaL_loadfile(L, NULL)) != LUA_OK) {
        ha->exit_code = report_status;
        return 0;
      }
    }
  }
  ha->exit_code = 0;
  return 0;
}

/* OpenBLAS that does not know this CPU runs its oldest kernels (a float32
 * GEMM at a fraction of the vector units' speed) and reads
 * OPENBLAS_CORETYPE only when it loads: set it and start again, before
 * anything else (MPI included) has happened. The same on every rank of a
 * job, so every rank runs the same kernels. LUAPIPE_BLAS_CORE=keep, or an
 * OPENBLAS_CORETYPE of the user's, leaves it alone; a failed exec goes on
 * as it was. */
static void blas_core_restart(char **argv) {
  const char *knob = getenv("LUAPIPE_BLAS_CORE");
  if (getenv("OPENBLAS_CORETYPE") || (knob && strcmp(knob, "auto") != 0))
    return; /* keep, or a typo lp_env_check names */
  const char *better = lp_tensor_blas_better_core();
  if (!better) return;
  if (setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
  setenv("LUAPIPE_BLAS_CORE_SET", better, 1); /* for -v: who chose it */
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE"); /* (still here: the exec failed) */
  unsetenv("LUAPIPE_BLAS_CORE_SET");
}

/* Tensors are allocated and freed every step, most over glibc's 128 KiB
 * mmap threshold: each came back as fresh mmapped pages (or freshly sbrk'd
 * ones after the heap top was trimmed) and every step paid their page
 * faults and the kernel's zeroing again. Keep freed memory in the heap
 * instead: allocations up to 32 MiB (glibc's largest threshold) come from
 * it and the top is never given back, so a step reuses the pages of the
 * last one. The peak resident set stays the peak of live tensors plus
 * the heap's fragmentation; between steps it no longer shrinks. Under
 * AddressSanitizer its own allocator runs and these are no-ops. */
static void host_malloc_tune(void) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int main(int argc, char **argv) {
  /* stderr line-buffered: a message written in pieces (Lua's
   * io.stderr:write("luapipe: ", msg, "\n"), fprintf) leaves as one write,
   * so mpirun, which forwards each rank's stdout and stderr separately,
   * cannot put a line of stdout inside it. A line without its newline
   * (a progress line) is flushed by its writer. */
  static char errbuf[BUFSIZ];
  setvbuf(stderr, errbuf, _IOLBF, sizeof errbuf);
  host_sigint_install();
  blas_core_restart(argv);
  host_malloc_tune();
  char env_err[LP_ERRLEN];
  if (lp_env_check(env_err) != LP_OK) { /* before MPI: nothing to undo */
    fprintf(stderr, "%s: %s\n", progname, env_err);
    return 2;
  }
  /* MPI first when under mpirun (atexit also finalizes, for os.exit) */
  if (lp_comm_mpi_init(&argc, &argv) != LP_OK) return 1;
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "%s: cannot create Lua state: not enough memory\n", progname);
    lp_comm_mpi_finalize();
    return 1;
  }
  host_args ha = {argc, argv, 1};
  lua_pushcfunction(L, pmain);
  lua_pushlightuserdata(L, &ha);
  int st = lua_pcall(L, 1, 0, 0);
  if (st != LUA_OK) host_report(L, st);
  /* os.exit inside a script ends the process itself; otherwise here */
  lua_close(L);
  lp_comm_mpi_finalize();
  return st == LUA_OK ? ha.exit_code : 1;
}
