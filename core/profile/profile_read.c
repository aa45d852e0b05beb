/* profile_read.c — the streaming trace reader: zlib's gzread (plain files
 * pass through it unchanged) feeding yajl's event parser; only the events
 * the analysis needs are kept (GPU operations, runtime calls with a
 * correlation id, user annotations, a luapipe trace's slices). */
#define _GNU_SOURCE /* strverscmp */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yajl/yajl_parse.h>
#include <zlib.h>

#include "profile_internal.h"

#define RD_CHUNK (256 * 1024)
#define RD_MAX_DEPTH 512
#define RD_NAME_MAX 65536 /* longer names are cut there */

/* containers on the reader's stack */
enum { C_TOP, C_EVENTS, C_EVENT, C_ARGS, C_DIST, C_SKIP };
/* keys the reader knows */
enum {
  K_OTHER = 0, K_EVENTS, K_DIST, K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ARGS,
  K_STREAM, K_CORR, K_DEVICE, K_RANK
};

/* a field that is a number: 0 absent, 1 parsed, 2 present but not a
 * number or out of range */
typedef struct num_field {
  int state;
  int64_t v;
} num_field;

typedef struct rd_event {
  char ph;
  char cat[32];
  int cat_cut;
  char *name;
  size_t name_len, name_cap;
  int has_name;
  num_field ts, dur, stream, corr, device;
  int64_t pid, tid;
  int pid_num; /* pid is a number (not a string) */
  char arg_name[32];
} rd_event;

typedef struct rd {
  lp_profile *p;
  pf_file *f;
  int fi;
  unsigned char stack[RD_MAX_DEPTH];
  unsigned char key[RD_MAX_DEPTH]; /* last key of the map at each depth */
  int depth;
  int started;
  int saw_events;
  int64_t index; /* the event being read: traceEvents[index] */
  rd_event ev;
  lp_status st; /* set with p->err when a callback stops the parse */
  int64_t bytes_before; /* bytes given to yajl before the current chunk */
} rd;

/* ---- numbers ---------------------------------------------------------- */

/* Microseconds as text ("1740461679471346", "12.345", "-3", "1.5e3") to
 * integer nanoseconds, exactly for up to 3 decimals (rounded beyond).
 * Returns 0 on success, -1 when out of range. */
static int parse_us(const char *s, size_t n, int64_t *out) {
  size_t i = 0;
  int neg = 0;
  if (i < n && s[i] == '-') { neg = 1; i++; }
  int64_t ip = 0;
  for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
    if (ip > (INT64_MAX / 1000 - 9) / 10) return -1;
    ip = ip * 10 + (s[i] - '0');
  }
  int64_t frac = 0;
  int fd = 0, round = 0;
  if (i < n && s[i] == '.') {
    for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
      if (fd < 3) frac = frac * 10 + (s[i] - '0');
      else if (fd == 3) round = s[i] >= '5';
      fd++;
    }
    for (; fd < 3; fd++) frac *= 10;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    char tmp[64];
    if (n >= sizeof tmp) return -1;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    double d = strtod(tmp, NULL) * 1000.0;
    if (!(d > -9.2e18 && d < 9.2e18)) return -1;
    *out = (int64_t)(d < 0 ? d - 0.5 : d + 0.5);
    return 0;
  }
  int64_t v = ip * 1000 + frac + round;
  *out = neg ? -v : v;
  return 0;
}

/* An integer field (stream, correlation, pid): decimals are cut. */
static int parse_int(const char *s, size_t n, int64_t *out) {
  size_t i = 0;
  int neg = 0;
  if (i < n && s[i] == '-') { neg = 1; i++; }
  int64_t v = 0;
  for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
    if (v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (s[i] - '0');
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    char tmp[64];
    if (n >= sizeof tmp) return -1;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    double d = strtod(tmp, NULL);
    if (!(d > -9.2e18 && d < 9.2e18)) return -1;
    v = (int64_t)d;
    neg = 0;
  }
  *out = neg ? -v : v;
  return 0;
}

