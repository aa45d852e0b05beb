/* sim_link.c — the simulator's side of the emulated link: the delay of a
 * cross-rank message and of an all-to-all-v phase, from the same lp_link
 * model the comm layer applies to real messages (see lp_sim.h). */
#include <math.h>

#include "lp_sim.h"

double lp_sim_act_bytes(const lp_sim_cost *c) {
  if (!c || !(c->act_values > 0)) return 0;
  return c->act_values * (c->value_bytes > 0 ? c->value_bytes : 4);
}

double lp_sim_message_bytes(const lp_sim_cost *c) {
  if (!c) return 0;
  return c->act_values > 0 ? lp_sim_act_bytes(c) : c->message_bytes;
}

lp_status lp_sim_message_delay(const lp_sim_cost *c, double *out, char *err) {
  *out = 0;
  if (!c) return LP_OK;
  char why[LP_ERRLEN];
  if (lp_sim_time_check("latency", c->latency, why) != LP_OK ||
      lp_sim_time_check("bytes", c->message_bytes, why) != LP_OK ||
      lp_sim_time_check("values", c->act_values, why) != LP_OK) {
    lp_errf(err, "cost model: %s", why);
    return LP_ERR_ARG;
  }
  if (c->value_bytes != 0 && c->value_bytes != 2 && c->value_bytes != 4) {
    lp_errf(err, "cost model: a value takes %d bytes: 4 (f32) or 2 (bf16)", c->value_bytes);
    return LP_ERR_ARG;
  }
  if (c->act_values > 0 && c->message_bytes > 0) {
    lp_errf(err, "cost model: give the message size as bytes or as values (with the "
                 "precision), not both");
    return LP_ERR_ARG;
  }
  const lp_link *l = &c->link;
  if (!(isfinite(l->latency_s) && l->latency_s >= 0 && isfinite(l->bytes_per_s) &&
        l->bytes_per_s >= 0)) {
    lp_errf(err, "cost model: link latency %g s and bandwidth %g B/s must be "
                 "numbers >= 0", l->latency_s, l->bytes_per_s);
    return LP_ERR_ARG;
  }
  /* the one cost rule also bounds the link's latency and the whole delay */
  double unit = c->link_unit > 0 ? c->link_unit : 1;
  double d = c->latency + unit * lp_link_time(l, lp_sim_message_bytes(c));
  if (lp_sim_time_check("link latency", l->latency_s, why) != LP_OK) {
    lp_errf(err, "cost model: %s", why);
    return LP_ERR_ARG;
  }
  if (lp_sim_time_check("message delay", d, why) != LP_OK) {
    lp_errf(err, "cost model: a message takes %.17g (latency + link latency + bytes / "
                 "bandwidth), more than the limit of %g", d, LP_SIM_MAX_TIME);
    return LP_ERR_ARG;
  }
  *out = d;
  return LP_OK;
}

double lp_sim_alltoallv_time(const lp_sim_cost *c, double bytes_out,
                             double bytes_in) {
  return c ? lp_link_alltoallv_time(&c->link, bytes_out, bytes_in) : 0;
}
