/* link.c — the emulated-link cost model (lp_link) and its one text parser,
 * shared by the comm layer (LUAPIPE_LINK) and the simulator (--link). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lp_base.h"

typedef struct unit {
  const char *name;
  double scale;
} unit;

static const unit time_units[] = {{"us", 1e-6}, {"ms", 1e-3}, {"s", 1}, {NULL, 0}};
static const unit bw_units[] = {
    {"GB/s", 1e9}, {"MB/s", 1e6}, {"KB/s", 1e3}, {"B/s", 1}, {NULL, 0}};

/* Parses "<number><unit>" of one field (value text v of length n). */
static lp_status parse_field(const char *text, const char *key, const char *v,
                             size_t n, const unit *units, const char *names,
                             double *out, char *err) {
  char buf[64];
  if (n == 0) {
    lp_errf(err, "link '%s': %s= needs a value, e.g. %s", text, key,
            units == time_units ? "lat=50us" : "bw=2GB/s");
    return LP_ERR_PARSE;
  }
  if (n >= sizeof buf) {
    lp_errf(err, "link '%s': the %s= value is too long", text, key);
    return LP_ERR_PARSE;
  }
  memcpy(buf, v, n);
  buf[n] = 0;
  char *end;
  errno = 0;
  double x = strtod(buf, &end);
  if (end == buf || errno == ERANGE || !isfinite(x)) {
    lp_errf(err, "link '%s': %s=%s is not a number with a unit (%s)", text,
            key, buf, names);
    return LP_ERR_PARSE;
  }
  if (!*end) {
    lp_errf(err, "link '%s': %s=%s needs a unit (%s)", text, key, buf, names);
    return LP_ERR_PARSE;
  }
  const unit *u = units;
  while (u->name && strcmp(u->name, end) != 0) u++;
  if (!u->name) {
    lp_errf(err, "link '%s': %s=%s has an unknown unit '%s' (use %s)", text,
            key, buf, end, names);
    return LP_ERR_PARSE;
  }
  if (x < 0 || (units == bw_units && x == 0)) {
    lp_errf(err, "link '%s': %s=%s must be %s", text, key, buf,
            units == bw_units ? "positive" : ">= 0");
    return LP_ERR_PARSE;
  }
  *out = x * u->scale;
  return LP_OK;
}

lp_status lp_link_parse(const char *text, lp_link *out, char *err) {
  memset(out, 0, sizeof *out);
  if (!text || !*text || strcmp(text, "none") == 0) return LP_OK;
  lp_link l = {0, 0};
  int have_lat = 0, have_bw = 0;
  const char *p = text;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    const char *eq = memchr(p, '=', len);
    size_t klen = eq ? (size_t)(eq - p) : len;
    lp_status st;
    if (eq && klen == 3 && strncmp(p, "lat", 3) == 0) {
      if (have_lat++) {
        lp_errf(err, "link '%s': lat= is given twice", text);
        return LP_ERR_PARSE;
      }
      st = parse_field(text, "lat", eq + 1, len - klen - 1, time_units,
                       "us, ms or s", &l.latency_s, err);
    } else if (eq && klen == 2 && strncmp(p, "bw", 2) == 0) {
      if (have_bw++) {
        lp_errf(err, "link '%s': bw= is given twice", text);
        return LP_ERR_PARSE;
      }
      st = parse_field(text, "bw", eq + 1, len - klen - 1, bw_units,
                       "GB/s, MB/s, KB/s or B/s", &l.bytes_per_s, err);
    } else {
      lp_errf(err, "link '%s': unknown field '%.*s' (expected lat=<time> or "
                   "bw=<rate>, e.g. lat=50us,bw=2GB/s)",
              text, (int)(len > 40 ? 40 : len), p);
      st = LP_ERR_PARSE;
    }
    if (st != LP_OK) return st;
    if (!comma) break;
    p = comma + 1;
  }
  *out = l;
  return LP_OK;
}

double lp_link_time(const lp_link *l, double bytes) {
  if (!l) return 0;
  double t = l->latency_s;
  if (l->bytes_per_s > 0 && bytes > 0) t += bytes / l->bytes_per_s;
  return t;
}

double lp_link_alltoallv_time(const lp_link *l, double bytes_out,
                              double bytes_in) {
  if (bytes_out <= 0 && bytes_in <= 0) return 0;
  return lp_link_time(l, bytes_out > bytes_in ? bytes_out : bytes_in);
}

double lp_link_allreduce_time(const lp_link *l, int ranks, double bytes) {
  if (ranks <= 1 || bytes <= 0) return 0;
  return 2.0 * (ranks - 1) * lp_link_time(l, bytes / ranks);
}

int lp_link_active(const lp_link *l) {
  return l && (l->latency_s > 0 || l->bytes_per_s > 0);
}

/* Picks the largest unit in which x is at least 1. */
static void fmt_unit(char *buf, size_t size, double x, const unit *units) {
  const unit *u = units;
  if (units == time_units) u = x >= 1 ? &units[2] : x >= 1e-3 ? &units[1] : &units[0];
  else
    while (u[1].name && x < u->scale) u++;
  snprintf(buf, size, "%g%s", x / u->scale, u->name);
}

void lp_link_format(const lp_link *l, char *buf, size_t size) {
  if (!lp_link_active(l)) {
    snprintf(buf, size, "none");
    return;
  }
  char lat[32] = "", bw[32] = "";
  if (l->latency_s > 0) fmt_unit(lat, sizeof lat, l->latency_s, time_units);
  if (l->bytes_per_s > 0) fmt_unit(bw, sizeof bw, l->bytes_per_s, bw_units);
  snprintf(buf, size, "%s%s%s%s%s", *lat ? "lat=" : "", lat,
           *lat && *bw ? "," : "", *bw ? "bw=" : "", bw);
}

void lp_sleep_until(double t) {
  double left = t - lp_now();
  if (left <= 0) return;
  struct timespec ts;
  ts.tv_sec = (time_t)left;
  ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
