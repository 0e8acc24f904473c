-- fixed_window.lua: fixed window aligned to the epoch, or to the UTC calendar
-- (docs/algorithms.md, fixed_window.rs, calendar.rs).
--
-- Item parameters: p1 = limit L, p2 = window W (ms), p3 = calendar period (0 none, 1 day,
-- 2 ISO week, 3 month: the window's bounds come from the calendar, see window_bounds).
-- State: string `f<window_start>:<count>`.
-- Redis commands per decision: GET, then SET PX when admitted with cost > 0 (2 at most).
CHECK.fw = function(key, now, cost, limit, w, calendar)
  local now_ms = floor(now / 1000)
  local stored, count = nil, 0
  local v = get_string(key)
  if v then
    local s, c = string.match(v, '^f(%d+):(%d+)$')
    if s then
      stored, count = tonumber(s), tonumber(c)
      -- A clock behind the stored window stands at its start: nothing is refunded.
      if stored > now_ms then
        now_ms = stored
      end
    end
  end
  local start, finish = window_bounds(calendar, now_ms, w)
  if stored ~= start then
    count = 0
  end
  local left = finish - now_ms
  local function reset_of(c)
    if c > 0 then
      return left
    end
    return 0
  end
  if cost > limit then
    return too_costly(limit, math.max(0, limit - count), reset_of(count))
  end
  if count + cost > limit then
    return limited(limit, math.max(0, limit - count), left, reset_of(count))
  end
  local after = count + cost
  local d = allow(limit, limit - after, reset_of(after))
  if cost == 0 then
    return d
  end
  return d, function(pad)
    put_string(key, string.format('f%d:%d', start, after), left, pad)
  end
end
