-- luapipe.show: pictures of a simulated timeline.
--
--   local show = require("luapipe.show")
--   print(show.gantt(res))        -- terminal Gantt chart, one row per rank
--   local svg = show.svg(res)     -- standalone SVG, one lane per rank
--   s:show()                      -- a schedule's Gantt under the default cost
--   res:write_svg("t.svg")        -- atomically
--
-- The Gantt chart draws time left to right, one column per time unit (or
-- more, or less, so that the chart fits `width` columns). Cells carry the
-- micro-batch number (a-z for 10-35 where a cell is one column wide): F as digits ("3"), B, I and W with their letter
-- ("B3", "I3", "W3"), an overlapped F&B pair as "3&5" (forward of mb 3
-- with backward of mb 5); "." is idle. On a colour terminal cells are also
-- coloured by type, pairs split in the F and B colours (show.use_color
-- decides: the output must end at a terminal; NO_COLOR, TERM=dumb and
-- --color=never turn colour off).
local core = require("luapipe.core")

local M = {}
package.loaded["luapipe.show"] = M -- luapipe.sim requires us back

local Schedule, SimResult = core.Schedule, core.SimResult

-- ---- colour ----

local RESET = "\27[0m"
local ansi = {
  F = "\27[30;46m",           -- black on cyan
  B = "\27[30;42m",           -- black on green
  I = "\27[30;43m",           -- black on yellow
  W = "\27[30;45m",           -- black on magenta
  FBf = "\27[1;4;30;106m",    -- pair, forward half: bold underlined, bright cyan
  FBb = "\27[1;4;30;102m",    -- pair, backward half: bold underlined, bright green
  FBi = "\27[1;4;30;103m",    -- pair whose backward half is an I
  idle = "\27[2m",            -- dim
}

-- show.use_color([fd]) -> boolean: the one colour decision of luapipe.
-- LUAPIPE_COLOR (set by `luapipe --color=WHEN`) "always" or "never" decides;
-- otherwise colour is on when NO_COLOR is unset or empty, TERM is set and
-- not "dumb", and output on fd (default 1) ends at a terminal: under
-- mpirun, mpirun's own output (core.output_is_terminal, from the program).
function M.use_color(fd)
  local when = os.getenv("LUAPIPE_COLOR")
  if when == "always" then return true elseif when == "never" then return false end
  local nc = os.getenv("NO_COLOR")
  if nc and nc ~= "" then return false end
  local term = os.getenv("TERM")
  if not term or term == "" or term == "dumb" then return false end
  return (core.output_is_terminal or core.isatty)(fd or 1)
end

-- ---- the Gantt chart ----

-- A micro-batch number in at most w columns: the number when it fits,
-- otherwise one symbol: 0-9, then a-z for 10-35 (lower case, so it never
-- reads as the B/I/W letters), "+" beyond.
local function mb_text(n, w)
  local s = tostring(n)
  if #s <= w then return s end
  if n < 10 then return s end
  if n < 36 then return string.char(87 + n) end -- 10 -> "a"
  return "+"
end
M.mb_text = mb_text

