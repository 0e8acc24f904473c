-- Lifts every ban of one identity: the fields of its ban index, plus the fields the caller
-- knows of. O(bans of the identity).
-- KEYS[1] the bans hash, KEYS[2] the change log, KEYS[3] the expiry set, KEYS[4] the
-- identity's ban index.
-- ARGV: the log's length, then ban fields the caller knows of.
-- Returns how many bans went.
local fields = redis.call('SMEMBERS', KEYS[4])
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
local record = {'t', 'b'}
local n = 0
for _, f in ipairs(fields) do
  if redis.call('HDEL', KEYS[1], f) == 1 then
    n = n + 1
    redis.call('ZREM', KEYS[3], 'b\n' .. f)
    record[#record + 1] = '-' .. f
    record[#record + 1] = ''
  end
end
redis.call('DEL', KEYS[4])
if n > 0 then redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', unpack(record)) end
return n
