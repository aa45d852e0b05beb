/* schedule.c — the IR object and the action text form. */
#include "schedule_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *type_names[LP_ACT__COUNT] = {
    "F", "B", "I", "W", "OVERLAP_F_B", "SEND_F", "RECV_F", "SEND_B", "RECV_B",
    "REDUCE_GRAD", "WAIT_REDUCE_GRAD", "UNSHARD", "RESHARD"};

const char *lp_action_type_name(int type) {
  return (type >= 0 && type < LP_ACT__COUNT) ? type_names[type] : "?";
}

int lp_action_is_compute(int type) { return type >= LP_ACT_F && type <= LP_ACT_FB; }

static const char *const kind_names[LP_NKINDS] = {"F", "B", "I", "W", "FB"};
_Static_assert((int)LP_ACT_FB - (int)LP_ACT_F + 1 == (int)LP_NKINDS &&
                   (int)LP_ACT_F == (int)LP_KIND_F && (int)LP_ACT_FB == (int)LP_KIND_FB,
               "a compute kind is its compute action type");

const char *lp_kind_name(int kind) {
  return kind >= 0 && kind < LP_NKINDS ? kind_names[kind] : NULL;
}

int lp_kind_of(int type) { return lp_action_is_compute(type) ? type - LP_ACT_F : -1; }

int lp_action_is_p2p(int type) { return type >= LP_ACT_SEND_F && type <= LP_ACT_RECV_B; }

int lp_action_has_mb(int type) {
  return type < LP_ACT_REDUCE_GRAD || type >= LP_ACT__COUNT;
}

void lp_action_format(const lp_action *a, char *buf, size_t len) {
  if (a->type == LP_ACT_FB) {
    snprintf(buf, len, "(%dF%d;%d%s%d)OVERLAP_F_B", a->stage, a->mb, a->bstage,
             a->btype == LP_ACT_I ? "I" : "B", a->bmb);
  } else if (!lp_action_has_mb(a->type) || a->mb < 0) {
    snprintf(buf, len, "%d%s", a->stage, lp_action_type_name(a->type));
  } else {
    snprintf(buf, len, "%d%s%d", a->stage, lp_action_type_name(a->type), a->mb);
  }
}

/* Numbers in an action's text beyond this are refused while parsing (the
 * schedule's own limits, far lower, are checked when it is built). */
#define LP_ACTION_NUMBER_MAX 100000000

