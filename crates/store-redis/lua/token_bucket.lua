-- token_bucket.lua: token bucket (docs/algorithms.md, crates/core/src/algorithm/token_bucket.rs).
--
-- Item parameters: p1 = capacity C, p2 = R, p3 = P (the rate reduced to R units per ms, one
-- token = P units). State: string, tokens in units and last ms (tb_state, tb_value).
-- Redis commands per decision: GET, then SET PX when admitted with cost > 0 (2 at most).
CHECK.tb = function(key, now, cost, cap, r, p)
  local full = cap * p
  local now_ms = floor(now / 1000)
  local tokens = full
  local v = get_string(key)
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
        tokens = t + elapsed * r
      end
    end
  end
  if cost > cap then
    return too_costly(cap, fdiv(tokens, p), cdiv(full - tokens, r))
  end
  local need = cost * p
  if tokens < need then
    return limited(cap, fdiv(tokens, p), cdiv(need - tokens, r), cdiv(full - tokens, r))
  end
  local left = tokens - need
  local reset = cdiv(full - left, r)
  local d = allow(cap, fdiv(left, p), reset)
  if cost == 0 then
    return d
  end
  return d, function(pad)
    put_string(key, tb_value(left, now_ms), reset, pad)
  end
end
