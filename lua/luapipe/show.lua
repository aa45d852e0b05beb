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
-- mb 5; "3&I5" when the backward half is an I); "." is idle. When a rank
-- runs more than one virtual stage (interleaved chunks, ZB-V's and
-- DualPipe's two legs) every label ends with its chunk's letter: a for the
-- rank's lowest-numbered virtual stage, b for the next ("3b", "B3a",
-- "3a&5b"), and the chunks alternate normal and bright colours. Labels are
-- never abbreviated, whatever the cost ratio: a chart wider than `width`
-- is cut into bands, one under the other, at times where few actions are
-- cut ("~" marks the part of a cut action that has no room for its label).
-- On a colour terminal cells are also coloured by kind (F cyan, B green, I
-- yellow, W magenta; bright for chunks b, d, ...), pairs bold and
-- underlined, split in their halves' colours (show.use_color decides: the
-- output must end at a terminal; NO_COLOR, TERM=dumb and --color=never
-- turn colour off).
local core = require("luapipe.core")

local M = {}
package.loaded["luapipe.show"] = M -- luapipe.sim requires us back

local Schedule, SimResult = core.Schedule, core.SimResult

-- ---- colour ----

local RESET = "\27[0m"
-- Background colours by kind; a style is "idle", or KIND, KIND.."'" (a
-- chunk b, d, ...: bright) with "&" after it for half of a pair.
local kind_bg = { F = 46, B = 42, I = 43, W = 45 }
local ansi = setmetatable({ idle = "\27[2m" }, { __index = function(t, st)
  local kind, odd, pair = st:match("^(%u)('?)(&?)$")
  local bg = kind and kind_bg[kind]
  if not bg then return nil end
  local code = string.format("\27[%s30;%dm", pair == "&" and "1;4;" or "", bg + (odd == "'" and 60 or 0))
  rawset(t, st, code)
  return code
end })

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

-- ---- chunks ----

