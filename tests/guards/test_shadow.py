"""Shadow mode: every guard, cap, limit and breaker decides as usual, records what it
would have done — ``guardstack.shadow.decisions`` by layer and decision, a
``guardstack.shadow.decision`` event, a span attribute — and lets the call through
unchanged. For each, the same scenario runs enforcing and in shadow: the shadow records
exactly the decisions the enforcing layer acted on, and changes nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import attrs
import pytest

from guardstack.guards import (
    AgentLimit,
    Approval,
    LoopDetector,
    ModelCallLimit,
    RepeatToolReminder,
    ToolCallLimit,
    TurnDeadline,
    UsageLimit,
)
from guardstack.pipeline import (
    AgentLimitExceeded,
    ConfigError,
    Harness,
    ModelError,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    ToolCall,
    ToolCallRequest,
    ToolDefinition,
    Usage,
    UserMessage,
)
from guardstack.wrappers import (
    AdaptiveConcurrencyLimit,
    CircuitBreaker,
    ConcurrencyLimit,
    Metrics,
    RateLimit,
    TokenRateLimit,
    Tracing,
)
from tests.wrappers.otel import LogRig, MetricRig, SpanRig


@attrs.define
class Run:
    """What one scenario did: calls that ran, how it ended, what the layer acted on."""

    ran: int = 0
    acted: int = 0  # refusals, denials, reminders, stops the layer made (enforcing)
    outcome: list[str] = attrs.Factory(list)


Scenario = Callable[[Any, Harness, Run], Awaitable[None]]


def shadowed(layer: Any) -> Any:
    return attrs.evolve(layer, shadow=True)


async def breaker(layer: Any, harness: Harness, run: Run) -> None:
    async def down(arguments: Any, call: ToolCall) -> str:
        run.ran += 1
        raise RuntimeError("the backend is down")

    harness.tools.register(ToolDefinition("search", down))
    for n in range(6):
        outcome = await harness.tools.execute(ToolCall("search", {}, f"c{n}"))
        run.acted += outcome.result.code == "TOOL_UNAVAILABLE"


async def at_once(harness: Harness, run: Run, count: int, hold_s: float = 0.1) -> None:
    async def work(arguments: Any, call: ToolCall) -> str:
        run.ran += 1
        await anyio.sleep(hold_s)
        return "ok"

    harness.tools.register(ToolDefinition("work", work))
    started = anyio.current_time()

    async def one(n: int) -> None:
        outcome = await harness.tools.execute(ToolCall("work", {}, f"c{n}"))
        run.acted += outcome.result.code is not None
        run.acted += anyio.current_time() - started > hold_s + 1e-6  # it had to wait

    async with anyio.create_task_group() as group:
        for n in range(count):
            group.start_soon(one, n)


async def bulkhead(layer: Any, harness: Harness, run: Run) -> None:
    await at_once(harness, run, 3)


async def rate(layer: Any, harness: Harness, run: Run) -> None:
    await at_once(harness, run, 3, hold_s=0.0)


class Counting:
    model = "m"
    max_tokens = 10

    def __init__(self, run: Run) -> None:
        self.run = run

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        self.run.ran += 1
        return ModelReply("ok", usage=Usage(5, 5), model="m")


async def model_minute(layer: Any, harness: Harness, run: Run) -> None:
    agent = harness.loop.create("s")
    agent.model = Counting(run)
    for _ in range(3):
        try:
            await harness.loop.call_model(
                ModelRequest(agent, [{"role": "user", "content": "x"}], [])
            )
        except ModelError:
            run.acted += 1


def looping_model(calls: int, name: str = "lookup") -> ScriptedModel:
    replies = [
        ModelReply(tool_calls=(ToolCallRequest(name, {"q": "same"}, f"c{n}"),), usage=Usage(5, 5))
        for n in range(calls)
    ]
    return ScriptedModel([*replies, ModelReply("done", usage=Usage(5, 5))], model="m")


async def agent_turn(layer: Any, harness: Harness, run: Run, calls: int = 4) -> None:
    async def lookup(arguments: Any, call: ToolCall) -> str:
        run.ran += 1
        return "the same answer"

    harness.tools.register(ToolDefinition("lookup", lookup))
    agent = harness.loop.create("s")
    agent.model = looping_model(calls)
    result = await agent.prompt("go")
    run.outcome.append(result.reason)
    run.acted += sum(
        1
        for event in agent.session.events
        if (isinstance(event, UserMessage) and event.source.plugin)
        or getattr(getattr(event, "result", None), "code", None) == "TOOL_DENIED"
    )
    run.acted += result.reason == "blocked"


async def loops(layer: Any, harness: Harness, run: Run) -> None:
    await agent_turn(layer, harness, run, calls=6)


async def agents(layer: Any, harness: Harness, run: Run) -> None:
    for n in range(3):
        try:
            harness.loop.create(f"a{n}")
            run.ran += 1
        except AgentLimitExceeded:
            run.acted += 1


async def slow_turn(layer: Any, harness: Harness, run: Run) -> None:
    async def slow(arguments: Any, call: ToolCall) -> str:
        await anyio.sleep(1.0)
        run.ran += 1
        return "ok"

    harness.tools.register(ToolDefinition("lookup", slow))
    agent = harness.loop.create("s")
    agent.model = looping_model(1)
    result = await agent.prompt("go")
    run.outcome.append(result.reason)
    run.acted += result.reason == "deadline"


async def destructive(layer: Any, harness: Harness, run: Run) -> None:
    async def remove(arguments: Any, call: ToolCall) -> str:
        run.ran += 1
        return "removed"

    harness.tools.register(ToolDefinition("rm", remove))
    outcome = await harness.tools.execute(ToolCall("rm", {}, "c1"))
    run.acted += outcome.result.code is not None


CASES: list[tuple[str, Any, Scenario]] = [
    ("circuit-breaker", CircuitBreaker(minimum_calls=2, failure_ratio=1.0), breaker),
    ("concurrency-limit", ConcurrencyLimit(1), bulkhead),
    ("concurrency-limit, queued", ConcurrencyLimit(1, queue=5), bulkhead),
    ("adaptive-concurrency-limit", AdaptiveConcurrencyLimit(initial=1, min=1, max=1), bulkhead),
    ("rate-limit", RateLimit(per_second=1, wait=False), rate),
    ("token-rate-limit", TokenRateLimit(requests_per_minute=1, wait=False), model_minute),
    ("tool-call-limit", ToolCallLimit(per_turn=2), agent_turn),
    ("model-call-limit", ModelCallLimit(per_turn=2), agent_turn),
    ("usage-limit", UsageLimit(tokens_per_turn=25, estimate_output_tokens=1), agent_turn),
    ("agent-limit", AgentLimit(max_agents=1), agents),
    ("turn-deadline", TurnDeadline(ms=300), slow_turn),
    ("repeat-tool-reminder", RepeatToolReminder(thresholds=(3,)), agent_turn),
    ("loop-detector", LoopDetector(identical=3, remind=1, deny=2, end_turn=None), loops),
    ("approval", Approval(require=["rm"]), destructive),
]


@pytest.mark.parametrize(("name", "layer", "scenario"), CASES, ids=[c[0] for c in CASES])
async def test_a_shadow_records_what_the_enforcing_layer_did_and_changes_nothing(
    name: str, layer: Any, scenario: Scenario
) -> None:
    enforcing, plain = Run(), Run()
    harness = Harness(ScriptedModel([ModelReply("ok")]))
    harness.plugin(layer)
    await scenario(layer, harness, enforcing)
    assert enforcing.acted > 0, "the scenario makes the enforcing layer act"

    unguarded = Harness(ScriptedModel([ModelReply("ok")]))
    await scenario(layer, unguarded, plain)

    metrics, logs, shadow = MetricRig(), LogRig(), Run()
    harness = Harness(ScriptedModel([ModelReply("ok")]))
    harness.plugin(Metrics(metrics.provider))
    harness.plugin(Tracing(logger_provider=logs.provider))
    harness.plugin(shadowed(layer))
    await scenario(layer, harness, shadow)
    # unchanged: everything ran as with no layer at all, and nothing was acted on
    assert shadow.ran == plain.ran
    assert shadow.outcome == plain.outcome
    assert shadow.acted == plain.acted
    # recorded: at least what the enforcing layer acted on (a cap that ends the turn
    # acts once; in shadow the turn goes on, and each later call would be stopped too)
    recorded = metrics.total("guardstack.shadow.decisions")
    assert recorded >= 1
    if name not in ("model-call-limit", "usage-limit", "turn-deadline"):
        assert recorded == enforcing.acted
    events = logs.events("guardstack.shadow.decision")
    assert len(events) == recorded
    assert {dict(e.attributes)["guardstack.layer"] for e in events} == {layer.name}


async def test_a_shadow_decision_marks_the_span() -> None:
    spans = SpanRig()
    harness = Harness()
    harness.plugin(Tracing(spans.provider))
    harness.plugin(CircuitBreaker(minimum_calls=1, failure_ratio=1.0, shadow=True))

    async def down(arguments: Any, call: ToolCall) -> str:
        raise RuntimeError("down")

    harness.tools.register(ToolDefinition("search", down))
    for n in range(2):
        await harness.tools.execute(ToolCall("search", {}, f"c{n}"))
    marked = [
        span.attributes.get("guardstack.shadow.decision")
        for span in spans.spans
        if span.attributes and "guardstack.shadow.decision" in span.attributes
    ]
    assert marked == ['circuit-breaker: would refuse tool "search"']


def test_shadow_comes_from_config_and_is_checked() -> None:
    harness = Harness()
    harness.load([{"name": "circuit-breaker", "config": {"shadow": True}}])
    [handle] = harness.plugins
    assert getattr(handle.plugin, "shadow", None) is True
    with pytest.raises(ConfigError) as raised:
        Harness().load([{"name": "tool-call-limit", "config": {"per_turn": 1, "shadow": "yes"}}])
    assert raised.value.key == "shadow"
