-- common.lua: helpers shared by every sluice script (prepended to each of them).
--
-- Integer arithmetic on Lua doubles: every value sluice passes is below 2^53, where doubles
-- are exact; divisions are corrected to the exact floor/ceil. Values are written with %d so
-- no precision is lost to Lua's default %.14g formatting.
--
-- math.floor, struct.pack and struct.unpack as upvalues: a global and a field lookup less on
-- each use, ~3% of a batched decision's instructions (callgrind). A function library cannot
-- reach `math` or `struct` while it loads, so every entry point (check, batch, batch_step,
-- release, adjust) calls bind_libs first, at call time.
local M_FLOOR, S_PACK, S_UNPACK
local function bind_libs()
  M_FLOOR, S_PACK, S_UNPACK = math.floor, struct.pack, struct.unpack
end

local function floor(x)
  return M_FLOOR(x)
end
-- Looked up at call time: a function library cannot reach redis.call or math while it loads.
local function call(...)
  return redis.call(...)
end
local function pcall_(...)
  return redis.pcall(...)
end

-- Exact floor(a / b) for 0 <= a < 2^53, b >= 1; free when b = 1 (a rate reduced to one unit
-- per ms), and M_FLOOR called directly: the divisions are most of a decision's own Lua.
local function fdiv(a, b)
  if b == 1 then
    return a
  end
  local q = M_FLOOR(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- Exact ceil(a / b) for 0 <= a < 2^53, b >= 1.
local function cdiv(a, b)
  if b == 1 then
    return a
  end
  local q = fdiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- Calendar windows (crates/core/src/algorithm/calendar.rs): days since 1970-01-01 of the
-- date y-m-d, and the date of a day number, for the proleptic Gregorian calendar. Every value
-- is a non-negative integer far below 2^53, so the double arithmetic is exact.
local DAY_MS = 86400000

local function days_from_civil(y, m, d)
  if m <= 2 then
    y = y - 1
  end
  local era = fdiv(y, 400)
  local yoe = y - era * 400
  local doy = fdiv(153 * ((m + 9) % 12) + 2, 5) + d - 1
  local doe = yoe * 365 + fdiv(yoe, 4) - fdiv(yoe, 100) + doy
  return era * 146097 + doe - 719468
end

local function civil_from_days(days)
  local z = days + 719468
  local era = fdiv(z, 146097)
  local doe = z - era * 146097
  local yoe = fdiv(doe - fdiv(doe, 1460) + fdiv(doe, 36524) - fdiv(doe, 146096), 365)
  local doy = doe - (365 * yoe + fdiv(yoe, 4) - fdiv(yoe, 100))
  local mp = fdiv(5 * doy + 2, 153)
  local d = doy - fdiv(153 * mp + 2, 5) + 1
  local m = mp + 3
  if mp >= 10 then
    m = mp - 9
  end
  local y = yoe + era * 400
  if m <= 2 then
    y = y + 1
  end
  return y, m, d
end

-- [start, end) in ms of the window holding now_ms: epoch-aligned windows of w ms when
-- `calendar` is 0, else the UTC day (1), ISO week from Monday (2) or month (3).
local function window_bounds(calendar, now_ms, w)
  if calendar == 1 or calendar == 2 or calendar == 3 then
    local day = fdiv(now_ms, DAY_MS)
    local s, e
    if calendar == 1 then
      s, e = day, day + 1
    elseif calendar == 2 then
      -- 1970-01-01 was a Thursday: Monday-based weekday = (day + 3) mod 7.
      s = day - (day + 3) % 7
      e = s + 7
    else
      local y, m = civil_from_days(day)
      s = days_from_civil(y, m, 1)
      if m == 12 then
        e = days_from_civil(y + 1, 1, 1)
      else
        e = days_from_civil(y, m + 1, 1)
      end
    end
    return s * DAY_MS, e * DAY_MS
  end
  local s = fdiv(now_ms, w) * w
  return s, s + w
end

-- The value of a string key, or nil when it is missing or holds another type (a policy that
-- changed algorithm): a state of another algorithm is treated as absent.
local function get_string(key)
  local v = pcall_('GET', key)
  if type(v) == 'string' then
    return v
  end
  return nil
end

-- Writes a string state with a TTL (ms, at least 1) padded by `pad` (test clocks only).
local function put_string(key, value, ttl_ms, pad)
  call('SET', key, value, 'PX', ttl_ms + pad)
end

-- The entries of a sorted-set state as {member, score} pairs (flat list), or nil and true when
-- the key holds another type (it is then replaced on write).
local function zentries(key)
  local v = pcall_('ZRANGE', key, 0, -1, 'WITHSCORES')
  if type(v) == 'table' and v.err == nil then
    return v, false
  end
  return {}, true
end

-- The cost encoded in a log entry or lease member: `<id>#<cost>` for cost > 1, `<id>` for 1.
local function member_cost(m)
  local c = string.match(m, '#(%d+)$')
  if c then
    return tonumber(c)
  end
  return 1
end

-- Decision rows: {allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms, reason}
-- reason: 0 none, 1 limited, 2 cost exceeds limit.
local function allow(limit, remaining, reset, delay)
  return { 1, limit, remaining, 0, reset, delay or 0, 0 }
end
local function limited(limit, remaining, retry, reset)
  if retry < 1 then
    retry = 1
  end
  return { 0, limit, remaining, retry, reset, 0, 1 }
end
local function too_costly(limit, remaining, reset)
  return { 0, limit, remaining, 0, reset, 0, 2 }
end

-- The time of the call in µs since the epoch: `given` (ARGV[1]) when a test clock passes it,
-- else the server's own clock (TIME), so every caller of the store agrees on it.
local function now_us(given)
  if given == '' then
    local t = call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return tonumber(given)
end

-- Algorithms register here under their code (sluice_core::algorithm::registry):
-- CHECK[code](key, now_us, cost, p1, p2, p3, p4, token) returns a decision row and, when the
-- decision writes, a function(pad) doing the write.
local CHECK = {}

-- The algorithms whose state is one string (the registry's `step`) register their decision
-- here instead, as a step with no Redis command of its own:
--   STEP[code](v, now_us, cost, p1, p2, p3, p4)
-- where v is the stored value (nil or false when absent or of another type), returns
--   verdict (0 admitted, n > 0 limited with retry after n ms, -1 the cost exceeds the limit),
--   limit, remaining, reset_after_ms, delay_ms,
-- and, when the admission changes the state, the value to write and its TTL in ms. The
-- one-key check (check_of below), the one-policy batch loop (batch_step.lua) and charge and
-- refund (adjust.lua, through the same state readers) all run these, so each algorithm's
-- formula is written once.
local STEP = {}

-- Charge and refund (adjust.lua; crates/core/src/algorithm/adjust.rs): every algorithm but
-- concurrency registers ADJUST[code](key, now, charge, cost, pad, p1, p2, p3, p4, token),
-- which writes the state after consuming `cost` without a check (`charge`) or giving it back.
-- Each reads the state with the reader its check step uses, so the formulas are written once.
local ADJUST = {}

-- The largest integer a double holds exactly: a charge never takes a count beyond it.
local MAX_EXACT = 9007199254740992

local function capped(x)
  if x > MAX_EXACT then
    return MAX_EXACT
  end
  return x
end

-- A window count after a charge (capped below 2^53) or a refund (never below zero).
local function moved_count(count, charge, cost)
  if charge then
    return capped(count + cost)
  end
  return math.max(0, count - cost)
end

-- A limited verdict: the retry, at least 1 ms (0 is the admitted verdict).
local function retry_of(ms)
  if ms < 1 then
    return 1
  end
  return ms
end

-- The CHECK entry of a step: one GET, the step, and the SET it asks for.
local function check_of(step)
  return function(key, now, cost, p1, p2, p3, p4)
    local verdict, limit, remaining, reset, delay, value, ttl =
      step(get_string(key), now, cost, p1, p2, p3, p4)
    if verdict < 0 then
      return too_costly(limit, remaining, reset)
    elseif verdict > 0 then
      return limited(limit, remaining, verdict, reset)
    end
    local d = allow(limit, remaining, reset, delay)
    if value then
      return d, function(pad)
        put_string(key, value, ttl, pad)
      end
    end
    return d
  end
end

-- The 7 arguments of item i start here: code, cost, p1, p2, p3, p4, token.
local function item_base(i)
  return 3 + 7 * (i - 1)
end

-- Decides item i at `now`, at `cost` (nil: the item's own cost): a decision row and the write
-- (or nil). Returns nil alone for an unknown code (see unknown_algorithm).
local function check_item(keys, argv, i, now, cost)
  local b = item_base(i)
  local f = CHECK[argv[b]]
  if f == nil then
    return nil
  end
  if cost == nil then
    cost = tonumber(argv[b + 1])
  end
  return f(keys[i], now, cost, tonumber(argv[b + 2]), tonumber(argv[b + 3]), tonumber(argv[b + 4]),
    tonumber(argv[b + 5]), argv[b + 6])
end

-- The error reply for item i's unknown code.
local function unknown_algorithm(argv, i)
  return redis.error_reply('sluice: unknown algorithm ' .. tostring(argv[item_base(i)]))
end
