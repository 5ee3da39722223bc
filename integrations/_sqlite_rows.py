"""``SqliteStore``'s connections, tables and the row operations its transactions are
made of."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Final

from guardstack.pipeline.ledger import SLIDING_BUCKETS
from guardstack.pipeline.store import StoreError

_EPSILON: Final = 1e-9
_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS ledger(key TEXT PRIMARY KEY, value REAL NOT NULL,"
    " expires REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS sliding(key TEXT NOT NULL, bucket INTEGER NOT NULL,"
    " amount REAL NOT NULL, expires REAL NOT NULL, PRIMARY KEY(key, bucket))",
    "CREATE TABLE IF NOT EXISTS operations(op TEXT PRIMARY KEY, state TEXT NOT NULL,"
    " expires REAL NOT NULL, reserved TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS soft(key TEXT PRIMARY KEY, kind TEXT NOT NULL,"
    " data TEXT NOT NULL, expires REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS controls(key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS outcomes(key TEXT NOT NULL, t REAL NOT NULL,"
    " failed INTEGER NOT NULL, expires REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS outcomes_key ON outcomes(key, t)",
    "CREATE INDEX IF NOT EXISTS outcomes_expires ON outcomes(expires)",
    "CREATE INDEX IF NOT EXISTS ledger_expires ON ledger(expires)",
    "CREATE INDEX IF NOT EXISTS operations_expires ON operations(expires)",
    "CREATE INDEX IF NOT EXISTS soft_expires ON soft(expires)",
)


def _closed() -> dict[str, Any]:
    return {"state": "closed", "opened": 0.0, "probing": None, "probe": None, "outcomes": []}


def _soft(db: sqlite3.Connection, key: str, kind: str, now: float) -> Any:
    row = db.execute(
        "SELECT kind, data FROM soft WHERE key = ? AND expires > ?", (key, now)
    ).fetchone()
    if row is None:
        return None
    if row[0] != kind:
        raise StoreError(f"sqlite: store key {key!r} holds a {row[0]}, not a {kind}")
    try:
        return json.loads(row[1])
    except ValueError as error:
        raise StoreError(f"sqlite: store key {key!r} holds garbage") from error


def _put(db: sqlite3.Connection, key: str, kind: str, data: Any, expires: float) -> None:
    db.execute(
        "INSERT OR REPLACE INTO soft(key, kind, data, expires) VALUES (?, ?, ?, ?)",
        (key, kind, json.dumps(data), expires),
    )


def _sliding(
    db: sqlite3.Connection, key: str, bucket: int, now: float
) -> tuple[float, list[tuple[int, float]]]:
    oldest = bucket - SLIDING_BUCKETS
    db.execute("DELETE FROM sliding WHERE key = ? AND bucket < ?", (key, oldest))
    rows = db.execute(
        "SELECT bucket, amount FROM sliding WHERE key = ? AND expires > ? ORDER BY bucket",
        (key, now),
    ).fetchall()
    live = [(int(b), float(a)) for b, a in rows]
    return max(0.0, sum(a for _, a in live)), live


def _sliding_wait(
    live: list[tuple[int, float]], excess: float, slide_s: float, now: float
) -> float | None:
    freed = 0.0
    width = slide_s / SLIDING_BUCKETS
    for index, amount in live:
        freed += amount
        if freed >= excess - _EPSILON:
            return max(0.0, (index + SLIDING_BUCKETS + 1) * width - now)
    return None


def _operation(db: sqlite3.Connection, op_id: str, now: float) -> Any:
    """A ledger operation still within its lease: ``(state, reserved)``, or ``None``."""
    return db.execute(
        "SELECT state, reserved FROM operations WHERE op = ? AND expires > ?", (op_id, now)
    ).fetchone()


def _change(db: sqlite3.Connection, key: str, bucket: int | None, delta: float, now: float) -> None:
    """A window's (or bucket's) value moved by ``delta``, if it is still there: a window
    that has gone (closed, expired) is not made again."""
    if delta == 0:
        return
    if bucket is not None:
        db.execute(
            "UPDATE sliding SET amount = MAX(0, amount + ?) WHERE key = ? AND bucket = ?",
            (delta, key, bucket),
        )
    else:
        db.execute(
            "UPDATE ledger SET value = MAX(0, value + ?) WHERE key = ? AND expires > ?",
            (delta, key, now),
        )


def _sweep(db: sqlite3.Connection, now: float) -> None:
    """Rows whose lifetimes ended (what they held is over)."""
    db.execute("DELETE FROM ledger WHERE expires <= ?", (now,))
    db.execute("DELETE FROM sliding WHERE expires <= ?", (now,))
    db.execute("DELETE FROM operations WHERE expires <= ?", (now,))
    db.execute("DELETE FROM soft WHERE expires <= ?", (now,))
    db.execute("DELETE FROM outcomes WHERE expires <= ?", (now,))


#: A transaction run in place found the write lock held: run it on the worker instead.
BUSY: Final = object()
#: After one operation in this many, the worker thread checkpoints the WAL.
_WORKER_EVERY: Final = 256


class _Link:
    """One connection to the store's file, and the lock of the thread using it.

    ``wait``: the worker thread's, which waits for another process's write lock (30 s)
    and checkpoints the WAL as SQLite does by default; otherwise the connection used in
    place, which never waits (busy timeout 0) and never checkpoints (that fsyncs)."""

    def __init__(self, path: Path, *, wait: bool) -> None:
        self.path = path
        self.wait = wait
        self.lock = threading.Lock()
        self.connection: sqlite3.Connection | None = None

    def connect(self) -> sqlite3.Connection:
        if self.connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(
                self.path,
                timeout=30.0 if self.wait else 0.0,
                isolation_level=None,
                check_same_thread=False,
            )
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
                connection.execute(f"PRAGMA busy_timeout={30000 if self.wait else 0}")
                if not self.wait:
                    connection.execute("PRAGMA wal_autocheckpoint=0")
                for statement in _SCHEMA:
                    connection.execute(statement)
            except BaseException:  # not a database, or locked: closed, never left open
                connection.close()
                raise
            self.connection = connection
        return self.connection

    def drop(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(sqlite3.Error):
                self.connection.close()
            self.connection = None


def _outcome(
    db: sqlite3.Connection, key: str, failed: bool, now: float, window_s: float
) -> tuple[int, int]:
    """A breaker's outcome recorded (one row each, as Redis keeps them in a sorted set):
    how many calls and failures its window holds now."""
    db.execute("DELETE FROM outcomes WHERE key = ? AND t <= ?", (key, now - window_s))
    db.execute(
        "INSERT INTO outcomes(key, t, failed, expires) VALUES (?, ?, ?, ?)",
        (key, now, int(failed), now + window_s + 1),
    )
    calls, failures = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(failed), 0) FROM outcomes WHERE key = ?", (key,)
    ).fetchone()
    return int(calls), int(failures)


def _forget_outcomes(db: sqlite3.Connection, key: str) -> None:
    db.execute("DELETE FROM outcomes WHERE key = ?", (key,))
