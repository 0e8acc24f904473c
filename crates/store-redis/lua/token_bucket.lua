-- token_bucket.lua: token bucket (docs/algorithms.md, crates/core/src/algorithm/token_bucket.rs).
--
-- Item parameters: p1 = capacity C, p2 = R, p3 = P (the rate reduced to R units per ms, one
-- token = P units). State: string, tokens in units and last ms (tb_state, tb_value).
-- Redis commands per decision: GET, then SET PX when admitted with cost > 0 (2 at most).

-- The token bucket's state (docs/redis.md, "State encoding"), packed like GCRA's (gcra.lua):
-- the byte 'T' and two little-endian doubles (tokens in units, last ms); every value is an
-- integer below 2^53, which a double holds exactly. Packing and unpacking cost a fraction of
-- formatting and matching decimal text, the largest part of a batched decision's Lua. The
-- text form `t<tokens>:<last_ms>` that earlier versions wrote is still read, so stored states
-- survive an upgrade.
local TB_TAG = 84

-- tokens, last_ms of a stored token-bucket value, or nil (another algorithm's state).
local function tb_state(v)
  if #v == 17 then
    local tag, t, last = S_UNPACK('<Bdd', v)
    if tag == TB_TAG then
      return t, last
    end
  end
  local t, last = string.match(v, '^t(%d+):(%d+)$')
  if t then
    return tonumber(t), tonumber(last)
  end
  return nil
end

local function tb_value(tokens, last_ms)
  return S_PACK('<Bdd', TB_TAG, tokens, last_ms)
end

-- The tokens (units) of stored value v at now_ms, refilled at r units per ms up to `full`;
-- `full` when absent. The refill formula, for checks, batches and charges alike.
local function tb_tokens(v, now_ms, full, r)
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
      if elapsed < cdiv(missing, r) then
        return t + elapsed * r
      end
    end
  end
  return full
end

STEP.tb = function(v, now, cost, cap, r, p)
  local full = cap * p
  local now_ms = floor(now / 1000)
  local tokens = tb_tokens(v, now_ms, full, r)
  if cost > cap then
    return -1, cap, fdiv(tokens, p), cdiv(full - tokens, r), 0
  end
  local need = cost * p
  if tokens < need then
    return retry_of(cdiv(need - tokens, r)), cap, fdiv(tokens, p), cdiv(full - tokens, r), 0
  end
  local left = tokens - need
  local reset = cdiv(full - left, r)
  if cost == 0 then
    return 0, cap, fdiv(left, p), reset, 0
  end
  return 0, cap, fdiv(left, p), reset, 0, tb_value(left, now_ms), reset
end
CHECK.tb = check_of(STEP.tb)

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
