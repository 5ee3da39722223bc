"""The corners the resilience family must hold: many keys, caps inside breakers, cancelled
waiters, windows by the current time, cancelled calls, hedges inside retries, a failing
store. Each test is one defect found in review, through the public API."""

from __future__ import annotations

import time
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from guardstack.guards import ModelCallLimit, ToolCallLimit
from guardstack.pipeline import (
    MODEL_FAILED,
    TOOL_DENIED,
    TOOL_FAILED,
    TOOL_OVERLOADED,
    TOOL_RATE_LIMITED,
    TOOL_UNAVAILABLE,
    GuardstackWarning,
    Harness,
    MemoryStore,
    ModelError,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolDefinition,
    ToolResult,
)
from guardstack.pipeline.testing import Raise, Reply, ScriptedTool
from guardstack.wrappers import (
    Chaos,
    CircuitBreaker,
    ConcurrencyLimit,
    Hedge,
    RateLimit,
    Retry,
)
from tests.helpers import call
from tests.virtual_time import jump_clock


async def ok(arguments: Any, call: Any) -> str:
    return "ok"


async def fails(arguments: Any, call: Any) -> str:
    raise RuntimeError("backend down")


def with_tools(count: int, execute: Any = ok, **harness: Any) -> Harness:
    built = Harness(**harness)
    for index in range(count):
        built.tools.register(ToolDefinition(f"tool-{index}", execute))
    return built


# -- 1. keyed state past the bound ---------------------------------------------------------


async def test_a_rate_limit_still_limits_after_more_keys_than_the_store_holds() -> None:
    """The entry being created is never the one evicted, so the limit holds at key 5,001."""
    built = with_tools(5_001, store=MemoryStore(max_keys=1_000))
    built.plugin(RateLimit(per_second=0.001, wait=False))
    for index in range(5_000):
        await built.tools.execute(call(f"tool-{index}"))
    codes = [(await built.tools.execute(call("tool-5000"))).result.code for _ in range(5)]
    assert codes == [
        None,
        TOOL_RATE_LIMITED,
        TOOL_RATE_LIMITED,
        TOOL_RATE_LIMITED,
        TOOL_RATE_LIMITED,
    ]


async def test_a_breaker_still_opens_after_more_keys_than_the_store_holds() -> None:
    built = with_tools(3_000, fails, store=MemoryStore(max_keys=500))
    built.plugin(CircuitBreaker(minimum_calls=2, failure_ratio=1.0, break_s=60))
    for index in range(2_999):
        await built.tools.execute(call(f"tool-{index}"))
    codes = [(await built.tools.execute(call("tool-2999"))).result.code for _ in range(3)]
    assert codes == [TOOL_FAILED, TOOL_FAILED, TOOL_UNAVAILABLE]


async def test_made_up_tool_names_share_one_key_and_cannot_fill_the_store() -> None:
    built = Harness()
    built.plugin(CircuitBreaker(minimum_calls=3, failure_ratio=1.0))
    built.plugin(RateLimit(per_second=1_000, burst=1_000))
    for index in range(2_000):
        await built.tools.execute(call(f"no-such-tool-{index}"))
    assert len(built.store) == 2  # type: ignore[arg-type]  # one bucket, one breaker: <unknown>


async def test_a_store_of_a_hundred_thousand_keys_evicts_in_constant_time() -> None:
    """50,000 busy slots are kept; the next 100,000 idle counters cost what the first did."""
    store = MemoryStore(max_keys=100_000)
    for index in range(50_000):
        assert await store.acquire(f"busy-{index}", 1) is not None  # held: never evicted
    started = time.perf_counter()
    for index in range(100_000):
        await store.add(f"idle-{index}", 1)
    first = time.perf_counter() - started
    started = time.perf_counter()
    for index in range(100_000, 200_000):
        await store.add(f"idle-{index}", 1)
    second = time.perf_counter() - started
    assert len(store) <= 110_000  # busy ones cycled to the back once, then idle ones go
    assert all(f"busy-{index}" in store for index in range(0, 50_000, 997))
    assert second < 5 * first + 0.5  # no scan per key (the old map took 100x longer)


async def test_a_store_whose_every_entry_is_busy_grows_and_warns_once() -> None:
    store = MemoryStore(max_keys=10)

    async def fill() -> None:
        for index in range(50):
            await store.acquire(f"slot-{index}", 1)

    with pytest.warns(GuardstackWarning, match="growing rather than dropping a limit") as warned:
        await fill()
    assert len(store) == 50
    assert len(warned) == 1


# -- 2. guardstack's own control flow is never a provider failure ----------------------------


