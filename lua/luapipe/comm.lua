-- luapipe.comm: the process's communicator. Under mpirun every process is
-- one rank of the MPI world; a plain `luapipe script.lua` is rank 0 of 1
-- (backend "self").
--
--   local comm = require("luapipe.comm")
--   local right = (comm.rank() + 1) % comm.size()
--   assert(comm.send(right, {1, 2, 3}, 7))
--   local xs, err = comm.recv(left, 3, 7, "ring step 1")
--   if not xs then error(err, 0) end
--
-- Every wait is bounded by LUAPIPE_TIMEOUT seconds (default 300): a peer
-- that never answers makes the call return nil, message (naming this rank,
-- the peer, the tag and the description). Runtime failures return nil,
-- message; misuse (a peer out of range, sending to oneself, a bad tag)
-- raises an error. The library never ends the process: what a failed
-- script does to the job is the program's (luapipe.cli.job), which may
-- call abort.
local core = require("luapipe.core")
local util = require("luapipe.util")

local M = {}

local info -- core.comm(), read once: rank and size never change

local function get()
  if not info then info = core.comm() end
  return info
end

-- This process's rank, 0-based.
function M.rank() return get().rank end

-- Number of ranks in the job.
function M.size() return get().size end

-- "mpi" or "self".
function M.backend() return get().backend end

-- {rank=, size=, backend=, timeout=, tag_ub=, progress_thread=} (a copy;
-- progress_thread: MPI progresses in a thread while the rank computes).
function M.info()
  local t = {}
  for k, v in pairs(get()) do t[k] = v end
  return t
end

-- The functions below are the C binding itself, so errors point at the
-- caller's line.

-- barrier([what]): waits until every rank has called it. true | nil, err
M.barrier = core.comm_barrier

-- allreduce(list [, what]): element-wise sum of `list` over all ranks (in
-- doubles); every rank passes a list of the same length. list | nil, err
M.allreduce = core.comm_allreduce_sum

-- send(peer, list [, tag [, what]]): sends the numbers of `list` (as
-- floats) to rank `peer` with `tag` (default 0); returns once the peer has
-- them or they are buffered. true | nil, err
M.send = core.comm_send

-- recv(peer, n [, tag [, what]]): receives exactly n numbers from rank
-- `peer` with `tag` (default 0); `what` describes the wait for the watchdog
-- message ("action 14 (5B3) waits for RECV_B from rank 3"). list | nil, err
M.recv = core.comm_recv

-- world(): the process's communicator as a luapipe.Comm object, with
-- methods rank(), size(), split(color [, key]), barrier([what]),
-- allreduce(list [, what]), bcast(list, root [, what]) (root's list to
-- every rank; all pass lists of one length), alltoallv(lists [, what]),
-- set_link(text),
-- link() and close() (a no-op for the world).
function M.world()
  if not M._world then M._world = core.comm_world() end
  return M._world
end

-- split(color [, key]): collective over the world (like MPI_Comm_split):
-- the ranks passing the same color (>= 0) form a new luapipe.Comm ordered
-- by key (default: world rank). Inherits the timeout and emulated link.
-- Comm | nil, err. E.g. a pp x ep grid: world rank r = stage * ep + e,
--   local ep_group = comm.split(r // ep)   -- the EP ranks of one stage
--   local pp_group = comm.split(r % ep)    -- one EP index across stages
function M.split(color, key)
  util.arg("comm.split", 1, "color", color, "integer")
  util.arg("comm.split", 2, "key", key, "?integer")
  return M.world():split(color, key)
end

-- alltoallv(lists [, what]): lists[p + 1] goes to rank p (size() lists of
-- numbers, any may be empty); returns the size() lists received, entry
-- p + 1 from rank p (as floats). lists | nil, err
function M.alltoallv(lists, what)
  util.arg("comm.alltoallv", 1, "lists", lists, "table", "a list of one list of numbers per rank")
  util.arg("comm.alltoallv", 2, "what", what, "?string", "a description for messages")
  if #lists ~= M.size() then
    util.raise(string.format("comm.alltoallv: lists (argument 1) must hold one list per rank (%d), got %d",
      M.size(), #lists))
  end
  return M.world():alltoallv(lists, what)
end

-- set_link(text): emulated link of the world ("lat=50us,bw=2GB/s", "none";
-- LUAPIPE_LINK sets it at start-up). link() gives it back as text.
function M.set_link(text)
  util.arg("comm.set_link", 1, "text", text, "string", "a link such as \"lat=50us,bw=2GB/s\" or \"none\"")
  local l, err = core.link_parse(text)
  if not l then error(err, 2) end -- raised at the caller's line
  return M.world():set_link(text)
end
function M.link() return M.world():link() end

-- parse_link(text): {latency=seconds, bandwidth=bytes/s (0: unlimited),
-- text=canonical} | nil, err -- the one parser the comm layer and the
-- simulator's --link share.
M.parse_link = core.link_parse

-- abort([msg]): prints "luapipe: rank R: <msg>" and ends every rank (exit
-- code 1). Does not return. For programs (the job policy, a script's own
-- decision); the library raises errors instead.
M.abort = core.comm_abort

-- a mistyped name ("luapipe.comm.x") gets a "did you mean"
return require("luapipe.util").guard(M, "luapipe.comm")
