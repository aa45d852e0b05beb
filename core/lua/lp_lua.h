/* lp_lua.h — the Lua binding of the luapipe core (module "luapipe.core") and
 * the one pcall choke point every call into Lua goes through. Only this
 * folder and core/host include lua.h. */
#pragma once

#include <lua.h>

/* Opens the C module: returns 1 table with the per-module functions. */
int luaopen_luapipe_core(lua_State *L);

/* Calls the function below nargs arguments with a message handler that
 * turns any error value into text and appends a traceback. Same results as
 * lua_pcall; on error the message is left on the stack. */
int lp_lua_pcall(lua_State *L, int nargs, int nresults);

/* As lp_lua_pcall, but the message left is one line of text, the error's
 * own (a string, or what its __tostring gives), with no traceback: for a
 * callback whose failure the core reports inside a message of its own. */
int lp_lua_pcall_line(lua_State *L, int nargs, int nresults);

/* As lp_lua_pcall, but a luapipe.Error (a table whose metatable's __name
 * is "luapipe.Error") is left as that table, for the program's edge to
 * read its fields (luapipe.cli.job); other errors get the traceback. */
int lp_lua_pcall_keep(lua_State *L, int nargs, int nresults);

/* Message handler usable with lua_pcall directly (the host's docall). */
int lp_lua_traceback(lua_State *L);