/* Parses "<int><TYPE>[<int>]" from [p, end). */
static lp_status parse_simple(const char *p, const char *end, lp_action *out,
                              char *err, const char *whole) {
  char type[32];
  size_t tn = 0;
  long stage = -1, mb = -1;
  const char *q = p, *what = "stage";
  if (q == end || !isdigit((unsigned char)*q)) goto bad;
  stage = 0;
  while (q < end && isdigit((unsigned char)*q)) {
    stage = stage * 10 + (*q++ - '0');
    if (stage > LP_ACTION_NUMBER_MAX) goto too_large;
  }
  while (q < end && (isalpha((unsigned char)*q) || *q == '_')) {
    if (tn + 1 >= sizeof type) goto bad;
    type[tn++] = (char)toupper((unsigned char)*q++);
  }
  type[tn] = '\0';
  if (tn == 0) goto bad;
  if (q < end) {
    if (!isdigit((unsigned char)*q)) goto bad;
    mb = 0;
    what = "micro-batch";
    while (q < end && isdigit((unsigned char)*q)) {
      mb = mb * 10 + (*q++ - '0');
      if (mb > LP_ACTION_NUMBER_MAX) goto too_large;
    }
  }
  if (q != end) goto bad;
  memset(out, 0, sizeof *out);
  out->type = -1;
  if (strcmp(type, "BW") == 0) out->type = LP_ACT_B;
  for (int t = 0; t < LP_ACT__COUNT && out->type < 0; t++)
    if (t != LP_ACT_FB && strcmp(type, type_names[t]) == 0) out->type = t;
  if (out->type < 0) {
    if (err)
      lp_errf(err, "action '%s': unknown action type '%s' (expected F, B, I, "
                   "W, SEND_F, RECV_F, SEND_B, RECV_B, REDUCE_GRAD, "
                   "WAIT_REDUCE_GRAD, UNSHARD, RESHARD or an OVERLAP_F_B pair)",
              whole, type);
    return LP_ERR_PARSE;
  }
  out->stage = (int32_t)stage;
  out->mb = (int32_t)mb;
  out->btype = out->bstage = out->bmb = -1;
  if (!lp_action_has_mb(out->type)) {
    if (mb >= 0) {
      if (err) lp_errf(err, "action '%s': %s takes no micro-batch", whole, type);
      return LP_ERR_PARSE;
    }
  } else if (mb < 0) {
    if (err) lp_errf(err, "action '%s': missing micro-batch number after %s", whole, type);
    return LP_ERR_PARSE;
  }
  return LP_OK;
too_large:
  if (err)
    lp_errf(err, "action '%s': the %s number is too large (at most %d)", whole, what,
            LP_ACTION_NUMBER_MAX);
  return LP_ERR_PARSE;
bad:
  if (err)
    lp_errf(err, "action '%s': expected <stage><TYPE><microbatch> such as 0F3, "
                 "7I2 or 2SEND_F1", whole);
  return LP_ERR_PARSE;
}

lp_status lp_action_parse(const char *text, lp_action *out, char *err) {
  char whole[LP_ACTION_TEXT_MAX * 2];
  const char *b = text, *e = text + strlen(text);
  while (b < e && isspace((unsigned char)*b)) b++;
  while (e > b && isspace((unsigned char)e[-1])) e--;
  size_t n = (size_t)(e - b);
  if (n >= sizeof whole) n = sizeof whole - 1;
  memcpy(whole, b, n);
  whole[n] = '\0';
  if (b == e) {
    if (err) lp_errf(err, "empty action");
    return LP_ERR_PARSE;
  }
  if (*b != '(') return parse_simple(b, e, out, err, whole);

  static const char suffix[] = ")OVERLAP_F_B";
  size_t sl = sizeof suffix - 1;
  const char *semi = memchr(b, ';', (size_t)(e - b));
  if ((size_t)(e - b) < sl + 2 || strncmp(e - sl, suffix, sl) != 0 || !semi) {
    if (err)
      lp_errf(err, "action '%s': an overlapped pair is written "
                   "(<stage>F<mb>;<stage>B<mb>)OVERLAP_F_B", whole);
    return LP_ERR_PARSE;
  }
  lp_action h1, h2;
  LP_CHECK(parse_simple(b + 1, semi, &h1, err, whole));
  LP_CHECK(parse_simple(semi + 1, e - sl, &h2, err, whole));
  if (h1.type != LP_ACT_F) { /* accept (B;F) and normalise to (F;B) */
    lp_action t = h1;
    h1 = h2;
    h2 = t;
  }
  if (h1.type != LP_ACT_F || (h2.type != LP_ACT_B && h2.type != LP_ACT_I)) {
    if (err)
      lp_errf(err, "action '%s': an overlapped pair needs one F and one B or I", whole);
    return LP_ERR_PARSE;
  }
  *out = h1;
  out->type = LP_ACT_FB;
  out->btype = h2.type;
  out->bstage = h2.stage;
  out->bmb = h2.mb;
  return LP_OK;
}

/* ---- the schedule object ---- */

static int count_ok(long long v, long long max, const char *what, char *err) {
  if (v >= 1 && v <= max) return 1;
  if (err) lp_errf(err, "%s must be 1..%lld, got %lld", what, max, v);
  return 0;
}

