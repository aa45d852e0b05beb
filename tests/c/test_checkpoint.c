/* test_checkpoint.c — checkpoints of the executor on one process (self
 * comm): optimizer state export/import (SGD momentum, AdamW moments and
 * step count); save after step 2, load into a fresh executor, and steps 3-4
 * give bitwise the losses and parameters of the run that never stopped
 * (while a fresh executor without the load does not); the error paths, each
 * naming the file: missing, truncated, a flipped byte, bad magic, another
 * schedule, another model, another optimizer — and a failed load changes
 * nothing; a save that cannot be written leaves the old checkpoint intact;
 * lp_write_file_atomic. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec_fixtures.h"
#include "lp_exec.h"

#define D_IN 5
#define D_OUT 3
#define BATCH 4
#define MB 4

static int d_hidden = 7; /* changed to build "another model" */
static int moe_hidden = 0; /* > 0: stage 1 starts with an MoE layer (4 experts, top-2) */

/* stage 0: linear(5,H) + gelu; stage 1: linear(H,3), or with moe_hidden
 * an MoE layer then linear(H,3) */
static lp_status build_stage(int stage, lp_nn_layer **out) {
  if (stage == 0 || moe_hidden <= 0) return fx_mlp_stage(stage, 2, D_IN, d_hidden, D_OUT, 42, out);
  lp_nn_layer *ls[2] = {NULL, NULL};
  lp_nn_moe_opts mo = {.dim = d_hidden, .hidden = moe_hidden, .experts = 4, .topk = 2,
                       .bias_speed = 0.05f};
  lp_status st = lp_nn_moe_new("layers.2", &mo, 42, &ls[0]);
  if (st == LP_OK) st = lp_nn_linear_new("layers.3", d_hidden, D_OUT, 1, 42, &ls[1]);
  if (st == LP_OK) st = lp_nn_chunk_new("stage.1", ls, 2, out);
  lp_nn_layer_release(ls[0]);
  lp_nn_layer_release(ls[1]);
  return st;
}

static lp_status chunk_fn(void *ud, int stage, lp_nn_layer **out, char *err) {
  (void)ud;
  (void)err;
  return build_stage(stage, out);
}

static lp_status data_fn(void *ud, int64_t step, int mb, lp_tensor **in, lp_tensor **tg,
                         char *err) {
  (void)ud;
  (void)err;
  fx_wave_data(step, mb, 2, (int64_t[]){BATCH, D_IN}, 2, (int64_t[]){BATCH, D_OUT}, in, tg);
  return LP_OK;
}

static int act_ndim[2] = {0, 2};
static int64_t act_shape[2][LP_TENSOR_MAXDIM] = {{0}, {BATCH, 7}};

static lp_exec_opts opts_of(lp_nn_optim_type kind) {
  lp_exec_opts o;
  memset(&o, 0, sizeof o);
  o.chunk = chunk_fn;
  o.data = data_fn;
  o.loss = LP_NN_LOSS_MSE;
  act_shape[1][1] = d_hidden;
  o.act_ndim = act_ndim;
  o.act_shape = (const int64_t(*)[LP_TENSOR_MAXDIM])act_shape;
  o.optim = kind;
  o.sgd = (lp_nn_sgd_opts){0.1f, 0.9f, 0.0f};
  o.adamw = (lp_nn_adamw_opts){0.01f, 0.9f, 0.999f, 1e-8f, 0.01f};
  return o;
}

/* One rank, two stages, split backward (I then W later), named `name`. */
static lp_schedule *sched(const char *name) {
  static const char *const acts[] = {"0F0", "1F0", "1I0", "0I0", "0F1", "1F1", "1I1", "0I1",
                                     "1W0", "0W0", "0F2", "1F2", "1I2", "0I2", "1W1", "0W1",
                                     "0F3", "1F3", "1I3", "0I3", "1W2", "0W2", "1W3", "0W3"};
  return fx_two_stage(MB, acts, (int)(sizeof acts / sizeof *acts), 1, name);
}

static lp_exec *new_exec(const char *name, lp_nn_optim_type kind) {
  lp_schedule *s = sched(name);
  lp_exec_opts o = opts_of(kind);
  lp_exec *e = NULL;
  char err[LP_ERRLEN] = "";
  if (lp_exec_new(s, &o, &e, err) != LP_OK) fail_msg("lp_exec_new: %s", err);
  lp_schedule_free(s);
  return e;
}

