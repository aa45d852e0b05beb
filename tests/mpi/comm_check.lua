-- comm_check.lua — run under mpirun by test_comm.sh:
--   luapipe tests/mpi/comm_check.lua basic        (any number of ranks >= 2)
--   luapipe tests/mpi/comm_check.lua silent|exit  (watchdog: rank 1 never
--                                                  sends; `exit` leaves early)
--   luapipe tests/mpi/comm_check.lua abort        (the last rank aborts while
--                                                  the others wait)
--   luapipe tests/mpi/comm_check.lua a2a          (all-to-all-v with uneven
--                                                  counts, emulated link)
--   luapipe tests/mpi/comm_check.lua grid         (4 ranks split 2 x 2)
--   luapipe tests/mpi/comm_check.lua a2a_silent   (rank 1 never joins)
--   luapipe tests/mpi/comm_check.lua split_silent (rank 1 never joins)
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
  -- (compared on the host's one monotonic clock, so ranks that started at
  -- different times under load do not matter)
  local t0 = core.now()
  if r == 0 then while core.now() - t0 < 0.5 do end end
  local arrived = core.now()
  ok_or_abort(comm.barrier())
  local left = core.now()
  local late = ok_or_abort(comm.allreduce({ r == 0 and arrived or 0 }))[1]
  check(left >= late, "left the barrier %.3f s before rank 0 arrived", late - left)

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
elseif mode == "a2a" then
  -- rank s sends (3s + 2d) % 5 numbers to rank d (zeros included), valued
  -- s*1000 + d*100 + i; done twice to check nothing is left over
  check(comm.info().progress_thread, "no MPI progress thread")
  local function len(s, d) return (3 * s + 2 * d) % 5 end
  for round = 1, 2 do
    local lists = {}
    for d = 0, n - 1 do
      local l = {}
      for i = 1, len(r, d) do l[i] = r * 1000 + d * 100 + i + round end
      lists[d + 1] = l
    end
    local got = ok_or_abort(comm.alltoallv(lists, "a2a round " .. round))
    check(#got == n, "got %d lists", #got)
    for s = 0, n - 1 do
      local l = got[s + 1]
      check(#l == len(s, r), "from rank %d: %d numbers, want %d", s, #l, len(s, r))
      for i = 1, #l do
        check(l[i] == s * 1000 + r * 100 + i + round, "from rank %d entry %d: %s", s, i, l[i])
      end
    end
  end
  -- all empty
  local empty = {}
  for d = 1, n do empty[d] = {} end
  local got = ok_or_abort(comm.alltoallv(empty))
  for s = 1, n do check(#got[s] == 0, "empty exchange: %d numbers", #got[s]) end
  -- the emulated link: nothing completes before 20 ms after its start
  check(comm.link() == "none", "link %s", comm.link())
  comm.set_link("lat=20ms")
  check(comm.link() == "lat=20ms", "link %s", comm.link())
  ok_or_abort(comm.barrier())
  local ones = {}
  for d = 1, n do ones[d] = { r } end
  local t0 = core.now()
  ok_or_abort(comm.alltoallv(ones)) -- (two exchanges: counts, then data)
  local dt = core.now() - t0
  check(dt >= 0.02, "all-to-all-v on a 20 ms link took %.4f s", dt)
  if r == 0 then -- (the receiver's bound runs from the send's start: below)
    t0 = core.now()
    ok_or_abort(comm.send(1, { 1, 2 }, 4))
    dt = core.now() - t0
    check(dt >= 0.02, "a send on a 20 ms link took %.4f s", dt)
  elseif r == 1 then
    ok_or_abort(comm.recv(0, 2, 4))
  end
  -- the delay runs from the sender's start, not the receive's posting:
  -- rank 1 posts its receive, rank 0 sends 0.2 s later on a 300 ms link,
  -- so the data cannot be there before the send's start + 0.3 s (compared
  -- on the host's one monotonic clock, so barrier skew under load does not
  -- matter)
  comm.set_link("lat=300ms")
  ok_or_abort(comm.barrier())
  local sent, received = 0, 0
  if r == 0 then
    local t1 = core.now()
    while core.now() - t1 < 0.2 do end
    sent = core.now()
    ok_or_abort(comm.send(1, { 5 }, 6))
  elseif r == 1 then
    ok_or_abort(comm.recv(0, 1, 6))
    received = core.now()
  end
  comm.set_link("none")
  local start = ok_or_abort(comm.allreduce({ sent }))[1]
  if r == 1 then
    check(received - start >= 0.3, "late sender on a 300 ms link: received %.4f s after "
      .. "the send began", received - start)
  end
  local ok, err = pcall(comm.set_link, "lat=20")
  check(not ok and err:find("lat=20 needs a unit %(us, ms or s%)"), "bad link: %s", tostring(err))
  ok_or_abort(comm.barrier())
  print(string.format("rank %d: ok", r))
elseif mode == "grid" then
  -- 4 ranks as pp = 2 stages x ep = 2: world rank = stage * 2 + e
  check(n == 4, "grid needs 4 ranks, got %d", n)
  local stage, e = r // 2, r % 2
  local ep = ok_or_abort(comm.split(stage))
  local pp = ok_or_abort(comm.split(e))
  check(ep:size() == 2 and ep:rank() == e, "ep group: rank %d of %d", ep:rank(), ep:size())
  check(pp:size() == 2 and pp:rank() == stage, "pp group: rank %d of %d", pp:rank(), pp:size())
  local s = ok_or_abort(ep:allreduce({ r }))
  check(s[1] == 4 * stage + 1, "ep all-reduce: %s", s[1])
  s = ok_or_abort(pp:allreduce({ r }))
  check(s[1] == 2 * e + 2, "pp all-reduce: %s", s[1])
  ok_or_abort(ep:barrier())
  ok_or_abort(pp:barrier())
  local b = ok_or_abort(ep:bcast({ r, r + 0.5 }, 1))
  check(b[1] == stage * 2 + 1 and b[2] == stage * 2 + 1.5, "ep bcast: %s %s", b[1], b[2])
  b = ok_or_abort(pp:bcast({ r }, 0))
  check(b[1] == e, "pp bcast: %s", b[1])
  -- all-to-all-v inside each EP group: uneven, one side empty
  local to_other = {}
  for i = 1, e + 2 do to_other[i] = r * 10 + i end
  local lists = { {}, {} }
  lists[1 - e + 1] = to_other
  lists[e + 1] = { r }
  local got = ok_or_abort(ep:alltoallv(lists, "dispatch"))
  local peer_e = 1 - e
  check(#got[peer_e + 1] == peer_e + 2, "ep a2a: %d numbers from the peer", #got[peer_e + 1])
  for i = 1, peer_e + 2 do
    check(got[peer_e + 1][i] == (stage * 2 + peer_e) * 10 + i, "ep a2a entry %d", i)
  end
  check(#got[e + 1] == 1 and got[e + 1][1] == r, "ep a2a self piece")
  -- keys order the new ranks; split groups inherit the link
  comm.set_link("lat=1ms")
  local rev = ok_or_abort(comm.split(0, -r))
  check(rev:rank() == n - 1 - r, "reversed split: rank %d", rev:rank())
  check(rev:link() == "lat=1ms", "split link: %s", rev:link())
  rev:close()
  rev:close() -- idempotent
  check(not pcall(rev.rank, rev), "closed comm usable")
  ep:close()
  pp:close()
  ok_or_abort(comm.barrier())
  print(string.format("rank %d: ok", r))
elseif mode == "split_silent" then
  if r == 1 then return end -- never joins
  local v, err = comm.split(0)
  if v == nil then comm.abort(err) end
  print("rank 0: unexpected split")
elseif mode == "a2a_silent" then
  if r == 1 then return end -- never joins
  local lists = {}
  for d = 1, n do lists[d] = { d } end
  local t0 = core.now()
  local v, err = comm.alltoallv(lists, "dispatch of layer 3 (5F2)")
  io.stderr:write(string.format("rank %d: alltoallv returned after %.1f s\n", r, core.now() - t0))
  if v == nil then comm.abort(err) end
  print("rank 0: unexpected exchange")
else
  error("unknown mode " .. mode)
end
