"""Order is meaning, proved over random stacks and random tool behaviour, in virtual time.

Stacks are random orders of ``Timeout(a, code="X")``, ``Retry(n)``,
``Timeout(b, code="Y")``, ``ToolCallTimeoutPolicy`` (the tool's budget ``c``) and
``Metrics``. A small reference simulation says, from the order alone, what must
happen; the real stack, traced and measured, must do exactly that:

* the result and the elapsed virtual time are the simulation's — so the code is
  that of the timeout whose deadline fell first (cooperative tools), or of the
  outermost one that fired (tools that ignore cancellation);
* a timeout outside the retry bounds the whole operation, one inside it each
  attempt; attempts never exceed ``n``; nothing starts after a cancellation;
* Metrics counts operations outside the retry and attempts inside it;
* every layer's span is the child of the span of the layer registered before it.
"""

from __future__ import annotations

import math
from typing import Any

import anyio
import attrs
from hypothesis import assume, given
from hypothesis import strategies as st

from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.pipeline import TOOL_FAILED, TOOL_TIMEOUT, Harness, ToolResult
from guardstack.pipeline.testing import Hang, Raise, Reply, ScriptedTool, ToolStep
from guardstack.wrappers import CALLS_METRIC, Metrics, Retry, Timeout, Tracing, no_backoff
from tests.helpers import call
from tests.wrappers.otel import MetricRig, SpanRig

RETRY_ON = ("X", "Y", TOOL_TIMEOUT, TOOL_FAILED)
EPSILON = 1e-9


class Tie(Exception):
    """Two events at the same instant: the order between them is not the stack's to decide."""


@attrs.frozen
class Behaviour:
    kind: str  # "ok", "fail", "hang", "stubborn" (returns at `latency` whatever happens)
    latency: float = 0.0


@attrs.frozen
class Done:
    code: str | None  # None: the tool's success
    time: float


@attrs.frozen
class Cancelled:
    owner: int  # index of the timeout layer whose scope catches it
    time: float


class Simulation:
    def __init__(
        self, stack: list[tuple[str, Any]], behaviours: list[Behaviour], tool_budget: float | None
    ) -> None:
        self.stack, self.behaviours, self.tool_budget = stack, behaviours, tool_budget
        self.runs: list[tuple[int, float]] = []  # (attempt, start) of each tool run
        self.entered = [0] * len(stack)

    def run(self) -> Done:
        outcome = self.layer(0, 0.0, [], 1)
        assert isinstance(outcome, Done)
        return outcome

    def layer(
        self, index: int, start: float, deadlines: list[tuple[float, int]], attempt: int
    ) -> Done | Cancelled:
        if index == len(self.stack):
            return self.tool(start, deadlines, attempt)
        self.entered[index] += 1
        kind, parameter = self.stack[index]
        if kind == "metrics":
            return self.layer(index + 1, start, deadlines, attempt)
        if kind == "retry":
            return self.retry(index, start, deadlines, parameter)
        budget = parameter if kind == "timeout" else self.tool_budget
        if budget is None:
            return self.layer(index + 1, start, deadlines, attempt)
        code = parameter_code(kind, index, self.stack)
        deadline = start + budget
        inner = self.layer(index + 1, start, [*deadlines, (deadline, index)], attempt)
        if isinstance(inner, Cancelled):
            return inner if inner.owner != index else Done(code, inner.time)
        if deadline < inner.time - EPSILON:  # fired while the inner call ran (stubborn tool)
            fired_outside = [owner for time, owner in deadlines if time < inner.time - EPSILON]
            if fired_outside:
                return Cancelled(min(fired_outside), inner.time)
            return Done(code, inner.time)
        check_tie(deadline, inner.time)
        return inner

    def retry(
        self, index: int, start: float, deadlines: list[tuple[float, int]], attempts: int
    ) -> Done | Cancelled:
        now = start
        for attempt in range(1, attempts + 1):
            outcome = self.layer(index + 1, now, deadlines, attempt)
            if isinstance(outcome, Cancelled) or attempt == attempts:
                return outcome
            if outcome.code not in RETRY_ON:
                return outcome
            now = outcome.time
            for time, _ in deadlines:
                check_tie(time, now)
            fired = [owner for time, owner in deadlines if time < now]
            if fired:  # the checkpoint before the next attempt raises
                return Cancelled(min(fired), now)
        raise AssertionError("unreachable")

    def tool(
        self, start: float, deadlines: list[tuple[float, int]], attempt: int
    ) -> Done | Cancelled:
        behaviour = self.behaviours[min(len(self.runs), len(self.behaviours) - 1)]
        self.runs.append((attempt, start))
        end = start + behaviour.latency if behaviour.kind != "hang" else math.inf
        if behaviour.kind == "stubborn":
            return Done(None, end)
        first = min(deadlines, default=(math.inf, -1))
        for time, owner in deadlines:
            if owner != first[1]:
                check_tie(time, first[0])
        check_tie(end, first[0])
        if end < first[0]:
            return Done(TOOL_FAILED if behaviour.kind == "fail" else None, end)
        if first[1] < 0:
            raise Tie("hangs forever")  # no deadline at all: not a stack worth running
        return Cancelled(first[1], first[0])


def check_tie(first: float, second: float) -> None:
    if math.isfinite(first) and abs(first - second) < EPSILON:
        raise Tie


def parameter_code(kind: str, index: int, stack: list[tuple[str, Any]]) -> str:
    if kind == "policy":
        return TOOL_TIMEOUT
    timeouts_before = sum(1 for other, _ in stack[:index] if other == "timeout")
    return "X" if timeouts_before == 0 else "Y"


