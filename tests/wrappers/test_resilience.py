"""The rest of the resilience family, one behaviour at a time, on both backends in virtual time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import attrs
import pytest
from anyio import wait_all_tasks_blocked

from guardstack.pipeline import (
    MODEL_RATE_LIMITED,
    MODEL_UNAVAILABLE,
    TOOL_FAILED,
    TOOL_OVERLOADED,
    TOOL_RATE_LIMITED,
    TOOL_TIMEOUT,
    TOOL_UNAVAILABLE,
    ConfigError,
    Harness,
    ModelError,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolDefinition,
    ToolError,
    ToolResult,
)
from guardstack.pipeline.testing import Hang, Raise, Reply, ScriptedTool
from guardstack.wrappers import (
    Chaos,
    CircuitBreaker,
    ConcurrencyLimit,
    Fallback,
    Hedge,
    RateLimit,
    Retry,
    Timeout,
)
from tests.helpers import call


def harness_with(*tools: ScriptedTool) -> Harness:
    built = Harness()
    for tool in tools:
        tool.register(built.tools)
    return built


async def run(built: Harness, name: str, **arguments: Any) -> ToolResult:
    return (await built.tools.execute(call(name, arguments))).result


# -- CircuitBreaker ---------------------------------------------------------------------


async def test_a_breaker_opens_on_failures_and_answers_at_once_until_it_probes() -> None:
    dead = ScriptedTool("search", [Hang()], timeout_ms=2_000)
    built = harness_with(dead)
    built.plugin(CircuitBreaker(minimum_calls=3, failure_ratio=1.0, break_s=60))
    built.plugin(Timeout())
    for _ in range(3):
        assert (await run(built, "search")).code == TOOL_TIMEOUT
    started = anyio.current_time()
    refused = await run(built, "search")
    assert anyio.current_time() == started  # no budget waited out against a dead backend
    assert refused.code == TOOL_UNAVAILABLE
    assert refused.content.startswith('Error: tool "search" is unavailable')
    assert "Try again in 60s" in refused.content
    assert len(dead.runs) == 3
    await anyio.sleep(60)
    dead.steps = [Reply("back")]
    assert (await run(built, "search")).content == "back"  # the probe closes it
    assert (await run(built, "search")).content == "back"


async def test_a_failed_probe_opens_it_again_and_only_one_probe_runs() -> None:
    flaky = ScriptedTool("search", [Raise(RuntimeError("down"), after_s=1.0)])
    built = harness_with(flaky)
    built.plugin(CircuitBreaker(minimum_calls=1, break_s=10))
    assert (await run(built, "search")).code == TOOL_FAILED
    await anyio.sleep(10)
    results: list[ToolResult] = []

    async def one() -> None:
        results.append(await run(built, "search"))

    async with anyio.create_task_group() as group:
        group.start_soon(one)
        group.start_soon(one)
    assert sorted(str(r.code) for r in results) == [TOOL_FAILED, TOOL_UNAVAILABLE]
    assert "a test call" in next(r.content for r in results if r.code == TOOL_UNAVAILABLE)
    assert (await run(built, "search")).code == TOOL_UNAVAILABLE  # open again
    assert len(flaky.runs) == 2


async def test_the_window_forgets_old_failures_and_state_is_per_tool() -> None:
    bad = ScriptedTool("bad", [Raise(RuntimeError("x"))])
    good = ScriptedTool("good")
    built = harness_with(bad, good)
    built.plugin(CircuitBreaker(minimum_calls=2, window_s=5))
    await run(built, "bad")
    await anyio.sleep(6)
    await run(built, "bad")  # the first failure left the window: one call, not two
    assert (await run(built, "good")).content == "ok"
    assert (await run(built, "bad")).code == TOOL_FAILED  # two in the window now: opens
    assert (await run(built, "bad")).code == TOOL_UNAVAILABLE
    assert (await run(built, "good")).content == "ok"  # another tool's breaker is closed


async def test_a_model_breaker_raises_model_unavailable_with_retry_after() -> None:
    model = ScriptedModel([ModelError("down", MODEL_UNAVAILABLE)] * 3)
    built = Harness(model)
    built.plugin(CircuitBreaker(stage="model", minimum_calls=2, break_s=20))
    for _ in range(2):
        assert (await built.loop.create(f"s{_}").prompt("hi")).reason == "error"
    turn = await built.loop.create("s3").prompt("hi")
    assert turn.error is not None
    assert turn.error.startswith("ModelError: MODEL_UNAVAILABLE: model model is unavailable")
    assert model.remaining == 1  # never asked


# -- ConcurrencyLimit --------------------------------------------------------------------


async def test_a_bulkhead_runs_at_most_n_queues_fifo_and_refuses_beyond_the_queue() -> None:
    slow = ScriptedTool("fetch", [Reply("done", after_s=1.0)])
    built = harness_with(slow)
    built.plugin(ConcurrencyLimit(2, queue=2))
    finished: list[tuple[int, float, str]] = []
    started = anyio.current_time()

    async def one(index: int) -> None:
        result = await built.tools.execute(call("fetch", {"i": index}))
        finished.append((index, anyio.current_time() - started, str(result.result.code)))

    async with anyio.create_task_group() as group:
        for index in range(5):
            group.start_soon(one, index)
            await wait_all_tasks_blocked()
    assert sorted(finished) == [
        (0, 1.0, "None"),
        (1, 1.0, "None"),
        (2, 2.0, "None"),
        (3, 2.0, "None"),
        (4, 0.0, TOOL_OVERLOADED),
    ]


async def fetch(built: Harness, index: int) -> None:
    await built.tools.execute(call("fetch", {"i": index}))


def index_of(asked: Any) -> Any:
    return asked.arguments["i"]


async def test_a_bulkhead_serves_its_queue_in_arrival_order() -> None:
    slow = ScriptedTool("fetch", [Reply("done", after_s=1.0)])
    built = harness_with(slow)
    built.plugin(ConcurrencyLimit(1, queue=3))
    started = anyio.current_time()
    async with anyio.create_task_group() as group:
        for index in range(4):
            group.start_soon(fetch, built, index)
            await wait_all_tasks_blocked()
    assert [(index_of(r.call), r.started - started) for r in slow.runs] == [
        (0, 0.0),
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
    ]


async def test_queue_time_counts_against_a_timeout_only_inside_it() -> None:
    slow = ScriptedTool("fetch", [Reply("done", after_s=1.0)])
    inside = harness_with(slow)
    inside.plugin(Timeout(ms=1_500))
    inside.plugin(ConcurrencyLimit(1, queue=1))
    outside = harness_with(ScriptedTool("fetch", [Reply("done", after_s=1.0)]))
    outside.plugin(ConcurrencyLimit(1, queue=1))
    outside.plugin(Timeout(ms=1_500))
    for built, expected in ((inside, [None, TOOL_TIMEOUT]), (outside, [None, None])):
        codes: list[str | None] = []

        async def one(built: Harness = built, codes: list[str | None] = codes) -> None:
            codes.append((await run(built, "fetch")).code)

        async with anyio.create_task_group() as group:
            group.start_soon(one)
            await wait_all_tasks_blocked()
            group.start_soon(one)
        assert codes == expected


async def test_a_queued_call_gives_up_after_queue_timeout_and_a_cancelled_one_leaves() -> None:
    slow = ScriptedTool("fetch", [Reply("done", after_s=10.0)])
    built = harness_with(slow)
    built.plugin(ConcurrencyLimit(1, queue=2, queue_timeout_ms=500))
    results: list[ToolResult] = []

    async def one() -> None:
        results.append(await run(built, "fetch"))

    async with anyio.create_task_group() as group:
        group.start_soon(one)
        await wait_all_tasks_blocked()
        with anyio.move_on_after(0.1):
            await run(built, "fetch")  # cancelled while queued: leaves the queue
        group.start_soon(one)
    assert [str(r.code) for r in results] == [TOOL_OVERLOADED, "None"]
    assert "waited 500ms" in results[0].content
    assert len(slow.runs) == 1


# -- RateLimit ---------------------------------------------------------------------------


async def test_a_rate_limit_spaces_calls_after_its_burst() -> None:
    tool = ScriptedTool("api")
    built = harness_with(tool)
    built.plugin(RateLimit(per_second=2, burst=2))
    started = anyio.current_time()
    async with anyio.create_task_group() as group:
        for _ in range(5):
            group.start_soon(run, built, "api")
    assert sorted(run.started - started for run in tool.runs) == [0.0, 0.0, 0.5, 1.0, 1.5]


async def test_without_waiting_a_rate_limit_answers_rate_limited_with_the_wait() -> None:
    built = harness_with(ScriptedTool("api"))
    built.plugin(RateLimit(per_second=4, wait=False))
    assert (await run(built, "api")).content == "ok"
    refused = await run(built, "api")
    assert refused.code == TOOL_RATE_LIMITED
    assert refused.content == (
        'Error: tool "api" is rate limited (4 calls per second). Try again in 0.3s.'
    )
    await anyio.sleep(0.25)
    assert (await run(built, "api")).content == "ok"


async def test_a_model_rate_limit_raises_with_retry_after_for_a_retry_outside() -> None:
    model = ScriptedModel([ModelReply("one"), ModelReply("two")])
    built = Harness(model)
    built.plugin(Retry(stage="model", attempts=2, backoff_ms=0, jitter=False))
    built.plugin(RateLimit(stage="model", per_second=1, wait=False))
    agent = built.loop.create("s")
    await agent.prompt("a")
    started = anyio.current_time()
    turn = await agent.prompt("b")
    assert turn.text == "two"
    assert anyio.current_time() - started == pytest.approx(1.0)  # waited the retry-after


# -- Fallback ----------------------------------------------------------------------------


async def test_a_fallback_tool_answers_with_the_same_arguments() -> None:
    primary = ScriptedTool("search", [Hang()], timeout_ms=100)
    backup = ScriptedTool("search_mirror", ["mirror says hi"])
    built = harness_with(primary, backup)
    built.plugin(Fallback("search_mirror"))
    built.plugin(Timeout())
    result = await built.tools.execute(call("search", {"q": "x"}))
    assert result.result.content == "mirror says hi"
    assert backup.calls[0].arguments == {"q": "x"}


async def test_fallback_outside_a_retry_runs_once_inside_it_after_each_attempt() -> None:
    calls: list[str] = []

    async def cached(arguments: Any, call: Any) -> str:
        calls.append("fallback")
        return "cached"

    for inside, expected in ((False, 1), (True, 1)):
        calls.clear()
        tool = ScriptedTool("search", [Raise(RuntimeError("x"))])
        built = harness_with(tool)
        layers: list[Any] = [
            Retry(attempts=3, retry_on=(TOOL_FAILED,), backoff_ms=0),
            Fallback(cached),
        ]
        for layer in layers if inside else reversed(layers):
            built.plugin(layer)
        assert (await run(built, "search")).content == "cached"
        assert len(calls) == expected
        # inside: the first fallback succeeds, so the retry stops after one attempt
        assert len(tool.runs) == (1 if inside else 3)


async def test_a_model_fallback_asks_another_model() -> None:
    primary = ScriptedModel([ModelError("busy", MODEL_RATE_LIMITED)])
    backup = ScriptedModel([ModelReply("from the backup")])
    built = Harness(primary)
    built.plugin(Fallback(backup, stage="model"))
    turn = await built.loop.create("s").prompt("hi")
    assert turn.text == "from the backup"
    assert backup.requests[0] == [{"role": "user", "content": "hi"}]


async def test_a_fallback_to_a_named_upstream_outside_the_model_proxy_fails_saying_so() -> None:
    primary = ScriptedModel([ModelError("busy", MODEL_RATE_LIMITED)])
    built = Harness(primary)
    built.plugin(Fallback({"upstream": "backup"}, stage="model"))
    turn = await built.loop.create("s").prompt("hi")
    assert turn.reason == "error"
    assert "MODEL_FAILED: fallback: to={upstream: 'backup'} answers only behind guardstack " in (
        str(turn.error)
    )


@pytest.mark.parametrize(
    ("layer", "meant"),
    [
        (lambda: Retry(stage="model", retry_on=["RATE_LIMITED"]), "MODEL_RATE_LIMITED"),
        (lambda: Retry(retry_on=["MODEL_TIMEOUT"]), "TOOL_TIMEOUT"),
        (lambda: CircuitBreaker(stage="model", on=["TOOL_FAILED"]), "MODEL_FAILED"),
        (lambda: Fallback("mirror", on=["UNAVAILABLE"]), "TOOL_UNAVAILABLE"),
    ],
)
def test_a_code_the_stage_never_gives_is_refused_naming_the_one_it_does(
    layer: Callable[[], Any], meant: str
) -> None:
    with pytest.raises(ConfigError, match=f"did you mean '{meant}'"):
        layer()
    assert Retry(retry_on=["TOOL_TIMEOUT", "MY_OWN_CODE"]).retry_on  # a tool's own code: fine


@pytest.mark.parametrize(
    "layer",
    [
        lambda: CircuitBreaker(extra_on=["MODEL_TIMEOUT"]),
        lambda: Fallback("mirror", stage="model", extra_on=["TOOL_FAILED"]),
    ],
)
def test_extra_on_is_checked_against_the_stage_as_on_is(layer: Callable[[], Any]) -> None:
    with pytest.raises(ConfigError, match="extra_on"):
        layer()


def test_on_replaces_the_defaults_and_extra_on_adds_to_them() -> None:
    """One rule in every layer: ``on=`` replaces a layer's codes, ``extra_on=`` adds."""
    default = CircuitBreaker().on
    assert CircuitBreaker(on=["MY_CODE"]).on == {"MY_CODE"}
    assert CircuitBreaker(extra_on=["MY_CODE"]).on == default | {"MY_CODE"}
    assert CircuitBreaker(on=["TOOL_FAILED"], extra_on=["MY_CODE"]).on == {
        "TOOL_FAILED",
        "MY_CODE",
    }
    assert Fallback("mirror", extra_on=["TOOL_DENIED"]).on == Fallback("mirror").on | {
        "TOOL_DENIED"
    }


