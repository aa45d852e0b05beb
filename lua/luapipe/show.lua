-- luapipe.show: pictures of a simulated timeline.
--
--   local show = require("luapipe.show")
--   print(show.gantt(res))        -- terminal Gantt chart, one row per rank
--   local svg = show.svg(res)     -- standalone SVG, one lane per rank
--   s:show()                      -- a schedule's Gantt under the default cost
--   res:write_svg("t.svg")        -- atomically
--
-- The Gantt chart draws time left to right, a whole number of columns per
-- time unit (or a fraction of one for long actions), chosen so that every
-- action's full label fits its cell followed by a space: F as its
-- micro-batch number ("3"), B, I and W with their letter ("B3", "I3",
-- "W3"), an overlapped F&B pair as "3&5" (forward of mb 3 with backward of
-- mb 5; "3&I5" when the backward half is an I); "." is idle. Labels are
-- never abbreviated, whatever the cost ratio: a chart wider than `width`
-- is cut into bands, one under the other, at times where few actions are
-- cut ("~" marks the part of a cut action that has no room for its label).
-- On a colour terminal cells are also coloured by type, pairs split in the
-- F and B colours (show.use_color decides: the output must end at a terminal; NO_COLOR,
-- TERM=dumb and --color=never turn colour off).
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

-- ---- characters ----

