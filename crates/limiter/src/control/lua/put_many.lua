-- Sets many entries of one list at once, all or nothing: O(entries), never O(table).
-- KEYS[1] the list's hash, KEYS[2] the change log, KEYS[3] the expiry set.
-- ARGV: table code (a or d), the table's most entries, the log's length, then one
-- (field, value, end) triple per entry (fields distinct; end in Unix ms, 0 = never).
-- Returns {1, size after} when stored, {0, size} when the new entries would take the
-- table beyond its most (nothing changed). The log gets one record per 100 entries.
local hash, log, expiry = KEYS[1], KEYS[2], KEYS[3]
local code, most, maxlen = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local size = redis.call('HLEN', hash)
local new = 0
for i = 4, #ARGV, 3 do
  if redis.call('HEXISTS', hash, ARGV[i]) == 0 then new = new + 1 end
end
if size + new > most then return {0, size} end
local record = {'t', code}
for i = 4, #ARGV, 3 do
  local field, value, ends = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  redis.call('HSET', hash, field, value)
  local member = code .. '\n' .. field
  if ends > 0 then
    redis.call('ZADD', expiry, ends, member)
  else
    redis.call('ZREM', expiry, member)
  end
  record[#record + 1] = '+' .. field
  record[#record + 1] = value
  if #record >= 202 then
    redis.call('XADD', log, 'MAXLEN', '~', maxlen, '*', unpack(record))
    record = {'t', code}
  end
end
if #record > 2 then redis.call('XADD', log, 'MAXLEN', '~', maxlen, '*', unpack(record)) end
return {1, size + new}