async def test_a_breaker_with_extra_on_opens_on_the_added_code() -> None:
    busy = ToolResult("Error: busy", True, ToolError("busy", "Busy", "TOOL_BUSY"))
    refusing = ScriptedTool("search", [Reply(busy)])
    plain, extended = harness_with(refusing), harness_with(refusing)
    plain.plugin(CircuitBreaker(minimum_calls=2, failure_ratio=1.0))
    extended.plugin(CircuitBreaker(minimum_calls=2, failure_ratio=1.0, extra_on=["TOOL_BUSY"]))
    for _ in range(2):
        await run(plain, "search")
        await run(extended, "search")
    assert (await run(plain, "search")).code == "TOOL_BUSY"  # not a code it counts
    assert (await run(extended, "search")).code == TOOL_UNAVAILABLE


# -- Hedge -------------------------------------------------------------------------------


async def test_a_hedge_starts_another_attempt_and_cancels_the_loser() -> None:
    tool = ScriptedTool("read", [Reply("slow", after_s=5.0), Reply("fast", after_s=0.1)])
    built = harness_with(tool)
    built.plugin(Hedge(delay_ms=200))
    started = anyio.current_time()
    assert (await run(built, "read")).content == "fast"
    assert anyio.current_time() - started == pytest.approx(0.3)
    assert [r.outcome for r in tool.runs] == ["cancelled", "returned"]
    assert all(r.ended is not None for r in tool.runs)  # nothing left running
    assert [r.call.attempt for r in tool.runs] == [1, 1]  # Retry's number, untouched
    assert [r.call.hedge for r in tool.runs] == [0, 1]