lp_status lp_schedule_check_counts(long long ranks, long long stages, long long microbatches,
                                   char *err) {
  if (!count_ok(ranks, LP_SCHEDULE_MAX_RANKS, "ranks", err) ||
      !count_ok(stages, LP_SCHEDULE_MAX_STAGES, "stages", err) ||
      !count_ok(microbatches, LP_SCHEDULE_MAX_MICROBATCHES, "microbatches", err))
    return LP_ERR_ARG;
  if (stages * microbatches > LP_SCHEDULE_MAX_CELLS) {
    if (err)
      lp_errf(err, "stages x microbatches = %lld x %lld is over the limit of %lld", stages,
              microbatches, (long long)LP_SCHEDULE_MAX_CELLS);
    return LP_ERR_ARG;
  }
  return LP_OK;
}

lp_status lp_schedule_new(int ranks, int stages, int microbatches,
                          lp_schedule **out) {
  *out = NULL;
  if (lp_schedule_check_counts(ranks, stages, microbatches, NULL) != LP_OK) return LP_ERR_ARG;
  lp_schedule *s = lp_calloc(1, sizeof *s);
  if (!s) return LP_ERR_NOMEM;
  s->ranks = ranks;
  s->stages = stages;
  s->microbatches = microbatches;
  s->routes = lp_calloc((size_t)microbatches, sizeof *s->routes);
  s->route_len = lp_calloc((size_t)microbatches, sizeof *s->route_len);
  s->acts = lp_calloc((size_t)ranks, sizeof *s->acts);
  if (!s->routes || !s->route_len || !s->acts) {
    lp_schedule_free(s);
    return LP_ERR_NOMEM;
  }
  *out = s;
  return LP_OK;
}

void lp_schedule_free(lp_schedule *s) {
  if (!s) return;
  if (s->routes)
    for (int m = 0; m < s->microbatches; m++) lp_free(s->routes[m]);
  if (s->acts)
    for (int r = 0; r < s->ranks; r++) lp_free(s->acts[r].v);
  lp_free(s->routes);
  lp_free(s->route_len);
  lp_free(s->acts);
  lp_free(s->vst);
  lp_free(s->name);
  lp_free(s);
}

lp_schedule *lp_schedule_clone(const lp_schedule *s) {
  lp_schedule *c;
  if (lp_schedule_new(s->ranks, s->stages, s->microbatches, &c) != LP_OK) return NULL;
  if (s->name && lp_schedule_set_name(c, s->name) != LP_OK) goto fail;
  for (int v = 0; v < s->nvst; v++)
    if (lp_schedule_add_vstage(c, s->vst[v].stage, s->vst[v].rank, NULL) != LP_OK) goto fail;
  for (int m = 0; m < s->microbatches; m++)
    if (s->routes[m] &&
        lp_schedule_set_route(c, m, s->routes[m], s->route_len[m]) != LP_OK)
      goto fail;
  for (int r = 0; r < s->ranks; r++)
    for (int i = 0; i < s->acts[r].n; i++)
      if (lp_schedule_push(c, r, &s->acts[r].v[i]) != LP_OK) goto fail;
  return c;
fail:
  lp_schedule_free(c);
  return NULL;
}

const char *lp_schedule_last_error(const lp_schedule *s) { return s->err; }

lp_status lp_schedule_set_name(lp_schedule *s, const char *name) {
  char *d = lp_strdup(name);
  if (!d) return LP_ERR_NOMEM;
  lp_free(s->name);
  s->name = d;
  return LP_OK;
}

const char *lp_schedule_name(const lp_schedule *s) { return s->name ? s->name : ""; }
int lp_schedule_ranks(const lp_schedule *s) { return s->ranks; }
int lp_schedule_stages(const lp_schedule *s) { return s->stages; }
int lp_schedule_microbatches(const lp_schedule *s) { return s->microbatches; }
int lp_schedule_vstages(const lp_schedule *s) { return s->nvst; }

