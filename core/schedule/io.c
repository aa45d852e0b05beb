/* io.c — schedule CSV (PyTorch torch.distributed.pipelining format: one row
 * per rank, one action per cell) and JSON export. CSV import infers the
 * placement and routes from the cells (see lp_schedule_from_csv). */
#include "schedule_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- export ---- */

char *lp_schedule_to_csv(const lp_schedule *s) {
  lp_buf b;
  char t[LP_ACTION_TEXT_MAX];
  lp_buf_init(&b);
  for (int r = 0; r < s->ranks; r++) {
    for (int i = 0; i < s->acts[r].n; i++) {
      if (i) lp_buf_append(&b, ",", 1);
      lp_buf_puts(&b, ACT_TEXT(&s->acts[r].v[i], t));
    }
    lp_buf_append(&b, "\n", 1);
  }
  return lp_buf_take(&b);
}

char *lp_schedule_to_json(const lp_schedule *s) {
  lp_buf b;
  char t[LP_ACTION_TEXT_MAX];
  lp_buf_init(&b);
  lp_buf_puts(&b, "{\n  \"name\": ");
  lp_buf_json_string(&b, lp_schedule_name(s));
  lp_buf_printf(&b, ",\n  \"ranks\": %d,\n  \"stages\": %d,\n  \"microbatches\": %d,\n"
                    "  \"virtual_stages\": [", s->ranks, s->stages, s->microbatches);
  for (int v = 0; v < s->nvst; v++)
    lp_buf_printf(&b, "%s{\"id\": %d, \"stage\": %d, \"rank\": %d}", v ? ", " : "", v,
                  s->vst[v].stage, s->vst[v].rank);
  lp_buf_puts(&b, "],\n  \"routes\": [");
  for (int m = 0; m < s->microbatches; m++) {
    if (m) lp_buf_puts(&b, ", ");
    if (!s->routes[m]) {
      lp_buf_puts(&b, "null");
      continue;
    }
    lp_buf_append(&b, "[", 1);
    for (int k = 0; k < s->route_len[m]; k++)
      lp_buf_printf(&b, "%s%d", k ? ", " : "", s->routes[m][k]);
    lp_buf_append(&b, "]", 1);
  }
  lp_buf_puts(&b, "],\n  \"actions\": [");
  for (int r = 0; r < s->ranks; r++) {
    lp_buf_puts(&b, r ? ",\n    [" : "\n    [");
    for (int i = 0; i < s->acts[r].n; i++) {
      if (i) lp_buf_puts(&b, ", ");
      lp_buf_json_string(&b, ACT_TEXT(&s->acts[r].v[i], t));
    }
    lp_buf_append(&b, "]", 1);
  }
  lp_buf_puts(&b, "\n  ]\n}\n");
  return lp_buf_take(&b);
}

/* ---- CSV import ---- */

typedef struct cell {
  lp_action a;
  int rank, line, col; /* col is 1-based */
} cell;

typedef struct csv_in {
  const char *origin;
  char *err;
  cell *c;
  size_t n, cap;
  int ranks;
} csv_in;

/* A (vstage, mb, position) record used to pair B with a later W. */
typedef struct bw_rec {
  int v, mb;
  size_t idx;
  int half; /* 0: plain action, 1: backward half of an FB */
  int is_w;
} bw_rec;

static lp_status cell_error(csv_in *in, int line, int rank, int col, const char *why) {
  lp_errf(in->err, "%s:%d: rank %d, cell %d: %s", in->origin, line, rank, col, why);
  return LP_ERR_PARSE;
}

static int is_blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\r'; }

/* Parses one trimmed-or-not cell [b, e) of row `rank`. */
static lp_status add_cell(csv_in *in, const char *b, const char *e, int line, int col,
                          int *any) {
  while (b < e && is_blank(*b)) b++;
  while (e > b && is_blank(e[-1])) e--;
  if (e - b >= 2 && *b == '"' && e[-1] == '"') {
    b++, e--;
    while (b < e && is_blank(*b)) b++;
    while (e > b && is_blank(e[-1])) e--;
  }
  if (b == e) return LP_OK;
  char text[256], why[LP_ERRLEN];
  if ((size_t)(e - b) >= sizeof text) {
    snprintf(why, sizeof why, "cell is too long (%zu characters)", (size_t)(e - b));
    return cell_error(in, line, in->ranks, col, why);
  }
  memcpy(text, b, (size_t)(e - b));
  text[e - b] = '\0';
  lp_action a;
  if (lp_action_parse(text, &a, why) != LP_OK) return cell_error(in, line, in->ranks, col, why);
  if (in->n == in->cap) {
    size_t cap = in->cap ? 2 * in->cap : 64;
    cell *c = lp_realloc(in->c, cap * sizeof *c);
    if (!c) return LP_ERR_NOMEM;
    in->c = c;
    in->cap = cap;
  }
  in->c[in->n++] = (cell){a, in->ranks, line, col};
  *any = 1;
  return LP_OK;
}

