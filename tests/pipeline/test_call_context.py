"""What a tool call and a model request share: the attempt, hedge, priority, tenant and
agent every layer reads, answered alike by both (a model request names no tenant of its
own: its agent's counts)."""

from __future__ import annotations

import attrs

from guardstack.pipeline import Harness, ModelRequest, ScriptedModel, ToolCall
from guardstack.pipeline.contract import CallContext


def _read(context: CallContext) -> tuple[int, int, int | None, str | None, object]:
    """A layer's view: typed against the protocol, so mypy checks both values fit it."""
    return (context.attempt, context.hedge, context.priority, context.tenant, context.agent)


def test_a_fresh_call_and_request_read_the_same_defaults() -> None:
    agent = Harness(ScriptedModel([])).loop.create("a")
    call = ToolCall("t", {}, "c1", agent)
    request = ModelRequest(agent, [], [])
    assert _read(call) == _read(request) == (1, 0, None, None, agent)


def test_a_retry_and_a_hedge_number_their_copies_on_both_stages() -> None:
    agent = Harness(ScriptedModel([])).loop.create("a")
    agent.tenant = "team-a"
    call = attrs.evolve(ToolCall("t", {}, "c1", agent, tenant="team-b"), attempt=2, hedge=1)
    request = attrs.evolve(ModelRequest(agent, [], []), attempt=2, hedge=1)
    assert _read(call)[:2] == _read(request)[:2] == (2, 1)
    assert call.tenant == "team-b"  # a call may name its own
    assert request.tenant is None  # none of its own: the layers read its agent's
    assert request.agent is not None
    assert request.agent.tenant == "team-a"
