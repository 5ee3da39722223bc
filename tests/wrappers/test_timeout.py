"""Timeout: a fixed or declared budget; each instance owns its code; streams and progress."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from guardstack.pipeline import (
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    TOOL_FAILED,
    TOOL_TIMEOUT,
    AssistantMessage,
    ConfigError,
    Harness,
    ModelError,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    ToolCall,
    ToolDefinition,
    ToolRegistry,
    ToolResult,
    timeout_result,
)
from guardstack.pipeline.testing import Hang, Reply, ScriptedTool, Streamed
from guardstack.wrappers import Retry, Timeout, no_backoff
from tests.helpers import call, registry_with


async def test_a_fixed_budget_times_out_with_the_layers_code() -> None:
    registry = registry_with(ScriptedTool("t", [Hang()]))
    registry.dispatch.use(Timeout(ms=40, code="MY_TIMEOUT"))
    started = anyio.current_time()
    outcome = await registry.execute(call("t"))
    assert anyio.current_time() - started == pytest.approx(0.04)
    assert outcome.result == timeout_result(40, "MY_TIMEOUT")
    assert outcome.result.content == "Error: tool call timed out after 40ms"


async def test_no_ms_uses_the_tools_declared_budget_or_passes_through() -> None:
    registry = registry_with(
        ScriptedTool("budgeted", [Hang()], timeout_ms=70),
        ScriptedTool("free", [Reply("done", after_ms=100_000)]),
    )
    registry.dispatch.use(Timeout())
    assert (await registry.execute(call("budgeted"))).result == timeout_result(70, TOOL_TIMEOUT)
    assert (await registry.execute(call("free"))).result == ToolResult("done")


async def test_nested_timeouts_report_whichever_fired() -> None:
    for outer, inner, expected in ((100, 30, "INNER"), (30, 100, "OUTER")):
        registry = registry_with(ScriptedTool("t", [Hang()]))
        registry.dispatch.use(Timeout(ms=outer, code="OUTER"))
        registry.dispatch.use(Timeout(ms=inner, code="INNER"))
        outcome = await registry.execute(call("t"))
        assert outcome.result.code == expected
        assert outcome.result.content == f"Error: tool call timed out after {min(outer, inner)}ms"


@pytest.mark.parametrize(
    ("key", "value"), [("ms", 0), ("ms", 2.5), ("ms", True), ("code", ""), ("code", 5)]
)
def test_bad_timeout_configuration_fails_loud(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        Timeout(**{key: value})
    assert raised.value.key == key
    assert repr(value) in str(raised.value)


async def test_a_layer_returning_none_inside_a_timeout_is_not_a_timeout() -> None:
    """Judged by the scope, not the result: a broken layer is a TOOL_FAILED at t=0."""

    async def returns_none(tool_call: Any, call_next: Any) -> Any:
        return None

    registry = registry_with(ScriptedTool("echo"))
    registry.dispatch.use(Timeout(ms=1000))
    registry.dispatch.use(returns_none)
    started = anyio.current_time()
    outcome = await registry.execute(call("echo"))
    assert anyio.current_time() == started
    assert outcome.result.code == TOOL_FAILED
    assert "timed out" not in outcome.result.content


async def test_an_uncancellable_sync_tool_overrunning_its_budget_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The model's text stays the seed's; the operator gets a warning with the real time."""
    import threading

    release = threading.Event()

    def blocking(arguments: Any, tool_call: Any) -> str:
        release.wait(5)
        return "late"

    registry = ToolRegistry()
    registry.register(ToolDefinition("blocking", blocking, timeout_ms=200))
    registry.dispatch.use(Timeout())

    async def release_later() -> None:
        await anyio.sleep(1.0)
        release.set()

    with caplog.at_level("WARNING", logger="guardstack"):
        async with anyio.create_task_group() as group:
            group.start_soon(release_later)
            outcome = await registry.execute(call("blocking"))
    assert outcome.result.content == "Error: tool call timed out after 200ms"
    warning = " ".join(record.getMessage() for record in caplog.records)
    assert 'tool "blocking" ignored cancellation: budget 200ms, ran' in warning


# -- streams and progress: first_byte_ms, idle_ms ----------------------------------------


def streamed(*waits_ms: int, text: str = "ab", fail: bool = False) -> Streamed:
    """Pieces ``text`` arriving after each wait (ms), then a reply (or a failure)."""
    error = ModelError("the stream broke", MODEL_UNAVAILABLE) if fail else None
    return Streamed([(ms / 1000, text) for ms in waits_ms], fail=error)


