-- train_watchdog.lua MODE — run under mpirun by test_train_watchdog.sh.
-- Trains a small MLP with 1f1b; in step 2 the last rank stops: MODE "hang"
-- makes its data function sleep (a stuck rank), MODE "kill" makes it kill
-- itself with SIGKILL (a dead rank). The other ranks must not hang.
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local comm = require("luapipe.comm")

local mode = arg[1]
local last = comm.size() - 1

local model = nn.sequential { nn.linear(4, 8), nn.gelu(), nn.linear(8, 8), nn.linear(8, 2) }

local function data(step, mb)
  if step == 2 and comm.rank() == last then
    io.stderr:write(string.format("rank %d: stops in step 2 (%s)\n", comm.rank(), mode))
    io.stderr:flush()
    if mode == "kill" then
      local f = assert(io.open("/proc/self/stat"))
      local pid = f:read("n")
      f:close()
      os.execute("kill -9 " .. pid)
    end
    -- stuck: spin (no child process that could outlive the job)
    local t = os.time() + 60
    while os.time() < t do end
  end
  local x, y = {}, {}
  for i = 1, 8 do x[i] = math.sin(step + mb + i) end
  for i = 1, 4 do y[i] = math.cos(step + mb + i) end
  return nn.tensor({ 2, 4 }, x), nn.tensor({ 2, 2 }, y)
end

train { model = model, schedule = "1f1b", microbatches = 4, data = data, steps = 3 }
print(string.format("rank %d: finished (should not happen)", comm.rank()))
