/* lp_base.h — status codes, error text, logging, allocation hooks and the
 * LUAPIPE_* environment knobs shared by every luapipe module.
 * Depends on nothing but the C library. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef enum lp_status {
  LP_OK = 0,
  LP_ERR_NOMEM,       /* an allocation failed */
  LP_ERR_ARG,         /* a caller passed something out of range */
  LP_ERR_PARSE,       /* text (action, CSV, JSON, numbers) did not parse */
  LP_ERR_INVALID,     /* a schedule or plan failed validation */
  LP_ERR_IO,          /* a file could not be read or written */
  LP_ERR_UNSUPPORTED, /* not built in (e.g. CUDA without nvcc) */
  LP_ERR_COMM,        /* a communication backend failed */
  LP_ERR_TIMEOUT,     /* the watchdog fired */
  LP_ERR_INTERNAL     /* a bug: an invariant did not hold */
} lp_status;

/* Returns a static, human-readable name for a status ("out of memory"). */
const char *lp_strerror(lp_status st);

/* ---- allocation hooks -------------------------------------------------
 * Every allocation in the core goes through these so tests can inject
 * out-of-memory failures. lp_realloc(p, 0) frees and returns NULL. */
typedef void *(*lp_alloc_fn)(void *ud, void *ptr, size_t size);
void lp_set_allocator(lp_alloc_fn fn, void *ud); /* NULL restores malloc */
void *lp_malloc(size_t size);
void *lp_calloc(size_t n, size_t size);
void *lp_realloc(void *ptr, size_t size);
void lp_free(void *ptr);
char *lp_strdup(const char *s);

