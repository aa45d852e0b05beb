/* lb_safetensors.c — luapipe.Safetensors: a safetensors file open for
 * reading, and the writer.
 *   core.safetensors_open(path) -> Safetensors | nil, message
 *   st:tensors() -> {name = {dtype =, shape = {...}, offsets = {begin, end}}}
 *   st:names() -> {name, ...} in the order of their data
 *   st:metadata() -> {key = value} ("__metadata__")
 *   st:read(name [, {scale = name, block = 128, scale_file = st2}]) -> Tensor
 *     | nil, message (scale_file: the shard that holds the scale)
 *   st:bytes_read() -> bytes read from the file so far
 *   st:path(), st:close()
 *   core.safetensors_write(path, {name = Tensor, ...} [, {dtype = "f32" |
 *     "bf16", order = {name, ...}, metadata = {key = value}}]) -> true |
 *     nil, message
 * A broken file, a missing tensor or a failed write is a runtime failure
 * (nil, message naming the file and tensor); misuse raises. */
#include <stdlib.h>
#include <string.h>

#include "lb_nn.h"
#include "lp_safetensors.h"

#define LB_SAFETENSORS "luapipe.Safetensors"

typedef struct st_box {
  lp_safetensors_file *f; /* NULL once closed */
} st_box;

static lp_safetensors_file *check_st(lua_State *L, int idx) {
  return ((st_box *)lb_box_check(L, idx, LB_SAFETENSORS))->f;
}

static int lb_st_close(lua_State *L) {
  st_box *b = luaL_checkudata(L, 1, LB_SAFETENSORS);
  lp_safetensors_close(b->f);
  b->f = NULL;
  return 0;
}

/* core.safetensors_open(path) -> Safetensors | nil, message */
static int lb_st_open(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  st_box *b = lb_box_new(L, sizeof *b, LB_SAFETENSORS);
  char err[LP_ERRLEN];
  if (lp_safetensors_open(path, &b->f, err) != LP_OK) return lb_fail(L, err);
  return 1;
}

static void push_shape(lua_State *L, const lp_safetensors_info *t) {
  lua_createtable(L, t->ndim, 0);
  for (int d = 0; d < t->ndim; d++) {
    lua_pushinteger(L, t->shape[d]);
    lua_rawseti(L, -2, d + 1);
  }
}

/* st:tensors() -> {name = {dtype =, shape =, offsets =}} */
static int lb_st_tensors(lua_State *L) {
  lp_safetensors_file *f = check_st(L, 1);
  size_t n = lp_safetensors_count(f);
  lua_createtable(L, 0, (int)n);
  for (size_t i = 0; i < n; i++) {
    const lp_safetensors_info *t = lp_safetensors_at(f, i);
    lua_createtable(L, 0, 3);
    lua_pushstring(L, lp_safetensors_dtype_name(t->dtype));
    lua_setfield(L, -2, "dtype");
    push_shape(L, t);
    lua_setfield(L, -2, "shape");
    lua_createtable(L, 2, 0);
    lua_pushinteger(L, (lua_Integer)t->begin);
    lua_rawseti(L, -2, 1);
    lua_pushinteger(L, (lua_Integer)t->end);
    lua_rawseti(L, -2, 2);
    lua_setfield(L, -2, "offsets");
    lua_setfield(L, -2, t->name);
  }
  return 1;
}

/* st:names() -> {name, ...} in data order */
static int lb_st_names(lua_State *L) {
  lp_safetensors_file *f = check_st(L, 1);
  size_t n = lp_safetensors_count(f);
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushstring(L, lp_safetensors_at(f, i)->name);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}

/* st:metadata() -> {key = value} */
static int lb_st_metadata(lua_State *L) {
  lp_safetensors_file *f = check_st(L, 1);
  size_t n = lp_safetensors_metadata_count(f);
  lua_createtable(L, 0, (int)n);
  for (size_t i = 0; i < n; i++) {
    const char *k, *v;
    lp_safetensors_metadata_at(f, i, &k, &v);
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
  }
  return 1;
}

/* st:read(name [, {scale = name, block = n, scale_file = Safetensors}]) ->
 * Tensor | nil, message */
