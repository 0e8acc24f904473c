-- Counts one denial towards a policy's automatic ban; at `after` denials, bans for the
-- escalated duration, logs the ban and queues the ban and the level for their ends. O(1).
-- KEYS[1] the denial counter, KEYS[2] the levels hash, KEYS[3] the bans hash, KEYS[4] the
-- change log, KEYS[5] the expiry set, KEYS[6] the identity's ban index.
-- ARGV: pair field (POLICY\nIDENTITY), ban field, after, within_ms, duration_ms, multiplier,
-- max_ms, now_ms, most bans, the log's length.
-- Returns the ban's end (Unix ms), 0 when no ban, -1 when the bans table is full.
-- A denial while the ban exists is not counted (another instance's late denials).
local now = tonumber(ARGV[8])
local ban = tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0')
if ban > now then return 0 end
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
if n < tonumber(ARGV[3]) then return 0 end
redis.call('DEL', KEYS[1])
local most = tonumber(ARGV[9])
if redis.call('HLEN', KEYS[3]) >= most and redis.call('HEXISTS', KEYS[3], ARGV[2]) == 0 then
  return -1
end
local level = 0
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if raw then
  local l, forget = string.match(raw, '^(%d+):(%d+)$')
  if l and tonumber(forget) > now then level = tonumber(l) end
end
local max = tonumber(ARGV[7])
local d = tonumber(ARGV[5]) * (tonumber(ARGV[6]) ^ level)
if d > max then d = max end
if d < 1 then d = 1 end
d = math.floor(d)
local untl = now + d
local forget = untl + max
if raw or redis.call('HLEN', KEYS[2]) < most then
  redis.call('HSET', KEYS[2], ARGV[1], (level + 1) .. ':' .. forget)
  redis.call('ZADD', KEYS[5], forget, 'l\n' .. ARGV[1])
end
redis.call('HSET', KEYS[3], ARGV[2], untl)
redis.call('ZADD', KEYS[5], untl, 'b\n' .. ARGV[2])
redis.call('SADD', KEYS[6], ARGV[2])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[10], '*', 't', 'b', '+' .. ARGV[2], untl)
return untl