/* ---- growable byte buffer (for text and JSON output) ----------------- */
typedef struct lp_buf {
  char *data; /* NUL-terminated while ok */
  size_t len, cap;
  int failed; /* set once an allocation failed; further appends are ignored */
} lp_buf;
void lp_buf_init(lp_buf *b);
void lp_buf_free(lp_buf *b);
void lp_buf_append(lp_buf *b, const char *s, size_t n);
void lp_buf_puts(lp_buf *b, const char *s);
void lp_buf_printf(lp_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string literal, with quotes and escapes. */
void lp_buf_json_string(lp_buf *b, const char *s);
/* Hands the data to the caller (who frees it with lp_free); NULL on
 * allocation failure. The buffer is left empty. */
char *lp_buf_take(lp_buf *b);

/* ---- atomic file writes -----------------------------------------------
 * lp_file_begin creates "<path>.tmp"; lp_file_put appends to it (a failed
 * write is remembered and reported by commit); lp_file_commit flushes,
 * fsyncs, renames it over path and fsyncs the directory; lp_file_abort
 * removes it. Both free f. path is untouched unless commit succeeds.
 * An existing path that is not a regular file or folder (/dev/null,
 * /dev/stdout, a FIFO) is written in place instead (no temporary, nothing
 * renamed: a device is never replaced by a file); a symbolic link to a
 * regular file is replaced at its target (the link stays).
 * Errors name the user's path P, never the temporary: "cannot create P:
 * reason" ("there is no folder D" when P's folder is missing; the
 * temporary is named only when its own name is in the way), "writing P
 * failed: reason (P is unchanged)", "cannot replace P: reason". */
typedef struct lp_file lp_file;
lp_status lp_file_begin(const char *path, lp_file **out, char *err);
void lp_file_put(lp_file *f, const void *data, size_t n);
lp_status lp_file_commit(lp_file *f, char *err);
void lp_file_abort(lp_file *f);
/* Writes data to path through lp_file_begin/put/commit. */
lp_status lp_write_file_atomic(const char *path, const void *data, size_t n,
                               char *err);

/* ---- error text -------------------------------------------------------
 * Contexts keep their last error in a fixed buffer: formatting never
 * allocates, so it works after an out-of-memory failure. A NULL dst is
 * allowed (the text is dropped). */
#define LP_ERRLEN 512
/* "s" unless n is 1: "%d rank%s", n, LP_PLURAL(n) reads "1 rank", "2 ranks". */
#define LP_PLURAL(n) ((n) == 1 ? "" : "s")
void lp_errf(char *dst, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- logging ---------------------------------------------------------- */
typedef enum { LP_LOG_ERROR, LP_LOG_WARN, LP_LOG_INFO, LP_LOG_DEBUG } lp_log_level;
void lp_log(lp_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
lp_log_level lp_log_threshold(void); /* from LUAPIPE_LOG (error|warn|info|debug) */

/* Check macros (NCCL style): return on failure, or jump to `fail`. Both
 * leave a debug-level trail "-> code at file:line". */
#define LP_CHECK(call)                                                         \
  do {                                                                         \
    lp_status st_ = (call);                                                    \
    if (st_ != LP_OK) {                                                        \
      lp_log(LP_LOG_DEBUG, "-> %d at %s:%d", (int)st_, __FILE__, __LINE__);   \
      return st_;                                                              \
    }                                                                          \
  } while (0)
#define LP_CHECK_GOTO(call, st, label)                                         \
  do {                                                                         \
    (st) = (call);                                                             \
    if ((st) != LP_OK) {                                                       \
      lp_log(LP_LOG_DEBUG, "-> %d at %s:%d", (int)(st), __FILE__, __LINE__);  \
      goto label;                                                              \
    }                                                                          \
  } while (0)

/* ---- environment knobs -------------------------------------------------
 * Declared once here; each reads its LUAPIPE_* variable on first use.
 * The README lists them. */
typedef struct lp_env_knob {
  const char *name;    /* "LUAPIPE_TIMEOUT" */
  const char *deflt;   /* default as text */
  const char *summary; /* one line for the README and `luapipe help env` */
} lp_env_knob;
const lp_env_knob *lp_env_knobs(int *count);
/* Integer / double value of a knob (default when unset or unparsable). */
long lp_env_int(const char *name, long deflt);
double lp_env_double(const char *name, double deflt);
/* Checks the knobs with a fixed form (LUAPIPE_LOG, LUAPIPE_TIMEOUT,
 * LUAPIPE_COMM_THREAD, LUAPIPE_COLOR, LUAPIPE_COMM, LUAPIPE_TF32,
 * LUAPIPE_CUDA_SYNC): LP_OK, or LP_ERR_ARG with a message naming the
 * variable, its value and what it takes. */
lp_status lp_env_check(char *err);

/* Monotonic wall clock in seconds. */
double lp_now(void);
/* Sleeps until lp_now() >= t (returns at once when t has passed). */
void lp_sleep_until(double t);

/* ---- emulated link ----------------------------------------------------
 * One cost model for the comm layer's emulated link (LUAPIPE_LINK,
 * lp_comm_set_link) and the simulator's --link: a message of B bytes takes
 * latency_s + B / bytes_per_s seconds (bytes_per_s 0: unlimited). Text
 * form: comma-separated fields "lat=<number><us|ms|s>" and
 * "bw=<number><GB/s|MB/s|KB/s|B/s>" (decimal units: 1 GB = 1e9 bytes), in
 * any order, each at most once, e.g. "lat=50us,bw=2GB/s"; a missing field
 * is 0 (no latency) / unlimited. "" and "none" are the zero link. */
typedef struct lp_link {
  double latency_s;   /* >= 0 */
  double bytes_per_s; /* > 0, or 0 for unlimited */
} lp_link;
/* Parses text into *out (zeroed on failure). LP_ERR_PARSE with the reason
 * in err (LP_ERRLEN), naming the field and the accepted units, e.g.
 * "link 'lat=5,bw=1GB/s': lat=5 needs a unit (us, ms or s)". */
lp_status lp_link_parse(const char *text, lp_link *out, char *err);
/* latency_s + bytes / bytes_per_s (0 for a NULL link). */
double lp_link_time(const lp_link *l, double bytes);
/* Time of an all-to-all-v on link l for one rank that sends bytes_out to
 * and receives bytes_in from other ranks (the self piece excluded): each
 * rank's link serialises its own traffic, both directions at once, so
 * latency + max(bytes_out, bytes_in) / bandwidth; 0 when nothing moves. */
double lp_link_alltoallv_time(const lp_link *l, double bytes_out, double bytes_in);
/* Time of a ring all-reduce of `bytes` over `ranks` ranks on link l (what a
 * DP group's gradient sum costs): 2 (ranks - 1) steps, each moving
 * bytes / ranks, so 2 (ranks - 1) x lp_link_time(l, bytes / ranks); 0 for
 * one rank or no bytes. */
double lp_link_allreduce_time(const lp_link *l, int ranks, double bytes);
/* 1 when l models any cost (latency or limited bandwidth). */
int lp_link_active(const lp_link *l);
/* Writes the canonical text of l ("lat=50us,bw=2GB/s", "none"). */
void lp_link_format(const lp_link *l, char *buf, size_t size);

#define LP_VERSION "0.1.0"

/* ---- optional modules (the CUDA and NCCL backends) ----------------------
 * The backends that need big shared libraries (cuBLAS, NCCL) are built as
 * modules that the program opens on first use, so that a CPU run maps none
 * of those libraries. lp_module_open opens `file` (e.g. "luapipe_cuda.so")
 * with dlopen (every symbol resolved at once; its symbols kept to itself),
 * looking, in this order, next to the running program (/proc/self/exe: the
 * build tree, where the program and its modules lie side by side) and in
 * <program dir>/../lib/luapipe (an installed tree: cmake --install). The
 * handle is never closed. NULL on failure, with one line in err
 * (LP_ERRLEN): the paths tried when none exists, or the path and the
 * dynamic loader's reason (e.g. "libcublas.so.13: cannot open shared
 * object file") when one exists but cannot be loaded. path (path_len
 * bytes, may be NULL) gets the file opened. */
void *lp_module_open(const char *file, char *path, size_t path_len, char *err);
/* The directory of the running program (from /proc/self/exe) into dir; ""
 * when unknown. */
void lp_program_dir(char *dir, size_t n);
/* The address of symbol `name` of an opened module (NULL when missing). */
void *lp_module_symbol(void *handle, const char *name);
