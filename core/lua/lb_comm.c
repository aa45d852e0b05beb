/* lb_comm.c — the process's communicator seen from Lua (core.comm_*): rank
 * and size, barrier, all-reduce, blocking send / receive of number lists,
 * abort; luapipe.Comm objects (the world or a split of it) with split,
 * all-to-all-v, all-reduce, barrier and the emulated link; the link parser.
 * Misuse (a bad peer or tag, non-numbers) raises; runtime failures (a
 * timeout, a peer that sent the wrong length) return nil, message. */
#include <limits.h>

#include "lb_internal.h"
#include "lp_comm.h"

#define LB_COMM_MAX_COUNT (1 << 26) /* floats in one message from Lua */

/* Raises the context's error for misuse, else pushes nil, message. */
static int comm_fail(lua_State *L, lp_comm *c, lp_status st) {
  if (st == LP_ERR_NOMEM) return luaL_error(L, "out of memory");
  if (st == LP_ERR_ARG) return luaL_error(L, "%s", lp_comm_last_error(c));
  return lb_fail(L, lp_comm_last_error(c));
}

/* core.comm() -> {rank=, size=, backend=, timeout=, tag_ub=,
 * progress_thread=} */
static int lb_comm_info(lua_State *L) {
  lp_comm *c = lp_comm_world();
  lua_createtable(L, 0, 6);
  lua_pushboolean(L, lp_comm_progress_thread());
  lua_setfield(L, -2, "progress_thread");
  lb_set_integer(L, "rank", lp_comm_rank(c));
  lb_set_integer(L, "size", lp_comm_size(c));
  lua_pushstring(L, lp_comm_backend_name(c));
  lua_setfield(L, -2, "backend");
  lb_set_number(L, "timeout", lp_comm_timeout(c));
  lb_set_integer(L, "tag_ub", lp_comm_tag_ub(c));
  return 1;
}

/* core.comm_barrier([what]) -> true | nil, err */
static int lb_comm_barrier(lua_State *L) {
  lp_comm *c = lp_comm_world();
  lp_status st = lp_comm_barrier(c, luaL_optstring(L, 1, "comm.barrier"));
  if (st != LP_OK) return comm_fail(L, c, st);
  lua_pushboolean(L, 1);
  return 1;
}

/* Copies the numbers of the list at idx into a new userdata of floats (or
 * doubles) and returns it; the userdata stays on the stack so the GC owns
 * it even when a later error is raised. *n gets the length. */
static void *check_numbers(lua_State *L, int idx, int as_double, size_t *n) {
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_Integer len = luaL_len(L, idx);
  luaL_argcheck(L, len <= LB_COMM_MAX_COUNT, idx, "list too long");
  size_t elem = as_double ? sizeof(double) : sizeof(float);
  void *buf = lua_newuserdatauv(L, (size_t)len * elem + 1, 0); /* [.., buf] */
  for (lua_Integer i = 1; i <= len; i++) {
    int ok;
    lua_geti(L, idx, i);
    lua_Number v = lua_tonumberx(L, -1, &ok);
    if (!ok)
      luaL_error(L, "entry %d of the list is a %s, not a number", (int)i,
                 luaL_typename(L, -1));
    lua_pop(L, 1);
    if (as_double) ((double *)buf)[i - 1] = (double)v;
    else ((float *)buf)[i - 1] = (float)v;
  }
  *n = (size_t)len;
  return buf;
}

/* core.comm_allreduce_sum(list [, what]) -> list of sums | nil, err
 * (in double precision). */
