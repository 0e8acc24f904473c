-- batch_step.lua: checks of one policy in one call, for every algorithm with a step (STEP in
-- common.lua; src/batch.rs sends them): one loop, the algorithm's step per item. The script
-- of each algorithm is this file with its step passed in (src/scripts.rs composes
-- `return batch_step(STEP.<code>, KEYS, ARGV)`), so the policy's code is not sent.
--
-- KEYS     = item keys (see batch_keys for the Cluster form)
-- ARGV[1]  = now in µs, or "" to read the server clock with TIME
-- ARGV[2]  = TTL padding in ms added to every write
-- ARGV[3..6] = p1..p4 (as a check sends them, check.lua; "" for 0)
-- ARGV[7]  = 1 when every key is distinct, else 0 (see batch_keys)
-- ARGV[8]  = m, then m more item keys (Cluster form; 0 otherwise)
-- then the cost of each item, or nothing when every item costs 1
-- Returns 4 integers per item: verdict (0 admitted, n > 0 limited with retry after n ms,
-- -1 the cost exceeds the limit), remaining, reset_after_ms, delay_ms.
-- Redis commands per call: TIME, MGET (or one GET per item on a Cluster), one SET PX per
-- distinct key an admitted item of positive cost changed.
--
-- The policy's parameters come once per call and per item only its key and, when any item
-- costs more than 1, its cost. Every state is read before anything is written and each
-- distinct key is written once, at the end, with the value its last admitted item left: what
-- separate one-item calls arriving in the same microsecond would leave, since an item of the
-- batch is decided from the value the batch's earlier items on its key left.

-- The item keys, whether they are distinct, and the ARGV index after them (called first by
-- every batch). ARGV[at] = 1 when the client saw every key once in the batch (each is then
-- decided and written on its own, with no per-key bookkeeping), else 0. ARGV[at + 1] = m:
-- how many item keys follow in ARGV after those in KEYS (a Cluster node's batch names one
-- key in KEYS, which routes the call, and the rest in ARGV: they are in other slots of the
-- same node).
local function batch_keys(keys, argv, at)
  local distinct = argv[at] == '1'
  local m = tonumber(argv[at + 1])
  if m == 0 then
    return keys, distinct, at + 2
  end
  local all = {}
  local n = #keys
  for i = 1, n do
    all[i] = keys[i]
  end
  for j = 1, m do
    all[n + j] = argv[at + 1 + j]
  end
  return all, distinct, at + 2 + m
end

-- The stored value of every item key (false when missing or of another type). A standalone
-- server reads them with one MGET (which answers nil for a key of another type); a Cluster
-- node reads each key on its own, since a command's keys must share one slot. Any error but
-- WRONGTYPE ends the call here, before anything is written: a key whose slot this node no
-- longer serves ("non local key") must fail the whole batch, which the client then decides
-- again one item per call, not read as absent.
local function batch_reads(items)
  if BATCH_PER_KEY_READS then
    local rpcall = redis.pcall
    local vals = {}
    for i = 1, #items do
      local v = rpcall('GET', items[i])
      if type(v) == 'string' then
        vals[i] = v
      elseif type(v) == 'table' and v.err and not string.find(v.err, 'WRONGTYPE', 1, true) then
        error(v)
      else
        vals[i] = false
      end
    end
    return vals
  end
  return call('MGET', unpack(items))
end

local function batch_step(step, keys, argv)
  -- redis.call itself, not common.lua's wrapper (which a function library needs while it
  -- loads; at call time it is reachable): one Lua call less per write, with redis.pcall
  -- for the Cluster form's reads 2-3% of a decision's instructions (callgrind).
  local rcall = redis.call
  bind_libs()
  local now = now_us(argv[1])
  local pad = tonumber(argv[2])
  local p1 = tonumber(argv[3]) or 0
  local p2 = tonumber(argv[4]) or 0
  local p3 = tonumber(argv[5]) or 0
  local p4 = tonumber(argv[6]) or 0
  local items, distinct, at = batch_keys(keys, argv, 7)
  local vals = batch_reads(items)
  local costs = #argv >= at
  -- Per repeated key: the value and TTL its last admitted item left, in first-write order.
  local value_of = {}
  local ttl_of = {}
  local order = {}
  local out = {}
  local o = 0
  for i = 1, #items do
    local key = items[i]
    local v = vals[i]
    if not distinct then
      local left = value_of[key]
      if left ~= nil then
        v = left
      end
    end
    local cost = 1
    if costs then
      cost = tonumber(argv[at + i - 1])
    end
    local verdict, _, remaining, reset, delay, value, ttl = step(v, now, cost, p1, p2, p3, p4)
    out[o + 1] = verdict
    out[o + 2] = remaining
    out[o + 3] = reset
    out[o + 4] = delay
    o = o + 4
    if value then
      if distinct then
        rcall('SET', key, value, 'PX', ttl + pad)
      else
        if ttl_of[key] == nil then
          order[#order + 1] = key
        end
        value_of[key] = value
        ttl_of[key] = ttl
      end
    end
  end
  for j = 1, #order do
    local key = order[j]
    rcall('SET', key, value_of[key], 'PX', ttl_of[key] + pad)
  end
  return out
end
