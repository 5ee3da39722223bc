"""Metrics: outside a retry it measures operations, inside it attempts."""

from __future__ import annotations

import pytest

from guardstack.pipeline import TOOL_TIMEOUT, ToolResult
from guardstack.pipeline.testing import Hang, Reply, ScriptedTool
from guardstack.wrappers import CALLS_METRIC, DURATION_METRIC, Metrics, Retry, Timeout
from tests.helpers import call, registry_with
from tests.wrappers.otel import MetricRig


def failing_twice() -> ScriptedTool:
    failure = Reply(ToolResult.failure("slow", code=TOOL_TIMEOUT), after_ms=1000)
    return ScriptedTool("lookup", [failure, failure, Reply("found", after_ms=1000)])


async def test_outside_a_retry_it_counts_operations() -> None:
    rig = MetricRig()
    registry = registry_with(failing_twice())
    registry.dispatch.use(Metrics(rig.provider))
    registry.dispatch.use(Retry(attempts=3, backoff_ms=500, jitter=False))
    await registry.execute(call("lookup"))
    assert rig.total(CALLS_METRIC) == 1
    [point] = rig.points(DURATION_METRIC)
    assert point.count == 1
    assert point.sum == pytest.approx(3.0 + 0.5 + 1.0)  # all attempts and both waits
    assert dict(point.attributes) == {"gen_ai.tool.name": "lookup"}
    assert list(point.explicit_bounds) == [0.01 * 2**n for n in range(14)]


async def test_inside_a_retry_it_counts_attempts_with_their_error_type() -> None:
    rig = MetricRig()
    registry = registry_with(failing_twice())
    registry.dispatch.use(Retry(attempts=3, backoff_ms=500, jitter=False))
    registry.dispatch.use(Metrics(rig.provider))
    await registry.execute(call("lookup"))
    assert rig.total(CALLS_METRIC) == 3
    assert rig.total(CALLS_METRIC, **{"error.type": TOOL_TIMEOUT}) == 2
    durations = {point.attributes.get("error.type"): point for point in rig.points(DURATION_METRIC)}
    assert durations[TOOL_TIMEOUT].count == 2
    assert durations[TOOL_TIMEOUT].sum == pytest.approx(2.0)
    assert durations[None].sum == pytest.approx(1.0)


async def test_inside_a_timeout_a_cut_attempt_is_recorded_as_cancelled() -> None:
    rig = MetricRig()
    registry = registry_with(ScriptedTool("hang", [Hang()]))
    registry.dispatch.use(Timeout(ms=250))
    registry.dispatch.use(Metrics(rig.provider))
    outcome = await registry.execute(call("hang"))
    assert outcome.result.code == TOOL_TIMEOUT
    [point] = rig.points(DURATION_METRIC)
    assert point.attributes["error.type"] == "cancelled"
    assert point.sum == pytest.approx(0.25)


async def test_outside_a_timeout_it_sees_the_timeout_result() -> None:
    rig = MetricRig()
    registry = registry_with(ScriptedTool("hang", [Hang()]))
    registry.dispatch.use(Metrics(rig.provider))
    registry.dispatch.use(Timeout(ms=250))
    await registry.execute(call("hang"))
    assert rig.total(CALLS_METRIC, **{"error.type": TOOL_TIMEOUT}) == 1


async def test_errors_without_a_code_are_other() -> None:
    rig = MetricRig()
    registry = registry_with(ScriptedTool("t", [Reply(ToolResult.failure("uncoded"))]))
    registry.dispatch.use(Metrics(rig.provider))
    await registry.execute(call("t"))
    assert rig.total(CALLS_METRIC, **{"error.type": "_OTHER"}) == 1