static double step(lp_exec *e, int64_t k) {
  double l = 0;
  if (lp_exec_step(e, k, &l) != LP_OK)
    fail_msg("step %lld: %s", (long long)k, lp_exec_last_error(e));
  return l;
}

/* 1: every parameter of a and b is bitwise equal. */
static int same_params(const lp_exec *a, const lp_exec *b) {
  assert_int_equal(lp_exec_vstages(a), lp_exec_vstages(b));
  for (int i = 0; i < lp_exec_vstages(a); i++) {
    size_t na, nb;
    const lp_nn_param *pa = lp_nn_params(lp_exec_vstage_chunk(a, i), &na);
    const lp_nn_param *pb = lp_nn_params(lp_exec_vstage_chunk(b, i), &nb);
    assert_int_equal(na, nb);
    for (size_t j = 0; j < na; j++)
      if (!lp_tensor_equal(pa[j].value, pb[j].value)) return 0;
  }
  return 1;
}

static char tmpdir[256];

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/lp_test_ckpt_XXXXXX");
  assert_non_null(mkdtemp(tmpdir));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_optim_state(void **state) {
  (void)state;
  lp_nn_layer *l = NULL;
  assert_int_equal(lp_nn_linear_new("fc", 3, 2, 1, 1, &l), LP_OK);
  size_t np;
  const lp_nn_param *p = lp_nn_params(l, &np);
  lp_nn_sgd_opts so = {0.1f, 0.9f, 0.0f};
  lp_nn_adamw_opts ao = {0.01f, 0.9f, 0.999f, 1e-8f, 0.0f};
  lp_nn_optim *sgd = NULL, *a1 = NULL, *a2 = NULL;
  assert_int_equal(lp_nn_optim_sgd_new(p, np, &so, &sgd), LP_OK);
  assert_int_equal(lp_nn_optim_adamw_new(p, np, &ao, &a1), LP_OK);
  assert_int_equal(lp_nn_optim_adamw_new(p, np, &ao, &a2), LP_OK);
  assert_string_equal(lp_nn_optim_kind(sgd), "sgd");
  assert_string_equal(lp_nn_optim_kind(a1), "adamw");
  assert_int_equal(lp_nn_optim_state_numel(sgd), 8);
  assert_int_equal(lp_nn_optim_state_numel(a1), 16);
  for (size_t i = 0; i < np; i++) assert_int_equal(lp_tensor_fill(p[i].grad, 0.5f), LP_OK);
  assert_int_equal(lp_nn_optim_step(a1), LP_OK);
  assert_int_equal(lp_nn_optim_step(a1), LP_OK);
  float buf[16], back[16];
  int64_t t = -1;
  assert_int_equal(lp_nn_optim_state_export(a1, buf, 15, &t), LP_ERR_ARG);
  assert_int_equal(lp_nn_optim_state_export(a1, buf, 16, &t), LP_OK);
  assert_int_equal(t, 2);
  assert_true(buf[0] != 0.0f && buf[15] != 0.0f); /* m and v were written */
  assert_int_equal(lp_nn_optim_state_import(a2, buf, 8, 2), LP_ERR_ARG);
  assert_int_equal(lp_nn_optim_state_import(a2, buf, 16, -1), LP_ERR_ARG);
  assert_int_equal(lp_nn_optim_steps(a2), 0); /* untouched */
  assert_int_equal(lp_nn_optim_state_import(a2, buf, 16, 2), LP_OK);
  assert_int_equal(lp_nn_optim_steps(a2), 2);
  assert_int_equal(lp_nn_optim_state_export(a2, back, 16, NULL), LP_OK);
  assert_memory_equal(buf, back, sizeof buf);
  lp_nn_optim_free(sgd);
  lp_nn_optim_free(a1);
  lp_nn_optim_free(a2);
  lp_nn_layer_release(l);
}

