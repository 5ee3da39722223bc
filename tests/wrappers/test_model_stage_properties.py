"""Order means the same on the model stage, proved over random stacks and random models.

The stacks are random orders of model-stage ``Timeout(a, code="X")``, ``Retry(n)``,
``Timeout(b, code="Y")`` and ``Metrics``; the model answers, fails with
``MODEL_UNAVAILABLE``, hangs, or ignores cancellation. The reference simulation of
the tool-stage property (``test_ordering_properties``) says from the order alone
what must happen — a failure is an exception here instead of a result, and that
is the only difference — and the real ``model_call`` stage must do exactly that:
the same error code (or the reply), at the same virtual time, with the same
attempts started at the same instants.
"""

from __future__ import annotations

import math
from typing import Any

import anyio
from hypothesis import assume, given
from hypothesis import strategies as st

from guardstack.pipeline import (
    MODEL_UNAVAILABLE,
    TOOL_FAILED,
    Harness,
    ModelError,
    ModelReply,
    ModelRequest,
)
from guardstack.pipeline.plugin import ModelNext
from guardstack.wrappers import Metrics, Retry, Timeout, no_backoff
from guardstack.wrappers.metrics import MODEL_DURATION_METRIC
from tests.wrappers.otel import MetricRig
from tests.wrappers.test_ordering_properties import (
    Behaviour,
    Simulation,
    Tie,
    behaviour,
    parameter_code,
    stacks,
    stubborn,
)

RETRY_ON = ("X", "Y", MODEL_UNAVAILABLE)


class BehavingModel:
    """Answers the n-th request as the n-th behaviour says (the last one repeats)."""

    model = "behaving-model"

    def __init__(self, behaviours: list[Behaviour]) -> None:
        self.behaviours = behaviours
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        item = self.behaviours[min(self.calls, len(self.behaviours) - 1)]
        self.calls += 1
        if item.kind == "hang":
            await anyio.sleep(math.inf)
        with anyio.CancelScope(shield=item.kind == "stubborn"):
            await anyio.sleep(item.latency)
        if item.kind == "fail":
            raise ModelError("provider down", MODEL_UNAVAILABLE)
        return ModelReply("ok")


def model_stacks() -> st.SearchStrategy[list[tuple[str, Any]]]:
    """The tool-stage stacks without the tool-only budget policy."""
    return stacks().map(lambda stack: [part for part in stack if part[0] != "policy"])


async def check_model_stack(stack: list[tuple[str, Any]], behaviours: list[Behaviour]) -> None:
    simulation = Simulation(stack, behaviours, None)
    try:
        expected = simulation.run()
    except Tie:
        assume(False)
        return

    metrics = MetricRig()
    model = BehavingModel(behaviours)
    harness = Harness(model)
    metric_positions = []
    for index, (kind, parameter) in enumerate(stack):
        if kind == "timeout":
            harness.plugin(
                Timeout(
                    ms=round(parameter * 1000),
                    code=parameter_code(kind, index, stack),
                    stage="model",
                )
            )
        elif kind == "retry":
            harness.plugin(Retry(attempts=parameter, retry_on=RETRY_ON, stage="model"))
        else:
            harness.plugin(Metrics(metrics.provider, stage="model"))
            metric_positions.append(index)
    attempts: list[tuple[int, float]] = []

    async def innermost(request: ModelRequest, call_next: ModelNext) -> ModelReply:
        attempts.append((request.attempt, anyio.current_time()))
        return await call_next(request)

    harness.loop.model_call.use(innermost)
    agent = harness.loop.create("property")

    started = anyio.current_time()
    code: str | None = None
    with no_backoff():
        try:
            reply = await harness.loop.model_call(ModelRequest(agent, [], []))
        except ModelError as error:
            code = error.code
        else:
            assert reply == ModelReply("ok")
    elapsed = anyio.current_time() - started

    expected_code = MODEL_UNAVAILABLE if expected.code == TOOL_FAILED else expected.code
    assert code == expected_code
    assert abs(elapsed - expected.time) < 1e-6
    assert [(attempt, round(at - started, 6)) for attempt, at in attempts] == [
        (attempt, round(start, 6)) for attempt, start in simulation.runs
    ]
    retry_at = next((i for i, (kind, _) in enumerate(stack) if kind == "retry"), len(stack))
    for index in metric_positions:  # operations outside the retry, attempts inside it
        expected_points = 1 if index < retry_at else simulation.entered[index]
        assert simulation.entered[index] == expected_points
    if len(metric_positions) == 1:
        points = metrics.points(MODEL_DURATION_METRIC)
        assert sum(point.count for point in points) == simulation.entered[metric_positions[0]]


@given(stack=model_stacks(), behaviours=st.lists(behaviour, min_size=1, max_size=4))
async def test_cooperative_models_follow_the_order(
    stack: list[tuple[str, Any]], behaviours: list[Behaviour]
) -> None:
    await check_model_stack(stack, behaviours)


@given(
    stack=model_stacks(),
    behaviours=st.lists(st.one_of(behaviour, stubborn), min_size=1, max_size=4),
)
async def test_models_that_ignore_cancellation_follow_the_order_too(
    stack: list[tuple[str, Any]], behaviours: list[Behaviour]
) -> None:
    await check_model_stack(stack, behaviours)
