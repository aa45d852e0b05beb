-- luapipe.comm: the process's communicator. Under mpirun every process is
-- one rank of the MPI world; a plain `luapipe script.lua` is rank 0 of 1
-- (backend "self").
--
--   local comm = require("luapipe.comm")
--   local right = (comm.rank() + 1) % comm.size()
--   assert(comm.send(right, {1, 2, 3}, 7))
--   local xs, err = comm.recv(left, 3, 7, "ring step 1")
--   if not xs then comm.abort(err) end
--
-- Every wait is bounded by LUAPIPE_TIMEOUT seconds (default 300): a peer
-- that never answers makes the call return nil, message (naming this rank,
-- the peer, the tag and the description); comm.abort(message) then takes
-- every rank down. Runtime failures return nil, message; misuse (a peer
-- out of range, sending to oneself, a bad tag) raises an error.
local core = require("luapipe.core")

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

-- {rank=, size=, backend=, timeout=, tag_ub=} (a copy).
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

-- abort([msg]): prints "luapipe: rank R: <msg>" and ends every rank (exit
-- code 1). Does not return.
M.abort = core.comm_abort

return M
