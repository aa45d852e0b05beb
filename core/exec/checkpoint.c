/* checkpoint.c — per-rank checkpoints of the executor's virtual stages
 * (parameter values, optimizer state, step), written atomically; see the
 * checkpoint section of lp_exec.h for the format. Version 2 adds the EP
 * size, and per MoE layer the placement in force and the router bias. Only the executor's
 * public accessors are used. */
#define _POSIX_C_SOURCE 200809L
#include "lp_exec.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CK_MAGIC "LPIPECKP"
#define CK_VERSION 3u /* 2: EP size, expert placements, router biases;
                       * 3: per-parameter optimizer steps (experts no
                       * token reached were not updated) */
#define CK_VERSION_MIN 2u /* read too: every parameter took every step */
#define CK_BOM 0x01020304u
#define CK_NAME_MAX 1024

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 1099511628211ULL;
  }
  return h;
}
#define FNV_START 14695981039346656037ULL

void lp_exec_checkpoint_path(const char *dir, int rank, char *buf, size_t n) {
  snprintf(buf, n, "%s/rank%d.ckpt", dir && *dir ? dir : ".", rank);
}

/* ---- writing ---- */

typedef struct wr {
  lp_file *f;
  uint64_t h; /* checksum of what was written */
} wr;

static void put(wr *w, const void *p, size_t n) {
  lp_file_put(w->f, p, n);
  w->h = fnv1a(w->h, p, n);
}
static void put_u32(wr *w, uint32_t v) { put(w, &v, sizeof v); }
static void put_i32(wr *w, int32_t v) { put(w, &v, sizeof v); }
static void put_i64(wr *w, int64_t v) { put(w, &v, sizeof v); }
static void put_str(wr *w, const char *s) {
  size_t n = strlen(s);
  put_u32(w, (uint32_t)n);
  put(w, s, n);
}

typedef lp_status (*body_fn)(void *ud, wr *w, char *err);

/* Writes body to path atomically (lp_file_begin/commit): a failure leaves
 * path as it was. */
static lp_status write_atomic(const char *path, body_fn body, void *ud, char *err) {
  wr w = {NULL, FNV_START};
  LP_CHECK(lp_file_begin(path, &w.f, err));
  lp_status st = body(ud, &w, err);
  if (st != LP_OK) {
    lp_file_abort(w.f);
    return st;
  }
  return lp_file_commit(w.f, err);
}

typedef struct save_ctx {
  lp_exec *e;
  int64_t step;
} save_ctx;

static const char *sched_name(const lp_schedule *s) {
  const char *n = lp_schedule_name(s);
  return n && *n ? n : "(unnamed)";
}

