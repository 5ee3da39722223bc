"""State stores: where every keyed layer keeps its soft state.

A breaker's window, a bucket's tokens, a bulkhead's slots and an adaptive limit are
*soft state*: forgotten, they are rebuilt at the cost of a little admission accuracy.
What caps count is accounting, and goes through the ``Ledger`` (``pipeline/ledger.py``),
which every store also implements. Soft state is kept in a ``StateStore`` through a
few operations, each atomic for its key (no
other operation on that key runs in between), each taking the store's own clock —
so a store shared by several processes (``integrations.redis.RedisStore``) gives
them one limit, and the same layer code runs on either.

``MemoryStore`` is the default, one per ``Harness``: it answers without suspending
(its ``async`` operations never await), so using it adds no scheduling. It is
bounded: past ``max_keys`` it forgets idle entries, least recently used first, in
constant time per new key; an entry is never forgotten while it is busy — a slot
held, a breaker open or with outcomes still in its window, a bucket not yet full
again — nor the entry being created. When every entry is busy it grows and warns
once. Windows are pruned by the current time, not by when a call started.

Waiting is the layers' business, not the store's: a rate limit's and a bulkhead's
queues of waiters live in the process (first come, first served there), and ask the
store again when their turn comes.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Final, Literal, Protocol, TypeAlias, runtime_checkable

import anyio
import attrs

from guardstack.pipeline.errors import GuardstackWarning
from guardstack.pipeline.ledger import LEASE_S, SESSION_TTL_S, MemoryLedger
from guardstack.pipeline.validate import in_ms, integer, number

__all__ = [
    "Admission",
    "BreakerState",
    "MemoryStore",
    "StateStore",
    "StoreError",
]

BreakerState: TypeAlias = Literal["closed", "open", "half_open"]

#: Tokens short by less than this count as there: a clock that cannot add a wait of 1e-16 s
#: to the current time would otherwise have a waiter sleep for nothing, forever.
_TOKEN_EPSILON: Final = 1e-9
#: How many of the oldest entries one new key may look at to find an idle one.
_EVICTION_LOOKS: Final = 8


class StoreError(Exception):
    """A store could not answer (down, too slow, or garbage); layers apply their policy."""


@attrs.frozen
class Admission:
    """A breaker's answer to one call: let it through (maybe as the probe), or how long to wait."""

    admitted: bool
    wait_s: float = 0.0
    probe: bool = False


@runtime_checkable
class StateStore(Protocol):
    """The operations keyed layers and caps keep their state through (each atomic per key).

    Keys are strings the layers build (their application's namespace and the tool,
    model or conversation); a store never interprets them. ``on_error`` is the
    store's failure policy for layers using it (``None``: each layer's default).
    """

    name: str
    on_error: Literal["open", "closed"] | None

    async def take(self, key: str, per_second: float, burst: float, amount: float = 1.0) -> float:
        """Take ``amount`` tokens from a bucket (refilled at ``per_second``, holding at most
        ``burst``, full at first): ``0.0`` when taken, else the seconds until they would be
        there (nothing taken). A negative ``amount`` deposits, up to ``burst``."""
        ...

    async def admit(self, key: str, break_s: float) -> Admission:
        """A breaker's decision for one call; after ``break_s`` open, one call is the probe."""
        ...

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
        """A call's outcome, at the current time; the breaker's new state if it changed."""
        ...

    async def release_probe(self, key: str) -> None:
        """The probe ended without an outcome (cancelled): the next call probes instead."""
        ...

    async def acquire(self, key: str, limit: int) -> str | None:
        """One of ``limit`` slots: a lease to give back, or ``None`` when all are held."""
        ...

    async def release_slot(self, key: str, lease: str) -> None:
        """Give a slot back."""
        ...

    async def add(
        self, key: str, amount: float, *, limit: float | None = None, initial: float = 0.0
    ) -> tuple[bool, float]:
        """Add to a counter (starting at ``initial``) unless that would pass ``limit``:
        ``(added, total)``. A negative amount gives back."""
        ...

    async def read(self, key: str) -> float:
        """A counter's value (0 when it has none)."""
        ...

    async def read_limit(self, key: str, initial: float) -> tuple[float, int]:
        """A shared limit (``initial`` at first) and its version."""
        ...

    async def swap_limit(
        self, key: str, version: int, value: float, low: float, high: float, *, bump: bool
    ) -> tuple[float, int]:
        """Set a shared limit to ``value`` clamped to ``[low, high]`` if it is still at
        ``version`` (compare and set), and with ``bump`` start a new version: of several
        processes that saw one overload, one lowers it. The limit and version after."""
        ...


