-- adjust.lua: charge or refund one key without an admission check, the Lua form of
-- crates/core/src/algorithm/adjust.rs (docs/admin.md, "State, charge and refund").
--
-- KEYS[1]  = the state key
-- ARGV[1]  = now in µs, or "" to read the server clock with TIME
-- ARGV[2]  = TTL padding in ms (0 in production)
-- ARGV[3..9] = the item as a check sends it: code, cost, p1, p2, p3, p4, token (a unique id,
--            for the sliding log's new entry)
-- ARGV[10] = 'charge' (consume without a check, into debt as far as the state can express) or
--            'refund' (give back, never beyond the capacity)
-- Returns the 7 integers of a check of cost 0 after the change (see check.lua). A concurrency
-- limit (or an unknown code) is an error reply: a lease is taken by a check, given back by a
-- release.
-- Each algorithm registers its charge and refund (ADJUST.<code>, common.lua) in its own file,
-- next to its check; this file is only the entry point.
local function adjust(keys, argv)
  bind_libs()
  local now = now_us(argv[1])
  local pad = tonumber(argv[2])
  local code = argv[3]
  local f = ADJUST[code]
  if f == nil then
    if code == 'cc' then
      return redis.error_reply(
        'sluice: a concurrency limit cannot be charged or refunded: a check takes a lease and a release gives it back')
    end
    return unknown_algorithm(argv, 1)
  end
  local charge = argv[10] == 'charge'
  f(keys[1], now, charge, tonumber(argv[4]), pad, tonumber(argv[5]), tonumber(argv[6]),
    tonumber(argv[7]), tonumber(argv[8]), argv[9])
  local d = check_item(keys, argv, 1, now, 0)
  return d
end
