"""Random stacks, random tool behaviour, random cancellations at random instants.

Over any order of the resilience layers, on the dispatch stage and on the model
stage, with callers cancelled at random moments:

* no slot is leaked — when everything has ended, every slot can be taken again;
* no token is over-issued — calls pass a rate limit no faster than its bucket allows
  (in any window of length T: at most ``burst + rate·T``), measured right inside it;
* never more calls inside a concurrency limit than its slots;
* no hedge, retry or tool is left running once the caller has its answer;
* every call is answered once (a result, or its cancellation), and nothing else escapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline import (
    Harness,
    MemoryStore,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolCallRequest,
    ToolDefinition,
    ToolResult,
)
from guardstack.pipeline.session import ToolCallEvent, ToolResultEvent
from guardstack.wrappers import (
    CircuitBreaker,
    ConcurrencyLimit,
    Hedge,
    RateLimit,
    Retry,
    Timeout,
)
from tests.helpers import call

SLOTS, RATE, BURST = 2, 4.0, 2
LAYERS: dict[str, Callable[[str], Any]] = {
    "limit": lambda stage: ConcurrencyLimit(SLOTS, queue=100, stage=stage),
    "rate": lambda stage: RateLimit(per_second=RATE, burst=BURST, stage=stage),
    "retry": lambda stage: Retry(
        attempts=3,
        retry_on=("TOOL_TIMEOUT", "TOOL_FAILED")
        if stage == "dispatch"
        else ("MODEL_TIMEOUT", "MODEL_FAILED"),
        backoff_ms=50,
        stage=stage,
        seed=1,
    ),
    "hedge": lambda stage: Hedge(delay_ms=70, max_hedges=1, stage=stage),
    "timeout": lambda stage: Timeout(ms=300, stage=stage),
    "breaker": lambda stage: CircuitBreaker(minimum_calls=4, break_s=0.5, stage=stage),
}


class Probe:
    """A layer placed right inside a limit: records who passes it, when, and how many at once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.passes: list[float] = []
        self.inside = 0
        self.peak = 0

    async def __call__(self, item: Any, call_next: Any) -> Any:
        self.passes.append(anyio.current_time())
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        try:
            return await call_next(item)
        finally:
            self.inside -= 1


class ProbePlugin:
    def __init__(self, probe: Probe, stage: str) -> None:
        self.probe = probe
        self.stage = stage
        self.name = probe.name

    def apply(self, scope: Any) -> None:
        pipeline = scope.loop.model_call if self.stage == "model" else scope.tools.dispatch
        scope.use(pipeline, self.probe, name=self.name)


def assemble(order: list[str], stage: str, model: Any = None) -> tuple[Harness, dict[str, Probe]]:
    built = Harness(model, store=MemoryStore())
    probes: dict[str, Probe] = {}
    for name in order:
        built.plugin(LAYERS[name](stage), id=name)
        if name in ("limit", "rate"):
            probe = probes[name] = Probe(f"inside-{name}")
            built.plugin(ProbePlugin(probe, stage))
    return built, probes


def check_limits(probes: dict[str, Probe]) -> None:
    limit = probes.get("limit")
    if limit is not None:
        assert limit.peak <= SLOTS
        assert limit.inside == 0
    rate = probes.get("rate")
    if rate is not None:
        passes = sorted(rate.passes)
        for first in range(len(passes)):
            for last in range(first, len(passes)):
                window = passes[last] - passes[first]
                assert last - first + 1 <= BURST + RATE * window + 1e-6


async def no_slot_leaked(built: Harness, key: str) -> None:
    store = built.store
    leases = [await store.acquire(key, SLOTS) for _ in range(SLOTS)]
    assert all(lease is not None for lease in leases)


BEHAVIOUR = st.sampled_from(["ok", "slow", "hang", "fail"])
ORDERS = st.permutations(list(LAYERS)).flatmap(
    lambda names: st.integers(1, len(names)).map(lambda size: list(names[:size]))
)


