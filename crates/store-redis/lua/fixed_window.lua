-- fixed_window.lua: fixed window aligned to the epoch, or to the UTC calendar
-- (docs/algorithms.md, fixed_window.rs, calendar.rs).
--
-- Item parameters: p1 = limit L, p2 = window W (ms), p3 = calendar period (0 none, 1 day,
-- 2 ISO week, 3 month: the window's bounds come from the calendar, see window_bounds).
-- State: string `f<window_start>:<count>`.
-- Redis commands per decision: GET, then SET PX when admitted with cost > 0 (2 at most).

-- The window of stored value v at now_ms: the time it is judged at (a clock behind the
-- stored window stands at its start, so nothing is refunded), the window's start and end,
-- and its count (0 for a value of an earlier window, or none).
local function fw_window(v, now_ms, w, calendar)
  local stored, count = nil, 0
  if v then
    local s, c = string.match(v, '^f(%d+):(%d+)$')
    if s then
      stored, count = tonumber(s), tonumber(c)
      if stored > now_ms then
        now_ms = stored
      end
    end
  end
  local start, finish = window_bounds(calendar, now_ms, w)
  if stored ~= start then
    count = 0
  end
  return now_ms, start, finish, count
end

local function fw_value(start, count)
  return string.format('f%d:%d', start, count)
end

STEP.fw = function(v, now, cost, limit, w, calendar)
  local now_ms, start, finish, count = fw_window(v, floor(now / 1000), w, calendar)
  local left = finish - now_ms
  local remaining = limit - count
  if remaining < 0 then
    remaining = 0
  end
  local reset = 0
  if count > 0 then
    reset = left
  end
  if cost > limit then
    return -1, limit, remaining, reset, 0
  end
  if count + cost > limit then
    return retry_of(left), limit, remaining, reset, 0
  end
  local after = count + cost
  if after > 0 then
    reset = left
  else
    reset = 0
  end
  if cost == 0 then
    return 0, limit, limit - after, reset, 0
  end
  return 0, limit, limit - after, reset, 0, fw_value(start, after), left
end
CHECK.fw = check_of(STEP.fw)

ADJUST.fw = function(key, now, charge, cost, pad, _, w, calendar)
  local now_ms, start, finish, count = fw_window(get_string(key), floor(now / 1000), w, calendar)
  count = moved_count(count, charge, cost)
  if count == 0 then
    call('DEL', key)
  else
    put_string(key, fw_value(start, count), finish - now_ms, pad)
  end
end
