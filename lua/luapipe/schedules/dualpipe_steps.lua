-- luapipe.schedules.dualpipe_steps: the eight steps one DualPipe or
-- DualPipeV rank runs (DeepSeek's dualpipe.py / dualpipev.py; written out in
-- specs/dualpipe.md). Shared by the dualpipe and dualpipev builders.
--
-- steps(p, near, far, H, h, N): p a luapipe.schedules.program for the rank;
-- near/far its two virtual stages (near: the chunk whose route starts in this
-- rank's half); H half the ranks (DualPipe P/2, DualPipeV P); h the rank's
-- distance from the outer edge (DualPipe min(r, P-1-r), DualPipeV r); N the
-- micro-batches per route (DualPipe M/2, DualPipeV M).
return function(p, near, far, H, h, N)
  local middle = h == H - 1 -- the ranks where the two directions meet

  -- 1. fill: forwards of the near chunk
  for _ = 1, 2 * (H - h - 1) do p:F(near) end
  -- 2. forwards of both chunks
  for _ = 1, h + 1 do p:F(near); p:F(far) end
  -- 3. first backwards of the far chunk, weight-grads right after (zero bubble)
  for _ = 1, H - h - 1 do p:I(far); p:W(); p:F(far) end
  -- 4. main step: overlapped forward & backward pairs. On the middle ranks
  --    the first pair runs un-overlapped, F then B, to shorten the bubble.
  for i = 1, N - 2 * H + h + 1 do
    if i == 1 and middle then p:F(near); p:B(far) else p:FB(near, far) end
    p:FB(far, near)
  end
  -- 5. the far chunk's forwards are done: backward, then pair
  for _ = 1, H - h - 1 do p:B(far); p:FB(far, near) end
  -- 6. backwards of both chunks; the last h+1 of these 2(h+1) defer their W
  local n = 0
  for _ = 1, h + 1 do
    for _, c in ipairs { far, near } do
      n = n + 1
      if n > h + 1 then p:I(c) else p:B(c) end
    end
  end
  -- 7. remaining near backwards, each after one deferred W (FIFO)
  for _ = 1, H - h - 1 do p:W(); p:I(near) end
  -- 8. the deferred W's left
  for _ = 1, h + 1 do p:W() end
end