/* a string pid/tid: a hash with bit 62 set, apart from any number */
static int64_t str_id(const unsigned char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  return (int64_t)((h & 0x3fffffffffffffffull) | 0x4000000000000000ull);
}

/* ---- errors ----------------------------------------------------------- */

static void ev_label(rd *r, char *dst, size_t cap) {
  if (r->ev.has_name && r->ev.name_len) {
    char nm[64];
    size_t k = r->ev.name_len < 40 ? r->ev.name_len : 40;
    memcpy(nm, r->ev.name, k);
    nm[k] = 0;
    for (size_t i = 0; i < k; i++)
      if ((unsigned char)nm[i] < 32) nm[i] = ' ';
    snprintf(dst, cap, " (\"%s%s\")", nm, r->ev.name_len > 40 ? "..." : "");
  } else {
    dst[0] = 0;
  }
}

static int fail_event(rd *r, const char *what) {
  char lab[96];
  ev_label(r, lab, sizeof lab);
  lp_errf(r->p->err, "%s: traceEvents[%lld]%s: %s", r->f->path, (long long)r->index, lab, what);
  r->st = LP_ERR_PARSE;
  return 0;
}

static int fail_file(rd *r, lp_status st, const char *what) {
  lp_errf(r->p->err, "%s: %s", r->f->path, what);
  r->st = st;
  return 0;
}

static int nomem(rd *r) { return fail_file(r, LP_ERR_NOMEM, "out of memory reading the trace"); }

/* ---- growable arrays -------------------------------------------------- */

int pf_grow(void **ptr, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return 0;
  int64_t nc = *cap ? *cap * 2 : 1024;
  while (nc < need) nc *= 2;
  void *np = lp_realloc(*ptr, (size_t)nc * elem);
  if (!np) return -1;
  *ptr = np;
  *cap = nc;
  return 0;
}

/* ---- the event, field by field ---------------------------------------- */

static void ev_reset(rd_event *e) {
  e->ph = 0;
  e->cat[0] = 0;
  e->cat_cut = 0;
  e->name_len = 0;
  e->has_name = 0;
  e->ts.state = e->dur.state = e->stream.state = e->corr.state = e->device.state = 0;
  e->pid = e->tid = 0;
  e->pid_num = 0;
  e->arg_name[0] = 0;
}

static int cat_is(const rd_event *e, const char *s) { return strcmp(e->cat, s) == 0; }

/* Runtime calls that never put an operation on the GPU (event queries
 * and waits, synchronisation): not kept. */
static int never_launches(const char *name) {
  static const char *const prefixes[] = {"cudaEvent",          "cudaStreamWaitEvent",
                                         "cudaStreamSynchronize", "cudaDeviceSynchronize",
                                         "cudaStreamQuery",    "cudaGetLastError",
                                         "cudaPeekAtLastError", "cudaGetDevice",
                                         "cudaSetDevice",      "cudaStreamIsCapturing",
                                         NULL};
  for (int i = 0; prefixes[i]; i++)
    if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) return 1;
  return 0;
}