-- The text of an event's cell, fitted into w columns.
local function cell_label(e, w)
  if w <= 0 then return "" end
  local label
  if e.type == "F" then
    label = mb_text(e.mb, w)
  elseif e.type == "FB" then
    local bmark = e.btype == "I" and "I" or ""
    label = e.mb .. "&" .. bmark .. e.bmb
    if #label > w then label = mb_text(e.mb, 1) .. "&" .. bmark .. mb_text(e.bmb, 1) end
    if #label > w then label = mb_text(e.mb, 1) .. "&" .. mb_text(e.bmb, 1) end
    if #label > w then label = ("&" .. mb_text(e.bmb, 1)):sub(1, w) end
  else
    label = e.type .. e.mb
    if #label > w then label = w >= 2 and (e.type .. mb_text(e.mb, 1)) or e.type end
  end
  return label .. string.rep(" ", w - #label)
end

local function tick_step(scale, min_cols)
  for _, step in ipairs { 1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000 } do
    if step * scale >= min_cols then return step end
  end
  return 10 ^ math.ceil(math.log(min_cols / scale, 10))
end

local function fmt_num(x)
  if x == math.floor(x) and math.abs(x) < 1e15 then return string.format("%d", x) end
  return (string.format("%.2f", x):gsub("0+$", ""):gsub("%.$", ""))
end

-- Renders one row (array of chars + array of styles) with or without colour.
local function render(chars, styles, color)
  if not color then return table.concat(chars) end
  local out, cur = {}, nil
  for i = 1, #chars do
    local st = styles[i] or "idle"
    if st ~= cur then
      if cur then out[#out + 1] = RESET end
      out[#out + 1] = ansi[st] or ""
      cur = st
    end
    out[#out + 1] = chars[i]
  end
  if cur then out[#out + 1] = RESET end
  return table.concat(out)
end

local function legend_lines(color, width, scale)
  local function sample(text, st)
    if not color then return text end
    return (ansi[st] or "") .. text .. RESET
  end
  local unit = scale >= 1 and string.format("1 unit = %s col%s", fmt_num(scale), scale == 1 and "" or "s")
    or string.format("1 col = %s units", fmt_num(1 / scale))
  local items = {
    sample("3", "F") .. "=F of mb 3",
    sample("B3", "B") .. "/" .. sample("I3", "I") .. "/" .. sample("W3", "W") .. "=B/I/W",
    sample("3", "FBf") .. sample("&5", "FBb") .. "=F3 overlapped with B5",
    sample(".", "idle") .. "=idle",
    "a-z=mb 10-35 in narrow cells",
    unit,
  }
  -- plain lengths decide the wrapping
  local plain = { "3=F of mb 3", "B3/I3/W3=B/I/W", "3&5=F3 overlapped with B5", ".=idle",
    "a-z=mb 10-35 in narrow cells", unit }
  local lines, cur, curlen = {}, "legend: ", 8
  for i, it in ipairs(items) do
    local add = (curlen > 8 and 2 or 0) + #plain[i]
    if curlen + add > width and curlen > 8 then
      lines[#lines + 1] = cur
      cur, curlen = "        " .. it, 8 + #plain[i]
    else
      cur = cur .. (curlen > 8 and "  " or "") .. it
      curlen = curlen + add
    end
  end
  lines[#lines + 1] = cur
  return lines
end

-- show.gantt(res[, opts]) -> text. opts: width (columns, default 80),
-- color (true/false; default: show.use_color()), scale (columns per time
-- unit; default: the largest whole number that fits, or a fraction),
-- legend (default true), axis (default true).
function M.gantt(res, opts)
  opts = opts or {}
  local info = res:info()
  local P = info.ranks
  local width = opts.width or 80
  local color = opts.color
  if color == nil then color = M.use_color(1) end
  local T = res:makespan()
  local lw = #("r" .. (P - 1))
  local avail = math.max(10, width - (lw + 2) - 1)
  local scale = opts.scale
  if not scale then
    if T <= 0 then
      scale = 1
    else
      scale = avail / T
      if scale >= 1 then scale = math.min(4, math.floor(scale)) end
    end
  end
  local ncols = math.max(1, math.ceil(T * scale - 1e-9))
  local function col(t) return math.floor(t * scale + 0.5) end

  local lines = {}
  for r = 0, P - 1 do
    local chars, styles = {}, {}
    for i = 1, ncols do chars[i] = "." end
    for _, e in ipairs(res:events(r)) do
      local c0, c1 = col(e.start), col(e.finish)
      if c1 <= c0 and e.finish > e.start then c1 = c0 + 1 end
      if c1 > ncols then c1 = ncols end
      local w = c1 - c0
      if w > 0 then
        local text = cell_label(e, w)
        -- a pair is coloured F up to its "&", B from there on
        local amp = e.type == "FB" and (text:find("&", 1, true) or (w // 2 + 1)) or 0
        local bstyle = e.btype == "I" and "FBi" or "FBb"
        for k = 1, w do
          chars[c0 + k] = text:sub(k, k)
          if e.type == "FB" then
            styles[c0 + k] = k < amp and "FBf" or bstyle
          else
            styles[c0 + k] = e.type
          end
        end
      end
    end
    lines[#lines + 1] = string.format("%-" .. lw .. "s |%s|", "r" .. r, render(chars, styles, color))
  end
  if opts.axis ~= false then
    local step = tick_step(scale, 6)
    local axis = {}
    for i = 1, ncols + 8 do axis[i] = " " end
    local last = 0
    local t = 0
    while t <= T + 1e-9 do
      local c = col(t) + 1
      local s = fmt_num(t)
      if c > last and c + #s - 1 <= ncols + 1 then
        for k = 1, #s do axis[c + k - 1] = s:sub(k, k) end
        last = c + #s
      end
      t = t + step
    end
    lines[#lines + 1] = (string.rep(" ", lw + 2) .. table.concat(axis)):gsub("%s+$", "")
  end
  if opts.legend ~= false then
    for _, l in ipairs(legend_lines(color, width, scale)) do lines[#lines + 1] = l end
  end
  return table.concat(lines, "\n")
end

-- ---- SVG ----

local svg_fill = {
  F = "#f4a259", B = "#4f86c6", I = "#8fc1e3", W = "#7fb069", idle = "#eeeeee",
}

local function xml(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
    ['"'] = "&quot;" }))
end

local function f2(x) return (string.format("%.2f", x):gsub("%.?0+$", "")) end

-- show.svg(res[, opts]) -> SVG text. opts: scale (pixels per time unit;
-- default fits about 1000 px, between 4 and 60), lane (lane height, 28),
-- title (default: schedule name and figures).
function M.svg(res, opts)
  opts = opts or {}
  local info = res:info()
  local P = info.ranks
  local T = res:makespan()
  local scale = opts.scale or math.max(4, math.min(60, T > 0 and 1000 / T or 60))
  local lane, gap = opts.lane or 28, 8
  local left, top, right = 70, 46, 20
  local plot_w = math.max(1, T * scale)
  local W = left + plot_w + right
  local lanes_h = P * (lane + gap)
  local legend_y = top + lanes_h + 36
  local H = legend_y + 34
  local o = {}
  local function put(...) o[#o + 1] = table.concat({ ... }) end
  put('<?xml version="1.0" encoding="UTF-8"?>')
  put('<svg xmlns="http://www.w3.org/2000/svg" width="', f2(W), '" height="', f2(H),
    '" viewBox="0 0 ', f2(W), " ", f2(H), '" font-family="Helvetica, Arial, sans-serif">')
  put('<defs><pattern id="idle" width="6" height="6" patternUnits="userSpaceOnUse" ',
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f2f2f2"/>',
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#d0d0d0" stroke-width="2"/></pattern></defs>')
  put('<rect width="100%" height="100%" fill="white"/>')
  local title = opts.title or string.format("%s: %d ranks, %d micro-batches, makespan %s, largest bubble %s",
    info.name ~= "" and info.name or "schedule", P, info.microbatches, fmt_num(T),
    fmt_num(res:max_bubble()))
  put('<text x="', left, '" y="22" font-size="15" font-weight="bold">', xml(title), '</text>')
  -- time axis
  local step = tick_step(scale, 40)
  put('<g class="axis" font-size="10" fill="#555">')
  local t = 0
  while t <= T + 1e-9 do
    local x = f2(left + t * scale)
    put('<line x1="', x, '" y1="', top - 4, '" x2="', x, '" y2="', top + lanes_h - gap,
      '" stroke="#ddd" stroke-width="1"/>')
    put('<text x="', x, '" y="', top + lanes_h + 8, '" text-anchor="middle">', fmt_num(t), '</text>')
    t = t + step
  end
  put('<text x="', f2(left + plot_w), '" y="', top + lanes_h + 22,
    '" text-anchor="end">time (units)</text>')
  put('</g>')
  -- lanes
  for r = 0, P - 1 do
    local y = top + r * (lane + gap)
    put('<g class="rank" id="rank', r, '">')
    put('<text x="', left - 8, '" y="', f2(y + lane / 2 + 4), '" text-anchor="end" font-size="12">rank ',
      r, '</text>')
    put('<rect class="lane" x="', left, '" y="', y, '" width="', f2(plot_w), '" height="', lane,
      '" fill="url(#idle)" stroke="#bbb" stroke-width="0.5"><title>rank ', r, ': idle where hatched</title></rect>')
    for _, e in ipairs(res:events(r)) do
      local x, w = left + e.start * scale, (e.finish - e.start) * scale
      local tip = string.format("rank %d, action %d: %s [%s, %s]", r, e.index, e.text,
        fmt_num(e.start), fmt_num(e.finish))
      local fs = math.min(12, lane / 2 - 2)
      if e.type == "FB" then
        local bfill = svg_fill[e.btype] or svg_fill.B
        put('<g class="FB"><title>', xml(tip), '</title>')
        put('<rect class="FB-F" x="', f2(x), '" y="', y, '" width="', f2(w), '" height="', f2(lane / 2),
          '" fill="', svg_fill.F, '"/>')
        put('<rect class="FB-B" x="', f2(x), '" y="', f2(y + lane / 2), '" width="', f2(w),
          '" height="', f2(lane / 2), '" fill="', bfill, '"/>')
        put('<rect x="', f2(x), '" y="', y, '" width="', f2(w), '" height="', lane,
          '" fill="none" stroke="#222" stroke-width="1.5"/>')
        if w >= 10 then
          put('<text x="', f2(x + w / 2), '" y="', f2(y + lane / 4 + fs / 3), '" font-size="', f2(fs * 0.9),
            '" text-anchor="middle">', e.mb, '</text>')
          put('<text x="', f2(x + w / 2), '" y="', f2(y + 3 * lane / 4 + fs / 3), '" font-size="', f2(fs * 0.9),
            '" text-anchor="middle"', e.btype == "I" and "" or ' fill="white"', '>', (e.btype == "I" and "I" or ""),
            e.bmb, '</text>')
        end
        put('</g>')
      else
        put('<g class="', e.type, '"><title>', xml(tip), '</title>')
        put('<rect x="', f2(x), '" y="', y, '" width="', f2(w), '" height="', lane, '" fill="',
          svg_fill[e.type] or "#999", '" stroke="white" stroke-width="0.5"/>')
        if w >= 10 then
          put('<text x="', f2(x + w / 2), '" y="', f2(y + lane / 2 + fs / 3), '" font-size="', f2(fs),
            '" text-anchor="middle"', e.type == "B" and ' fill="white"' or "", '>', e.mb, '</text>')
        end
        put('</g>')
      end
    end
    put('</g>')
  end
  -- legend
  put('<g class="legend" font-size="12">')
  local lx = left
  local entries = {
    { "F", "forward" }, { "B", "backward (full)" }, { "I", "backward, input-grad (I)" },
    { "W", "weight-grad (W)" }, { "FB", "F&B pair: F half top, B half bottom" }, { "idle", "idle" },
  }
  for _, en in ipairs(entries) do
    local k, label = en[1], en[2]
    if k == "FB" then
      put('<rect x="', lx, '" y="', legend_y, '" width="16" height="7" fill="', svg_fill.F, '"/>')
      put('<rect x="', lx, '" y="', legend_y + 7, '" width="16" height="7" fill="', svg_fill.B, '"/>')
      put('<rect x="', lx, '" y="', legend_y, '" width="16" height="14" fill="none" stroke="#222" stroke-width="1.5"/>')
    else
      put('<rect x="', lx, '" y="', legend_y, '" width="16" height="14" fill="',
        k == "idle" and "url(#idle)" or svg_fill[k], '" stroke="#999" stroke-width="0.5"/>')
    end
    put('<text x="', lx + 21, '" y="', legend_y + 11, '">', xml(label), '</text>')
    lx = lx + 30 + #label * 6.5
  end
  put('</g>')
  put('</svg>')
  return table.concat(o, "\n") .. "\n"
end

-- ---- methods ----

-- res:svg([opts]) -> SVG text
function SimResult.svg(res, opts) return M.svg(res, opts) end

-- res:write_svg(path[, opts]) -> true | nil, message (written atomically)
function SimResult.write_svg(res, path, opts)
  if type(path) ~= "string" then error("write_svg: expected a file path", 2) end
  return core.write_file(path, M.svg(res, opts))
end

local function simulate(s, cost)
  local sim = require("luapipe.sim")
  return s:simulate(sim.to_cost(cost))
end

-- s:gantt([cost[, opts]]) -> text | nil, message. cost: a table as for
-- s:simulate, a string as for sim.parse_cost, or nil (the default model).
function Schedule.gantt(s, cost, opts)
  local res, err = simulate(s, cost)
  if not res then return nil, err end
  local text = M.gantt(res, opts)
  res:close()
  return text
end

-- s:show([cost[, opts]]) prints the Gantt chart of s simulated under cost.
-- Returns nothing (so the REPL echoes nothing), or nil, message when s is
-- invalid.
function Schedule.show(s, cost, opts)
  local text, err = Schedule.gantt(s, cost, opts)
  if not text then return nil, err end
  io.write(text, "\n")
end

require("luapipe.sim") -- installs summary, __tostring, show, gantt of results

return M