async def run_model(
    script: list[Streamed], *layers: Any
) -> tuple[ModelReply | BaseException, float, Any]:
    harness = Harness(ScriptedModel(script))
    for layer in layers:
        harness.plugin(layer)
    agent = harness.loop.create("s")
    request = ModelRequest(agent, [{"role": "user", "content": "hi"}], [])
    started = anyio.current_time()
    try:
        with no_backoff():
            outcome: ModelReply | BaseException = await harness.loop.call_model(request)
    except ModelError as error:
        outcome = error
    return outcome, anyio.current_time() - started, harness


async def test_a_stream_that_never_starts_times_out_at_its_first_byte_bound() -> None:
    outcome, elapsed, _ = await run_model(
        [streamed(5_000)], Timeout(stage="model", first_byte_ms=200, idle_ms=50)
    )
    assert isinstance(outcome, ModelError)
    assert outcome.code == MODEL_TIMEOUT
    assert outcome.message == "model call timed out: no first byte within 200ms"
    assert outcome.partial is None
    assert elapsed == pytest.approx(0.2)


async def test_a_stream_that_stalls_is_cut_with_what_arrived() -> None:
    outcome, elapsed, _ = await run_model(
        [streamed(10, 10, 10, 900)], Timeout(stage="model", first_byte_ms=200, idle_ms=100)
    )
    assert isinstance(outcome, ModelError)
    assert outcome.message == (
        "model call timed out: the stream stalled: no chunk for 100ms after 3 chunks"
    )
    assert outcome.partial == "ababab"
    assert elapsed == pytest.approx(0.13)


async def test_a_long_stream_that_keeps_coming_is_bounded_only_by_ms() -> None:
    steady = streamed(*[90] * 40)  # 3.6 s in all, never a gap of 100 ms
    outcome, elapsed, _ = await run_model([steady], Timeout(stage="model", idle_ms=100))
    assert outcome == ModelReply("ab" * 40)
    assert elapsed == pytest.approx(3.6)
    outcome, elapsed, _ = await run_model([steady], Timeout(stage="model", ms=1_005, idle_ms=100))
    assert isinstance(outcome, ModelError)
    assert outcome.message == "model call timed out after 1005ms"
    assert outcome.partial == "ab" * 11
    assert elapsed == pytest.approx(1.005)


async def test_a_cut_stream_that_ends_the_turn_is_logged() -> None:
    harness = Harness(ScriptedModel([streamed(10, 10, 500, text="Hel")]))
    harness.plugin(Timeout(stage="model", idle_ms=100))
    agent = harness.loop.create("cut")
    result = await agent.prompt("go")
    assert result.reason == "error"
    said = [e for e in agent.session.events if isinstance(e, AssistantMessage)]
    assert [e.text for e in said] == ["HelHel"]
    assert agent.session.messages()[-1] == {"role": "assistant", "content": "HelHel"}


async def test_a_model_that_does_not_stream_is_one_piece() -> None:
    """A model that reports no pieces: the first byte is the whole reply."""

    class Plain:
        async def complete(self, messages: Any, tools: Any) -> ModelReply:
            await anyio.sleep(0.3)
            return ModelReply("late")

    harness = Harness(Plain())
    harness.plugin(Timeout(stage="model", first_byte_ms=200))
    result = await harness.loop.create("p").prompt("go")
    assert (
        result.error
        == "ModelError: MODEL_TIMEOUT: model call timed out: no first byte within 200ms"
    )


async def test_a_tool_that_reports_progress_outlives_its_declared_budget() -> None:
    async def working(arguments: Any, call: ToolCall) -> str:
        for _ in range(int(arguments["reports"])):
            await anyio.sleep(0.05)
            call.progress()
        await anyio.sleep(float(arguments.get("then_s", 0)))
        return "done"

    registry = ToolRegistry()
    registry.register(ToolDefinition("work", working, timeout_ms=100))
    registry.dispatch.use(Timeout(idle_ms=80))
    started = anyio.current_time()
    outcome = await registry.execute(call("work", {"reports": 20}))
    assert outcome.result == ToolResult("done")
    assert anyio.current_time() - started == pytest.approx(1.0)  # ten times its budget
    started = anyio.current_time()
    outcome = await registry.execute(call("work", {"reports": 3, "then_s": 5}))
    assert outcome.result.content == "Error: tool call timed out: no progress report for 80ms"
    assert outcome.result.code == TOOL_TIMEOUT
    assert anyio.current_time() - started == pytest.approx(0.23)
    started = anyio.current_time()
    outcome = await registry.execute(call("work", {"reports": 0, "then_s": 5}))
    assert outcome.result == timeout_result(100)  # never reported: its budget, as before
    assert anyio.current_time() - started == pytest.approx(0.1)
    registry.dispatch.use(Timeout(ms=300))  # an explicit whole bound holds, reports or not
    started = anyio.current_time()
    outcome = await registry.execute(call("work", {"reports": 20}))
    assert outcome.result == timeout_result(300)
    assert anyio.current_time() - started == pytest.approx(0.3)