static lp_status save_body(void *ud, wr *w, char *err) {
  save_ctx *c = ud;
  lp_exec *e = c->e;
  const lp_schedule *s = lp_exec_schedule(e);
  int nloc = lp_exec_vstages(e);
  put(w, CK_MAGIC, 8);
  put_u32(w, CK_VERSION);
  put_u32(w, CK_BOM);
  put_i32(w, lp_comm_rank(lp_exec_comm(e)));
  put_i32(w, lp_schedule_ranks(s));
  put_i32(w, lp_schedule_stages(s));
  put_i32(w, lp_schedule_vstages(s));
  put_i32(w, lp_schedule_microbatches(s));
  put_str(w, sched_name(s));
  put_str(w, nloc > 0 ? lp_nn_optim_kind(lp_exec_vstage_optim(e, 0)) : "none");
  int ep_rank = 0, ep = lp_exec_ep(e, &ep_rank);
  put_i32(w, ep);
  put_i32(w, ep_rank);
  put_i64(w, c->step);
  put_i32(w, nloc);
  /* MoE layers: placement in force (restored before the parameters are
   * read, so slot parameters land in their slots) and router bias */
  for (int i = 0; i < nloc; i++) {
    lp_nn_layer *chunk = lp_exec_vstage_chunk(e, i);
    int nm = lp_nn_moe_count(chunk);
    put_u32(w, (uint32_t)nm);
    for (int mi = 0; mi < nm; mi++) {
      lp_nn_layer *m = lp_nn_moe_find(chunk, mi);
      int E = lp_nn_moe_get_opts(m)->experts, spr = lp_nn_moe_slots_per_rank(m);
      size_t ns = (size_t)spr * (size_t)ep;
      int *p2l = lp_malloc(ns * sizeof *p2l);
      float *bias = lp_malloc((size_t)E * sizeof *bias);
      lp_status st = p2l && bias ? lp_nn_moe_placement(m, p2l) : LP_ERR_NOMEM;
      if (st == LP_OK) st = lp_nn_moe_get_bias(m, bias);
      if (st == LP_OK) {
        put_i32(w, E);
        put_i32(w, spr);
        for (size_t q = 0; q < ns; q++) put_i32(w, p2l[q]);
        put(w, bias, (size_t)E * sizeof *bias);
      }
      lp_free(p2l);
      lp_free(bias);
      if (st != LP_OK) {
        lp_errf(err, "reading MoE layer %d of stage %d: %s", mi, lp_exec_vstage_id(e, i),
                lp_strerror(st));
        return st;
      }
    }
  }
  for (int i = 0; i < nloc; i++) {
    lp_nn_layer *chunk = lp_exec_vstage_chunk(e, i);
    lp_nn_optim *o = lp_exec_vstage_optim(e, i);
    size_t np = 0, sn = lp_nn_optim_state_numel(o);
    const lp_nn_param *p = lp_nn_params(chunk, &np);
    float *state = lp_malloc((sn ? sn : 1) * sizeof(float));
    if (!state) {
      lp_errf(err, "out of memory saving the optimizer state of stage %d",
              lp_exec_vstage_id(e, i));
      return LP_ERR_NOMEM;
    }
    int64_t osteps = 0;
    lp_status st = lp_nn_optim_state_export(o, state, sn, &osteps);
    if (st != LP_OK) {
      lp_free(state);
      lp_errf(err, "exporting the optimizer state of stage %d: %s", lp_exec_vstage_id(e, i),
              lp_strerror(st));
      return st;
    }
    put_i32(w, lp_exec_vstage_id(e, i));
    put_i32(w, lp_exec_vstage_stage(e, i));
    put_i64(w, osteps);
    put_u32(w, (uint32_t)np);
    for (size_t j = 0; j < np; j++) {
      put_str(w, p[j].name);
      put_i32(w, p[j].value->ndim);
      for (int d = 0; d < p[j].value->ndim; d++) put_i64(w, p[j].value->shape[d]);
    }
    for (size_t j = 0; j < np && st == LP_OK; j++) {
      /* through a host copy: the parameters may live on a device */
      size_t cnt = (size_t)lp_tensor_numel(p[j].value);
      float *h = lp_malloc((cnt ? cnt : 1) * sizeof *h);
      st = h ? lp_tensor_read(p[j].value, h) : LP_ERR_NOMEM;
      if (st == LP_OK) put(w, h, cnt * sizeof *h);
      lp_free(h);
    }
    if (st != LP_OK) {
      lp_free(state);
      lp_errf(err, "reading the parameters of stage %d: %s", lp_exec_vstage_id(e, i),
              lp_strerror(st));
      return st;
    }
    put_i64(w, (int64_t)sn);
    put(w, state, sn * sizeof(float));
    lp_free(state);
    /* version 3: the steps that updated each parameter of the optimizer */
    size_t on = lp_nn_optim_count(o);
    int64_t *ts = lp_malloc((on ? on : 1) * sizeof *ts);
    st = ts ? lp_nn_optim_param_steps(o, ts, on) : LP_ERR_NOMEM;
    if (st == LP_OK) {
      put_u32(w, (uint32_t)on);
      for (size_t j = 0; j < on; j++) put_i64(w, ts[j]);
    }
    lp_free(ts);
    if (st != LP_OK) {
      lp_errf(err, "reading the optimizer's step counts of stage %d: %s",
              lp_exec_vstage_id(e, i), lp_strerror(st));
      return st;
    }
  }
  uint64_t h = w->h;
  put(w, &h, sizeof h);
  return LP_OK;
}