behaviour = st.one_of(
    st.builds(Behaviour, st.sampled_from(["ok", "fail"]), st.integers(0, 60).map(lambda n: n / 10)),
    st.just(Behaviour("hang")),
)
stubborn = st.builds(Behaviour, st.just("stubborn"), st.integers(0, 60).map(lambda n: n / 10))


def stacks() -> st.SearchStrategy[list[tuple[str, Any]]]:
    parts = st.fixed_dictionaries(
        {
            "X": st.integers(1, 40).map(lambda n: ("timeout", n / 10 + 0.001)),
            "Y": st.integers(1, 40).map(lambda n: ("timeout", n / 10 + 0.003)),
            "retry": st.integers(1, 4).map(lambda n: ("retry", n)),
            "policy": st.just(("policy", None)),
            "metrics": st.just(("metrics", None)),
        }
    )
    return parts.flatmap(
        lambda chosen: st.permutations(list(chosen.values())).flatmap(
            lambda order: st.integers(1, len(order)).map(lambda size: list(order[:size]))
        )
    )


def to_step(item: Behaviour) -> ToolStep:
    if item.kind == "hang":
        return Hang()
    if item.kind == "fail":
        return Raise(RuntimeError("tool failed"), after_ms=item.latency * 1000)
    return Reply("ok", after_ms=item.latency * 1000, ignore_cancel=item.kind == "stubborn")


async def check_stack(
    stack: list[tuple[str, Any]], behaviours: list[Behaviour], tool_budget_ms: int | None
) -> None:
    simulation = Simulation(
        stack, behaviours, None if tool_budget_ms is None else tool_budget_ms / 1000
    )
    try:
        expected = simulation.run()
    except Tie:
        assume(False)
        return

    spans, metrics = SpanRig(), MetricRig()
    harness = Harness()
    tool = ScriptedTool("t", [to_step(item) for item in behaviours], timeout_ms=tool_budget_ms)
    tool.register(harness.tools)
    harness.plugin(Tracing(spans.provider))
    metric_positions = []
    for index, (kind, parameter) in enumerate(stack):
        if kind == "timeout":
            harness.plugin(
                Timeout(ms=round(parameter * 1000), code=parameter_code(kind, index, stack))
            )
        elif kind == "retry":
            harness.plugin(Retry(attempts=parameter, retry_on=RETRY_ON))
        elif kind == "policy":
            harness.plugin(ToolCallTimeoutPolicy())
        else:
            harness.plugin(Metrics(metrics.provider))
            metric_positions.append(index)

    started = anyio.current_time()
    with no_backoff():
        outcome = await harness.tools.execute(call("t"))
    elapsed = anyio.current_time() - started

    # The result and the time are exactly what the order implies.
    if expected.code is None:
        assert outcome.result == ToolResult("ok")
    else:
        assert outcome.result.code == expected.code
    assert abs(elapsed - expected.time) < 1e-6
    assert [(run.call.attempt, round(run.started - started, 6)) for run in tool.runs] == [
        (attempt, round(start, 6)) for attempt, start in simulation.runs
    ]

    # The invariants, stated directly.
    retry_at = next((i for i, (kind, _) in enumerate(stack) if kind == "retry"), len(stack))
    attempts_allowed = stack[retry_at][1] if retry_at < len(stack) else 1
    assert len(tool.runs) <= attempts_allowed
    cooperative = all(item.kind != "stubborn" for item in behaviours)
    for index, (kind, parameter) in enumerate(stack):
        if kind != "timeout" or not cooperative:
            continue
        if index < retry_at:  # outside the retry: one budget for the whole operation
            assert elapsed <= parameter + 1e-6
        else:  # inside: a budget per attempt
            for run in tool.runs:
                assert run.ended is not None
                assert run.ended - run.started <= parameter + 1e-6
    assert all(run.started <= started + elapsed + 1e-9 for run in tool.runs)

    # Metrics counts operations outside the retry, attempts inside it.
    for index in metric_positions:
        expected_count = 1 if index < retry_at else simulation.entered[index]
        assert simulation.entered[index] == expected_count
        assert metrics.total(CALLS_METRIC) >= expected_count
    if len(metric_positions) == 1:
        assert metrics.total(CALLS_METRIC) == simulation.entered[metric_positions[0]]

    # Span nesting equals registration order, once per entry.
    finished = spans.spans
    by_id = {span.context.span_id: span for span in finished}
    layer_spans = [
        span for span in finished if span.attributes and "guardstack.layer.index" in span.attributes
    ]

    def index_of(span: Any) -> Any:
        return span.attributes["guardstack.layer.index"]

    for span in layer_spans:
        index = index_of(span)
        assert span.parent is not None
        parent = by_id[span.parent.span_id]
        if index == 0:
            assert parent.name == "execute_tool t"
        else:
            assert index_of(parent) == index - 1
    for index in range(len(stack)):
        count = sum(1 for span in layer_spans if index_of(span) == index)
        assert count == simulation.entered[index]


@given(
    stack=stacks(),
    behaviours=st.lists(behaviour, min_size=1, max_size=4),
    tool_budget=st.none() | st.integers(1, 40).map(lambda n: n * 100 + 7),
)
async def test_cooperative_tools_follow_the_order(
    stack: list[tuple[str, Any]], behaviours: list[Behaviour], tool_budget: int | None
) -> None:
    await check_stack(stack, behaviours, tool_budget)


@given(
    stack=stacks(),
    behaviours=st.lists(st.one_of(behaviour, stubborn), min_size=1, max_size=4),
    tool_budget=st.none() | st.integers(1, 40).map(lambda n: n * 100 + 7),
)
async def test_tools_that_ignore_cancellation_follow_the_order_too(
    stack: list[tuple[str, Any]], behaviours: list[Behaviour], tool_budget: int | None
) -> None:
    await check_stack(stack, behaviours, tool_budget)
