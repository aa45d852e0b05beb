/* support.c — fuzz_tmpdir() of fuzz.h, for every harness. */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <unistd.h>

#include "fuzz.h"

static char tmpdir[64];

static void remove_tmpdir(void) {
  DIR *d = opendir(tmpdir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char p[512];
      snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
      unlink(p);
    }
    closedir(d);
  }
  rmdir(tmpdir);
}

const char *fuzz_tmpdir(void) {
  if (!tmpdir[0]) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/luapipe_fuzz_XXXXXX");
    if (!mkdtemp(tmpdir)) {
      perror("fuzz: mkdtemp");
      abort();
    }
    atexit(remove_tmpdir);
  }
  return tmpdir;
}