/* Pushes n doubles as a Lua list; returns 1. */
static int push_doubles(lua_State *L, const double *buf, size_t n) {
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushnumber(L, buf[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}

/* The element-wise sum over the ranks of c of the list at `list` (the
 * watchdog text at `what`): the list of sums | nil, err. */
static int allreduce_on(lua_State *L, lp_comm *c, int list, int what_arg) {
  const char *what = luaL_optstring(L, what_arg, "comm.allreduce");
  size_t n;
  double *buf = check_numbers(L, list, 1, &n);
  lp_status st = lp_comm_allreduce_sum_double(c, buf, n, what);
  if (st != LP_OK) return comm_fail(L, c, st);
  return push_doubles(L, buf, n);
}

static int lb_comm_allreduce_sum(lua_State *L) {
  return allreduce_on(L, lp_comm_world(), 1, 2);
}

static int check_tag(lua_State *L, int arg, lp_comm *c) {
  lua_Integer tag = luaL_optinteger(L, arg, 0);
  if (tag < 0 || tag > lp_comm_tag_ub(c))
    luaL_argerror(L, arg, lua_pushfstring(L, "tag %d is out of range 0..%d",
                                          (int)tag, lp_comm_tag_ub(c)));
  return (int)tag;
}

static int check_peer(lua_State *L, int arg, lp_comm *c) {
  lua_Integer p = luaL_checkinteger(L, arg);
  if (p < 0 || p >= lp_comm_size(c))
    luaL_argerror(L, arg, lua_pushfstring(L, "rank %d is out of range 0..%d",
                                          (int)p, lp_comm_size(c) - 1));
  return (int)p;
}

/* core.comm_send(peer, list [, tag [, what]]) -> true | nil, err
 * (the numbers travel as floats). */
static int lb_comm_send(lua_State *L) {
  lp_comm *c = lp_comm_world();
  int peer = check_peer(L, 1, c);
  int tag = check_tag(L, 3, c);
  const char *what = luaL_optstring(L, 4, "comm.send");
  size_t n;
  const float *buf = check_numbers(L, 2, 0, &n);
  lp_status st = lp_comm_send(c, buf, n, peer, tag, what);
  if (st != LP_OK) return comm_fail(L, c, st);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.comm_recv(peer, n [, tag [, what]]) -> list of n numbers | nil, err */
static int lb_comm_recv(lua_State *L) {
  lp_comm *c = lp_comm_world();
  int peer = check_peer(L, 1, c);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_argcheck(L, n >= 0 && n <= LB_COMM_MAX_COUNT, 2, "count out of range");
  int tag = check_tag(L, 3, c);
  const char *what = luaL_optstring(L, 4, "comm.recv");
  float *buf = lua_newuserdatauv(L, (size_t)n * sizeof(float) + 1, 0);
  lp_status st = lp_comm_recv(c, buf, (size_t)n, peer, tag, what);
  if (st != LP_OK) return comm_fail(L, c, st);
  lua_createtable(L, (int)n, 0);
  for (lua_Integer i = 0; i < n; i++) {
    lua_pushnumber(L, (lua_Number)buf[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* core.comm_abort([msg]): prints "luapipe: rank R: msg" and takes every
 * rank down with exit code 1. Does not return. */
static int lb_comm_abort(lua_State *L) {
  const char *msg = luaL_optstring(L, 1, "aborted by the script");
  lp_comm_fatal(lp_comm_world(), msg);
  return 0;
}

/* ---- luapipe.Comm objects ---- */

#define LB_COMM "luapipe.Comm"

typedef struct comm_box {
  lp_comm *c; /* first field: NULL once closed (the world is never freed) */
} comm_box;

static lp_comm *check_comm(lua_State *L, int idx) {
  return ((comm_box *)lb_box_check(L, idx, LB_COMM))->c;
}

static void push_comm(lua_State *L, lp_comm *c) {
  comm_box *b = lb_box_new(L, sizeof *b, LB_COMM);
  b->c = c;
}

/* core.comm_world() -> the world as a luapipe.Comm */
static int lb_comm_world(lua_State *L) {
  push_comm(L, lp_comm_world());
  return 1;
}

/* c:close() / __gc: frees a split context (the world stays). */
static int lb_comm_close(lua_State *L) {
  comm_box *b = luaL_checkudata(L, 1, LB_COMM);
  if (b->c) lp_comm_free(b->c);
  b->c = NULL;
  return 0;
}

static int lb_comm_obj_rank(lua_State *L) {
  lua_pushinteger(L, lp_comm_rank(check_comm(L, 1)));
  return 1;
}

static int lb_comm_obj_size(lua_State *L) {
  lua_pushinteger(L, lp_comm_size(check_comm(L, 1)));
  return 1;
}

/* c:split(color, key) -> luapipe.Comm | nil, err (collective over c) */
static int lb_comm_obj_split(lua_State *L) {
  lp_comm *c = check_comm(L, 1);
  lua_Integer color = luaL_checkinteger(L, 2);
  lua_Integer key = luaL_optinteger(L, 3, lp_comm_rank(c));
  luaL_argcheck(L, color >= 0 && color <= INT_MAX, 2, "color must be >= 0");
  luaL_argcheck(L, key >= INT_MIN && key <= INT_MAX, 3, "key out of range");
  comm_box *b = lb_box_new(L, sizeof *b, LB_COMM); /* owns it before split */
  lp_status st = lp_comm_split(c, (int)color, (int)key, &b->c);
  if (st != LP_OK) return comm_fail(L, c, st);
  return 1;
}

/* c:barrier([what]) -> true | nil, err */
static int lb_comm_obj_barrier(lua_State *L) {
  lp_comm *c = check_comm(L, 1);
  lp_status st = lp_comm_barrier(c, luaL_optstring(L, 2, "comm.barrier"));
  if (st != LP_OK) return comm_fail(L, c, st);
  lua_pushboolean(L, 1);
  return 1;
}

/* c:allreduce(list [, what]) -> sums (in doubles) | nil, err */
static int lb_comm_obj_allreduce(lua_State *L) {
  return allreduce_on(L, check_comm(L, 1), 2, 3);
}

/* c:bcast(list, root [, what]) -> root's list (as doubles) | nil, err;
 * every rank passes a list of the same length (the others' values are
 * ignored). */
static int lb_comm_obj_bcast(lua_State *L) {
  lp_comm *c = check_comm(L, 1);
  lua_Integer root = luaL_checkinteger(L, 3);
  luaL_argcheck(L, root >= 0 && root < lp_comm_size(c), 3, "no such rank");
  const char *what = luaL_optstring(L, 4, "comm.bcast");
  size_t n;
  double *buf = check_numbers(L, 2, 1, &n);
  lp_status st = lp_comm_bcast(c, buf, n * sizeof(double), (int)root, what);
  if (st != LP_OK) return comm_fail(L, c, st);
  return push_doubles(L, buf, n);
}

#define LB_A2A_MAX_COUNT (1 << 24) /* floats per piece: exact as a float count */

/* c:alltoallv(lists [, what]) -> received lists | nil, err
 * lists[p + 1] is the list of numbers for rank p (size(c) lists, any may
 * be empty); returns size(c) lists, entry p + 1 from rank p (as floats).
 * The counts travel first (an all-to-all-v of one float each). */
static int lb_comm_obj_alltoallv(lua_State *L) {
  lp_comm *c = check_comm(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  const char *what = luaL_optstring(L, 3, "comm.alltoallv");
  int n = lp_comm_size(c), me = lp_comm_rank(c);
  luaL_argcheck(L, luaL_len(L, 2) == n, 2,
                lua_pushfstring(L, "expected %d lists (one per rank)", n));
  size_t *a = lua_newuserdatauv(L, 4 * (size_t)n * sizeof(size_t), 0);
  size_t *sc = a, *sd = a + n, *rc = a + 2 * n, *rd = a + 3 * n;
  size_t total = 0;
  for (int p = 0; p < n; p++) {
    lua_geti(L, 2, p + 1);
    luaL_argcheck(L, lua_istable(L, -1), 2, "every entry must be a list of numbers");
    lua_Integer len = luaL_len(L, -1);
    luaL_argcheck(L, len <= LB_A2A_MAX_COUNT, 2, "list too long");
    lua_pop(L, 1);
    sc[p] = (size_t)len;
    sd[p] = total;
    total += (size_t)len;
  }
  float *send = lua_newuserdatauv(L, total * sizeof(float) + 1, 0);
  for (int p = 0; p < n; p++) {
    lua_geti(L, 2, p + 1);
    for (size_t i = 0; i < sc[p]; i++) {
      int ok;
      lua_geti(L, -1, (lua_Integer)i + 1);
      lua_Number v = lua_tonumberx(L, -1, &ok);
      if (!ok)
        luaL_error(L, "entry %d of the list for rank %d is a %s, not a number",
                   (int)i + 1, p, luaL_typename(L, -1));
      send[sd[p] + i] = (float)v;
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  /* 1: the counts */
  float *cnt = lua_newuserdatauv(L, 2 * (size_t)n * sizeof(float), 0);
  size_t *one = lua_newuserdatauv(L, 2 * (size_t)n * sizeof(size_t), 0);
  for (int p = 0; p < n; p++) {
    cnt[p] = (float)sc[p];
    one[p] = 1;
    one[n + p] = (size_t)p;
  }
  lp_status st = lp_comm_alltoallv(c, cnt, one, one + n, cnt + n, one, one + n, what);
  if (st != LP_OK) return comm_fail(L, c, st);
  size_t rtotal = 0;
  for (int p = 0; p < n; p++) {
    rc[p] = (size_t)cnt[n + p];
    rd[p] = rtotal;
    rtotal += rc[p];
  }
  if (rc[me] != sc[me]) return luaL_error(L, "internal: self count mismatch");
  /* 2: the numbers */
  float *recv = lua_newuserdatauv(L, rtotal * sizeof(float) + 1, 0);
  st = lp_comm_alltoallv(c, send, sc, sd, recv, rc, rd, what);
  if (st != LP_OK) return comm_fail(L, c, st);
  lua_createtable(L, n, 0);
  for (int p = 0; p < n; p++) {
    lua_createtable(L, (int)rc[p], 0);
    for (size_t i = 0; i < rc[p]; i++) {
      lua_pushnumber(L, (lua_Number)recv[rd[p] + i]);
      lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    lua_rawseti(L, -2, p + 1);
  }
  return 1;
}

/* c:set_link(text) sets the emulated link ("lat=50us,bw=2GB/s", "none");
 * a malformed text raises the parser's message. */
static int lb_comm_obj_set_link(lua_State *L) {
  lp_comm *c = check_comm(L, 1);
  lp_link l;
  char err[LP_ERRLEN];
  if (lp_link_parse(luaL_checkstring(L, 2), &l, err) != LP_OK)
    return luaL_error(L, "%s", err);
  lp_comm_set_link(c, &l);
  return 0;
}

/* c:link() -> "lat=50us,bw=2GB/s" | "none" */
static int lb_comm_obj_link(lua_State *L) {
  char text[64];
  lp_link_format(lp_comm_link(check_comm(L, 1)), text, sizeof text);
  lua_pushstring(L, text);
  return 1;
}

/* core.link_parse(text) -> {latency=seconds, bandwidth=bytes/s (0:
 * unlimited), text=canonical} | nil, err */
static int lb_link_parse(lua_State *L) {
  lp_link l;
  char err[LP_ERRLEN], text[64];
  if (lp_link_parse(luaL_checkstring(L, 1), &l, err) != LP_OK)
    return lb_fail(L, err);
  lua_createtable(L, 0, 3);
  lb_set_number(L, "latency", l.latency_s);
  lb_set_number(L, "bandwidth", l.bytes_per_s);
  lp_link_format(&l, text, sizeof text);
  lua_pushstring(L, text);
  lua_setfield(L, -2, "text");
  return 1;
}

void lb_open_comm(lua_State *L) {
  static const luaL_Reg methods[] = {{"rank", lb_comm_obj_rank},
                                     {"size", lb_comm_obj_size},
                                     {"split", lb_comm_obj_split},
                                     {"barrier", lb_comm_obj_barrier},
                                     {"allreduce", lb_comm_obj_allreduce},
                                     {"bcast", lb_comm_obj_bcast},
                                     {"alltoallv", lb_comm_obj_alltoallv},
                                     {"set_link", lb_comm_obj_set_link},
                                     {"link", lb_comm_obj_link},
                                     {"close", lb_comm_close},
                                     {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", lb_comm_close},
                                  {"__close", lb_comm_close},
                                  {NULL, NULL}};
  lb_new_class(L, LB_COMM, "Comm", methods, meta);
  static const luaL_Reg more[] = {{"comm_world", lb_comm_world},
                                  {"link_parse", lb_link_parse},
                                  {NULL, NULL}};
  luaL_setfuncs(L, more, 0);
  static const luaL_Reg funcs[] = {{"comm", lb_comm_info},
                                   {"comm_barrier", lb_comm_barrier},
                                   {"comm_allreduce_sum", lb_comm_allreduce_sum},
                                   {"comm_send", lb_comm_send},
                                   {"comm_recv", lb_comm_recv},
                                   {"comm_abort", lb_comm_abort},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0); /* [mod] */
}
