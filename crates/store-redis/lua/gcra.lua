-- gcra.lua: GCRA, redis-cell's CL.THROTTLE in microseconds (docs/algorithms.md, gcra.rs).
--
-- Item parameters: p1 = emission interval T (µs, >= 1), p2 = burst. State: string, the TAT in µs
-- (gcra_state, gcra_value).
-- Redis commands per decision: GET, then SET PX when admitted with cost > 0 (2 at most).
CHECK.gcra = function(key, now, cost, t, burst)
  local tolerance = t * (burst + 1)
  local increment = t * cost
  local tat = now
  local v = get_string(key)
  if v then
    local x = gcra_state(v)
    if x then
      tat = x
    end
  end
  local base = tat
  if now > base then
    base = now
  end
  local new_tat = base + increment
  local diff = now - (new_tat - tolerance)
  local limit = burst + 1
  local ttl
  local d
  if diff < 0 then
    ttl = tat - now
    if ttl < 0 then
      ttl = 0
    end
    local nxt = tolerance - ttl
    local remaining = 0
    if nxt > 0 then
      remaining = fdiv(nxt, t)
    end
    if increment <= tolerance then
      return limited(limit, remaining, cdiv(-diff, 1000), cdiv(ttl, 1000))
    end
    return too_costly(limit, remaining, cdiv(ttl, 1000))
  end
  ttl = new_tat - now
  local nxt = tolerance - ttl
  local remaining = 0
  if nxt > 0 then
    remaining = fdiv(nxt, t)
  end
  d = allow(limit, remaining, cdiv(ttl, 1000))
  if cost == 0 then
    return d
  end
  return d, function(pad)
    put_string(key, gcra_value(new_tat), cdiv(ttl, 1000), pad)
  end
end