@given(
    order=ORDERS,
    behaviours=st.lists(BEHAVIOUR, min_size=1, max_size=6),
    cancels=st.lists(st.one_of(st.none(), st.integers(0, 900)), min_size=6, max_size=6),
)
async def test_tool_calls_cancelled_at_random_keep_every_limit(
    order: list[str], behaviours: list[str], cancels: list[int | None]
) -> None:
    running: list[int] = []
    runs = 0

    async def tool(arguments: Any, call: ToolCall) -> ToolResult:
        nonlocal runs
        behaviour = behaviours[runs % len(behaviours)]
        runs += 1
        running.append(1)
        try:
            if behaviour == "slow":
                await anyio.sleep(0.2)
            elif behaviour == "hang":
                await anyio.sleep_forever()
            elif behaviour == "fail":
                return ToolResult.failure("no", code="TOOL_FAILED")
            return ToolResult.of("ok")
        finally:
            running.pop()

    built, probes = assemble(order, "dispatch")
    built.tools.register(ToolDefinition("t", tool))
    answers: list[str] = []

    async def caller(index: int, cancel_ms: int | None) -> None:
        # None: the caller gives up only after a long while (a hung tool must end somewhere)
        with anyio.CancelScope(
            deadline=anyio.current_time() + (cancel_ms or 30_000) / 1000
        ) as scope:
            outcome = await built.tools.execute(call("t", {"i": index}, f"c{index}"))
            assert isinstance(outcome.result, ToolResult)
            answers.append(f"answered {index}")
        if scope.cancelled_caught:
            answers.append(f"cancelled {index}")

    with anyio.fail_after(600):
        async with anyio.create_task_group() as group:
            for index, cancel_ms in enumerate(cancels):
                group.start_soon(caller, index, cancel_ms)
    assert len(answers) == len(cancels)  # each answered exactly once, or cancelled once
    assert len({int(answer.split()[1]) for answer in answers}) == len(cancels)
    assert running == []  # no tool, hedge or retry left running
    check_limits(probes)
    if "limit" in order:
        await no_slot_leaked(built, "limit:t")


@given(
    order=st.permutations(["limit", "rate", "retry", "timeout"]).flatmap(
        lambda names: st.integers(1, 4).map(lambda size: list(names[:size]))
    ),
    cancels=st.lists(st.one_of(st.none(), st.integers(0, 2_000)), min_size=4, max_size=4),
    slow=st.booleans(),
)
async def test_model_calls_cancelled_at_random_keep_the_log_whole_and_every_limit(
    order: list[str], cancels: list[int | None], slow: bool
) -> None:
    async def thinking(messages: Any) -> ModelReply:
        await anyio.sleep(0.4 if slow else 0.05)
        answered = sum(1 for message in messages if message["role"] == "tool")
        if answered < 2:
            return ModelReply(tool_calls=[ToolCallRequest("t", {"n": answered})])
        return ModelReply("done")

    async def tool(arguments: Any, call: ToolCall) -> str:
        await anyio.sleep(0.1)
        return "ok"

    built, probes = assemble(order, "model", ScriptedModel([thinking] * 100))
    built.tools.register(ToolDefinition("t", tool))
    agents = [built.loop.create(f"agent-{index}") for index in range(len(cancels))]

    async def turn(index: int, cancel_ms: int | None) -> None:
        with anyio.CancelScope(deadline=anyio.current_time() + (cancel_ms or 30_000) / 1000):
            await agents[index].prompt("go")

    with anyio.fail_after(600):
        async with anyio.create_task_group() as group:
            for index, cancel_ms in enumerate(cancels):
                group.start_soon(turn, index, cancel_ms)
    for agent in agents:
        events = agent.session.events
        called = [e.call_id for e in events if isinstance(e, ToolCallEvent)]
        answered = [e.call_id for e in events if isinstance(e, ToolResultEvent)]
        assert sorted(called) == sorted(answered) == sorted(set(called))
        assert events[-1].type == "turn/end"
        assert agent.session.messages() == agent.session.rebuild_messages()
    check_limits(probes)
    if "limit" in order:
        await no_slot_leaked(built, "limit:model")