static lp_status split_rows(csv_in *in, const char *text) {
  const char *p = text;
  int line = 0;
  while (*p) {
    line++;
    const char *eol = strchr(p, '\n');
    if (!eol) eol = p + strlen(p);
    int col = 0, any = 0;
    const char *c = p;
    for (;;) {
      const char *ce = memchr(c, ',', (size_t)(eol - c));
      if (!ce) ce = eol;
      LP_CHECK(add_cell(in, c, ce, line, ++col, &any));
      if (ce == eol) break;
      c = ce + 1;
    }
    if (any) in->ranks++;
    p = *eol ? eol + 1 : eol;
  }
  return LP_OK;
}

static int cmp_bw(const void *x, const void *y) {
  const bw_rec *a = x, *b = y;
  if (a->v != b->v) return a->v < b->v ? -1 : 1;
  if (a->mb != b->mb) return a->mb < b->mb ? -1 : 1;
  if (a->idx != b->idx) return a->idx < b->idx ? -1 : 1;
  return a->half - b->half;
}

static int cmp_i64(const void *x, const void *y) {
  long long a = *(const long long *)x, b = *(const long long *)y;
  return a < b ? -1 : a > b;
}

/* Older spelling: a B followed later (same row, same stage and mb) by a W
 * is an I, with or without SEND/RECV in the CSV. */
static lp_status convert_old_bw(csv_in *in) {
  size_t nr = 0;
  bw_rec *r = lp_malloc((in->n ? in->n : 1) * sizeof *r);
  if (!r) return LP_ERR_NOMEM;
  for (size_t i = 0; i < in->n; i++) {
    const lp_action *a = &in->c[i].a;
    if (a->type == LP_ACT_B || a->type == LP_ACT_W)
      r[nr++] = (bw_rec){a->stage, a->mb, i, 0, a->type == LP_ACT_W};
    else if (a->type == LP_ACT_FB && a->btype == LP_ACT_B)
      r[nr++] = (bw_rec){a->bstage, a->bmb, i, 1, 0};
  }
  qsort(r, nr, sizeof *r, cmp_bw);
  /* within one (stage, mb) group, walk backwards remembering a later W */
  int later_w = 0;
  for (size_t j = nr; j-- > 0;) {
    if (j + 1 == nr || r[j].v != r[j + 1].v || r[j].mb != r[j + 1].mb) later_w = 0;
    if (r[j].is_w) {
      later_w = 1;
    } else if (later_w) {
      lp_action *a = &in->c[r[j].idx].a;
      if (r[j].half) a->btype = LP_ACT_I;
      else a->type = LP_ACT_I;
    }
  }
  lp_free(r);
  return LP_OK;
}

/* Base name of origin without directory and extension. */
static lp_status set_name_from(lp_schedule *s, const char *origin) {
  char name[256];
  const char *b = strrchr(origin, '/');
  b = b ? b + 1 : origin;
  snprintf(name, sizeof name, "%s", b);
  char *dot = strrchr(name, '.');
  if (dot && dot != name) *dot = '\0';
  return lp_schedule_set_name(s, name);
}

typedef struct infer {
  int V, M, S;
  int *vrank, *vline, *pos, *pos_mb; /* [V] */
  long long *keys;                   /* sorted (mb, vstage) of every F */
  size_t nkeys;
  size_t *mb_off;                    /* [M+1] into keys */
} infer;

static void infer_free(infer *f) {
  lp_free(f->vrank);
  lp_free(f->vline);
  lp_free(f->pos);
  lp_free(f->pos_mb);
  lp_free(f->keys);
  lp_free(f->mb_off);
}