async def test_a_caps_refusal_never_opens_the_model_breaker_for_everyone() -> None:
    model = ScriptedModel([ModelReply(tool_calls=()), ModelReply("fresh")] * 3)
    built = Harness(model)
    built.plugin(CircuitBreaker(stage="model", minimum_calls=2, failure_ratio=1.0))
    built.plugin(ModelCallLimit(per_turn=1))
    for name in ("a", "b"):
        agent = built.loop.create(name)
        await agent.prompt("one")
    # Each agent's second turn is its own; now hit the cap twice in one turn each.
    capped = Harness(ScriptedModel([ModelReply(tool_calls=[_ask()])] * 4 + [ModelReply("fresh")]))
    capped.tools.register(ToolDefinition("look", ok))
    capped.plugin(CircuitBreaker(stage="model", minimum_calls=2, failure_ratio=1.0))
    capped.plugin(ModelCallLimit(per_turn=1))
    for name in ("a", "b"):
        turn = await capped.loop.create(name).prompt("loop")
        assert turn.reason == "blocked"
    fresh = await capped.loop.create("fresh").prompt("hi")
    assert fresh.reason != "error", fresh.error  # the breaker did not count the caps


def _ask() -> Any:
    from guardstack.pipeline import ToolCallRequest

    return ToolCallRequest("look", {})


async def test_a_breaker_never_counts_another_layers_refusal() -> None:
    """A rate limit inside a breaker refusing is guardstack's answer, not the tool failing."""
    built = with_tools(1)
    built.plugin(CircuitBreaker(minimum_calls=2, failure_ratio=0.5, on=(TOOL_RATE_LIMITED,)))
    built.plugin(RateLimit(per_second=0.001, wait=False))
    codes = [(await built.tools.execute(call("tool-0"))).result.code for _ in range(6)]
    assert codes == [None] + [TOOL_RATE_LIMITED] * 5  # never TOOL_UNAVAILABLE


async def test_retry_retries_a_refusal_only_when_it_says_when() -> None:
    runs = []

    async def counted(arguments: Any, call: Any) -> str:
        runs.append(anyio.current_time())
        return "ok"

    built = Harness()
    built.tools.register(ToolDefinition("t", counted))
    built.plugin(Retry(attempts=3, retry_on=(TOOL_RATE_LIMITED,), backoff_ms=0, jitter=False))
    built.plugin(RateLimit(per_second=2, wait=False))
    first = await built.tools.execute(call("t"))
    second = await built.tools.execute(call("t"))  # refused with a 0.5 s wait, then retried
    assert (first.result.code, second.result.code) == (None, None)
    assert runs[1] - runs[0] == pytest.approx(0.5)


# -- 3. a cancelled waiter never lets two calls through where one is allowed -----------------


async def test_a_cancelled_rate_limit_waiter_hands_its_place_to_the_next() -> None:
    """aiolimiter's rule: B and C wait, B is cancelled, C moves up; D arriving later waits."""
    starts: list[tuple[float, str]] = []
    began = anyio.current_time()

    async def mark(arguments: Any, call: Any) -> str:
        starts.append((round(anyio.current_time() - began, 6), arguments["who"]))
        return "ok"

    built = Harness()
    built.tools.register(ToolDefinition("t", mark))
    built.plugin(RateLimit(per_second=1, burst=1))

    async def caller(who: str, scope: anyio.CancelScope | None = None) -> None:
        if scope is None:
            await built.tools.execute(call("t", {"who": who}))
            return
        with scope:
            await built.tools.execute(call("t", {"who": who}))

    b_scope = anyio.CancelScope()
    async with anyio.create_task_group() as group:
        group.start_soon(caller, "X")
        await anyio.sleep(0.1)
        group.start_soon(caller, "B", b_scope)
        await anyio.sleep(0.1)
        group.start_soon(caller, "C")
        await anyio.sleep(0.3)
        b_scope.cancel()
        await anyio.sleep(0.1)
        group.start_soon(caller, "D")
    assert starts == [(0.0, "X"), (1.0, "C"), (2.0, "D")]


async def test_a_cancelled_bulkhead_waiter_never_lets_two_through_a_limit_of_one() -> None:
    running = peak = 0

    async def work(arguments: Any, call: Any) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await anyio.sleep(1)
        finally:
            running -= 1
        return "ok"

    built = Harness()
    built.tools.register(ToolDefinition("t", work))
    built.plugin(ConcurrencyLimit(1, queue=10))
    scopes = [anyio.CancelScope() for _ in range(5)]

    async def caller(scope: anyio.CancelScope) -> None:
        with scope:
            await built.tools.execute(call("t"))

    async with anyio.create_task_group() as group:
        for scope in scopes:
            group.start_soon(caller, scope)
        await anyio.sleep(0.5)
        scopes[1].cancel()
        scopes[0].cancel()  # the running one: its slot goes back
        for _ in range(3):
            group.start_soon(caller, anyio.CancelScope())
    assert peak == 1


