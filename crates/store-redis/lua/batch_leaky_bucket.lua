-- batch_leaky_bucket.lua: leaky-bucket checks of one policy in one call (src/batch.rs; the
-- formulas and state `l<level>:<last_ms>` of leaky_bucket.lua).
--
-- KEYS     = item keys (see batch_keys for the Cluster form)
-- ARGV[1]  = now in µs, or "" to read the server clock with TIME
-- ARGV[2]  = TTL padding in ms added to every write
-- ARGV[3..6] = C, R, P, shaping (leaky_bucket.lua's p1..p4)
-- ARGV[7]  = 1 when every key is distinct, else 0 (see batch_keys)
-- ARGV[8]  = m, then m more item keys (Cluster form; 0 otherwise)
-- then the cost of each item, or nothing when every item costs 1
-- Returns 4 integers per item: verdict (0 admitted, n > 0 limited with retry after n ms,
-- -1 the cost exceeds the capacity), remaining, reset_after_ms, delay_ms.
-- Redis commands per call: TIME, MGET (or one GET per item on a Cluster), one SET PX per
-- distinct key an admitted item of positive cost changed.
local function batch_leaky_bucket(keys, argv)
  local now_ms = floor(now_us(argv[1]) / 1000)
  local pad = tonumber(argv[2])
  local cap, r, p = tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5])
  local shaping = tonumber(argv[6]) == 1
  local items, distinct, at = batch_keys(keys, argv, 7)
  local vals = batch_reads(items)
  local costs = #argv >= at
  local full = cap * p
  local match = string.match
  local level_of = {}
  local ttl_of = {}
  local order = {}
  local out = {}
  local o = 0
  for i = 1, #items do
    local key = items[i]
    local level = nil
    if not distinct then
      level = level_of[key]
    end
    if level == nil then
      level = 0
      local v = vals[i]
      if v then
        local l, last = match(v, '^l(%d+):(%d+)$')
        if l then
          l, last = tonumber(l), tonumber(last)
          local elapsed = now_ms - last
          if elapsed < 0 then
            elapsed = 0
          end
          if elapsed < bcdiv(l, r) then
            level = l - elapsed * r
          end
        end
      end
    end
    local cost = 1
    if costs then
      cost = tonumber(argv[at + i - 1])
    end
    local need = cost * p
    if cost > cap then
      out[o + 1] = -1
      out[o + 2] = bfdiv(full - level, p)
      out[o + 3] = bcdiv(level, r)
      out[o + 4] = 0
    elseif level + need > full then
      local retry = bcdiv(level + need - full, r)
      if retry < 1 then
        retry = 1
      end
      out[o + 1] = retry
      out[o + 2] = bfdiv(full - level, p)
      out[o + 3] = bcdiv(level, r)
      out[o + 4] = 0
    else
      local delay = 0
      if shaping then
        delay = bcdiv(level, r)
      end
      local after = level + need
      local reset = bcdiv(after, r)
      out[o + 1] = 0
      out[o + 2] = bfdiv(full - after, p)
      out[o + 3] = reset
      out[o + 4] = delay
      if cost > 0 then
        level = after
        if distinct then
          call('SET', key, string.format('l%d:%d', level, now_ms), 'PX', reset + pad)
        else
          if ttl_of[key] == nil then
            order[#order + 1] = key
          end
          ttl_of[key] = reset
        end
      end
    end
    if not distinct then
      level_of[key] = level
    end
    o = o + 4
  end
  for j = 1, #order do
    local key = order[j]
    call('SET', key, string.format('l%d:%d', level_of[key], now_ms), 'PX', ttl_of[key] + pad)
  end
  return out
end