/* FNV-1a 64, as the checkpoint's checksum */
static uint64_t fnv(const unsigned char *p, size_t n) {
  uint64_t h = 14695981039346656037ULL;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

/* A cursor over a checkpoint's bytes (the checksum's 8 left out). */
typedef struct cur {
  const unsigned char *p;
  size_t n, at;
} cur;
static const unsigned char *take(cur *c, size_t k) {
  assert_true(k <= c->n - c->at);
  c->at += k;
  return c->p + c->at - k;
}
static uint32_t take_u32(cur *c) {
  uint32_t v;
  memcpy(&v, take(c, 4), 4);
  return v;
}
static int64_t take_i64(cur *c) {
  int64_t v;
  memcpy(&v, take(c, 8), 8);
  return v;
}

/* Rewrites the version-3 checkpoint `from` as version 2 at `to`: the same
 * file without the per-parameter step counts (version 2 had none), the
 * version field and the checksum made right. ep: the EP size. */
static void to_version2(const char *from, const char *to, int ep) {
  FILE *f = fopen(from, "rb");
  assert_non_null(f);
  static unsigned char in[1 << 16], out[1 << 16];
  size_t n = fread(in, 1, sizeof in, f), o = 0, last = 0;
  fclose(f);
  assert_true(n > 16 && n < sizeof in);
  cur c = {in, n - 8, 0};
  take(&c, 8 + 4 + 4 + 4 * 5); /* magic, version, bom, rank, P, S, V, M */
  for (int k = 0; k < 2; k++) take(&c, take_u32(&c)); /* schedule, optimizer */
  take(&c, 4 + 4 + 8);                                 /* ep, ep rank, step */
  uint32_t nloc = take_u32(&c);
  for (uint32_t i = 0; i < nloc; i++) { /* MoE records */
    uint32_t nm = take_u32(&c);
    for (uint32_t m = 0; m < nm; m++) {
      uint32_t E = take_u32(&c), spr = take_u32(&c);
      take(&c, 4 * (size_t)spr * (size_t)ep + 4 * (size_t)E);
    }
  }
  for (uint32_t i = 0; i < nloc; i++) {
    take(&c, 4 + 4 + 8); /* id, stage, optimizer steps */
    uint32_t np = take_u32(&c);
    size_t floats = 0;
    for (uint32_t j = 0; j < np; j++) {
      take(&c, take_u32(&c));
      uint32_t nd = take_u32(&c);
      int64_t cnt = 1;
      for (uint32_t d = 0; d < nd; d++) cnt *= take_i64(&c);
      floats += (size_t)cnt;
    }
    take(&c, 4 * floats);                    /* values */
    take(&c, 4 * (size_t)take_i64(&c));      /* optimizer state */
    memcpy(out + o, in + last, c.at - last); /* all up to here, */
    o += c.at - last;
    take(&c, 8 * (size_t)take_u32(&c)); /* not the step counts */
    last = c.at;
  }
  assert_int_equal(c.at, n - 8); /* everything parsed */
  uint32_t version = 2;
  memcpy(out + 8, &version, 4);
  uint64_t h = fnv(out, o);
  memcpy(out + o, &h, 8);
  o += 8;
  f = fopen(to, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(out, 1, o, f), o);
  fclose(f);
}

static void round_trip(lp_nn_optim_type kind) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/rt%d", tmpdir, (int)kind);
  assert_int_equal(mkdir(dir, 0777), 0);
  lp_exec *a = new_exec("mine", kind);
  step(a, 1);
  step(a, 2);
  assert_int_equal(lp_exec_checkpoint_save(a, dir, 2), LP_OK);
  char path[400], tmp[410];
  lp_exec_checkpoint_path(dir, 0, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  assert_int_equal(access(path, F_OK), 0);
  assert_int_not_equal(access(tmp, F_OK), 0); /* renamed away */
  double l3 = step(a, 3), l4 = step(a, 4);

  lp_exec *b = new_exec("mine", kind), *c = new_exec("mine", kind);
  int64_t k = -1;
  assert_int_equal(lp_exec_checkpoint_load(b, dir, &k), LP_OK);
  assert_int_equal(k, 2);
  assert_true(step(b, 3) == l3); /* bitwise */
  assert_true(step(b, 4) == l4);
  assert_true(same_params(a, b));
  /* a version-2 file (no per-parameter steps: every parameter took every
   * step, as here) resumes the same */
  char dir2[310], path2[420];
  snprintf(dir2, sizeof dir2, "%s/v2", dir);
  assert_int_equal(mkdir(dir2, 0777), 0);
  lp_exec_checkpoint_path(dir2, 0, path2, sizeof path2);
  to_version2(path, path2, 1);
  lp_exec *d = new_exec("mine", kind);
  assert_int_equal(lp_exec_checkpoint_load(d, dir2, &k), LP_OK);
  assert_int_equal(k, 2);
  assert_true(step(d, 3) == l3);
  assert_true(step(d, 4) == l4);
  assert_true(same_params(a, d));
  lp_exec_free(d);
  /* the control: without the checkpoint the same steps differ */
  assert_true(step(c, 3) != l3);
  step(c, 4);
  assert_false(same_params(a, c));
  lp_exec_free(a);
  lp_exec_free(b);
  lp_exec_free(c);
}

static void test_round_trip_adamw(void **state) {
  (void)state;
  round_trip(LP_NN_OPTIM_ADAMW);
}

static void test_round_trip_sgd(void **state) {
  (void)state;
  round_trip(LP_NN_OPTIM_SGD);
}

/* Loads dir into a fresh executor (name, optimizer kind) expecting status
 * `want` and an error containing each of the NULL-terminated fragments;
 * checks the parameters did not change. */
static void expect_load_error(const char *dir, const char *name, lp_nn_optim_type kind,
                              lp_status want, ...) {
  lp_exec *e = new_exec(name, kind), *fresh = new_exec(name, kind);
  int64_t k = -7;
  assert_int_equal(lp_exec_checkpoint_load(e, dir, &k), want);
  assert_int_equal(k, -7);
  const char *msg = lp_exec_last_error(e);
  va_list ap;
  va_start(ap, want);
  for (const char *frag; (frag = va_arg(ap, const char *)) != NULL;)
    if (!strstr(msg, frag)) fail_msg("error '%s' lacks '%s'", msg, frag);
  va_end(ap);
  assert_true(same_params(e, fresh)); /* nothing changed */
  lp_exec_free(e);
  lp_exec_free(fresh);
}

static void copy_file(const char *from, const char *to, long keep, long flip) {
  FILE *f = fopen(from, "rb");
  assert_non_null(f);
  static unsigned char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  assert_true(n > 0 && n < sizeof buf);
  if (keep >= 0 && (size_t)keep < n) n = (size_t)keep;
  if (flip >= 0 && (size_t)flip < n) buf[flip] ^= 0x10;
  f = fopen(to, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, n, f), n);
  fclose(f);
}