lp_status lp_exec_checkpoint_save(lp_exec *e, const char *dir, int64_t step) {
  char path[4096], err[LP_ERRLEN] = "";
  lp_exec_checkpoint_path(dir, lp_comm_rank(lp_exec_comm(e)), path, sizeof path);
  save_ctx c = {e, step};
  lp_status st = write_atomic(path, save_body, &c, err);
  if (st != LP_OK) {
    char msg[LP_ERRLEN];
    lp_errf(msg, "rank %d: saving checkpoint %s: %s", lp_comm_rank(lp_exec_comm(e)), path,
            err);
    lp_exec_set_error(e, msg);
  }
  return st;
}

/* ---- reading ---- */

typedef struct rd {
  const unsigned char *p;
  size_t n, off;
  int bad; /* ran past the end */
} rd;

static const void *take(rd *r, size_t n) {
  if (r->bad || n > r->n - r->off) {
    r->bad = 1;
    return NULL;
  }
  const void *q = r->p + r->off;
  r->off += n;
  return q;
}
static uint32_t get_u32(rd *r) {
  uint32_t v = 0;
  const void *q = take(r, sizeof v);
  if (q) memcpy(&v, q, sizeof v);
  return v;
}
static int32_t get_i32(rd *r) {
  int32_t v = 0;
  const void *q = take(r, sizeof v);
  if (q) memcpy(&v, q, sizeof v);
  return v;
}
static int64_t get_i64(rd *r) {
  int64_t v = 0;
  const void *q = take(r, sizeof v);
  if (q) memcpy(&v, q, sizeof v);
  return v;
}
/* A length-prefixed string into buf (cap bytes, NUL-terminated); too long
 * counts as corrupt. */
static void get_str(rd *r, char *buf, size_t cap) {
  uint32_t n = get_u32(r);
  buf[0] = '\0';
  if (r->bad) return;
  if (n >= cap) {
    r->bad = 1;
    return;
  }
  const void *q = take(r, n);
  if (!q) return;
  memcpy(buf, q, n);
  buf[n] = '\0';
}

static void shape_text(int ndim, const int64_t *shape, char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && o < n; d++)
    o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (o < n) snprintf(buf + o, n - o, "]");
}

/* Appends "; " + text to a difference list; a list cut short at cap ends
 * in "...". */
static void add_diff(char *dst, size_t cap, const char *fmt, const char *a, const char *b) {
  size_t o = strlen(dst);
  if (o >= cap - 1) return;
  if (o) o += (size_t)snprintf(dst + o, cap - o, "; ");
  int n = o < cap ? snprintf(dst + o, cap - o, fmt, a, b) : 0;
  if ((o >= cap || (n >= 0 && (size_t)n >= cap - o)) && cap > 4)
    memcpy(dst + cap - 4, "...", 4);
}

typedef struct load_ctx {
  lp_exec *e;
  uint32_t version; /* of the file */
  const char *path;
  char *msg;      /* LP_ERRLEN */
  size_t max_sn;  /* largest optimizer state (found by the check pass) */
  float *scratch; /* max_sn floats for the apply pass (aligned copy) */
  char way_out[2 * CK_NAME_MAX + 200]; /* after a placement mismatch: its schedule */
} load_ctx;

/* One pass over the stage records: apply = 0 checks everything against the
 * executor; apply = 1 (only after a clean check) copies the numbers in. */
