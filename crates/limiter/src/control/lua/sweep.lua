-- Removes entries that ended, at most ARGV[2] per call, and logs the removals (escalation
-- levels are not logged: no instance holds them in memory).
-- KEYS[1] the expiry set, KEYS[2] the change log, KEYS[3..7] the overrides, bans, allow,
-- deny and levels hashes.
-- ARGV: now (Unix ms), most entries, the log's length, the ban index key prefix (the
-- identity follows it; same hash tag, so the same slot).
-- An entry set again since it was queued keeps living: its value names its new end.
-- Returns how many members were due.
local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local hashes = {o = KEYS[3], b = KEYS[4], a = KEYS[5], d = KEYS[6], l = KEYS[7]}
local records = {}
local function flush(code)
  local r = records[code]
  if r and #r > 2 then redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', unpack(r)) end
  records[code] = nil
end
for _, member in ipairs(due) do
  redis.call('ZREM', KEYS[1], member)
  local code, field = string.match(member, '^(%a)\n(.*)$')
  local hash = code and hashes[code]
  local value = hash and redis.call('HGET', hash, field)
  if value then
    local ends
    if code == 'l' then
      ends = tonumber(string.match(value, ':(%d+)$'))
    else
      ends = tonumber(string.match(value, '^(%d+)'))
    end
    if ends and ends > 0 and ends <= now then
      redis.call('HDEL', hash, field)
      if code == 'b' then
        redis.call('SREM', ARGV[4] .. string.match(field, '^[^\n]*'), field)
      end
      if code ~= 'l' then
        local r = records[code]
        if not r then
          r = {'t', code}
          records[code] = r
        end
        r[#r + 1] = '-' .. field
        r[#r + 1] = ''
        if #r >= 202 then flush(code) end
      end
    elseif ends and ends > now then
      redis.call('ZADD', KEYS[1], ends, member)
    end
  end
end
for _, code in ipairs({'o', 'b', 'a', 'd'}) do flush(code) end
return #due
