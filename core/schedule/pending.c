/* pending.c — TEMPORARY placeholders, replaced function by function by the
 * real I/O, validation, lowering and memory code. */
#include "schedule_internal.h"

#include <string.h>

char *lp_schedule_to_csv(const lp_schedule *s) { (void)s; return NULL; }
lp_status lp_schedule_from_csv(const char *text, const char *origin,
                               lp_schedule **out, char *err) {
  (void)text, (void)origin;
  *out = NULL;
  lp_errf(err, "not implemented");
  return LP_ERR_UNSUPPORTED;
}
char *lp_schedule_to_json(const lp_schedule *s) { (void)s; return NULL; }
lp_status lp_schedule_validate(lp_schedule *s) { (void)s; return LP_OK; }
lp_status lp_schedule_lower(lp_schedule *s, lp_schedule **out) {
  *out = lp_schedule_clone(s);
  return LP_OK;
}
lp_status lp_schedule_memory_of(const lp_schedule *s, int rank,
                                lp_schedule_memory *out) {
  (void)s, (void)rank;
  memset(out, 0, sizeof *out);
  return LP_OK;
}
