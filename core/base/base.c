/* base.c — status text, allocation hooks, buffers, logging, env knobs. */
#define _XOPEN_SOURCE 700 /* realpath, with POSIX 2008 */
#include "lp_base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *lp_strerror(lp_status st) {
  switch (st) {
  case LP_OK: return "ok";
  case LP_ERR_NOMEM: return "out of memory";
  case LP_ERR_ARG: return "invalid argument";
  case LP_ERR_PARSE: return "parse error";
  case LP_ERR_INVALID: return "invalid";
  case LP_ERR_IO: return "i/o error";
  case LP_ERR_UNSUPPORTED: return "unsupported in this build";
  case LP_ERR_COMM: return "communication error";
  case LP_ERR_TIMEOUT: return "timed out";
  case LP_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

/* ---- allocation ---- */

static lp_alloc_fn alloc_fn;
static void *alloc_ud;

void lp_set_allocator(lp_alloc_fn fn, void *ud) {
  alloc_fn = fn;
  alloc_ud = ud;
}

void *lp_realloc(void *ptr, size_t size) {
  if (alloc_fn) return alloc_fn(alloc_ud, ptr, size);
  if (size == 0) {
    free(ptr);
    return NULL;
  }
  return realloc(ptr, size);
}

void *lp_malloc(size_t size) { return lp_realloc(NULL, size ? size : 1); }

void *lp_calloc(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  void *p = lp_malloc(n * size);
  if (p && n * size > 0) memset(p, 0, n * size);
  return p;
}

void lp_free(void *ptr) {
  if (ptr) lp_realloc(ptr, 0);
}

char *lp_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = lp_malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* ---- buffers ---- */

void lp_buf_init(lp_buf *b) { memset(b, 0, sizeof *b); }

void lp_buf_free(lp_buf *b) {
  lp_free(b->data);
  lp_buf_init(b);
}

static int buf_reserve(lp_buf *b, size_t extra) {
  if (b->failed) return 0;
  if (b->len + extra + 1 <= b->cap) return 1;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) cap *= 2;
  char *d = lp_realloc(b->data, cap);
  if (!d) {
    b->failed = 1;
    return 0;
  }
  b->data = d;
  b->cap = cap;
  return 1;
}

