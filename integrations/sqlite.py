"""``SqliteStore``: the store and ledger seams in one SQLite file — a gateway on one
machine keeps its months across restarts with no server to run.

The standard library's ``sqlite3`` in WAL mode (``synchronous=NORMAL``: a commit is
written to the WAL, synced at checkpoints). Every operation is one ``BEGIN IMMEDIATE``
transaction, so it is atomic for its keys whatever else runs — another harness, another
process on the same file — exactly as ``RedisStore``'s server-side scripts are, and it
answers alike (the stores' shared tests hold them to it). The event loop never waits
for a lock or a sync: a transaction runs in place when the file's write lock is free at
once (busy timeout 0; tens of microseconds), and on the store's worker thread when
another process is writing; every 256th operation, the worker checkpoints the WAL (a
passive checkpoint: transactions in place go on meanwhile). On asyncio and trio alike:

* **Ledger** (accounting, kept as long as it means something): windows, sliding
  windows' buckets and operation records by id, with ``reserve`` all or none, and
  ``settle``/``release`` idempotent by operation id for the reservation's lease.
* **Soft state** (buckets, breakers, slots, counters, shared limits): one row per key,
  forgotten after ``idle_ttl_ms`` unused. A slot is a lease (``lease_ms``) a crashed
  holder loses; this process renews its own as it uses the store.
* **Controls** (operators' overrides): one row each, read by every process.

Time is the wall clock (``time.time``: every process on the machine reads the same),
windows cut by it as ``UTC`` calendar windows are. A file that cannot be opened or
answers garbage is a ``StoreError``; layers apply their policy.

Extra: none — ``sqlite3`` is the standard library's.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from guardstack.integrations._sqlite_rows import (
    _EPSILON,
    _WORKER_EVERY,
    BUSY,
    _change,
    _closed,
    _forget_outcomes,
    _Link,
    _operation,
    _outcome,
    _put,
    _sliding,
    _sliding_wait,
    _soft,
    _sweep,
)
from guardstack.pipeline.ledger import (
    LEASE_S,
    SESSION_TTL_S,
    SLIDING_BUCKETS,
    Reservation,
    Settlement,
    Window,
)
from guardstack.pipeline.store import Admission, BreakerState, StoreError

__all__ = ["SqliteStore"]

T = TypeVar("T")

logger = logging.getLogger("guardstack")

#: How many operations between two sweeps of expired rows.
_SWEEP_EVERY: Final = 500


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"SqliteStore: {name} must be a positive number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"SqliteStore: {name} must be finite, got {value!r}")
    return float(value)


def default_path() -> Path:
    """``$XDG_STATE_HOME/guardstack/ledger.sqlite3`` (``~/.local/state`` when unset)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "guardstack" / "ledger.sqlite3"


