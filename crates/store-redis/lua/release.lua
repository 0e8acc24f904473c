-- release.lua: releases a concurrency lease.
--
-- KEYS[1] = the concurrency state key
-- ARGV[1] = now in µs, or "" to read the server clock with TIME
-- ARGV[2] = TTL padding in ms (0 in production)
-- ARGV[3] = the lease id
-- Returns 1 if the lease was held (and is now released), 0 if it had expired or was unknown.
-- Redis commands: TIME (unless now is given), ZSCORE; when held: ZREM, ZREMRANGEBYSCORE,
-- ZRANGE, PEXPIRE (an empty set is deleted by Redis itself).
local function release(keys, argv)
  bind_libs()
  local now = now_us(argv[1])
  local now_ms = floor(now / 1000)
  local key = keys[1]
  local s = pcall_('ZSCORE', key, argv[3])
  if type(s) ~= 'string' or tonumber(s) <= now_ms then
    return 0
  end
  call('ZREM', key, argv[3])
  call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
  local last = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    call('PEXPIRE', key, tonumber(last[2]) - now_ms + tonumber(argv[2]))
  end
  return 1
end
