/* lp_trace.h — the one trace event schema shared by the simulator and the
 * executor (slices of compute and communication per rank, flows from a
 * send to its receive, counters), and its Chrome/Perfetto JSON writer.
 * Uses lp_base, lp_schedule and lp_sim (lp_trace_from_sim).
 *
 * Times are microseconds. A simulated time unit is shown as one
 * millisecond: lp_trace_from_sim multiplies by LP_TRACE_US_PER_UNIT. */
#pragma once

#include "lp_base.h"
#include "lp_schedule.h"
#include "lp_sim.h"

#define LP_TRACE_US_PER_UNIT 1000.0

typedef enum lp_trace_kind {
  LP_TRACE_COMPUTE = 0, /* an action's work: the "compute" track */
  LP_TRACE_SEND,        /* a message leaving: the "comm" track */
  LP_TRACE_RECV         /* a message arriving: the "comm" track */
} lp_trace_kind;

#define LP_TRACE_NAME_MAX (LP_ACTION_TEXT_MAX + 32) /* room for "recv <action> from rank N" */
#define LP_TRACE_CAT_MAX 32

/* One slice. Strings are copied into the trace. */
typedef struct lp_trace_event {
  int rank;
  int kind;                     /* lp_trace_kind */
  char name[LP_TRACE_NAME_MAX]; /* "0F3", "send 0F3" */
  char cat[LP_TRACE_CAT_MAX];   /* "F", "B", "I", "W", "FB", "comm" */
  double start_us, dur_us;
  /* args */
  int stage, mb;                   /* virtual stage and micro-batch; -1: none */
  int index;                       /* position in the rank's action list; -1 */
  char action[LP_ACTION_TEXT_MAX]; /* action text; "" for none */
  /* a message slice (send / recv): the other rank, the message tag and the
   * training step; -1 when none. A send on rank a with peer b and a recv
   * on rank b with peer a of the same tag and step are one message
   * (lp_trace_link_messages). */
  int peer, tag;
  int64_t step;
} lp_trace_event;

/* An arrow from a send slice to its receive slice. from_event / to_event
 * index the trace's events when known (-1: the writer looks for the
 * send/recv slice of that rank that contains the time). */
typedef struct lp_trace_flow {
  long id;
  int from_rank, to_rank;
  double from_us, to_us;
  int from_event, to_event;
} lp_trace_flow;

/* A counter sample: `name` on `rank` has `value` from time_us on. */
typedef struct lp_trace_counter {
  int rank;
  char name[LP_TRACE_CAT_MAX];
  double time_us;
  double value;
} lp_trace_counter;

/* An instant marker ("step 3 starts") on rank's compute track. */
typedef struct lp_trace_marker {
  int rank;
  char name[LP_TRACE_CAT_MAX];
  double time_us;
} lp_trace_marker;

typedef struct lp_trace lp_trace;

/* An empty trace; NULL on allocation failure. Free with lp_trace_free. */
lp_trace *lp_trace_new(void);
void lp_trace_free(lp_trace *t);

/* Appends a copy. LP_ERR_NOMEM on allocation failure, LP_ERR_ARG for a
 * negative rank or an unknown kind. lp_trace_add_event returns the new
 * event's index in *index when index is not NULL. */
lp_status lp_trace_add_event(lp_trace *t, const lp_trace_event *e, int *index);
lp_status lp_trace_add_flow(lp_trace *t, const lp_trace_flow *f);
lp_status lp_trace_add_counter(lp_trace *t, const lp_trace_counter *c);
lp_status lp_trace_add_marker(lp_trace *t, const lp_trace_marker *m);

/* Fills the optional fields of e with "none" (stage, mb, index -1, empty
 * strings) so callers set only what they know. */
void lp_trace_event_init(lp_trace_event *e);

const lp_trace_event *lp_trace_events(const lp_trace *t, int *n);
const lp_trace_flow *lp_trace_flows(const lp_trace *t, int *n);
const lp_trace_marker *lp_trace_markers(const lp_trace *t, int *n);
int lp_trace_ranks(const lp_trace *t); /* 1 + the largest rank seen */

/* Pairs every send slice with the receive slice of the same message (send
 * on rank a with peer b, recv on rank b with peer a, equal tag and step),
 * sets both slices to [sent, arrived] (from the send's start to the end of
 * the receiver's wait, as in simulated traces) and adds a flow between
 * them. Slices without a partner keep their times. LP_OK or LP_ERR_NOMEM. */
lp_status lp_trace_link_messages(lp_trace *t);

/* Shifts every time (slices, flows, counters, markers) so that the
 * earliest one is 0. */
void lp_trace_start_at_zero(lp_trace *t);

/* The trace's events, counters and markers as one byte buffer (*buf to
 * lp_free, *bytes long) for shipping to another process of the same build;
 * flows are not packed (link after gathering). LP_OK or LP_ERR_NOMEM. */
lp_status lp_trace_pack(const lp_trace *t, void **buf, size_t *bytes);
/* Appends what lp_trace_pack wrote. LP_ERR_PARSE for a buffer that is
 * not one (size mismatch), LP_ERR_NOMEM. */
lp_status lp_trace_unpack_append(lp_trace *t, const void *buf, size_t bytes);

/* Chrome/Perfetto trace JSON: {"traceEvents":[...],"displayTimeUnit":"ms"}.
 * One process per rank (pid = rank, named "rank r"); per process a
 * "compute" thread (tid 0) and a "comm" thread (tid 1), and, where slices
 * of one track overlap without nesting, extra lanes "compute 2", "comm 2",
 * ... (tid 2, 3, ...) so that every thread's slices nest. Slices are
 * complete events ("ph":"X") with args {stage, mb, index, action}; each
 * flow is a pair "ph":"s" / "ph":"f" ("bp":"e", same id, cat "message")
 * bound to the send and receive slices (the "s" a quarter into the send
 * slice, the "f" three quarters into the receive slice, so both lie inside
 * their slices whenever these have a length); counters are "ph":"C" events with
 * args {"value": v}; markers are instant events ("ph":"i", "s":"p"). Every event carries ph, pid,
 * tid and ts. Returns a NUL-terminated string to lp_free, NULL on allocation failure. */
char *lp_trace_to_json(const lp_trace *t);

/* Writes the JSON to path atomically (lp_write_file_atomic): on failure no
 * file is left behind and err (LP_ERRLEN, may be NULL) names the path and
 * the reason (LP_ERR_IO, LP_ERR_NOMEM). */
lp_status lp_trace_write_json(const lp_trace *t, const char *path, char *err);

/* Builds the trace of a simulation: a compute slice per action (cat = its
 * type, "FB" for a pair), a send slice [sent, arrived] on the producer's
 * rank and a recv slice [sent, arrived] on the consumer's rank per message
 * with a flow between them, and the counters "live activations" and
 * "pending W" per rank. One simulated time unit = 1000 us (1 ms). *out is
 * NULL on failure (LP_ERR_NOMEM). */
lp_status lp_trace_from_sim(const lp_sim_result *r, lp_trace **out);
