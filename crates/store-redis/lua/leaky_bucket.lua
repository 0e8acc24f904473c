-- leaky_bucket.lua: leaky bucket, policing or shaping (docs/algorithms.md, leaky_bucket.rs).
--
-- Item parameters: p1 = capacity C, p2 = R, p3 = P (drain of R units per ms, one request of
-- cost 1 = P units), p4 = 1 for shaping, 0 for policing. State: string `l<level>:<last_ms>`.
-- Redis commands per decision: GET, then SET PX when admitted with cost > 0 (2 at most).

-- The level (units) of stored value v at now_ms, drained at r units per ms; 0 when absent.
local function lb_level(v, now_ms, r)
  if v then
    local l, last = string.match(v, '^l(%d+):(%d+)$')
    if l then
      l, last = tonumber(l), tonumber(last)
      local elapsed = now_ms - last
      if elapsed < 0 then
        elapsed = 0
      end
      if elapsed < cdiv(l, r) then
        return l - elapsed * r
      end
    end
  end
  return 0
end

local function lb_value(level, now_ms)
  return string.format('l%d:%d', level, now_ms)
end

STEP.lb = function(v, now, cost, cap, r, p, shaping)
  local full = cap * p
  local now_ms = floor(now / 1000)
  local level = lb_level(v, now_ms, r)
  if cost > cap then
    return -1, cap, fdiv(full - level, p), cdiv(level, r), 0
  end
  local need = cost * p
  if level + need > full then
    return retry_of(cdiv(level + need - full, r)), cap, fdiv(full - level, p), cdiv(level, r), 0
  end
  local delay = 0
  if shaping == 1 then
    delay = cdiv(level, r)
  end
  local after = level + need
  local reset = cdiv(after, r)
  if cost == 0 then
    return 0, cap, fdiv(full - after, p), reset, delay
  end
  return 0, cap, fdiv(full - after, p), reset, delay, lb_value(after, now_ms), reset
end
CHECK.lb = check_of(STEP.lb)

ADJUST.lb = function(key, now, charge, cost, pad, _, r, p)
  local now_ms = floor(now / 1000)
  local level = lb_level(get_string(key), now_ms, r)
  if charge then
    level = capped(level + cost * p)
  else
    level = math.max(0, level - cost * p)
  end
  if level == 0 then
    call('DEL', key)
  else
    put_string(key, lb_value(level, now_ms), cdiv(level, r), pad)
  end
end