# -- 4. a breaker's window is pruned by the current time ------------------------------------


async def test_a_breaker_forgets_failures_older_than_its_window_when_a_long_call_ends() -> None:
    async def slow_failure(arguments: Any, call: Any) -> str:
        await anyio.sleep(arguments["s"])
        raise RuntimeError("down")

    built = Harness()
    built.tools.register(ToolDefinition("t", slow_failure))
    built.plugin(CircuitBreaker(minimum_calls=2, failure_ratio=0.5, window_s=10, break_s=60))

    async def long_call() -> None:
        await built.tools.execute(call("t", {"s": 100}))

    began = anyio.current_time()
    async with anyio.create_task_group() as group:
        group.start_soon(long_call)  # starts at 0, fails at 100
        await anyio.lowlevel.checkpoint()
        await built.tools.execute(call("t", {"s": 1}))  # fails at 1: long gone by 100
    assert anyio.current_time() - began == pytest.approx(100)
    result = (await built.tools.execute(call("t", {"s": 0}))).result
    assert result.code == TOOL_FAILED  # admitted: two failures 99 s apart never met


# -- 5. a cancelled call never runs its tool -------------------------------------------------


@pytest.mark.parametrize("with_retry", [False, True])
async def test_a_call_whose_caller_is_cancelled_never_runs_its_tool(with_retry: bool) -> None:
    tool = ScriptedTool("t", [Reply("ran")])
    built = Harness()
    tool.register(built.tools)
    if with_retry:
        built.plugin(Retry(attempts=3))
    with anyio.CancelScope() as scope:
        scope.cancel()
        await built.tools.execute(call("t"))
    assert tool.calls == []


@pytest.mark.parametrize("with_retry", [False, True])
async def test_a_call_whose_deadline_passed_while_its_caller_ran_never_runs_its_tool(
    with_retry: bool,
) -> None:
    """The caller's deadline passed while it was busy, so its timer has not fired yet:
    the cancel still arrives before the tool starts (on asyncio it takes the timer a
    second checkpoint to run)."""
    tool = ScriptedTool("t", [Reply("ran")])
    built = Harness()
    tool.register(built.tools)
    if with_retry:
        built.plugin(Retry(attempts=3))
    with anyio.CancelScope(deadline=anyio.current_time() + 1) as scope:
        jump_clock(2)
        await built.tools.execute(call("t"))
    assert scope.cancelled_caught
    assert tool.calls == []


# -- 6. chaos on the model stage is a fault a retry can retry ------------------------------


async def test_a_model_stage_chaos_raise_is_retried() -> None:
    model = ScriptedModel([ModelReply("after the fault")])
    built = Harness(model)
    built.plugin(Retry(stage="model", attempts=2, retry_on=lambda error: True, backoff_ms=0))
    built.plugin(Chaos(stage="model", rate=1.0, fault="raise", seed=1))
    turn = await built.loop.create("s").prompt("hi")
    assert turn.reason == "error"  # rate 1.0: both attempts get the fault...
    assert "ChaosError" in (turn.error or "")
    chaotic = Harness(ScriptedModel([ModelReply("after the fault")]))
    chaotic.plugin(Retry(stage="model", attempts=5, retry_on=(MODEL_FAILED,), backoff_ms=0))
    chaotic.plugin(Chaos(stage="model", rate=0.5, fault="raise", seed=3))
    turn = await chaotic.loop.create("s").prompt("hi")
    assert turn.text == "after the fault"  # ... and a retry gets past a 50% fault


# -- 7 and 8. hedges: exceptions as themselves, numbers of their own -------------------------


async def test_an_inner_layers_exception_passes_a_hedge_as_itself_with_its_blame() -> None:
    async def broken(call: ToolCall, call_next: Any) -> ToolResult:
        raise ValueError("inner layer bug")

    built = with_tools(1)
    built.plugin(Hedge(delay_ms=100))
    built.tools.dispatch.use(broken, name="broken")
    result = (await built.tools.execute(call("tool-0"))).result
    assert result.code == TOOL_FAILED
    assert result.content == 'Error: dispatch layer "broken" failed: inner layer bug'


async def test_inner_layers_tell_hedges_from_retries() -> None:
    seen: list[tuple[int, int]] = []

    async def slow_fail(arguments: Any, call: ToolCall) -> ToolResult:
        seen.append((call.attempt, call.hedge))
        await anyio.sleep(0.2)
        return ToolResult.failure("no", code="TOOL_TIMEOUT")

    built = Harness()
    built.tools.register(ToolDefinition("t", slow_fail))
    built.plugin(Retry(attempts=2, backoff_ms=0))
    built.plugin(Hedge(delay_ms=100))
    await built.tools.execute(call("t"))
    assert seen == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert len(set(seen)) == 4


