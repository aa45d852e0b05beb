/* module.c — lp_module_open: finds and opens luapipe's optional backend
 * modules (luapipe_cuda.so, luapipe_nccl.so) relative to the running
 * program, the way the program finds its Lua modules (core/host/main.c). */
#define _DEFAULT_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lp_base.h"

void lp_program_dir(char *dir, size_t n) {
  char exe[4096];
  dir[0] = '\0';
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return;
  exe[len] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash) return;
  *slash = '\0';
  snprintf(dir, n, "%s", exe);
}

void *lp_module_open(const char *file, char *path, size_t path_len, char *err) {
  char dir[4096], cand[2][4200];
  if (path && path_len) path[0] = '\0';
  err[0] = '\0';
  lp_program_dir(dir, sizeof dir);
  if (!dir[0]) {
    lp_errf(err, "module %s: cannot find the running program (/proc/self/exe)", file);
    return NULL;
  }
  snprintf(cand[0], sizeof cand[0], "%s/%s", dir, file);
  snprintf(cand[1], sizeof cand[1], "%s/../lib/luapipe/%s", dir, file);
  for (int i = 0; i < 2; i++) {
    if (access(cand[i], F_OK) != 0) continue;
    dlerror();
    void *h = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *why = dlerror();
      /* dlerror usually starts with the path itself: do not say it twice */
      size_t pl = strlen(cand[i]);
      if (why && !strncmp(why, cand[i], pl) && why[pl] == ':') why += pl + 1;
      while (why && *why == ' ') why++;
      lp_errf(err, "cannot load %s: %s", cand[i], why ? why : "unknown reason");
      return NULL;
    }
    if (path && path_len) snprintf(path, path_len, "%s", cand[i]);
    return h;
  }
  lp_errf(err, "module %s not found (looked in %s and %s/../lib/luapipe)", file, dir, dir);
  return NULL;
}

void *lp_module_symbol(void *handle, const char *name) {
  return handle ? dlsym(handle, name) : NULL;
}
