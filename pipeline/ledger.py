"""The ledger: what caps have counted, reserved before and settled after, never forgotten.

Two kinds of state live in a store, with two promises. *Soft state* — token buckets,
breaker windows and probes, bulkhead slots, an adaptive limit — may be forgotten and
rebuilt (``StateStore``, ``pipeline/store.py``): losing it costs a little admission
accuracy. *Accounting* — every cap's count: tool calls and model calls per turn and
session, tokens and dollars in every window, a tenant's calendar windows, a gateway's
quotas — is a promise to stop loss. It goes through this seam, the ``Ledger``:

* ``reserve(op_id, amounts, windows)`` adds ``amounts[window.unit]`` to every window
  it names, all or none: a window whose ``limit`` the addition would pass refuses the
  whole reservation, and the answer names it. Concurrent calls therefore overshoot a
  limit by at most the error of their estimates — nothing when each estimate is at
  least what its call really costs.
* ``settle(op_id, actual)`` replaces the reservation by what was spent (by unit; a
  unit it does not report stays at its reservation); ``release(op_id)`` gives the
  reservation back (the call never reached the provider or the tool).
* Each is idempotent by ``op_id``: a retried or late settle never counts twice, a
  settle after a release is refused, a release before its reservation arrived keeps
  that reservation from ever counting. A reservation never settled stays charged in
  full: when its lease ends (``lease_s``) the record of it goes and a late settle is
  refused.
* Windows live as long as they mean something (``Window.ttl_s``, extended by each
  use and never shortened): a calendar window until it ends, a session's for the
  session's lifetime; a turn's go when the turn ends (``close``). ``Window.floor`` is
  what the window held at least — the session log's count — so a store that lost a
  session's entry (a Redis restart) counts on from the larger of the two.
* Ledger entries are never evicted to make room: ``MemoryStore``'s bound applies to
  soft state only.
* A **sliding** window (``Window(slide_s=60)``: a rate per minute) holds what was
  reserved in the last ``slide_s`` seconds, kept in sixty buckets of ``slide_s / 60``;
  it counts the bucket a reservation fell in for a whole ``slide_s`` after that
  bucket ended, so in any ``slide_s`` seconds at most its limit is admitted (a
  settlement that spent more than was reserved aside). A reservation it refuses says
  when enough of what it holds will have slid out (``Reservation.retry_after_s``).
  Sliding windows count in the store's monotonic clock (anyio's in memory, the
  server's on Redis).

``MemoryStore`` and ``RedisStore`` implement both seams (one object,
``Harness(store=…)``). Amounts are floats; a unit is a name (``calls``, ``tokens``,
``usd``). Keys are ``pipeline.keys.store_key`` parts, the owner (a plugin's
namespace) first: an operation's id and its windows share that owner.
"""

from __future__ import annotations

import datetime
import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Literal, Protocol, TypeAlias, runtime_checkable

import anyio
import attrs

from guardstack.pipeline.frozen import quick_init

__all__ = [
    "DAY_S",
    "SESSION_TTL_S",
    "SLIDING_BUCKETS",
    "Ledger",
    "MemoryLedger",
    "Reservation",
    "Settlement",
    "Window",
    "bucket_of",
    "calendar_periods",
    "calendar_window",
    "sliding_wait",
]

#: How long a session's entries live after their last use, unless the store says.
SESSION_TTL_S: Final = 30 * 86_400.0
#: One day, in seconds: a calendar day window's length and a turn's safety lifetime.
DAY_S: Final = 86_400.0
#: How long an operation's reservation (and the record of its settlement) is kept.
LEASE_S: Final = 3_600.0
#: Amounts within this of a limit count as at it (sums of prices are not exact).
_EPSILON: Final = 1e-9

#: What ``settle`` and ``release`` answer: ``settled``/``released`` (done now),
#: ``duplicate`` (it was already), the other word (the operation had ended the other
#: way, so this is refused), or ``unknown`` (no reservation by that id — never made,
#: or its lease ended and it stays charged in full).
Settlement: TypeAlias = Literal["settled", "released", "duplicate", "unknown"]