int lp_schedule_vstage_stage(const lp_schedule *s, int v) {
  return (v >= 0 && v < s->nvst) ? s->vst[v].stage : -1;
}

int lp_schedule_vstage_rank(const lp_schedule *s, int v) {
  return (v >= 0 && v < s->nvst) ? s->vst[v].rank : -1;
}

lp_status lp_schedule_add_vstage(lp_schedule *s, int stage, int rank, int *id) {
  if (stage < 0 || stage >= s->stages) {
    lp_errf(s->err, "virtual stage %d: model stage %d is out of range 0..%d",
            s->nvst, stage, s->stages - 1);
    return LP_ERR_ARG;
  }
  if (rank < 0 || rank >= s->ranks) {
    lp_errf(s->err, "virtual stage %d: rank %d is out of range 0..%d", s->nvst,
            rank, s->ranks - 1);
    return LP_ERR_ARG;
  }
  if (s->nvst >= LP_SCHEDULE_MAX_VSTAGES) {
    lp_errf(s->err, "virtual stage %d: a schedule holds at most %d virtual stages", s->nvst,
            LP_SCHEDULE_MAX_VSTAGES);
    return LP_ERR_ARG;
  }
  if (s->nvst == s->capvst) {
    int cap = s->capvst ? 2 * s->capvst : 8;
    vstage_info *v = lp_realloc(s->vst, (size_t)cap * sizeof *v);
    if (!v) return LP_ERR_NOMEM;
    s->vst = v;
    s->capvst = cap;
  }
  s->vst[s->nvst].stage = stage;
  s->vst[s->nvst].rank = rank;
  if (id) *id = s->nvst;
  s->nvst++;
  return LP_OK;
}

lp_status lp_schedule_set_route(lp_schedule *s, int mb, const int *v, int n) {
  if (mb < 0 || mb >= s->microbatches) {
    lp_errf(s->err, "route: micro-batch %d is out of range 0..%d", mb,
            s->microbatches - 1);
    return LP_ERR_ARG;
  }
  if (n != s->stages) {
    lp_errf(s->err, "route of micro-batch %d has %d virtual stages; the model "
                    "has %d stages", mb, n, s->stages);
    return LP_ERR_ARG;
  }
  for (int k = 0; k < n; k++) {
    if (v[k] < 0 || v[k] >= s->nvst) {
      lp_errf(s->err, "route of micro-batch %d: virtual stage %d does not exist", mb, v[k]);
      return LP_ERR_ARG;
    }
    if (s->vst[v[k]].stage != k) {
      lp_errf(s->err, "route of micro-batch %d: position %d is virtual stage %d "
                      "(model stage %d), expected model stage %d", mb, k, v[k],
              s->vst[v[k]].stage, k);
      return LP_ERR_ARG;
    }
  }
  int *copy = lp_malloc((size_t)n * sizeof *copy);
  if (!copy) return LP_ERR_NOMEM;
  memcpy(copy, v, (size_t)n * sizeof *copy);
  lp_free(s->routes[mb]);
  s->routes[mb] = copy;
  s->route_len[mb] = n;
  return LP_OK;
}

const int *lp_schedule_route(const lp_schedule *s, int mb, int *n) {
  if (mb < 0 || mb >= s->microbatches || !s->routes[mb]) {
    *n = 0;
    return NULL;
  }
  *n = s->route_len[mb];
  return s->routes[mb];
}