/* A finished event: keeps what the analysis needs. */
static int ev_finish(rd *r) {
  rd_event *e = &r->ev;
  lp_profile *p = r->p;
  if (e->ph == 'M') {
    /* process_name "rank N" for pid N: a trace luapipe wrote */
    if (e->has_name && e->name_len == 12 && memcmp(e->name, "process_name", 12) == 0 &&
        e->pid_num) {
      char want[32];
      snprintf(want, sizeof want, "rank %lld", (long long)e->pid);
      if (strcmp(want, e->arg_name) == 0) r->f->luapipe = 1;
    }
    return 1;
  }
  if (e->ph != 'X') return 1;
  if (e->ts.state == 0) return fail_event(r, "a complete event (\"ph\": \"X\") without \"ts\"");
  if (e->ts.state == 2) return fail_event(r, "\"ts\" is not a number in range");
  if (e->dur.state == 0) return fail_event(r, "a complete event (\"ph\": \"X\") without \"dur\"");
  if (e->dur.state == 2) return fail_event(r, "\"dur\" is not a number in range");
  if (e->dur.v < 0) {
    char m[80];
    snprintf(m, sizeof m, "negative \"dur\" (%.3f us)", (double)e->dur.v / 1000.0);
    return fail_event(r, m);
  }
  if (e->ts.v > INT64_MAX / 2 || e->ts.v < -(INT64_MAX / 2) || e->dur.v > INT64_MAX / 4)
    return fail_event(r, "\"ts\" or \"dur\" is out of range");
  const char *name = e->has_name ? e->name : "";
  size_t nlen = e->has_name ? e->name_len : 0;
  int gpu = cat_is(e, "kernel") || cat_is(e, "gpu_memcpy") || cat_is(e, "gpu_memset");
  if (gpu || (r->f->luapipe && e->pid_num && e->cat[0])) {
    if (pf_grow((void **)&p->ops, &p->ops_cap, p->nops + 1, sizeof *p->ops)) return nomem(r);
    int id = pf_names_intern(&p->names, e->cat, name, nlen);
    if (id < 0) return nomem(r);
    pf_op *o = &p->ops[p->nops++];
    o->start = e->ts.v;
    o->end = e->ts.v + e->dur.v;
    o->corr = gpu && e->corr.state == 1 ? e->corr.v : -1;
    o->name = id;
    o->file = r->fi;
    if (gpu) {
      o->device = e->device.state == 1 ? (int)e->device.v : (int)e->pid;
      o->stream = e->stream.state == 1 ? (int)e->stream.v : (int)e->tid;
    } else {
      o->device = (int)e->pid;
      o->stream = (int)e->tid;
    }
    p->names.e[id].ops++;
    p->names.e[id].total += e->dur.v;
    return 1;
  }
  if ((cat_is(e, "cuda_runtime") || cat_is(e, "cuda_driver")) && e->corr.state == 1 &&
      !never_launches(name)) {
    if (pf_grow((void **)&p->calls, &p->calls_cap, p->ncalls + 1, sizeof *p->calls))
      return nomem(r);
    pf_call *c = &p->calls[p->ncalls++];
    c->corr = e->corr.v;
    c->ts = e->ts.v;
    c->pid = e->pid;
    c->tid = e->tid;
    c->file = r->fi;
    return 1;
  }
  if (cat_is(e, "user_annotation")) {
    if (pf_grow((void **)&p->anns, &p->anns_cap, p->nanns + 1, sizeof *p->anns)) return nomem(r);
    int id = pf_names_intern(&p->ann_names, "", name, nlen);
    if (id < 0) return nomem(r);
    pf_ann *a = &p->anns[p->nanns++];
    a->start = e->ts.v;
    a->end = e->ts.v + e->dur.v;
    a->pid = e->pid;
    a->tid = e->tid;
    a->name = id;
    a->file = r->fi;
    return 1;
  }
  return 1;
}

/* ---- yajl callbacks --------------------------------------------------- */

static int key_id(int container, const unsigned char *k, size_t n) {
#define IS(s) (n == sizeof(s) - 1 && memcmp(k, s, n) == 0)
  switch (container) {
  case C_TOP:
    if (IS("traceEvents")) return K_EVENTS;
    if (IS("distributedInfo")) return K_DIST;
    return K_OTHER;
  case C_EVENT:
    switch (n) {
    case 2:
      if (IS("ph")) return K_PH;
      if (IS("ts")) return K_TS;
      break;
    case 3:
      if (IS("cat")) return K_CAT;
      if (IS("pid")) return K_PID;
      if (IS("tid")) return K_TID;
      if (IS("dur")) return K_DUR;
      break;
    case 4:
      if (IS("name")) return K_NAME;
      if (IS("args")) return K_ARGS;
      break;
    }
    return K_OTHER;
  case C_ARGS:
    if (IS("stream")) return K_STREAM;
    if (IS("correlation")) return K_CORR;
    if (IS("device")) return K_DEVICE;
    if (IS("name")) return K_NAME;
    return K_OTHER;
  case C_DIST:
    if (IS("rank")) return K_RANK;
    return K_OTHER;
  }
  return K_OTHER;
#undef IS
}