async def test_a_non_idempotent_tool_is_never_hedged_and_naming_one_is_refused() -> None:
    tool = ScriptedTool("pay", [Reply("paid", after_s=5.0)])
    built = Harness()
    built.tools.register(attrs.evolve(tool.definition, idempotent=False))
    built.plugin(Hedge(delay_ms=100))
    assert (await run(built, "pay")).content == "paid"
    assert len(tool.runs) == 1
    with pytest.raises(ConfigError, match='"pay" is declared idempotent=False'):
        built.plugin(Hedge(delay_ms=100, tools=["pay"]))


async def test_a_hedge_that_fails_starts_the_next_at_once_and_the_last_failure_wins() -> None:
    tool = ScriptedTool("read", [Raise(RuntimeError("one")), Raise(RuntimeError("two"))])
    built = harness_with(tool)
    built.plugin(Hedge(delay_ms=1_000, max_hedges=1))
    started = anyio.current_time()
    result = await run(built, "read")
    assert anyio.current_time() == started
    assert result.content == "Error: two"
    assert len(tool.runs) == 2


# -- Chaos -------------------------------------------------------------------------------


async def test_chaos_injects_each_fault() -> None:
    cases: list[tuple[str, Callable[[ToolResult, float], bool]]] = [
        ("latency:250", lambda r, t: r.content == "ok" and t == 0.25),
        ("fail:TOOL_UNAVAILABLE", lambda r, t: r.code == TOOL_UNAVAILABLE),
        (
            "raise",
            lambda r, t: (
                r.code == TOOL_FAILED and r.error is not None and r.error.name == "ChaosError"
            ),
        ),
        ("hang", lambda r, t: r.code == TOOL_TIMEOUT and t == 1.0),
    ]
    for fault, check in cases:
        built = harness_with(ScriptedTool("api"))
        built.plugin(Timeout(ms=1_000))
        built.plugin(Chaos(rate=1.0, fault=fault))
        started = anyio.current_time()
        result = await run(built, "api")
        assert check(result, anyio.current_time() - started), fault


