/* lb_sim.c — TEMPORARY placeholder; the simulator binding replaces it. */
#include "lb_internal.h"

void lb_open_sim(lua_State *L) { (void)L; }