static void test_errors(void **state) {
  (void)state;
  char good[300], path[400], bad[300], bpath[400];
  snprintf(good, sizeof good, "%s/good", tmpdir);
  snprintf(bad, sizeof bad, "%s/bad", tmpdir);
  assert_int_equal(mkdir(good, 0777), 0);
  assert_int_equal(mkdir(bad, 0777), 0);
  lp_exec_checkpoint_path(good, 0, path, sizeof path);
  lp_exec_checkpoint_path(bad, 0, bpath, sizeof bpath);
  lp_exec *a = new_exec("mine", LP_NN_OPTIM_ADAMW);
  step(a, 1);
  assert_int_equal(lp_exec_checkpoint_save(a, good, 1), LP_OK);

  /* missing */
  expect_load_error(bad, "mine", LP_NN_OPTIM_ADAMW, LP_ERR_IO, "rank 0: cannot open checkpoint",
                    bpath, "No such file", NULL);
  /* truncated: every shorter length is refused (a few samples) */
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  long lens[] = {0, 5, 20, 100, (long)sb.st_size / 2, (long)sb.st_size - 1};
  for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
    copy_file(path, bpath, lens[i], -1);
    expect_load_error(bad, "mine", LP_NN_OPTIM_ADAMW, LP_ERR_PARSE, bpath, "truncated", NULL);
  }
  /* one flipped bit in the parameter data */
  copy_file(path, bpath, -1, (long)sb.st_size - 40);
  expect_load_error(bad, "mine", LP_NN_OPTIM_ADAMW, LP_ERR_PARSE, bpath,
                    "truncated or corrupt (checksum mismatch", NULL);
  /* not a checkpoint */
  copy_file(path, bpath, -1, 2);
  expect_load_error(bad, "mine", LP_NN_OPTIM_ADAMW, LP_ERR_PARSE, bpath,
                    "is not a luapipe checkpoint (bad magic)", NULL);
  /* another schedule with the same placement loads (parameters and
   * optimizer state do not depend on the schedule); another optimizer is
   * refused, and with another schedule too the message names the one it
   * was written under as the way out */
  {
    lp_exec *t = new_exec("theirs", LP_NN_OPTIM_ADAMW);
    int64_t k = -7;
    assert_int_equal(lp_exec_checkpoint_load(t, good, &k), LP_OK);
    assert_int_equal(k, 1);
    assert_true(same_params(t, a));
    lp_exec_free(t);
  }
  expect_load_error(good, "mine", LP_NN_OPTIM_SGD, LP_ERR_INVALID, path,
                    "does not match this run: optimizer adamw in the checkpoint, sgd in this run",
                    NULL);
  expect_load_error(good, "theirs", LP_NN_OPTIM_SGD, LP_ERR_INVALID,
                    "optimizer adamw in the checkpoint, sgd in this run (it was written under "
                    "schedule 'mine', this run's is 'theirs': resume under 'mine', or a schedule "
                    "that places the model stages on the ranks alike)", NULL);
  /* schedule names too long for one message: the way out is cut short,
   * the message still one bounded line naming what differs */
  {
    char lname[2][400], ldir[300], lpath[400];
    memset(lname[0], 'a', sizeof lname[0] - 1), lname[0][sizeof lname[0] - 1] = 0;
    memset(lname[1], 'b', sizeof lname[1] - 1), lname[1][sizeof lname[1] - 1] = 0;
    snprintf(ldir, sizeof ldir, "%s/long", tmpdir);
    assert_int_equal(mkdir(ldir, 0777), 0);
    lp_exec_checkpoint_path(ldir, 0, lpath, sizeof lpath);
    lp_exec *l = new_exec(lname[0], LP_NN_OPTIM_ADAMW);
    step(l, 1);
    assert_int_equal(lp_exec_checkpoint_save(l, ldir, 1), LP_OK);
    lp_exec_free(l);
    lp_exec *m = new_exec(lname[1], LP_NN_OPTIM_SGD);
    int64_t k = -7;
    assert_int_equal(lp_exec_checkpoint_load(m, ldir, &k), LP_ERR_INVALID);
    const char *msg = lp_exec_last_error(m);
    assert_true(strlen(msg) < LP_ERRLEN);
    assert_non_null(strstr(msg,
                           "does not match this run: optimizer adamw in the checkpoint, sgd in "
                           "this run (it was written under schedule 'aaaa"));
    assert_null(strstr(msg, "'bbbb")); /* did not fit */
    lp_exec_free(m);
    unlink(lpath);
    assert_int_equal(rmdir(ldir), 0);
  }
  /* another model: hidden size 8 instead of 7 */
  d_hidden = 8;
  expect_load_error(good, "mine", LP_NN_OPTIM_ADAMW, LP_ERR_INVALID, path,
                    "does not match the model: model stage 0, parameter 1 is layers.0.weight "
                    "[7, 5] in the checkpoint but layers.0.weight [8, 5] in this model",
                    NULL);
  d_hidden = 7;

  /* a save that cannot be written leaves the good checkpoint as it was */
  char tmp[410];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  assert_int_equal(mkdir(tmp, 0777), 0); /* the .tmp name is taken */
  step(a, 2);
  assert_int_equal(lp_exec_checkpoint_save(a, good, 2), LP_ERR_IO);
  assert_non_null(strstr(lp_exec_last_error(a), "rank 0: saving checkpoint"));
  assert_non_null(strstr(lp_exec_last_error(a), tmp));
  assert_int_equal(rmdir(tmp), 0);
  lp_exec *b = new_exec("mine", LP_NN_OPTIM_ADAMW);
  int64_t k = 0;
  assert_int_equal(lp_exec_checkpoint_load(b, good, &k), LP_OK);
  assert_int_equal(k, 1);
  /* a directory that does not exist */
  char nodir[300];
  snprintf(nodir, sizeof nodir, "%s/nope", tmpdir);
  assert_int_equal(lp_exec_checkpoint_save(a, nodir, 2), LP_ERR_IO);
  assert_non_null(strstr(lp_exec_last_error(a), "cannot create"));
  lp_exec_free(a);
  lp_exec_free(b);
}