static int cb_map_key(void *ctx, const unsigned char *k, size_t n) {
  rd *r = ctx;
  int c = r->stack[r->depth - 1];
  r->key[r->depth - 1] = c == C_SKIP || c == C_EVENTS ? K_OTHER : (unsigned char)key_id(c, k, n);
  return 1;
}

/* Where a value lands: the container on top and its current key. */
static int top(rd *r) { return r->depth ? r->stack[r->depth - 1] : -1; }
static int cur_key(rd *r) { return r->depth ? r->key[r->depth - 1] : K_OTHER; }

static int push(rd *r, int c) {
  if (r->depth >= RD_MAX_DEPTH) return fail_file(r, LP_ERR_PARSE, "JSON nested too deep");
  r->stack[r->depth] = (unsigned char)c;
  r->key[r->depth] = K_OTHER;
  r->depth++;
  return 1;
}

/* a scalar where a container was required */
static int scalar_checks(rd *r) {
  int c = top(r);
  if (c < 0) return fail_file(r, LP_ERR_PARSE, "not a trace: the JSON is not an object");
  if (c == C_TOP && cur_key(r) == K_EVENTS)
    return fail_file(r, LP_ERR_PARSE, "not a trace: \"traceEvents\" is not an array");
  if (c == C_EVENTS) {
    char m[96];
    snprintf(m, sizeof m, "not a trace: traceEvents[%lld] is not an object", (long long)r->index);
    return fail_file(r, LP_ERR_PARSE, m);
  }
  return 1;
}

static void set_num(rd *r, num_field *f, const char *s, size_t n, int us) {
  int64_t v;
  if ((us ? parse_us(s, n, &v) : parse_int(s, n, &v)) != 0) {
    f->state = 2;
    return;
  }
  f->state = 1;
  f->v = v;
  (void)r;
}

static int cb_number(void *ctx, const char *s, size_t n) {
  rd *r = ctx;
  if (!scalar_checks(r)) return 0;
  int c = top(r), k = cur_key(r);
  rd_event *e = &r->ev;
  if (c == C_EVENT) {
    switch (k) {
    case K_TS: set_num(r, &e->ts, s, n, 1); break;
    case K_DUR: set_num(r, &e->dur, s, n, 1); break;
    case K_PID:
    case K_TID: {
      int64_t v = 0;
      if (parse_int(s, n, &v) != 0) v = str_id((const unsigned char *)s, n);
      if (k == K_PID) {
        e->pid = v;
        e->pid_num = 1;
      } else {
        e->tid = v;
      }
      break;
    }
    default: break;
    }
  } else if (c == C_ARGS) {
    switch (k) {
    case K_STREAM: set_num(r, &e->stream, s, n, 0); break;
    case K_CORR: set_num(r, &e->corr, s, n, 0); break;
    case K_DEVICE: set_num(r, &e->device, s, n, 0); break;
    default: break;
    }
  } else if (c == C_DIST && k == K_RANK) {
    int64_t v;
    if (parse_int(s, n, &v) == 0 && v >= 0 && v < (1 << 30)) r->f->dist_rank = (int)v;
  }
  return 1;
}

