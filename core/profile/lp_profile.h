/* lp_profile.h — profile traces in: a streaming reader of Chrome-format
 * JSON traces (the PyTorch profiler's, plain or gzip, and luapipe's own),
 * the GPU operations they hold as intervals, and the analysis of a rank:
 * busy time per class and stream as unions of intervals, communication
 * overlapped by computation, idle time, and phases (innermost user
 * annotations) with the GPU time of the operations they launched.
 *
 * Uses lp_base only (yajl and zlib underneath). No Lua: the classification
 * of operation names comes from the caller (luapipe.profile's rules), one
 * class per distinct (category, name) through lp_profile_set_class.
 *
 * Times are kept as integer nanoseconds (trace microseconds * 1000, exact
 * for the profiler's integer and 3-decimal timestamps).
 *
 * Memory: per GPU operation about 40 bytes, per CPU runtime call that
 * carries a correlation id 32 bytes, per user annotation 40 bytes, one copy
 * of each distinct name; nothing for other CPU events. */
#pragma once

#include <stdint.h>

#include "lp_base.h"

/* Classes of an operation. WAIT marks time a luapipe rank sat blocked
 * inside an action (taken out of its compute time); IGNORE drops the
 * operation from every figure. */
typedef enum lp_profile_class {
  LP_PROFILE_COMPUTE = 0,
  LP_PROFILE_COMM,
  LP_PROFILE_MEMORY,
  LP_PROFILE_WAIT,
  LP_PROFILE_IGNORE,
  LP_PROFILE_NCLASS
} lp_profile_class;

/* The three classes reported as busy time. */
#define LP_PROFILE_NBUSY 3

typedef struct lp_profile lp_profile;

/* A new, empty reading (NULL on allocation failure). */
lp_profile *lp_profile_new(void);
void lp_profile_free(lp_profile *p);
/* Text of the last failure: one line naming the file and, where there is
 * one, the event's index ("traceEvents[12]"). */
const char *lp_profile_last_error(const lp_profile *p);

/* Reads a trace file (.json, .json.gz; gzip is recognised by its magic
 * bytes, and a name ending in .gz must be gzip) or every trace file of a
 * folder (names ending .json or .json.gz, in natural order), appending
 * their operations. A PyTorch trace is one rank: distributedInfo.rank
 * when present, else its position among the files read. A trace luapipe
 * wrote holds every rank (process "rank N"). LP_ERR_IO (cannot open),
 * LP_ERR_PARSE (not JSON, truncated, not a trace, a bad event),
 * LP_ERR_NOMEM; the reading is then unusable. */
lp_status lp_profile_read(lp_profile *p, const char *path);

/* Distinct operation names (with their category: "kernel", "gpu_memcpy",
 * "gpu_memset", or a luapipe slice's category): index i in 0..n-1. ops and
 * total_ns: how many operations carry it and their summed durations. */
int lp_profile_name_count(const lp_profile *p);
const char *lp_profile_name(const lp_profile *p, int i, const char **cat, int64_t *ops,
                            int64_t *total_ns);
/* Sets the class of name i (default LP_PROFILE_COMPUTE). LP_ERR_ARG for
 * an index or class out of range. */
lp_status lp_profile_set_class(lp_profile *p, int i, lp_profile_class c);

typedef struct lp_profile_stream {
  int device, stream;
  int64_t busy_ns[LP_PROFILE_NBUSY]; /* union of that class's operations on the stream */
  int64_t ops;
} lp_profile_stream;

typedef struct lp_profile_phase {
  int name;                /* index into lp_profile_annotation_name */
  int64_t cpu_start_ns;    /* the annotation's CPU interval */
  int64_t cpu_dur_ns;
  int64_t gpu_ns;          /* summed durations of the operations it launched */
  int64_t ops;             /* how many */
  int64_t gpu_first_ns;    /* first start and last end of those operations */
  int64_t gpu_last_ns;     /* (both 0 when ops == 0) */
  int64_t class_ns[LP_PROFILE_NBUSY]; /* gpu_ns split by class */
} lp_profile_phase;

typedef struct lp_profile_rank {
  int rank;
  const char *file;        /* the file it came from */
  int64_t t0_ns;           /* first operation's start (absolute trace time) */
  int64_t span_ns;         /* last end - first start, every counted class */
  int64_t idle_ns;         /* span - union of every counted operation */
  int64_t busy_ns[LP_PROFILE_NBUSY]; /* union per class, all streams; compute minus WAIT */
  int64_t overlap_ns;      /* |union(comm) ∩ union(compute)| */
  int64_t exposed_ns;      /* |union(comm)| - overlap */
  /* per operation instead of per union: the summed durations of the
   * communication operations and the summed |op ∩ union(compute)| of each
   * (luapipe's training summary counts its exchanges' hidden time so) */
  int64_t comm_ops_ns, comm_ops_overlap_ns;
  int64_t ops;             /* counted operations */
  int64_t unattributed_ops; /* operations no phase launched (when phases exist) */
  int nstreams;
  lp_profile_stream *streams;
  int nphases;
  lp_profile_phase *phases; /* in CPU order */
} lp_profile_rank;

/* Analyses every rank with the classes set so far. Call again after
 * changing classes. LP_ERR_NOMEM, or LP_ERR_PARSE when a rank appears in two
 * files. */
lp_status lp_profile_analyze(lp_profile *p);
int lp_profile_rank_count(const lp_profile *p);
const lp_profile_rank *lp_profile_rank_at(const lp_profile *p, int i); /* in rank order */
const char *lp_profile_annotation_name(const lp_profile *p, int name);

/* One operation of rank i, j in 0..n-1 (in start order) for drawing:
 * start/end relative to the rank's t0, stream index into its streams,
 * class, phase index (-1: none). Returns the count when op is NULL. */
typedef struct lp_profile_op_view {
  int64_t start_ns, end_ns;
  int stream;
  int cls;
  int phase;
  int name;
} lp_profile_op_view;
int64_t lp_profile_rank_ops(const lp_profile *p, int i, int64_t j, lp_profile_op_view *op);

/* Statistics of the reading: bytes of JSON parsed and events seen. */
void lp_profile_stats(const lp_profile *p, int64_t *bytes, int64_t *events);
