-- gcra.lua: GCRA, redis-cell's CL.THROTTLE in microseconds (docs/algorithms.md, gcra.rs).
--
-- Item parameters: p1 = emission interval T (µs, >= 1), p2 = burst. State: string, the TAT in µs
-- (gcra_state, gcra_value).
-- Redis commands per decision: GET, then SET PX when admitted with cost > 0 (2 at most).

-- GCRA's state (docs/redis.md, "State encoding"), packed: the byte 'G' and one little-endian
-- double, the TAT in µs; the text form `g<tat_us>` of earlier versions is still read.
local GCRA_TAG = 71

-- The TAT (µs) of a stored GCRA value, or nil (another algorithm's state).
local function gcra_state(v)
  if #v == 9 then
    local tag, tat = S_UNPACK('<Bd', v)
    if tag == GCRA_TAG then
      return tat
    end
  end
  local x = string.match(v, '^g(%d+)$')
  if x then
    return tonumber(x)
  end
  return nil
end

local function gcra_value(tat)
  return S_PACK('<Bd', GCRA_TAG, tat)
end

-- The TAT (µs) of stored value v at `now`: never before `now` (a TAT in the past, or none,
-- is the bucket at rest).
local function gcra_tat(v, now)
  if v then
    local x = gcra_state(v)
    if x and x > now then
      return x
    end
  end
  return now
end

-- Requests that would still conform `ttl` µs before the TAT reaches the tolerance.
local function gcra_remaining(tolerance, ttl, t)
  local nxt = tolerance - ttl
  if nxt > 0 then
    return fdiv(nxt, t)
  end
  return 0
end

STEP.gcra = function(v, now, cost, t, burst)
  local tolerance = t * (burst + 1)
  local increment = t * cost
  local tat = gcra_tat(v, now)
  local new_tat = tat + increment
  local diff = now - (new_tat - tolerance)
  local limit = burst + 1
  if diff < 0 then
    local ttl = tat - now
    local remaining = gcra_remaining(tolerance, ttl, t)
    if increment <= tolerance then
      return retry_of(cdiv(-diff, 1000)), limit, remaining, cdiv(ttl, 1000), 0
    end
    return -1, limit, remaining, cdiv(ttl, 1000), 0
  end
  local ttl = new_tat - now
  local reset = cdiv(ttl, 1000)
  local remaining = gcra_remaining(tolerance, ttl, t)
  if cost == 0 then
    return 0, limit, remaining, reset, 0
  end
  return 0, limit, remaining, reset, 0, gcra_value(new_tat), reset
end
CHECK.gcra = check_of(STEP.gcra)

ADJUST.gcra = function(key, now, charge, cost, pad, t)
  local tat = gcra_tat(get_string(key), now)
  if charge then
    tat = capped(tat + t * cost)
  else
    tat = math.max(now, tat - t * cost)
  end
  if tat <= now then
    call('DEL', key)
  else
    put_string(key, gcra_value(tat), cdiv(tat - now, 1000), pad)
  end
end
