-- adjust.lua: charge or refund one key without an admission check, the Lua form of
-- crates/core/src/algorithm/adjust.rs (docs/admin.md, "State, charge and refund").
--
-- KEYS[1]  = the state key
-- ARGV[1]  = now in µs, or "" to read the server clock with TIME
-- ARGV[2]  = TTL padding in ms (0 in production)
-- ARGV[3..9] = the item as a check sends it: code, cost, p1, p2, p3, p4, token (a unique id,
--            for the sliding log's new entry)
-- ARGV[10] = 'charge' (consume without a check, into debt as far as the state can express) or
--            'refund' (give back, never beyond the capacity)
-- Returns the 7 integers of a check of cost 0 after the change (see check.lua). A concurrency
-- limit (or an unknown code) is an error reply: a lease is taken by a check, given back by a
-- release.
local MAX_EXACT = 9007199254740992

-- ADJUST[code](key, now, charge, cost, pad, p1, p2, p3, p4, token) writes the new state.
local ADJUST = {}

local function capped(x)
  if x > MAX_EXACT then
    return MAX_EXACT
  end
  return x
end

-- Each state is read at `now` by the same reader its check step uses (tb_tokens, gcra_tat,
-- lb_level, fw_window, swc_window), so the refill and window formulas are written once.
ADJUST.tb = function(key, now, charge, cost, pad, cap, r, p)
  local full = cap * p
  local now_ms = floor(now / 1000)
  local tokens = tb_tokens(get_string(key), now_ms, full, r)
  local left
  if charge then
    left = math.max(0, tokens - cost * p)
  else
    left = math.min(full, tokens + cost * p)
  end
  if left == full then
    call('DEL', key)
  else
    put_string(key, tb_value(left, now_ms), cdiv(full - left, r), pad)
  end
end

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

-- A window count after a charge (capped below 2^53) or a refund (never below zero).
local function moved_count(count, charge, cost)
  if charge then
    return capped(count + cost)
  end
  return math.max(0, count - cost)
end

ADJUST.fw = function(key, now, charge, cost, pad, _, w, calendar)
  local now_ms, start, finish, count = fw_window(get_string(key), floor(now / 1000), w, calendar)
  count = moved_count(count, charge, cost)
  if count == 0 then
    call('DEL', key)
  else
    put_string(key, fw_value(start, count), finish - now_ms, pad)
  end
end

ADJUST.swc = function(key, now, charge, cost, pad, _, w)
  local now_ms, start, curr, prev = swc_window(get_string(key), floor(now / 1000), w)
  curr = moved_count(curr, charge, cost)
  if curr == 0 and prev == 0 then
    call('DEL', key)
  else
    put_string(key, swc_value(start, curr, prev), start + 2 * w - now_ms, pad)
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

local function adjust(keys, argv)
  local now = now_us(argv[1])
  local pad = tonumber(argv[2])
  local code = argv[3]
  local f = ADJUST[code]
  if f == nil then
    if code == 'cc' then
      return redis.error_reply(
        'sluice: a concurrency limit cannot be charged or refunded: a check takes a lease and a release gives it back')
    end
    return unknown_algorithm(argv, 1)
  end
  local charge = argv[10] == 'charge'
  f(keys[1], now, charge, tonumber(argv[4]), pad, tonumber(argv[5]), tonumber(argv[6]),
    tonumber(argv[7]), tonumber(argv[8]), argv[9])
  local d = check_item(keys, argv, 1, now, 0)
  return d
end
