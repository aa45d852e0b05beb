/* profile.c — names, and the analysis of a rank's GPU operations: unions
 * of intervals per class and stream, communication overlapped by
 * computation, idle time, and phases (innermost user annotations) with
 * the operations they launched (matched by correlation id). */
#include <stdlib.h>
#include <string.h>

#include "profile_internal.h"

/* ---- names ------------------------------------------------------------ */

static uint64_t hash2(const char *cat, const char *name, size_t len) {
  uint64_t h = 1469598103934665603ull;
  for (const char *c = cat; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  h = (h ^ 0xff) * 1099511628211ull;
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)name[i]) * 1099511628211ull;
  return h;
}

static int names_rehash(pf_names *t, int64_t nslots) {
  int32_t *s = lp_calloc((size_t)nslots, sizeof *s);
  if (!s) return -1;
  for (int64_t i = 0; i < t->n; i++) {
    uint64_t j = t->e[i].hash & (uint64_t)(nslots - 1);
    while (s[j]) j = (j + 1) & (uint64_t)(nslots - 1);
    s[j] = (int32_t)(i + 1);
  }
  lp_free(t->slots);
  t->slots = s;
  t->nslots = nslots;
  return 0;
}

int pf_names_intern(pf_names *t, const char *cat, const char *name, size_t len) {
  uint64_t h = hash2(cat, name, len);
  if (t->nslots) {
    uint64_t j = h & (uint64_t)(t->nslots - 1);
    while (t->slots[j]) {
      pf_name *e = &t->e[t->slots[j] - 1];
      if (e->hash == h && strcmp(e->cat, cat) == 0 && strlen(e->name) == len &&
          memcmp(e->name, name, len) == 0)
        return t->slots[j] - 1;
      j = (j + 1) & (uint64_t)(t->nslots - 1);
    }
  }
  if (t->n >= (1 << 30)) return -1;
  if ((t->n + 1) * 2 > t->nslots && names_rehash(t, t->nslots ? t->nslots * 2 : 256)) return -1;
  if (pf_grow((void **)&t->e, &t->cap, t->n + 1, sizeof *t->e)) return -1;
  size_t cl = strlen(cat);
  char *mem = lp_malloc(cl + 1 + len + 1);
  if (!mem) return -1;
  memcpy(mem, cat, cl + 1);
  memcpy(mem + cl + 1, name, len);
  mem[cl + 1 + len] = 0;
  pf_name *e = &t->e[t->n];
  e->cat = mem;
  e->name = mem + cl + 1;
  e->hash = h;
  e->ops = e->total = 0;
  e->cls = LP_PROFILE_COMPUTE;
  uint64_t j = h & (uint64_t)(t->nslots - 1);
  while (t->slots[j]) j = (j + 1) & (uint64_t)(t->nslots - 1);
  t->slots[j] = (int32_t)(t->n + 1);
  return (int)t->n++;
}

void pf_names_free(pf_names *t) {
  for (int64_t i = 0; i < t->n; i++) lp_free(t->e[i].cat);
  lp_free(t->e);
  lp_free(t->slots);
  memset(t, 0, sizeof *t);
}

/* ---- the object ------------------------------------------------------- */

lp_profile *lp_profile_new(void) { return lp_calloc(1, sizeof(lp_profile)); }

static void free_ranks(lp_profile *p) {
  for (int i = 0; i < p->nranks; i++) {
    pf_rank_data *d = &p->ranks[i];
    lp_free(d->order);
    lp_free(d->phase);
    lp_free(d->stream_ix);
    lp_free(d->r.streams);
    lp_free(d->r.phases);
  }
  lp_free(p->ranks);
  p->ranks = NULL;
  p->nranks = 0;
}

void lp_profile_free(lp_profile *p) {
  if (!p) return;
  free_ranks(p);
  for (int64_t i = 0; i < p->nfiles; i++) lp_free(p->files[i].path);
  lp_free(p->files);
  lp_free(p->ops);
  lp_free(p->calls);
  lp_free(p->anns);
  pf_names_free(&p->names);
  pf_names_free(&p->ann_names);
  lp_free(p);
}

