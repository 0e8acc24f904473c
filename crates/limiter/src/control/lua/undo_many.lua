-- Undoes chunks of a bulk import that failed part way: puts back what the import's entries
-- held before it (removes the ones that were new, restores the value and end of the ones
-- that were there) and logs the changes, so every instance undoes them too. O(entries).
-- KEYS[1] the list's hash, KEYS[2] the change log, KEYS[3] the expiry set.
-- ARGV: table code (a or d), the log's length, the number N of entries to remove, those N
-- entries, then pairs (entry, its former value = its end, Unix ms, 0 = never).
local hash, log, expiry = KEYS[1], KEYS[2], KEYS[3]
local code, maxlen, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local record = {}
local function flush()
  if #record > 0 then
    redis.call('XADD', log, 'MAXLEN', '~', maxlen, '*', 't', code, unpack(record))
    record = {}
  end
end
for i = 4, 3 + n do
  redis.call('HDEL', hash, ARGV[i])
  redis.call('ZREM', expiry, code .. '\n' .. ARGV[i])
  record[#record + 1] = '-' .. ARGV[i]
  record[#record + 1] = ''
  if #record >= 200 then flush() end
end
for i = 4 + n, #ARGV - 1, 2 do
  local field, value = ARGV[i], ARGV[i + 1]
  redis.call('HSET', hash, field, value)
  if value ~= '0' then
    redis.call('ZADD', expiry, tonumber(value), code .. '\n' .. field)
  else
    redis.call('ZREM', expiry, code .. '\n' .. field)
  end
  record[#record + 1] = '+' .. field
  record[#record + 1] = value
  if #record >= 200 then flush() end
end
flush()
return 1