class _Bucket:
    __slots__ = ("burst", "per_second", "tokens", "updated")

    def __init__(self, per_second: float, burst: float, now: float) -> None:
        self.per_second = per_second
        self.burst = burst
        self.tokens = float(burst)
        self.updated = now

    def refill(self, now: float) -> None:
        elapsed = now - self.updated
        if elapsed > 0:
            self.tokens = min(self.burst, self.tokens + elapsed * self.per_second)
        self.updated = now

    def idle(self, now: float) -> bool:
        self.refill(now)
        return self.tokens >= self.burst


class _Breaker:
    __slots__ = ("failures", "opened_at", "outcomes", "probing", "state", "window_s")

    def __init__(self) -> None:
        self.state: BreakerState = "closed"
        self.outcomes: deque[tuple[float, bool]] = deque()
        self.failures = 0
        self.opened_at = -math.inf
        self.probing = False
        self.window_s = 0.0

    def prune(self, now: float) -> None:
        outcomes = self.outcomes
        horizon = now - self.window_s
        while outcomes and outcomes[0][0] <= horizon:
            self.failures -= outcomes.popleft()[1]

    def idle(self, now: float) -> bool:
        if self.state != "closed":
            return False
        self.prune(now)
        return not self.outcomes

    def open(self, now: float) -> None:
        self.state, self.opened_at, self.probing = "open", now, False
        self.outcomes.clear()
        self.failures = 0


class _Slots:
    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held: set[str] = set()

    def idle(self, now: float) -> bool:
        return not self.held


class _Counter:
    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value

    def idle(self, now: float) -> bool:
        return True  # nothing in flight: least recently used counters may go first


class _Limit:
    __slots__ = ("value", "version")

    def __init__(self, value: float) -> None:
        self.value = value
        self.version = 0

    def idle(self, now: float) -> bool:
        return True  # soft state: forgotten, it starts again from its initial value


_Entry: TypeAlias = _Bucket | _Breaker | _Slots | _Counter | _Limit
_ADMITTED: Final = Admission(True)
_PROBE: Final = Admission(True, probe=True)
_PROBING: Final = Admission(False, 0.0)