class SqliteStore:
    """guardstack's ``StateStore`` and ``Ledger`` protocols in one SQLite file."""

    name = "sqlite"
    #: Its operations suspend (a worker thread): layers shield their cleanup.
    suspends = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        idle_ttl_ms: float = 86_400_000,
        session_ttl_ms: float = SESSION_TTL_S * 1000,
        reservation_ttl_ms: float = LEASE_S * 1000,
        lease_ms: float = 900_000,
        on_error: Literal["open", "closed"] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.path = Path(path)
        self.idle_ttl_s = _positive("idle_ttl_ms", idle_ttl_ms) / 1000
        self.session_ttl_s = _positive("session_ttl_ms", session_ttl_ms) / 1000
        self.lease_s = _positive("reservation_ttl_ms", reservation_ttl_ms) / 1000
        self.slot_lease_s = _positive("lease_ms", lease_ms) / 1000
        if on_error not in (None, "open", "closed"):
            raise ValueError(f"SqliteStore: on_error must be 'open' or 'closed', got {on_error!r}")
        self.on_error = on_error
        #: The wall clock every process on the machine shares (seconds since the epoch).
        self.wall_clock = clock or time.time
        #: Two connections to the file: one for transactions run in place, on the event
        #: loop's thread, that never wait for a lock (busy timeout 0, no checkpoint);
        #: one for the worker thread, that waits for other processes' transactions and
        #: checkpoints the WAL.
        self._here = _Link(self.path, wait=False)
        self._worker = _Link(self.path, wait=True)
        self._limiter = anyio.CapacityLimiter(1)
        self._in_place = 0
        self._operations = 0
        #: Slots and probes this process holds (renewed as it uses the store).
        self._held: dict[str, str] = {}  # lease -> slots key
        self._probes: dict[str, str] = {}  # breaker key -> probe id
        self._renewed = 0.0

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    # -- the connection ------------------------------------------------------------------

    def _transaction(self, work: Callable[[sqlite3.Connection, float], T], link: _Link) -> Any:
        """``work(connection, now)`` in one ``BEGIN IMMEDIATE`` transaction on ``link``;
        any failure a ``StoreError`` and nothing written. ``BUSY`` from the link that
        never waits, when another connection holds the write lock."""
        with link.lock:
            try:
                connection = link.connect()
                connection.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as error:
                if not link.wait and "locked" in str(error):
                    return BUSY
                link.drop()
                raise StoreError(f"sqlite: {type(error).__name__}: {error}") from error
            except (sqlite3.Error, OSError) as error:
                link.drop()
                raise StoreError(f"sqlite: {type(error).__name__}: {error}") from error
            now = self.wall_clock()
            try:
                answer = work(connection, now)
                self._operations += 1
                if self._operations % _SWEEP_EVERY == 0:
                    _sweep(connection, now)
                if self._held or self._probes:
                    self._renew(connection, now)
                connection.execute("COMMIT")
            except BaseException as error:
                try:
                    connection.execute("ROLLBACK")
                except sqlite3.Error:
                    link.drop()
                if isinstance(error, StoreError):
                    raise
                if isinstance(error, sqlite3.Error | ValueError | TypeError | KeyError):
                    raise StoreError(f"sqlite: {type(error).__name__}: {error}") from error
                raise
            return answer

    async def _run(self, work: Callable[[sqlite3.Connection, float], T]) -> T:
        """In place when the file's write lock is free (tens of µs: the WAL is written,
        not synced), else on the worker thread, so the event loop never waits for
        another process; every ``_WORKER_EVERY``-th time the worker then checkpoints the
        WAL. (Every ``_WORKER_EVERY``-th operation itself used to go to the worker: under
        load the ones in place met its write lock, went there too, and queued behind it
        — each request then waited on a thread.)"""
        self._in_place += 1
        answer: Any = BUSY
        if self._here.lock.acquire(blocking=False):
            self._here.lock.release()
            await anyio.lowlevel.checkpoint_if_cancelled()
            answer = self._transaction(work, self._here)
        if answer is BUSY:
            answer = await anyio.to_thread.run_sync(
                self._transaction, work, self._worker, limiter=self._limiter
            )
        if self._in_place % _WORKER_EVERY == 0:
            with anyio.CancelScope(shield=True):  # done: the answer is the caller's
                await anyio.to_thread.run_sync(self._checkpoint, limiter=self._limiter)
        else:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        return cast(T, answer)

    def _checkpoint(self) -> None:
        """The WAL copied into the file as far as no reader needs it (``PASSIVE``: it
        takes no write lock); a failure is only logged — the next one tries again."""
        link = self._worker
        with link.lock:
            try:
                link.connect().execute("PRAGMA wal_checkpoint(PASSIVE)")
            except (sqlite3.Error, OSError) as error:
                link.drop()
                logger.debug("sqlite: a checkpoint failed: %s", error)

    async def aclose(self) -> None:
        """Close the file (what is written is on disk)."""
        for link in (self._here, self._worker):
            with link.lock:
                link.drop()

    def _renew(self, connection: sqlite3.Connection, now: float) -> None:
        if now - self._renewed < self.slot_lease_s / 3:
            return
        self._renewed = now
        for lease, key in list(self._held.items()):
            slots = _soft(connection, key, "slots", now)
            if slots is not None and lease in slots:
                slots[lease] = now + self.slot_lease_s
                _put(connection, key, "slots", slots, now + self.idle_ttl_s)
        for key, probe in list(self._probes.items()):
            breaker = _soft(connection, key, "breaker", now)
            if breaker is not None and breaker.get("probe") == probe:
                breaker["probing"] = now
                _put(connection, key, "breaker", breaker, now + self.idle_ttl_s)

    # -- buckets -------------------------------------------------------------------------

    async def take(self, key: str, per_second: float, burst: float, amount: float = 1.0) -> float:
        def work(db: sqlite3.Connection, now: float) -> float:
            bucket = _soft(db, key, "bucket", now) or {"tokens": burst, "ts": now}
            tokens, ts = float(bucket["tokens"]), float(bucket["ts"])
            if now > ts:
                tokens = min(burst, tokens + (now - ts) * per_second)
            wait = 0.0
            if amount <= 0:
                tokens = min(burst, tokens - amount)
            elif tokens + _EPSILON >= amount:
                tokens = max(0.0, tokens - amount)
            else:
                wait = (amount - tokens) / per_second
            refill_s = (burst - tokens) / per_second + 1.0
            _put(db, key, "bucket", {"tokens": tokens, "ts": now}, now + refill_s)
            return wait

        return await self._run(work)

    # -- breakers ------------------------------------------------------------------------

    async def admit(self, key: str, break_s: float) -> Admission:
        probe_id = uuid.uuid4().hex

        def work(db: sqlite3.Connection, now: float) -> Admission:
            breaker = _soft(db, key, "breaker", now) or _closed()
            state = breaker["state"]
            if state == "open":
                remaining = float(breaker["opened"]) + break_s - now
                if remaining > 0:
                    return Admission(False, remaining)
                state, breaker["probing"] = "half_open", None
            if state == "half_open":
                probing = breaker.get("probing")
                if probing is not None and now - float(probing) < self.slot_lease_s:
                    return Admission(False, 0.0)
                breaker.update(state="half_open", probing=now, probe=probe_id)
                _put(db, key, "breaker", breaker, now + self.idle_ttl_s)
                self._probes[key] = probe_id
                return Admission(True, probe=True)
            return Admission(True)

        return await self._run(work)

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
        probe_id = self._probes.get(key)

        def work(db: sqlite3.Connection, now: float) -> BreakerState | None:
            breaker = _soft(db, key, "breaker", now)
            ttl = now + max(self.idle_ttl_s, window_s + 1)

            def opened() -> BreakerState:
                _put(db, key, "breaker", {**_closed(), "state": "open", "opened": now}, ttl)
                _forget_outcomes(db, key)
                return "open"

            if probe:
                if breaker is None or breaker["state"] != "half_open":
                    return None
                if breaker.get("probe") != probe_id:
                    return None
                if failed:
                    return opened()
                _put(db, key, "breaker", _closed(), ttl)
                _forget_outcomes(db, key)
                return "closed"
            if breaker is None:
                _put(db, key, "breaker", _closed(), ttl)  # known: so it expires when idle
            elif breaker["state"] != "closed":
                return None
            calls, failures = _outcome(db, key, failed, now, window_s)
            if calls >= minimum_calls and failures >= failure_ratio * calls:
                return opened()
            return None

        try:
            return await self._run(work)
        finally:
            if probe:
                self._probes.pop(key, None)

    async def release_probe(self, key: str) -> None:
        probe_id = self._probes.pop(key, None)

        def work(db: sqlite3.Connection, now: float) -> None:
            breaker = _soft(db, key, "breaker", now)
            if breaker is not None and breaker.get("probe") == probe_id:
                breaker.update(probing=None, probe=None)
                _put(db, key, "breaker", breaker, now + self.idle_ttl_s)

        await self._run(work)

    async def breaker_state(self, key: str) -> BreakerState:
        def work(db: sqlite3.Connection, now: float) -> BreakerState:
            breaker = _soft(db, key, "breaker", now)
            state: BreakerState = breaker["state"] if breaker is not None else "closed"
            return state

        return await self._run(work)

    # -- slots ---------------------------------------------------------------------------

    async def acquire(self, key: str, limit: int) -> str | None:
        lease = uuid.uuid4().hex

        def work(db: sqlite3.Connection, now: float) -> str | None:
            slots = {k: v for k, v in (_soft(db, key, "slots", now) or {}).items() if v > now}
            if len(slots) >= limit:
                _put(db, key, "slots", slots, now + self.idle_ttl_s)
                return None
            slots[lease] = now + self.slot_lease_s
            _put(db, key, "slots", slots, now + self.idle_ttl_s)
            return lease

        got = await self._run(work)
        if got is not None:
            self._held[got] = key
        return got

    async def release_slot(self, key: str, lease: str) -> None:
        self._held.pop(lease, None)

        def work(db: sqlite3.Connection, now: float) -> None:
            slots = _soft(db, key, "slots", now)
            if slots is not None and slots.pop(lease, None) is not None:
                _put(db, key, "slots", slots, now + self.idle_ttl_s)

        await self._run(work)

    # -- counters and shared limits ------------------------------------------------------

    async def add(
        self, key: str, amount: float, *, limit: float | None = None, initial: float = 0.0
    ) -> tuple[bool, float]:
        def work(db: sqlite3.Connection, now: float) -> tuple[bool, float]:
            counter = _soft(db, key, "counter", now)
            value = float(counter["value"]) if counter is not None else initial
            total = value + amount
            if limit is not None and amount > 0 and total > limit:
                return False, value
            _put(db, key, "counter", {"value": total}, now + self.idle_ttl_s)
            return True, total

        return await self._run(work)

    async def read(self, key: str) -> float:
        def work(db: sqlite3.Connection, now: float) -> float:
            counter = _soft(db, key, "counter", now)
            return float(counter["value"]) if counter is not None else 0.0

        return await self._run(work)

    async def read_limit(self, key: str, initial: float) -> tuple[float, int]:
        def work(db: sqlite3.Connection, now: float) -> tuple[float, int]:
            limit = _soft(db, key, "limit", now) or {"value": initial, "version": 0}
            _put(db, key, "limit", limit, now + self.idle_ttl_s)
            return float(limit["value"]), int(limit["version"])

        return await self._run(work)

    async def swap_limit(
        self, key: str, version: int, value: float, low: float, high: float, *, bump: bool
    ) -> tuple[float, int]:
        def work(db: sqlite3.Connection, now: float) -> tuple[float, int]:
            limit = _soft(db, key, "limit", now) or {"value": value, "version": 0}
            if int(limit["version"]) == version:
                limit = {"value": min(high, max(low, value)), "version": version + int(bump)}
            _put(db, key, "limit", limit, now + self.idle_ttl_s)
            return float(limit["value"]), int(limit["version"])

        return await self._run(work)

    # -- the ledger ----------------------------------------------------------------------

    async def reserve(
        self,
        op_id: str,
        amounts: Mapping[str, float],
        windows: Sequence[Window],
        *,
        lease_s: float | None = None,
    ) -> Reservation:
        lease = self.lease_s if lease_s is None else max(0.001, lease_s)

        def work(db: sqlite3.Connection, now: float) -> Reservation:
            row = db.execute(
                "SELECT state FROM operations WHERE op = ? AND expires > ?", (op_id, now)
            ).fetchone()
            if row is not None:
                return Reservation(op_id, row[0] != "x", duplicate=True)
            planned: list[tuple[Window, float, float, int | None]] = []
            for window in windows:
                amount = float(amounts.get(window.unit, 0.0))
                bucket = None
                if window.slide_s is not None:
                    bucket = math.floor(now * SLIDING_BUCKETS / window.slide_s)
                    value, live = _sliding(db, window.key, bucket, now)
                else:
                    found = db.execute(
                        "SELECT value FROM ledger WHERE key = ? AND expires > ?",
                        (window.key, now),
                    ).fetchone()
                    value, live = (float(found[0]) if found is not None else 0.0), []
                value = max(value, window.floor)
                limit = window.limit
                if limit is not None and amount > 0 and value + amount > limit + _EPSILON:
                    wait = None
                    if window.slide_s is not None and amount <= limit:
                        wait = _sliding_wait(live, value + amount - limit, window.slide_s, now)
                    return Reservation(op_id, False, window, value, False, wait)
                planned.append((window, value, amount, bucket))
            reserved = []
            for window, value, amount, bucket in planned:
                if bucket is not None:
                    assert window.slide_s is not None
                    db.execute(
                        "INSERT INTO sliding(key, bucket, amount, expires) VALUES (?, ?, ?, ?)"
                        " ON CONFLICT(key, bucket) DO UPDATE SET amount = amount + excluded.amount,"
                        " expires = excluded.expires",
                        (window.key, bucket, amount, now + 2 * window.slide_s),
                    )
                else:
                    db.execute(
                        "INSERT INTO ledger(key, value, expires) VALUES (?, ?, ?)"
                        " ON CONFLICT(key) DO UPDATE SET value = excluded.value,"
                        " expires = MAX(CASE WHEN ledger.expires > ? THEN ledger.expires"
                        " ELSE 0 END, excluded.expires)",
                        (window.key, value + amount, now + window.ttl_s, now),
                    )
                reserved.append([window.key, window.unit, amount, bucket])
            db.execute(
                "INSERT OR REPLACE INTO operations(op, state, expires, reserved)"
                " VALUES (?, 'r', ?, ?)",
                (op_id, now + lease, json.dumps(reserved)),
            )
            return Reservation(op_id, True)

        return await self._run(work)

    async def settle(self, op_id: str, actual: Mapping[str, float]) -> Settlement:
        spent = {unit: float(amount) for unit, amount in actual.items()}

        def work(db: sqlite3.Connection, now: float) -> Settlement:
            row = _operation(db, op_id, now)
            if row is None:
                return "unknown"
            if row[0] == "s":
                return "duplicate"
            if row[0] == "x":
                return "released"
            for key, unit, amount, bucket in json.loads(row[1]):
                if unit in spent and spent[unit] != amount:
                    _change(db, key, bucket, spent[unit] - amount, now)
            db.execute("UPDATE operations SET state = 's' WHERE op = ?", (op_id,))
            return "settled"

        return await self._run(work)

    async def release(self, op_id: str) -> Settlement:
        def work(db: sqlite3.Connection, now: float) -> Settlement:
            row = _operation(db, op_id, now)
            if row is None:
                db.execute(
                    "INSERT OR REPLACE INTO operations(op, state, expires, reserved)"
                    " VALUES (?, 'x', ?, '[]')",
                    (op_id, now + self.lease_s),
                )
                return "unknown"
            if row[0] == "s":
                return "settled"
            if row[0] == "x":
                return "duplicate"
            for key, _, amount, bucket in json.loads(row[1]):
                _change(db, key, bucket, -amount, now)
            db.execute("UPDATE operations SET state = 'x' WHERE op = ?", (op_id,))
            return "released"

        return await self._run(work)

    async def balance(self, window: Window) -> float:
        def work(db: sqlite3.Connection, now: float) -> float:
            if window.slide_s is not None:
                bucket = math.floor(now * SLIDING_BUCKETS / window.slide_s)
                value, _ = _sliding(db, window.key, bucket, now)
            else:
                found = db.execute(
                    "SELECT value FROM ledger WHERE key = ? AND expires > ?", (window.key, now)
                ).fetchone()
                value = float(found[0]) if found is not None else 0.0
            return max(value, window.floor)

        return await self._run(work)

    async def close(self, keys: Sequence[str]) -> None:
        if not keys:
            return

        def work(db: sqlite3.Connection, now: float) -> None:
            db.executemany("DELETE FROM ledger WHERE key = ?", [(key,) for key in keys])
            db.executemany("DELETE FROM sliding WHERE key = ?", [(key,) for key in keys])

        await self._run(work)

    async def windows(self, prefix: str) -> dict[str, float]:
        """Every plain window whose key begins with ``prefix``, and what it holds (for
        spend reports)."""

        def work(db: sqlite3.Connection, now: float) -> dict[str, float]:
            rows = db.execute(
                "SELECT key, value FROM ledger WHERE key >= ? AND key < ? AND expires > ?",
                (prefix, prefix + "\U0010ffff", now),
            ).fetchall()
            return {str(key): float(value) for key, value in rows}

        return await self._run(work)

    # -- operators' overrides ------------------------------------------------------------

    async def write_control(self, key: str, value: str | None) -> None:
        def work(db: sqlite3.Connection, now: float) -> None:
            if value is None:
                db.execute("DELETE FROM controls WHERE key = ?", (key,))
            else:
                db.execute(
                    "INSERT OR REPLACE INTO controls(key, value) VALUES (?, ?)", (key, value)
                )

        await self._run(work)

    async def read_controls(self) -> dict[str, str]:
        def work(db: sqlite3.Connection, now: float) -> dict[str, str]:
            return {str(k): str(v) for k, v in db.execute("SELECT key, value FROM controls")}

        return await self._run(work)