static int lb_st_read(lua_State *L) {
  lp_safetensors_file *f = check_st(L, 1);
  const char *name = luaL_checkstring(L, 2);
  lp_safetensors_read_opts o = {NULL, 0, NULL};
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    if (lua_getfield(L, 3, "scale") != LUA_TNIL) {
      if (lua_type(L, -1) != LUA_TSTRING)
        luaL_argerror(L, 3, "scale must be the name of a tensor");
      o.scale = lua_tostring(L, -1); /* stays on the stack while we read */
    }
    if (lua_getfield(L, 3, "block") != LUA_TNIL) {
      int ok;
      lua_Integer b = lua_tointegerx(L, -1, &ok);
      if (!ok || b < 1) luaL_argerror(L, 3, "block must be a positive integer");
      o.block = b;
    }
    if (lua_getfield(L, 3, "scale_file") != LUA_TNIL) {
      st_box *sb = luaL_testudata(L, -1, LB_SAFETENSORS);
      if (!sb) luaL_argerror(L, 3, "scale_file must be a luapipe.Safetensors");
      if (!sb->f) luaL_argerror(L, 3, "scale_file is closed");
      o.scale_file = sb->f;
    }
  }
  lp_tensor **box = lb_box_new(L, sizeof *box, LB_TENSOR); /* closed-first */
  if (lp_safetensors_read_tensor(f, name, &o, box) != LP_OK)
    return lb_fail(L, lp_safetensors_last_error(f));
  return 1;
}

static int lb_st_bytes_read(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)lp_safetensors_bytes_read(check_st(L, 1)));
  return 1;
}

