-- train_pcall.lua MODE — luapipe.train's failures as values under mpirun
-- (run by test_train_pcall.sh): the library never ends the process, so a
-- script's pcall returns on every rank. Each rank prints one line
-- "rank R: <fields>" for what it caught. MODE:
--   options     a mistake in the options on every rank
--   one_rank    a mistake in the options on rank 1 only (found before any
--               collective: partition = "layers")
--   resume      resume = true with no checkpoint in the directory
--   stranded    the data function fails on rank 1 in step 2: rank 1's error
--               says the others are left waiting; it is raised again, and
--               the job policy takes the job down
--   uncaught    options error not caught: the program's policy prints it
--               once and every rank exits 2
local comm = luapipe.comm
local nn = luapipe.nn
local mode = ...
local rank = comm.rank()

local function opts(over)
  local o = { model = nn.sequential { nn.linear(4, 4), nn.linear(4, 4), nn.linear(4, 4) }, schedule = "1f1b",
    microbatches = 2, steps = 2, quiet = true,
    data = function(step, mb)
      if mode == "stranded" and step == 2 and rank == 1 then error("no data for step 2", 0) end
      local x = {}
      for i = 1, 8 do x[i] = (i + mb) / 10 end
      return nn.tensor({ 2, 4 }, x), nn.tensor({ 2, 4 }, x)
    end }
  for k, v in pairs(over or {}) do o[k] = v end
  return o
end

local function show(ok, e)
  if ok then
    print(string.format("rank %d: returned a result", rank))
    return
  end
  print(string.format("rank %d: caught everywhere=%s stranded=%s status=%s speaker=%s option=%s text=%s",
    rank, tostring(e.everywhere), tostring(e.stranded), tostring(e.status), tostring(e.speaker),
    tostring(e.option), tostring(e)))
end

if mode == "options" then
  show(pcall(luapipe.train, opts { steps = "ten" }))
elseif mode == "one_rank" then
  -- (partition by layers: a cost partition measures collectively, and a
  -- rank whose options fail before it would not join that collective)
  show(pcall(luapipe.train, opts { steps = rank == 1 and "ten" or 2, partition = "layers" }))
elseif mode == "resume" then
  show(pcall(luapipe.train, opts { checkpoint = { dir = arg[2] }, resume = true }))
elseif mode == "stranded" then
  local ok, e = pcall(luapipe.train, opts())
  show(ok, e)
  if not ok then error(e, 0) end
elseif mode == "uncaught" then
  luapipe.train(opts { steps = "ten" })
end
-- every rank is here after its pcall: the job goes on (a collective works)
print(string.format("rank %d: after: %s", rank, tostring(comm.barrier("after the failed train"))))
