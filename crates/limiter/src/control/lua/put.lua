-- Sets one entry of a control table, records it for its end and logs the change: O(1).
-- KEYS[1] the table's hash, KEYS[2] the change log (a stream), KEYS[3] the expiry set,
-- KEYS[4] the identity's ban index (a set; bans only, any key otherwise).
-- ARGV: table code (o, b, a, d), field, value, end (Unix ms, 0 = never), the table's most
-- entries, the log's length.
-- Returns {1, size before} when stored, {0, size} when the table is full (nothing changed).
local hash, log, expiry = KEYS[1], KEYS[2], KEYS[3]
local code, field, value = ARGV[1], ARGV[2], ARGV[3]
local size = redis.call('HLEN', hash)
if size >= tonumber(ARGV[5]) and redis.call('HEXISTS', hash, field) == 0 then
  return {0, size}
end
redis.call('HSET', hash, field, value)
local member = code .. '\n' .. field
local ends = tonumber(ARGV[4])
if ends > 0 then
  redis.call('ZADD', expiry, ends, member)
else
  redis.call('ZREM', expiry, member)
end
if code == 'b' then redis.call('SADD', KEYS[4], field) end
redis.call('XADD', log, 'MAXLEN', '~', ARGV[6], '*', 't', code, '+' .. field, value)
return {1, size}
