-- sliding_window_log.lua: exact sliding window log (docs/algorithms.md, sliding_window_log.rs).
--
-- Item parameters: p1 = limit L, p2 = window W (ms); token = a unique id for the new entry.
-- State: a sorted set, score = admission time (ms), member = `<token>` (cost 1) or
-- `<token>#<cost>`. An entry counts while now_ms - t < W.
-- Redis commands per decision: ZRANGE (all entries), then when admitted with cost > 0:
-- ZREMRANGEBYRANK (only if some entries expired), ZADD, PEXPIRE (2 to 4).
CHECK.swl = function(key, now, cost, limit, w, _, _, token)
  local now_ms = floor(now / 1000)
  local cutoff = now_ms - w
  local raw, wrong = zentries(key)
  local expired = 0
  local ts, cs = {}, {}
  local count = 0
  for i = 1, #raw, 2 do
    local t = tonumber(raw[i + 1])
    if t <= cutoff then
      expired = expired + 1
    else
      local c = member_cost(raw[i])
      ts[#ts + 1] = t
      cs[#cs + 1] = c
      count = count + c
    end
  end
  local newest = ts[#ts]
  local function reset_of(n)
    if n == nil then
      return 0
    end
    return n + w - now_ms
  end
  local function remaining_of(c)
    if c >= limit then
      return 0
    end
    return limit - c
  end
  if cost > limit then
    return too_costly(limit, remaining_of(count), reset_of(newest))
  end
  if count + cost > limit then
    local retry = 0
    local cum = 0
    for i = 1, #ts do
      cum = cum + cs[i]
      if count - cum + cost <= limit then
        retry = ts[i] + w - now_ms
        break
      end
    end
    return limited(limit, remaining_of(count), retry, reset_of(newest))
  end
  if cost == 0 then
    return allow(limit, remaining_of(count), reset_of(newest))
  end
  local n = now_ms
  if newest and newest > n then
    n = newest
  end
  local reset = reset_of(n)
  local d = allow(limit, remaining_of(count + cost), reset)
  return d, function(pad)
    if wrong then
      call('DEL', key)
    elseif expired > 0 then
      call('ZREMRANGEBYRANK', key, 0, expired - 1)
    end
    local m = token
    if cost > 1 then
      m = token .. '#' .. cost
    end
    call('ZADD', key, now_ms, m)
    call('PEXPIRE', key, reset + pad)
  end
end