static int cb_string(void *ctx, const unsigned char *s, size_t n) {
  rd *r = ctx;
  if (!scalar_checks(r)) return 0;
  int c = top(r), k = cur_key(r);
  rd_event *e = &r->ev;
  if (c == C_EVENT) {
    switch (k) {
    case K_PH: e->ph = n == 1 ? (char)s[0] : '?'; break;
    case K_CAT: {
      size_t m = n < sizeof e->cat - 1 ? n : sizeof e->cat - 1;
      memcpy(e->cat, s, m);
      e->cat[m] = 0;
      e->cat_cut = m < n;
      if (e->cat_cut || memchr(s, 0, n)) e->cat[0] = '?'; /* no category of ours */
      break;
    }
    case K_NAME: {
      size_t m = n < RD_NAME_MAX ? n : RD_NAME_MAX;
      if (m + 1 > e->name_cap) {
        size_t nc = e->name_cap ? e->name_cap : 256;
        while (nc < m + 1) nc *= 2;
        char *np = lp_realloc(e->name, nc);
        if (!np) return nomem(r);
        e->name = np;
        e->name_cap = nc;
      }
      memcpy(e->name, s, m);
      e->name[m] = 0;
      e->name_len = m;
      e->has_name = 1;
      break;
    }
    case K_PID: e->pid = str_id(s, n); e->pid_num = 0; break;
    case K_TID: e->tid = str_id(s, n); break;
    case K_TS: e->ts.state = 2; break;
    case K_DUR: e->dur.state = 2; break;
    default: break;
    }
  } else if (c == C_ARGS && k == K_NAME) {
    size_t m = n < sizeof e->arg_name - 1 ? n : sizeof e->arg_name - 1;
    memcpy(e->arg_name, s, m);
    e->arg_name[m] = 0;
  }
  return 1;
}

static int cb_other(rd *r) {
  if (!scalar_checks(r)) return 0;
  if (top(r) == C_EVENT) {
    int k = cur_key(r);
    if (k == K_TS) r->ev.ts.state = 2;
    if (k == K_DUR) r->ev.dur.state = 2;
  }
  return 1;
}
static int cb_null(void *ctx) { return cb_other(ctx); }
static int cb_boolean(void *ctx, int b) {
  (void)b;
  return cb_other(ctx);
}

static int cb_start_map(void *ctx) {
  rd *r = ctx;
  int c = top(r), k = cur_key(r);
  if (c < 0) {
    r->started = 1;
    return push(r, C_TOP);
  }
  if (c == C_TOP && k == K_EVENTS)
    return fail_file(r, LP_ERR_PARSE, "not a trace: \"traceEvents\" is not an array");
  if (c == C_TOP && k == K_DIST) return push(r, C_DIST);
  if (c == C_EVENTS) {
    ev_reset(&r->ev);
    return push(r, C_EVENT);
  }
  if (c == C_EVENT && k == K_ARGS) return push(r, C_ARGS);
  return push(r, C_SKIP);
}

static int cb_end_map(void *ctx) {
  rd *r = ctx;
  int c = top(r);
  r->depth--;
  if (c == C_EVENT) {
    if (!ev_finish(r)) return 0;
    r->index++;
    r->p->events++;
  }
  return 1;
}

static int cb_start_array(void *ctx) {
  rd *r = ctx;
  int c = top(r), k = cur_key(r);
  if (c < 0) { /* the JSON Array Format: the events themselves */
    r->started = 1;
    r->saw_events = 1;
    return push(r, C_EVENTS);
  }
  if (c == C_TOP && k == K_EVENTS) {
    if (r->saw_events)
      return fail_file(r, LP_ERR_PARSE, "not a trace: two \"traceEvents\" arrays");
    r->saw_events = 1;
    return push(r, C_EVENTS);
  }
  if (c == C_EVENTS) {
    char m[96];
    snprintf(m, sizeof m, "not a trace: traceEvents[%lld] is not an object", (long long)r->index);
    return fail_file(r, LP_ERR_PARSE, m);
  }
  return push(r, C_SKIP);
}

static int cb_end_array(void *ctx) {
  rd *r = ctx;
  r->depth--;
  return 1;
}

static const yajl_callbacks rd_callbacks = {
    cb_null, cb_boolean, NULL, NULL, cb_number, cb_string, cb_start_map, cb_map_key,
    cb_end_map, cb_start_array, cb_end_array};