static lp_status place_vstages(csv_in *in, infer *f) {
  int maxv = -1;
  for (size_t i = 0; i < in->n; i++) {
    const lp_action *a = &in->c[i].a;
    if (a->stage > maxv) maxv = a->stage;
    if (a->type == LP_ACT_FB && a->bstage > maxv) maxv = a->bstage;
  }
  if ((size_t)maxv >= 2 * in->n) {
    lp_errf(in->err, "%s: virtual stage ids must be 0..V-1 without gaps (the highest "
                     "is %d but there are only %zu actions)", in->origin, maxv, in->n);
    return LP_ERR_PARSE;
  }
  f->V = maxv + 1;
  f->vrank = lp_malloc((size_t)f->V * sizeof *f->vrank);
  f->vline = lp_malloc((size_t)f->V * sizeof *f->vline);
  if (!f->vrank || !f->vline) return LP_ERR_NOMEM;
  for (int v = 0; v < f->V; v++) f->vrank[v] = -1;
  for (size_t i = 0; i < in->n; i++) {
    const cell *c = &in->c[i];
    int vs[2] = {c->a.stage, c->a.type == LP_ACT_FB ? c->a.bstage : -1};
    for (int j = 0; j < 2; j++) {
      int v = vs[j];
      if (v < 0) continue;
      if (f->vrank[v] < 0) {
        f->vrank[v] = c->rank;
        f->vline[v] = c->line;
      } else if (f->vrank[v] != c->rank) {
        char t[LP_ACTION_TEXT_MAX];
        lp_errf(in->err, "%s:%d: rank %d, cell %d: action '%s': stage %d also appears "
                         "on rank %d (line %d); a virtual stage lives on one rank",
                in->origin, c->line, c->rank, c->col, ACT_TEXT(&c->a, t), v,
                f->vrank[v], f->vline[v]);
        return LP_ERR_PARSE;
      }
    }
  }
  for (int v = 0; v < f->V; v++) {
    if (f->vrank[v] < 0) {
      lp_errf(in->err, "%s: virtual stage %d never appears; virtual stage ids must be "
                       "0..%d without gaps", in->origin, v, f->V - 1);
      return LP_ERR_PARSE;
    }
  }
  return LP_OK;
}

static lp_status infer_routes(csv_in *in, infer *f) {
  int maxmb = -1;
  for (size_t i = 0; i < in->n; i++) {
    const lp_action *a = &in->c[i].a;
    if (a->mb > maxmb) maxmb = a->mb;
    if (a->type == LP_ACT_FB && a->bmb > maxmb) maxmb = a->bmb;
    if (a->type == LP_ACT_F || a->type == LP_ACT_FB) f->nkeys++;
  }
  if (maxmb < 0) {
    lp_errf(in->err, "%s: no action names a micro-batch", in->origin);
    return LP_ERR_PARSE;
  }
  if ((size_t)maxmb >= f->nkeys) {
    lp_errf(in->err, "%s: micro-batch ids must be 0..M-1 without gaps (the highest is "
                     "%d but there are only %zu forwards)", in->origin, maxmb, f->nkeys);
    return LP_ERR_PARSE;
  }
  f->M = maxmb + 1;
  f->keys = lp_malloc(f->nkeys * sizeof *f->keys);
  f->mb_off = lp_calloc((size_t)f->M + 1, sizeof *f->mb_off);
  f->pos = lp_malloc((size_t)f->V * sizeof *f->pos);
  f->pos_mb = lp_malloc((size_t)f->V * sizeof *f->pos_mb);
  if (!f->keys || !f->mb_off || !f->pos || !f->pos_mb) return LP_ERR_NOMEM;
  size_t n = 0;
  for (size_t i = 0; i < in->n; i++) {
    const lp_action *a = &in->c[i].a;
    if (a->type == LP_ACT_F || a->type == LP_ACT_FB)
      f->keys[n++] = (long long)a->mb * f->V + a->stage;
  }
  qsort(f->keys, n, sizeof *f->keys, cmp_i64);
  size_t u = 0; /* drop duplicates (validation reports them later) */
  for (size_t i = 0; i < n; i++)
    if (u == 0 || f->keys[u - 1] != f->keys[i]) f->keys[u++] = f->keys[i];
  f->nkeys = u;
  for (size_t i = 0; i < u; i++) f->mb_off[f->keys[i] / f->V + 1]++;
  for (int m = 0; m < f->M; m++) f->mb_off[m + 1] += f->mb_off[m];

  for (int v = 0; v < f->V; v++) f->pos[v] = -1;
  int longest = 0;
  for (int m = 0; m < f->M; m++) {
    int len = (int)(f->mb_off[m + 1] - f->mb_off[m]);
    if (len > (int)(f->mb_off[longest + 1] - f->mb_off[longest])) longest = m;
    for (int j = 0; j < len; j++) {
      int v = (int)(f->keys[f->mb_off[m] + (size_t)j] % f->V);
      if (f->pos[v] < 0) {
        f->pos[v] = j;
        f->pos_mb[v] = m;
      } else if (f->pos[v] != j) {
        lp_errf(in->err, "%s: stage %d is at position %d of micro-batch %d's route but at "
                         "position %d of micro-batch %d's route (a route is the stages "
                         "that forward a micro-batch, in increasing id order)",
                in->origin, v, f->pos[v], f->pos_mb[v], j, m);
        return LP_ERR_PARSE;
      }
    }
  }
  f->S = (int)(f->mb_off[longest + 1] - f->mb_off[longest]);
  for (int m = 0; m < f->M; m++) {
    int len = (int)(f->mb_off[m + 1] - f->mb_off[m]);
    if (len == 0) {
      lp_errf(in->err, "%s: micro-batch %d is never forwarded; micro-batch ids must be "
                       "0..%d without gaps", in->origin, m, f->M - 1);
      return LP_ERR_PARSE;
    }
    if (len < f->S) {
      int miss = 0;
      while (f->pos[miss] != len) miss++; /* exists: the longest route has one */
      lp_errf(in->err, "%s: micro-batch %d is forwarded on %d stage%s but micro-batch %d "
                       "on %d: it never reaches stage %d (or another copy of model "
                       "stage %d); every micro-batch must pass the same number of "
                       "stages", in->origin, m, len, LP_PLURAL(len), longest, f->S, miss, len);
      return LP_ERR_PARSE;
    }
  }
  for (int v = 0; v < f->V; v++) {
    if (f->pos[v] < 0) {
      lp_errf(in->err, "%s: stage %d never forwards a micro-batch, so its model stage "
                       "is unknown", in->origin, v);
      return LP_ERR_PARSE;
    }
  }
  return LP_OK;
}