class MemoryStore(MemoryLedger):
    """The in-process store: bounded, constant-time eviction of idle entries, never suspends.

    It is the in-process ``Ledger`` too (``MemoryLedger``): accounting is kept apart from
    the soft state and never evicted; ``max_keys`` bounds the soft state only.
    """

    name = "memory"
    #: Its operations never suspend: callers need not shield their cleanup.
    suspends = False

    def __init__(
        self,
        max_keys: int = 100_000,
        *,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] | None = None,
        on_error: Literal["open", "closed"] | None = None,
        session_ttl_ms: float = SESSION_TTL_S * 1000,
        reservation_ttl_ms: float = LEASE_S * 1000,
        lease_s: float | None = None,
        session_ttl_s: float | None = None,
    ) -> None:
        # The ledger's lifetimes, spelt as RedisStore spells them (the old seconds warn).
        session_ttl_ms = in_ms("MemoryStore", "session_ttl", session_ttl_s, session_ttl_ms)
        reservation_ttl_ms = in_ms(
            "MemoryStore", "reservation_ttl", lease_s, reservation_ttl_ms, old="lease_s"
        )
        super().__init__(
            wall_clock=wall_clock,
            lease_s=number("MemoryStore", "reservation_ttl_ms", reservation_ttl_ms, minimum=1)
            / 1000,
            session_ttl_s=number("MemoryStore", "session_ttl_ms", session_ttl_ms, minimum=1) / 1000,
        )
        self.max_keys = integer("MemoryStore", "max_keys", max_keys)
        #: The monotonic clock windows and waits are measured with (anyio's: virtual in tests).
        self.clock = clock or anyio.current_time
        self.on_error = on_error  # a memory store never fails; kept for the protocol
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._warned = False
        self._leases = itertools.count(1)
        #: An operator's overrides (``Control``): never evicted.
        self._controls: dict[str, str] = {}

    async def write_control(self, key: str, value: str | None) -> None:
        """Set an operator's override (``None``: remove it)."""
        if value is None:
            self._controls.pop(key, None)
        else:
            self._controls[key] = value

    async def read_controls(self) -> dict[str, str]:
        """Every operator's override."""
        return dict(self._controls)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __repr__(self) -> str:
        return f"MemoryStore(max_keys={self.max_keys})"

    def _entry(self, key: str, kind: type[_Entry], make: Callable[[], _Entry]) -> _Entry:
        entries = self._entries
        entry = entries.get(key)
        if entry is not None:
            entries.move_to_end(key)
            if type(entry) is not kind:
                raise TypeError(f"store key {key!r} holds a {type(entry).__name__}, not a {kind}")
            return entry
        entry = entries[key] = make()
        if len(entries) > self.max_keys:
            self._evict()
        return entry

    def _evict(self) -> None:
        """Forget idle entries among the oldest few until back at the bound (busy ones move to
        the back), so a store that had to grow shrinks again as soon as entries go idle."""
        entries = self._entries
        now = self.clock()
        for _ in range(min(_EVICTION_LOOKS, len(entries) - 1)):
            key, entry = next(iter(entries.items()))
            if entry.idle(now):
                del entries[key]
                if len(entries) <= self.max_keys:
                    return
            else:
                entries.move_to_end(key)  # busy: looked at again only after every other entry
        # None of the oldest few was idle: grow by one (busy ones now wait at the back).
        if not self._warned and len(entries) > self.max_keys * 1.1:
            self._warned = True
            warnings.warn(
                f"MemoryStore: more than {self.max_keys} keys, and the oldest are busy "
                "(calls in flight, breakers open); growing rather than dropping a limit",
                GuardstackWarning,
                stacklevel=4,
            )

    # -- buckets -------------------------------------------------------------------------

    async def take(self, key: str, per_second: float, burst: float, amount: float = 1.0) -> float:
        now = self.clock()
        bucket = self._entry(key, _Bucket, lambda: _Bucket(per_second, burst, now))
        assert isinstance(bucket, _Bucket)
        bucket.per_second, bucket.burst = per_second, burst
        bucket.refill(now)
        if amount <= 0:
            bucket.tokens = min(burst, bucket.tokens - amount)
            return 0.0
        if bucket.tokens + _TOKEN_EPSILON >= amount:
            bucket.tokens = max(0.0, bucket.tokens - amount)
            return 0.0
        return (amount - bucket.tokens) / per_second

    # -- breakers ------------------------------------------------------------------------

    async def admit(self, key: str, break_s: float) -> Admission:
        breaker = self._entry(key, _Breaker, _Breaker)
        assert isinstance(breaker, _Breaker)
        if breaker.state == "open":
            remaining = breaker.opened_at + break_s - self.clock()
            if remaining > 0:
                return Admission(False, remaining)
            breaker.state, breaker.probing = "half_open", False
        if breaker.state == "half_open":
            if breaker.probing:
                return _PROBING
            breaker.probing = True
            return _PROBE
        return _ADMITTED

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
        breaker = self._entry(key, _Breaker, _Breaker)
        assert isinstance(breaker, _Breaker)
        now = self.clock()
        breaker.window_s = window_s
        if probe:
            breaker.probing = False
            if breaker.state != "half_open":
                return None
            if failed:
                breaker.open(now)
                return "open"
            breaker.state = "closed"
            breaker.outcomes.clear()
            breaker.failures = 0
            return "closed"
        if breaker.state != "closed":
            return None  # admitted before it opened: the window starts afresh on closing
        breaker.outcomes.append((now, failed))
        breaker.failures += failed
        breaker.prune(now)
        calls = len(breaker.outcomes)
        if calls >= minimum_calls and breaker.failures >= failure_ratio * calls:
            breaker.open(now)
            return "open"
        return None

    async def release_probe(self, key: str) -> None:
        breaker = self._entries.get(key)
        if isinstance(breaker, _Breaker):
            breaker.probing = False

    def breaker_state(self, key: str) -> BreakerState:
        """A breaker's state now, without changing it (``closed`` when it has none)."""
        breaker = self._entries.get(key)
        return breaker.state if isinstance(breaker, _Breaker) else "closed"

    # -- slots ---------------------------------------------------------------------------

    async def acquire(self, key: str, limit: int) -> str | None:
        slots = self._entry(key, _Slots, _Slots)
        assert isinstance(slots, _Slots)
        if len(slots.held) >= limit:
            return None
        lease = str(next(self._leases))
        slots.held.add(lease)
        return lease

    async def release_slot(self, key: str, lease: str) -> None:
        slots = self._entries.get(key)
        if isinstance(slots, _Slots):
            slots.held.discard(lease)

    # -- counters ------------------------------------------------------------------------

    async def add(
        self, key: str, amount: float, *, limit: float | None = None, initial: float = 0.0
    ) -> tuple[bool, float]:
        counter = self._entry(key, _Counter, lambda: _Counter(initial))
        assert isinstance(counter, _Counter)
        total = counter.value + amount
        if limit is not None and amount > 0 and total > limit:
            return False, counter.value
        counter.value = total
        return True, total

    async def read(self, key: str) -> float:
        counter = self._entries.get(key)
        return counter.value if isinstance(counter, _Counter) else 0.0

    # -- shared limits -------------------------------------------------------------------

    async def read_limit(self, key: str, initial: float) -> tuple[float, int]:
        limit = self._entry(key, _Limit, lambda: _Limit(initial))
        assert isinstance(limit, _Limit)
        return limit.value, limit.version

    async def swap_limit(
        self, key: str, version: int, value: float, low: float, high: float, *, bump: bool
    ) -> tuple[float, int]:
        limit = self._entry(key, _Limit, lambda: _Limit(value))
        assert isinstance(limit, _Limit)
        if limit.version == version:
            limit.value = min(high, max(low, value))
            limit.version += bump
        return limit.value, limit.version