/* yajl's message (several lines with a pointer into the text) as one line */
static void yajl_line(yajl_handle h, const unsigned char *buf, size_t len, char *dst, size_t cap) {
  unsigned char *m = yajl_get_error(h, 0, buf, len);
  snprintf(dst, cap, "%s", m ? (const char *)m : "parse error");
  if (m) yajl_free_error(h, m);
  for (char *c = dst; *c; c++)
    if (*c == '\n' || *c == '\r') { *c = 0; break; }
  size_t n = strlen(dst);
  while (n && (dst[n - 1] == ' ' || dst[n - 1] == '.')) dst[--n] = 0;
}

/* ---- one file --------------------------------------------------------- */

/* gzerror's text without the "path: " zlib puts in front */
static const char *gz_message(gzFile gz, const char *path) {
  int zerr;
  const char *m = gzerror(gz, &zerr);
  if (!m || !*m) return "read error";
  size_t n = strlen(path);
  if (strncmp(m, path, n) == 0 && m[n] == ':' && m[n + 1] == ' ') m += n + 2;
  return m;
}

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static lp_status read_file(lp_profile *p, const char *path) {
  /* the magic bytes decide; a name ending in .gz must have them */
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    lp_errf(p->err, "%s: cannot open: %s", path, strerror(errno));
    return LP_ERR_IO;
  }
  unsigned char magic[2] = {0, 0};
  size_t got = fread(magic, 1, 2, fp);
  fclose(fp);
  int is_gz = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  if (ends_with(path, ".gz") && !is_gz) {
    lp_errf(p->err, "%s: not a gzip file (the name ends in .gz)", path);
    return LP_ERR_PARSE;
  }
  if (pf_grow((void **)&p->files, &p->files_cap, p->nfiles + 1, sizeof *p->files))
    return LP_ERR_NOMEM;
  char *pcopy = lp_strdup(path);
  if (!pcopy) return LP_ERR_NOMEM;
  pf_file *f = &p->files[p->nfiles];
  memset(f, 0, sizeof *f);
  f->path = pcopy;
  f->dist_rank = -1;
  f->order = (int)p->nfiles;
  p->nfiles++;

  rd *r = lp_calloc(1, sizeof *r);
  unsigned char *buf = lp_malloc(RD_CHUNK);
  gzFile gz = NULL;
  yajl_handle h = NULL;
  lp_status st = LP_OK;
  if (!r || !buf) {
    st = LP_ERR_NOMEM;
    lp_errf(p->err, "%s: out of memory", path);
    goto done;
  }
  r->p = p;
  r->f = f;
  r->fi = (int)p->nfiles - 1;
  gz = gzopen(path, "rb");
  if (!gz) {
    lp_errf(p->err, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    st = LP_ERR_IO;
    goto done;
  }
  gzbuffer(gz, RD_CHUNK);
  h = yajl_alloc(&rd_callbacks, NULL, r);
  if (!h) {
    st = LP_ERR_NOMEM;
    lp_errf(p->err, "%s: out of memory", path);
    goto done;
  }
  int64_t total = 0;
  for (;;) {
    int n = gzread(gz, buf, RD_CHUNK);
    if (n < 0) {
      lp_errf(p->err, "%s: damaged gzip data: %s", path, gz_message(gz, path));
      st = LP_ERR_PARSE;
      goto done;
    }
    if (n == 0) break;
    r->bytes_before = total;
    yajl_status ys = yajl_parse(h, buf, (size_t)n);
    total += n;
    if (ys != yajl_status_ok) {
      if (r->st != LP_OK) {
        st = r->st;
      } else {
        char m[256];
        yajl_line(h, buf, (size_t)n, m, sizeof m);
        lp_errf(p->err, "%s: not JSON: %s (at byte %lld)", path, m,
                (long long)(r->bytes_before + (int64_t)yajl_get_bytes_consumed(h)));
        st = LP_ERR_PARSE;
      }
      goto done;
    }
  }
  {
    int zerr = Z_OK;
    gzerror(gz, &zerr);
    if (zerr != Z_OK && zerr != Z_STREAM_END) {
      lp_errf(p->err, "%s: damaged gzip data: %s", path, gz_message(gz, path));
      st = LP_ERR_PARSE;
      goto done;
    }
  }
  p->bytes += total;
  if (!r->started && total == 0) {
    lp_errf(p->err, "%s: empty file", path);
    st = LP_ERR_PARSE;
    goto done;
  }
  yajl_status ys = yajl_complete_parse(h);
  if (ys != yajl_status_ok) {
    if (r->st != LP_OK) {
      st = r->st;
    } else {
      /* every chunk parsed (a fault inside the text stops yajl_parse, with
       * its position, above): only the end is missing */
      lp_errf(p->err, "%s: truncated: the JSON ends early (after %lld bytes)", path,
              (long long)total);
      st = LP_ERR_PARSE;
    }
    goto done;
  }
  if (!r->saw_events) {
    lp_errf(p->err, "%s: not a trace: no \"traceEvents\" array", path);
    st = LP_ERR_PARSE;
    goto done;
  }
  /* give back the growth slack of the arrays (the analysis allocates next) */
  if (p->nops && p->nops < p->ops_cap) {
    pf_op *o = lp_realloc(p->ops, (size_t)p->nops * sizeof *p->ops);
    if (o) {
      p->ops = o;
      p->ops_cap = p->nops;
    }
  }
  if (p->ncalls && p->ncalls < p->calls_cap) {
    pf_call *c = lp_realloc(p->calls, (size_t)p->ncalls * sizeof *p->calls);
    if (c) {
      p->calls = c;
      p->calls_cap = p->ncalls;
    }
  }
done:
  if (h) yajl_free(h);
  if (gz) gzclose(gz);
  if (r) lp_free(r->ev.name);
  lp_free(r);
  lp_free(buf);
  return st;
}