def _non_negative(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"Window.{attribute.name} must be a number >= 0, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"Window.{attribute.name} must be finite, got {value!r}")


def _optional_limit(_: object, attribute: attrs.Attribute[float | None], value: object) -> None:
    if value is not None:
        _non_negative(_, attribute, value)  # type: ignore[arg-type]


def _optional_slide(_: object, attribute: attrs.Attribute[float | None], value: object) -> None:
    if value is not None:
        _non_negative(_, attribute, value)  # type: ignore[arg-type]
        if not value:
            raise ValueError(f"Window.slide_s must be > 0, got {value!r}")


@attrs.frozen
class Window:
    """One counter an operation reserves in: its key, the unit it counts, its limit
    (``None``: counted, never refused), how long it lives from now at least, and the
    least it holds (a session log's count, for a store that lost it). With
    ``slide_s`` it holds only what was reserved in the last ``slide_s`` seconds."""

    key: str
    unit: str
    limit: float | None = attrs.field(default=None, validator=_optional_limit)
    ttl_s: float = attrs.field(default=SESSION_TTL_S, validator=_non_negative)
    floor: float = attrs.field(default=0.0, validator=_non_negative)
    slide_s: float | None = attrs.field(default=None, validator=_optional_slide, kw_only=True)


#: How many buckets a sliding window is cut into.
SLIDING_BUCKETS: Final = 60


def bucket_of(now: float, slide_s: float) -> int:
    """The bucket a moment falls in (buckets of ``slide_s / 60``)."""
    return math.floor(now * SLIDING_BUCKETS / slide_s)


def sliding_wait(
    buckets: Mapping[int, float], current: int, slide_s: float, now: float, excess: float
) -> float | None:
    """How long until buckets holding ``excess`` have slid out of the window (``None``:
    they never will: what is asked is more than the limit)."""
    freed = 0.0
    width = slide_s / SLIDING_BUCKETS
    for index in sorted(buckets):
        if index < current - SLIDING_BUCKETS:
            continue
        freed += buckets[index]
        if freed >= excess - _EPSILON:
            return max(0.0, (index + SLIDING_BUCKETS + 1) * width - now)
    return None


#: A calendar window's entry outlives its end by this much (clocks a little apart).
CALENDAR_GRACE_S: Final = 3_600.0


def calendar_window(now: float, kind: str) -> tuple[str, float, float]:
    """The UTC calendar ``kind`` window ``now`` is in: its name, start and end."""
    moment = datetime.datetime.fromtimestamp(now, tz=datetime.UTC)
    if kind == "minute":
        start = moment.replace(second=0, microsecond=0)
        end = start + datetime.timedelta(minutes=1)
        name = start.strftime("%Y-%m-%dT%H:%M")
    elif kind == "hour":
        start = moment.replace(minute=0, second=0, microsecond=0)
        end = start + datetime.timedelta(hours=1)
        name = start.strftime("%Y-%m-%dT%H")
    elif kind == "day":
        start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        end = start + datetime.timedelta(days=1)
        name = start.strftime("%Y-%m-%d")
    elif kind == "week":
        day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        start = day - datetime.timedelta(days=day.weekday())
        end = start + datetime.timedelta(days=7)
        year, week, _ = start.isocalendar()
        name = f"{year}-W{week:02d}"
    elif kind == "month":
        start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = (start + datetime.timedelta(days=32)).replace(day=1)
        name = start.strftime("%Y-%m")
    else:
        raise ValueError(f"no calendar window {kind!r}")
    return name, start.timestamp(), end.timestamp()


def calendar_periods(now: float) -> dict[str, tuple[str, float]]:
    """The calendar (UTC) periods a window counts in at ``now`` (``day``, ``month``):
    each one's name (``2026-12-04``, ``2026-12``) and the seconds until it ends, plus a
    grace (its entry's lifetime)."""
    periods = {}
    for kind in ("day", "month"):
        name, _, end = calendar_window(now, kind)
        periods[kind] = (name, end - now + CALENDAR_GRACE_S)
    return periods


@quick_init
@attrs.frozen
class Reservation:
    """A ledger's answer to ``reserve``: granted, or refused by ``window`` (which held
    ``used`` and would have passed its limit). ``duplicate``: this ``op_id`` had
    already reserved (or ended): nothing was added again."""

    op_id: str
    granted: bool
    window: Window | None = None
    used: float = 0.0
    duplicate: bool = False
    #: A sliding window's refusal: how long until there is room (``None``: never).
    retry_after_s: float | None = None


@runtime_checkable
class Ledger(Protocol):
    """The accounting seam (see the module docstring); every operation atomic."""

    name: str

    async def reserve(
        self,
        op_id: str,
        amounts: Mapping[str, float],
        windows: Sequence[Window],
        *,
        lease_s: float | None = None,
    ) -> Reservation:
        """Add ``amounts[w.unit]`` to every window ``w``, all or none; the operation may be
        settled or released for ``lease_s`` (``None``: the store's lease)."""
        ...

    async def settle(self, op_id: str, actual: Mapping[str, float]) -> Settlement:
        """Replace the reservation by what was spent, by unit."""
        ...

    async def release(self, op_id: str) -> Settlement:
        """Give the reservation back (the operation never reached what it pays for)."""
        ...

    async def balance(self, window: Window) -> float:
        """What ``window`` holds now (spent and reserved; at least its floor)."""
        ...

    async def close(self, keys: Sequence[str]) -> None:
        """Forget windows whose meaning ended (a turn's, when the turn ends)."""
        ...


class _Counter:
    __slots__ = ("expires", "value")

    def __init__(self, value: float, expires: float) -> None:
        self.value = value
        self.expires = expires


class _Sliding:
    """A sliding window's buckets (index -> amount, oldest first) and their running total."""

    __slots__ = ("buckets", "expires", "held")

    def __init__(self, expires: float) -> None:
        self.buckets: dict[int, float] = {}
        self.expires = expires
        self.held = 0.0

    def total(self, current: int) -> float:
        buckets = self.buckets
        oldest = current - SLIDING_BUCKETS
        while buckets:
            first = next(iter(buckets))
            if first >= oldest:
                break
            self.held -= buckets.pop(first)
        if not buckets:
            self.held = 0.0  # no rounding left behind
        return max(0.0, self.held)

    def add(self, index: int, amount: float) -> None:
        buckets = self.buckets
        before = buckets.get(index)
        if before is None:
            if amount <= 0:
                return  # a bucket slid out (or never held anything): nothing to change
            buckets[index] = amount  # the newest bucket: appended in order
            self.held += amount
            return
        after = max(0.0, before + amount)
        buckets[index] = after
        self.held += after - before


class _Operation:
    __slots__ = ("expires", "reserved", "sliding")

    def __init__(
        self,
        reserved: list[tuple[_Counter, str, float]],
        expires: float,
        sliding: list[tuple[_Sliding, str, float, int]] | None = None,
    ) -> None:
        self.reserved = reserved  # (the window's counter, unit, amount)
        self.expires = expires
        #: (a sliding window, unit, amount, the bucket it was reserved in)
        self.sliding = sliding


class MemoryLedger:
    """The ledger kept in this process (``MemoryStore``'s half): never evicted, each
    entry kept until its lifetime (by the UTC wall clock) ends; expired entries are
    dropped as new operations come, in order of expiry.

    An operation's record is kept for its lease whichever way it ended, as every store
    keeps it: a ``reserve`` sent again after its settle or release is a ``duplicate``
    that counts nothing (granted if it had settled, refused if it was released), a
    second settle is a ``duplicate``, a settle after a release answers ``released`` —
    the answers ``RedisStore`` gives, so a caller that re-sends (a retried activity, a
    gateway) is counted once on either. An ended record is a pair (how it ended, when
    its lease ends) and holds nothing of its windows."""

    def __init__(
        self,
        *,
        wall_clock: Callable[[], float] | None = None,
        lease_s: float = LEASE_S,
        session_ttl_s: float = SESSION_TTL_S,
    ) -> None:
        #: The UTC wall clock calendar windows are cut by (seconds since the epoch).
        self.wall_clock = wall_clock or time.time
        self.lease_s = lease_s
        self.session_ttl_s = session_ttl_s
        self._windows: dict[str, _Counter] = {}
        #: Sliding windows, by key (their own lifetimes: a window idle for longer than
        #: it slides holds nothing, and goes).
        self._sliding: dict[str, _Sliding] = {}
        #: Operation records in the order made: with one lease for all, also the order
        #: they expire in (settled and released ones leave at once).
        self._operations: dict[str, _Operation] = {}
        #: Operations that ended, kept for their lease to answer what comes again:
        #: op id -> (settled, not released; when the record goes), in the order they ended.
        self._ended: dict[str, tuple[bool, float]] = {}
        #: (expiry when pushed, key), a min-heap with one item per window: a window whose
        #: life was extended since is pushed again when its old expiry comes.
        self._expiries: list[tuple[float, str]] = []

    def ledger_size(self) -> int:
        """How many windows (sliding ones too) and operation records the ledger holds."""
        return len(self._windows) + len(self._sliding) + len(self._operations) + len(self._ended)

    def _expire(self, now: float) -> None:
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            _, key = heapq.heappop(expiries)
            counter = self._windows.get(key)
            if counter is None:
                continue
            if counter.expires <= now:
                del self._windows[key]
            else:
                heapq.heappush(expiries, (counter.expires, key))
        operations = self._operations
        while operations:
            op_id = next(iter(operations))
            if operations[op_id].expires > now:
                break
            del operations[op_id]
        ended = self._ended
        while ended:
            op_id = next(iter(ended))
            if ended[op_id][1] > now:
                break
            del ended[op_id]

    def _window(self, key: str, now: float) -> _Counter | None:
        counter = self._windows.get(key)
        if counter is not None and counter.expires <= now:
            del self._windows[key]
            return None
        return counter

    async def reserve(
        self,
        op_id: str,
        amounts: Mapping[str, float],
        windows: Sequence[Window],
        *,
        lease_s: float | None = None,
    ) -> Reservation:
        now = self.wall_clock()
        operations = self._operations
        expiries = self._expiries
        ended = self._ended
        if (
            (expiries and expiries[0][0] <= now)
            or (operations and next(iter(operations.values())).expires <= now)
            or (ended and next(iter(ended.values()))[1] <= now)
        ):
            self._expire(now)
        if op_id in operations:
            return Reservation(op_id, True, duplicate=True)
        if ended:
            gone = ended.get(op_id)
            if gone is not None and gone[1] > now:
                return Reservation(op_id, gone[0], duplicate=True)
        found = self._windows
        counters = []
        sliding: list[tuple[Window, _Sliding | None, int, float]] = []
        for window in windows:
            amount = amounts.get(window.unit, 0.0)
            if window.slide_s is not None:
                refused = self._slide(window, amount, sliding)
                if refused is not None:
                    return Reservation(op_id, *refused)
                continue
            counter = found.get(window.key)
            if counter is not None and counter.expires <= now:
                del found[window.key]
                counter = None
            value = counter.value if counter is not None else 0.0
            if window.floor > value:
                value = window.floor
            limit = window.limit
            if limit is not None and amount > 0 and value + amount > limit + _EPSILON:
                return Reservation(op_id, False, window, value)
            counters.append((window, counter, value, amount))
        slid = []
        for window, slider, index, amount in sliding:
            assert window.slide_s is not None
            if slider is None:
                slider = self._sliding[window.key] = _Sliding(0.0)
            # in the monotonic clock ``_slide`` reads, not the wall clock: measured
            # against the other, an idle window was never forgotten
            slider.expires = anyio.current_time() + 2 * window.slide_s
            slider.add(index, amount)
            slid.append((slider, window.unit, amount, index))
        reserved = []
        for window, counter, value, amount in counters:
            expires = now + window.ttl_s
            if counter is None:
                counter = found[window.key] = _Counter(value, expires)
                heapq.heappush(self._expiries, (expires, window.key))
            elif expires > counter.expires:
                counter.expires = expires
            counter.value = value + amount
            reserved.append((counter, window.unit, amount))
        lease = self.lease_s if lease_s is None else lease_s
        operations[op_id] = _Operation(reserved, now + lease, slid or None)
        return Reservation(op_id, True)

    def _slide(
        self,
        window: Window,
        amount: float,
        sliding: list[tuple[Window, _Sliding | None, int, float]],
    ) -> tuple[bool, Window, float, bool, float | None] | None:
        """Check a sliding window (in the monotonic clock); the refusal's fields, or
        ``None`` with the window noted in ``sliding``."""
        slide_s = window.slide_s
        assert slide_s is not None
        now = anyio.current_time()
        if len(self._sliding) > 1_024:  # windows of keys no longer used: dropped
            for key in [k for k, known in self._sliding.items() if known.expires <= now]:
                del self._sliding[key]
        index = bucket_of(now, slide_s)
        slider = self._sliding.get(window.key)
        if slider is not None and slider.expires <= now:
            del self._sliding[window.key]
            slider = None
        value = slider.total(index) if slider is not None else 0.0
        limit = window.limit
        if limit is not None and amount > 0 and value + amount > limit + _EPSILON:
            wait = None
            if slider is not None and amount <= limit:
                wait = sliding_wait(slider.buckets, index, slide_s, now, value + amount - limit)
            return False, window, value, False, wait
        sliding.append((window, slider, index, amount))
        return None

    def _ended_as(self, op_id: str, now: float) -> bool | None:
        """How an operation ended (``True``: settled, ``False``: released), if its
        record is still kept."""
        gone = self._ended.get(op_id)
        return gone[0] if gone is not None and gone[1] > now else None

    async def settle(self, op_id: str, actual: Mapping[str, float]) -> Settlement:
        operation = self._operations.get(op_id)
        now = self.wall_clock()
        if operation is None or operation.expires <= now:
            ended = self._ended_as(op_id, now) if self._ended else None
            if ended is None:
                return "unknown"
            return "duplicate" if ended else "released"
        # each counter as reserved: one closed or expired since is no longer in the ledger,
        # so changing it changes nothing (a closed window stays closed)
        for counter, unit, amount in operation.reserved:
            spent = actual.get(unit, amount)
            if spent != amount:
                counter.value = max(0.0, counter.value + spent - amount)
        for slider, unit, amount, index in operation.sliding or ():
            spent = actual.get(unit, amount)
            if spent != amount:
                slider.add(index, spent - amount)
        del self._operations[op_id]
        self._ended[op_id] = (True, operation.expires)
        return "settled"

    async def release(self, op_id: str) -> Settlement:
        now = self.wall_clock()
        self._expire(now)
        operation = self._operations.get(op_id)
        if operation is None:
            ended = self._ended_as(op_id, now) if self._ended else None
            if ended is not None:
                return "settled" if ended else "duplicate"
            # a reservation arriving later is void (memory order is kept by lease: the
            # tombstone's, like any record's, is the store's own)
            self._ended[op_id] = (False, now + self.lease_s)
            return "unknown"
        for counter, _, amount in operation.reserved:
            counter.value = max(0.0, counter.value - amount)
        for slider, _, amount, index in operation.sliding or ():
            slider.add(index, -amount)
        del self._operations[op_id]
        self._ended[op_id] = (False, operation.expires)
        return "released"

    async def balance(self, window: Window) -> float:
        if window.slide_s is not None:
            slider = self._sliding.get(window.key)
            now = anyio.current_time()
            if slider is None or slider.expires <= now:
                return window.floor
            return max(slider.total(bucket_of(now, window.slide_s)), window.floor)
        counter = self._window(window.key, self.wall_clock())
        return max(counter.value if counter is not None else 0.0, window.floor)

    async def windows(self, prefix: str) -> dict[str, float]:
        """Every plain window whose key begins with ``prefix``, and what it holds (spend
        reports read them)."""
        now = self.wall_clock()
        return {
            key: counter.value
            for key, counter in self._windows.items()
            if key.startswith(prefix) and counter.expires > now
        }

    async def close(self, keys: Sequence[str]) -> None:
        windows = self._windows
        for key in keys:
            windows.pop(key, None)
            self._sliding.pop(key, None)
        if len(self._expiries) > 2 * len(windows) + 64:  # closed windows' items: rebuilt
            self._expiries = [(counter.expires, key) for key, counter in windows.items()]
            heapq.heapify(self._expiries)
