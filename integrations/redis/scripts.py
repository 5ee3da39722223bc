"""The Lua scripts ``RedisStore`` runs: each decision made on the server in one round
trip, on the server's clock."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    pass


_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"
_FMT = "local function fmt(x) return string.format('%.17g', x) end\n"

_TAKE: Final = (
    _NOW
    + """
local rate, burst, amount = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(v[1]) or burst, tonumber(v[2]) or now
if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate) end
local wait = 0
if amount <= 0 then
  tokens = math.min(burst, tokens - amount)
elseif tokens + 1e-9 >= amount then
  tokens = math.max(0, tokens - amount)
else
  wait = (amount - tokens) / rate
end
local fmt = '%.17g'
redis.call('HSET', KEYS[1], 'tokens', string.format(fmt, tokens), 'ts', string.format(fmt, now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return string.format('%.17g', wait)
"""
)

# KEYS: breaker hash. ARGV: break_s, probe lease (s), idle ttl (ms), probe id.
_ADMIT: Final = (
    _NOW
    + """
local v = redis.call('HMGET', KEYS[1], 'state', 'opened', 'probing')
local state = v[1] or 'closed'
if state == 'open' then
  local remaining = tonumber(v[2]) + tonumber(ARGV[1]) - now
  if remaining > 0 then return {0, string.format('%.17g', remaining), 0} end
  state = 'half_open'
  v[3] = false
end
if state == 'half_open' then
  local probing = tonumber(v[3])
  if probing and now - probing < tonumber(ARGV[2]) then return {0, '0', 0} end
  redis.call('HSET', KEYS[1], 'state', 'half_open', 'probing', string.format('%.17g', now),
    'probe', ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, '0', 1}
end
return {1, '0', 0}
"""
)

# KEYS: breaker hash, outcomes zset, failures zset.
# ARGV: failed, probe, window_s, minimum_calls, failure_ratio, member, idle ttl (ms), probe id.
_RECORD: Final = (
    _NOW
    + """
local failed, probe = ARGV[1] == '1', ARGV[2] == '1'
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local function open()
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened', string.format('%.17g', now),
    'probing', '', 'probe', '')
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  redis.call('DEL', KEYS[2], KEYS[3])
  return 'open'
end
if probe then
  -- only the probe this breaker is waiting on may decide it; a breaker that has gone
  -- (expired, flushed) is not made again without a lifetime
  if state ~= 'half_open' or redis.call('HGET', KEYS[1], 'probe') ~= ARGV[8] then return '' end
  if failed then return open() end
  redis.call('HSET', KEYS[1], 'state', 'closed', 'probing', '', 'probe', '')
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  redis.call('DEL', KEYS[2], KEYS[3])
  return 'closed'
end
if state ~= 'closed' then return '' end
local window = tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], now, ARGV[6])
if failed then redis.call('ZADD', KEYS[3], now, ARGV[6]) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%.17g', now - window))
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%.17g', now - window))
local ttl = math.ceil(window * 1000) + 1000
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
local calls, failures = redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3])
if calls >= tonumber(ARGV[4]) and failures >= tonumber(ARGV[5]) * calls then return open() end
return ''
"""
)

# KEYS: breaker hash. ARGV: probe id.
_RELEASE_PROBE: Final = """
if redis.call('HGET', KEYS[1], 'probe') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'probing', '', 'probe', '')
end
return 1
"""

# KEYS: slots zset (member: lease, score: its expiry). ARGV: limit, lease (s), lease id.
_ACQUIRE: Final = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.17g', now))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return false end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000) + 1000)
return ARGV[3]
"""
)

# KEYS: slots zsets, then breaker hashes. ARGV: lease (s), the count of slots keys, one
# lease id per slots key, then one probe id per breaker.
_RENEW: Final = (
    _NOW
    + """
local slots = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  if i <= slots then
    redis.call('ZADD', key, 'XX', now + tonumber(ARGV[1]), ARGV[i + 2])
    redis.call('PEXPIRE', key, math.ceil(tonumber(ARGV[1]) * 1000) + 1000)
  elseif redis.call('HGET', key, 'probe') == ARGV[i + 2] then
    redis.call('HSET', key, 'probing', string.format('%.17g', now))
  end
end
return #KEYS
"""
)

