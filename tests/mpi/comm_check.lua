-- comm_check.lua — run under mpirun by test_comm.sh:
--   luapipe tests/mpi/comm_check.lua basic        (any number of ranks >= 2)
--   luapipe tests/mpi/comm_check.lua silent|exit  (watchdog: rank 1 never
--                                                  sends; `exit` leaves early)
--   luapipe tests/mpi/comm_check.lua abort        (the last rank aborts while
--                                                  the others wait)
-- Prints "rank R: ok" per rank when the basic checks pass.
local comm = require("luapipe.comm")
local core = require("luapipe.core")

local mode = arg[1] or "basic"
local r, n = comm.rank(), comm.size()

local function check(cond, fmt, ...)
  if not cond then comm.abort(string.format("check failed: " .. fmt, ...)) end
end

local function ok_or_abort(v, err)
  if v == nil then comm.abort(err) end
  return v
end

if mode == "basic" then
  check(comm.backend() == "mpi", "backend %s", comm.backend())
  check(n >= 2, "needs 2 ranks or more, got %d", n)
  local right, left = (r + 1) % n, (r - 1) % n

  -- ring, small and large (rendezvous) messages; even ranks send first
  for _, len in ipairs({ 5, 100000 }) do
    local out = {}
    for i = 1, len do out[i] = r * 1000 + (i % 997) end
    local got
    local what = string.format("ring of %d from rank %d", len, left)
    if r % 2 == 0 then
      ok_or_abort(comm.send(right, out, 11))
      got = ok_or_abort(comm.recv(left, len, 11, what))
    else
      got = ok_or_abort(comm.recv(left, len, 11, what))
      ok_or_abort(comm.send(right, out, 11))
    end
    check(#got == len, "ring: got %d numbers", #got)
    for i = 1, len do
      check(got[i] == left * 1000 + (i % 997), "ring %d: entry %d is %s", len, i, got[i])
    end
  end

  -- tags keep messages apart: send tag 2 then tag 1, receive 1 then 2
  if r == 0 then
    ok_or_abort(comm.send(1, { 2 }, 2))
    ok_or_abort(comm.send(1, { 1 }, 1))
  elseif r == 1 then
    check(ok_or_abort(comm.recv(0, 1, 1))[1] == 1, "tag 1")
    check(ok_or_abort(comm.recv(0, 1, 2))[1] == 2, "tag 2")
  end

  -- all-reduce against the closed forms
  local k = n
  local s = ok_or_abort(comm.allreduce({ r + 1, (r + 1) ^ 2, 0.5 * r, 1 }))
  check(s[1] == k * (k + 1) / 2, "sum of ranks+1: %s", s[1])
  check(s[2] == k * (k + 1) * (2 * k + 1) / 6, "sum of squares: %s", s[2])
  check(s[3] == 0.5 * k * (k - 1) / 2, "half ranks: %s", s[3])
  check(s[4] == k, "count: %s", s[4])

  -- barrier: rank 0 arrives 0.5 s late; nobody leaves before it arrives
  local t0 = core.now()
  if r == 0 then while core.now() - t0 < 0.5 do end end
  ok_or_abort(comm.barrier())
  check(core.now() - t0 >= 0.45, "left the barrier after %.3f s", core.now() - t0)

  -- a message of the wrong length is an error, not a hang
  if r == 0 then
    ok_or_abort(comm.send(1, { 1, 2, 3 }, 5))
  elseif r == 1 then
    local v, err = comm.recv(0, 4, 5, "short message")
    check(v == nil and err:find("rank 0 sent 3 floats %(tag 5%) but rank 1 expected 4"),
      "short message: %s", tostring(err))
  end

  -- misuse raises
  local ok, err = pcall(comm.send, r, { 1 }, 0)
  check(not ok and err:find("cannot send to itself"), "self send: %s", tostring(err))
  ok, err = pcall(comm.recv, n, 1, 0)
  check(not ok and err:find("out of range"), "bad peer: %s", tostring(err))

  ok_or_abort(comm.barrier())
  print(string.format("rank %d: ok", r))
elseif mode == "silent" or mode == "exit" then
  if r == 1 then
    if mode == "exit" then os.exit(0) end
    return -- never sends
  end
  if r == 0 then
    local t0 = core.now()
    local v, err = comm.recv(1, 4, 7, "action 14 (5B3) waits for RECV_B from rank 1")
    io.stderr:write(string.format("rank 0: recv returned after %.1f s\n", core.now() - t0))
    if v == nil then comm.abort(err) end
    print("rank 0: unexpected message")
  end
elseif mode == "abort" then
  -- the last rank gives up at once; the others wait (default timeout) for a
  -- message that never comes and must be taken down by the abort
  if r == n - 1 then comm.abort("giving up on purpose") end
  local v, err = comm.recv(n - 1, 1, 3, "a message that never comes")
  print(string.format("rank %d: recv returned %s", r, tostring(v or err)))
else
  error("unknown mode " .. mode)
end
