"""A ``StateStore`` on Redis: one limit for every process that shares the server.

Run the same stack on four workers and a ``RateLimit(per_second=10)`` in memory admits
40 calls a second; with a ``RedisStore`` the four share one bucket, one breaker, one
set of bulkhead slots and one spend counter::

    from guardstack.integrations.redis import RedisStore
    from guardstack.pipeline import Harness

    harness = Harness(model, store=RedisStore("redis://localhost:6379/0"))

How it works (extra ``redis``: redis-py's asyncio client; Redis ≥ 6.2 or Valkey):

* every operation is one server-side Lua script, so it is atomic across processes and
  costs one round trip; time is read from the server (``TIME``), so the processes'
  clocks never disagree;
* keys carry TTLs (a bucket until it would be full again, a breaker's outcomes for
  their window, counters and breaker state for ``idle_ttl_s``), so idle state expires
  on its own;
* a bulkhead slot is a lease that expires after ``lease_ms`` unless renewed: while a
  call runs, the store renews its leases every third of that, so a process killed
  mid-call gives its slots back within one lease; a breaker's half-open probe is held
  the same way, so a probe lost with its process lets another process probe;
* a server that is down, slower than ``timeout_ms`` or answers garbage raises
  ``StoreError`` and each layer does what ``on_error`` says (``None``: caps and spend
  limits fail closed; breakers, rate limits and concurrency limits fail open).
  Redis restarted mid-run: the next operations reconnect and state rebuilds.

It runs on asyncio only (redis-py's client is asyncio's); on trio every operation
raises ``RuntimeError`` saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Literal

from guardstack.integrations._extras import require
from guardstack.pipeline.store import Admission, BreakerState, StoreError
from guardstack.pipeline.validate import cut

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["RedisStore"]

EXTRA = "redis"
_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"

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

# KEYS: breaker hash. ARGV: break_s, probe lease (s), idle ttl (ms).
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
  redis.call('HSET', KEYS[1], 'state', 'half_open', 'probing', string.format('%.17g', now))
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, '0', 1}
end
return {1, '0', 0}
"""
)

# KEYS: breaker hash, outcomes zset, failures zset.
# ARGV: failed, probe, window_s, minimum_calls, failure_ratio, member, idle ttl (ms).
_RECORD: Final = (
    _NOW
    + """
local failed, probe = ARGV[1] == '1', ARGV[2] == '1'
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local function open()
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened', string.format('%.17g', now), 'probing', '')
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  redis.call('DEL', KEYS[2], KEYS[3])
  return 'open'
end
if probe then
  redis.call('HSET', KEYS[1], 'probing', '')
  if state ~= 'half_open' then return '' end
  if failed then return open() end
  redis.call('HSET', KEYS[1], 'state', 'closed')
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

_RELEASE_PROBE: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'probing', '') end
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

# KEYS: slots zsets; ARGV: lease (s), then one lease id per key.
_RENEW: Final = (
    _NOW
    + """
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + tonumber(ARGV[1]), ARGV[i + 1])
  redis.call('PEXPIRE', key, math.ceil(tonumber(ARGV[1]) * 1000) + 1000)
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

_SCRIPTS: Final = {
    "take": _TAKE,
    "admit": _ADMIT,
    "record": _RECORD,
    "release_probe": _RELEASE_PROBE,
    "acquire": _ACQUIRE,
    "renew": _RENEW,
    "add": _ADD,
}


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"RedisStore: {name} must be a positive number, got {cut(value)}")
    if not math.isfinite(value):
        raise ValueError(f"RedisStore: {name} must be finite, got {value}")
    return float(value)


