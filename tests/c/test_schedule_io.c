/* test_schedule_io.c — action text, CSV (PyTorch format) and JSON I/O of
 * the schedule IR: exact output, round trips, older spellings, tolerant
 * reading, error messages with file:line, and out-of-memory paths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "schedule_fixtures.h"

/* ---- a tiny JSON syntax checker (enough to prove the output is JSON) ---- */

static const char *js_value(const char *p);

static const char *js_ws(const char *p) {
  while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
  return p;
}

static const char *js_string(const char *p) {
  if (*p != '"') return NULL;
  for (p++; *p && *p != '"'; p++) {
    if ((unsigned char)*p < 0x20) return NULL;
    if (*p == '\\') {
      p++;
      if (!*p || !strchr("\"\\/bfnrtu", *p)) return NULL;
    }
  }
  return *p == '"' ? p + 1 : NULL;
}

static const char *js_seq(const char *p, char close, int object) {
  p = js_ws(p + 1);
  if (*p == close) return p + 1;
  for (;;) {
    if (object) {
      p = js_string(js_ws(p));
      if (!p) return NULL;
      p = js_ws(p);
      if (*p++ != ':') return NULL;
    }
    p = js_value(p);
    if (!p) return NULL;
    p = js_ws(p);
    if (*p == close) return p + 1;
    if (*p++ != ',') return NULL;
  }
}

static const char *js_value(const char *p) {
  p = js_ws(p);
  if (*p == '{') return js_seq(p, '}', 1);
  if (*p == '[') return js_seq(p, ']', 0);
  if (*p == '"') return js_string(p);
  if (!strncmp(p, "null", 4) || !strncmp(p, "true", 4)) return p + 4;
  if (!strncmp(p, "false", 5)) return p + 5;
  const char *q = p;
  if (*q == '-') q++;
  while (*q >= '0' && *q <= '9') q++;
  return q > p ? q : NULL;
}

static int is_json(const char *text) {
  const char *p = js_value(text);
  return p && *js_ws(p) == '\0';
}

/* ---- helpers ---- */

static lp_schedule *csv_ok(const char *text, const char *origin) {
  lp_schedule *s = NULL;
  char err[LP_ERRLEN] = "";
  lp_status st = lp_schedule_from_csv(text, origin, &s, err);
  if (st != LP_OK) print_error("from_csv: %s\n", err);
  assert_int_equal(st, LP_OK);
  assert_non_null(s);
  return s;
}

static void csv_err(const char *text, const char *expect) {
  lp_schedule *s = (lp_schedule *)1;
  char err[LP_ERRLEN] = "";
  assert_int_not_equal(lp_schedule_from_csv(text, "file.csv", &s, err), LP_OK);
  assert_null(s);
  if (!strstr(err, expect)) print_error("got: %s\nwant: %s\n", err, expect);
  assert_non_null(strstr(err, expect));
}

static void roundtrip(lp_schedule *s, const char *origin, const char *name) {
  char *csv = lp_schedule_to_csv(s);
  assert_non_null(csv);
  lp_schedule *t = csv_ok(csv, origin);
  fx_assert_same(s, t);
  assert_string_equal(lp_schedule_name(t), name);
  char *again = lp_schedule_to_csv(t);
  assert_string_equal(csv, again);
  lp_free(again);
  lp_free(csv);
  lp_schedule_free(t);
}

/* ---- tests ---- */