# KEYS: counter. ARGV: amount, limit ('' for none), initial, idle ttl (ms).
_ADD: Final = """
local value = tonumber(redis.call('GET', KEYS[1]) or ARGV[3])
local amount = tonumber(ARGV[1])
local total = value + amount
if ARGV[2] ~= '' and amount > 0 and total > tonumber(ARGV[2]) then
  return {0, string.format('%.17g', value)}
end
redis.call('SET', KEYS[1], string.format('%.17g', total), 'PX', ARGV[4])
return {1, string.format('%.17g', total)}
"""

# KEYS: limit hash. ARGV: initial, idle ttl (ms).
_READ_LIMIT: Final = """
local v = redis.call('HMGET', KEYS[1], 'value', 'version')
if not v[1] then
  redis.call('HSET', KEYS[1], 'value', ARGV[1], 'version', 0)
  v = {ARGV[1], 0}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {v[1], tonumber(v[2])}
"""

# KEYS: limit hash. ARGV: version, value, low, high, idle ttl (ms), bump (1 or 0).
_SWAP_LIMIT: Final = (
    _FMT
    + """
local v = redis.call('HMGET', KEYS[1], 'value', 'version')
local version = tonumber(v[2]) or 0
local value = v[1] or ARGV[2]
if version == tonumber(ARGV[1]) then
  value = fmt(math.min(tonumber(ARGV[4]), math.max(tonumber(ARGV[3]), tonumber(ARGV[2]))))
  version = version + tonumber(ARGV[6])
  redis.call('HSET', KEYS[1], 'value', value, 'version', version)
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {value, version}
"""
)

# KEYS: operation hash, then the windows. ARGV: lease (ms), then per window: amount,
# limit ('' for none), floor, ttl (ms), unit, slide (s; '' for a plain window). Answers
# {granted, refusing window, its value, wait}: 1 reserved now, 0 refused (a sliding
# window's wait until there is room, '' for never), 2 this operation had reserved
# already, 3 it had ended. A sliding window is a hash of 60 buckets (index -> amount).
_RESERVE: Final = (
    _FMT
    + """
local now
local function clock()  -- the server's time, asked only by a sliding window
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  end
  return now
end
local state = redis.call('HGET', KEYS[1], 'state')
if state then
  if state == 'x' then return {3, 0, '0', ''} end
  return {2, 0, '0', ''}
end
local values, buckets = {}, {}
for i = 2, #KEYS do
  local base = 1 + (i - 2) * 6
  local amount, limit, floor = tonumber(ARGV[base + 1]), ARGV[base + 2], tonumber(ARGV[base + 3])
  local slide = ARGV[base + 6]
  local value = 0
  local live = {}
  if slide == '' then
    value = tonumber(redis.call('GET', KEYS[i]) or '0')
  else
    local current = math.floor(clock() * 60 / tonumber(slide))
    buckets[i] = current
    local all = redis.call('HGETALL', KEYS[i])
    for j = 1, #all, 2 do
      local index = tonumber(all[j])
      if index < current - 60 then
        redis.call('HDEL', KEYS[i], all[j])
      else
        value = value + tonumber(all[j + 1])
        live[#live + 1] = {index, tonumber(all[j + 1])}
      end
    end
  end
  if value < floor then value = floor end
  if limit ~= '' and amount > 0 and value + amount > tonumber(limit) + 1e-9 then
    local wait = ''
    if slide ~= '' and amount <= tonumber(limit) then
      table.sort(live, function(a, b) return a[1] < b[1] end)
      local excess, freed, width = value + amount - tonumber(limit), 0, tonumber(slide) / 60
      for _, bucket in ipairs(live) do
        freed = freed + bucket[2]
        if freed >= excess - 1e-9 then
          wait = fmt(math.max(0, (bucket[1] + 61) * width - clock()))
          break
        end
      end
    end
    return {0, i - 1, fmt(value), wait}
  end
  values[i] = value
end
local record = {'state', 'r', 'n', #KEYS - 1}
for i = 2, #KEYS do
  local base = 1 + (i - 2) * 6
  local amount, ttl = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 4])
  if buckets[i] then
    redis.call('HINCRBYFLOAT', KEYS[i], buckets[i], fmt(amount))
    redis.call('PEXPIRE', KEYS[i], math.ceil(tonumber(ARGV[base + 6]) * 2000))
    record[#record + 1] = 'b' .. (i - 1)
    record[#record + 1] = buckets[i]
  else
    redis.call('SET', KEYS[i], fmt(values[i] + amount), 'KEEPTTL')
    local left = redis.call('PTTL', KEYS[i])
    if left < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
  end
  record[#record + 1] = 'k' .. (i - 1)
  record[#record + 1] = KEYS[i]
  record[#record + 1] = 'a' .. (i - 1)
  record[#record + 1] = fmt(amount)
  record[#record + 1] = 'u' .. (i - 1)
  record[#record + 1] = ARGV[base + 5]
end
redis.call('HSET', KEYS[1], unpack(record))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return {1, 0, '0', ''}
"""
)

