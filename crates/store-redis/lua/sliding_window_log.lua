-- sliding_window_log.lua: exact sliding window log (docs/algorithms.md, sliding_window_log.rs).
--
-- Item parameters: p1 = limit L, p2 = window W (ms); token = a unique id for the new entry.
-- State: a sorted set, score = admission time (ms), member = `<token>` (cost 1) or
-- `<token>#<cost>`. An entry counts while now_ms - t < W. While the set holds an entry of
-- cost > 1 it also holds the member LOG_MULTI_COST at score +inf.
--
-- Why the marker: when every entry costs 1, the count is the number of entries, which Redis
-- counts (ZCOUNT over the window) without sending them, so a check fetches at most two
-- entries (the newest, for reset_after_ms; on a denial the one whose expiry makes room, for
-- retry_after_ms) and costs O(log n) in the n entries of the window instead of O(n). The
-- marker says when the costs must be summed from the members instead (the log is read
-- whole, as before); it sorts last, where the newest-entry read sees it for free.
-- Redis commands per decision, all cost 1: ZCOUNT, ZRANGE (newest; skipped on an empty
-- window), and when denied ZRANGEBYSCORE (one entry); when admitted with cost > 0:
-- ZREMRANGEBYSCORE (expired entries), ZADD, PEXPIRE (2 to 5). With the marker: ZCOUNT, ZRANGE
-- (newest), ZRANGE (all), then when admitted ZREMRANGEBYSCORE, ZADD, ZREM (the marker, once no
-- entry of cost > 1 is left), PEXPIRE.
local LOG_MULTI_COST = '~cost>1'

-- The live part of a log (entries with t > cutoff): {count, newest (nil when empty), wrong
-- (the key holds another type), ts and cs (times and costs oldest first; only when read
-- whole), multi (whether a live entry costs more than 1; only when read whole)}.
local function log_read(key, cutoff)
  local live = '(' .. cutoff
  local c = pcall_('ZCOUNT', key, live, '+inf')
  if type(c) ~= 'number' then
    return { count = 0, wrong = true }
  end
  if c == 0 then
    return { count = 0 }
  end
  local last = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[1] ~= LOG_MULTI_COST then
    return { count = c, newest = tonumber(last[2]) }
  end
  local raw = call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local log = { count = 0, ts = {}, cs = {}, multi = false }
  for i = 1, #raw - 2, 2 do
    local t = tonumber(raw[i + 1])
    if t > cutoff then
      local cost = member_cost(raw[i])
      log.ts[#log.ts + 1] = t
      log.cs[#log.cs + 1] = cost
      log.count = log.count + cost
      log.newest = t
      if cost > 1 then
        log.multi = true
      end
    end
  end
  return log
end

-- The time of the entry whose expiry first leaves room for `cost` (count + cost > limit).
local function log_room_at(key, cutoff, log, cost, limit)
  if log.ts == nil then
    -- Every entry costs 1: the k-th to leave frees k, so it is the (count + cost - limit)-th
    -- live entry, oldest first (1 <= that <= count as cost <= limit).
    local e = call('ZRANGEBYSCORE', key, '(' .. cutoff, '+inf', 'WITHSCORES', 'LIMIT',
      log.count + cost - limit - 1, 1)
    return tonumber(e[2])
  end
  local cum = 0
  for i = 1, #log.ts do
    cum = cum + log.cs[i]
    if log.count - cum + cost <= limit then
      return log.ts[i]
    end
  end
  return nil
end

CHECK.swl = function(key, now, cost, limit, w, _, _, token)
  local now_ms = floor(now / 1000)
  local cutoff = now_ms - w
  local log = log_read(key, cutoff)
  local count, newest = log.count, log.newest
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
    local t = log_room_at(key, cutoff, log, cost, limit)
    if t then
      retry = t + w - now_ms
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
    if log.wrong then
      call('DEL', key)
    elseif newest or log.ts then
      call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    else
      -- Nothing live: whatever the key holds has expired.
      call('DEL', key)
    end
    if cost > 1 then
      call('ZADD', key, now_ms, token .. '#' .. cost, '+inf', LOG_MULTI_COST)
    else
      call('ZADD', key, now_ms, token)
      if log.ts and not log.multi then
        call('ZREM', key, LOG_MULTI_COST)
      end
    end
    call('PEXPIRE', key, reset + pad)
  end
end

-- The member of a log entry of `cost` under the unique `id` (see member_cost).
local function log_member(id, cost)
  if cost > 1 then
    return id .. '#' .. cost
  end
  return id
end

-- Writes a log entry; one of cost > 1 also sets the marker (sliding_window_log.lua).
local function log_add(key, t, id, cost)
  if cost > 1 then
    call('ZADD', key, t, log_member(id, cost), '+inf', LOG_MULTI_COST)
  else
    call('ZADD', key, t, id)
  end
end

-- The log is read whole here (a charge or refund is rare); the marker, sorting last at +inf,
-- is never taken for an entry.
ADJUST.swl = function(key, now, charge, cost, pad, _, w, _, _, token)
  local now_ms = floor(now / 1000)
  local cutoff = now_ms - w
  local _, wrong = zentries(key)
  if wrong then
    call('DEL', key)
  end
  call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
  if charge then
    if cost > 0 then
      log_add(key, now_ms, token, cost)
    end
  else
    -- Newest first: ZRANGE lists by ascending score.
    local live = call('ZRANGE', key, 0, -1, 'WITHSCORES')
    local left = cost
    local i = #live - 1
    while left > 0 and i >= 1 do
      local m, t = live[i], live[i + 1]
      if m ~= LOG_MULTI_COST then
        local c = member_cost(m)
        call('ZREM', key, m)
        if c > left then
          log_add(key, t, token, c - left)
          left = 0
        else
          left = left - c
        end
      end
      i = i - 2
    end
  end
  local last = call('ZREVRANGEBYSCORE', key, '(+inf', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if last[2] then
    call('PEXPIRE', key, tonumber(last[2]) + w - now_ms + pad)
  else
    -- No entry left (the marker alone, at most).
    call('DEL', key)
  end
end
