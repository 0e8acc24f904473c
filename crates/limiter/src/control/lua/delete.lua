-- Removes one entry of a control table and logs the removal: O(1).
-- KEYS[1] the table's hash, KEYS[2] the change log, KEYS[3] the expiry set, KEYS[4] the
-- identity's ban index (bans only, any key otherwise).
-- ARGV: table code (o, b, a, d), field, the log's length.
-- Returns 1 when the entry was there, else 0.
if redis.call('HDEL', KEYS[1], ARGV[2]) == 0 then return 0 end
redis.call('ZREM', KEYS[3], ARGV[1] .. '\n' .. ARGV[2])
if ARGV[1] == 'b' then redis.call('SREM', KEYS[4], ARGV[2]) end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 't', ARGV[1], '-' .. ARGV[2], '')
return 1