static void test_action_text(void **state) {
  (void)state;
  const char *same[] = {"0F3", "7I2", "7W2", "12B0", "2SEND_F1", "3RECV_F1", "3SEND_B1",
                        "2RECV_B1", "3REDUCE_GRAD", "3WAIT_REDUCE_GRAD", "0UNSHARD",
                        "0RESHARD", "(0F7;7B3)OVERLAP_F_B",
                        "(6F6;1I0)OVERLAP_F_B"};
  for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
    lp_action a;
    char t[LP_ACTION_TEXT_MAX];
    assert_int_equal(lp_action_parse(same[i], &a, NULL), LP_OK);
    lp_action_format(&a, t, sizeof t);
    assert_string_equal(t, same[i]);
  }
  lp_action a;
  char t[LP_ACTION_TEXT_MAX], err[LP_ERRLEN];
  assert_int_equal(lp_action_parse(" 5BW3 ", &a, NULL), LP_OK); /* older spelling */
  assert_int_equal(a.type, LP_ACT_B);
  assert_int_equal(lp_action_parse("(7B3;0F7)OVERLAP_F_B", &a, NULL), LP_OK);
  lp_action_format(&a, t, sizeof t);
  assert_string_equal(t, "(0F7;7B3)OVERLAP_F_B");
  assert_int_equal(lp_action_parse("0X3", &a, err), LP_ERR_PARSE);
  assert_non_null(strstr(err, "action '0X3': unknown action type 'X'"));
  /* a number too large is named, not a format error */
  assert_int_equal(lp_action_parse("0F99999999999", &a, err), LP_ERR_PARSE);
  assert_string_equal(err, "action '0F99999999999': the micro-batch number is too large "
                           "(at most 100000000)");
  assert_int_equal(lp_action_parse("99999999999SEND_F0", &a, err), LP_ERR_PARSE);
  assert_string_equal(err, "action '99999999999SEND_F0': the stage number is too large "
                           "(at most 100000000)");
  assert_int_equal(lp_action_parse("100000000F100000000", &a, NULL), LP_OK);
}