const char *lp_profile_last_error(const lp_profile *p) { return p->err; }

int lp_profile_name_count(const lp_profile *p) { return (int)p->names.n; }

const char *lp_profile_name(const lp_profile *p, int i, const char **cat, int64_t *ops,
                            int64_t *total_ns) {
  if (i < 0 || i >= p->names.n) return NULL;
  const pf_name *e = &p->names.e[i];
  if (cat) *cat = e->cat;
  if (ops) *ops = e->ops;
  if (total_ns) *total_ns = e->total;
  return e->name;
}

lp_status lp_profile_set_class(lp_profile *p, int i, lp_profile_class c) {
  if (i < 0 || i >= p->names.n || (int)c < 0 || c >= LP_PROFILE_NCLASS) return LP_ERR_ARG;
  p->names.e[i].cls = (int)c;
  return LP_OK;
}

const char *lp_profile_annotation_name(const lp_profile *p, int name) {
  if (name < 0 || name >= p->ann_names.n) return NULL;
  return p->ann_names.e[name].name;
}

int lp_profile_rank_count(const lp_profile *p) { return p->nranks; }

const lp_profile_rank *lp_profile_rank_at(const lp_profile *p, int i) {
  if (i < 0 || i >= p->nranks) return NULL;
  return &p->ranks[i].r;
}

void lp_profile_stats(const lp_profile *p, int64_t *bytes, int64_t *events) {
  if (bytes) *bytes = p->bytes;
  if (events) *events = p->events;
}

int64_t lp_profile_rank_ops(const lp_profile *p, int i, int64_t j, lp_profile_op_view *op) {
  if (i < 0 || i >= p->nranks) return 0;
  const pf_rank_data *d = &p->ranks[i];
  if (!op) return d->nops_all;
  if (j < 0 || j >= d->nops_all) return 0;
  const pf_op *o = &p->ops[d->order[j]];
  op->start_ns = o->start - d->r.t0_ns;
  op->end_ns = o->end - d->r.t0_ns;
  op->stream = d->stream_ix[j];
  op->cls = p->names.e[o->name].cls;
  op->phase = d->phase[j];
  op->name = o->name;
  return d->nops_all;
}

/* ---- interval sets ---------------------------------------------------- */

typedef struct iv {
  int64_t s, e;
} iv;

typedef struct ivset {
  iv *v;
  int64_t n, cap;
} ivset;

/* adds [s, e) to a set built in start order, merging */
static int ivset_add(ivset *a, int64_t s, int64_t e) {
  if (a->n && s <= a->v[a->n - 1].e) {
    if (e > a->v[a->n - 1].e) a->v[a->n - 1].e = e;
    return 0;
  }
  if (pf_grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v)) return -1;
  a->v[a->n].s = s;
  a->v[a->n].e = e;
  a->n++;
  return 0;
}

static int64_t ivset_len(const ivset *a) {
  int64_t t = 0;
  for (int64_t i = 0; i < a->n; i++) t += a->v[i].e - a->v[i].s;
  return t;
}

static int64_t ivset_intersect_len(const ivset *a, const ivset *b) {
  int64_t t = 0, i = 0, j = 0;
  while (i < a->n && j < b->n) {
    int64_t s = a->v[i].s > b->v[j].s ? a->v[i].s : b->v[j].s;
    int64_t e = a->v[i].e < b->v[j].e ? a->v[i].e : b->v[j].e;
    if (e > s) t += e - s;
    if (a->v[i].e < b->v[j].e) i++;
    else j++;
  }
  return t;
}

/* |[s, e) ∩ a| */
static int64_t ivset_cover(const ivset *a, int64_t s, int64_t e) {
  int64_t lo = 0, hi = a->n; /* first interval ending after s */
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    if (a->v[mid].e <= s) lo = mid + 1;
    else hi = mid;
  }
  int64_t t = 0;
  for (int64_t i = lo; i < a->n && a->v[i].s < e; i++) {
    int64_t x = a->v[i].s > s ? a->v[i].s : s, y = a->v[i].e < e ? a->v[i].e : e;
    if (y > x) t += y - x;
  }
  return t;
}