async def test_a_hedge_never_hedges_after_a_refusal() -> None:
    runs = []

    async def counted(arguments: Any, call: ToolCall) -> str:
        runs.append(call.hedge)
        await anyio.sleep(1)
        return "ok"

    built = Harness()
    built.tools.register(ToolDefinition("t", counted))
    built.plugin(Hedge(delay_ms=100, max_hedges=3))
    built.plugin(ConcurrencyLimit(1))
    result = (await built.tools.execute(call("t"))).result
    assert result.content == "ok"
    assert runs == [0]  # the first hedge was refused (overloaded): no more were started


# -- a store that fails -----------------------------------------------------------------


class FailingStore(MemoryStore):
    """A memory store that fails while ``down`` is set (as a Redis that went away)."""

    def __init__(self, on_error: Any = None) -> None:
        super().__init__(on_error=on_error)
        self.down = False
        self.name = "test"

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("store unreachable")

    async def take(self, *args: Any, **kwargs: Any) -> float:
        self._check()
        return await super().take(*args, **kwargs)

    async def admit(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return await super().admit(*args, **kwargs)

    async def acquire(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return await super().acquire(*args, **kwargs)

    async def add(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return await super().add(*args, **kwargs)

    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return await super().reserve(*args, **kwargs)

    async def settle(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return await super().settle(*args, **kwargs)

    async def release(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return await super().release(*args, **kwargs)


async def test_layers_fail_open_and_caps_fail_closed_when_the_store_is_down() -> None:
    store = FailingStore()
    built = with_tools(1, store=store)
    built.plugin(ToolCallLimit(per_turn=100))
    built.plugin(CircuitBreaker())
    built.plugin(RateLimit(per_second=1))
    built.plugin(ConcurrencyLimit(1))
    assert (await built.tools.execute(call("tool-0", conversation="c"))).result.content == "ok"
    store.down = True
    result = (await built.tools.execute(call("tool-0", conversation="c"))).result
    assert result.code == TOOL_DENIED  # the cap fails closed, naming its store
    assert "its test store is not answering" in result.content


async def test_with_on_error_open_a_cap_lets_calls_through_and_layers_warn_once_a_minute() -> None:
    store = FailingStore(on_error="open")
    built = with_tools(1, store=store)
    built.plugin(ToolCallLimit(per_turn=100))
    built.plugin(RateLimit(per_second=1_000))
    store.down = True

    async def five_calls() -> list[str]:
        calls = [call("tool-0", conversation="c") for _ in range(5)]
        return [(await built.tools.execute(each)).result.content for each in calls]

    with pytest.warns(GuardstackWarning) as warned:
        contents = await five_calls()
    assert contents == ["ok"] * 5
    assert len(warned) == 1  # one per layer per minute


async def test_a_breaker_on_a_closed_store_refuses_naming_the_store() -> None:
    store = FailingStore(on_error="closed")
    built = with_tools(1, store=store)
    built.plugin(CircuitBreaker())
    store.down = True
    with pytest.warns(GuardstackWarning):
        result = (await built.tools.execute(call("tool-0"))).result
    assert result.code == TOOL_UNAVAILABLE
    assert "store is not answering" in result.content


async def test_a_model_stage_store_failure_with_a_closed_store_is_a_refusal_not_a_crash() -> None:
    store = FailingStore(on_error="closed")
    built = Harness(ScriptedModel([ModelReply("never")]), store=store)
    built.plugin(RateLimit(stage="model", per_second=1))
    store.down = True
    with pytest.warns(GuardstackWarning):
        turn = await built.loop.create("s").prompt("hi")
    assert turn.reason == "error"
    assert "MODEL_RATE_LIMITED" in (turn.error or "")
    assert "store is not answering" in (turn.error or "")


def test_model_error_refusals_are_marked_as_guardstacks_own() -> None:
    error = ModelError("x", refused=True, layer="rate-limit")
    assert error.refused
    assert error.layer == "rate-limit"
    assert not ModelError("y").refused
    assert not isinstance(Raise, type(None))


async def test_a_bulkhead_on_a_closed_store_refuses_naming_the_store() -> None:
    store = FailingStore(on_error="closed")
    built = with_tools(1, store=store)
    built.plugin(ConcurrencyLimit(2))
    store.down = True
    with pytest.warns(GuardstackWarning):
        result = (await built.tools.execute(call("tool-0"))).result
    assert result.code == TOOL_OVERLOADED
    assert "store is not answering" in result.content
