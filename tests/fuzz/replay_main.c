/* replay_main.c — main() of a fuzz harness built without libFuzzer: feeds
 * every file named on the command line (a folder: each file in it, in name
 * order) to LLVMFuzzerTestOneInput once, and says how many it ran. Exit
 * status 0; a broken contract aborts (FUZZ_FAIL), a sanitizer reports.
 *
 *   fuzz_schedule_csv tests/fuzz/corpus/schedule_csv */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return 0;
  }
  uint8_t *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? 2 * cap : 4096;
      uint8_t *nb = realloc(buf, cap);
      if (!nb) abort();
      buf = nb;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    if (got == 0) break;
    n += got;
  }
  fclose(f);
  /* an exact-size copy, so that ASan sees reads past the input's end */
  uint8_t *exact = malloc(n ? n : 1);
  if (!exact) abort();
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 1;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv) {
  int files = 0, bad = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: no such file or folder %s\n", argv[i]);
      bad = 1;
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      files += run_file(argv[i]);
      continue;
    }
    struct dirent **list;
    int n = scandir(argv[i], &list, NULL, by_name);
    for (int k = 0; k < n; k++) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], list[k]->d_name);
      if (list[k]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode))
        files += run_file(path);
      free(list[k]);
    }
    if (n >= 0) free(list);
  }
  printf("%s: replayed %d input(s)\n", argv[0], files);
  return bad || files == 0 ? 1 : 0;
}