static int trace_name(const char *n) {
  return ends_with(n, ".json") || ends_with(n, ".json.gz");
}

static int cmp_names(const void *a, const void *b) {
  return strverscmp(*(char *const *)a, *(char *const *)b);
}

lp_status lp_profile_read(lp_profile *p, const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    lp_errf(p->err, "%s: cannot open: %s", path, strerror(errno));
    return LP_ERR_IO;
  }
  if (!S_ISDIR(sb.st_mode)) return read_file(p, path);
  DIR *d = opendir(path);
  if (!d) {
    lp_errf(p->err, "%s: cannot open the folder: %s", path, strerror(errno));
    return LP_ERR_IO;
  }
  char **names = NULL;
  int64_t n = 0, cap = 0;
  lp_status st = LP_OK;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.' || !trace_name(de->d_name)) continue;
    if (pf_grow((void **)&names, &cap, n + 1, sizeof *names) ||
        !(names[n] = lp_strdup(de->d_name))) {
      st = LP_ERR_NOMEM;
      lp_errf(p->err, "%s: out of memory", path);
      break;
    }
    n++;
  }
  closedir(d);
  if (st == LP_OK && n == 0) {
    lp_errf(p->err, "%s: no trace files (*.json, *.json.gz) in this folder", path);
    st = LP_ERR_IO;
  }
  if (st == LP_OK) qsort(names, (size_t)n, sizeof *names, cmp_names);
  for (int64_t i = 0; st == LP_OK && i < n; i++) {
    size_t len = strlen(path) + strlen(names[i]) + 2;
    char *full = lp_malloc(len);
    if (!full) {
      st = LP_ERR_NOMEM;
      break;
    }
    snprintf(full, len, "%s%s%s", path, ends_with(path, "/") ? "" : "/", names[i]);
    st = read_file(p, full);
    lp_free(full);
  }
  for (int64_t i = 0; i < n; i++) lp_free(names[i]);
  lp_free(names);
  return st;
}