static lp_status stages_pass(load_ctx *c, rd *r, int nloc, int apply) {
  lp_exec *e = c->e;
  char a[128], b[128];
  for (int i = 0; i < nloc; i++) {
    int id = get_i32(r), stage = get_i32(r);
    int64_t osteps = get_i64(r);
    uint32_t np = get_u32(r);
    if (r->bad) goto corrupt;
    if (id != lp_exec_vstage_id(e, i) || stage != lp_exec_vstage_stage(e, i)) {
      lp_errf(c->msg, "checkpoint %s does not match this run: it holds virtual stage %d (model "
              "stage %d) where this rank has virtual stage %d (model stage %d)%s",
              c->path, id, stage, lp_exec_vstage_id(e, i), lp_exec_vstage_stage(e, i), c->way_out);
      return LP_ERR_INVALID;
    }
    lp_nn_layer *chunk = lp_exec_vstage_chunk(e, i);
    lp_nn_optim *o = lp_exec_vstage_optim(e, i);
    size_t mnp = 0;
    const lp_nn_param *p = lp_nn_params(chunk, &mnp);
    if (np != mnp) {
      lp_errf(c->msg, "checkpoint %s does not match the model: model stage %d has %u "
              "parameters in the checkpoint, %zu in this model", c->path, stage, np, mnp);
      return LP_ERR_INVALID;
    }
    for (uint32_t j = 0; j < np; j++) {
      char name[CK_NAME_MAX];
      get_str(r, name, sizeof name);
      int ndim = get_i32(r);
      if (r->bad || ndim < 0 || ndim > LP_TENSOR_MAXDIM) goto corrupt;
      int64_t shape[LP_TENSOR_MAXDIM] = {0};
      for (int d = 0; d < ndim; d++) shape[d] = get_i64(r);
      if (r->bad) goto corrupt;
      const lp_tensor *v = p[j].value;
      int same = strcmp(name, p[j].name) == 0 && ndim == v->ndim;
      for (int d = 0; same && d < ndim; d++) same = shape[d] == v->shape[d];
      if (!same) {
        shape_text(ndim, shape, a, sizeof a);
        shape_text(v->ndim, v->shape, b, sizeof b);
        lp_errf(c->msg, "checkpoint %s does not match the model: model stage %d, parameter %u "
                "is %s %s in the checkpoint but %s %s in this model", c->path, stage, j + 1,
                name, a, p[j].name, b);
        return LP_ERR_INVALID;
      }
    }
    for (uint32_t j = 0; j < np; j++) {
      size_t bytes = (size_t)lp_tensor_numel(p[j].value) * sizeof(float);
      const void *q = take(r, bytes);
      if (!q) goto corrupt;
      if (apply && bytes) {
        /* an aligned host copy, then to wherever the parameter lives */
        float *h = lp_malloc(bytes);
        lp_status st = h ? LP_OK : LP_ERR_NOMEM;
        if (st == LP_OK) {
          memcpy(h, q, bytes);
          st = lp_tensor_write(p[j].value, h);
        }
        lp_free(h);
        if (st != LP_OK) {
          lp_errf(c->msg, "checkpoint %s: writing parameter %s of model stage %d: %s", c->path,
                  p[j].name, stage, lp_strerror(st));
          return st;
        }
      }
    }
    int64_t sn = get_i64(r);
    if (r->bad) goto corrupt;
    if (sn < 0 || (uint64_t)sn != (uint64_t)lp_nn_optim_state_numel(o)) {
      lp_errf(c->msg, "checkpoint %s does not match this run: the optimizer state of model "
              "stage %d has %lld numbers in the checkpoint, this run's %s needs %zu", c->path,
              stage, (long long)sn, lp_nn_optim_kind(o), lp_nn_optim_state_numel(o));
      return LP_ERR_INVALID;
    }
    const void *q = take(r, (size_t)sn * sizeof(float));
    if (!q) goto corrupt;
    /* version 3: per-parameter steps (version 2: all osteps) */
    const unsigned char *tsq = NULL;
    size_t on = lp_nn_optim_count(o);
    if (c->version >= 3) {
      uint32_t n = get_u32(r);
      if (r->bad) goto corrupt;
      if (n != on) {
        lp_errf(c->msg, "checkpoint %s does not match this run: the optimizer of model stage %d "
                "has %u parameters in the checkpoint, %zu in this run", c->path, stage, n, on);
        return LP_ERR_INVALID;
      }
      tsq = take(r, (size_t)n * sizeof(int64_t));
      if (!tsq) goto corrupt;
      for (uint32_t j = 0; j < n; j++) {
        int64_t t;
        memcpy(&t, tsq + (size_t)j * sizeof t, sizeof t);
        if (t < 0 || t > osteps) goto corrupt;
      }
    }
    if (apply) {
      if (sn) memcpy(c->scratch, q, (size_t)sn * sizeof(float));
      lp_status st = lp_nn_optim_state_import(o, c->scratch, (size_t)sn, osteps);
      if (st == LP_OK && tsq) {
        int64_t *ts = lp_malloc((on ? on : 1) * sizeof *ts);
        st = ts ? LP_OK : LP_ERR_NOMEM;
        if (ts && on) memcpy(ts, tsq, on * sizeof *ts);
        if (st == LP_OK) st = lp_nn_optim_set_param_steps(o, ts, on);
        lp_free(ts);
      }
      if (st != LP_OK) {
        lp_errf(c->msg, "checkpoint %s: importing the optimizer state of model stage %d: %s",
                c->path, stage, lp_strerror(st));
        return st;
      }
    } else {
      if (osteps < 0) goto corrupt;
      if ((size_t)sn > c->max_sn) c->max_sn = (size_t)sn;
    }
  }
  if (r->off != r->n) goto corrupt;
  return LP_OK;
corrupt:
  lp_errf(c->msg, "checkpoint %s is corrupt: its contents do not parse (offset %zu of %zu)",
          c->path, r->off, r->n);
  return LP_ERR_PARSE;
}