static int check_ref(lp_schedule *s, int rank, const lp_action *a, int v, int mb) {
  char t[LP_ACTION_TEXT_MAX];
  if (v < 0 || v >= s->nvst) {
    lp_errf(s->err, "rank %d, action %d (%s): virtual stage %d does not exist "
                    "(the schedule has %d)", rank, s->acts[rank].n, ACT_TEXT(a, t),
            v, s->nvst);
    return 0;
  }
  if (s->vst[v].rank != rank) {
    lp_errf(s->err, "rank %d, action %d (%s): virtual stage %d is placed on "
                    "rank %d, not rank %d", rank, s->acts[rank].n, ACT_TEXT(a, t),
            v, s->vst[v].rank, rank);
    return 0;
  }
  if (lp_action_has_mb(a->type) && (mb < 0 || mb >= s->microbatches)) {
    lp_errf(s->err, "rank %d, action %d (%s): micro-batch %d is out of range "
                    "0..%d", rank, s->acts[rank].n, ACT_TEXT(a, t), mb,
            s->microbatches - 1);
    return 0;
  }
  return 1;
}

lp_status lp_schedule_push(lp_schedule *s, int rank, const lp_action *a) {
  if (rank < 0 || rank >= s->ranks) {
    lp_errf(s->err, "rank %d is out of range 0..%d", rank, s->ranks - 1);
    return LP_ERR_ARG;
  }
  if (a->type < 0 || a->type >= LP_ACT__COUNT) {
    lp_errf(s->err, "rank %d, action %d: unknown action type %d", rank,
            s->acts[rank].n, a->type);
    return LP_ERR_ARG;
  }
  if (!check_ref(s, rank, a, a->stage, a->mb)) return LP_ERR_ARG;
  if (a->type == LP_ACT_FB) {
    if ((a->btype != LP_ACT_B && a->btype != LP_ACT_I) ||
        !check_ref(s, rank, a, a->bstage, a->bmb))
      return LP_ERR_ARG;
  }
  action_list *l = &s->acts[rank];
  if (s->nacts >= LP_SCHEDULE_MAX_ACTIONS) {
    lp_errf(s->err, "rank %d, action %d: a schedule holds at most %lld actions (all ranks "
                    "together)", rank, l->n, (long long)LP_SCHEDULE_MAX_ACTIONS);
    return LP_ERR_ARG;
  }
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    lp_action *v = lp_realloc(l->v, (size_t)cap * sizeof *v);
    if (!v) return LP_ERR_NOMEM;
    l->v = v;
    l->cap = cap;
  }
  lp_action c = *a;
  if (c.type != LP_ACT_FB) c.btype = c.bstage = c.bmb = -1;
  if (!lp_action_has_mb(c.type)) c.mb = -1;
  l->v[l->n++] = c;
  s->nacts++;
  return LP_OK;
}

lp_status lp_schedule_push_text(lp_schedule *s, int rank, const char *text) {
  lp_action a;
  char err[LP_ERRLEN];
  if (lp_action_parse(text, &a, err) != LP_OK) {
    lp_errf(s->err, "rank %d, action %d: %s", rank,
            (rank >= 0 && rank < s->ranks) ? s->acts[rank].n : 0, err);
    return LP_ERR_PARSE;
  }
  return lp_schedule_push(s, rank, &a);
}

const lp_action *lp_schedule_actions(const lp_schedule *s, int rank, int *n) {
  if (rank < 0 || rank >= s->ranks) {
    *n = 0;
    return NULL;
  }
  *n = s->acts[rank].n;
  return s->acts[rank].v;
}

void lp_schedule_clear_rank(lp_schedule *s, int rank) {
  if (rank >= 0 && rank < s->ranks) {
    s->nacts -= s->acts[rank].n;
    s->acts[rank].n = 0;
  }
}

void lp_schedule_truncate_rank(lp_schedule *s, int rank, int n) {
  if (rank >= 0 && rank < s->ranks && n >= 0 && n < s->acts[rank].n) {
    s->nacts -= s->acts[rank].n - n;
    s->acts[rank].n = n;
  }
}

int lp_schedule_has_comm(const lp_schedule *s) {
  for (int r = 0; r < s->ranks; r++)
    for (int i = 0; i < s->acts[r].n; i++)
      if (lp_action_is_p2p(s->acts[r].v[i].type)) return 1;
  return 0;
}
