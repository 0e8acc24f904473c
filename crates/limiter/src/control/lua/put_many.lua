-- Sets one chunk of a bulk import (at most IMPORT_CHUNK entries of one list): O(chunk),
-- never O(table). A 10,000-entry import runs as several of these short scripts rather than
-- one long one, so checks sharing this Redis never wait behind it; the caller keeps the
-- whole call all or nothing (it checks the room first and undoes its chunks with
-- undo_many.lua when one fails). Each chunk refuses on its own when the table has no room
-- for it (another writer may have filled it since the caller checked).
-- KEYS[1] the list's hash, KEYS[2] the change log, KEYS[3] the expiry set.
-- ARGV: table code (a or d), the table's most entries, the log's length, the entries' value,
-- their end (Unix ms, 0 = never), then the entries (distinct fields).
-- Returns {1, size after} when stored, {0, size} when the new entries would take the
-- table beyond its most (nothing changed). The log gets one record per 100 entries.
local hash, log, expiry = KEYS[1], KEYS[2], KEYS[3]
local code, most, maxlen = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local value, ends = ARGV[4], tonumber(ARGV[5])
local first, last = 6, #ARGV
local group = 500
local size = redis.call('HLEN', hash)
local new = 0
-- Entries that had an end before (their value names it) leave the expiry set.
local ended = {}
for i = first, last, group do
  local fields = {}
  for j = i, math.min(i + group - 1, last) do fields[#fields + 1] = ARGV[j] end
  local present = redis.call('HMGET', hash, unpack(fields))
  for k = 1, #fields do
    if not present[k] then
      new = new + 1
    elseif present[k] ~= '0' then
      ended[#ended + 1] = code .. '\n' .. fields[k]
    end
  end
end
if size + new > most then return {0, size} end
for i = first, last, group do
  local pairs_, members = {}, {}
  for j = i, math.min(i + group - 1, last) do
    pairs_[#pairs_ + 1] = ARGV[j]
    pairs_[#pairs_ + 1] = value
    if ends > 0 then
      members[#members + 1] = ends
      members[#members + 1] = code .. '\n' .. ARGV[j]
    end
  end
  redis.call('HSET', hash, unpack(pairs_))
  if ends > 0 then redis.call('ZADD', expiry, unpack(members)) end
end
if ends == 0 then
  for i = 1, #ended, group do
    redis.call('ZREM', expiry, unpack(ended, i, math.min(i + group - 1, #ended)))
  end
end
for i = first, last, 100 do
  local record = {'t', code}
  for j = i, math.min(i + 99, last) do
    record[#record + 1] = '+' .. ARGV[j]
    record[#record + 1] = value
  end
  redis.call('XADD', log, 'MAXLEN', '~', maxlen, '*', unpack(record))
end
return {1, size + new}