static void test_write_file_atomic(void **state) {
  (void)state;
  char path[300], err[LP_ERRLEN] = "";
  snprintf(path, sizeof path, "%s/latest", tmpdir);
  assert_int_equal(lp_write_file_atomic(path, "{\"step\": 1}\n", 12, err), LP_OK);
  assert_int_equal(lp_write_file_atomic(path, "{\"step\": 22}\n", 13, err), LP_OK);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  char buf[64] = "";
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  assert_int_equal(n, 13);
  assert_string_equal(buf, "{\"step\": 22}\n");
  snprintf(path, sizeof path, "%s/no/such/dir/latest", tmpdir);
  assert_int_equal(lp_write_file_atomic(path, "x", 1, err), LP_ERR_IO);
  assert_non_null(strstr(err, "cannot create"));
}

/* The MoE layer of vstage 1 (stage 1), its slots per rank and bias. */
static lp_nn_layer *moe_of(lp_exec *e, float *bias) {
  lp_nn_layer *m = lp_nn_moe_find(lp_exec_vstage_chunk(e, 1), 0);
  assert_non_null(m);
  if (bias) assert_int_equal(lp_nn_moe_get_bias(m, bias), LP_OK);
  return m;
}

/* An MoE stage: a placement with a replica (5 slots for 4 experts) and a
 * router bias that moves every step come back with the checkpoint, and the
 * resumed steps are bitwise; a checkpoint of another expert size is refused
 * after its placement was restored, which is then set back. */
