-- batch.lua: independent one-limit checks sent together (the store's automatic batching of
-- concurrent checks, src/batch.rs); appended after the algorithms.
--
-- KEYS[i]  = the state key of item i (standalone servers only: keys may be in any slot)
-- ARGV[1]  = now in µs since the epoch, or "" to read the server clock with TIME (production)
-- ARGV[2]  = TTL padding in ms added to every write
-- ARGV[3 + 7*(i-1) ..] = item i: code, cost, p1, p2, p3, p4, token (as in check.lua)
-- Returns 7 integers per item, as check.lua does for a one-item check. Each item is decided
-- and written on its own, in order: exactly what separate one-item calls arriving in the same
-- microsecond would get (an item sees the writes of earlier items on the same key).
-- Redis commands per call: one TIME for the whole batch plus each item's own (GET, SET).
local function batch(keys, argv)
  local now
  if argv[1] == '' then
    local t = call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  else
    now = tonumber(argv[1])
  end
  local pad = tonumber(argv[2])
  local flat = {}
  local k = 0
  for i = 1, #keys do
    local b = 3 + 7 * (i - 1)
    local f = CHECK[argv[b]]
    if f == nil then
      return redis.error_reply('sluice: unknown algorithm ' .. tostring(argv[b]))
    end
    local d, w = f(keys[i], now, tonumber(argv[b + 1]), tonumber(argv[b + 2]), tonumber(argv[b + 3]),
      tonumber(argv[b + 4]), tonumber(argv[b + 5]), argv[b + 6])
    if d[1] == 1 and w then
      w(pad)
    end
    for j = 1, 7 do
      flat[k + j] = d[j]
    end
    k = k + 7
  end
  return flat
end
