-- batch_common.lua: what the one-policy batch scripts share (batch_token_bucket.lua,
-- batch_gcra.lua; src/batch.rs sends them), appended after common.lua.
--
-- A one-policy batch sends the policy's parameters once and per item only its key and, when
-- any item costs more than 1, its cost. Every state is read before anything is written and
-- each distinct key is written once, at the end, with the state its last admitted item left:
-- what separate one-item calls arriving in the same microsecond would leave, since an item
-- of the batch sees the state the batch's earlier items on its key left.

-- math.floor, looked up when a batch starts (see batch_keys).
local mfloor

-- fdiv and cdiv of common.lua with one call less each, and free when b = 1 (a rate reduced to
-- one unit per ms): the divisions are most of a batched decision's own Lua.
local function bfdiv(a, b)
  if b == 1 then
    return a
  end
  local q = mfloor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function bcdiv(a, b)
  if b == 1 then
    return a
  end
  local q = mfloor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  if q * b < a then
    q = q + 1
  end
  return q
end

-- The item keys, whether they are distinct, and the ARGV index after them (called first by
-- every batch). ARGV[at] = 1 when the client saw every key once in the batch (each is then
-- decided and written on its own, with no per-key bookkeeping), else 0. ARGV[at + 1] = m:
-- how many item keys follow in ARGV after those in KEYS (a Cluster node's batch names one
-- key in KEYS, which routes the call, and the rest in ARGV: they are in other slots of the
-- same node).
local function batch_keys(keys, argv, at)
  mfloor = math.floor
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
    local vals = {}
    for i = 1, #items do
      local v = pcall_('GET', items[i])
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
