/* fuzz_schedule_csv.c — the schedule CSV reader, lp_schedule_from_csv (what
 * `luapipe simulate file.csv` and schedule.from_csv use). Contract: it
 * returns LP_OK with a schedule, or an error status with no schedule and a
 * message naming the source ("fuzz.csv:LINE: ..."). A schedule it accepts
 * can be validated, and written back: its CSV reads again into a schedule
 * with the same CSV (a fixed point), and its JSON is produced. */
#include "fuzz.h"
#include "lp_base.h"
#include "lp_schedule.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size), err[LP_ERRLEN] = "";
  lp_schedule *s = (lp_schedule *)1;
  lp_status st = lp_schedule_from_csv(text, "fuzz.csv", &s, err);
  free(text);
  if (st != LP_OK) {
    if (s) FUZZ_FAIL("status %d but a schedule was returned", (int)st);
    if (st != LP_ERR_NOMEM && strncmp(err, "fuzz.csv", 8) != 0)
      FUZZ_FAIL("error does not name the source: '%s'", err);
    fuzz_check_message(err, data, size);
    return 0;
  }
  if (!s) FUZZ_FAIL("LP_OK without a schedule");
  if (lp_schedule_validate(s) != LP_OK && !*lp_schedule_last_error(s))
    FUZZ_FAIL("validation failed without a message");
  char *csv = lp_schedule_to_csv(s), *json = lp_schedule_to_json(s);
  if (!csv || !json) FUZZ_FAIL("to_csv / to_json failed");
  lp_schedule *t = NULL;
  if (lp_schedule_from_csv(csv, "rewritten.csv", &t, err) != LP_OK)
    FUZZ_FAIL("its own CSV does not read back: %s\n%s", err, csv);
  char *csv2 = lp_schedule_to_csv(t);
  if (!csv2 || strcmp(csv, csv2) != 0) FUZZ_FAIL("CSV round trip differs:\n%s\n--\n%s", csv, csv2);
  lp_free(csv2);
  lp_free(csv);
  lp_free(json);
  lp_schedule_free(t);
  lp_schedule_free(s);
  return 0;
}
