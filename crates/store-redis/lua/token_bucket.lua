-- token_bucket.lua: token bucket (docs/algorithms.md, crates/core/src/algorithm/token_bucket.rs).
--
-- Item parameters: p1 = capacity C, p2 = R, p3 = P (the rate reduced to R units per ms, one
-- token = P units). State: string, tokens in units and last ms (tb_state, tb_value).
-- Redis commands per decision: GET, then SET PX when admitted with cost > 0 (2 at most).

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