/* out = a minus b */
static int ivset_subtract(const ivset *a, const ivset *b, ivset *out) {
  int64_t j = 0;
  for (int64_t i = 0; i < a->n; i++) {
    int64_t s = a->v[i].s, e = a->v[i].e;
    while (j < b->n && b->v[j].e <= s) j++;
    int64_t k = j;
    while (k < b->n && b->v[k].s < e) {
      if (b->v[k].s > s && ivset_add(out, s, b->v[k].s)) return -1;
      if (b->v[k].e > s) s = b->v[k].e;
      if (s >= e) break;
      k++;
    }
    if (s < e && ivset_add(out, s, e)) return -1;
  }
  return 0;
}

/* out = a ∪ b (both in order) */
static int ivset_union(const ivset *a, const ivset *b, ivset *out) {
  int64_t i = 0, j = 0;
  while (i < a->n || j < b->n) {
    const iv *x = (j >= b->n || (i < a->n && a->v[i].s <= b->v[j].s)) ? &a->v[i++] : &b->v[j++];
    if (ivset_add(out, x->s, x->e)) return -1;
  }
  return 0;
}

/* ---- sorting helpers -------------------------------------------------- */

typedef struct opkey {
  int64_t start, end;
  int32_t rank, file;
  int64_t idx;
} opkey;

static int cmp_opkey(const void *pa, const void *pb) {
  const opkey *a = pa, *b = pb;
  if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
  if (a->start != b->start) return a->start < b->start ? -1 : 1;
  if (a->end != b->end) return a->end < b->end ? -1 : 1;
  return a->idx < b->idx ? -1 : a->idx > b->idx;
}

static int cmp_call(const void *pa, const void *pb) {
  const pf_call *a = pa, *b = pb;
  if (a->file != b->file) return a->file < b->file ? -1 : 1;
  if (a->corr != b->corr) return a->corr < b->corr ? -1 : 1;
  return a->ts < b->ts ? -1 : a->ts > b->ts;
}

/* annotations: file, pid, tid, start, longer first */
static int cmp_ann_thread(const void *pa, const void *pb) {
  const pf_ann *a = pa, *b = pb;
  if (a->file != b->file) return a->file < b->file ? -1 : 1;
  if (a->pid != b->pid) return a->pid < b->pid ? -1 : 1;
  if (a->tid != b->tid) return a->tid < b->tid ? -1 : 1;
  if (a->start != b->start) return a->start < b->start ? -1 : 1;
  if (a->end != b->end) return a->end > b->end ? -1 : 1;
  return a->name < b->name ? -1 : a->name > b->name;
}

/* a leaf: its file, its CPU interval, its phase index in the file */
typedef struct leaf {
  int64_t start, end, pid, tid;
  int32_t file, phase;
} leaf;

static int cmp_leaf_thread(const void *pa, const void *pb) {
  const leaf *a = pa, *b = pb;
  if (a->file != b->file) return a->file < b->file ? -1 : 1;
  if (a->pid != b->pid) return a->pid < b->pid ? -1 : 1;
  if (a->tid != b->tid) return a->tid < b->tid ? -1 : 1;
  return a->start < b->start ? -1 : a->start > b->start;
}

static int cmp_leaf_process(const void *pa, const void *pb) {
  const leaf *a = pa, *b = pb;
  if (a->file != b->file) return a->file < b->file ? -1 : 1;
  if (a->pid != b->pid) return a->pid < b->pid ? -1 : 1;
  if (a->start != b->start) return a->start < b->start ? -1 : 1;
  return a->tid < b->tid ? -1 : a->tid > b->tid;
}

typedef struct leafkey_order { /* phase order in a file: by CPU start */
  int64_t start, end;
  int32_t file, ann;
} leafkey_order;

static int cmp_leaf_order(const void *pa, const void *pb) {
  const leafkey_order *a = pa, *b = pb;
  if (a->file != b->file) return a->file < b->file ? -1 : 1;
  if (a->start != b->start) return a->start < b->start ? -1 : 1;
  if (a->end != b->end) return a->end < b->end ? -1 : 1;
  return a->ann < b->ann ? -1 : a->ann > b->ann;
}

