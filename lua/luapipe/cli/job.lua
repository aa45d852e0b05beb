-- luapipe.cli.job: the job policy, in one place. The library never ends the
-- process: it raises a luapipe.Error (luapipe.util) whose fields say who
-- knows of the failure; the program (the luapipe host, when a script, -e
-- code or a subcommand ends with an error) calls job.failed(err) and ends
-- as it says:
--
--   one process         "luapipe: <err>" on stderr, exit status 1
--   err.stranded        other ranks may be waiting on this one: every rank
--                       of the job is taken down ("luapipe: rank R: <err>",
--                       mpirun's status 1); does not return
--   err.everywhere      every rank raised it alike: rank err.speaker
--                       (default 0) prints it once, every rank waits for
--                       the others and ends with err.status (default 1)
--   anything else       printed by this rank, status 1
--
-- A script that wants to go on after a failure catches it with pcall
-- (every rank gets the error) and never reaches the policy.
local M = {}

-- job.failed(err) -> the exit status the program ends with, after printing
-- err as above (a luapipe.Error, or any error value).
function M.failed(err)
  local comm = require("luapipe.comm")
  local util = require("luapipe.util")
  local fields = util.is_error(err) and err or {}
  local okt, text = pcall(tostring, err)
  if not okt then text = "(error object is not printable)" end
  local size = comm.size()
  if size > 1 and fields.stranded then comm.abort(text) end
  if size > 1 and fields.everywhere then
    if comm.rank() == (fields.speaker or 0) then
      io.stderr:write("luapipe: ", text, "\n")
      io.stderr:flush()
    end
    comm.barrier("every rank stops on an error every rank found")
    return fields.status or 1
  end
  io.stderr:write("luapipe: ", text, "\n")
  io.stderr:flush()
  return 1
end

-- job.usage_exit(prog[, msg]): a script's own usage error, found alike on
-- every rank (a bad command-line option). Rank 0 writes "<prog>: <msg>"
-- (none when msg is nil: cli.parse printed it already); every rank waits
-- for the others (so that rank 0's line is out before mpirun takes the job
-- down) and exits with status 2. Does not return.
function M.usage_exit(prog, msg)
  local comm = require("luapipe.comm")
  if msg and comm.rank() == 0 then
    io.stderr:write(prog, ": ", msg, "\n")
    io.stderr:flush()
  end
  if comm.size() > 1 then comm.barrier(prog .. ": every rank stops on a usage error") end
  os.exit(2)
end

return M
