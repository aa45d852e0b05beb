/* lb_pending.c — TEMPORARY: module openers not written yet. */
#include "lb_internal.h"

void lb_open_sim(lua_State *L) { (void)L; }
void lb_open_eplb(lua_State *L) { (void)L; }
