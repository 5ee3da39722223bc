"""``SqliteStore``: the store and ledger seams in one SQLite file, held to what
``MemoryStore`` and ``RedisStore`` answer — operation by operation, the ledger's
stateful model (restarts of the store's process included), several processes on one
file, and a failing file."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import precondition, rule

from guardstack.integrations.sqlite import SqliteStore, default_path
from guardstack.pipeline import Harness, MemoryStore, ToolCall, ToolDefinition
from guardstack.pipeline.contract import Window
from guardstack.pipeline.store import StoreError
from tests.helpers import thread_loop
from tests.integrations.store_script import operations, play
from tests.ledger_model import LedgerMachine

ROOT = Path(__file__).parents[2]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    made = SqliteStore(tmp_path / "ledger.sqlite3")
    try:
        yield made
    finally:
        await made.aclose()


async def test_each_operation_answers_as_the_memory_store_does(store: SqliteStore) -> None:
    assert [await store.take("bucket", 10, 2) for _ in range(2)] == [0.0, 0.0]
    assert 0.05 < await store.take("bucket", 10, 2) <= 0.1  # empty: the wait for a token
    assert await store.take("bucket", 10, 2, amount=-5) == 0.0  # a deposit, up to burst
    assert await store.take("bucket", 10, 2, amount=2) == 0.0
    assert (await store.admit("breaker", 60)).admitted
    states = [
        await store.record("breaker", True, False, window_s=10, minimum_calls=2, failure_ratio=1)
        for _ in range(2)
    ]
    assert states == [None, "open"]
    refused = await store.admit("breaker", 60)
    assert not refused.admitted
    assert 59 < refused.wait_s <= 60
    first, second = await store.acquire("slots", 1), await store.acquire("slots", 1)
    assert first is not None
    assert second is None
    await store.release_slot("slots", first)
    assert await store.acquire("slots", 1) is not None
    assert await store.add("counter", 3, limit=5) == (True, 3.0)
    assert await store.add("counter", 3, limit=5) == (False, 3.0)
    assert await store.add("counter", -1) == (True, 2.0)
    assert await store.read("counter") == 2.0
    assert await store.read("nothing") == 0.0
    assert await store.read_limit("limit", 8) == (8.0, 0)
    assert await store.swap_limit("limit", 0, 4, 1, 10, bump=True) == (4.0, 1)
    assert await store.swap_limit("limit", 0, 2, 1, 10, bump=True) == (4.0, 1)  # stale version
    await store.write_control("override", "{}")
    assert await store.read_controls() == {"override": "{}"}


async def test_a_breaker_half_opens_after_its_break_and_one_probe_decides(tmp_path: Path) -> None:
    now = [1_000.0]
    store = SqliteStore(tmp_path / "s.sqlite3", clock=lambda: now[0])
    try:
        for _ in range(2):
            await store.record("b", True, False, window_s=10, minimum_calls=2, failure_ratio=1)
        now[0] += 31
        probe = await store.admit("b", 30)
        assert (probe.admitted, probe.probe) == (True, True)
        assert not (await store.admit("b", 30)).admitted  # one probe at a time
        await store.release_probe("b")  # cancelled: the next call probes
        again = await store.admit("b", 30)
        assert again.probe
        assert await store.record("b", False, True, window_s=10, minimum_calls=2,
                                  failure_ratio=1) == "closed"  # fmt: skip
        assert await store.breaker_state("b") == "closed"
    finally:
        await store.aclose()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=operations)
async def test_the_same_operations_give_the_same_answers_as_in_memory(
    tmp_path_factory: pytest.TempPathFactory, script: list[tuple[str, str, Any]]
) -> None:
    """Slots, counters and breakers (within one window, long breaks: time-independent)."""
    sqlite = SqliteStore(tmp_path_factory.mktemp("same") / "s.sqlite3")
    memory = MemoryStore()
    try:
        played = [await play(each, script) for each in (sqlite, memory)]
    finally:
        await sqlite.aclose()
    assert played[0] == played[1]


# -- the ledger's stateful model, restarts included ---------------------------------------


FILES: list[Path] = []


def make_store() -> tuple[Any, Any, Any]:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="guardstack-ledger-"))
    store = SqliteStore(folder / "ledger.sqlite3")

    def restart() -> None:  # the store's process stops and starts: only the file is left
        thread_loop().run(store.aclose())

    return store, None, restart


class SqliteLedgerMachine(LedgerMachine):
    run = staticmethod(lambda coroutine: thread_loop().run(coroutine))
    make_store = staticmethod(make_store)

    def __init__(self) -> None:
        super().__init__()
        self.restarts = 0

    @precondition(lambda self: self.restarts < 3)
    @rule()
    def restart_the_process(self) -> None:
        """The process holding the store stops and another opens the file: unlike a
        Redis without persistence, nothing is lost — the model goes on as it was."""
        assert self.restart is not None
        self.restart()
        self.restarts += 1

    def teardown(self) -> None:
        thread_loop().run(self.ledger.aclose())  # type: ignore[attr-defined]


TestSqliteLedger = SqliteLedgerMachine.TestCase
TestSqliteLedger.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


# -- several processes, a failing file --------------------------------------------------

WORKER = """
import anyio, json, sys
from guardstack.integrations.sqlite import SqliteStore
from guardstack.pipeline.contract import Window