-- show.chunks(res) -> chunk_of, multi: the chunk of every virtual stage
-- (chunk_of[v], 0-based: its place among the virtual stages its rank runs,
-- in number order) and whether a rank runs more than one.
function M.chunks(res)
  local chunk_of, multi = {}, false
  for r = 0, res:info().ranks - 1 do
    local seen, list = {}, {}
    for _, e in ipairs(res:events(r)) do
      for _, v in ipairs { e.stage, e.bstage } do
        if type(v) == "number" and v >= 0 and not seen[v] then
          seen[v] = true
          list[#list + 1] = v
        end
      end
    end
    table.sort(list)
    for i, v in ipairs(list) do chunk_of[v] = i - 1 end
    if #list > 1 then multi = true end
  end
  return chunk_of, multi
end

-- show.chunk_name(c) -> "a", "b", ... "z", "A" .. "Z", then "#53", ...
function M.chunk_name(c)
  if c < 26 then return string.char(97 + c) elseif c < 52 then return string.char(65 + c - 26) end
  return "#" .. (c + 1)
end

-- The full label of an event's cell (see the header); chunks: the map of
-- show.chunks when a rank runs several virtual stages (labels then end
-- with the chunk's letter), else nil.
local function cell_label(e, chunks)
  local function at(v) return chunks and chunks[v] and M.chunk_name(chunks[v]) or "" end
  if e.type == "F" then return e.mb .. at(e.stage) end
  if e.type == "FB" then
    return e.mb .. at(e.stage) .. "&" .. (e.btype == "I" and "I" or "") .. e.bmb .. at(e.bstage)
  end
  if e.type == "B" or e.type == "I" or e.type == "W" then return e.type .. e.mb .. at(e.stage) end
  return tostring(e.text or e.type)
end
M.cell_label = cell_label

-- The terminal style of an action of kind t on virtual stage v.
local function style_of(t, v, chunks, pair)
  if not kind_bg[t] then return "idle" end
  local odd = chunks and chunks[v] and chunks[v] % 2 == 1
  return t .. (odd and "'" or "") .. (pair and "&" or "")
end

-- ---- the Gantt chart ----

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

local function legend_lines(color, width, scale, cut, capped, multi)
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
    { sample("3", "F&") .. sample("&5", "B&") .. "=F3 overlapped with B5", "3&5=F3 overlapped with B5" },
    { sample(".", "idle") .. "=idle", ".=idle" },
  }
  if multi then
    table.insert(items, 1, { sample("3a", "F") .. "/" .. sample("3b", "F'")
      .. "=chunk a/b: the rank's 1st/2nd virtual stage", "3a/3b=chunk a/b: the rank's 1st/2nd virtual stage" })
  end
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
local function gantt_scale(res, P, T, avail, want, chunks)
  local scale = want
  if not scale then
    scale = T > 0 and avail / T or 1
    if scale >= 1 then scale = math.min(4, math.floor(scale)) end
  end
  local need = 0
  for r = 0, P - 1 do
    for _, e in ipairs(res:events(r)) do
      local d = e.finish - e.start
      if d > 0 then need = math.max(need, (#cell_label(e, chunks) + 1) / d) end
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
local function gantt_cells(events, col, ncols, inside, chunks)
  local cells = {}
  for _, e in ipairs(events) do
    local c0, c1 = col(e.start), math.min(col(e.finish), ncols)
    if e.finish > e.start and c1 > c0 then
      cells[#cells + 1] = { c0 = c0, c1 = c1, label = cell_label(e, chunks), e = e }
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
local function band_row(cells, a, b, chunks)
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
      local fstyle, bstyle, style
      if e.type == "FB" then
        fstyle = style_of("F", e.stage, chunks, true)
        bstyle = style_of(e.btype or "B", e.bstage, chunks, true)
      else
        style = style_of(e.type, e.stage, chunks, false)
      end
      for k = 1, w do
        chars[v0 - a + k] = text:sub(k, k)
        styles[v0 - a + k] = style or (k < amp and fstyle or bstyle)
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
  local chunk_of, multi = M.chunks(res)
  local chunks = multi and chunk_of or nil
  local scale, capped = gantt_scale(res, P, T, avail, opts.scale, chunks)
  local ncols = math.max(1, math.ceil(T * scale - 1e-9))
  local function col(t) return math.floor(t * scale + 0.5) end

  local cells, inside = {}, {}
  for r = 0, P - 1 do
    inside[r] = {}
    cells[r] = gantt_cells(res:events(r), col, ncols, inside[r], chunks)
  end
  local edges = band_edges(ncols, avail, inside, P)
  local lines, anycut = {}, false
  for bi = 1, #edges - 1 do
    local a, b = edges[bi], edges[bi + 1]
    if bi > 1 then lines[#lines + 1] = "" end
    for r = 0, P - 1 do
      local chars, styles, cut = band_row(cells[r], a, b, chunks)
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
    for _, l in ipairs(legend_lines(color, width, scale, anycut, capped, multi)) do lines[#lines + 1] = l end
  end
  return table.concat(lines, "\n")
end

-- ---- SVG ----

-- A hue per kind, far apart (F blue, I orange, B green, W purple), and a
-- shade per chunk: a rank's chunks a, c, ... dark, b, d, ... light (a
-- chunk's letter also ends its labels). ink: the text colour on that fill.
local svg_fill = {
  F = { "#3a6ea5", "#9ecae1" }, I = { "#e8731a", "#fdbe85" },
  B = { "#3d8b37", "#a1d99b" }, W = { "#8a4f9e", "#f0a3d4" },
  optim = "#9e9e9e", other = "#bdbdbd",
}
local svg_ink = { "white", "#222" }
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

-- The shade (1 dark, 2 light) of virtual stage v's chunk.
local function shade_of(chunks, v)
  return chunks and chunks[v] and chunks[v] % 2 + 1 or 1
end

-- The fill and ink of an action of kind t (F, B, I, W) on virtual stage v.
local function fill_of(chunks, t, v)
  local fam = type_names[t] and svg_fill[t]
  if not fam then return t == "optim" and svg_fill.optim or svg_fill.other, "#222" end
  local sh = shade_of(chunks, v)
  return fam[sh], svg_ink[sh]
end

-- Text of about fs px per character fits w px?
local function fits(text, fs, w) return #text * fs * 0.6 + 4 <= w end

-- The label of a cell w px wide and h px high: text, font size and
-- whether it runs upwards (rotated, for a cell too narrow to hold it
-- across at 8 px but tall enough to hold it along); nil when neither fits
-- (the tooltip still names the action).
local function svg_label(text, fs, w, h)
  for f = fs, 8, -1 do
    if fits(text, f, w) then return text, f, false end
  end
  if h then
    for f = math.min(fs, math.floor(w - 2)), 7, -1 do
      if fits(text, f, h) then return text, f, true end
    end
  end
  return nil
end

-- The <text> of a label centred at (cx, cy).
local function svg_text(put, text, fs, up, cx, cy, ink)
  if up then
    put('<text x="', f2(cx), '" y="', f2(cy + fs / 3), '" font-size="', fs,
      '" text-anchor="middle" transform="rotate(-90 ', f2(cx), " ", f2(cy), ')" fill="', ink, '">',
      xml(text), '</text>')
  else
    put('<text x="', f2(cx), '" y="', f2(cy + fs / 3), '" font-size="', fs,
      '" text-anchor="middle" fill="', ink, '">', xml(text), '</text>')
  end
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
  local chunk_of, multi = M.chunks(res)
  local chunks = multi and chunk_of or nil
  local function at(v) return chunks and chunks[v] and M.chunk_name(chunks[v]) or "" end
  local present, shades, optim = {}, {}, false
  local scale = opts.scale
  if not scale then
    scale = T > 0 and 1000 / T or 60
    local need = 0 -- px per unit for the shortest action to hold "88" (and its chunk) at 11 px
    for r = 0, P - 1 do
      for _, e in ipairs(res:events(r)) do
        local d = e.finish - e.start
        local n = 2 + (multi and 1 or 0)
        if d > 0 and e.type ~= "optim" then need = math.max(need, (n * 11 * 0.6 + 4) / d) end
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
        local bt = e.btype or "B"
        local ff, fink = fill_of(chunks, "F", e.stage)
        local bf, bink = fill_of(chunks, bt, e.bstage)
        present[bt], present.F, present.FB = true, true, true
        shades[shade_of(chunks, e.stage)], shades[shade_of(chunks, e.bstage)] = true, true
        bput('<g class="FB"><title>', xml(tip), '</title>')
        bput('<rect class="FB-F" x="', f2(x), '" y="', y, '" width="', f2(w), '" height="', f2(lane / 2),
          '" fill="', ff, '"/>')
        bput('<rect class="FB-B" x="', f2(x), '" y="', f2(y + lane / 2), '" width="', f2(w),
          '" height="', f2(lane / 2), '" fill="', bf, '"/>')
        bput('<rect x="', f2(x), '" y="', y, '" width="', f2(w), '" height="', lane,
          '" fill="none" stroke="#222" stroke-width="1.5"/>')
        local hfs = math.min(fs0, lane // 2 - 2)
        local ft, ffs, fup = svg_label(e.mb .. at(e.stage), hfs, w, lane / 2 - 2)
        local btx, bfs, bup = svg_label((e.btype == "I" and "I" or "") .. e.bmb .. at(e.bstage), hfs, w,
          lane / 2 - 2)
        if ft then svg_text(bput, ft, ffs, fup, x + w / 2, y + lane / 4, fink) end
        if btx then svg_text(bput, btx, bfs, bup, x + w / 2, y + 3 * lane / 4, bink) end
        bput('</g>')
      else
        local fill, ink = fill_of(chunks, e.type, e.stage)
        if e.type == "optim" then optim = true
        elseif type_names[e.type] then
          present[e.type] = true
          shades[shade_of(chunks, e.stage)] = true
        end
        bput('<g class="', xml(e.type), '"><title>', xml(tip), '</title>')
        bput('<rect x="', f2(x), '" y="', y, '" width="', f2(w), '" height="', lane, '" fill="',
          fill, '" stroke="white" stroke-width="0.5"/>')
        local text = e.type == "optim" and "optimizer" or (e.mb .. at(e.stage))
        local t, tfs, up = svg_label(text, fs0, w, e.type ~= "optim" and lane - 4 or nil)
        if t then svg_text(bput, t, tfs, up, x + w / 2, y + lane / 2, ink) end
        bput('</g>')
      end
    end
    bput('</g>')
  end

  -- legend rows: one per shade in use (chunks a, c, ... and b, d, ...),
  -- then pairs, idle, optimizer
  local legend = {}
  local nchunks = 0
  for _, c in pairs(chunk_of) do nchunks = math.max(nchunks, c + 1) end
  for sh = 1, 2 do
    if shades[sh] then
      local row = {}
      if multi then
        local names, ds = {}, {}
        for c = sh - 1, nchunks - 1, 2 do names[#names + 1] = M.chunk_name(c) end
        for v, c in pairs(chunk_of) do if c % 2 == sh - 1 then ds[dir[v] or "down"] = true end end
        local where = ds.down and ds.up and "" or ds.up and string.format(" (up the ranks, %d to 0)", P - 1)
          or string.format(" (down the ranks, 0 to %d)", P - 1)
        row.title = string.format("chunk%s %s%s:", #names > 1 and "s" or "", table.concat(names, ", "), where)
      end
      for _, t in ipairs { "F", "B", "I", "W" } do
        if present[t] then row[#row + 1] = { fill = svg_fill[t][sh], label = t .. " " .. type_names[t] } end
      end
      legend[#legend + 1] = row
    end
  end
  local misc = {}
  if present.FB then misc[#misc + 1] = { pair = true, label = "F&B overlapped: F top, B bottom" } end
  misc[#misc + 1] = { fill = "url(#idle)", label = "idle" }
  if optim then misc[#misc + 1] = { fill = svg_fill.optim, label = "optimizer step" } end
  misc[#misc + 1] = { label = multi and "labels: micro-batch and chunk (3a, I3b)" or "numbers: micro-batch" }
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
        put('<rect x="', lx, '" y="', y, '" width="16" height="7" fill="', svg_fill.F[1], '"/>')
        put('<rect x="', lx, '" y="', y + 7, '" width="16" height="7" fill="', svg_fill.B[1], '"/>')
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
  return s:try_simulate(sim.to_cost(cost))
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
