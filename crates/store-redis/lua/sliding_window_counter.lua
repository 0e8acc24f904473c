-- sliding_window_counter.lua: sliding window counter (docs/algorithms.md,
-- sliding_window_counter.rs): the current aligned window plus the previous one weighted by
-- its overlap with the sliding window.
--
-- Item parameters: p1 = limit L, p2 = window W (ms). State: string `s<start>:<curr>:<prev>`.
-- Redis commands per decision: GET, then SET PX when admitted with cost > 0 (2 at most).
CHECK.swc = function(key, now, cost, limit, w)
  local now_ms = floor(now / 1000)
  local stored, sc, sp = nil, 0, 0
  local v = get_string(key)
  if v then
    local s, c, pr = string.match(v, '^s(%d+):(%d+):(%d+)$')
    if s then
      stored, sc, sp = tonumber(s), tonumber(c), tonumber(pr)
      -- A clock behind the stored window stands at its start: nothing is refunded.
      if stored > now_ms then
        now_ms = stored
      end
    end
  end
  local start = fdiv(now_ms, w) * w
  local e = now_ms - start
  local curr, prev = 0, 0
  if stored == start then
    curr, prev = sc, sp
  elseif stored == start - w then
    prev = sc
  end
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
    return too_costly(limit, remaining_of(estimate), reset_of(curr))
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
    return limited(limit, remaining_of(estimate), retry, reset_of(curr))
  end
  local after = curr + cost
  local reset = reset_of(after)
  local d = allow(limit, remaining_of(estimate + cost), reset)
  if cost == 0 then
    return d
  end
  return d, function(pad)
    put_string(key, string.format('s%d:%d:%d', start, after, prev), reset, pad)
  end
end
