/* test_trace.c — the trace schema and its Chrome/Perfetto JSON: the
 * output parses, every event has ph/pid/tid/ts, processes and threads are
 * named, slices on one thread nest, flows are paired and bound to their
 * send/recv slices, counters are present; simulated units are ms; atomic
 * writes leave nothing behind on failure. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lp_schedule.h"
#include "lp_sim.h"
#include "lp_trace.h"

/* ---- a small JSON parser (enough to check the structure) ---- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
  jtype t;
  double num;
  char *str;
  struct jval **items; /* array items or object values */
  char **keys;         /* object keys */
  int n;
} jval;

typedef struct jparser {
  const char *p;
  int ok;
} jparser;

static void jfree(jval *v) {
  if (!v) return;
  for (int i = 0; i < v->n; i++) {
    jfree(v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->str);
  free(v);
}

static void ws(jparser *J) {
  while (*J->p == ' ' || *J->p == '\n' || *J->p == '\t' || *J->p == '\r')
    J->p++;
}

static char *jstring(jparser *J) {
  if (*J->p != '"') {
    J->ok = 0;
    return NULL;
  }
  J->p++;
  size_t cap = 16, n = 0;
  char *s = malloc(cap);
  while (*J->p && *J->p != '"') {
    char c = *J->p++;
    if (c == '\\') {
      c = *J->p++;
      if (c == 'n')
        c = '\n';
      else if (c == 't')
        c = '\t';
      else if (c == 'r')
        c = '\r';
      else if (c == 'u') {
        J->p += 4;
        c = '?';
      } else if (c != '"' && c != '\\' && c != '/')
        J->ok = 0;
    } else if ((unsigned char)c < 0x20) {
      J->ok = 0;
    }
    if (n + 2 > cap) s = realloc(s, cap *= 2);
    s[n++] = c;
  }
  if (*J->p != '"')
    J->ok = 0;
  else
    J->p++;
  s[n] = '\0';
  return s;
}

static jval *jparse(jparser *J);

static void jpush(jval *v, char *key, jval *item) {
  v->items = realloc(v->items, (size_t)(v->n + 1) * sizeof *v->items);
  if (v->t == J_OBJ) {
    v->keys = realloc(v->keys, (size_t)(v->n + 1) * sizeof *v->keys);
    v->keys[v->n] = key;
  }
  v->items[v->n++] = item;
}

static jval *jparse(jparser *J) {
  ws(J);
  jval *v = calloc(1, sizeof *v);
  char c = *J->p;
  if (c == '{' || c == '[') {
    v->t = c == '{' ? J_OBJ : J_ARR;
    char close = c == '{' ? '}' : ']';
    J->p++;
    ws(J);
    if (*J->p == close) {
      J->p++;
      return v;
    }
    while (J->ok) {
      ws(J);
      char *key = NULL;
      if (v->t == J_OBJ) {
        key = jstring(J);
        ws(J);
        if (*J->p != ':')
          J->ok = 0;
        else
          J->p++;
      }
      jpush(v, key, jparse(J));
      ws(J);
      if (*J->p == ',') {
        J->p++;
      } else if (*J->p == close) {
        J->p++;
        break;
      } else {
        J->ok = 0;
      }
    }
  } else if (c == '"') {
    v->t = J_STR;
    v->str = jstring(J);
  } else if (strncmp(J->p, "true", 4) == 0 || strncmp(J->p, "false", 5) == 0) {
    v->t = J_BOOL;
    v->num = *J->p == 't';
    J->p += *J->p == 't' ? 4 : 5;
  } else if (strncmp(J->p, "null", 4) == 0) {
    v->t = J_NULL;
    J->p += 4;
  } else {
    char *end;
    v->t = J_NUM;
    v->num = strtod(J->p, &end);
    if (end == J->p) J->ok = 0;
    J->p = end;
  }
  return v;
}

static jval *parse_json(const char *text) {
  jparser J = {text, 1};
  jval *v = jparse(&J);
  ws(&J);
  if (!J.ok || *J.p != '\0') fail_msg("invalid JSON near: %.60s", J.p);
  return v;
}

static jval *get(const jval *o, const char *key) {
  if (!o || o->t != J_OBJ) return NULL;
  for (int i = 0; i < o->n; i++)
    if (strcmp(o->keys[i], key) == 0) return o->items[i];
  return NULL;
}

static const char *sget(const jval *o, const char *key) {
  jval *v = get(o, key);
  return v && v->t == J_STR ? v->str : NULL;
}

static double nget(const jval *o, const char *key) {
  jval *v = get(o, key);
  if (!v || v->t != J_NUM) fail_msg("field %s missing or not a number", key);
  return v->num;
}

/* ---- schedules ---- */

static lp_schedule *linear(int P, int M) {
  lp_schedule *s;
  assert_int_equal(lp_schedule_new(P, P, M, &s), LP_OK);
  for (int i = 0; i < P; i++)
    assert_int_equal(lp_schedule_add_vstage(s, i, i, NULL), LP_OK);
  int route[16];
  for (int i = 0; i < P; i++)
    route[i] = i;
  for (int m = 0; m < M; m++)
    assert_int_equal(lp_schedule_set_route(s, m, route, P), LP_OK);
  return s;
}

static void push(lp_schedule *s, int rank, int stage, char type, int mb) {
  char t[32];
  snprintf(t, sizeof t, "%d%c%d", stage, type, mb);
  assert_int_equal(lp_schedule_push_text(s, rank, t), LP_OK);
}

static lp_schedule *onef1b(int P, int M) {
  lp_schedule *s = linear(P, M);
  for (int r = 0; r < P; r++) {
    int f = 0, b = 0;
    for (int k = 0; k < P - 1 - r && f < M; k++)
      push(s, r, r, 'F', f++);
    while (b < M) {
      if (f < M) push(s, r, r, 'F', f++);
      push(s, r, r, 'B', b++);
    }
  }
  return s;
}

static lp_sim_result *simulate(lp_schedule *s, double latency) {
  lp_sim_cost c;
  lp_sim_cost_init(&c);
  c.t.f = 1;
  c.t.b = 2;
  c.latency = latency;
  lp_sim_result *r;
  char err[LP_ERRLEN];
  if (lp_sim_run(s, &c, &r, err) != LP_OK) fail_msg("simulate: %s", err);
  return r;
}

static char *json_of(const lp_sim_result *r) {
  lp_trace *t;
  assert_int_equal(lp_trace_from_sim(r, &t), LP_OK);
  char *json = lp_trace_to_json(t);
  assert_non_null(json);
  lp_trace_free(t);
  return json;
}

/* ---- structural checks shared by the tests ---- */

typedef struct summary {
  int slices, flows_s, flows_f, counters, process_names, thread_names;
} summary;

/* Checks the properties every trace must have; fills *out. */
static void check_structure(const jval *root, int ranks, summary *out) {
  memset(out, 0, sizeof *out);
  assert_non_null(root);
  assert_int_equal(root->t, J_OBJ);
  const char *unit = sget(root, "displayTimeUnit");
  assert_non_null(unit);
  assert_string_equal(unit, "ms");
  jval *ev = get(root, "traceEvents");
  assert_non_null(ev);
  assert_int_equal(ev->t, J_ARR);
  int *named = calloc((size_t)ranks, sizeof *named);
  for (int i = 0; i < ev->n; i++) {
    jval *e = ev->items[i];
    assert_int_equal(e->t, J_OBJ);
    const char *ph = sget(e, "ph");
    if (!ph || !get(e, "pid") || !get(e, "tid") || !get(e, "ts"))
      fail_msg("event %d lacks ph, pid, tid or ts", i);
    int pid = (int)nget(e, "pid");
    assert_true(pid >= 0 && pid < ranks);
    if (strcmp(ph, "X") == 0) {
      out->slices++;
      assert_true(nget(e, "dur") >= 0);
      assert_non_null(sget(e, "name"));
      assert_non_null(get(e, "args"));
    } else if (strcmp(ph, "s") == 0 || strcmp(ph, "f") == 0) {
      assert_non_null(get(e, "id"));
      assert_string_equal(sget(e, "bp"), "e");
      if (ph[0] == 's')
        out->flows_s++;
      else
        out->flows_f++;
    } else if (strcmp(ph, "C") == 0) {
      out->counters++;
      jval *args = get(e, "args");
      assert_non_null(args);
      nget(args, "value");
    } else if (strcmp(ph, "M") == 0) {
      const char *name = sget(e, "name");
      jval *args = get(e, "args");
      assert_non_null(args);
      if (strcmp(name, "process_name") == 0) {
        char want[32];
        snprintf(want, sizeof want, "rank %d", pid);
        assert_string_equal(sget(args, "name"), want);
        named[pid]++;
        out->process_names++;
      } else if (strcmp(name, "thread_name") == 0) {
        out->thread_names++;
      }
    } else {
      fail_msg("unexpected phase %s", ph);
    }
  }
  for (int r = 0; r < ranks; r++)
    assert_int_equal(named[r], 1);
  free(named);
}

/* The X slice on (pid, tid) enclosing ts, or NULL. */
static jval *enclosing(const jval *ev, int pid, int tid, double ts) {
  for (int i = 0; i < ev->n; i++) {
    jval *e = ev->items[i];
    if (strcmp(sget(e, "ph"), "X") != 0) continue;
    if ((int)nget(e, "pid") != pid || (int)nget(e, "tid") != tid) continue;
    double s = nget(e, "ts"), d = nget(e, "dur");
    if (s <= ts + 1e-6 && ts <= s + d + 1e-6) return e;
  }
  return NULL;
}

/* Flows: each id has one "s" and one "f", each bound to a send / recv slice. */
static void check_flows(const jval *root, int forward) {
  jval *ev = get(root, "traceEvents");
  for (int i = 0; i < ev->n; i++) {
    jval *e = ev->items[i];
    if (strcmp(sget(e, "ph"), "s") != 0) continue;
    double id = nget(e, "id");
    int ends = 0;
    jval *end = NULL;
    for (int k = 0; k < ev->n; k++) {
      jval *g = ev->items[k];
      if (strcmp(sget(g, "ph"), "f") == 0 && nget(g, "id") == id) {
        ends++;
        end = g;
      }
    }
    assert_int_equal(ends, 1);
    assert_string_equal(sget(e, "cat"), sget(end, "cat"));
    assert_string_equal(sget(e, "name"), sget(end, "name"));
    jval *ss =
        enclosing(ev, (int)nget(e, "pid"), (int)nget(e, "tid"), nget(e, "ts"));
    jval *rs = enclosing(ev, (int)nget(end, "pid"), (int)nget(end, "tid"),
                         nget(end, "ts"));
    if (!ss || !rs) fail_msg("flow %g is not bound to slices", id);
    assert_non_null(strstr(sget(ss, "name"), "send "));
    assert_non_null(strstr(sget(rs, "name"), "recv "));
    if (forward) assert_true(nget(end, "ts") >= nget(e, "ts") - 1e-6);
  }
}

/* Slices on one thread never overlap partially. */
static void check_nesting(const jval *root) {
  jval *ev = get(root, "traceEvents");
  for (int i = 0; i < ev->n; i++) {
    jval *a = ev->items[i];
    if (strcmp(sget(a, "ph"), "X") != 0) continue;
    for (int k = i + 1; k < ev->n; k++) {
      jval *b = ev->items[k];
      if (strcmp(sget(b, "ph"), "X") != 0) continue;
      if (nget(a, "pid") != nget(b, "pid") || nget(a, "tid") != nget(b, "tid"))
        continue;
      double as = nget(a, "ts"), ae = as + nget(a, "dur");
      double bs = nget(b, "ts"), be = bs + nget(b, "dur");
      int disjoint = ae <= bs + 1e-6 || be <= as + 1e-6;
      int nested = (as <= bs && be <= ae) || (bs <= as && ae <= be);
      if (!disjoint && !nested)
        fail_msg("slices %s [%g,%g] and %s [%g,%g] overlap on one thread",
                 sget(a, "name"), as, ae, sget(b, "name"), bs, be);
    }
  }
}

static jval *find_slice(const jval *root, const char *name) {
  jval *ev = get(root, "traceEvents");
  for (int i = 0; i < ev->n; i++) {
    jval *e = ev->items[i];
    if (strcmp(sget(e, "ph"), "X") == 0 && strcmp(sget(e, "name"), name) == 0)
      return e;
  }
  return NULL;
}

/* ---- tests ---- */

static void test_sim_trace_structure(void **state) {
  (void)state;
  lp_schedule *s = linear(2, 1);
  push(s, 0, 0, 'F', 0);
  push(s, 0, 0, 'B', 0);
  push(s, 1, 1, 'F', 0);
  push(s, 1, 1, 'B', 0);
  lp_sim_result *r = simulate(s, 0.5);
  char *json = json_of(r);
  jval *root = parse_json(json);
  summary sm;
  check_structure(root, 2, &sm);
  assert_int_equal(sm.slices,
                   4 + 2 * 2); /* 4 actions, 2 messages x send+recv */
  assert_int_equal(sm.flows_s, 2);
  assert_int_equal(sm.flows_f, 2);
  assert_int_equal(sm.process_names, 2);
  assert_true(sm.thread_names >= 4); /* compute and comm per rank */
  assert_true(sm.counters > 0);
  check_flows(root, 1);
  check_nesting(root);
  /* one simulated unit = 1 ms = 1000 us */
  jval *f1 = find_slice(root, "1F0");
  assert_non_null(f1);
  assert_true(nget(f1, "ts") == 1500 && nget(f1, "dur") == 1000);
  assert_int_equal((int)nget(f1, "pid"), 1);
  assert_int_equal((int)nget(f1, "tid"), 0);
  jval *args = get(f1, "args");
  assert_true(nget(args, "stage") == 1 && nget(args, "mb") == 0 &&
              nget(args, "index") == 0);
  assert_string_equal(sget(args, "action"), "1F0");
  jval *send = find_slice(root, "send 0F0 to rank 1");
  assert_non_null(send);
  assert_true(nget(send, "ts") == 1000 && nget(send, "dur") == 500);
  assert_int_equal((int)nget(send, "tid"), 1);
  assert_non_null(find_slice(root, "recv 0F0 from rank 0"));
  /* counters: "live activations" on both ranks */
  jval *ev = get(root, "traceEvents");
  int live[2] = {0, 0};
  for (int i = 0; i < ev->n; i++) {
    jval *e = ev->items[i];
    if (strcmp(sget(e, "ph"), "C") == 0 &&
        strcmp(sget(e, "name"), "live activations") == 0)
      live[(int)nget(e, "pid")]++;
  }
  assert_true(live[0] > 0 && live[1] > 0);
  jfree(root);
  lp_free(json);
  lp_sim_result_free(r);
  lp_schedule_free(s);
}

/* Many messages at once (1F1B, long latency): comm slices overlap and go
 * to extra lanes; everything still nests and every flow binds. */
static void test_overlapping_messages(void **state) {
  (void)state;
  lp_schedule *s = onef1b(4, 8);
  lp_sim_result *r = simulate(s, 2.5);
  char *json = json_of(r);
  jval *root = parse_json(json);
  summary sm;
  check_structure(root, 4, &sm);
  int nmsg;
  lp_sim_messages(r, &nmsg);
  assert_int_equal(sm.flows_s, nmsg);
  assert_int_equal(sm.flows_f, nmsg);
  assert_true(sm.thread_names > 8); /* some "comm 2" lanes */
  check_flows(root, 1);
  check_nesting(root);
  assert_non_null(strstr(json, "\"comm 2\""));
  jfree(root);
  lp_free(json);
  lp_sim_result_free(r);
  lp_schedule_free(s);
}

/* The schema by hand: unknown slice indices are looked up by time. */
static void test_manual_trace(void **state) {
  (void)state;
  lp_trace *t = lp_trace_new();
  assert_non_null(t);
  lp_trace_event e;
  lp_trace_event_init(&e);
  e.rank = 0;
  e.kind = LP_TRACE_COMPUTE;
  snprintf(e.name, sizeof e.name, "matmul \"big\"");
  e.start_us = 0;
  e.dur_us = 10;
  assert_int_equal(lp_trace_add_event(t, &e, NULL), LP_OK);
  e.kind = LP_TRACE_SEND;
  snprintf(e.name, sizeof e.name, "send x");
  e.start_us = 10;
  e.dur_us = 5;
  assert_int_equal(lp_trace_add_event(t, &e, NULL), LP_OK);
  e.rank = 1;
  e.kind = LP_TRACE_RECV;
  snprintf(e.name, sizeof e.name, "recv x");
  e.start_us = 2;
  e.dur_us = 14;
  assert_int_equal(lp_trace_add_event(t, &e, NULL), LP_OK);
  e.kind = 7;
  assert_int_equal(lp_trace_add_event(t, &e, NULL), LP_ERR_ARG);
  lp_trace_flow f = {.id = 42,
                     .from_rank = 0,
                     .to_rank = 1,
                     .from_us = 10,
                     .to_us = 15,
                     .from_event = -1,
                     .to_event = -1};
  assert_int_equal(lp_trace_add_flow(t, &f), LP_OK);
  lp_trace_counter c = {.rank = 1, .time_us = 3, .value = 2.5};
  snprintf(c.name, sizeof c.name, "live activations");
  assert_int_equal(lp_trace_add_counter(t, &c), LP_OK);
  assert_int_equal(lp_trace_ranks(t), 2);
  char *json = lp_trace_to_json(t);
  jval *root = parse_json(json);
  summary sm;
  check_structure(root, 2, &sm);
  assert_int_equal(sm.slices, 3);
  assert_int_equal(sm.counters, 1);
  check_flows(root, 0);
  assert_non_null(find_slice(root, "matmul \"big\""));
  jfree(root);
  lp_free(json);
  lp_trace_free(t);
}

static int leftovers(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (strstr(de->d_name, ".tmp")) n++;
  closedir(d);
  return n;
}

static void test_atomic_write(void **state) {
  (void)state;
  lp_schedule *s = onef1b(2, 2);
  lp_sim_result *r = simulate(s, 0);
  lp_trace *t;
  assert_int_equal(lp_trace_from_sim(r, &t), LP_OK);
  char err[LP_ERRLEN];

  /* a directory that does not exist */
  const char *bad = "/nonexistent-luapipe-dir/trace.json";
  assert_int_equal(lp_trace_write_json(t, bad, err), LP_ERR_IO);
  assert_non_null(strstr(err, bad));
  struct stat st;
  assert_int_not_equal(stat(bad, &st), 0);

  /* the target is a directory: the rename fails, the temp file goes */
  char dir[] = "/tmp/lp_trace_test_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char target[256], good[256];
  snprintf(target, sizeof target, "%s/sub", dir);
  assert_int_equal(mkdir(target, 0755), 0);
  assert_int_equal(lp_trace_write_json(t, target, err), LP_ERR_IO);
  assert_non_null(strstr(err, target));
  assert_int_equal(leftovers(dir), 0);

  /* a good write: the file holds exactly the JSON */
  snprintf(good, sizeof good, "%s/t.json", dir);
  assert_int_equal(lp_trace_write_json(t, good, NULL), LP_OK);
  char *json = lp_trace_to_json(t);
  FILE *fp = fopen(good, "rb");
  assert_non_null(fp);
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
  buf[n] = '\0';
  fclose(fp);
  assert_string_equal(buf, json);
  assert_int_equal(leftovers(dir), 0);
  /* overwriting keeps it whole */
  assert_int_equal(lp_write_file_atomic(good, "x", 1, err), LP_OK);
  fp = fopen(good, "rb");
  assert_int_equal(fread(buf, 1, (size_t)n, fp), 1);
  fclose(fp);

  free(buf);
  lp_free(json);
  unlink(good);
  rmdir(target);
  rmdir(dir);
  lp_trace_free(t);
  lp_sim_result_free(r);
  lp_schedule_free(s);
}

/* Same input, same bytes. */
static void test_deterministic_json(void **state) {
  (void)state;
  lp_schedule *s = onef1b(4, 8);
  lp_sim_result *a = simulate(s, 0.3), *b = simulate(s, 0.3);
  char *ja = json_of(a), *jb = json_of(b);
  assert_string_equal(ja, jb);
  lp_free(ja);
  lp_free(jb);
  lp_sim_result_free(a);
  lp_sim_result_free(b);
  lp_schedule_free(s);
}

static lp_trace_event msg_event(int rank, int kind, int peer, int tag, int64_t step,
                                double start, double dur) {
  lp_trace_event e;
  lp_trace_event_init(&e);
  e.rank = rank;
  e.kind = kind;
  snprintf(e.name, sizeof e.name, "%s", kind == LP_TRACE_SEND ? "send" : "recv");
  e.peer = peer;
  e.tag = tag;
  e.step = step;
  e.start_us = start;
  e.dur_us = dur;
  return e;
}

/* Messages pair by (sender, receiver, tag, step), never by name; a packed
 * trace unpacks to the same events; times shift to start at 0. */
static void test_link_pack_origin(void **state) {
  (void)state;
  lp_trace *a = lp_trace_new(), *b = lp_trace_new();
  assert_non_null(a);
  assert_non_null(b);
  /* rank 0 sends tag 5 in steps 1 and 2 to rank 1; a stray send tag 6 */
  lp_trace_event ev[] = {
      msg_event(0, LP_TRACE_SEND, 1, 5, 1, 100, 1),
      msg_event(0, LP_TRACE_SEND, 1, 5, 2, 300, 1),
      msg_event(0, LP_TRACE_SEND, 1, 6, 1, 150, 1),
      msg_event(1, LP_TRACE_RECV, 0, 5, 2, 320, 30), /* arrives 350 */
      msg_event(1, LP_TRACE_RECV, 0, 5, 1, 90, 40),  /* arrives 130 */
  };
  for (int i = 0; i < 3; i++) assert_int_equal(lp_trace_add_event(a, &ev[i], NULL), LP_OK);
  lp_trace_counter c = {1, "live activations", 95, 2};
  assert_int_equal(lp_trace_add_counter(a, &c), LP_OK);
  lp_trace_marker m = {1, "step 1", 80};
  assert_int_equal(lp_trace_add_marker(b, &m), LP_OK);
  for (int i = 3; i < 5; i++) assert_int_equal(lp_trace_add_event(b, &ev[i], NULL), LP_OK);
  void *buf = NULL;
  size_t n = 0;
  assert_int_equal(lp_trace_pack(b, &buf, &n), LP_OK);
  assert_int_equal(lp_trace_unpack_append(a, buf, n - 1), LP_ERR_PARSE);
  assert_int_equal(lp_trace_unpack_append(a, buf, n), LP_OK);
  lp_free(buf);
  int ne, nf, nm;
  const lp_trace_event *e = lp_trace_events(a, &ne);
  assert_int_equal(ne, 5);
  assert_int_equal(e[3].tag, 5);
  assert_int_equal((int)e[3].step, 2);
  assert_int_equal(lp_trace_link_messages(a), LP_OK);
  const lp_trace_flow *f = lp_trace_flows(a, &nf);
  assert_int_equal(nf, 2);
  e = lp_trace_events(a, &ne);
  /* step 1: [100, 130] on both sides; step 2: [300, 350] */
  assert_true(e[0].start_us == 100 && e[0].dur_us == 30);
  assert_true(e[4].start_us == 100 && e[4].dur_us == 30);
  assert_true(e[1].start_us == 300 && e[1].dur_us == 50);
  assert_true(e[3].start_us == 300 && e[3].dur_us == 50);
  assert_true(e[2].dur_us == 1); /* unpaired: untouched */
  for (int i = 0; i < nf; i++) assert_true(f[i].from_event >= 0 && f[i].to_event >= 0);
  lp_trace_start_at_zero(a);
  const lp_trace_marker *mk = lp_trace_markers(a, &nm);
  assert_int_equal(nm, 1);
  assert_true(mk[0].time_us == 0); /* the marker at 80 was the earliest */
  e = lp_trace_events(a, &ne);
  assert_true(e[0].start_us == 20);
  char *json = lp_trace_to_json(a);
  assert_non_null(json);
  assert_non_null(strstr(json, "\"name\":\"step 1\",\"cat\":\"marker\",\"ph\":\"i\""));
  assert_non_null(strstr(json, "\"peer\":1,\"tag\":5,\"step\":1"));
  lp_free(json);
  lp_trace_free(a);
  lp_trace_free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sim_trace_structure),
      cmocka_unit_test(test_overlapping_messages),
      cmocka_unit_test(test_manual_trace),
      cmocka_unit_test(test_atomic_write),
      cmocka_unit_test(test_deterministic_json),
      cmocka_unit_test(test_link_pack_origin),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
