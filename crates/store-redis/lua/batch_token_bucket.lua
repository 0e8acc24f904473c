-- batch_token_bucket.lua: token-bucket checks of one policy in one call (src/batch.rs; the
-- formulas of token_bucket.lua, its state through tb_state and tb_value of common.lua).
--
-- KEYS     = item keys (see batch_keys for the Cluster form)
-- ARGV[1]  = now in µs, or "" to read the server clock with TIME
-- ARGV[2]  = TTL padding in ms added to every write
-- ARGV[3], ARGV[4], ARGV[5] = C, R, P (token_bucket.lua's p1, p2, p3)
-- ARGV[6]  = 1 when every key is distinct, else 0 (see batch_keys)
-- ARGV[7]  = m, then m more item keys (Cluster form; 0 otherwise)
-- then the cost of each item, or nothing when every item costs 1
-- Returns 3 integers per item: verdict (0 admitted, n > 0 limited with retry after n ms,
-- -1 the cost exceeds the capacity), remaining, reset_after_ms.
-- Redis commands per call: TIME, MGET (or one GET per item on a Cluster), one SET PX per
-- distinct key an admitted item of positive cost changed.
local function batch_token_bucket(keys, argv)
  local now_ms = floor(now_us(argv[1]) / 1000)
  local pad = tonumber(argv[2])
  local cap, r, p = tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5])
  local items, distinct, at = batch_keys(keys, argv, 6)
  local vals = batch_reads(items)
  local costs = #argv >= at
  local full = cap * p
  local tokens_of = {}
  local ttl_of = {}
  local order = {}
  local out = {}
  local o = 0
  for i = 1, #items do
    local key = items[i]
    local tokens = nil
    if not distinct then
      tokens = tokens_of[key]
    end
    if tokens == nil then
      tokens = full
      local v = vals[i]
      if v then
        local t, last = tb_state(v)
        if t then
          local elapsed = now_ms - last
          if elapsed < 0 then
            elapsed = 0
          end
          local missing = full - t
          if missing < 0 then
            missing = 0
          end
          if elapsed < bcdiv(missing, r) then
            tokens = t + elapsed * r
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
      out[o + 2] = bfdiv(tokens, p)
      out[o + 3] = bcdiv(full - tokens, r)
    elseif tokens < need then
      local retry = bcdiv(need - tokens, r)
      if retry < 1 then
        retry = 1
      end
      out[o + 1] = retry
      out[o + 2] = bfdiv(tokens, p)
      out[o + 3] = bcdiv(full - tokens, r)
    else
      tokens = tokens - need
      local reset = bcdiv(full - tokens, r)
      out[o + 1] = 0
      out[o + 2] = bfdiv(tokens, p)
      out[o + 3] = reset
      if cost > 0 then
        if distinct then
          call('SET', key, tb_value(tokens, now_ms), 'PX', reset + pad)
        else
          if ttl_of[key] == nil then
            order[#order + 1] = key
          end
          ttl_of[key] = reset
        end
      end
    end
    if not distinct then
      tokens_of[key] = tokens
    end
    o = o + 3
  end
  for j = 1, #order do
    local key = order[j]
    call('SET', key, tb_value(tokens_of[key], now_ms), 'PX', ttl_of[key] + pad)
  end
  return out
end