static int lb_st_path(lua_State *L) {
  lua_pushstring(L, lp_safetensors_path(check_st(L, 1)));
  return 1;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* core.safetensors_write(path, tensors [, opts]) -> true | nil, message.
 * The C arrays live in userdata on the stack, so a raise frees them; a
 * tensor that is strided or on a device is copied to the host first (a
 * Tensor box in a table on the stack owns the copy). */
static int lb_st_write(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 3);
  lp_safetensors_write_opts o = {LP_SAFETENSORS_F32, 0, NULL, 0};
  if (!lua_isnil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    if (lua_getfield(L, 3, "dtype") != LUA_TNIL) {
      const char *d = lua_tostring(L, -1);
      if (d && (strcmp(d, "f32") == 0 || strcmp(d, "F32") == 0)) o.dtype = LP_SAFETENSORS_F32;
      else if (d && (strcmp(d, "bf16") == 0 || strcmp(d, "BF16") == 0))
        o.dtype = LP_SAFETENSORS_BF16;
      else
        luaL_argerror(L, 3, lua_pushfstring(L, "dtype must be \"f32\" or \"bf16\", got %s",
                                            d ? d : luaL_typename(L, -1)));
    }
    lua_pop(L, 1);
  }
  /* the names: opts.order, or every key of tensors */
  size_t n = 0;
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    if (lua_type(L, -2) != LUA_TSTRING)
      luaL_argerror(L, 2, lua_pushfstring(L, "tensor names must be strings, got a %s",
                                          luaL_typename(L, -2)));
    if (!luaL_testudata(L, -1, LB_TENSOR))
      luaL_argerror(L, 2, lua_pushfstring(L, "'%s' is a %s, not a luapipe.Tensor",
                                          lua_tostring(L, -2), luaL_typename(L, -1)));
    n++;
    lua_pop(L, 1);
  }
  const char **names = lua_newuserdatauv(L, (n ? n : 1) * sizeof *names, 0); /* [.., names] */
  int have_order = !lua_isnil(L, 3) && lua_getfield(L, 3, "order") != LUA_TNIL;
  if (!lua_isnil(L, 3) && !have_order) lua_pop(L, 1);
  if (have_order) { /* [.., names, order] */
    if (!lua_istable(L, -1)) luaL_argerror(L, 3, "order must be a list of tensor names");
    if ((size_t)luaL_len(L, -1) != n)
      luaL_argerror(L, 3, lua_pushfstring(L, "order lists %I names for %I tensors",
                                          (lua_Integer)luaL_len(L, -1), (lua_Integer)n));
    for (size_t i = 0; i < n; i++) {
      lua_geti(L, -1, (lua_Integer)i + 1);
      const char *k = lua_tostring(L, -1);
      if (lua_type(L, -1) != LUA_TSTRING || lua_getfield(L, 2, k) == LUA_TNIL)
        luaL_argerror(L, 3, lua_pushfstring(L, "order[%I] is not a tensor of the table",
                                            (lua_Integer)i + 1));
      lua_pop(L, 2);
      lua_geti(L, -1, (lua_Integer)i + 1);
      names[i] = lua_tostring(L, -1); /* the order table keeps the string alive */
      lua_pop(L, 1);
    }
    o.keep_order = 1;
  } else {
    size_t i = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
      lua_pop(L, 1);
      names[i++] = lua_tostring(L, -1); /* keys of the tensors table stay alive */
    }
  }
  /* entries (host copies where needed live in Tensor boxes kept in a table
   * on the stack) */
  lp_safetensors_entry *e = lua_newuserdatauv(L, (n ? n : 1) * sizeof *e, 0);
  lua_newtable(L);
  int keep = lua_gettop(L);
  for (size_t i = 0; i < n; i++) {
    lua_getfield(L, 2, names[i]);
    lp_tensor *t = lb_check_tensor(L, -1);
    lua_pop(L, 1);
    if (!lp_tensor_is_contiguous(t) || !lp_tensor_backend_of(t)->host_accessible) {
      lp_tensor **copy = lb_box_new(L, sizeof *copy, LB_TENSOR);
      lp_status st = lp_tensor_to_host(t, copy);
      if (st != LP_OK)
        return lb_fail(L, lua_pushfstring(L, "%s: reading tensor '%s' from %s failed: %s",
                                          path, names[i], lp_tensor_backend_of(t)->name,
                                          lp_strerror(st)));
      t = *copy;
      lua_rawseti(L, keep, (lua_Integer)i + 1);
    }
    e[i] = (lp_safetensors_entry){names[i], t->ndim, t->shape, t->data};
  }
  /* metadata, keys sorted (a Lua table has no order) */
  const char **kv = NULL;
  if (!lua_isnil(L, 3) && lua_getfield(L, 3, "metadata") != LUA_TNIL) {
    int mi = lua_gettop(L);
    if (!lua_istable(L, mi)) luaL_argerror(L, 3, "metadata must be a table of strings");
    size_t m = 0;
    lua_pushnil(L);
    while (lua_next(L, mi)) {
      if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
        luaL_argerror(L, 3, "metadata keys and values must be strings");
      m++;
      lua_pop(L, 1);
    }
    kv = lua_newuserdatauv(L, (m ? 2 * m : 1) * sizeof *kv, 0);
    size_t i = 0;
    lua_pushnil(L);
    while (lua_next(L, mi)) {
      lua_pop(L, 1);
      kv[2 * i++] = lua_tostring(L, -1);
    }
    /* sort the keys, then look their values up */
    const char **keys = lua_newuserdatauv(L, (m ? m : 1) * sizeof *keys, 0);
    for (i = 0; i < m; i++) keys[i] = kv[2 * i];
    qsort(keys, m, sizeof *keys, cmp_str);
    for (i = 0; i < m; i++) {
      kv[2 * i] = keys[i];
      lua_getfield(L, mi, keys[i]);
      kv[2 * i + 1] = lua_tostring(L, -1); /* the metadata table keeps it alive */
      lua_pop(L, 1);
    }
    o.metadata = kv;
    o.n_metadata = m;
  }
  char err[LP_ERRLEN];
  if (lp_safetensors_write(path, e, n, &o, err) != LP_OK) return lb_fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

void lb_open_safetensors(lua_State *L) {
  static const luaL_Reg methods[] = {{"tensors", lb_st_tensors},
                                     {"names", lb_st_names},
                                     {"metadata", lb_st_metadata},
                                     {"read", lb_st_read},
                                     {"bytes_read", lb_st_bytes_read},
                                     {"path", lb_st_path},
                                     {"close", lb_st_close},
                                     {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", lb_st_close}, {"__close", lb_st_close}, {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"safetensors_open", lb_st_open},
                                   {"safetensors_write", lb_st_write},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  lb_new_class(L, LB_SAFETENSORS, "Safetensors", methods, meta);
}