# The windows an operation reserved in, changed by ``delta(i, reserved, unit)``; a window
# that has gone (closed, expired) is not made again. A sliding window's change goes to
# the bucket the reservation fell in.
_EACH_WINDOW = """
local function each_window(delta)
  local n = tonumber(redis.call('HGET', KEYS[1], 'n')) or 0
  for i = 1, n do
    local f = redis.call('HMGET', KEYS[1], 'k' .. i, 'a' .. i, 'u' .. i, 'b' .. i)
    local change = delta(tonumber(f[2]), f[3])
    if change ~= 0 and redis.call('EXISTS', f[1]) == 1 then
      if f[4] then
        local held = tonumber(redis.call('HGET', f[1], f[4]) or '0') + change
        if held < 0 then held = 0 end
        redis.call('HSET', f[1], f[4], fmt(held))
      else
        local value = tonumber(redis.call('GET', f[1])) + change
        if value < 0 then value = 0 end
        redis.call('SET', f[1], fmt(value), 'KEEPTTL')
      end
    end
  end
end
"""

# KEYS: operation hash. ARGV: unit, amount pairs (what was spent).
_SETTLE: Final = (
    _FMT
    + _EACH_WINDOW
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'unknown' end
if state == 's' then return 'duplicate' end
if state == 'x' then return 'released' end
local actual = {}
for i = 1, #ARGV, 2 do actual[ARGV[i]] = tonumber(ARGV[i + 1]) end
each_window(function(reserved, unit)
  local spent = actual[unit]
  if spent == nil then return 0 end
  return spent - reserved
end)
redis.call('HSET', KEYS[1], 'state', 's')
return 'settled'
"""
)

# KEYS: operation hash. ARGV: lease (ms).
_RELEASE: Final = (
    _FMT
    + _EACH_WINDOW
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  redis.call('HSET', KEYS[1], 'state', 'x', 'n', 0)
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return 'unknown'
end
if state == 's' then return 'settled' end
if state == 'x' then return 'duplicate' end
each_window(function(reserved, unit) return -reserved end)
redis.call('HSET', KEYS[1], 'state', 'x')
return 'released'
"""
)

# KEYS: a sliding window. ARGV: slide (s). What it holds now.
_SLIDING_BALANCE: Final = (
    _NOW
    + _FMT
    + """
local current = math.floor(now * 60 / tonumber(ARGV[1]))
local all = redis.call('HGETALL', KEYS[1])
local value = 0
for j = 1, #all, 2 do
  if tonumber(all[j]) >= current - 60 then value = value + tonumber(all[j + 1]) end
end
return fmt(value)
"""
)

SCRIPTS: Final = {
    "sliding_balance": _SLIDING_BALANCE,
    "take": _TAKE,
    "admit": _ADMIT,
    "record": _RECORD,
    "release_probe": _RELEASE_PROBE,
    "acquire": _ACQUIRE,
    "renew": _RENEW,
    "add": _ADD,
    "read_limit": _READ_LIMIT,
    "swap_limit": _SWAP_LIMIT,
    "reserve": _RESERVE,
    "settle": _SETTLE,
    "release_op": _RELEASE,
}