async def test_chaos_at_a_rate_is_repeatable_with_a_seed() -> None:
    def outcomes() -> Any:
        built = harness_with(ScriptedTool("api"))
        built.plugin(Chaos(rate=0.3, fault="fail:TOOL_FAILED", seed=7))
        return built

    first, second = outcomes(), outcomes()
    a = [(await run(first, "api")).is_error for _ in range(50)]
    b = [(await run(second, "api")).is_error for _ in range(50)]
    assert a == b
    assert 5 < sum(a) < 25


@pytest.mark.parametrize(
    ("plugin", "config", "key"),
    [
        ("circuit-breaker", {"failureRatio": 1.5}, "failureRatio"),
        ("concurrency-limit", {"maxConcurrent": 0}, "maxConcurrent"),
        ("rate-limit", {"perSecond": 0}, "perSecond"),
        ("hedge", {"delayMs": -1}, "delayMs"),
        ("chaos", {"rate": 0.5, "fault": "explode"}, "fault"),
        ("fallback", {"to": 3}, "to"),
    ],
)
def test_bad_config_names_the_plugin_key_and_value(
    plugin: str, config: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        Harness().load([{"id": "x", "name": plugin, "config": config}])
    assert plugin in str(raised.value)
    assert key in str(raised.value)


# -- Retry(respect_deadline=True) ---------------------------------------------------------


async def test_a_deadline_aware_retry_stops_when_the_next_attempt_cannot_finish() -> None:
    for respect, code, elapsed in ((True, TOOL_TIMEOUT, 2.0), (False, "TOTAL", 5.0)):
        built = harness_with(ScriptedTool("search", [Hang()], timeout_ms=2_000))
        built.plugin(Timeout(ms=5_000, code="TOTAL"))
        built.plugin(Retry(attempts=5, backoff_ms=1_000, jitter=False, respect_deadline=respect))
        built.plugin(Timeout())
        started = anyio.current_time()
        result = await run(built, "search")
        assert (result.code, anyio.current_time() - started) == (code, elapsed)
    assert result.code == "TOTAL"
    built = harness_with(ScriptedTool("search", [Hang()], timeout_ms=2_000))
    built.plugin(Timeout(ms=5_000, code="TOTAL"))
    built.plugin(Retry(attempts=5, backoff_ms=1_000, jitter=False, respect_deadline=True))
    built.plugin(Timeout())
    assert (await run(built, "search")).content == (
        "Error: tool call timed out after 2000ms (not retried: a 2000ms attempt after a "
        "1000ms wait cannot finish in the 3000ms left of the deadline)"
    )


# -- the model stage ----------------------------------------------------------------------


async def test_model_stage_bulkhead_hedge_and_chaos() -> None:
    async def slow_then_fast(messages: Any) -> ModelReply:
        slow_then_fast.calls += 1  # type: ignore[attr-defined]
        await anyio.sleep(5.0 if slow_then_fast.calls == 1 else 0.1)  # type: ignore[attr-defined]
        return ModelReply(f"reply {slow_then_fast.calls}")  # type: ignore[attr-defined]

    slow_then_fast.calls = 0  # type: ignore[attr-defined]
    hedged = Harness(ScriptedModel([slow_then_fast, slow_then_fast]))
    hedged.plugin(Hedge(delay_ms=500, stage="model"))
    started = anyio.current_time()
    assert (await hedged.loop.create("s").prompt("hi")).text == "reply 2"
    assert anyio.current_time() - started == pytest.approx(0.6)

    async def busy(messages: Any) -> ModelReply:
        await anyio.sleep(1.0)
        return ModelReply("done")

    limited = Harness(ScriptedModel([busy, busy]))
    limited.plugin(ConcurrencyLimit(1, stage="model"))
    turns: list[Any] = []

    async def prompt(name: str) -> None:
        turns.append(await limited.loop.create(name).prompt("hi"))

    async with anyio.create_task_group() as group:
        group.start_soon(prompt, "a")
        group.start_soon(prompt, "b")
    assert sorted(str(turn.error).split(":")[:2] for turn in turns) == [
        ["ModelError", " MODEL_OVERLOADED"],
        ["None"],
    ]

    chaotic = Harness(ScriptedModel([ModelReply("never")]))
    chaotic.plugin(Chaos(rate=1.0, fault="fail:MODEL_RATE_LIMITED", stage="model"))
    turn = await chaotic.loop.create("s").prompt("hi")
    assert turn.error == "ModelError: MODEL_RATE_LIMITED: chaos: injected MODEL_RATE_LIMITED"


# -- a health-aware fallback: Fallback(to=[…]) ------------------------------------------------


def health_rig(wait_ms: int | None = None) -> tuple[Harness, dict[str, int]]:
    """``search`` fails; ``mirror-a`` fails too; ``mirror-b`` answers. A breaker (each
    opens on its first failure for 10 s) inside the fallback."""
    runs: dict[str, int] = {}

    def tool(name: str, fails: bool) -> ToolDefinition:
        async def run(arguments: Any, call: ToolCall) -> str:
            runs[name] = runs.get(name, 0) + 1
            if fails:
                raise RuntimeError(f"{name} is down")
            return f"{name} answered"

        return ToolDefinition(name, run)

    harness = Harness()
    for name, fails in (("search", True), ("mirror-a", True), ("mirror-b", False)):
        harness.tools.register(tool(name, fails))
    harness.plugin(Fallback(to=["mirror-a", "mirror-b"], wait_ms=wait_ms))
    harness.plugin(CircuitBreaker(minimum_calls=1, failure_ratio=1.0, break_s=10))
    return harness, runs


async def test_a_fallback_skips_a_target_whose_breaker_is_open() -> None:
    harness, runs = health_rig()
    first = await harness.tools.execute(ToolCall("search", {}, "c1"))
    assert first.result.content == "mirror-b answered"  # a failed, then b
    assert runs == {"search": 1, "mirror-a": 1, "mirror-b": 1}
    second = await harness.tools.execute(ToolCall("search", {}, "c2"))
    assert second.result.content == "mirror-b answered"
    assert runs["mirror-a"] == 1  # open: skipped, never tried again
    await harness.control.isolate("mirror-b")  # an operator holds it open too
    third = await harness.tools.execute(ToolCall("search", {}, "c3"))
    assert third.result.code == TOOL_UNAVAILABLE
    assert "every fallback (mirror-a, mirror-b)" in third.result.content
    assert third.result.error is not None
    assert 0 < (third.result.error.retry_after_s or 0) <= 10  # mirror-a's break


async def test_when_every_target_is_open_it_waits_for_the_earliest_within_wait_ms() -> None:
    harness, runs = health_rig(wait_ms=15_000)
    await harness.tools.execute(ToolCall("search", {}, "c1"))  # opens search and mirror-a
    await harness.control.isolate("mirror-b")
    started = anyio.current_time()
    answered = await harness.tools.execute(ToolCall("search", {}, "c2"))
    # mirror-a half-opened at 10 s: its probe was this call, and it failed again
    assert anyio.current_time() - started == pytest.approx(10.0)
    assert runs["mirror-a"] == 2
    assert answered.result.code in (TOOL_FAILED, TOOL_UNAVAILABLE)


def test_a_fallback_list_is_checked_target_by_target() -> None:
    with pytest.raises(ConfigError):
        Fallback(to=[])
    with pytest.raises(ConfigError):
        Fallback(to=["ok", 5])  # type: ignore[list-item]  # checked at run time
