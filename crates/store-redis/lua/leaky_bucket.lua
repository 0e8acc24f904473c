-- leaky_bucket.lua: leaky bucket, policing or shaping (docs/algorithms.md, leaky_bucket.rs).
--
-- Item parameters: p1 = capacity C, p2 = R, p3 = P (drain of R units per ms, one request of
-- cost 1 = P units), p4 = 1 for shaping, 0 for policing. State: string `l<level>:<last_ms>`.
-- Redis commands per decision: GET, then SET PX when admitted with cost > 0 (2 at most).
CHECK.lb = function(key, now, cost, cap, r, p, shaping)
  local full = cap * p
  local now_ms = floor(now / 1000)
  local level = 0
  local v = get_string(key)
  if v then
    local l, last = string.match(v, '^l(%d+):(%d+)$')
    if l then
      l, last = tonumber(l), tonumber(last)
      local elapsed = now_ms - last
      if elapsed < 0 then
        elapsed = 0
      end
      if elapsed < cdiv(l, r) then
        level = l - elapsed * r
      end
    end
  end
  if cost > cap then
    return too_costly(cap, fdiv(full - level, p), cdiv(level, r))
  end
  local need = cost * p
  if level + need > full then
    return limited(cap, fdiv(full - level, p), cdiv(level + need - full, r), cdiv(level, r))
  end
  local delay = 0
  if shaping == 1 then
    delay = cdiv(level, r)
  end
  local after = level + need
  local reset = cdiv(after, r)
  local d = allow(cap, fdiv(full - after, p), reset, delay)
  if cost == 0 then
    return d
  end
  return d, function(pad)
    put_string(key, string.format('l%d:%d', after, now_ms), reset, pad)
  end
end