class RedisStore:
    """guardstack's ``StateStore`` protocol on a Redis (or Valkey) server."""

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
        on_error: Literal["open", "closed"] | None = None,
    ) -> None:
        redis = require("redis.asyncio", EXTRA)
        if on_error not in (None, "open", "closed"):
            raise ValueError(
                f"RedisStore: on_error must be 'open', 'closed' or None, got {cut(on_error)}"
            )
        if not isinstance(prefix, str):
            raise TypeError(f"RedisStore: prefix must be text, got {cut(prefix)}")
        self.timeout_s = _positive("timeout_ms", timeout_ms) / 1000
        self.lease_s = _positive("lease_ms", lease_ms) / 1000
        self.idle_ttl_ms = int(_positive("idle_ttl_s", idle_ttl_s) * 1000)
        if client is None:
            client = redis.Redis.from_url(
                url or "redis://127.0.0.1:6379/0",
                socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s,
            )
        elif url is not None:
            raise ValueError("RedisStore: give a url or a client, not both")
        self.client = client
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
        self._renewer: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"RedisStore({self.url or '<client>'!r}, prefix={self.prefix!r})"

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        return await self._answer(lambda: self._scripts[script](keys=keys, args=args))

    async def _answer(self, request: Callable[[], Awaitable[Any]]) -> Any:
        """One round trip, on asyncio, within ``timeout_ms``: any failure a ``StoreError``."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "RedisStore runs on asyncio only (redis-py's client is asyncio's); "
                "run this harness with anyio.run(..., backend='asyncio')"
            ) from None
        try:
            async with asyncio.timeout(self.timeout_s):
                return await request()
        except TimeoutError as error:
            raise StoreError(f"redis did not answer within {self.timeout_s * 1000:g} ms") from error
        except asyncio.CancelledError:
            raise
        except Exception as error:  # connection refused, reset, a script error, garbage
            raise StoreError(f"redis: {type(error).__name__}: {cut(str(error), 200)}") from error

    # -- buckets -------------------------------------------------------------------------

    async def take(self, key: str, per_second: float, burst: float, amount: float = 1.0) -> float:
        answer = await self._run("take", [self.prefix + key], [per_second, burst, amount])
        return _number(answer)

    # -- breakers ------------------------------------------------------------------------

    def _breaker_keys(self, key: str) -> list[str]:
        base = self.prefix + key
        return [base, f"{base}:outcomes", f"{base}:failures"]

    async def admit(self, key: str, break_s: float) -> Admission:
        answer = await self._run(
            "admit", self._breaker_keys(key)[:1], [break_s, self.lease_s, self.idle_ttl_ms]
        )
        try:
            admitted, wait, probe = answer
            return Admission(bool(int(admitted)), _number(wait), bool(int(probe)))
        except (TypeError, ValueError) as error:
            raise StoreError(f"redis answered {cut(answer)} to a breaker's admit") from error

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
        answer = await self._run(
            "record",
            self._breaker_keys(key),
            [
                int(failed),
                int(probe),
                window_s,
                minimum_calls,
                failure_ratio,
                uuid.uuid4().hex,
                self.idle_ttl_ms,
            ],
        )
        state = answer.decode() if isinstance(answer, bytes) else answer
        if state in ("open", "closed"):
            return "open" if state == "open" else "closed"
        if state in ("", None):
            return None
        raise StoreError(f"redis answered {cut(answer)} to a breaker's record")

    async def release_probe(self, key: str) -> None:
        await self._run("release_probe", self._breaker_keys(key)[:1], [])

    async def breaker_state(self, key: str) -> BreakerState:
        """A breaker's state now, as the server holds it (``closed`` when it has none)."""
        state = await self._answer(lambda: self.client.hget(self.prefix + key, "state"))
        text = state.decode() if isinstance(state, bytes) else state
        return text if text in ("open", "half_open") else "closed"  # type: ignore[return-value]

    # -- slots ---------------------------------------------------------------------------

    async def acquire(self, key: str, limit: int) -> str | None:
        lease = uuid.uuid4().hex
        slots = self.prefix + key
        answer = await self._run("acquire", [slots], [limit, self.lease_s, lease])
        if answer is None:
            return None
        self._leases[lease] = slots
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_leases())
        return lease

    async def release(self, key: str, lease: str) -> None:
        slots = self._leases.pop(lease, self.prefix + key)
        await self._answer(lambda: self.client.zrem(slots, lease))

    async def _renew_leases(self) -> None:
        """Renew every lease this process holds every third of a lease, until none is held."""
        while self._leases:
            await asyncio.sleep(self.lease_s / 3)
            held = dict(self._leases)
            if not held:
                return
            with contextlib.suppress(StoreError):
                await self._run("renew", list(held.values()), [self.lease_s, *held])

    # -- counters ------------------------------------------------------------------------

    async def add(
        self, key: str, amount: float, *, limit: float | None = None, initial: float = 0.0
    ) -> tuple[bool, float]:
        answer = await self._run(
            "add",
            [self.prefix + key],
            [amount, "" if limit is None else limit, initial, self.idle_ttl_ms],
        )
        try:
            added, total = answer
            return bool(int(added)), _number(total)
        except (TypeError, ValueError) as error:
            raise StoreError(f"redis answered {cut(answer)} to a counter's add") from error

    async def read(self, key: str) -> float:
        value = await self._answer(lambda: self.client.get(self.prefix + key))
        return 0.0 if value is None else _number(value)

    async def aclose(self) -> None:
        """Close the client's connections (and stop renewing leases)."""
        if self._renewer is not None:
            self._renewer.cancel()
        await self.client.aclose()


def _number(value: object) -> float:
    try:
        number = float(value.decode() if isinstance(value, bytes) else value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise StoreError(f"redis answered {cut(value)} where a number was due") from error
    if not math.isfinite(number):
        raise StoreError(f"redis answered {number} where a finite number was due")
    return number