static lp_status build_schedule(csv_in *in, infer *f, lp_schedule **out) {
  lp_schedule *s;
  char why[LP_ERRLEN];
  if (lp_schedule_check_counts(in->ranks, f->S, f->M, why) != LP_OK) {
    lp_errf(in->err, "%s: %s (rows are ranks)", in->origin, why);
    return LP_ERR_PARSE;
  }
  LP_CHECK(lp_schedule_new(in->ranks, f->S, f->M, &s));
  lp_status st;
  int *route = lp_malloc((size_t)f->S * sizeof *route);
  if (!route) {
    st = LP_ERR_NOMEM;
    goto fail;
  }
  LP_CHECK_GOTO(set_name_from(s, in->origin), st, fail);
  for (int v = 0; v < f->V; v++)
    LP_CHECK_GOTO(lp_schedule_add_vstage(s, f->pos[v], f->vrank[v], NULL), st, fail);
  for (int m = 0; m < f->M; m++) {
    for (int k = 0; k < f->S; k++)
      route[k] = (int)(f->keys[f->mb_off[m] + (size_t)k] % f->V);
    LP_CHECK_GOTO(lp_schedule_set_route(s, m, route, f->S), st, fail);
  }
  for (size_t i = 0; i < in->n; i++) {
    const cell *c = &in->c[i];
    st = lp_schedule_push(s, c->rank, &c->a);
    if (st == LP_ERR_NOMEM) goto fail;
    if (st != LP_OK) {
      lp_errf(in->err, "%s:%d: rank %d, cell %d: %s", in->origin, c->line, c->rank,
              c->col, s->err);
      goto fail;
    }
  }
  lp_free(route);
  *out = s;
  return LP_OK;
fail:
  if (st != LP_ERR_NOMEM) {
    if (!in->err[0]) lp_errf(in->err, "%s: %s", in->origin, s->err);
    st = LP_ERR_PARSE;
  }
  lp_free(route);
  lp_schedule_free(s);
  return st;
}

lp_status lp_schedule_from_csv(const char *text, const char *origin, lp_schedule **out,
                               char *err) {
  char local[LP_ERRLEN];
  csv_in in;
  infer f;
  memset(&in, 0, sizeof in);
  memset(&f, 0, sizeof f);
  *out = NULL;
  in.origin = origin ? origin : "csv";
  in.err = err ? err : local;
  in.err[0] = '\0';
  lp_status st;
  LP_CHECK_GOTO(split_rows(&in, text ? text : ""), st, done);
  if (in.n == 0) {
    lp_errf(in.err, "%s: no actions", in.origin);
    st = LP_ERR_PARSE;
    goto done;
  }
  LP_CHECK_GOTO(place_vstages(&in, &f), st, done);
  LP_CHECK_GOTO(convert_old_bw(&in), st, done);
  LP_CHECK_GOTO(infer_routes(&in, &f), st, done);
  LP_CHECK_GOTO(build_schedule(&in, &f, out), st, done);
done:
  if (st == LP_ERR_NOMEM) lp_errf(in.err, "%s: out of memory", in.origin);
  infer_free(&f);
  lp_free(in.c);
  return st;
}