-- show.use_unicode() -> boolean: whether terminal pictures may use block
-- characters (the EPLB heat map's ▁▂▃...█) or keep to ASCII. LUAPIPE_CHARSET
-- "utf-8" or "ascii" decides; otherwise the locale does, read as tree and
-- htop read it (their setlocale + nl_langinfo(CODESET), from the
-- environment): the first of LC_ALL, LC_CTYPE and LANG that is set and not
-- empty must name a UTF-8 codeset ("C.UTF-8", "en_US.utf8"); none set is
-- the C locale, ASCII.
function M.use_unicode()
  local cs = os.getenv("LUAPIPE_CHARSET")
  cs = cs and cs:lower():gsub("[-_]", "")
  if cs == "utf8" then return true elseif cs == "ascii" then return false end
  for _, k in ipairs { "LC_ALL", "LC_CTYPE", "LANG" } do
    local v = os.getenv(k)
    if v and v ~= "" then return v:lower():gsub("[-_]", ""):find("utf8", 1, true) ~= nil end
  end
  return false
end

-- show.shades([unicode]) -> 8 cell characters, lightest first: block
-- characters ▁..█ when unicode (default: show.use_unicode()), else the ASCII
-- ramp . : - = + * # @.
local block_shades = { "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█" }
local ascii_shades = { ".", ":", "-", "=", "+", "*", "#", "@" }
function M.shades(unicode)
  if unicode == nil then unicode = M.use_unicode() end
  return table.move(unicode and block_shades or ascii_shades, 1, 8, 1, {})
end

-- ---- the Gantt chart ----

-- The full label of an event's cell (see the header).
local function cell_label(e)
  if e.type == "F" then return tostring(e.mb) end
  if e.type == "FB" then return e.mb .. "&" .. (e.btype == "I" and "I" or "") .. e.bmb end
  if e.type == "B" or e.type == "I" or e.type == "W" then return e.type .. e.mb end
  return tostring(e.text or e.type)
end
M.cell_label = cell_label

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

-- At most MAX_BANDS bands: with costs that differ by many orders of
-- magnitude (--cost F=1e15) every label cannot fit in a chart of bounded
-- size; the scale is then capped and the labels of short actions are cut.
local MAX_BANDS = 24

local function legend_lines(color, width, scale, cut, capped)
  local function sample(text, st)
    if not color then return text end
    return (ansi[st] or "") .. text .. RESET
  end
  local unit = scale >= 1 and string.format("1 unit = %s col%s", fmt_num(scale), scale == 1 and "" or "s")
    or string.format("1 col = %s units", fmt_num(1 / scale))
  local items = {
    { sample("3", "F") .. "=F of mb 3", "3=F of mb 3" },
    { sample("B3", "B") .. "/" .. sample("I3", "I") .. "/" .. sample("W3", "W") .. "=B/I/W",
      "B3/I3/W3=B/I/W" },
    { sample("3", "FBf") .. sample("&5", "FBb") .. "=F3 overlapped with B5", "3&5=F3 overlapped with B5" },
    { sample(".", "idle") .. "=idle", ".=idle" },
  }
  if cut then items[#items + 1] = { "~=action cut by the band edge", "~=action cut by the band edge" } end
  if capped then
    local note = string.format("(costs too far apart to label every action in %d bands: short ones cut)",
      MAX_BANDS)
    items[#items + 1] = { note, note }
  end
  items[#items + 1] = { unit, unit }
  local lines, cur, curlen = {}, "legend: ", 8
  for _, it in ipairs(items) do
    local text, plain = it[1], it[2] -- plain lengths decide the wrapping
    local add = (curlen > 8 and 2 or 0) + #plain
    if curlen + add > width and curlen > 8 then
      lines[#lines + 1] = cur
      cur, curlen = "        " .. text, 8 + #plain
    else
      cur = cur .. (curlen > 8 and "  " or "") .. text
      curlen = curlen + add
    end
  end
  lines[#lines + 1] = cur
  return lines
end

-- The columns per time unit: the fitting scale (a whole number up to 4
-- when there is room, else a fraction), raised so that every event of
-- positive length holds its label and a space even after rounding.
local function gantt_scale(res, P, T, avail, want)
  local scale = want
  if not scale then
    scale = T > 0 and avail / T or 1
    if scale >= 1 then scale = math.min(4, math.floor(scale)) end
  end
  local need = 0
  for r = 0, P - 1 do
    for _, e in ipairs(res:events(r)) do
      local d = e.finish - e.start
      if d > 0 then need = math.max(need, (#cell_label(e) + 1) / d) end
    end
  end
  if need > scale then
    scale = need > 1 and math.ceil(need - 1e-9) or need * (1 + 1e-9)
  end
  local cap = T > 0 and MAX_BANDS * avail / T or scale
  if scale > cap then return cap, true end
  return scale, false
end

-- Lays out one rank's cells: {c0, c1, label, e} in columns (0-based
-- start, exclusive end), and marks in inside[c] the column boundaries c
-- that fall strictly inside a cell.
local function gantt_cells(events, col, ncols, inside)
  local cells = {}
  for _, e in ipairs(events) do
    local c0, c1 = col(e.start), math.min(col(e.finish), ncols)
    if e.finish > e.start and c1 > c0 then
      cells[#cells + 1] = { c0 = c0, c1 = c1, label = cell_label(e), e = e }
      for c = c0 + 1, c1 - 1 do inside[c] = true end
    end
  end
  return cells
end

-- Band edges: column boundaries 0 = b0 < b1 < ... = ncols, bands of
-- about equal width, none wider than avail, each edge near its ideal place
-- where the fewest ranks have a cell cut.
local function band_edges(ncols, avail, inside, P)
  local edges, pos = { 0 }, 0
  while ncols - pos > avail do
    local left = ncols - pos
    local ideal = math.ceil(left / math.ceil(left / avail))
    local slack = math.max(1, ideal // 6)
    local best, bestkey = pos + ideal, math.huge
    for c = pos + math.max(1, ideal - slack), pos + math.min(avail, ideal + slack) do
      local cut = 0
      for r = 0, P - 1 do if inside[r][c] then cut = cut + 1 end end
      local key = cut * 1e6 + math.abs(c - pos - ideal)
      if key < bestkey then best, bestkey = c, key end
    end
    edges[#edges + 1] = best
    pos = best
  end
  edges[#edges + 1] = ncols
  return edges
end

-- One band [a, b) of a rank's row: chars and styles. Returns whether a
-- cell was cut at either edge.
local function band_row(cells, a, b)
  local chars, styles, cut = {}, {}, false
  for i = 1, b - a do chars[i] = "." end
  for _, c in ipairs(cells) do
    local v0, v1 = math.max(c.c0, a), math.min(c.c1, b)
    if v1 > v0 then
      local w, text = v1 - v0, c.label
      if v0 > c.c0 or c.c1 > b then
        cut = true
        if v0 > c.c0 or #text > w then -- no room for the label: a continuation mark
          text = string.rep("~", c.c1 > b and w or w - 1)
        end
      end
      text = text .. string.rep(" ", w - #text)
      local e = c.e
      local amp = e.type == "FB" and (text:find("&", 1, true) or (v0 > c.c0 and 0 or w + 1)) or 0
      local bstyle = e.btype == "I" and "FBi" or "FBb"
      for k = 1, w do
        chars[v0 - a + k] = text:sub(k, k)
        if e.type == "FB" then
          styles[v0 - a + k] = k < amp and "FBf" or bstyle
        else
          styles[v0 - a + k] = ansi[e.type] and e.type or "idle"
        end
      end
    end
  end
  return chars, styles, cut
end

-- show.gantt(res[, opts]) -> text. opts: width (columns, default 80),
-- color (true/false; default: show.use_color()), scale (columns per time
-- unit; default: the largest whole number up to 4 that fits, or a
-- fraction; raised when a label would not fit), legend (default true),
-- axis (default true).
-- The result's info(), or raises at the caller of fname naming what was
-- expected.
local function result_info(fname, res)
  local ok, info = pcall(function() return res:info() end)
  if not ok or type(info) ~= "table" then
    error(string.format("show.%s: expected a simulation result (s:simulate(cost)), got %s", fname,
      type(res)), 3)
  end
  return info
end

function M.gantt(res, opts)
  opts = opts or {}
  local info = result_info("gantt", res)
  local P = info.ranks
  local width = opts.width or 80
  local color = opts.color
  if color == nil then color = M.use_color(1) end
  local T = res:makespan()
  local lw = #("r" .. (P - 1))
  local avail = math.max(10, width - (lw + 2) - 1)
  local scale, capped = gantt_scale(res, P, T, avail, opts.scale)
  local ncols = math.max(1, math.ceil(T * scale - 1e-9))
  local function col(t) return math.floor(t * scale + 0.5) end

  local cells, inside = {}, {}
  for r = 0, P - 1 do
    inside[r] = {}
    cells[r] = gantt_cells(res:events(r), col, ncols, inside[r])
  end
  local edges = band_edges(ncols, avail, inside, P)
  local lines, anycut = {}, false
  for bi = 1, #edges - 1 do
    local a, b = edges[bi], edges[bi + 1]
    if bi > 1 then lines[#lines + 1] = "" end
    for r = 0, P - 1 do
      local chars, styles, cut = band_row(cells[r], a, b)
      anycut = anycut or cut
      lines[#lines + 1] = string.format("%-" .. lw .. "s |%s|", "r" .. r, render(chars, styles, color))
    end
    if opts.axis ~= false then
      local step = tick_step(scale, 6)
      local axis = {}
      for i = 1, b - a + 8 do axis[i] = " " end
      local last = 0
      local t = math.ceil(a / scale / step - 1e-9) * step
      while col(t) <= b do
        local c = col(t) - a + 1
        local s = fmt_num(t)
        if c > last and c + #s - 1 <= b - a + 1 then
          for k = 1, #s do axis[c + k - 1] = s:sub(k, k) end
          last = c + #s
        end
        t = t + step
      end
      lines[#lines + 1] = (string.rep(" ", lw + 2) .. table.concat(axis)):gsub("%s+$", "")
    end
  end
  if opts.legend ~= false then
    for _, l in ipairs(legend_lines(color, width, scale, anycut, capped)) do lines[#lines + 1] = l end
  end
  return table.concat(lines, "\n")
end

-- ---- SVG ----

-- Two hue families, as in DeepSeek's DualPipe figure: actions of a virtual
-- stage on a route running down the ranks (rank 0 towards P-1) in warm
-- colours, up the ranks in cool ones; within a family F is light, I
-- medium, B dark and W darkest. ink: the text colour on that fill.
local svg_fill = {
  down = { F = "#fdae61", I = "#f46d43", B = "#d73027", W = "#8c510a" },
  up = { F = "#abd9e9", I = "#74add1", B = "#4575b4", W = "#5e3c99" },
  optim = "#9e9e9e", other = "#bdbdbd",
}
local svg_ink = { F = "#222", I = "#222", B = "white", W = "white" }
local type_names = { F = "forward", I = "input-grad", B = "backward", W = "weight-grad" }

local function xml(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
    ['"'] = "&quot;" }))
end

local function f2(x) return (string.format("%.2f", x):gsub("%.?0+$", "")) end

-- The direction of every virtual stage seen in res: "down" or "up". The
-- virtual stages are taken in number order and cut into runs that step one
-- rank at a time the same way (0,1,2,3 | 3,2,1,0 for DualPipe and ZB-V;
-- 0,1 | 0,1 for interleaved 1F1B); a run going to lower ranks is "up".
local function directions(res, P)
  local rank_of, maxv = {}, -1
  for r = 0, P - 1 do
    for _, e in ipairs(res:events(r)) do
      for _, v in ipairs { e.stage, e.bstage } do
        if type(v) == "number" and v >= 0 then
          rank_of[v] = r
          if v > maxv then maxv = v end
        end
      end
    end
  end
  local dir, v = {}, 0
  while v <= maxv do
    local d, w = 1, v
    if rank_of[v] and rank_of[v + 1] and rank_of[v + 1] == rank_of[v] - 1 then d = -1 end
    while rank_of[w] and rank_of[w + 1] and rank_of[w + 1] == rank_of[w] + d do w = w + 1 end
    for k = v, w do dir[k] = d < 0 and "up" or "down" end
    v = w + 1
  end
  return dir
end

-- The fill of an action of type t (F, B, I, W) on virtual stage v.
local function fill_of(dir, t, v)
  local fam = svg_fill[dir[v] or "down"]
  return fam[t] or (t == "optim" and svg_fill.optim) or svg_fill.other
end

-- Text of about fs px per character fits w px?
local function fits(text, fs, w) return #text * fs * 0.6 + 4 <= w end

-- The label of a cell at most w px wide, and its font size; nil when even
-- 8 px does not fit (the tooltip still names the action).
local function svg_label(text, fs, w)
  while fs >= 8 do
    if fits(text, fs, w) then return text, fs end
    fs = fs - 1
  end
  return nil
end

-- show.svg(res[, opts]) -> SVG text. opts: scale (pixels per time unit;
-- default: about 1000 px wide, more when a two-digit micro-batch number
-- would not fit its cell, within 2400 px), lane (lane height; default
-- grows with the width so that the picture is about 3:1), unit (the time
-- unit named on the axis, "units"), title (default: schedule name and
-- figures).
function M.svg(res, opts)
  opts = opts or {}
  local info = result_info("svg", res)
  local P = info.ranks
  local T = res:makespan()
  local unit = opts.unit or "units"
  local dir = directions(res, P)
  local present, fams, optim = {}, {}, false
  local scale = opts.scale
  if not scale then
    scale = T > 0 and 1000 / T or 60
    local need = 0 -- px per unit for the shortest action to hold "88" at 11 px
    for r = 0, P - 1 do
      for _, e in ipairs(res:events(r)) do
        local d = e.finish - e.start
        if d > 0 and e.type ~= "optim" then need = math.max(need, (2 * 11 * 0.6 + 4) / d) end
      end
    end
    scale = math.max(scale, math.min(need, T > 0 and 2400 / T or need))
    scale = math.max(4 / math.max(1, T / 250), math.min(60, scale))
  end
  local plot_w = math.max(1, T * scale)
  local lane = opts.lane or math.floor(math.max(28, math.min(90, plot_w / (3.2 * P))))
  local gap = math.max(6, lane // 5)
  local left, top, right = 70, 46, 20
  local W = left + plot_w + right
  local lanes_h = P * (lane + gap)
  local o = {}
  local function put(...) o[#o + 1] = table.concat({ ... }) end
  -- the lanes first (the legend shows only what they use)
  local body = {}
  local function bput(...) body[#body + 1] = table.concat({ ... }) end
  local fs0 = math.min(14, math.floor(lane / 2 - 2))
  for r = 0, P - 1 do
    local y = top + r * (lane + gap)
    bput('<g class="rank" id="rank', r, '">')
    bput('<text x="', left - 8, '" y="', f2(y + lane / 2 + 4), '" text-anchor="end" font-size="12">rank ',
      r, '</text>')
    bput('<rect class="lane" x="', left, '" y="', y, '" width="', f2(plot_w), '" height="', lane,
      '" fill="url(#idle)" stroke="#bbb" stroke-width="0.5"><title>rank ', r, ': idle where hatched</title></rect>')
    for _, e in ipairs(res:events(r)) do
      local x, w = left + e.start * scale, (e.finish - e.start) * scale
      local tip = string.format("rank %d, action %d: %s [%s, %s] %s", r, e.index, e.text,
        fmt_num(e.start), fmt_num(e.finish), unit)
      if e.type == "FB" then
        local ff, bf = fill_of(dir, "F", e.stage), fill_of(dir, e.btype or "B", e.bstage)
        present[e.btype or "B"], present.F, present.FB = true, true, true
        fams[dir[e.stage] or "down"], fams[dir[e.bstage] or "down"] = true, true
        bput('<g class="FB"><title>', xml(tip), '</title>')
        bput('<rect class="FB-F" x="', f2(x), '" y="', y, '" width="', f2(w), '" height="', f2(lane / 2),
          '" fill="', ff, '"/>')
        bput('<rect class="FB-B" x="', f2(x), '" y="', f2(y + lane / 2), '" width="', f2(w),
          '" height="', f2(lane / 2), '" fill="', bf, '"/>')
        bput('<rect x="', f2(x), '" y="', y, '" width="', f2(w), '" height="', lane,
          '" fill="none" stroke="#222" stroke-width="1.5"/>')
        local ft, ffs = svg_label(tostring(e.mb), math.min(fs0, lane // 2 - 2), w)
        local bt, bfs = svg_label((e.btype == "I" and "I" or "") .. e.bmb, math.min(fs0, lane // 2 - 2), w)
        if ft then
          bput('<text x="', f2(x + w / 2), '" y="', f2(y + lane / 4 + ffs / 3), '" font-size="', ffs,
            '" text-anchor="middle" fill="', svg_ink.F, '">', ft, '</text>')
        end
        if bt then
          bput('<text x="', f2(x + w / 2), '" y="', f2(y + 3 * lane / 4 + bfs / 3), '" font-size="', bfs,
            '" text-anchor="middle" fill="', svg_ink[e.btype or "B"], '">', bt, '</text>')
        end
        bput('</g>')
      else
        local fill = fill_of(dir, e.type, e.stage)
        if e.type == "optim" then optim = true
        elseif type_names[e.type] then
          present[e.type] = true
          fams[dir[e.stage] or "down"] = true
        end
        bput('<g class="', xml(e.type), '"><title>', xml(tip), '</title>')
        bput('<rect x="', f2(x), '" y="', y, '" width="', f2(w), '" height="', lane, '" fill="',
          fill, '" stroke="white" stroke-width="0.5"/>')
        local text = e.type == "optim" and "optimizer" or tostring(e.mb)
        local t, tfs = svg_label(text, fs0, w)
        if t then
          bput('<text x="', f2(x + w / 2), '" y="', f2(y + lane / 2 + tfs / 3), '" font-size="', tfs,
            '" text-anchor="middle" fill="', svg_ink[e.type] or "#222", '">', xml(t), '</text>')
        end
        bput('</g>')
      end
    end
    bput('</g>')
  end

  -- legend rows: one per hue family in use, then pairs, idle, optimizer
  local legend = {}
  local both = fams.down and fams.up
  for _, fam in ipairs { "down", "up" } do
    if fams[fam] then
      local row = {}
      if both then
        row.title = fam == "down" and string.format("down the ranks (0 to %d):", P - 1)
          or string.format("up the ranks (%d to 0):", P - 1)
      end
      for _, t in ipairs { "F", "B", "I", "W" } do
        if present[t] then row[#row + 1] = { fill = svg_fill[fam][t], label = t .. " " .. type_names[t] } end
      end
      legend[#legend + 1] = row
    end
  end
  local misc = {}
  if present.FB then misc[#misc + 1] = { pair = true, label = "F&B overlapped: F top, B bottom" } end
  misc[#misc + 1] = { fill = "url(#idle)", label = "idle" }
  if optim then misc[#misc + 1] = { fill = svg_fill.optim, label = "optimizer step" } end
  misc[#misc + 1] = { label = "numbers: micro-batch" }
  legend[#legend + 1] = misc
  local legend_y = top + lanes_h + 36
  local H = legend_y + #legend * 22 + 8

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
    '" text-anchor="end">time (', xml(unit), ')</text>')
  put('</g>')
  for _, l in ipairs(body) do o[#o + 1] = l end
  -- legend
  put('<g class="legend" font-size="12">')
  for i, row in ipairs(legend) do
    local y, lx = legend_y + (i - 1) * 22, left
    if row.title then
      put('<text x="', lx, '" y="', y + 11, '">', xml(row.title), '</text>')
      lx = lx + #row.title * 6.5 + 10
    end
    for _, en in ipairs(row) do
      if en.pair then
        put('<rect x="', lx, '" y="', y, '" width="16" height="7" fill="', svg_fill.down.F, '"/>')
        put('<rect x="', lx, '" y="', y + 7, '" width="16" height="7" fill="', svg_fill.up.B, '"/>')
        put('<rect x="', lx, '" y="', y, '" width="16" height="14" fill="none" stroke="#222" stroke-width="1.5"/>')
        lx = lx + 21
      elseif en.fill then
        put('<rect x="', lx, '" y="', y, '" width="16" height="14" fill="', en.fill,
          '" stroke="#999" stroke-width="0.5"/>')
        lx = lx + 21
      end
      put('<text x="', lx, '" y="', y + 11, '">', xml(en.label), '</text>')
      lx = lx + 14 + #en.label * 6.5
    end
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