/* One MoE layer's record: where it is, the placement and the bias. */
typedef struct moe_rec {
  int vstage, moe, experts, spr;
  int restored; /* (the old placement) this load replaced it */
  int *p2l;    /* spr * ep */
  float *bias; /* experts */
} moe_rec;

/* Reads and checks the MoE records of the nloc virtual stages against this
 * run (layer count and experts per layer; a placement naming every expert).
 * *out gets them (to free) in file order. */
static lp_status moe_pass(load_ctx *c, rd *r, int nloc, int ep, moe_rec **out, int *nout) {
  lp_exec *e = c->e;
  int n = 0, cap = 0;
  moe_rec *recs = NULL;
  lp_status st = LP_OK;
  *out = NULL;
  *nout = 0;
  for (int i = 0; i < nloc && st == LP_OK; i++) {
    lp_nn_layer *chunk = lp_exec_vstage_chunk(e, i);
    uint32_t nm = get_u32(r);
    int mynm = lp_nn_moe_count(chunk);
    if (r->bad) goto corrupt;
    if (nm != (uint32_t)mynm) {
      lp_errf(c->msg, "checkpoint %s does not match the model: model stage %d has %u MoE layers "
              "in the checkpoint, %d in this model", c->path, lp_exec_vstage_stage(e, i), nm, mynm);
      st = LP_ERR_INVALID;
      break;
    }
    for (int mi = 0; mi < mynm; mi++) {
      int E = get_i32(r), spr = get_i32(r);
      int myE = lp_nn_moe_get_opts(lp_nn_moe_find(chunk, mi))->experts;
      if (r->bad || spr < 1 || E < 1 || (int64_t)spr * ep > (int64_t)1 << 24) goto corrupt;
      if (E != myE) {
        lp_errf(c->msg, "checkpoint %s does not match the model: MoE layer %d of model stage %d "
                "has %d expert%s in the checkpoint, %d in this model", c->path, mi + 1,
                lp_exec_vstage_stage(e, i), E, LP_PLURAL(E), myE);
        st = LP_ERR_INVALID;
        break;
      }
      if (n == cap) {
        cap = cap ? 2 * cap : 4;
        moe_rec *g = lp_realloc(recs, (size_t)cap * sizeof *g);
        if (!g) { st = LP_ERR_NOMEM; break; }
        recs = g;
      }
      moe_rec *m = &recs[n++];
      m->vstage = i, m->moe = mi, m->experts = E, m->spr = spr, m->restored = 0;
      m->p2l = lp_malloc((size_t)spr * (size_t)ep * sizeof *m->p2l);
      m->bias = lp_malloc((size_t)E * sizeof *m->bias);
      if (!m->p2l || !m->bias) { st = LP_ERR_NOMEM; break; }
      for (int s = 0; s < spr * ep; s++) {
        m->p2l[s] = get_i32(r);
        if (m->p2l[s] < 0 || m->p2l[s] >= E) r->bad = 1;
      }
      const void *q = take(r, (size_t)E * sizeof(float));
      if (!q) goto corrupt;
      memcpy(m->bias, q, (size_t)E * sizeof(float));
      for (int x = 0; x < E; x++) { /* every expert needs a slot */
        int has = 0;
        for (int s = 0; s < spr * ep && !has; s++) has = m->p2l[s] == x;
        if (!has) goto corrupt;
      }
    }
  }
  if (st == LP_ERR_NOMEM) lp_errf(c->msg, "out of memory loading checkpoint %s", c->path);
  *out = recs;
  *nout = n;
  return st;
corrupt:
  lp_errf(c->msg, "checkpoint %s is corrupt: its MoE records do not parse (offset %zu of %zu)",
          c->path, r->off, r->n);
  *out = recs;
  *nout = n;
  return LP_ERR_PARSE;
}

