/* fuzz_checkpoint.c — the checkpoint reader, lp_exec_checkpoint_load, on a
 * one-rank executor of two model stages (linear 4->3, linear 3->2; AdamW,
 * so the files carry optimizer moments). Input: one flag byte, then the
 * file. Flag bit 0 set: the last 8 bytes are replaced by the right
 * checksum first, so that mutations reach the parser behind the checksum.
 * Contract: LP_OK, or an error status with a message that names the file;
 * on failure no parameter changed. After a successful load the harness
 * loads its own checkpoint back.
 *
 * LUAPIPE_FUZZ_WRITE_SEED=FILE: also writes a valid checkpoint (with the
 * flag byte 0) to FILE: how tests/fuzz/corpus/checkpoint/valid was made. */
#include <stdint.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "lp_exec.h"

static lp_status chunk_fn(void *ud, int stage, lp_nn_layer **out, char *err) {
  (void)ud;
  (void)err;
  lp_nn_layer *lin = NULL;
  lp_status st = lp_nn_linear_new(stage ? "head" : "body", stage ? 3 : 4, stage ? 2 : 3, 1,
                                  7 + stage, &lin);
  if (st == LP_OK) st = lp_nn_chunk_new(stage ? "stage.1" : "stage.0", &lin, 1, out);
  lp_nn_layer_release(lin);
  return st;
}

static lp_status data_fn(void *ud, int64_t step, int mb, lp_tensor **in, lp_tensor **tg,
                         char *err) {
  (void)ud;
  (void)step;
  (void)mb;
  (void)err;
  float x[8] = {0}, y[4] = {0};
  lp_status st = LP_OK;
  if (in) st = lp_tensor_from_data(NULL, 2, (int64_t[]){2, 4}, x, in);
  if (st == LP_OK && tg) st = lp_tensor_from_data(NULL, 2, (int64_t[]){2, 2}, y, tg);
  return st;
}

static lp_exec *exec;
static char good[512], trial[512], file[600];

static lp_exec *make_exec(void) {
  static const int act_ndim[2] = {0, 2};
  static const int64_t act_shape[2][LP_TENSOR_MAXDIM] = {{0}, {2, 3}};
  lp_schedule *s = NULL;
  char err[LP_ERRLEN] = "";
  if (lp_schedule_new(1, 2, 1, &s) != LP_OK) abort();
  int route[2] = {0, 1};
  if (lp_schedule_set_name(s, "fuzz") != LP_OK || lp_schedule_add_vstage(s, 0, 0, NULL) ||
      lp_schedule_add_vstage(s, 1, 0, NULL) || lp_schedule_set_route(s, 0, route, 2))
    abort();
  const char *acts[] = {"0F0", "1F0", "1B0", "0B0"};
  for (int i = 0; i < 4; i++)
    if (lp_schedule_push_text(s, 0, acts[i]) != LP_OK) abort();
  lp_exec_opts o;
  memset(&o, 0, sizeof o);
  o.chunk = chunk_fn;
  o.data = data_fn;
  o.loss = LP_NN_LOSS_MSE;
  o.act_ndim = act_ndim;
  o.act_shape = act_shape;
  o.optim = LP_NN_OPTIM_ADAMW;
  o.adamw = (lp_nn_adamw_opts){0.01f, 0.9f, 0.999f, 1e-8f, 0.01f};
  lp_exec *e = NULL;
  if (lp_exec_new(s, &o, &e, err) != LP_OK) FUZZ_FAIL("lp_exec_new: %s", err);
  lp_schedule_free(s);
  return e;
}

static int same_params(lp_tensor **saved) {
  int k = 0, same = 1;
  for (int i = 0; i < lp_exec_vstages(exec); i++) {
    size_t n;
    const lp_nn_param *p = lp_nn_params(lp_exec_vstage_chunk(exec, i), &n);
    for (size_t j = 0; j < n; j++, k++) {
      if (saved[k] && !lp_tensor_equal(saved[k], p[j].value)) same = 0;
      lp_tensor_free(saved[k]);
      saved[k] = NULL;
    }
  }
  return same;
}

static void keep_params(lp_tensor **saved, int cap) {
  int k = 0;
  for (int i = 0; i < lp_exec_vstages(exec); i++) {
    size_t n;
    const lp_nn_param *p = lp_nn_params(lp_exec_vstage_chunk(exec, i), &n);
    for (size_t j = 0; j < n && k < cap; j++, k++)
      if (lp_tensor_clone(p[j].value, &saved[k]) != LP_OK) abort();
  }
}

static void setup(void) {
  exec = make_exec();
  snprintf(good, sizeof good, "%s/good", fuzz_tmpdir());
  snprintf(trial, sizeof trial, "%s/trial", fuzz_tmpdir());
  if (mkdir(good, 0700) != 0 || mkdir(trial, 0700) != 0) abort();
  lp_exec_checkpoint_path(trial, 0, file, sizeof file);
  if (lp_exec_checkpoint_save(exec, good, 3) != LP_OK) FUZZ_FAIL("%s", lp_exec_last_error(exec));
  const char *seed = getenv("LUAPIPE_FUZZ_WRITE_SEED");
  if (seed && *seed) {
    char path[600];
    lp_exec_checkpoint_path(good, 0, path, sizeof path);
    FILE *in = fopen(path, "rb"), *out = fopen(seed, "wb");
    if (!in || !out) abort();
    fputc(0, out);
    int c;
    while ((c = fgetc(in)) != EOF) fputc(c, out);
    fclose(in);
    fclose(out);
  }
}

static uint64_t fnv1a(const uint8_t *b, size_t n) {
  uint64_t h = 14695981039346656037ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!exec) setup();
  if (size < 1) return 0;
  uint8_t flags = data[0];
  size_t n = size - 1;
  uint8_t *body = malloc(n ? n : 1);
  if (!body) abort();
  memcpy(body, data + 1, n);
  if ((flags & 1) && n >= 8) {
    uint64_t h = fnv1a(body, n - 8);
    memcpy(body + n - 8, &h, 8);
  }
  FILE *f = fopen(file, "wb");
  if (!f || fwrite(body, 1, n, f) != n || fclose(f) != 0) abort();
  free(body);

  lp_tensor *saved[16] = {NULL};
  keep_params(saved, 16);
  int64_t step = -1;
  lp_status st = lp_exec_checkpoint_load(exec, trial, &step);
  if (st == LP_OK) {
    for (int k = 0; k < 16; k++) lp_tensor_free(saved[k]);
    if (lp_exec_checkpoint_load(exec, good, &step) != LP_OK || step != 3)
      FUZZ_FAIL("own checkpoint does not load back: %s", lp_exec_last_error(exec));
    return 0;
  }
  const char *msg = lp_exec_last_error(exec);
  if (!strstr(msg, file) && st != LP_ERR_NOMEM)
    FUZZ_FAIL("status %d, message does not name %s: '%s'", (int)st, file, msg);
  if (!same_params(saved)) FUZZ_FAIL("a failed load (%s) changed parameters", msg);
  return 0;
}
