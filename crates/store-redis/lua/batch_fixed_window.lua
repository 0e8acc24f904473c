-- batch_fixed_window.lua: fixed-window checks of one policy in one call (src/batch.rs; the
-- formulas and state `f<window_start>:<count>` of fixed_window.lua, calendar windows included).
--
-- KEYS     = item keys (see batch_keys for the Cluster form)
-- ARGV[1]  = now in µs, or "" to read the server clock with TIME
-- ARGV[2]  = TTL padding in ms added to every write
-- ARGV[3], ARGV[4], ARGV[5] = L, W (ms), calendar period (fixed_window.lua's p1, p2, p3)
-- ARGV[6]  = 1 when every key is distinct, else 0 (see batch_keys)
-- ARGV[7]  = m, then m more item keys (Cluster form; 0 otherwise)
-- then the cost of each item, or nothing when every item costs 1
-- Returns 3 integers per item: verdict (0 admitted, n > 0 limited with retry after n ms,
-- -1 the cost exceeds the limit), remaining, reset_after_ms.
-- Redis commands per call: TIME, MGET (or one GET per item on a Cluster), one SET PX per
-- distinct key an admitted item of positive cost changed.
local function batch_fixed_window(keys, argv)
  local now0 = floor(now_us(argv[1]) / 1000)
  local pad = tonumber(argv[2])
  local limit, w, calendar = tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5])
  local items, distinct, at = batch_keys(keys, argv, 6)
  local vals = batch_reads(items)
  local costs = #argv >= at
  local match = string.match
  -- Per key: the stored window start (false: none) and count, as the batch left them.
  local start_of = {}
  local count_of = {}
  local ttl_of = {}
  local order = {}
  local out = {}
  local o = 0
  for i = 1, #items do
    local key = items[i]
    local stored = nil
    if not distinct then
      stored = start_of[key]
    end
    local count
    if stored == nil then
      stored, count = false, 0
      local v = vals[i]
      if v then
        local s, c = match(v, '^f(%d+):(%d+)$')
        if s then
          stored, count = tonumber(s), tonumber(c)
        end
      end
    else
      count = count_of[key]
    end
    local now_ms = now0
    -- A clock behind the stored window stands at its start: nothing is refunded.
    if stored and stored > now_ms then
      now_ms = stored
    end
    local start, finish = window_bounds(calendar, now_ms, w)
    if stored ~= start then
      count = 0
    end
    local left = finish - now_ms
    local cost = 1
    if costs then
      cost = tonumber(argv[at + i - 1])
    end
    local remaining = limit - count
    if remaining < 0 then
      remaining = 0
    end
    local reset = 0
    if count > 0 then
      reset = left
    end
    if cost > limit then
      out[o + 1] = -1
      out[o + 2] = remaining
      out[o + 3] = reset
    elseif count + cost > limit then
      local retry = left
      if retry < 1 then
        retry = 1
      end
      out[o + 1] = retry
      out[o + 2] = remaining
      out[o + 3] = reset
    else
      local after = count + cost
      if after > 0 then
        reset = left
      else
        reset = 0
      end
      out[o + 1] = 0
      out[o + 2] = limit - after
      out[o + 3] = reset
      if cost > 0 then
        stored, count = start, after
        if distinct then
          call('SET', key, string.format('f%d:%d', start, after), 'PX', left + pad)
        else
          if ttl_of[key] == nil then
            order[#order + 1] = key
          end
          ttl_of[key] = left
        end
      end
    end
    if not distinct then
      start_of[key] = stored
      count_of[key] = count
    end
    o = o + 3
  end
  for j = 1, #order do
    local key = order[j]
    call('SET', key, string.format('f%d:%d', start_of[key], count_of[key]), 'PX',
      ttl_of[key] + pad)
  end
  return out
end
