/* host.c — how many ranks share this rank's host and how many cores they
 * may run on (their CPU affinity masks, together), found once when the
 * executor is made. When ranks outnumber those cores, a rank waits for a
 * core as well as for messages: the simulator does not model that, so the
 * summary says its prediction does not apply (lp_exec_host_share).
 * Also the process's allocator policy for a training loop (ex_keep_memory). */
#define _GNU_SOURCE
#include <sched.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "exec_internal.h"

#include <string.h>

/* FNV-1a of the host name, in 31 bits (a split color). */
static int host_color(void) {
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  uint32_t h = 2166136261u;
  for (const char *p = host; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
  return (int)(h & 0x7fffffff);
}

lp_status ex_host_share_new(lp_exec *e) {
  e->host.ranks = 1;
  e->host.cores = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  int n = CPU_SETSIZE;
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < c && i < n; i++) CPU_SET((int)i, &set);
  }
  lp_comm *hc = NULL;
  if (lp_comm_size(e->world) == 1) {
    e->host.cores = CPU_COUNT(&set);
    return LP_OK;
  }
  lp_status sst = lp_comm_split(e->world, host_color(), lp_comm_rank(e->world), &hc);
  if (sst != LP_OK) {
    lp_errf(e->err, "rank %d: lp_exec_new: grouping the ranks by host: %s", e->rank,
            lp_comm_last_error(e->world));
    return sst;
  }
  /* the union of the host's ranks' masks: a CPU any of them may use */
  double *use = lp_calloc((size_t)n + 1, sizeof *use);
  if (!use) {
    lp_comm_free(hc);
    return LP_ERR_NOMEM;
  }
  for (int i = 0; i < n; i++) use[i] = CPU_ISSET(i, &set) ? 1 : 0;
  use[n] = 1; /* ranks */
  lp_status st = lp_comm_allreduce_sum_double(
      hc, use, (size_t)n + 1, "lp_exec_new: counting the ranks and cores of a host");
  if (st == LP_OK) {
    e->host.ranks = (int)(use[n] + 0.5);
    for (int i = 0; i < n; i++) e->host.cores += use[i] > 0;
  } else {
    lp_errf(e->err, "rank %d: %s", e->rank, lp_comm_last_error(hc));
  }
  lp_free(use);
  lp_comm_free(hc);
  return st;
}

int lp_exec_host_share(const lp_exec *e, int *cores) {
  if (cores) *cores = e->host.cores;
  return e->host.ranks;
}

/* A step allocates and frees the same activations every time. glibc gives
 * large freed blocks back to the kernel (munmap, or trimming the heap top
 * once its free part exceeds a threshold that follows the largest freed
 * block), so every step paid the page faults of its peak memory again:
 * measured on the char-LM at 2 DualPipe ranks, the first forward that
 * raises the peak took 4.4 ms instead of 2.8 ms, every step, and the
 * other rank waited for it (the simulator's mean costs cannot show that).
 * Keeping blocks up to 32 MB on the heap and the heap's free top up to
 * 256 MB makes later steps reuse the pages. Once per process; glibc only. */
void ex_keep_memory(void) {
#ifdef __GLIBC__
  static int done;
  if (done) return;
  done = 1;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}
