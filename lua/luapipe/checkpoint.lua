-- luapipe.checkpoint: the checkpoints of luapipe.train (checkpoint = {dir =,
-- every =}, resume = true). Layout of dir:
--
--   <dir>/step<N>/rank<R>.ckpt   one file per rank: its virtual stages'
--                                parameters and optimizer state after step
--                                N (C format, see core/exec/lp_exec.h)
--   <dir>/latest                 {"step": N, "dir": "step<N>", ...}: the
--                                newest complete checkpoint
--
-- Saving after step N: rank 0 creates <dir>/step<N>; every rank writes its
-- file (rank<R>.ckpt.tmp, fsync, rename); once every rank has finished,
-- rank 0 replaces <dir>/latest (also write-then-rename), and only then the
-- files of the previous checkpoint are removed. A job that dies at any
-- point leaves `latest` naming a complete checkpoint. Every step between is
-- collective (all ranks call it after the same step), so a failure on one
-- rank is reported on every rank. All ranks must see the same file system
-- (one host, or a shared directory), as for traces.
local core = require("luapipe.core")
local comm = require("luapipe.comm")

local M = {}

local function fail(msg) error(msg, 0) end

local function step_dir(dir, step) return string.format("%s/step%d", dir, step) end

-- Every rank passes whether its part worked; returns nil when all did,
-- else this rank's message (its own error, or which ranks failed).
local function agree(ok, err, what)
  local size = comm.size()
  if size == 1 then return (not ok) and (err or what .. " failed") or nil end
  local v = {}
  for r = 1, size do v[r] = 0 end
  if not ok then v[comm.rank() + 1] = 1 end
  local all, cerr = comm.allreduce(v, what)
  if not all then comm.abort(cerr) end
  if not ok then return err or (what .. " failed") end
  local bad = {}
  for r = 1, size do
    if all[r] ~= 0 then bad[#bad + 1] = tostring(r - 1) end
  end
  if #bad == 0 then return nil end
  return string.format("%s failed on rank%s %s (see %s message)", what, #bad > 1 and "s" or "",
    table.concat(bad, ", "), #bad > 1 and "their" or "its")
end

-- Checks the options; nil when neither checkpoint nor resume is given, else
-- {dir =, every =, resume =}. Raises on misuse (the same on every rank).
function M.options(opts)
  local ck, resume = opts.checkpoint, opts.resume
  if ck == nil and not resume then return nil end
  local cfg = { every = nil, resume = false }
  if ck ~= nil then
    if type(ck) ~= "table" or type(ck.dir) ~= "string" or ck.dir == "" then
      error("luapipe.train: 'checkpoint' must be {dir = \"path\", every = N}", 3)
    end
    local every = ck.every or 1
    if math.type(every) ~= "integer" or every < 1 then
      error("luapipe.train: checkpoint.every must be a positive integer", 3)
    end
    cfg.dir, cfg.every = ck.dir, every
  end
  if resume then
    if type(resume) == "string" then
      cfg.resume_dir = resume
    elseif resume == true then
      if not cfg.dir then
        error("luapipe.train: resume = true needs checkpoint = {dir = \"path\"} (or resume = \"path\")", 3)
      end
      cfg.resume_dir = cfg.dir
    else
      error("luapipe.train: 'resume' must be true or a checkpoint directory", 3)
    end
    cfg.resume = true
  end
  return cfg
end

-- Loads the latest checkpoint into exec on every rank (collective); returns
-- the step it holds. Fails with a clear message on every rank when there is
-- none, or when a rank's file is missing, corrupt or does not match.
function M.resume(cfg, exec)
  local rank, size = comm.rank(), comm.size()
  local dir = cfg.resume_dir
  local marker = dir .. "/latest"
  local step = 0
  if rank == 0 then
    local f = io.open(marker, "r")
    if not f then
      step = -1
    else
      local text = f:read("a") or ""
      f:close()
      step = tonumber(text:match('"step"%s*:%s*(%d+)')) or -2
    end
  end
  if size > 1 then
    local all, err = comm.allreduce({ step }, "resume: reading " .. marker)
    if not all then comm.abort(err) end
    step = math.tointeger(all[1])
  end
  if step == -1 then
    fail(string.format("luapipe.train: resume = true, but there is no checkpoint in '%s' (%s "
      .. "does not exist)", dir, marker))
  elseif step == -2 then
    fail(string.format("luapipe.train: %s is not a luapipe checkpoint marker (no \"step\")", marker))
  end
  local sdir = step_dir(dir, step)
  local got, err = exec:load_checkpoint(sdir)
  if got and got ~= step then
    got, err = nil, string.format("rank %d: checkpoint %s/rank%d.ckpt holds step %d, but %s says %d",
      rank, sdir, rank, got, marker, step)
  end
  local msg = agree(got ~= nil, err, "loading checkpoint " .. sdir)
  if msg then fail("luapipe.train: " .. msg) end
  if cfg.resume_dir == cfg.dir then cfg.saved = step end
  return step
end

-- Saves after step k when k is a multiple of cfg.every (collective).
function M.after_step(cfg, exec, k, info)
  if not cfg or not cfg.every or k % cfg.every ~= 0 then return end
  local rank = comm.rank()
  local dir, sdir = cfg.dir, step_dir(cfg.dir, k)
  local ok, err = true, nil
  if rank == 0 then ok, err = core.mkdir_p(sdir) end
  local msg = agree(ok, err, "creating checkpoint directory " .. sdir)
  if msg then fail("luapipe.train: " .. msg) end
  ok, err = exec:save_checkpoint(sdir, k)
  msg = agree(ok, err, "saving checkpoint " .. sdir)
  if msg then fail("luapipe.train: " .. msg) end
  if rank == 0 then
    ok, err = core.write_file(dir .. "/latest", string.format(
      '{"step": %d, "dir": "step%d", "ranks": %d, "schedule": %q, "time": %d}\n',
      k, k, comm.size(), info and info.name or "", os.time()))
  end
  msg = agree(ok, err, "writing " .. dir .. "/latest")
  if msg then fail("luapipe.train: " .. msg) end
  -- the new checkpoint is committed: drop the previous one
  local prev = cfg.saved
  cfg.saved = k
  if prev and prev ~= k then
    local pdir = step_dir(dir, prev)
    os.remove(string.format("%s/rank%d.ckpt", pdir, rank))
    if comm.size() > 1 then
      local bok, berr = comm.barrier("checkpoint: removing " .. pdir)
      if not bok then comm.abort(berr) end
    end
    if rank == 0 then os.remove(pdir) end -- only when empty
  end
end

return M
