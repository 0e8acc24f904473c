-- check.lua: the all-or-nothing check of one or more limits (appended after the algorithms).
--
-- KEYS[i]  = the state key of item i (all in one Cluster slot)
-- ARGV[1]  = now in µs since the epoch, or "" to read the server clock with TIME (production)
-- ARGV[2]  = TTL padding in ms added to every write (0 in production; tests with a manual
--            clock pad TTLs because Redis expires keys on its own clock)
-- ARGV[3 + 7*(i-1) ..] = item i: code (tb|gcra|lb|fw|swc|swl|cc), cost, p1, p2, p3, p4, token
-- Returns 7 integers per item: allowed (0/1), limit, remaining, retry_after_ms,
-- reset_after_ms, delay_ms, reason (0 none, 1 limited, 2 cost exceeds limit,
-- 3 another item denied: not consumed, shown with its unconsumed state).
-- Writes happen only when every item admits. Redis commands per call: TIME (unless ARGV[1]
-- is given) plus the algorithms' own (see each algorithm's header).
local function check(keys, argv)
  bind_libs()
  local now = now_us(argv[1])
  local pad = tonumber(argv[2])
  local n = #keys
  local out = {}
  local writes = {}
  local all = true
  for i = 1, n do
    local d, w = check_item(keys, argv, i, now)
    if d == nil then
      return unknown_algorithm(argv, i)
    end
    if d[1] == 0 then
      all = false
    end
    out[i] = d
    writes[i] = w
  end
  local flat = {}
  for i = 1, n do
    local d = out[i]
    if not all and d[1] == 1 then
      -- Not consumed: report the unconsumed state (the same check at cost 0).
      d = check_item(keys, argv, i, now, 0)
      d[1] = 0
      d[4] = 0
      d[6] = 0
      d[7] = 3
    elseif all and writes[i] then
      writes[i](pad)
    end
    for j = 1, 7 do
      flat[#flat + 1] = d[j]
    end
  end
  return flat
end
