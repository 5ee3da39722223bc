"""``--store``: each spec names its store, a bad one is one clear line, and what a store
forgets across a restart is said."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from guardstack.cli.stores import describe_store, forgets, store_from
from guardstack.integrations.sqlite import SqliteStore
from guardstack.pipeline import ConfigError, MemoryStore


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_each_spec_names_its_store(tmp_path: Path) -> None:
    default = store_from(None)
    assert isinstance(default, SqliteStore)
    state = Path(os.environ["XDG_STATE_HOME"])  # each test's own (tests/conftest.py)
    assert default.path == state / "guardstack" / "ledger.sqlite3"
    assert describe_store(default) == f"sqlite:{default.path} (kept across restarts)"
    assert await forgets(default) is None
    named = store_from(f"sqlite:{tmp_path / 'mine.sqlite3'}")
    assert isinstance(named, SqliteStore)
    assert named.path == tmp_path / "mine.sqlite3"
    memory = store_from("memory")
    assert isinstance(memory, MemoryStore)
    assert "forgotten at every restart" in describe_store(memory)
    assert "keeps nothing across a restart" in str(await forgets(memory))
    for store in (default, named):
        await store.aclose()


@pytest.mark.parametrize("spec", ["postgres://db", "sqlite:", "mem", ""])
def test_a_bad_spec_is_one_line(spec: str) -> None:
    with pytest.raises(ConfigError) as raised:
        store_from(spec)
    assert "\n" not in str(raised.value)
    assert "--store" in str(raised.value)
