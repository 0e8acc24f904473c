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
  bind_libs()
  local now = now_us(argv[1])
  local pad = tonumber(argv[2])
  local flat = {}
  local k = 0
  for i = 1, #keys do
    local d, w = check_item(keys, argv, i, now)
    if d == nil then
      return unknown_algorithm(argv, i)
    end
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
