"""``RedisStore``: the store and ledger seams on a Redis server, through redis-py's
asyncio client."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from guardstack.integrations._extras import require
from guardstack.pipeline.errors import StoreUnsupported
from guardstack.pipeline.ledger import LEASE_S, SESSION_TTL_S, Reservation, Settlement, Window
from guardstack.pipeline.store import Admission, BreakerState, StoreError
from guardstack.pipeline.validate import cut, in_ms

if TYPE_CHECKING:
    from redis.asyncio import Redis

from guardstack.integrations.redis.scripts import SCRIPTS

EXTRA = "redis"


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
        idle_ttl_ms: float = 86_400_000,
        session_ttl_ms: float = SESSION_TTL_S * 1000,
        reservation_ttl_ms: float = LEASE_S * 1000,
        on_error: Literal["open", "closed"] | None = None,
        idle_ttl_s: float | None = None,
        session_ttl_s: float | None = None,
        reservation_ttl_s: float | None = None,
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
        idle_ttl_ms = in_ms("RedisStore", "idle_ttl", idle_ttl_s, idle_ttl_ms)
        session_ttl_ms = in_ms("RedisStore", "session_ttl", session_ttl_s, session_ttl_ms)
        reservation_ttl_ms = in_ms(
            "RedisStore", "reservation_ttl", reservation_ttl_s, reservation_ttl_ms
        )
        self.idle_ttl_ms = int(_positive("idle_ttl_ms", idle_ttl_ms))
        #: How long a session's ledger entries live after their last use.
        self.session_ttl_s = _positive("session_ttl_ms", session_ttl_ms) / 1000
        self.reservation_ttl_ms = int(_positive("reservation_ttl_ms", reservation_ttl_ms))
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
        self._scripts = {name: client.register_script(text) for name, text in SCRIPTS.items()}
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
        # answered: nothing to give back later (a re-send after a restart would leave a
        # tombstone the restart had cleared)
        self._doubtful_operations.discard(op_id)
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

    async def persistence(self) -> str | None:
        """Why the server would lose what this store counted when it restarts — it keeps
        no append-only file and takes no snapshots — or ``None`` when it keeps them."""
        answer = await self._answer(lambda: self.client.config_get("appendonly"), idempotent=True)
        saves = await self._answer(lambda: self.client.config_get("save"), idempotent=True)
        appendonly = str((answer or {}).get("appendonly", "no"))
        save = str((saves or {}).get("save", ""))
        if appendonly == "yes" or save.strip():
            return None
        return (
            "this Redis keeps nothing across a restart (appendonly no, no save points): a "
            "restart forgets every window's spend; run it with --appendonly yes"
        )

    async def windows(self, prefix: str) -> dict[str, float]:
        """Every plain window whose key begins with ``prefix``, and what it holds."""
        owned = self._owned(prefix)
        found: dict[str, float] = {}

        async def scan() -> None:
            async for name in self.client.scan_iter(match=_glob(owned) + "*", count=500):
                raw = name.decode() if isinstance(name, bytes) else str(name)
                value = await self.client.get(raw)
                try:
                    number = float(value) if isinstance(value, bytes | str) else math.nan
                except (TypeError, ValueError):
                    continue
                if math.isnan(number):
                    continue  # a sliding window, an operation record: not a plain window
                owner, _, rest = raw.removeprefix(self.prefix).partition(":")
                found[owner.strip("{}") + ":" + rest] = number

        await self._answer(scan, idempotent=True)
        return found

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


def _glob(text: str) -> str:
    """``text`` with Redis's glob characters escaped."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


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