static lp_status load_file(load_ctx *c, unsigned char *data, size_t size, int64_t *step) {
  lp_exec *e = c->e;
  const lp_schedule *s = lp_exec_schedule(e);
  const size_t head = 8 + 4 + 4;
  if (size < 8 || memcmp(data, CK_MAGIC, 8) != 0) {
    if (size < 8)
      lp_errf(c->msg, "checkpoint %s is truncated (%zu bytes): not a complete luapipe "
              "checkpoint", c->path, size);
    else
      lp_errf(c->msg, "checkpoint %s is not a luapipe checkpoint (bad magic)", c->path);
    return LP_ERR_PARSE;
  }
  if (size < head + 8) {
    lp_errf(c->msg, "checkpoint %s is truncated (%zu bytes)", c->path, size);
    return LP_ERR_PARSE;
  }
  uint32_t version, bom;
  memcpy(&version, data + 8, 4);
  memcpy(&bom, data + 12, 4);
  if (bom != CK_BOM) {
    lp_errf(c->msg, "checkpoint %s was written on a machine with another byte order", c->path);
    return LP_ERR_PARSE;
  }
  if (version < CK_VERSION_MIN || version > CK_VERSION) {
    lp_errf(c->msg, "checkpoint %s has format version %u; this luapipe reads versions %u to %u%s",
            c->path, version, CK_VERSION_MIN, CK_VERSION, version == 1 ? " (version 1 has no "
            "expert placements or router biases: resume it with the luapipe that wrote it)" : "");
    return LP_ERR_PARSE;
  }
  c->version = version;
  uint64_t want, got = fnv1a(FNV_START, data, size - 8);
  memcpy(&want, data + size - 8, 8);
  if (want != got) {
    lp_errf(c->msg, "checkpoint %s is truncated or corrupt (checksum mismatch over %zu bytes): "
            "it was not completely written or was damaged", c->path, size);
    return LP_ERR_PARSE;
  }
  rd r = {data, size - 8, head, 0};
  int rank = get_i32(&r), P = get_i32(&r), S = get_i32(&r), V = get_i32(&r);
  (void)get_i32(&r); /* micro-batches: informative only */
  char name[CK_NAME_MAX], okind[32];
  get_str(&r, name, sizeof name);
  get_str(&r, okind, sizeof okind);
  int ck_ep = get_i32(&r), ck_ep_rank = get_i32(&r);
  int64_t ck_step = get_i64(&r);
  int nloc = get_i32(&r);
  if (r.bad) {
    lp_errf(c->msg, "checkpoint %s is corrupt: its header does not parse", c->path);
    return LP_ERR_PARSE;
  }
  /* what differs, in user terms */
  char diff[LP_ERRLEN] = "", a[64], b[64];
  int myrank = lp_comm_rank(lp_exec_comm(e));
  int mynloc = lp_exec_vstages(e);
  const char *mykind = mynloc > 0 ? lp_nn_optim_kind(lp_exec_vstage_optim(e, 0)) : "none";
  /* another schedule is no difference by itself: parameters and optimizer
   * state do not depend on it, only on which model stages this rank holds
   * (checked below and per stage). When those differ, the way out names
   * the schedule the checkpoint was written under. */
  if (strcmp(name, sched_name(s)) != 0)
    snprintf(c->way_out, sizeof c->way_out, " (it was written under schedule '%s', this run's "
             "is '%s': resume under '%s', or a schedule that places the model stages on the ranks "
             "alike)", name, sched_name(s), name);
  if (P != lp_schedule_ranks(s)) {
    snprintf(a, sizeof a, "%d", P);
    snprintf(b, sizeof b, "%d", lp_schedule_ranks(s));
    add_diff(diff, sizeof diff, "%s ranks in the checkpoint, %s in this run", a, b);
  }
  if (rank != myrank) {
    snprintf(a, sizeof a, "%d", rank);
    snprintf(b, sizeof b, "%d", myrank);
    add_diff(diff, sizeof diff, "written by rank %s, read by rank %s", a, b);
  }
  if (S != lp_schedule_stages(s) || V != lp_schedule_vstages(s)) {
    snprintf(a, sizeof a, "%d model stages / %d virtual stages", S, V);
    snprintf(b, sizeof b, "%d / %d", lp_schedule_stages(s), lp_schedule_vstages(s));
    add_diff(diff, sizeof diff, "%s in the checkpoint, %s in this run", a, b);
  }
  int my_ep_rank = 0, my_ep = lp_exec_ep(e, &my_ep_rank);
  if (ck_ep != my_ep) {
    snprintf(a, sizeof a, "%d", ck_ep);
    snprintf(b, sizeof b, "%d", my_ep);
    add_diff(diff, sizeof diff, "EP size %s in the checkpoint, %s in this run", a, b);
  } else if (ck_ep_rank != my_ep_rank) {
    snprintf(a, sizeof a, "%d", ck_ep_rank);
    snprintf(b, sizeof b, "%d", my_ep_rank);
    add_diff(diff, sizeof diff, "EP index %s in the checkpoint, %s in this run", a, b);
  }
  if (strcmp(okind, mykind) != 0)
    add_diff(diff, sizeof diff, "optimizer %s in the checkpoint, %s in this run", okind,
             mykind);
  if (!*diff && nloc != mynloc) {
    snprintf(a, sizeof a, "%d", nloc);
    snprintf(b, sizeof b, "%d", mynloc);
    add_diff(diff, sizeof diff, "%s virtual stages on this rank in the checkpoint, %s in this run",
             a, b);
  }
  if (*diff) {
    lp_errf(c->msg, "checkpoint %s does not match this run: %s%s", c->path, diff, c->way_out);
    return LP_ERR_INVALID;
  }
  moe_rec *recs = NULL, *olds = NULL;
  int nrec = 0;
  lp_status st = moe_pass(c, &r, nloc, my_ep, &recs, &nrec);
  /* the checkpoint's placements first (the old ones kept to go back to),
   * so the parameter lists below are the ones the file was written from */
  if (st == LP_OK && nrec) {
    olds = lp_calloc((size_t)nrec, sizeof *olds);
    if (!olds) st = LP_ERR_NOMEM;
  }
  for (int q = 0; q < nrec && st == LP_OK; q++) {
    lp_nn_layer *m = lp_nn_moe_find(lp_exec_vstage_chunk(e, recs[q].vstage), recs[q].moe);
    olds[q] = recs[q];
    olds[q].spr = lp_nn_moe_slots_per_rank(m);
    olds[q].p2l = lp_malloc((size_t)olds[q].spr * (size_t)my_ep * sizeof(int));
    olds[q].bias = NULL;
    st = olds[q].p2l ? lp_nn_moe_placement(m, olds[q].p2l) : LP_ERR_NOMEM;
    if (st != LP_OK) break;
    if (olds[q].spr == recs[q].spr &&
        !memcmp(olds[q].p2l, recs[q].p2l, (size_t)recs[q].spr * (size_t)my_ep * sizeof(int)))
      continue;
    st = lp_exec_restore_placement(e, recs[q].vstage, recs[q].moe, recs[q].spr, recs[q].p2l);
    if (st != LP_OK) {
      lp_errf(c->msg, "checkpoint %s: restoring the expert placement of MoE layer %d of local "
              "virtual stage %d: %s", c->path, recs[q].moe, recs[q].vstage,
              lp_exec_last_error(e));
      break;
    }
    olds[q].restored = 1;
  }
  size_t body = r.off;
  if (st == LP_OK) st = stages_pass(c, &r, nloc, 0);
  /* everything checked: allocate first, so applying cannot fail halfway */
  if (st == LP_OK) {
    c->scratch = lp_malloc((c->max_sn ? c->max_sn : 1) * sizeof(float));
    if (!c->scratch) {
      lp_errf(c->msg, "out of memory loading checkpoint %s", c->path);
      st = LP_ERR_NOMEM;
    }
  }
  if (st == LP_OK) {
    r.off = body;
    st = stages_pass(c, &r, nloc, 1);
  }
  for (int q = 0; q < nrec && st == LP_OK; q++) {
    st = lp_nn_moe_set_bias(lp_nn_moe_find(lp_exec_vstage_chunk(e, recs[q].vstage), recs[q].moe),
                            recs[q].bias);
    if (st != LP_OK)
      lp_errf(c->msg, "checkpoint %s: setting the router bias of MoE layer %d: %s", c->path,
              recs[q].moe, lp_strerror(st));
  }
  lp_free(c->scratch);
  c->scratch = NULL;
  if (st != LP_OK) /* back to the placements this run had (values as initialised) */
    for (int q = 0; q < nrec && olds; q++)
      if (olds[q].restored)
        (void)lp_exec_restore_placement(e, olds[q].vstage, olds[q].moe, olds[q].spr, olds[q].p2l);
  for (int q = 0; q < nrec; q++) {
    if (olds) lp_free(olds[q].p2l);
    lp_free(recs[q].p2l);
    lp_free(recs[q].bias);
  }
  lp_free(olds);
  lp_free(recs);
  if (st == LP_OK && step) *step = ck_step;
  return st;
}

