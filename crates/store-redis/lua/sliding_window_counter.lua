-- sliding_window_counter.lua: sliding window counter (docs/algorithms.md,
-- sliding_window_counter.rs): the current aligned window plus the previous one weighted by
-- its overlap with the sliding window.
--
-- Item parameters: p1 = limit L, p2 = window W (ms). State: string `s<start>:<curr>:<prev>`.
-- Redis commands per decision: GET, then SET PX when admitted with cost > 0 (2 at most).

-- The windows of stored value v at now_ms: the time they are judged at (a clock behind the
-- stored window stands at its start, so nothing is refunded), the current window's start and
-- the counts of the current and the previous window.
local function swc_window(v, now_ms, w)
  local stored, sc, sp = nil, 0, 0
  if v then
    local s, c, pr = string.match(v, '^s(%d+):(%d+):(%d+)$')
    if s then
      stored, sc, sp = tonumber(s), tonumber(c), tonumber(pr)
      if stored > now_ms then
        now_ms = stored
      end
    end
  end
  local start = fdiv(now_ms, w) * w
  local curr, prev = 0, 0
  if stored == start then
    curr, prev = sc, sp
  elseif stored == start - w then
    prev = sc
  end
  return now_ms, start, curr, prev
end

local function swc_value(start, curr, prev)
  return string.format('s%d:%d:%d', start, curr, prev)
end

STEP.swc = function(v, now, cost, limit, w)
  local now_ms, start, curr, prev = swc_window(v, floor(now / 1000), w)
  local e = now_ms - start
  local weighted = fdiv(prev * (w - e), w)
  local estimate = weighted + curr
  local function reset_of(cu)
    if cu > 0 then
      return start + 2 * w - now_ms
    elseif prev > 0 then
      return start + w - now_ms
    end
    return 0
  end
  local function remaining_of(est)
    if est >= limit then
      return 0
    end
    return limit - est
  end
  if cost > limit then
    return -1, limit, remaining_of(estimate), reset_of(curr), 0
  end
  if estimate + cost > limit then
    local retry
    local a = limit - curr - cost
    if a >= 0 then
      local x = cdiv((a + 1) * w, prev) - 1
      retry = (w - x) - e
    else
      local b = limit - cost
      local x = cdiv((b + 1) * w, curr) - 1
      local extra = w - x
      if extra < 0 then
        extra = 0
      end
      retry = (w - e) + extra
    end
    return retry_of(retry), limit, remaining_of(estimate), reset_of(curr), 0
  end
  local after = curr + cost
  local reset = reset_of(after)
  if cost == 0 then
    return 0, limit, remaining_of(estimate + cost), reset, 0
  end
  return 0, limit, remaining_of(estimate + cost), reset, 0, swc_value(start, after, prev), reset
end
CHECK.swc = check_of(STEP.swc)

ADJUST.swc = function(key, now, charge, cost, pad, _, w)
  local now_ms, start, curr, prev = swc_window(get_string(key), floor(now / 1000), w)
  curr = moved_count(curr, charge, cost)
  if curr == 0 and prev == 0 then
    call('DEL', key)
  else
    put_string(key, swc_value(start, curr, prev), start + 2 * w - now_ms, pad)
  end
end