/* the launching call of (file, corr), or NULL */
static const pf_call *find_call(const lp_profile *p, int file, int64_t corr) {
  int64_t lo = 0, hi = p->ncalls;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    const pf_call *c = &p->calls[mid];
    if (c->file < file || (c->file == file && c->corr < corr)) lo = mid + 1;
    else hi = mid;
  }
  if (lo < p->ncalls && p->calls[lo].file == file && p->calls[lo].corr == corr)
    return &p->calls[lo];
  return NULL;
}

typedef struct phase_index {
  leaf *by_thread, *by_process;
  int64_t n;
  int64_t *file_first; /* first phase of each file in the rank's phase list: file -> count */
  int64_t *file_count;
  leafkey_order *order;
} phase_index;

/* the phase whose interval holds ts: on the call's own thread first, else
 * on any thread of its process (the autograd thread's launches); -1 */
static int find_phase(const phase_index *x, int file, int64_t pid, int64_t tid, int64_t ts) {
  /* last leaf with (file, pid, tid, start) <= (.., ts) */
  int64_t lo = 0, hi = x->n;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    const leaf *l = &x->by_thread[mid];
    int before = l->file != file ? l->file < file
                 : l->pid != pid ? l->pid < pid
                 : l->tid != tid ? l->tid < tid
                                 : l->start <= ts;
    if (before) lo = mid + 1;
    else hi = mid;
  }
  if (lo > 0) {
    const leaf *l = &x->by_thread[lo - 1];
    if (l->file == file && l->pid == pid && l->tid == tid && l->start <= ts && ts < l->end)
      return l->phase;
  }
  lo = 0;
  hi = x->n;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    const leaf *l = &x->by_process[mid];
    int before = l->file != file ? l->file < file : l->pid != pid ? l->pid < pid : l->start <= ts;
    if (before) lo = mid + 1;
    else hi = mid;
  }
  for (int64_t k = lo - 1, seen = 0; k >= 0 && seen < 256; k--, seen++) {
    const leaf *l = &x->by_process[k];
    if (l->file != file || l->pid != pid) break;
    if (l->start <= ts && ts < l->end) return l->phase;
  }
  return -1;
}

/* Builds the leaves (annotations with no other annotation of their
 * thread inside them) and their phase numbers per file. */
static lp_status build_phases(lp_profile *p, phase_index *x) {
  memset(x, 0, sizeof *x);
  x->file_first = lp_calloc((size_t)p->nfiles + 1, sizeof(int64_t));
  x->file_count = lp_calloc((size_t)p->nfiles + 1, sizeof(int64_t));
  if (!x->file_first || !x->file_count) return LP_ERR_NOMEM;
  if (p->nanns == 0) return LP_OK;
  qsort(p->anns, (size_t)p->nanns, sizeof *p->anns, cmp_ann_thread);
  int64_t nl = 0;
  x->order = lp_malloc((size_t)p->nanns * sizeof *x->order);
  if (!x->order) return LP_ERR_NOMEM;
  for (int64_t i = 0; i < p->nanns; i++) {
    const pf_ann *a = &p->anns[i];
    int is_leaf = 1;
    if (i + 1 < p->nanns) {
      const pf_ann *b = &p->anns[i + 1];
      if (b->file == a->file && b->pid == a->pid && b->tid == a->tid && b->start < a->end &&
          b->end <= a->end)
        is_leaf = 0;
      /* a zero-length annotation inside another at its start: the first
       * sorts longer first, so b is inside a */
    }
    if (is_leaf) {
      leafkey_order *o = &x->order[nl++];
      o->start = a->start;
      o->end = a->end;
      o->file = a->file;
      o->ann = (int32_t)i;
    }
  }
  qsort(x->order, (size_t)nl, sizeof *x->order, cmp_leaf_order);
  x->n = nl;
  x->by_thread = lp_malloc((size_t)(nl ? nl : 1) * sizeof *x->by_thread);
  x->by_process = lp_malloc((size_t)(nl ? nl : 1) * sizeof *x->by_process);
  if (!x->by_thread || !x->by_process) return LP_ERR_NOMEM;
  for (int64_t i = 0; i < nl; i++) {
    const pf_ann *a = &p->anns[x->order[i].ann];
    int f = a->file;
    if (x->file_count[f] == 0) x->file_first[f] = i;
    leaf *l = &x->by_thread[i];
    l->start = a->start;
    l->end = a->end;
    l->pid = a->pid;
    l->tid = a->tid;
    l->file = f;
    l->phase = (int32_t)x->file_count[f]++;
  }
  memcpy(x->by_process, x->by_thread, (size_t)nl * sizeof *x->by_thread);
  qsort(x->by_thread, (size_t)nl, sizeof *x->by_thread, cmp_leaf_thread);
  qsort(x->by_process, (size_t)nl, sizeof *x->by_process, cmp_leaf_process);
  return LP_OK;
}

