/* host.h — pieces of the luapipe program shared by main.c and repl.c. */
#pragma once

#include <lua.h>

/* Calls the function below nargs arguments through the pcall choke point
 * with Ctrl-C turned into a Lua error. */
int host_docall(lua_State *L, int nargs, int nres);
/* Installs the SIGINT handler (the process keeps it for its whole life). */
void host_sigint_install(void);
/* Returns 1 and clears it when a Ctrl-C is pending outside a call. */
int host_interrupt_take(void);
/* Prints the error on top of the stack (if status is not OK) to stderr and
 * pops it; a luapipe.Error table goes to the job policy (luapipe.cli.job),
 * which prints it and says the exit status. */
void host_report(lua_State *L, int status);
/* Runs the interactive REPL until end of input. */
void host_repl(lua_State *L);