static void test_csv_export_exact(void **state) {
  (void)state;
  lp_schedule *s = fx_1f1b(2, 2, 0);
  char *csv = lp_schedule_to_csv(s);
  assert_string_equal(csv, "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  lp_free(csv);
  lp_schedule_free(s);

  s = fx_dualpipe();
  csv = lp_schedule_to_csv(s);
  const char *row0 = "0F0,0F1,0F2,7F4,7I4,7W4,7F5,(0F3;7B5)OVERLAP_F_B,"
                     "(7F6;0B0)OVERLAP_F_B,7B6,(7F7;0B1)OVERLAP_F_B,7B7,0I2,0W2,0I3,0W3\n";
  assert_memory_equal(csv, row0, strlen(row0));
  assert_non_null(strstr(csv, "\n4F4,4F5,4F6,3F0,3I0,3W0,3F1,(4F7;3B1)OVERLAP_F_B,"));
  lp_free(csv);
  lp_schedule_free(s);
}

static void test_csv_roundtrip(void **state) {
  (void)state;
  lp_schedule *s = fx_1f1b(4, 8, 0);
  roundtrip(s, "runs/1f1b.csv", "1f1b");
  lp_schedule_free(s);

  s = fx_1f1b(4, 8, 1); /* I/W split */
  roundtrip(s, "zb.v2.csv", "zb.v2");
  lp_schedule_free(s);

  s = fx_dualpipe();
  roundtrip(s, "/tmp/x/dualpipe.csv", "dualpipe");
  /* with REDUCE_GRAD of both copies at the end of each rank */
  for (int r = 0; r < 4; r++) {
    char a[32];
    snprintf(a, sizeof a, "%dREDUCE_GRAD %dREDUCE_GRAD", r, 7 - r);
    fx_push(s, r, a);
  }
  assert_int_equal(lp_schedule_validate(s), LP_OK);
  roundtrip(s, "dp", "dp");
  /* lowered: SEND/RECV cells */
  lp_schedule *low;
  assert_int_equal(lp_schedule_lower(s, &low), LP_OK);
  roundtrip(low, "low.csv", "low");
  lp_schedule_free(low);
  lp_schedule_free(s);
}

static void test_csv_tolerant(void **state) {
  (void)state;
  const char *text = "\n"
                     " 0F0 , \"0F1\",, 0B0,0B1,,\r\n"
                     ",,\r\n"
                     "\"1F0\",1B0,1F1,1B1\r\n"
                     "\r\n";
  lp_schedule *s = csv_ok(text, "odd.csv");
  lp_schedule *want = fx_1f1b(2, 2, 0);
  fx_assert_same(s, want);
  char *csv = lp_schedule_to_csv(s);
  assert_string_equal(csv, "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  lp_free(csv);
  assert_string_equal(lp_schedule_name(s), "odd");
  lp_schedule_free(s);
  lp_schedule_free(want);

  /* no final newline, NULL origin */
  lp_schedule *t = NULL;
  char err[LP_ERRLEN];
  assert_int_equal(lp_schedule_from_csv("0F0,0B0", NULL, &t, err), LP_OK);
  assert_string_equal(lp_schedule_name(t), "csv");
  assert_int_equal(lp_schedule_validate(t), LP_OK);
  lp_schedule_free(t);
}

static void test_count_limits(void **state) {
  (void)state;
  char err[LP_ERRLEN];
  lp_schedule *s = (lp_schedule *)1;
  assert_int_equal(lp_schedule_check_counts(4294967298LL, 2, 2, err), LP_ERR_ARG);
  assert_string_equal(err, "ranks must be 1..4096, got 4294967298");
  assert_int_equal(lp_schedule_check_counts(2, 0, 2, err), LP_ERR_ARG);
  assert_string_equal(err, "stages must be 1..65536, got 0");
  assert_int_equal(lp_schedule_check_counts(2, 2, 100000000, err), LP_ERR_ARG);
  assert_string_equal(err, "microbatches must be 1..65536, got 100000000");
  assert_int_equal(lp_schedule_check_counts(2, 2048, 65536, err), LP_ERR_ARG);
  assert_string_equal(err, "stages x microbatches = 2048 x 65536 is over the limit of 67108864");
  assert_int_equal(lp_schedule_check_counts(4096, 1024, 65536, err), LP_OK);
  assert_int_equal(lp_schedule_new(4097, 2, 2, &s), LP_ERR_ARG);
  assert_null(s);
}

static void test_csv_old_spelling(void **state) {
  (void)state;
  /* BW = full backward; B then W of the same stage and mb = I */
  lp_schedule *s = csv_ok("0F0,0F1,0B0,0W0,0BW1\n1F0,1B0,1W0,1F1,1B1,1W1\n", "old.csv");
  char *csv = lp_schedule_to_csv(s);
  assert_string_equal(csv, "0F0,0F1,0I0,0W0,0B1\n1F0,1I0,1W0,1F1,1I1,1W1\n");
  lp_free(csv);
  assert_int_equal(lp_schedule_validate(s), LP_OK);
  lp_schedule_free(s);

  /* also the backward half of an overlapped pair; a W before the B does
   * not convert */
  s = csv_ok("0F0,0F1,(0F2;0B0)OVERLAP_F_B,0W0,0B1,0B2\n", "x.csv");
  csv = lp_schedule_to_csv(s);
  assert_string_equal(csv, "0F0,0F1,(0F2;0I0)OVERLAP_F_B,0W0,0B1,0B2\n");
  lp_free(csv);
  lp_schedule_free(s);

  /* also in a lowered CSV (PyTorch's *_comms.csv files) */
  s = csv_ok("0F0,0SEND_F0,0RECV_B0,0B0,0W0\n1RECV_F0,1F0,1B0,1SEND_B0\n", "l.csv");
  csv = lp_schedule_to_csv(s);
  assert_string_equal(csv, "0F0,0SEND_F0,0RECV_B0,0I0,0W0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  lp_free(csv);
  assert_int_equal(lp_schedule_validate(s), LP_OK);
  lp_schedule_free(s);
}

static void test_csv_inference(void **state) {
  (void)state;
  /* a V placement: vstages 0 and 3 on rank 0, 1 and 2 on rank 1 */
  lp_schedule *s = csv_ok("0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n", "v.csv");
  assert_int_equal(lp_schedule_ranks(s), 2);
  assert_int_equal(lp_schedule_stages(s), 4);
  assert_int_equal(lp_schedule_microbatches(s), 1);
  assert_int_equal(lp_schedule_vstages(s), 4);
  int want_rank[4] = {0, 1, 1, 0};
  for (int v = 0; v < 4; v++) {
    assert_int_equal(lp_schedule_vstage_stage(s, v), v);
    assert_int_equal(lp_schedule_vstage_rank(s, v), want_rank[v]);
  }
  int n;
  const int *route = lp_schedule_route(s, 0, &n);
  assert_int_equal(n, 4);
  for (int k = 0; k < 4; k++) assert_int_equal(route[k], k);
  assert_int_equal(lp_schedule_validate(s), LP_OK);
  lp_schedule_free(s);

  /* two copies of one model stage (DualPipe-like) */
  s = csv_ok("0F0,3F1,3B1,0B0\n2F1,1F0,1B0,2B1\n", "two.csv");
  assert_int_equal(lp_schedule_stages(s), 2);
  assert_int_equal(lp_schedule_vstage_stage(s, 2), 0);
  assert_int_equal(lp_schedule_vstage_stage(s, 3), 1);
  assert_int_equal(lp_schedule_validate(s), LP_OK);
  lp_schedule_free(s);
}

static void test_csv_errors(void **state) {
  (void)state;
  csv_err("0F0,0B0\n1F0,1B0\n2F0,2B0,,,0X3\n",
          "file.csv:3: rank 2, cell 5: action '0X3': unknown action type 'X'");
  csv_err("0F0,0B0\n\n1F0,1B0,0W0\n",
          "file.csv:3: rank 1, cell 3: action '0W0': stage 0 also appears on rank 0 "
          "(line 1); a virtual stage lives on one rank");
  csv_err("0F0,0B0\n2F0,2B0\n",
          "file.csv: virtual stage 1 never appears; virtual stage ids must be 0..2 "
          "without gaps");
  csv_err("0F0,0F1,0B0,0B1\n1F0,2F1,1B0,2B1\n2F0,2B0\n",
          "file.csv:3: rank 2, cell 1: action '2F0': stage 2 also appears on rank 1");
  csv_err("0F0,0F1,1F1,1B1,0B0,0B1\n2F0,2B0,2F1,2B1\n",
          "file.csv: stage 2 is at position 1 of micro-batch 0's route but at position 2 "
          "of micro-batch 1's route");
  csv_err("0F0,0F1,0B0,0B1\n1F0,1B0\n",
          "file.csv: micro-batch 1 is forwarded on 1 stage but micro-batch 0 on 2: it "
          "never reaches stage 1 (or another copy of model stage 1)");
  csv_err("0F0,0F2,0B0,0B2\n1F0,1F2,1B0,1B2\n",
          "file.csv: micro-batch 1 is never forwarded; micro-batch ids must be 0..2");
  csv_err("0F0,0B0,1REDUCE_GRAD\n",
          "file.csv: stage 1 never forwards a micro-batch, so its model stage is unknown");
  csv_err("0F0,0B99\n", "file.csv: micro-batch ids must be 0..M-1 without gaps");
  csv_err("0F0,9B0\n", "file.csv: virtual stage ids must be 0..V-1 without gaps");
  csv_err(" , ,\n\n", "file.csv: no actions");
  csv_err("", "file.csv: no actions");
  csv_err("0F0,(0F1;0X0)OVERLAP_F_B\n", "file.csv:1: rank 0, cell 2: action "
                                        "'(0F1;0X0)OVERLAP_F_B': unknown action type");
}

static void test_json(void **state) {
  (void)state;
  lp_schedule *s = fx_1f1b(2, 2, 0);
  lp_schedule_set_name(s, "a\"b");
  char *j = lp_schedule_to_json(s);
  assert_string_equal(j, "{\n"
                         "  \"name\": \"a\\\"b\",\n"
                         "  \"ranks\": 2,\n"
                         "  \"stages\": 2,\n"
                         "  \"microbatches\": 2,\n"
                         "  \"virtual_stages\": [{\"id\": 0, \"stage\": 0, \"rank\": 0}, "
                         "{\"id\": 1, \"stage\": 1, \"rank\": 1}],\n"
                         "  \"routes\": [[0, 1], [0, 1]],\n"
                         "  \"actions\": [\n"
                         "    [\"0F0\", \"0F1\", \"0B0\", \"0B1\"],\n"
                         "    [\"1F0\", \"1B0\", \"1F1\", \"1B1\"]\n"
                         "  ]\n"
                         "}\n");
  assert_true(is_json(j));
  lp_free(j);
  lp_schedule_free(s);

  s = fx_dualpipe();
  lp_schedule *low;
  assert_int_equal(lp_schedule_lower(s, &low), LP_OK);
  j = lp_schedule_to_json(low);
  assert_true(is_json(j));
  assert_non_null(strstr(j, "\"name\": \"dualpipe\""));
  assert_non_null(strstr(j, "{\"id\": 7, \"stage\": 3, \"rank\": 0}]"));
  assert_non_null(strstr(j, "\"routes\": [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], "
                            "[0, 1, 2, 3], [4, 5, 6, 7],"));
  assert_non_null(strstr(j, "\"(0F3;7B5)OVERLAP_F_B\""));
  assert_non_null(strstr(j, "\"0SEND_F0\""));
  assert_false(is_json("{\"a\": [1, 2,]}")); /* the checker itself rejects junk */
  lp_free(j);
  lp_schedule_free(low);
  lp_schedule_free(s);

  /* unset routes are null */
  assert_int_equal(lp_schedule_new(1, 1, 2, &s), LP_OK);
  j = lp_schedule_to_json(s);
  assert_true(is_json(j));
  assert_non_null(strstr(j, "\"routes\": [null, null]"));
  assert_non_null(strstr(j, "\"actions\": [\n    []\n  ]"));
  lp_free(j);
  lp_schedule_free(s);
}

static void test_io_out_of_memory(void **state) {
  (void)state;
  lp_schedule *s = fx_dualpipe();
  lp_schedule *low;
  assert_int_equal(lp_schedule_lower(s, &low), LP_OK);
  char *want_csv = lp_schedule_to_csv(low), *want_json = lp_schedule_to_json(low);
  long k, fails = 0;
  for (k = 0;; k++) {
    lp_test_oom_arm(k, 0);
    char *csv = lp_schedule_to_csv(low), *json = lp_schedule_to_json(low);
    lp_schedule *t = NULL;
    char err[LP_ERRLEN] = "";
    lp_status st = lp_schedule_from_csv(want_csv, "oom.csv", &t, err);
    int failed = lp_test_oom_state.failed;
    if (csv) assert_string_equal(csv, want_csv);
    if (json) assert_string_equal(json, want_json);
    if (st == LP_OK) {
      assert_non_null(t);
      fx_assert_same(low, t);
    } else {
      assert_int_equal(st, LP_ERR_NOMEM);
      assert_null(t);
      assert_string_equal(err, "oom.csv: out of memory");
    }
    lp_free(csv);
    lp_free(json);
    lp_schedule_free(t);
    long live = lp_test_oom_state.live;
    lp_test_oom_disarm();
    assert_int_equal(live, 0);
    if (!failed) break;
    fails++;
  }
  assert_true(fails > 10);
  lp_free(want_csv);
  lp_free(want_json);
  lp_schedule_free(low);
  lp_schedule_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_action_text),      cmocka_unit_test(test_csv_export_exact),
      cmocka_unit_test(test_csv_roundtrip),    cmocka_unit_test(test_csv_tolerant),
      cmocka_unit_test(test_csv_old_spelling),
      cmocka_unit_test(test_count_limits), cmocka_unit_test(test_csv_inference),
      cmocka_unit_test(test_csv_errors),       cmocka_unit_test(test_json),
      cmocka_unit_test(test_io_out_of_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
