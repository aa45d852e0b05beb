/* profile_internal.h — what the reader keeps and the analysis uses. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "lp_profile.h"

typedef struct pf_op { /* a GPU operation (or a luapipe slice) */
  int64_t start, end;  /* ns */
  int64_t corr;        /* correlation id, -1: none */
  int32_t name;        /* into names */
  int32_t device, stream;
  int32_t file;
} pf_op;

typedef struct pf_call { /* a runtime call that carries a correlation id */
  int64_t corr, ts;
  int64_t pid, tid;
  int32_t file;
} pf_call;

typedef struct pf_ann { /* a user annotation */
  int64_t start, end;
  int64_t pid, tid;
  int32_t name, file;
} pf_ann;

typedef struct pf_file {
  char *path;
  int dist_rank; /* distributedInfo.rank, -1 */
  int order;     /* position among the files read */
  int luapipe;   /* a trace luapipe wrote (processes "rank N") */
} pf_file;

typedef struct pf_name {
  char *cat, *name; /* one allocation: cat\0name\0 */
  uint64_t hash;
  int64_t ops, total;
  int cls;
} pf_name;

typedef struct pf_names {
  pf_name *e;
  int64_t n, cap;
  int32_t *slots; /* open addressing: index + 1, 0 empty */
  int64_t nslots;
} pf_names;

/* Returns the id of (cat, name[0..len)), adding it; -1 on NOMEM. */
int pf_names_intern(pf_names *t, const char *cat, const char *name, size_t len);
void pf_names_free(pf_names *t);
/* Grows *ptr (elements of elem bytes, capacity *cap) to hold need; 0 or -1. */
int pf_grow(void **ptr, int64_t *cap, int64_t need, size_t elem);

typedef struct pf_rank_data {
  lp_profile_rank r;
  int64_t *order; /* indices of its ops in start order */
  int32_t *phase; /* phase per entry of order, -1 */
  int32_t *stream_ix; /* index into r.streams per entry */
  int64_t nops_all;   /* entries in order (ignored ones included) */
} pf_rank_data;

struct lp_profile {
  char err[LP_ERRLEN];
  pf_file *files;
  int64_t nfiles, files_cap;
  pf_op *ops;
  int64_t nops, ops_cap;
  pf_call *calls;
  int64_t ncalls, calls_cap;
  pf_ann *anns;
  int64_t nanns, anns_cap;
  pf_names names, ann_names;
  int64_t bytes, events;
  pf_rank_data *ranks;
  int nranks;
};
