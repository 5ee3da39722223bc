"""A ``StateStore`` and ``Ledger`` on Redis: one limit for every process that shares the server.

Run the same stack on four workers and a ``RateLimit(per_second=10)`` in memory admits
40 calls a second; with a ``RedisStore`` the four share one bucket, one breaker, one
set of bulkhead slots and one ledger of what the caps counted::

    from guardstack.integrations.redis import RedisStore
    from guardstack.pipeline import Harness

    harness = Harness(model, store=RedisStore("redis://localhost:6379/0"))

How it works (extra ``redis``: redis-py's asyncio client; Redis ≥ 6.2 or Valkey):

* every operation is one server-side Lua script, so it is atomic across processes and
  costs one round trip; time is read from the server (``TIME``), so the processes'
  clocks never disagree;
* soft state expires when idle (a bucket once it would be full again, a breaker's
  outcomes after their window, its state and a shared limit after ``idle_ttl_s``);
  the ledger's windows live as long as they mean something — a calendar window until
  it ends, a session's for ``session_ttl_s`` after its last use, a turn's until the
  turn ends — and an operation's reservation for ``reservation_ttl_s``;
* every key carries a Redis Cluster hash tag: a soft entry its own, the ledger's
  entries their owner's (the plugin's namespace), so one script never spans slots;
* a bulkhead slot is a lease that expires after ``lease_ms`` unless renewed: while a
  call runs, the store renews its leases every third of that, so a process killed
  mid-call gives its slots back within one lease; a breaker's half-open probe is held
  and renewed the same way. A slot whose acquire went unanswered (a timeout, a lost
  reply) is given back at the next contact, and a reservation given up on the same
  way is released by its id;
* a server that is down, slower than ``timeout_ms`` or answers garbage raises
  ``StoreError`` and each layer does what ``on_error`` says (``None``: caps and spend
  limits fail closed; breakers, rate limits and concurrency limits fail open).
  Redis restarted mid-run: the next operations reconnect, soft state rebuilds, and a
  session's counts go on from the larger of what the store and the session log hold.

It runs on asyncio only (redis-py's client is asyncio's): built in a trio program, or
used from one, it raises ``StoreUnsupported`` — a mistake, not an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from guardstack.integrations._extras import require
from guardstack.pipeline.errors import StoreUnsupported
from guardstack.pipeline.ledger import LEASE_S, SESSION_TTL_S, Reservation, Settlement, Window
from guardstack.pipeline.store import Admission, BreakerState, StoreError
from guardstack.pipeline.validate import cut

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["RedisStore"]

EXTRA = "redis"
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

_SCRIPTS: Final = {
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


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"RedisStore: {name} must be a positive number, got {cut(value)}")
    if not math.isfinite(value):
        raise ValueError(f"RedisStore: {name} must be finite, got {value}")
    return float(value)


def _on_trio() -> bool:
    """Whether this thread runs a trio event loop now."""
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


_TRIO = (
    "RedisStore runs on asyncio only (redis-py's client is asyncio's); run this harness "
    "with anyio.run(..., backend='asyncio')"
)


class RedisStore:
    """guardstack's ``StateStore`` and ``Ledger`` protocols on a Redis (or Valkey) server."""

    name = "redis"
    #: Its operations suspend (network round trips): layers shield their cleanup.
    suspends = True

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Redis | None = None,
        prefix: str = "guardstack:",
        timeout_ms: float = 250,
        lease_ms: float = 30_000,
        idle_ttl_s: float = 86_400,
        session_ttl_s: float = SESSION_TTL_S,
        reservation_ttl_s: float = LEASE_S,
        on_error: Literal["open", "closed"] | None = None,
    ) -> None:
        redis = require("redis.asyncio", EXTRA)
        if _on_trio():
            raise StoreUnsupported(_TRIO)
        if on_error not in (None, "open", "closed"):
            raise ValueError(
                f"RedisStore: on_error must be 'open', 'closed' or None, got {cut(on_error)}"
            )
        if not isinstance(prefix, str):
            raise TypeError(f"RedisStore: prefix must be text, got {cut(prefix)}")
        if "{" in prefix or "}" in prefix:
            raise ValueError(
                f"RedisStore: prefix {cut(prefix)} may not hold braces: the store puts a "
                "Redis Cluster hash tag after it"
            )
        self.timeout_s = _positive("timeout_ms", timeout_ms) / 1000
        self.lease_s = _positive("lease_ms", lease_ms) / 1000
        self.idle_ttl_ms = int(_positive("idle_ttl_s", idle_ttl_s) * 1000)
        #: How long a session's ledger entries live after their last use.
        self.session_ttl_s = _positive("session_ttl_s", session_ttl_s)
        self.reservation_ttl_ms = int(_positive("reservation_ttl_s", reservation_ttl_s) * 1000)
        if client is None:
            client = redis.Redis.from_url(
                url or "redis://127.0.0.1:6379/0",
                socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s,
            )
        elif url is not None:
            raise ValueError("RedisStore: give a url or a client, not both")
        self.client = client
        self._redis = require("redis.exceptions", EXTRA)
        self.url = url
        self.prefix = prefix
        self.on_error = on_error
        #: How often a waiting bulkhead asks again (slots freed elsewhere wake no one here).
        self.poll_s = min(0.05, self.lease_s / 3)
        self._scripts = {name: client.register_script(text) for name, text in _SCRIPTS.items()}
        #: The UTC wall clock calendar windows are cut by: this process's (keep the
        #: workers' clocks in step, as NTP does; a window's edge moves with them).
        self.wall_clock = time.time
        self._leases: dict[str, str] = {}  # lease id -> its slots key, while a call holds it
        self._probes: dict[str, str] = {}  # breaker key -> the probe this process runs
        #: Slots and reservations whose answer was lost: given back at the next contact.
        self._doubtful_leases: dict[str, str] = {}
        self._doubtful_operations: set[str] = set()
        self._renewer: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"RedisStore({self.url or '<client>'!r}, prefix={self.prefix!r})"

    def _soft(self, key: str) -> str:
        """A soft entry's key: its own hash tag."""
        return f"{self.prefix}{{{key}}}"

    def _owned(self, key: str) -> str:
        """A ledger entry's key: its owner's hash tag (the key's first part), so one
        owner's operation and windows are in one slot."""
        owner, _, rest = key.partition(":")
        return f"{self.prefix}{{{owner}}}:{rest}"

    async def _run(
        self, script: str, keys: list[str], args: list[Any], *, idempotent: bool = False
    ) -> Any:
        return await self._answer(
            lambda: self._scripts[script](keys=keys, args=args), idempotent=idempotent
        )

    async def _answer(
        self, request: Callable[[], Awaitable[Any]], *, idempotent: bool = False
    ) -> Any:
        """One round trip, on asyncio, within ``timeout_ms``: any failure a ``StoreError``.
        An ``idempotent`` one (the ledger's, by operation id; a read) is sent once more
        when the connection it went out on was closed (a restarted server)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise StoreUnsupported(_TRIO) from None
        try:
            async with asyncio.timeout(self.timeout_s):
                if not idempotent:
                    return await request()
                try:
                    return await request()
                except self._redis.ConnectionError:
                    return await request()
        except TimeoutError as error:
            raise StoreError(f"redis did not answer within {self.timeout_s * 1000:g} ms") from error
        except asyncio.CancelledError:
            raise
        except Exception as error:  # connection refused, reset, a script error, garbage
            raise StoreError(f"redis: {type(error).__name__}: {cut(str(error), 200)}") from error

    # -- buckets -------------------------------------------------------------------------

    async def take(self, key: str, per_second: float, burst: float, amount: float = 1.0) -> float:
        answer = await self._run("take", [self._soft(key)], [per_second, burst, amount])
        return _number(answer)

    # -- breakers ------------------------------------------------------------------------

    def _breaker_keys(self, key: str) -> list[str]:
        base = self._soft(key)
        return [base, f"{base}:outcomes", f"{base}:failures"]

    async def admit(self, key: str, break_s: float) -> Admission:
        probe = uuid.uuid4().hex
        base = self._soft(key)
        answer = await self._run("admit", [base], [break_s, self.lease_s, self.idle_ttl_ms, probe])
        try:
            admitted, wait, probing = answer
            admission = Admission(bool(int(admitted)), _number(wait), bool(int(probing)))
        except (TypeError, ValueError) as error:
            raise StoreError(f"redis answered {cut(answer)} to a breaker's admit") from error
        if admission.probe:
            self._probes[base] = probe  # renewed while it runs
            self._renew_soon()
        return admission

    async def record(
        self,
        key: str,
        failed: bool,
        probe: bool,
        *,
        window_s: float,
        minimum_calls: int,
        failure_ratio: float,
    ) -> BreakerState | None:
        keys = self._breaker_keys(key)
        probe_id = self._probes.pop(keys[0], "") if probe else ""
        answer = await self._run(
            "record",
            keys,
            [
                int(failed),
                int(probe),
                window_s,
                minimum_calls,
                failure_ratio,
                uuid.uuid4().hex,
                self.idle_ttl_ms,
                probe_id,
            ],
        )
        state = answer.decode() if isinstance(answer, bytes) else answer
        if state in ("open", "closed"):
            return "open" if state == "open" else "closed"
        if state in ("", None):
            return None
        raise StoreError(f"redis answered {cut(answer)} to a breaker's record")

    async def release_probe(self, key: str) -> None:
        base = self._soft(key)
        probe = self._probes.pop(base, "")
        await self._run("release_probe", [base], [probe])

    async def breaker_state(self, key: str) -> BreakerState:
        """A breaker's state now, as the server holds it (``closed`` when it has none)."""
        state = await self._answer(lambda: self.client.hget(self._soft(key), "state"))
        text = state.decode() if isinstance(state, bytes) else state
        return text if text in ("open", "half_open") else "closed"  # type: ignore[return-value]

    # -- slots ---------------------------------------------------------------------------

    async def acquire(self, key: str, limit: int) -> str | None:
        if self._doubtful_leases:
            await self._forget_doubtful_leases()
        lease = uuid.uuid4().hex
        slots = self._soft(key)
        try:
            answer = await self._run("acquire", [slots], [limit, self.lease_s, lease])
        except BaseException:
            # The script may have run with its answer lost: a slot nobody holds would
            # then be taken until its lease ends. Given back at the next contact.
            self._doubtful_leases[lease] = slots
            raise
        if answer is None:
            return None
        self._leases[lease] = slots
        self._renew_soon()
        return lease

    async def _forget_doubtful_leases(self) -> None:
        doubtful = dict(self._doubtful_leases)
        with contextlib.suppress(StoreError):
            await self._answer(lambda: _zrem_each(self.client, doubtful))
            for lease in doubtful:
                self._doubtful_leases.pop(lease, None)

    async def release_slot(self, key: str, lease: str) -> None:
        slots = self._leases.pop(lease, self._soft(key))
        try:
            await self._answer(lambda: self.client.zrem(slots, lease))
        except BaseException:
            self._doubtful_leases[lease] = slots
            raise

    def _renew_soon(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_leases())

    async def _renew_leases(self) -> None:
        """Renew every slot and probe this process holds every third of a lease, until
        none is held."""
        while self._leases or self._probes:
            await asyncio.sleep(self.lease_s / 3)
            held, probes = dict(self._leases), dict(self._probes)
            if not held and not probes:
                return
            with contextlib.suppress(StoreError):
                await self._run(
                    "renew",
                    [*held.values(), *probes],
                    [self.lease_s, len(held), *held, *probes.values()],
                )

    # -- counters and shared limits (soft state) -----------------------------------------

    async def add(
        self, key: str, amount: float, *, limit: float | None = None, initial: float = 0.0
    ) -> tuple[bool, float]:
        answer = await self._run(
            "add",
            [self._soft(key)],
            [amount, "" if limit is None else limit, initial, self.idle_ttl_ms],
        )
        try:
            added, total = answer
            return bool(int(added)), _number(total)
        except (TypeError, ValueError) as error:
            raise StoreError(f"redis answered {cut(answer)} to a counter's add") from error

    async def read(self, key: str) -> float:
        value = await self._answer(lambda: self.client.get(self._soft(key)), idempotent=True)
        return 0.0 if value is None else _number(value)

    async def read_limit(self, key: str, initial: float) -> tuple[float, int]:
        answer = await self._run("read_limit", [self._soft(key)], [initial, self.idle_ttl_ms])
        return _limit(answer)

    async def swap_limit(
        self, key: str, version: int, value: float, low: float, high: float, *, bump: bool
    ) -> tuple[float, int]:
        answer = await self._run(
            "swap_limit",
            [self._soft(key)],
            [version, value, low, high, self.idle_ttl_ms, int(bump)],
        )
        return _limit(answer)

    # -- the ledger ----------------------------------------------------------------------

    async def _forget_doubtful_operations(self) -> None:
        for op_id in list(self._doubtful_operations):
            try:
                await self._run("release_op", [self._owned(op_id)], [self.reservation_ttl_ms])
            except StoreError:
                return
            self._doubtful_operations.discard(op_id)

    async def reserve(
        self,
        op_id: str,
        amounts: Mapping[str, float],
        windows: Sequence[Window],
        *,
        lease_s: float | None = None,
    ) -> Reservation:
        if self._doubtful_operations:
            await self._forget_doubtful_operations()
        lease_ms = self.reservation_ttl_ms if lease_s is None else max(1, int(lease_s * 1000))
        args: list[Any] = [lease_ms]
        for window in windows:
            args += [
                float(amounts.get(window.unit, 0.0)),
                "" if window.limit is None else window.limit,
                window.floor,
                max(1, math.ceil(window.ttl_s * 1000)),
                window.unit,
                "" if window.slide_s is None else window.slide_s,
            ]
        keys = [self._owned(op_id), *(self._owned(window.key) for window in windows)]
        answer = await self._run("reserve", keys, args, idempotent=True)
        try:
            status, index, used, wait = answer
            status, index = int(status), int(index)
        except (TypeError, ValueError) as error:
            raise StoreError(f"redis answered {cut(answer)} to a reservation") from error
        if status == 0:
            retry_after = _number(wait) if wait not in ("", b"") else None
            return Reservation(op_id, False, windows[index - 1], _number(used), False, retry_after)
        return Reservation(op_id, status in (1, 2), duplicate=status != 1)

    async def settle(self, op_id: str, actual: Mapping[str, float]) -> Settlement:
        pairs: list[Any] = []
        for unit, amount in actual.items():
            pairs += [unit, float(amount)]
        return _settlement(await self._run("settle", [self._owned(op_id)], pairs, idempotent=True))

    async def release(self, op_id: str) -> Settlement:
        try:
            answer = await self._run("release_op", [self._owned(op_id)], [self.reservation_ttl_ms])
        except BaseException:
            # Not given back now: at the next contact (a reservation that arrives after
            # it is void, so the order does not matter).
            self._doubtful_operations.add(op_id)
            raise
        return _settlement(answer)

    async def balance(self, window: Window) -> float:
        if window.slide_s is not None:
            held = await self._run(
                "sliding_balance", [self._owned(window.key)], [window.slide_s], idempotent=True
            )
            return max(_number(held), window.floor)
        value = await self._answer(
            lambda: self.client.get(self._owned(window.key)), idempotent=True
        )
        return max(0.0 if value is None else _number(value), window.floor)

    async def close(self, keys: Sequence[str]) -> None:
        if keys:
            owned = [self._owned(key) for key in keys]
            await self._answer(lambda: _delete_each(self.client, owned), idempotent=True)

    async def write_control(self, key: str, value: str | None) -> None:
        """Set an operator's override (``None``: remove it): one field of the prefix's
        ``control`` hash, seen by every process on the server."""
        name = f"{self.prefix}control"
        if value is None:
            await self._answer(lambda: self.client.hdel(name, key), idempotent=True)
        else:
            await self._answer(lambda: self.client.hset(name, key, value), idempotent=True)

    async def read_controls(self) -> dict[str, str]:
        """Every operator's override."""
        found = await self._answer(
            lambda: self.client.hgetall(f"{self.prefix}control"), idempotent=True
        )
        return {
            (k.decode() if isinstance(k, bytes) else str(k)): (
                v.decode() if isinstance(v, bytes) else str(v)
            )
            for k, v in (found or {}).items()
        }

    async def aclose(self) -> None:
        """Close the client's connections (and stop renewing leases)."""
        if self._renewer is not None:
            self._renewer.cancel()
        await self.client.aclose()


async def _zrem_each(client: Any, leases: Mapping[str, str]) -> None:
    async with client.pipeline(transaction=False) as pipe:
        for lease, slots in leases.items():
            pipe.zrem(slots, lease)
        await pipe.execute()


async def _delete_each(client: Any, keys: list[str]) -> None:
    # one DEL per key: keys of one owner share a slot, but a cluster client routes each
    async with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.delete(key)
        await pipe.execute()


def _settlement(answer: object) -> Settlement:
    text = answer.decode() if isinstance(answer, bytes) else answer
    if text in ("settled", "released", "duplicate", "unknown"):
        return text  # one of the four, as checked
    raise StoreError(f"redis answered {cut(answer)} to a settlement")


def _limit(answer: Any) -> tuple[float, int]:
    try:
        value, version = answer
        return _number(value), int(version)
    except (TypeError, ValueError) as error:
        raise StoreError(f"redis answered {cut(answer)} to a shared limit") from error


def _number(value: object) -> float:
    try:
        number = float(value.decode() if isinstance(value, bytes) else value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise StoreError(f"redis answered {cut(value)} where a number was due") from error
    if not math.isfinite(number):
        raise StoreError(f"redis answered {number} where a finite number was due")
    return number
