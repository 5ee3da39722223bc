"""Retry: what, how long, how many; budgets; cancellation; attempts visible inside."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import sniffio

from guardstack.pipeline import (
    TOOL_FAILED,
    TOOL_RATE_LIMITED,
    TOOL_TIMEOUT,
    ConfigError,
    ToolCall,
    ToolError,
    ToolResult,
    timeout_result,
)
from guardstack.pipeline.testing import Hang, Raise, Reply, ScriptedTool
from guardstack.wrappers import Retry, RetryBudget, Timeout, no_backoff
from tests.helpers import call, harness_with, registry_with, run


def flaky(fail_times: int, code: str = TOOL_TIMEOUT) -> ScriptedTool:
    steps: list[Any] = [Reply(ToolResult.failure("x", code=code))] * fail_times
    return ScriptedTool("flaky", [*steps, Reply("finally")])


async def test_retries_matching_failures_until_success() -> None:
    tool = flaky(2)
    registry = registry_with(tool)
    registry.dispatch.use(Retry(attempts=3, backoff_ms=0))
    outcome = await registry.execute(call("flaky"))
    assert outcome.result == ToolResult("finally")
    assert [run.call.attempt for run in tool.runs] == [1, 2, 3]


async def test_gives_up_after_attempts_and_returns_the_last_result() -> None:
    tool = flaky(5)
    registry = registry_with(tool)
    registry.dispatch.use(Retry(attempts=2, backoff_ms=0))
    outcome = await registry.execute(call("flaky"))
    assert outcome.result.code == TOOL_TIMEOUT
    assert len(tool.runs) == 2


async def test_only_what_retry_on_names_is_retried() -> None:
    tool = ScriptedTool("t", [Raise(ValueError("bad input"))])
    registry = registry_with(tool)
    registry.dispatch.use(Retry(attempts=5, backoff_ms=0))
    assert (await registry.execute(call("t"))).result.code == TOOL_FAILED
    assert len(tool.runs) == 1  # TOOL_FAILED is not in the default retry_on

    by_predicate = flaky(1, code="RATE_LIMITED")
    registry = registry_with(by_predicate)
    registry.dispatch.use(
        Retry(retry_on=lambda result: result.code == "RATE_LIMITED", backoff_ms=0)
    )
    assert (await registry.execute(call("flaky"))).result == ToolResult("finally")


async def test_backoff_is_exponential_and_capped_without_jitter() -> None:
    tool = flaky(4)
    registry = registry_with(tool)
    registry.dispatch.use(Retry(attempts=5, backoff_ms=100, max_backoff_ms=300, jitter=False))
    await registry.execute(call("flaky"))
    starts = [run.started - tool.runs[0].started for run in tool.runs]
    assert starts == pytest.approx([0, 0.1, 0.3, 0.6, 0.9])


async def test_jitter_is_full_and_repeatable_with_a_seed() -> None:
    retry = Retry(backoff_ms=1000, max_backoff_ms=8000, seed=7)
    delays = [retry.delay_s(attempt) for attempt in (1, 2, 3, 4, 5)]
    again = Retry(backoff_ms=1000, max_backoff_ms=8000, seed=7)
    assert delays == [again.delay_s(attempt) for attempt in (1, 2, 3, 4, 5)]
    ceilings = [1, 2, 4, 8, 8]
    assert all(0 <= delay <= ceiling for delay, ceiling in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == 5


async def test_no_backoff_turns_waits_off_only_in_its_scope() -> None:
    tool = flaky(2)
    registry = registry_with(tool)
    registry.dispatch.use(Retry(attempts=3, backoff_ms=5000, jitter=False))
    started = anyio.current_time()
    with no_backoff():
        await registry.execute(call("flaky"))
    assert anyio.current_time() == started
    tool.runs.clear()
    await registry.execute(call("flaky"))
    assert anyio.current_time() - started == pytest.approx(5 + 10)


async def test_cancellation_interrupts_the_wait_and_no_attempt_starts_after_it() -> None:
    tool = flaky(5)
    registry = registry_with(tool)
    registry.dispatch.use(Retry(attempts=5, backoff_ms=1000, jitter=False))
    outcomes = []
    with anyio.move_on_after(1.5) as scope:
        outcomes.append(await registry.execute(call("flaky")))
    assert scope.cancelled_caught
    assert outcomes == []
    assert len(tool.runs) == 2  # at 0 s and 1 s; the wait until 3 s was cut at 1.5 s
    await anyio.sleep(10)
    assert len(tool.runs) == 2


async def test_a_cancelled_attempt_is_not_retried() -> None:
    tool = ScriptedTool("hang", [Hang()])
    registry = registry_with(tool)
    registry.dispatch.use(Retry(attempts=3, backoff_ms=0))
    with anyio.move_on_after(1):
        await registry.execute(call("hang"))
    assert len(tool.runs) == 1


async def test_layers_inside_see_the_attempt_number() -> None:
    attempts: list[int] = []

    async def inside(tool_call: ToolCall, call_next: Any) -> ToolResult:
        attempts.append(tool_call.attempt)
        result: ToolResult = await call_next(tool_call)
        return result

    registry = registry_with(ScriptedTool("hang", [Hang()]))
    registry.dispatch.use(Retry(attempts=3, backoff_ms=0))
    registry.dispatch.use(inside)
    registry.dispatch.use(Timeout(ms=10))
    assert (await registry.execute(call("hang"))).result.code == TOOL_TIMEOUT
    assert attempts == [1, 2, 3]


async def test_a_shared_budget_stops_a_retry_storm() -> None:
    budget = RetryBudget(ratio=0.5, min_retries_per_second=0, capacity=2)
    tool = ScriptedTool("down", [Reply(ToolResult.failure("down", code=TOOL_TIMEOUT))])
    registry = registry_with(tool)
    registry.dispatch.use(Retry(attempts=3, backoff_ms=0, budget=budget))
    with no_backoff():
        for _ in range(10):
            await registry.execute(call("down"))
    # 10 operations; without a budget 30 attempts. With it: the 2 tokens it starts with
    # go to the first operation's retries, then every second operation earns one retry.
    assert len(tool.runs) == 10 + 2 + 4
    assert [run.call.attempt for run in tool.runs].count(2) == 5
    assert budget.tokens == 0.5


async def test_a_budget_refills_over_time() -> None:
    budget = RetryBudget(ratio=0, min_retries_per_second=2, capacity=4)
    for _ in range(4):
        assert budget.try_withdraw()
    assert not budget.try_withdraw()
    await anyio.sleep(1)
    assert budget.try_withdraw()
    assert budget.try_withdraw()
    assert not budget.try_withdraw()


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"attempts": 0}, "attempts"),
        ({"attempts": 1.5}, "attempts"),
        ({"backoff_ms": -1}, "backoff_ms"),
        ({"backoff_ms": 100, "max_backoff_ms": 50}, "max_backoff_ms"),
        ({"retry_on": []}, "retry_on"),
        ({"retry_on": [1]}, "retry_on"),
        ({"jitter": "yes"}, "jitter"),
        ({"budget": 3}, "budget"),
    ],
)
def test_bad_retry_configuration_fails_loud(config: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Retry(**config)
    assert raised.value.key == key


@pytest.mark.parametrize(("key", "value"), [("ratio", -1), ("capacity", 0.5), ("ratio", "x")])
def test_bad_budgets_fail_loud(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        RetryBudget(**{key: value})
    assert raised.value.key == key


def _block_the_event_loop_for(seconds: float) -> None:
    """What a neighbour that blocks the loop does to time: it jumps, no timer fires meanwhile."""
    if sniffio.current_async_library() == "trio":
        import trio

        trio.lowlevel.current_clock().jump(seconds)  # type: ignore[attr-defined]
    else:
        import asyncio

        asyncio.get_running_loop()._virtual_now += seconds  # type: ignore[attr-defined]


async def test_no_attempt_starts_once_the_enclosing_deadline_has_passed() -> None:
    """The loop runs late: the backoff ends after the outer deadline, before its cancel."""
    tool = ScriptedTool("flaky", [Reply(timeout_result(100), after_ms=500)] * 5)
    registry = registry_with(tool)
    registry.dispatch.use(Timeout(ms=1000, code="TOTAL"))
    registry.dispatch.use(Retry(attempts=5, backoff_ms=400, max_backoff_ms=400, jitter=False))

    async def neighbour() -> None:
        await anyio.sleep(0.85)
        _block_the_event_loop_for(0.25)  # backoff ends at 0.9, the deadline at 1.0

    started = anyio.current_time()
    async with anyio.create_task_group() as group:
        group.start_soon(neighbour)
        outcome = await registry.execute(call("flaky"))
    assert outcome.result.code == "TOTAL"
    assert [run.started - started for run in tool.runs] == [0.0]


def test_no_backoff_at_all_is_a_valid_configuration() -> None:
    """``backoff_ms=0, max_backoff_ms=0``: retries at once (0 is a bound, not a mistake)."""
    retry = Retry(attempts=2, backoff_ms=0, max_backoff_ms=0, jitter=False)
    assert (retry.backoff_ms, retry.max_backoff_ms) == (0, 0)


# -- Retry(respect_deadline=True) ---------------------------------------------------------


async def timed_hanging_search(
    total_ms: int, backoff_ms: int, *, respect: bool = True
) -> tuple[ToolResult, float]:
    """A hanging tool with a 2 s budget, retried (its backoff fixed) inside a whole
    operation timeout coded ``TOTAL``: its result, and how long it took."""
    built = harness_with(ScriptedTool("search", [Hang()], timeout_ms=2_000))
    built.plugin(Timeout(ms=total_ms, code="TOTAL"))
    built.plugin(Retry(attempts=5, backoff_ms=backoff_ms, jitter=False, respect_deadline=respect))
    built.plugin(Timeout())
    started = anyio.current_time()
    result = await run(built, "search")
    return result, anyio.current_time() - started


async def test_a_deadline_aware_retry_stops_when_the_next_attempt_cannot_finish() -> None:
    for respect, code, elapsed in ((True, TOOL_TIMEOUT, 2.0), (False, "TOTAL", 5.0)):
        result, took = await timed_hanging_search(5_000, 1_000, respect=respect)
        assert (result.code, took) == (code, elapsed)
    assert result.code == "TOTAL"
    assert (await timed_hanging_search(5_000, 1_000))[0].content == (
        "Error: tool call timed out after 2000ms (not retried: a 2000ms attempt after a "
        "1000ms wait cannot finish in the 3000ms left of the deadline)"
    )


async def test_a_deadline_aware_retry_counts_the_wait_beside_the_attempt() -> None:
    """The backoff before the next attempt counts, in the same unit as the attempt's
    budget: a 2.5 s wait and a 2 s attempt fit in the 8 s left, so it retries; a 5 s
    wait and a 2 s attempt do not fit in the 3.5 s left, so it stops at 6.5 s — not at
    the outer 10 s (a mutant that added the wait in seconds lived without this)."""
    result, took = await timed_hanging_search(10_000, 2_500)
    assert (result.code, took) == (TOOL_TIMEOUT, 6.5)
    assert result.content.endswith(
        "(not retried: a 2000ms attempt after a 5000ms wait cannot finish in the 3500ms "
        "left of the deadline)"
    )


async def test_a_provider_s_retry_after_is_waited_but_never_past_the_ceiling() -> None:
    """A failure that says when to come back is retried no sooner than it says, and
    never later than ``max_backoff_ms`` (stamina's ``wait_max``, tenacity's
    ``wait_exponential(max=…)``): 10 s asked, 1.5 s waited; 0.2 s asked, 0.2 s waited."""
    busy = ToolResult(
        "Error: busy", True, ToolError("busy", "Busy", TOOL_RATE_LIMITED, retry_after_s=10)
    )
    soon = ToolResult(
        "Error: busy", True, ToolError("busy", "Busy", TOOL_RATE_LIMITED, retry_after_s=0.2)
    )
    tool = ScriptedTool("search", [Reply(busy), Reply(soon), Reply("ok")])
    registry = registry_with(tool)
    registry.dispatch.use(
        Retry(
            attempts=3,
            retry_on=[TOOL_RATE_LIMITED],
            backoff_ms=1,
            max_backoff_ms=1_500,
            jitter=False,
        )
    )
    outcome = await registry.execute(call("search"))
    assert outcome.result.content == "ok"
    starts = [run.started - tool.runs[0].started for run in tool.runs]
    assert starts == pytest.approx([0, 1.5, 1.7], abs=1e-9)


async def test_a_deadline_stop_keeps_a_refusal_a_refusal_on_the_model_stage() -> None:
    """A rate limit's refusal (guardstack's own, ``refused``, with ``retry_after_s``)
    that ``respect_deadline`` does not retry is passed on as that refusal, with a note:
    a breaker outside does not count it as the provider failing, and the message
    names its code once."""
    from guardstack.pipeline import (
        MODEL_RATE_LIMITED,
        Harness,
        ModelError,
        ModelReply,
        ModelRequest,
    )
    from guardstack.pipeline.testing import ScriptedModel
    from guardstack.wrappers import CircuitBreaker, RateLimit

    model = ScriptedModel([ModelReply(text) for text in ("one", "two", "three", "four")])
    built = Harness(model)
    built.plugin(CircuitBreaker(stage="model", minimum_calls=1, failure_ratio=1.0))
    built.plugin(Timeout(stage="model", ms=1_000))
    built.plugin(Retry(stage="model", attempts=3, respect_deadline=True, jitter=False))
    built.plugin(RateLimit(stage="model", per_second=0.01, burst=1, wait=False))
    agent = built.loop.create("s")
    assert (await built.loop.call_model(ModelRequest(agent, [], []))).text == "one"
    for _ in range(3):  # never a breaker's refusal: the provider never failed
        with pytest.raises(ModelError) as raised:
            await built.loop.call_model(ModelRequest(agent, [], []))
        refusal = raised.value
        assert (refusal.code, refusal.refused, refusal.layer) == (
            MODEL_RATE_LIMITED,
            True,
            "rate-limit",
        )
        assert refusal.retry_after_s == pytest.approx(100, abs=1)
        assert "not retried:" in refusal.message
        assert str(refusal).count(MODEL_RATE_LIMITED) == 1
    assert model.remaining == 3
