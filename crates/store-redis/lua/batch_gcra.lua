-- batch_gcra.lua: GCRA checks of one policy in one call (src/batch.rs; the formulas of
-- gcra.lua, its state through gcra_state and gcra_value of common.lua).
--
-- KEYS     = item keys (see batch_keys for the Cluster form)
-- ARGV[1]  = now in µs, or "" to read the server clock with TIME
-- ARGV[2]  = TTL padding in ms added to every write
-- ARGV[3], ARGV[4] = T (µs), burst (gcra.lua's p1, p2)
-- ARGV[5]  = 1 when every key is distinct, else 0 (see batch_keys)
-- ARGV[6]  = m, then m more item keys (Cluster form; 0 otherwise)
-- then the cost of each item, or nothing when every item costs 1
-- Returns 3 integers per item: verdict (0 admitted, n > 0 limited with retry after n ms,
-- -1 the cost exceeds the burst), remaining, reset_after_ms.
-- Redis commands per call: TIME, MGET (or one GET per item on a Cluster), one SET PX per
-- distinct key an admitted item of positive cost changed.
local function batch_gcra(keys, argv)
  local now = now_us(argv[1])
  local pad = tonumber(argv[2])
  local t, burst = tonumber(argv[3]), tonumber(argv[4])
  local items, distinct, at = batch_keys(keys, argv, 5)
  local vals = batch_reads(items)
  local costs = #argv >= at
  local tolerance = t * (burst + 1)
  local tat_of = {}
  local ttl_of = {}
  local order = {}
  local out = {}
  local o = 0
  for i = 1, #items do
    local key = items[i]
    local tat = nil
    if not distinct then
      tat = tat_of[key]
    end
    if tat == nil then
      tat = now
      local v = vals[i]
      if v then
        local x = gcra_state(v)
        if x then
          tat = x
        end
      end
    end
    local cost = 1
    if costs then
      cost = tonumber(argv[at + i - 1])
    end
    local increment = t * cost
    local base = tat
    if now > base then
      base = now
    end
    local new_tat = base + increment
    local diff = now - (new_tat - tolerance)
    if diff < 0 then
      local ttl = tat - now
      if ttl < 0 then
        ttl = 0
      end
      local nxt = tolerance - ttl
      local remaining = 0
      if nxt > 0 then
        remaining = bfdiv(nxt, t)
      end
      if increment <= tolerance then
        local retry = bcdiv(-diff, 1000)
        if retry < 1 then
          retry = 1
        end
        out[o + 1] = retry
      else
        out[o + 1] = -1
      end
      out[o + 2] = remaining
      out[o + 3] = bcdiv(ttl, 1000)
    else
      local ttl = new_tat - now
      local nxt = tolerance - ttl
      local remaining = 0
      if nxt > 0 then
        remaining = bfdiv(nxt, t)
      end
      local reset = bcdiv(ttl, 1000)
      out[o + 1] = 0
      out[o + 2] = remaining
      out[o + 3] = reset
      if cost > 0 then
        tat = new_tat
        if distinct then
          call('SET', key, gcra_value(tat), 'PX', reset + pad)
        else
          if ttl_of[key] == nil then
            order[#order + 1] = key
          end
          ttl_of[key] = reset
        end
      end
    end
    if not distinct then
      tat_of[key] = tat
    end
    o = o + 3
  end
  for j = 1, #order do
    local key = order[j]
    call('SET', key, gcra_value(tat_of[key]), 'PX', ttl_of[key] + pad)
  end
  return out
end
