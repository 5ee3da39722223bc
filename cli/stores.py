"""``--store``: where a gateway keeps its counts — and whether they outlive a restart.

``memory`` (this process only: forgotten at every restart), ``sqlite:PATH`` (one file,
kept across restarts, shared by the processes of one machine; ``sqlite`` alone is
``$XDG_STATE_HOME/guardstack/ledger.sqlite3``, the default) or ``redis://…`` (every
process of every machine). A configuration file's own ``redis-store`` entry is used
when ``--store`` is not given. What the gateway chose is said at start, with a warning
when it forgets: a Redis that keeps nothing across its own restart (no AOF and no RDB
snapshots) loses every month's spend with it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.store import MemoryStore, StateStore

__all__ = ["describe_store", "forgets", "store_from"]


def store_from(spec: str | None) -> StateStore:
    """The store ``--store SPEC`` names (``None``: the default, SQLite)."""
    from guardstack.integrations.sqlite import SqliteStore, default_path

    if spec is None or spec == "sqlite":
        return SqliteStore(default_path())
    if spec == "memory":
        return MemoryStore()
    if spec.startswith("sqlite:"):
        path = spec.removeprefix("sqlite:").removeprefix("//")
        if not path:
            raise ConfigError("--store sqlite:PATH needs a path", key="store", value=spec)
        return SqliteStore(Path(path).expanduser())
    if spec.startswith(("redis://", "rediss://", "unix://")):
        from guardstack.integrations.redis import RedisStore

        return RedisStore(spec)
    raise ConfigError(
        f"--store {spec!r}: give memory, sqlite:PATH or a redis:// URL",
        key="store",
        value=spec,
    )


def describe_store(store: object) -> str:
    """One line: where the counts are, and how long they last."""
    name = type(store).__name__
    if name == "SqliteStore":
        return f"sqlite:{getattr(store, 'path', '?')} (kept across restarts)"
    if name == "RedisStore":
        return f"{getattr(store, 'url', None) or 'redis'} (shared by every process on it)"
    if isinstance(store, MemoryStore):
        return "memory (this process only: forgotten at every restart)"
    return repr(store)


async def forgets(store: object) -> str | None:
    """Why ``store`` would lose what it counted when restarted, or ``None``."""
    if isinstance(store, MemoryStore):
        return "the memory store keeps nothing across a restart: use --store sqlite or redis"
    persistence = getattr(store, "persistence", None)
    if callable(persistence):
        try:
            said: Any = await persistence()
        except Exception as error:  # not reachable now: said at the first failing call
            return f"could not ask the store how it keeps its data ({type(error).__name__})"
        return str(said) if said else None
    return None


def say(line: str, out: TextIO | None = None) -> None:
    print(line, file=out or sys.stderr, flush=True)