async def main():
    store = SqliteStore(sys.argv[1])
    granted = 0
    for n in range(int(sys.argv[3])):
        answer = await store.reserve(f"{sys.argv[2]}-{n}", {"usd": 1.0},
                                     [Window("day", "usd", 50.0)])
        granted += answer.granted
    await store.aclose()
    print(json.dumps({"granted": granted}))

anyio.run(main)
"""


def test_four_processes_on_one_file_never_pass_its_limit_together(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), f"p{number}", "30"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for number in range(4)
    ]
    granted = []
    for process in processes:
        out, _ = process.communicate(timeout=120)
        assert process.returncode == 0
        granted.append(json.loads(out)["granted"])

    async def held() -> float:
        store = SqliteStore(path)
        try:
            return await store.balance(Window("day", "usd", 50.0))
        finally:
            await store.aclose()

    assert sum(granted) == 50  # 120 asked of a limit of 50: exactly 50, all or none
    assert anyio.run(held) == 50.0


async def test_a_file_that_cannot_be_opened_is_a_store_error_and_layers_apply_their_policy(
    tmp_path: Path,
) -> None:
    (tmp_path / "blocked").write_text("a file where the folder should be", "utf-8")
    broken = SqliteStore(tmp_path / "blocked" / "ledger.sqlite3")
    with pytest.raises(StoreError):
        await broken.reserve("op", {"calls": 1}, [Window("w", "calls", 5)])
    harness = Harness(store=broken)

    async def ok(arguments: Any, call: ToolCall) -> str:
        return "ran"

    harness.tools.register(ToolDefinition("t", ok))
    harness.load([{"name": "tool-call-limit", "config": {"per_turn": 3}}])
    outcome = await harness.tools.execute(ToolCall("t", {}, "c", conversation="x"))
    assert outcome.result.code == "TOOL_DENIED"  # a cap fails closed
    assert "sqlite store is not answering" in outcome.result.content


def test_the_default_file_is_under_the_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_path() == tmp_path / "guardstack" / "ledger.sqlite3"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_path() == Path.home() / ".local" / "state" / "guardstack" / "ledger.sqlite3"


async def test_a_breakers_window_forgets_outcomes_older_than_it(tmp_path: Path) -> None:
    now = [1_000.0]
    store = SqliteStore(tmp_path / "b.sqlite3", clock=lambda: now[0])
    try:
        settings_: dict[str, Any] = {"window_s": 10.0, "minimum_calls": 3, "failure_ratio": 0.5}
        for _ in range(2):
            assert await store.record("b", True, False, **settings_) is None
        now[0] += 11  # both failures leave the window
        assert await store.record("b", False, False, **settings_) is None
        assert await store.record("b", True, False, **settings_) is None  # 1 of 2
        assert await store.breaker_state("b") == "closed"
        assert await store.record("b", True, False, **settings_) == "open"  # 2 of 3
    finally:
        await store.aclose()


async def test_a_lock_held_by_another_process_is_waited_for_off_the_event_loop(
    tmp_path: Path,
) -> None:
    """Operations run in place only when the write lock is free: while another
    connection (another process, as SQLite sees it) holds it, the operation waits on
    the worker thread — the event loop goes on — and completes once it is let go."""
    import sqlite3

    store = SqliteStore(tmp_path / "l.sqlite3")
    await store.add("warm", 1)  # the file and its tables exist
    other = sqlite3.connect(tmp_path / "l.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    ticks = 0
    done = anyio.Event()

    async def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await anyio.sleep(0.005)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(tick)
            with anyio.fail_after(10):
                waiting = anyio.Event()

                async def add() -> None:
                    waiting.set()
                    await store.add("k", 2)
                    done.set()

                group.start_soon(add)
                await waiting.wait()
                await anyio.sleep(0.2)
                assert not done.is_set()  # still waiting for the lock
                seen = ticks
                other.execute("COMMIT")
                await done.wait()
        assert seen >= 10  # the loop ran while the operation waited
        assert await store.read("k") == 2
    finally:
        other.close()
        await store.aclose()


async def test_under_load_every_operation_runs_in_place_and_the_worker_only_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reported through the model proxy at 100 clients: every 256th operation went to
    the worker thread, the ones in place met its write lock, went there too and queued
    behind it — from then on each request waited on a thread (a third of the proxy's
    throughput). Now, with no other process writing, none goes there: the worker only
    checkpoints the WAL, once every 256 operations, and the counts stay exact."""
    import anyio.to_thread

    from guardstack.pipeline.ledger import Window

    sent: list[str] = []
    real = anyio.to_thread.run_sync

    async def counted(function: Any, *arguments: Any, **options: Any) -> Any:
        sent.append(getattr(function, "__name__", repr(function)))
        return await real(function, *arguments, **options)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    store = SqliteStore(tmp_path / "l.sqlite3")
    window = Window("ledger|tenant|acme|tokens|day:1", "tokens", 1e12, 86_400)

    async def request(n: int) -> None:
        await store.reserve(f"op{n}", {"tokens": 10}, [window])
        await anyio.lowlevel.checkpoint()  # the upstream answers
        await store.settle(f"op{n}", {"tokens": 6})

    try:
        async with anyio.create_task_group() as group:
            for n in range(1_000):
                group.start_soon(request, n)
        assert await store.balance(window) == pytest.approx(6_000)
    finally:
        await store.aclose()
    assert "_transaction" not in sent
    assert sent.count("_checkpoint") == 2_000 // 256