lp_status lp_exec_checkpoint_load(lp_exec *e, const char *dir, int64_t *step) {
  char path[4096], msg[LP_ERRLEN] = "", full[LP_ERRLEN];
  int rank = lp_comm_rank(lp_exec_comm(e));
  lp_exec_checkpoint_path(dir, rank, path, sizeof path);
  lp_status st = LP_OK;
  unsigned char *data = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    lp_errf(msg, "cannot open checkpoint %s: %s", path, strerror(errno));
    st = LP_ERR_IO;
    goto out;
  }
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    lp_errf(msg, "checkpoint %s is not a regular file", path);
    st = LP_ERR_IO;
    goto out;
  }
  size_t size = (size_t)sb.st_size;
  data = lp_malloc(size ? size : 1);
  if (!data) {
    lp_errf(msg, "out of memory reading checkpoint %s (%zu bytes)", path, size);
    st = LP_ERR_NOMEM;
    goto out;
  }
  if (size && fread(data, 1, size, f) != size) {
    lp_errf(msg, "cannot read checkpoint %s: %s", path, ferror(f) ? strerror(errno) : "short read");
    st = LP_ERR_IO;
    goto out;
  }
  load_ctx c = {e, 0, path, msg, 0, NULL, ""};
  st = load_file(&c, data, size, step);
out:
  if (f) fclose(f);
  lp_free(data);
  if (st != LP_OK) {
    lp_errf(full, "rank %d: %s", rank, *msg ? msg : lp_strerror(st));
    lp_exec_set_error(e, full);
  }
  return st;
}
