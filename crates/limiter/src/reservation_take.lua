-- Takes a reservation record for settling, exactly once, and leaves a tombstone.
--
-- KEYS[1]  the reservation record (a JSON string, with the reservation's ttl as PX)
-- ARGV     none
--
-- Returns the record and replaces it with `settled` for the rest of its ttl, so a second
-- settle of the same id is told apart from an id that never existed or ran out; returns
-- `settled` when it was settled already; false (nil) when there is no such record.
local v = redis.call('GET', KEYS[1])
if not v then
  return false
end
if v == 'settled' then
  return 'settled'
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('SET', KEYS[1], 'settled', 'PX', ttl)
else
  redis.call('DEL', KEYS[1])
end
return v