static void free_phases(phase_index *x) {
  lp_free(x->by_thread);
  lp_free(x->by_process);
  lp_free(x->file_first);
  lp_free(x->file_count);
  lp_free(x->order);
}

static int rank_of(const lp_profile *p, const pf_op *o) {
  const pf_file *f = &p->files[o->file];
  if (f->luapipe) return o->device;
  return f->dist_rank >= 0 ? f->dist_rank : f->order;
}

/* The figures of one rank from its ops keys[0..n) (sorted by start). */
static lp_status analyze_rank(lp_profile *p, const phase_index *px, const opkey *keys, int64_t n,
                              pf_rank_data *d) {
  lp_status st = LP_ERR_NOMEM;
  ivset cls[LP_PROFILE_NCLASS];
  ivset ceff = {0}, u1 = {0}, all = {0};
  memset(cls, 0, sizeof cls);
  lp_profile_rank *r = &d->r;
  int file = keys[0].file;
  r->rank = keys[0].rank;
  r->file = p->files[file].path;
  d->nops_all = n;
  d->order = lp_malloc((size_t)n * sizeof *d->order);
  d->phase = lp_malloc((size_t)n * sizeof *d->phase);
  d->stream_ix = lp_malloc((size_t)n * sizeof *d->stream_ix);
  if (!d->order || !d->phase || !d->stream_ix) goto done;
  /* phases of this rank: the file's leaves (a PyTorch trace is one rank) */
  int64_t np = p->files[file].luapipe ? 0 : px->file_count[file];
  r->nphases = (int)np;
  r->phases = lp_calloc((size_t)(np ? np : 1), sizeof *r->phases);
  if (!r->phases) goto done;
  for (int64_t i = 0; i < np; i++) {
    const pf_ann *a = &p->anns[px->order[px->file_first[file] + i].ann];
    r->phases[i].name = a->name;
    r->phases[i].cpu_start_ns = a->start;
    r->phases[i].cpu_dur_ns = a->end - a->start;
  }
  int64_t cap_streams = 0;
  int64_t first = INT64_MAX, last = INT64_MIN;
  /* running union per stream and class */
  typedef struct run { int64_t s, e; } run;
  run *runs = NULL;
  int64_t runs_cap = 0;
  int last_stream = -1;
  for (int64_t k = 0; k < n; k++) {
    const pf_op *o = &p->ops[keys[k].idx];
    if (o->file != file) {
      lp_errf(p->err, "rank %d is in two files: %s and %s", r->rank, p->files[file].path,
              p->files[o->file].path);
      st = LP_ERR_PARSE;
      lp_free(runs);
      goto done;
    }
    d->order[k] = keys[k].idx;
    int c = p->names.e[o->name].cls;
    /* its stream */
    int si = -1;
    if (last_stream >= 0 && r->streams[last_stream].device == o->device &&
        r->streams[last_stream].stream == o->stream)
      si = last_stream;
    for (int s = 0; si < 0 && s < r->nstreams; s++)
      if (r->streams[s].device == o->device && r->streams[s].stream == o->stream) si = s;
    if (si < 0) {
      if (pf_grow((void **)&r->streams, &cap_streams, r->nstreams + 1, sizeof *r->streams) ||
          pf_grow((void **)&runs, &runs_cap, (int64_t)(r->nstreams + 1) * LP_PROFILE_NBUSY,
                  sizeof *runs)) {
        lp_free(runs);
        goto done;
      }
      si = r->nstreams++;
      memset(&r->streams[si], 0, sizeof r->streams[si]);
      r->streams[si].device = o->device;
      r->streams[si].stream = o->stream;
      for (int b = 0; b < LP_PROFILE_NBUSY; b++) runs[si * LP_PROFILE_NBUSY + b].s =
          runs[si * LP_PROFILE_NBUSY + b].e = INT64_MIN;
    }
    last_stream = si;
    d->stream_ix[k] = si;
    d->phase[k] = -1;
    if (c == LP_PROFILE_IGNORE) continue;
    if (ivset_add(&cls[c], o->start, o->end)) {
      lp_free(runs);
      goto done;
    }
    if (c == LP_PROFILE_WAIT) continue;
    r->ops++;
    r->streams[si].ops++;
    if (o->start < first) first = o->start;
    if (o->end > last) last = o->end;
    run *ru = &runs[si * LP_PROFILE_NBUSY + c];
    if (o->start > ru->e || ru->e == INT64_MIN) {
      if (ru->e != INT64_MIN) r->streams[si].busy_ns[c] += ru->e - ru->s;
      ru->s = o->start;
      ru->e = o->end;
    } else if (o->end > ru->e) {
      ru->e = o->end;
    }
    /* its phase */
    if (np && o->corr >= 0) {
      const pf_call *call = find_call(p, file, o->corr);
      int ph = call ? find_phase(px, file, call->pid, call->tid, call->ts) : -1;
      d->phase[k] = ph;
      if (ph >= 0) {
        lp_profile_phase *f = &r->phases[ph];
        f->gpu_ns += o->end - o->start;
        f->class_ns[c] += o->end - o->start;
        if (f->ops == 0 || o->start < f->gpu_first_ns) f->gpu_first_ns = o->start;
        if (f->ops == 0 || o->end > f->gpu_last_ns) f->gpu_last_ns = o->end;
        f->ops++;
      }
    }
    if (np && d->phase[k] < 0) r->unattributed_ops++;
  }
  for (int s = 0; s < r->nstreams; s++)
    for (int b = 0; b < LP_PROFILE_NBUSY; b++) {
      run *ru = &runs[s * LP_PROFILE_NBUSY + b];
      if (ru->e != INT64_MIN) r->streams[s].busy_ns[b] += ru->e - ru->s;
    }
  lp_free(runs);
  /* streams in (device, stream) order */
  if (r->nstreams > 1) {
    int ns = r->nstreams;
    int *perm = lp_malloc((size_t)ns * sizeof *perm), *inv = lp_malloc((size_t)ns * sizeof *inv);
    lp_profile_stream *sorted = lp_malloc((size_t)ns * sizeof *sorted);
    if (!perm || !inv || !sorted) {
      lp_free(perm);
      lp_free(inv);
      lp_free(sorted);
      goto done;
    }
    for (int a = 0; a < ns; a++) perm[a] = a;
    for (int a = 1; a < ns; a++) { /* insertion sort: few streams */
      int x = perm[a], b = a - 1;
      while (b >= 0 && (r->streams[perm[b]].device > r->streams[x].device ||
                        (r->streams[perm[b]].device == r->streams[x].device &&
                         r->streams[perm[b]].stream > r->streams[x].stream))) {
        perm[b + 1] = perm[b];
        b--;
      }
      perm[b + 1] = x;
    }
    for (int a = 0; a < ns; a++) {
      sorted[a] = r->streams[perm[a]];
      inv[perm[a]] = a;
    }
    memcpy(r->streams, sorted, (size_t)ns * sizeof *sorted);
    for (int64_t k = 0; k < n; k++) d->stream_ix[k] = inv[d->stream_ix[k]];
    lp_free(perm);
    lp_free(inv);
    lp_free(sorted);
  }
  if (r->ops == 0) { /* everything ignored */
    first = last = keys[0].start;
  }
  r->t0_ns = first;
  r->span_ns = last - first;
  for (int64_t i = 0; i < np; i++) {
    lp_profile_phase *f = &r->phases[i];
    if (f->ops) {
      f->gpu_first_ns -= first;
      f->gpu_last_ns -= first;
    }
    f->cpu_start_ns -= first;
  }
  /* compute minus the time a luapipe rank sat blocked */
  if (ivset_subtract(&cls[LP_PROFILE_COMPUTE], &cls[LP_PROFILE_WAIT], &ceff)) goto done;
  r->busy_ns[LP_PROFILE_COMPUTE] = ivset_len(&ceff);
  r->busy_ns[LP_PROFILE_COMM] = ivset_len(&cls[LP_PROFILE_COMM]);
  r->busy_ns[LP_PROFILE_MEMORY] = ivset_len(&cls[LP_PROFILE_MEMORY]);
  r->overlap_ns = ivset_intersect_len(&cls[LP_PROFILE_COMM], &ceff);
  r->exposed_ns = r->busy_ns[LP_PROFILE_COMM] - r->overlap_ns;
  for (int64_t k = 0; k < n; k++) {
    const pf_op *o = &p->ops[keys[k].idx];
    if (p->names.e[o->name].cls != LP_PROFILE_COMM) continue;
    r->comm_ops_ns += o->end - o->start;
    r->comm_ops_overlap_ns += ivset_cover(&ceff, o->start, o->end);
  }
  if (ivset_union(&ceff, &cls[LP_PROFILE_COMM], &u1)) goto done;
  if (ivset_union(&u1, &cls[LP_PROFILE_MEMORY], &all)) goto done;
  r->idle_ns = r->span_ns - ivset_len(&all);
  st = LP_OK;
done:
  for (int c = 0; c < LP_PROFILE_NCLASS; c++) lp_free(cls[c].v);
  lp_free(ceff.v);
  lp_free(u1.v);
  lp_free(all.v);
  return st;
}

