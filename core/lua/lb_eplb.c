/* lb_eplb.c — TEMPORARY placeholder; the EPLB binding replaces it. */
#include "lb_internal.h"

void lb_open_eplb(lua_State *L) { (void)L; }
