-- luapipe.checkpoint: the checkpoints of luapipe.train (checkpoint = {dir =,
-- every =}, resume = true). Layout of dir:
--
--   <dir>/step<N>/rank<R>.ckpt   one file per rank: its virtual stages'
--                                parameters and optimizer state after step
--                                N (C format, see core/exec/lp_exec.h)
--   <dir>/step<N>/state.json     what luapipe.train keeps beside the ranks'
--                                files (the model's partition into stages,
--                                the EPLB loop's state), written by rank 0
--                                before latest names step N
--   <dir>/latest                 {"step": N, "dir": "step<N>", ...}: the
--                                newest complete checkpoint
--   <dir>/pending                {"step": N, "ranks": P}: a save in progress
--
-- The hosts need not share dir: every host may have its own copy at the
-- same path (its local disk), or all may see one shared directory (one
-- host, or a shared file system); both work alike. Each rank reads and
-- writes only its own rank<R>.ckpt; everything else is rank 0's: the
-- markers (latest, pending) and state.json are written and read by rank 0
-- alone, on rank 0's host, and what it read reaches the other ranks over
-- the comm (the step of latest and pending, state.json's text). So with
-- local disks, rank 0's host holds latest, pending (during a save) and
-- step<N>/state.json beside its ranks' files, and every other host holds
-- only step<N>/rank<R>.ckpt of the ranks it runs: no marker, and any
-- latest or pending found there (one of an earlier job) is never read. A
-- resume must therefore place every rank on the host that holds its file
-- (the same host list, in the same order); a rank whose file is not on
-- its host fails naming the rank and the file.
--
-- Saving after step N: rank 0 writes <dir>/pending and creates
-- <dir>/step<N>; every rank creates <dir>/step<N> on its host (if its host
-- has none yet) and writes its file (rank<R>.ckpt.tmp, fsync, rename);
-- once every rank has finished, rank 0 writes state.json, then replaces
-- <dir>/latest (both write-then-rename), removes pending, and only then
-- the previous checkpoint is removed: each rank removes its own file (rank
-- 0 also state.json), and then every rank removes the step directory on
-- its host when it is empty. A job that dies at any point leaves `latest`
-- naming a complete checkpoint; what a killed save left behind is removed
-- at the next resume or save: rank 0 tells every rank the step of latest
-- and of pending, each rank removes its own leftovers (its *.ckpt.tmp in
-- both steps, its rank<R>.ckpt in pending's step unless latest names it),
-- rank 0 also the markers' .tmp files, pending's state.json and the files
-- of ranks a larger killed job had, and every rank then removes pending's
-- step directory on its host when empty. A `latest` that does not parse,
-- or whose step and directory disagree, is an error naming the file and
-- the fault, never read as some other step. Every step between is
-- collective (all ranks call it after the same step), so a failure on one
-- rank is reported on every rank.
local core = require("luapipe.core")
local comm = require("luapipe.comm")
local json = require("luapipe.json")
local util = require("luapipe.util")

local M = {}

-- A failure every rank knows of (a marker every rank read, or one agree()
-- told every rank of): on one process an error; under mpirun every rank
-- raises it as a luapipe.Error with everywhere = true and speaker = the
-- first rank that failed (with its own message; default rank 0): the job
-- policy (luapipe.cli.job) prints it once and every rank exits with status
-- 1 (no copy and no traceback per rank).
local function fail(msg, speaker)
  util.arg("checkpoint.fail_all", 1, "msg", msg, "string", "a message")
  util.arg("checkpoint.fail_all", 2, "speaker", speaker, "?integer", "a rank")
  if comm.size() == 1 then util.fail(msg, 0) end
  util.fail({ what = msg, everywhere = true, speaker = speaker or 0, status = 1 }, 0)
end

-- A collective that failed (the comm's own message): the other ranks may
-- be left waiting, so the error says so (stranded: the job policy takes
-- the job down).
local function fail_comm(msg)
  util.fail({ what = msg, stranded = comm.size() > 1 }, 0)
end

-- cfg must be what checkpoint.options returned (field: the one fn needs).
local function check_cfg(fn, cfg, field)
  if type(cfg) ~= "table" or type(cfg.resume) ~= "boolean"
    or (field and type(cfg[field]) ~= "string") then
    util.raise(string.format("%s: cfg (argument 1) must be what checkpoint.options "
      .. "returned%s, got %s", fn, field and " (with " .. field .. ")" or "", util.shown(cfg)))
  end
end

local function step_dir(dir, step) return string.format("%s/step%d", dir, step) end

M.fail_all = fail -- (luapipe.train's own such failures: a state.json of other settings)

-- Every rank passes whether its part worked; returns nil when all did,
-- else this rank's message (its own error, or which ranks failed) and the
-- first rank that failed.
local function agree(ok, err, what)
  local size = comm.size()
  if size == 1 then return (not ok) and (err or what .. " failed") or nil end
  local v = {}
  for r = 1, size do v[r] = 0 end
  if not ok then v[comm.rank() + 1] = 1 end
  local all, cerr = comm.allreduce(v, what)
  if not all then fail_comm(cerr) end
  local bad = {}
  for r = 1, size do
    if all[r] ~= 0 then bad[#bad + 1] = tostring(r - 1) end
  end
  if #bad == 0 then return nil end
  local first = tonumber(bad[1])
  if not ok then return err or (what .. " failed"), first end
  return string.format("%s failed on rank%s %s (see %s message)", what, #bad > 1 and "s" or "",
    table.concat(bad, ", "), #bad > 1 and "their" or "its"), first
end

-- Checks the options; nil when neither checkpoint nor resume is given, else
-- {dir =, every =, resume =}. Raises on misuse (the same on every rank).
function M.options(opts)
  util.arg("checkpoint.options", 1, "opts", opts, "table", "the options table of train{}")
  local ck, resume = opts.checkpoint, opts.resume
  if ck == nil and not resume then return nil end
  local cfg = { every = nil, resume = false }
  if ck ~= nil then
    if type(ck) ~= "table" or type(ck.dir) ~= "string" or ck.dir == "" then
      util.raise("luapipe.train: 'checkpoint' must be {dir = \"path\", every = N}")
    end
    local every = ck.every or 1
    if math.type(every) ~= "integer" or every < 1 then
      util.raise("luapipe.train: checkpoint.every must be a positive integer")
    end
    cfg.dir, cfg.every = ck.dir, every
  end
  if resume then
    if resume == "auto" then
      -- a job that restarts itself: resume when there is a checkpoint, else
      -- start fresh (a folder named auto is "./auto")
      if not cfg.dir then
        util.raise("luapipe.train: resume = \"auto\" needs checkpoint = {dir = \"path\"}")
      end
      cfg.resume_dir, cfg.auto = cfg.dir, true
    elseif type(resume) == "string" then
      cfg.resume_dir = resume
    elseif resume == true then
      if not cfg.dir then
        util.raise("luapipe.train: resume = true needs checkpoint = {dir = \"path\"} (or "
          .. "resume = \"path\")")
      end
      cfg.resume_dir = cfg.dir
    else
      util.raise("luapipe.train: 'resume' must be true, \"auto\" or a checkpoint directory")
    end
    cfg.resume = true
  end
  return cfg
end

-- Reads a marker file (latest or pending): its table, or nil, why (nil,
-- nil when the file does not exist). Every field is checked: a marker
-- written in part or damaged is never taken for another step.
local function read_marker(path)
  local f = io.open(path, "rb")
  if not f then return nil, nil end
  local text, rerr = f:read("a")
  f:close()
  if not text then return nil, "it cannot be read (" .. tostring(rerr) .. ")" end
  if text == "" then return nil, "it is empty" end
  local t, _, jerr = json.decode(text)
  if t == nil then return nil, "it is not complete JSON (" .. jerr .. ")" end
  if type(t) ~= "table" then return nil, "it is not a JSON object" end
  if math.type(t.step) ~= "integer" or t.step < 0 then
    return nil, string.format("\"step\" is %s, not a step number",
      t.step == nil and "missing" or json.encode(t.step))
  end
  if t.dir ~= nil and t.dir ~= "step" .. t.step then
    return nil, string.format("\"dir\" is %s, but \"step\" is %d (expected \"step%d\")",
      json.encode(t.dir), t.step, t.step)
  end
  if t.ranks ~= nil and (math.type(t.ranks) ~= "integer" or t.ranks < 1) then
    return nil, string.format("\"ranks\" is %s, not a rank count", json.encode(t.ranks))
  end
  return t
end

local function damaged(path, why)
  return string.format("luapipe.train: checkpoint marker %s is damaged: %s; it should read "
    .. "{\"step\": N, \"dir\": \"stepN\", ...}. Restore it, or remove it to start afresh",
    path, why)
end

-- Rank 0's list of numbers on every rank (collective; the others pass a
-- list of the same length, whose values are ignored).
local function share(v, what)
  if comm.size() == 1 then return v end
  local all, err = comm.world():bcast(v, 0, what)
  if not all then fail_comm(err) end
  for i, x in ipairs(all) do all[i] = math.tointeger(x) or x end
  return all
end

-- Rank 0's text (a string, or nil) on every rank (collective; the other
-- ranks pass nil): its length, then its bytes six to a number (exact in a
-- double).
local function share_text(text, what)
  if comm.size() == 1 then return text end
  local rank0 = comm.rank() == 0
  local n = share({ rank0 and (text and #text or -1) or 0 }, what)[1]
  if n < 0 then return nil end
  if n == 0 then return "" end
  local words, v = (n + 5) // 6, {}
  if rank0 then
    local padded = text .. string.rep("\0", words * 6 - n)
    for i = 1, words do v[i] = (string.unpack("<I6", padded, 6 * i - 5)) end
  else
    for i = 1, words do v[i] = 0 end
  end
  v = share(v, what)
  if rank0 then return text end
  for i = 1, words do v[i] = string.pack("<I6", v[i]) end
  return table.concat(v):sub(1, n)
end

local function barrier(what)
  if comm.size() == 1 then return end
  local ok, err = comm.barrier(what)
  if not ok then fail_comm(err) end
end

-- What rank 0 reads of dir's markers for clean_stale, on every rank
-- (collective): the step latest names (else `committed`, or nil), and
-- pending's step and rank count (nil when there is no pending).
local function stale_steps(dir, committed)
  local v = { -1, -1, 0 }
  if comm.rank() == 0 then
    local t = read_marker(dir .. "/latest")
    local p = read_marker(dir .. "/pending")
    v[1] = t and t.step or committed or -1
    if p then v[2], v[3] = p.step, p.ranks or 0 end
    v[3] = math.max(v[3], t and t.ranks or 0)
  end
  v = share(v, "checkpoint: the steps of " .. dir .. "/latest and pending")
  return v[1] >= 0 and v[1] or nil, v[2] >= 0 and v[2] or nil, v[3]
end

-- Removes what a killed save left in dir (collective, while no rank
-- saves): committed is the step latest names (or nil), pending pending's
-- step (or nil), ranks the most ranks either marker names. Each rank
-- removes its own rank files being written (*.ckpt.tmp) in both steps and
-- its rank<R>.ckpt in pending's step unless latest names it; rank 0 also
-- latest.tmp, pending.tmp, pending's state.json and the files of ranks
-- beyond this job's (a larger job's killed save); then every rank removes
-- pending's step directory on its host (only when empty: on a shared
-- directory only the last try succeeds), and rank 0 removes pending.
-- Failures to remove are harmless (nothing there).
local function clean_stale(dir, committed, pending, ranks)
  local rank, size = comm.rank(), comm.size()
  local mine = { rank }
  if rank == 0 then
    os.remove(dir .. "/latest.tmp")
    os.remove(dir .. "/pending.tmp")
    for r = size, (ranks or 1) - 1 do mine[#mine + 1] = r end
  end
  for _, step in ipairs({ committed or false, pending or false }) do
    if step then
      local sdir = step_dir(dir, step)
      for _, r in ipairs(mine) do
        os.remove(string.format("%s/rank%d.ckpt.tmp", sdir, r))
        if step ~= committed then os.remove(string.format("%s/rank%d.ckpt", sdir, r)) end
      end
      if rank == 0 then
        os.remove(sdir .. "/state.json.tmp")
        if step ~= committed then os.remove(sdir .. "/state.json") end
      end
    end
  end
  if pending and pending ~= committed then
    barrier("checkpoint: removing what a killed save left in " .. step_dir(dir, pending))
    os.remove(step_dir(dir, pending)) -- only when empty
  end
  -- no rank creates a step directory before every rank has removed its own
  barrier("checkpoint: cleaning " .. dir)
  if rank == 0 then os.remove(dir .. "/pending") end
end

local BY_CODE = { layers = 1, cost = 2 }
local BY_NAME = { "layers", "cost" }

-- The model partition the latest checkpoint in cfg.resume_dir was written
-- with (collective; read by rank 0 and broadcast, so every rank gets the
-- same answer): {by =, bounds = {{first =, last =}, ...}, file =} when
-- step<N>/state.json records one of `stages` stages over `nlayers` layers;
-- else nil and "none" (no checkpoint, or no record: one an older luapipe
-- wrote) or "other" (a record of another stage or layer count: the load
-- itself then names what differs: schedule, ranks, model). A damaged
-- marker or state.json is left for resume to report.
function M.recorded_partition(cfg, stages, nlayers)
  check_cfg("checkpoint.recorded_partition", cfg, "resume_dir")
  util.arg("checkpoint.recorded_partition", 2, "stages", stages, "integer")
  util.arg("checkpoint.recorded_partition", 3, "nlayers", nlayers, "integer")
  local v = { 0, 0, 0 } -- found, by code, step; then the last layer of each stage
  for s = 1, stages do v[3 + s] = 0 end
  if comm.rank() == 0 then
    local t = read_marker(cfg.resume_dir .. "/latest")
    local f = t and io.open(step_dir(cfg.resume_dir, t.step) .. "/state.json", "rb")
    local st = f and json.decode(f:read("a") or "")
    if f then f:close() end
    local p = type(st) == "table" and st.partition
    if p ~= nil and p ~= false then v[1] = 2 end
    if type(p) == "table" and BY_CODE[p.by] and math.tointeger(p.layers) == nlayers
        and type(p.bounds) == "table" and #p.bounds == stages then
      local nn = require("luapipe.nn")
      local b = nn.check_bounds(p.bounds, stages, nlayers)
      if b then
        v[1], v[2], v[3] = 1, BY_CODE[p.by], t.step
        for s = 1, stages do v[3 + s] = b[s].last end
      end
    end
  end
  if comm.size() > 1 then
    local all, err = comm.world()
      :bcast(v, 0, "resume: the partition recorded in " .. cfg.resume_dir)
    if not all then fail_comm(err) end
    v = all
  end
  if v[1] ~= 1 then return nil, v[1] == 2 and "other" or "none" end
  local bounds, first = {}, 1
  for s = 1, stages do
    local last = math.tointeger(v[3 + s])
    bounds[s] = { first = first, last = last }
    first = last + 1
  end
  return { by = BY_NAME[math.tointeger(v[2])], bounds = bounds,
    file = step_dir(cfg.resume_dir, math.tointeger(v[3])) .. "/state.json" }
end

-- The record of a partition that state.json keeps (see recorded_partition).
function M.partition_record(part, nlayers)
  util.arg("checkpoint.partition_record", 1, "part", part, "table", "a model:partition{...} result")
  util.arg("checkpoint.partition_record", 2, "nlayers", nlayers, "integer")
  if type(part.bounds) ~= "table" then
    util.raise("checkpoint.partition_record: part (argument 1) must be a model:partition{...} "
      .. "result, got "
      .. util.shown(part))
  end
  local bounds = {}
  for s, b in ipairs(part.bounds) do bounds[s] = { b.first, b.last } end
  return { by = part.by, layers = nlayers, bounds = bounds }
end

-- Loads the latest checkpoint into exec on every rank (collective); returns
-- the step it holds. Fails with a clear message on every rank when there is
-- none, when the marker is damaged, or when a rank's file is missing,
-- corrupt or does not match.
function M.resume(cfg, exec)
  check_cfg("checkpoint.resume", cfg, "resume_dir")
  util.arg("checkpoint.resume", 2, "exec", exec, "luapipe.Exec")
  local rank = comm.rank()
  local dir = cfg.resume_dir
  local marker = dir .. "/latest"
  -- rank 0 reads latest (only its host need hold it) and tells every rank
  local v, why = { 0, -1, 0 }, nil
  if rank == 0 then
    local t
    t, why = read_marker(marker)
    v[1] = t and t.step or (why and -2 or -1)
    -- the schedule it was written under (rank 0 only: for train's note
    -- when this run's differs; the rank files decide whether it loads)
    cfg.written_under = t and type(t.schedule) == "string" and t.schedule or nil
    if t and cfg.resume_dir == cfg.dir then
      local p = read_marker(dir .. "/pending")
      if p then v[2] = p.step end
      v[3] = math.max(t.ranks or 0, p and p.ranks or 0)
    end
  end
  v = share(v, "resume: reading " .. marker)
  local step = v[1]
  if step == -1 and cfg.auto then
    cfg.fresh = true -- resume = "auto" and no checkpoint yet: a fresh start
    return 0
  elseif step == -1 then
    fail(string.format("luapipe.train: resume = true, but there is no checkpoint in '%s' (%s "
      .. "does not exist)", dir, marker))
  elseif step == -2 then
    fail(damaged(marker, why or "it changed while being read")) -- (rank 0's message is printed)
  end
  if cfg.resume_dir == cfg.dir then
    clean_stale(dir, step, v[2] >= 0 and v[2] or nil, v[3])
    cfg.cleaned = true
  end
  local sdir = step_dir(dir, step)
  -- the grid it was written at (state.json's, when it records one): rank
  -- files hold each rank's share (its ZeRO-1 shard), so another dp or
  -- zero is refused naming both, before any file is read
  if cfg.grid then
    local g = { 0, 0, 0, 0 }
    if rank == 0 then
      local f = io.open(sdir .. "/state.json", "rb")
      local t = f and json.decode(f:read("a") or "")
      if f then f:close() end
      local gr = type(t) == "table" and type(t.grid) == "table" and t.grid
      if gr and math.tointeger(gr.dp) and math.tointeger(gr.zero) then
        g = { 1, gr.dp, gr.zero, math.tointeger(gr.ep) or gr.dp }
      end
    end
    g = share(g, "resume: the grid recorded in " .. sdir .. "/state.json")
    -- (two pp x ep grids without ZeRO: the rank files' own check names
    -- the EP sizes)
    local ep_only = g[2] == g[4] and g[3] == 0 and cfg.grid.dp == cfg.grid.ep and cfg.grid.zero == 0
    if g[1] == 1 and (g[2] ~= cfg.grid.dp or g[3] ~= cfg.grid.zero) and not ep_only then
      fail(string.format("luapipe.train: checkpoint %s was written at dp = %d, zero = %d; "
        .. "this run has dp = %d, zero = %d: each rank's file holds its share of the "
        .. "data-parallel group, so resume with dp = %d, zero = %d (re-sharding is not supported)",
        sdir, math.tointeger(g[2]), math.tointeger(g[3]), cfg.grid.dp, cfg.grid.zero,
        math.tointeger(g[2]), math.tointeger(g[3])))
    end
  end
  local got, err = exec:load_checkpoint(sdir)
  if got and got ~= step then
    got, err = nil,
      string.format("rank %d: checkpoint %s/rank%d.ckpt holds step %d, but %s says %d",
      rank, sdir, rank, got, marker, step)
  end
  if not got and cfg.load_hint then err = tostring(err) .. cfg.load_hint end
  local msg, first = agree(got ~= nil, err, "loading checkpoint " .. sdir)
  if msg then fail("luapipe.train: " .. msg, first) end
  -- the training loop's state beside the rank files (optional): rank 0
  -- reads it and every rank gets its text
  local sfile = sdir .. "/state.json"
  local text
  if rank == 0 then
    local f = io.open(sfile, "rb")
    if f then
      text = f:read("a") or ""
      f:close()
    end
  end
  text = share_text(text, "resume: reading " .. sfile)
  if text then
    local t, _, jerr = json.decode(text)
    if type(t) ~= "table" then
      fail(string.format("luapipe.train: checkpoint %s is damaged: %s", sfile,
        t == nil and "it is not complete JSON (" .. tostring(jerr) .. ")" or "not a JSON object"))
    end
    cfg.state, cfg.state_file = t, sfile
  end
  if cfg.resume_dir == cfg.dir then cfg.saved = step end
  return step
end

-- Saves after step k when k is a multiple of cfg.every, or is cfg.last
-- (the run's last step, set by luapipe.train) (collective).
-- state (optional): a function called on every rank when it saves (it may
-- be collective) giving a JSON-able table, the same on every rank, that
-- rank 0 writes to step<k>/state.json (resume puts it in cfg.state).
-- Returns the checkpoint's directory (<dir>/step<k>) when it saved one.
function M.after_step(cfg, exec, k, info, state)
  if cfg ~= nil then check_cfg("checkpoint.after_step", cfg) end
  util.arg("checkpoint.after_step", 2, "exec", exec, "luapipe.Exec")
  util.arg("checkpoint.after_step", 3, "step", k, "integer")
  util.arg("checkpoint.after_step", 5, "state", state, "?function")
  if not cfg or not cfg.every or (k % cfg.every ~= 0 and k ~= cfg.last) then return end
  if state then state = state() end
  local rank = comm.rank()
  local dir, sdir = cfg.dir, step_dir(cfg.dir, k)
  if not cfg.cleaned then
    -- a save killed in an earlier job: drop its leftovers first
    clean_stale(dir, stale_steps(dir, cfg.saved))
    cfg.cleaned = true
  end
  local ok, err = true, nil
  if rank == 0 then
    ok, err = core.mkdir_p(dir)
    if ok then
      ok, err = core.write_file(dir .. "/pending", string.format('{"step": %d, "ranks": %d}\n', k,
        comm.size()))
    end
    if ok then ok, err = core.mkdir_p(sdir) end
  end
  local msg, first = agree(ok, err, "creating checkpoint directory " .. sdir)
  if msg then fail("luapipe.train: " .. msg, first) end
  -- pending is written: every rank makes the step's directory on its host
  -- (a no-op where rank 0's host, or a shared directory, has it)
  if rank ~= 0 then
    ok, err = core.mkdir_p(sdir)
    if not ok then err = string.format("rank %d: %s", rank, err) end
  end
  if ok then ok, err = exec:save_checkpoint(sdir, k) end
  msg, first = agree(ok, err, "saving checkpoint " .. sdir)
  if msg then fail("luapipe.train: " .. msg, first) end
  if rank == 0 and state and next(state) then
    ok, err = core.write_file(sdir .. "/state.json", json.encode(state) .. "\n")
  end
  msg, first = agree(ok, err, "writing " .. sdir .. "/state.json")
  if msg then fail("luapipe.train: " .. msg, first) end
  if rank == 0 then
    ok, err = core.write_file(dir .. "/latest", string.format(
      '{"step": %d, "dir": "step%d", "ranks": %d, "schedule": %s, "time": %d}\n',
      k, k, comm.size(), json.quote(info and info.name or ""), os.time()))
    if ok then os.remove(dir .. "/pending") end
    if ok and cfg.on_commit then cfg.on_commit(k) end -- (train: where a resume would start)
  end
  msg, first = agree(ok, err, "writing " .. dir .. "/latest")
  if msg then fail("luapipe.train: " .. msg, first) end
  -- the new checkpoint is committed: drop the previous one
  local prev = cfg.saved
  cfg.saved = k
  if prev and prev ~= k then
    local pdir = step_dir(dir, prev)
    os.remove(string.format("%s/rank%d.ckpt", pdir, rank))
    if rank == 0 then os.remove(pdir .. "/state.json") end
    barrier("checkpoint: removing " .. pdir)
    os.remove(pdir) -- on every host, only when empty
  end
  return sdir
end

-- a mistyped name ("luapipe.checkpoint.x") gets a "did you mean"
return require("luapipe.util").guard(M, "luapipe.checkpoint")