static void test_moe_state(void **state) {
  (void)state;
  char dir[300];
  snprintf(dir, sizeof dir, "%s/moe", tmpdir);
  assert_int_equal(mkdir(dir, 0777), 0);
  moe_hidden = 6;
  lp_exec *a = new_exec("mine", LP_NN_OPTIM_ADAMW);
  const int p2l[5] = {0, 1, 2, 3, 1};
  assert_int_equal(lp_exec_set_placement(a, 0, 5, p2l, NULL), LP_OK);
  step(a, 1);
  step(a, 2);
  step(a, 3);
  float ba[4], bb[4], zero[4] = {0};
  moe_of(a, ba);
  assert_true(memcmp(ba, zero, sizeof ba) != 0); /* the bias moved */
  assert_int_equal(lp_exec_checkpoint_save(a, dir, 3), LP_OK);
  double l4 = step(a, 4), l5 = step(a, 5);

  lp_exec *b = new_exec("mine", LP_NN_OPTIM_ADAMW);
  assert_int_equal(lp_nn_moe_slots_per_rank(moe_of(b, NULL)), 4);
  assert_int_equal(lp_exec_checkpoint_load(b, dir, NULL), LP_OK);
  int got[5];
  assert_int_equal(lp_nn_moe_slots_per_rank(moe_of(b, bb)), 5);
  assert_int_equal(lp_nn_moe_placement(moe_of(b, NULL), got), LP_OK);
  assert_memory_equal(got, p2l, sizeof got);
  assert_memory_equal(ba, bb, sizeof ba); /* a's bias after step 3 */
  assert_true(step(b, 4) == l4);
  assert_true(step(b, 5) == l5);
  assert_true(same_params(a, b));

  moe_hidden = 5; /* another expert size: refused, default placement back */
  expect_load_error(dir, "mine", LP_NN_OPTIM_ADAMW, LP_ERR_INVALID, "does not match the model",
                    "layers.2.experts.0.w1 [6, 7] in the checkpoint but", NULL);
  lp_exec *c = new_exec("mine", LP_NN_OPTIM_ADAMW);
  assert_int_not_equal(lp_exec_checkpoint_load(c, dir, NULL), LP_OK);
  assert_int_equal(lp_nn_moe_slots_per_rank(moe_of(c, NULL)), 4);
  moe_hidden = 0;
  lp_exec_free(a);
  lp_exec_free(b);
  lp_exec_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_optim_state),
      cmocka_unit_test(test_round_trip_adamw),
      cmocka_unit_test(test_round_trip_sgd),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_moe_state),
      cmocka_unit_test(test_write_file_atomic),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
