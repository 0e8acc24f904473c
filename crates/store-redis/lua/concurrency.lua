-- concurrency.lua: concurrency leases (docs/algorithms.md, concurrency.rs).
--
-- Item parameters: p1 = limit N, p2 = lease timeout (ms); token = the lease id to take (made
-- unique by the client; `<id>#<cost>` when cost > 1). State: a sorted set, score = lease
-- expiry (ms), member = lease id. A lease is held while expiry > now_ms.
-- Redis commands per decision: ZRANGE (all leases), then when admitted with cost > 0:
-- ZREMRANGEBYRANK (only if some leases expired), ZADD, PEXPIRE (2 to 4).
-- Release (release.lua): ZSCORE, then when held: ZREM, ZREMRANGEBYSCORE, ZRANGE, PEXPIRE.
CHECK.cc = function(key, now, cost, limit, lease_ms, _, _, token)
  local now_ms = floor(now / 1000)
  local raw, wrong = zentries(key)
  local expired = 0
  local in_flight = 0
  local latest = nil
  local exps, costs = {}, {}
  for i = 1, #raw, 2 do
    local exp = tonumber(raw[i + 1])
    if exp <= now_ms then
      expired = expired + 1
    else
      local c = member_cost(raw[i])
      in_flight = in_flight + c
      exps[#exps + 1] = exp
      costs[#costs + 1] = c
      latest = exp
    end
  end
  local function reset_of(l)
    if l == nil then
      return 0
    end
    return l - now_ms
  end
  local function remaining_of(c)
    if c >= limit then
      return 0
    end
    return limit - c
  end
  if cost > limit then
    return too_costly(limit, remaining_of(in_flight), reset_of(latest))
  end
  if in_flight + cost > limit then
    -- The first lease, soonest expiry first, whose lapse frees enough (an upper bound: a
    -- release may free capacity sooner).
    local held, retry = in_flight, 0
    for i = 1, #exps do
      held = held - costs[i]
      if held + cost <= limit then
        retry = exps[i] - now_ms
        break
      end
    end
    return limited(limit, remaining_of(in_flight), retry, reset_of(latest))
  end
  if cost == 0 then
    return allow(limit, remaining_of(in_flight), reset_of(latest))
  end
  local exp = now_ms + lease_ms
  if latest == nil or exp > latest then
    latest = exp
  end
  local reset = reset_of(latest)
  local d = allow(limit, remaining_of(in_flight + cost), reset)
  return d, function(pad)
    if wrong then
      call('DEL', key)
    elseif expired > 0 then
      call('ZREMRANGEBYRANK', key, 0, expired - 1)
    end
    call('ZADD', key, exp, token)
    call('PEXPIRE', key, reset + pad)
  end
end