void lp_buf_append(lp_buf *b, const char *s, size_t n) {
  if (!buf_reserve(b, n)) return;
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void lp_buf_puts(lp_buf *b, const char *s) { lp_buf_append(b, s, strlen(s)); }

void lp_buf_printf(lp_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !buf_reserve(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void lp_buf_json_string(lp_buf *b, const char *s) {
  lp_buf_append(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    switch (c) {
    case '"': lp_buf_puts(b, "\\\""); break;
    case '\\': lp_buf_puts(b, "\\\\"); break;
    case '\n': lp_buf_puts(b, "\\n"); break;
    case '\r': lp_buf_puts(b, "\\r"); break;
    case '\t': lp_buf_puts(b, "\\t"); break;
    default:
      if (c < 0x20) lp_buf_printf(b, "\\u%04x", c);
      else lp_buf_append(b, (const char *)&c, 1);
    }
  }
  lp_buf_append(b, "\"", 1);
}

char *lp_buf_take(lp_buf *b) {
  char *d = NULL;
  if (!b->failed) {
    if (!b->data) buf_reserve(b, 0);
    d = b->failed ? NULL : b->data;
    if (d) b->data[b->len] = '\0';
  }
  if (!d) lp_free(b->data);
  lp_buf_init(b);
  return d;
}

/* ---- atomic file writes ---- */

struct lp_file {
  FILE *f;
  int bad;    /* errno of the first failed write */
  char *path; /* as the caller named it (for messages) */
  char *dest; /* the file replaced: path, or the target of a symbolic link */
  char *tmp;  /* dest + ".tmp"; NULL when dest is written in place */
};

static void file_release(lp_file *f) {
  if (f->f) fclose(f->f);
  lp_free(f->path);
  lp_free(f->dest);
  lp_free(f->tmp);
  lp_free(f);
}

lp_status lp_file_begin(const char *path, lp_file **out, char *err) {
  *out = NULL;
  /* An existing path that is not a regular file or folder (a device such
   * as /dev/null or /dev/stdout, a FIFO) is written in place: renaming a
   * temporary over it would replace the device with a file. A symbolic
   * link to a regular file is replaced at its target, so the link stays. */
  struct stat st, lst;
  int exists = stat(path, &st) == 0;
  int direct = exists && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
  char *real = NULL;
  if (exists && S_ISREG(st.st_mode) && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))
    real = realpath(path, NULL);
  lp_file *f = lp_calloc(1, sizeof *f);
  if (f) f->path = lp_strdup(path);
  if (f) f->dest = lp_strdup(real ? real : path);
  free(real);
  size_t n = f && f->dest ? strlen(f->dest) : 0;
  if (f && f->dest && !direct) f->tmp = lp_malloc(n + 5);
  if (!f || !f->path || !f->dest || (!direct && !f->tmp)) {
    if (f) file_release(f);
    lp_errf(err, "%s: out of memory", path);
    return LP_ERR_NOMEM;
  }
  if (f->tmp) {
    memcpy(f->tmp, f->dest, n);
    memcpy(f->tmp + n, ".tmp", 5);
  }
  f->f = fopen(f->tmp ? f->tmp : f->dest, "wb");
  if (!f->f) {
    int e = errno;
    const char *slash = strrchr(path, '/');
    if (e == ENOENT && slash && slash > path)
      lp_errf(err, "cannot create %s: there is no folder %.*s", path,
              (int)(slash - path), path);
    else if (e == EACCES || e == EROFS || e == ENOTDIR || e == ENOENT || !f->tmp)
      lp_errf(err, "cannot create %s: %s", path, strerror(e));
    else /* the temporary's own name is in the way (a folder, say) */
      lp_errf(err, "cannot create %s (through %s): %s", path, f->tmp, strerror(e));
    file_release(f);
    return LP_ERR_IO;
  }
  *out = f;
  return LP_OK;
}

void lp_file_put(lp_file *f, const void *data, size_t n) {
  if (f->bad || n == 0) return;
  errno = 0;
  if (fwrite(data, 1, n, f->f) != n) f->bad = errno ? errno : EIO;
}

void lp_file_abort(lp_file *f) {
  if (!f) return;
  if (f->f) fclose(f->f);
  f->f = NULL;
  if (f->tmp) remove(f->tmp);
  file_release(f);
}

/* fsync of the directory holding path, which makes a rename durable.
 * Errors are ignored: some file systems refuse fsync on a directory. */
static void sync_dir_of(const char *path) {
  char d[4096];
  snprintf(d, sizeof d, "%s", path);
  char *slash = strrchr(d, '/');
  if (!slash) snprintf(d, sizeof d, ".");
  else if (slash == d) d[1] = '\0';
  else *slash = '\0';
  int fd = open(d, O_RDONLY);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
}

lp_status lp_file_commit(lp_file *f, char *err) {
  if (!f->bad && fflush(f->f) != 0) f->bad = errno ? errno : EIO;
  if (!f->bad && f->tmp && fsync(fileno(f->f)) != 0 && errno != EINVAL && errno != EROFS)
    f->bad = errno;
  if (fclose(f->f) != 0 && !f->bad) f->bad = errno ? errno : EIO;
  f->f = NULL;
  if (f->bad) {
    lp_errf(err, "writing %s failed: %s (%s is unchanged)", f->path,
            strerror(f->bad), f->path);
    lp_file_abort(f);
    return LP_ERR_IO;
  }
  if (f->tmp && rename(f->tmp, f->dest) != 0) {
    lp_errf(err, "cannot replace %s: %s", f->path, strerror(errno));
    lp_file_abort(f);
    return LP_ERR_IO;
  }
  if (f->tmp) sync_dir_of(f->dest);
  file_release(f);
  return LP_OK;
}

lp_status lp_write_file_atomic(const char *path, const void *data, size_t n,
                               char *err) {
  lp_file *f;
  LP_CHECK(lp_file_begin(path, &f, err));
  lp_file_put(f, data, n);
  return lp_file_commit(f, err);
}

/* ---- errors and logging ---- */

void lp_errf(char *dst, const char *fmt, ...) {
  if (!dst) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dst, LP_ERRLEN, fmt, ap);
  va_end(ap);
}

static const char *level_names[] = {"error", "warn", "info", "debug"};

lp_log_level lp_log_threshold(void) {
  static int cached = -1;
  if (cached < 0) {
    cached = LP_LOG_WARN;
    const char *v = getenv("LUAPIPE_LOG");
    for (int i = 0; v && i < 4; i++)
      if (strcmp(v, level_names[i]) == 0) cached = i;
  }
  return (lp_log_level)cached;
}

void lp_log(lp_log_level lvl, const char *fmt, ...) {
  if (lvl > lp_log_threshold()) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "luapipe %s: ", level_names[lvl]);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* ---- env knobs ---- */

static const lp_env_knob knobs[] = {
    {"LUAPIPE_LOG", "warn", "log level on stderr: error, warn, info or debug"},
    {"LUAPIPE_LUA_PATH", "", "extra directory searched first for luapipe's Lua modules"},
    {"LUAPIPE_TIMEOUT", "300",
     "watchdog: seconds a rank may wait on a message before every rank aborts"},
    {"LUAPIPE_HISTORY", "~/.luapipe_history", "REPL history file (empty disables history)"},
    {"LUAPIPE_LINK", "none",
     "emulated link for every message, e.g. lat=50us,bw=2GB/s (see lp_comm.h)"},
    {"LUAPIPE_COMM_THREAD", "1",
     "0 turns off the MPI progress thread (communication then progresses only while a rank waits)"},
    {"LUAPIPE_COMM", "",
     "device buffers: nccl or mpi (staged through pinned host memory); unset: NCCL when every rank "
     "has its own GPU"},
    {"LUAPIPE_TF32", "0",
     "1 lets CUDA float32 GEMMs use TF32 tensor cores (faster, ~1e-3 relative error)"},
    {"LUAPIPE_CUDA_SYNC", "0",
     "1 waits after every CUDA op, so an error names the op that raised it (debugging)"},
    {"LUAPIPE_BF16_FALLBACK", "0",
     "1 runs CPU bf16 GEMMs on the float32 fallback even where oneDNN could (tests, comparisons)"},
    {"LUAPIPE_F32_GEMM", "openblas",
     "CPU float32 GEMMs: openblas, onednn, or auto (oneDNN where OpenBLAS has only generic kernels "
     "for the CPU)"},
    {"LUAPIPE_DP_BUCKET", "65536",
     "floats of a data-parallel gradient bucket: a stage's layers summed over dp by one "
     "all-reduce, started when their weight-grads are done"},
    {"LUAPIPE_BLAS_CORE", "auto",
     "auto: when OpenBLAS does not know the CPU and fell back to its oldest kernels, the program "
     "restarts itself with OPENBLAS_CORETYPE for the CPU's AVX-512/AVX2; keep: never "
     "(OPENBLAS_CORETYPE, when set, always wins)"},
};

const lp_env_knob *lp_env_knobs(int *count) {
  *count = (int)(sizeof knobs / sizeof knobs[0]);
  return knobs;
}

long lp_env_int(const char *name, long deflt) {
  const char *v = getenv(name);
  if (!v || !*v) return deflt;
  char *end;
  long x = strtol(v, &end, 10);
  return *end ? deflt : x;
}

double lp_env_double(const char *name, double deflt) {
  const char *v = getenv(name);
  if (!v || !*v) return deflt;
  char *end;
  double x = strtod(v, &end);
  return *end ? deflt : x;
}

/* The knobs that take one of a few words, and the hint for a typo. */
static const struct {
  const char *name, *values[5], *hint;
} choice_knobs[] = {
    {"LUAPIPE_LOG", {"error", "warn", "info", "debug", NULL}, "use error, warn, info or debug"},
    {"LUAPIPE_COMM_THREAD", {"0", "1", NULL}, "use 0 (off) or 1 (on)"},
    {"LUAPIPE_COLOR", {"auto", "always", "never", NULL}, "use auto, always or never"},
    {"LUAPIPE_COMM", {"nccl", "mpi", NULL}, "use nccl or mpi"},
    {"LUAPIPE_TF32", {"0", "1", NULL}, "use 0 (off) or 1 (on)"},
    {"LUAPIPE_CUDA_SYNC", {"0", "1", NULL}, "use 0 (off) or 1 (on)"},
    {"LUAPIPE_BF16_FALLBACK", {"0", "1", NULL}, "use 0 (off) or 1 (on)"},
    {"LUAPIPE_F32_GEMM", {"openblas", "onednn", "auto", NULL}, "use openblas, onednn or auto"},
    {"LUAPIPE_BLAS_CORE", {"auto", "keep", NULL},
     "use auto (a kernel set for this CPU when OpenBLAS does not know it) or keep"},
};

/* Checks the LUAPIPE_* knobs whose value has a fixed form, so a typo is
 * an error instead of the default taken in silence (LUAPIPE_LINK is
 * checked where it is parsed, lp_comm_mpi_init). */
lp_status lp_env_check(char *err) {
  for (size_t k = 0; k < sizeof choice_knobs / sizeof choice_knobs[0]; k++) {
    const char *v = getenv(choice_knobs[k].name);
    if (!v || !*v) continue;
    int ok = 0;
    for (int i = 0; choice_knobs[k].values[i]; i++) ok |= strcmp(v, choice_knobs[k].values[i]) == 0;
    if (!ok) {
      lp_errf(err, "%s='%s': %s", choice_knobs[k].name, v, choice_knobs[k].hint);
      return LP_ERR_ARG;
    }
  }
  const char *v = getenv("LUAPIPE_TIMEOUT");
  if (v && *v) {
    char *end;
    double x = strtod(v, &end);
    if (*end || !(x >= 0 && x <= 1e9)) { /* false for NaN */
      lp_errf(err, "LUAPIPE_TIMEOUT='%s': must be a number of seconds from 0 to 1e9 "
                   "(0: no watchdog)", v);
      return LP_ERR_ARG;
    }
  }
  return LP_OK;
}

double lp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