lp_status lp_profile_analyze(lp_profile *p) {
  free_ranks(p);
  if (p->nops == 0) {
    lp_errf(p->err, "%s: no GPU operations (no \"kernel\", \"gpu_memcpy\" or \"gpu_memset\" "
            "events, and not a trace luapipe wrote)",
            p->nfiles ? p->files[0].path : "(no file)");
    return LP_ERR_PARSE;
  }
  lp_status st = LP_ERR_NOMEM;
  phase_index px;
  opkey *keys = lp_malloc((size_t)p->nops * sizeof *keys);
  st = build_phases(p, &px);
  if (st != LP_OK || !keys) {
    st = LP_ERR_NOMEM;
    goto done;
  }
  if (p->ncalls > 1) qsort(p->calls, (size_t)p->ncalls, sizeof *p->calls, cmp_call);
  for (int64_t i = 0; i < p->nops; i++) {
    keys[i].start = p->ops[i].start;
    keys[i].end = p->ops[i].end;
    keys[i].rank = rank_of(p, &p->ops[i]);
    keys[i].file = p->ops[i].file;
    keys[i].idx = i;
  }
  qsort(keys, (size_t)p->nops, sizeof *keys, cmp_opkey);
  int nr = 0;
  for (int64_t i = 0; i < p->nops; i++)
    if (i == 0 || keys[i].rank != keys[i - 1].rank) nr++;
  p->ranks = lp_calloc((size_t)nr, sizeof *p->ranks);
  if (!p->ranks) goto done;
  st = LP_OK;
  for (int64_t i = 0; i < p->nops && st == LP_OK;) {
    int64_t j = i;
    while (j < p->nops && keys[j].rank == keys[i].rank) j++;
    st = analyze_rank(p, &px, keys + i, j - i, &p->ranks[p->nranks]);
    p->nranks++;
    i = j;
  }
  if (st != LP_OK) {
    if (st == LP_ERR_NOMEM) lp_errf(p->err, "out of memory analysing the trace");
    free_ranks(p);
  }
done:
  if (st == LP_ERR_NOMEM && !p->err[0]) lp_errf(p->err, "out of memory analysing the trace");
  lp_free(keys);
  free_phases(&px);
  return st;
}
