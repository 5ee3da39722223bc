"""What the peers' own test suites assert, held by guardstack's layers (virtual time).

Each test names the peer test it ports (both anyio backends run each). The behaviour is
ported, not the code: the peers' tests drive their own APIs; these drive guardstack's
through a harness.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from guardstack.pipeline import (
    TOOL_FAILED,
    TOOL_UNAVAILABLE,
    Harness,
    ToolCall,
    ToolDefinition,
    ToolResult,
)
from guardstack.wrappers import CircuitBreaker, Fallback, Hedge, RateLimit, Retry
from tests.helpers import call


class Backend:
    """A tool whose health the test switches, counting its runs."""

    def __init__(self) -> None:
        self.healthy = False
        self.runs = 0

    async def __call__(self, arguments: Any, call: ToolCall) -> str:
        self.runs += 1
        if not self.healthy:
            raise RuntimeError("down")
        return "up"


def breaker_harness(backend: Backend, **options: Any) -> Harness:
    built = Harness()
    built.tools.register(ToolDefinition("t", backend))
    options.setdefault("minimum_calls", 3)
    options.setdefault("failure_ratio", 1.0)
    options.setdefault("break_s", 1.0)
    built.plugin(CircuitBreaker(**options))
    return built


async def codes(built: Harness, count: int) -> list[str | None]:
    return [(await built.tools.execute(call("t"))).result.code for _ in range(count)]


# -- pybreaker (tests/pybreaker_test.py) ----------------------------------------------------


async def test_pybreaker_several_failed_calls_open_the_circuit() -> None:
    """test_several_failed_calls_setting_absent: fail_max failures, then the breaker refuses."""
    backend = Backend()
    built = breaker_harness(backend)
    assert await codes(built, 4) == [TOOL_FAILED, TOOL_FAILED, TOOL_FAILED, TOOL_UNAVAILABLE]
    assert backend.runs == 3  # the refused call never reached the backend


async def test_pybreaker_failed_call_after_timeout_opens_again() -> None:
    """test_failed_call_after_timeout / test_failed_call_when_halfopen: the probe fails, open."""
    backend = Backend()
    built = breaker_harness(backend)
    await codes(built, 3)
    await anyio.sleep(1.0)
    assert await codes(built, 2) == [TOOL_FAILED, TOOL_UNAVAILABLE]  # probe, then open again
    assert backend.runs == 4


async def test_pybreaker_successful_call_after_timeout_closes_and_runs_once() -> None:
    """test_successful_after_timeout: the probe succeeds and closes; it ran exactly once."""
    backend = Backend()
    built = breaker_harness(backend)
    await codes(built, 3)
    backend.healthy = True
    assert await codes(built, 1) == [TOOL_UNAVAILABLE]  # still open: the backend not called
    await anyio.sleep(1.0)
    runs_before = backend.runs
    assert await codes(built, 3) == [None, None, None]  # probe closed it
    assert backend.runs == runs_before + 3


async def test_pybreaker_half_open_lets_exactly_one_probe_through() -> None:
    """test_failed_call_when_halfopen (and resilience4j's permittedNumberOfCallsInHalfOpenState=1):
    while the probe runs, other calls are refused at once."""
    backend = Backend()

    async def slow_probe(arguments: Any, call: ToolCall) -> str:
        backend.runs += 1
        await anyio.sleep(0.5)
        return "up"

    shared = Harness()  # one breaker for both tools: "fail" opens it, "t" probes it
    shared.tools.register(ToolDefinition("t", slow_probe))
    shared.tools.register(ToolDefinition("fail", Backend()))
    shared.plugin(CircuitBreaker(minimum_calls=1, failure_ratio=1.0, break_s=1.0, key="api"))
    await shared.tools.execute(call("fail"))
    await anyio.sleep(1.0)
    results: list[str | None] = []

    async def one() -> None:
        results.append((await shared.tools.execute(call("t"))).result.code)

    async with anyio.create_task_group() as group:
        for _ in range(5):
            group.start_soon(one)
    assert sorted(results, key=str) == [None, *[TOOL_UNAVAILABLE] * 4]
    assert backend.runs == 1


# -- aiolimiter (tests/test_aiolimiter.py) ----------------------------------------------------


def rate_limited(per_second: float, burst: int) -> tuple[Harness, list[float]]:
    """A harness whose tool ``t`` records when each call starts, behind a rate limit."""
    starts: list[float] = []
    began = anyio.current_time()

    async def mark(arguments: Any, call: ToolCall) -> str:
        starts.append(round(anyio.current_time() - began, 6))
        return "ok"

    built = Harness()
    built.tools.register(ToolDefinition("t", mark))
    built.plugin(RateLimit(per_second=per_second, burst=burst))
    return built, starts


async def run(built: Harness) -> None:
    await built.tools.execute(call("t"))


async def test_aiolimiter_acquire_releases_capacity_over_time() -> None:
    """test_acquire: 5 per 10 s (burst 5) — five at once, then one every 2 s."""
    built, starts = rate_limited(0.5, 5)
    async with anyio.create_task_group() as group:
        for _ in range(10):
            group.start_soon(run, built)
    assert starts == [0.0] * 5 + [2.0, 4.0, 6.0, 8.0, 10.0]


async def test_aiolimiter_a_cancelled_task_does_not_delay_the_next() -> None:
    """test_task_cancelled: two waiters, the first cancelled — the second starts when the
    first would have, not a period later."""
    built, starts = rate_limited(1, 1)
    await built.tools.execute(call("t"))  # the bucket is empty now
    first = anyio.CancelScope()

    async def waiter(scope: anyio.CancelScope) -> None:
        with scope:
            await built.tools.execute(call("t"))

    async with anyio.create_task_group() as group:
        group.start_soon(waiter, first)
        group.start_soon(waiter, anyio.CancelScope())
        await anyio.sleep(0.2)
        first.cancel()
    assert starts == [0.0, 1.0]


# -- tenacity (tests/test_tenacity.py) --------------------------------------------------------


def test_tenacity_exponential_with_max_wait() -> None:
    """TestWaitConditions.test_exponential_with_max_wait: doubling, then held at the cap."""
    retry = Retry(backoff_ms=1_000, max_backoff_ms=40_000, jitter=False)
    assert [retry.ceiling_s(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 40, 40]


def test_tenacity_random_wait_stays_within_its_bounds() -> None:
    """TestWaitConditions.test_random_sleep (and stamina's jitter bound): a jittered wait is
    between 0 and the ceiling, every draw."""
    retry = Retry(backoff_ms=100, max_backoff_ms=1_000, seed=7)
    for attempt in range(1, 12):
        for _ in range(50):
            assert 0 <= retry.delay_s(attempt) <= retry.ceiling_s(attempt)


async def test_tenacity_stamina_a_cancel_during_the_wait_stops_the_retries() -> None:
    """Cancelling while Retry waits between attempts stops it: no further attempt starts
    (tenacity's AsyncRetrying propagates CancelledError from its sleep; Polly's
    RetryResilienceStrategyTests cancel the delay)."""
    backend = Backend()
    built = Harness()
    built.tools.register(ToolDefinition("t", backend))
    built.plugin(Retry(attempts=5, retry_on=(TOOL_FAILED,), backoff_ms=1_000, jitter=False))
    with anyio.move_on_after(1.5):  # during the second wait
        await built.tools.execute(call("t"))
    await anyio.sleep(60)
    assert backend.runs == 2


# -- Polly v8 ----------------------------------------------------------------------------------


async def test_polly_fallback_runs_for_handled_outcomes_only() -> None:
    """FallbackResilienceStrategyTests.Handle_Result_Ok / DoesntHandle_Skips: the fallback
    answers a handled failure and leaves anything else alone."""
    fallbacks = 0

    async def cached(arguments: Any, call: ToolCall) -> str:
        nonlocal fallbacks
        fallbacks += 1
        return "cached"

    async def answer(arguments: Any, call: ToolCall) -> ToolResult:
        code = arguments["code"]
        return ToolResult.failure("no", code=code) if code else ToolResult.of("fresh")

    built = Harness()
    built.tools.register(ToolDefinition("t", answer))
    built.plugin(Fallback(cached, on=("TOOL_UNAVAILABLE",)))
    handled = await built.tools.execute(call("t", {"code": TOOL_UNAVAILABLE}))
    unhandled = await built.tools.execute(call("t", {"code": "TOOL_DENIED_BY_TOOL"}))
    success = await built.tools.execute(call("t", {"code": None}))
    assert (handled.result.content, unhandled.result.code, success.result.content) == (
        "cached",
        "TOOL_DENIED_BY_TOOL",
        "fresh",
    )
    assert fallbacks == 1


async def test_polly_hedging_the_first_good_answer_wins_and_the_rest_stop() -> None:
    """HedgingResilienceStrategyTests (ExecuteAsync_EnsureHedgedTasksCancelled): the primary
    is slow, the hedge answers, the primary is cancelled before the call returns."""
    events: list[str] = []

    async def primary_slow(arguments: Any, call: ToolCall) -> str:
        try:
            await anyio.sleep(10 if call.hedge == 0 else 0.1)
        except anyio.get_cancelled_exc_class():
            events.append(f"cancelled {call.hedge}")
            raise
        events.append(f"answered {call.hedge}")
        return f"hedge {call.hedge}"

    built = Harness()
    built.tools.register(ToolDefinition("t", primary_slow))
    built.plugin(Hedge(delay_ms=200))
    began = anyio.current_time()
    result = (await built.tools.execute(call("t"))).result
    assert result.content == "hedge 1"
    assert anyio.current_time() - began == pytest.approx(0.3)
    assert events == ["answered 1", "cancelled 0"]