def test_progress_with_nobody_listening_is_a_no_op() -> None:
    call("t").progress()


@pytest.mark.parametrize(
    ("key", "value"),
    [("first_byte_ms", 0), ("idle_ms", -5), ("idle_ms", 1.5), ("first_byte_ms", "1")],
)
def test_bad_stream_bounds_fail_loud(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        Timeout(stage="model", **{key: value})
    assert raised.value.key == key


def test_the_model_stage_takes_stream_bounds_without_ms() -> None:
    Timeout(stage="model", idle_ms=100)
    with pytest.raises(ConfigError, match="first_byte_ms or idle_ms"):
        Timeout(stage="model")


# The reference: what a Timeout decides from the pieces' times alone (no ties: pieces
# arrive on multiples of 10 ms, bounds end on 5 ms).


def judge(
    waits: list[list[int]], ms: int | None, first: int | None, idle: int | None
) -> tuple[str | None, float, str]:
    """Over attempts laid end to end (each failing after its pieces, the last replying):
    (why it fired, or None; when it ended, s; the text one watch saw)."""
    whole = ms if ms is not None else math.inf
    deadline, phase = whole, "whole"
    if first is not None and first < whole:
        deadline, phase = first, "first_byte"
    clock, seen = 0, 0
    for attempt in waits:
        for wait in attempt:
            clock += wait
            if clock >= deadline:
                return phase, deadline / 1000, "ab" * seen
            seen += 1
            if idle is not None and clock + idle < whole:
                deadline, phase = clock + idle, "idle"
            else:
                deadline, phase = whole, "whole"
    return None, clock / 1000, "ab" * seen


bound = st.none() | st.integers(1, 30).map(lambda n: n * 10 + 5)
schedule = st.lists(st.integers(0, 30).map(lambda n: n * 10), max_size=5)


@given(waits=st.lists(schedule, min_size=1, max_size=3), ms=bound, first=bound, idle=bound)
async def test_outside_a_retry_the_bounds_watch_the_whole_operation(
    waits: list[list[int]], ms: int | None, first: int | None, idle: int | None
) -> None:
    assume(first is not None or idle is not None)  # ms alone is the plain timeout
    script = [streamed(*w, fail=i < len(waits) - 1) for i, w in enumerate(waits)]
    outcome, elapsed, _ = await run_model(
        script,
        Timeout(stage="model", ms=ms, first_byte_ms=first, idle_ms=idle, code="OUTER"),
        Retry(stage="model", attempts=len(waits), retry_on=(MODEL_UNAVAILABLE,)),
    )
    why, ended, text = judge(waits, ms, first, idle)
    assert elapsed == pytest.approx(ended)
    if why is None:
        assert outcome == ModelReply("ab" * len(waits[-1]))
    else:
        assert isinstance(outcome, ModelError)
        assert outcome.code == "OUTER"
        assert outcome.partial == (text or None)


@given(waits=st.lists(schedule, min_size=1, max_size=3), ms=bound, first=bound, idle=bound)
async def test_inside_a_retry_the_bounds_watch_each_attempt(
    waits: list[list[int]], ms: int | None, first: int | None, idle: int | None
) -> None:
    assume(first is not None or idle is not None)
    script = [streamed(*w) for w in waits]  # each attempt replies, if it is let finish
    outcome, elapsed, _ = await run_model(
        script,
        Retry(stage="model", attempts=len(waits), retry_on=("INNER",)),
        Timeout(stage="model", ms=ms, first_byte_ms=first, idle_ms=idle, code="INNER"),
    )
    clock, last = 0.0, None
    for attempt in waits:
        why, ended, text = judge([attempt], ms, first, idle)
        clock += ended
        last = (why, text, attempt)
        if why is None:
            break
    assert last is not None
    assert elapsed == pytest.approx(clock)
    why, text, attempt = last
    if why is None:
        assert outcome == ModelReply("ab" * len(attempt))
    else:
        assert isinstance(outcome, ModelError)
        assert outcome.code == "INNER"
        assert outcome.partial == (text or None)
