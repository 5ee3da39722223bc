"""Manual control (``harness.control``): breakers forced open, closed or isolated, tools
paused and resumed, limits changed at run time — each seen at the next call, each an
event, and every mistake an error naming what exists (and changing nothing)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from guardstack.guards import ModelCallLimit, ToolCallLimit
from guardstack.pipeline import (
    TOOL_DENIED,
    TOOL_UNAVAILABLE,
    ConfigError,
    Harness,
    MemoryStore,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolDefinition,
)
from guardstack.wrappers import CircuitBreaker, ConcurrencyLimit, Metrics, RateLimit, Tracing
from tests.wrappers.otel import LogRig, MetricRig


class Clock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def guarded(*plugins: Any, clock: Clock | None = None) -> tuple[Harness, list[str]]:
    ran: list[str] = []

    async def search(arguments: Any, call: ToolCall) -> str:
        ran.append(call.call_id)
        await anyio.sleep(float(arguments.get("hold", 0)))
        return "found"

    harness = Harness(store=MemoryStore(wall_clock=clock) if clock else None)
    harness.tools.register(ToolDefinition("search", search))
    harness.tools.register(ToolDefinition("other", search))
    for plugin in plugins:
        harness.plugin(plugin)
    return harness, ran


async def call(harness: Harness, call_id: str = "c", tool: str = "search", **arguments: Any) -> Any:
    return (await harness.tools.execute(ToolCall(tool, arguments, call_id))).result


async def test_a_breaker_forced_open_refuses_then_half_opens_after_its_break() -> None:
    clock = Clock()
    harness, ran = guarded(CircuitBreaker(break_s=30), clock=clock)
    await harness.control.force_open("search", by="oncall")
    refused = await call(harness, "c1")
    assert refused.code == TOOL_UNAVAILABLE
    assert "an operator holds it open. Try again in 30s" in refused.content
    assert (await call(harness, "c2", "other")).content == "found"  # only that tool
    clock.now += 31  # its break is over: the breaker decides again
    assert (await call(harness, "c3")).content == "found"
    assert ran == ["c2", "c3"]


async def test_isolated_until_released_and_held_closed_until_released() -> None:
    harness, _ = guarded(CircuitBreaker(minimum_calls=1, failure_ratio=1.0))
    await harness.control.isolate("search")
    assert (await call(harness, "c1")).code == TOOL_UNAVAILABLE
    await harness.control.release("search")
    assert (await call(harness, "c2")).content == "found"

    async def broken(arguments: Any, call: ToolCall) -> str:
        raise RuntimeError("down")

    failing, _ = guarded(CircuitBreaker(minimum_calls=1, failure_ratio=1.0))
    failing.tools.register(ToolDefinition("flaky", broken))
    await call(failing, "f1", "flaky")
    assert (await call(failing, "f2", "flaky")).code == TOOL_UNAVAILABLE  # it opened itself
    await failing.control.force_closed("flaky")
    assert (await call(failing, "f3", "flaky")).code == "TOOL_FAILED"  # let through
    await failing.control.release("flaky")
    assert (await call(failing, "f4", "flaky")).code == TOOL_UNAVAILABLE


async def test_a_paused_tool_is_denied_with_the_reason_the_model_reads() -> None:
    harness, ran = guarded()
    await harness.control.pause("search", reason="the index is being rebuilt until 14:00")
    denied = await call(harness, "c1")
    assert denied.code == TOOL_DENIED
    assert denied.content == (
        'Error: tool "search" is paused: the index is being rebuilt until 14:00'
    )
    assert (await call(harness, "c2", "other")).content == "found"
    await harness.control.resume("search")
    assert (await call(harness, "c3")).content == "found"
    assert ran == ["c2", "c3"]


async def test_a_limit_changed_at_run_time_holds_at_the_next_call() -> None:
    harness, _ = guarded(ConcurrencyLimit(4, queue=100))
    running: list[int] = []
    peak = 0

    async def held(arguments: Any, call: ToolCall) -> str:
        nonlocal peak
        running.append(1)
        peak = max(peak, len(running))
        await anyio.sleep(0.1)
        running.pop()
        return "ok"

    harness.tools.register(ToolDefinition("held", held))
    await harness.control.set_limit("concurrency-limit", max_concurrent=1)

    async def burst() -> None:
        async with anyio.create_task_group() as group:
            for n in range(4):
                group.start_soon(call, harness, f"h{n}", "held")

    await burst()
    assert peak == 1
    await harness.control.clear_limit("concurrency-limit")
    peak = 0
    await burst()
    assert peak == 4


async def test_caps_and_rates_take_an_operators_numbers() -> None:
    harness, _ = guarded(ToolCallLimit(per_turn=10))
    await harness.control.set_limit("tool-call-limit", per_turn=1)
    first = await harness.tools.execute(ToolCall("search", {}, "a", conversation="t"))
    second = await harness.tools.execute(ToolCall("search", {}, "b", conversation="t"))
    assert first.result.content == "found"
    assert second.result.code == TOOL_DENIED
    harness, _ = guarded(RateLimit(per_second=1000, burst=1000))
    await harness.control.set_limit("rate-limit", tool="other", per_second=1, burst=1)
    started = anyio.current_time()
    for n in range(3):
        await harness.tools.execute(ToolCall("other", {}, f"o{n}", conversation="u"))
    assert anyio.current_time() - started == pytest.approx(2.0)

    model = ScriptedModel([ModelReply("one"), ModelReply("two")])
    calls_capped = Harness(model)
    calls_capped.plugin(ModelCallLimit(per_session=5))
    await calls_capped.control.set_limit("model-call-limit", per_session=1)
    agent = calls_capped.loop.create("s")
    assert (await agent.prompt("1")).reason == "completed"
    assert (await agent.prompt("2")).reason == "blocked"


async def test_every_change_is_an_event_and_the_overrides_a_gauge() -> None:
    logs, metrics = LogRig(), MetricRig()
    harness, _ = guarded(
        Tracing(logger_provider=logs.provider), Metrics(metrics.provider), CircuitBreaker()
    )
    await harness.control.isolate("search", by="oncall")
    await harness.control.pause("other", reason="maintenance")
    [gauge_isolated] = [
        p.value
        for p in metrics.points("guardstack.control.overrides")
        if p.attributes["kind"] == "breaker"
    ]
    assert gauge_isolated == 1
    events = logs.events("guardstack.control")
    assert [dict(e.attributes)["guardstack.control.kind"] for e in events] == ["breaker", "pause"]
    assert dict(events[0].attributes)["guardstack.control.by"] == "oncall"
    assert {o.kind for o in await harness.control.overrides()} == {"breaker", "pause"}


async def test_mistakes_name_what_exists_and_change_nothing() -> None:
    harness, _ = guarded(CircuitBreaker(), ConcurrencyLimit(2))
    with pytest.raises(
        ConfigError,
        match="no circuit-breaker 'circuit-braker' \\(did you mean 'circuit-breaker'\\?\\)",
    ):
        await harness.control.force_open("search", layer="circuit-braker")
    with pytest.raises(ConfigError, match="no tool 'serch' \\(did you mean 'search'\\?\\)"):
        await harness.control.isolate("serch")
    with pytest.raises(
        ConfigError, match=r"no limit 'max_concurent' to change \(did you mean 'max_concurrent'\?\)"
    ):
        await harness.control.set_limit("concurrency-limit", max_concurent=1)
    with pytest.raises(ConfigError, match="must be a number > 0"):
        await harness.control.set_limit("concurrency-limit", max_concurrent=-1)
    with pytest.raises(ConfigError, match="no layer 'rate-limit'"):
        await harness.control.set_limit("rate-limit", per_second=1)
    with pytest.raises(ConfigError, match="give a reason"):
        await harness.control.pause("search", reason=" ")
    bare, _ = guarded()
    with pytest.raises(ConfigError, match="no circuit-breaker to force"):
        await bare.control.force_open("search")
    assert await harness.control.overrides() == []
    assert (await call(harness)).content == "found"


async def test_an_override_holds_in_every_harness_on_one_memory_store_within_refresh_s() -> None:
    """Two harnesses of one process on one ``MemoryStore`` (as two gateways' stacks may
    share one): a breaker forced open and a tool paused in one are seen by the other's
    next call after ``refresh_s``, as on a store shared between processes."""
    clock = Clock()
    store = MemoryStore(wall_clock=clock)
    first, second = Harness(store=store), Harness(store=store)
    ran: list[str] = []

    async def search(arguments: Any, call: ToolCall) -> str:
        ran.append(call.call_id)
        return "found"

    for harness in (first, second):
        harness.tools.register(ToolDefinition("search", search))
        harness.plugin(CircuitBreaker(break_s=30))
    assert (await call(second, "before")).content == "found"  # its snapshot read now
    await first.control.force_open("search", by="oncall")
    await first.control.pause("search", reason="maintenance")
    await anyio.sleep(second.control.refresh_s)
    refused = await call(second, "after")
    assert refused.code == TOOL_DENIED
    assert "maintenance" in refused.content
    await first.control.resume("search")
    await anyio.sleep(second.control.refresh_s)
    assert (await call(second, "open")).code == TOOL_UNAVAILABLE  # still forced open
    assert ran == ["before"]
