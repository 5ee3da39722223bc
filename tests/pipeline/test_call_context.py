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
    agent = Harness(ScriptedModel([])).loop.create("a", tenant="team-a")
    call = attrs.evolve(ToolCall("t", {}, "c1", agent, tenant="team-b"), attempt=2, hedge=1)
    request = attrs.evolve(ModelRequest(agent, [], []), attempt=2, hedge=1)
    assert _read(call)[:2] == _read(request)[:2] == (2, 1)
    assert call.tenant == "team-b"  # a call may name its own
    assert request.tenant is None  # none of its own: the layers read its agent's
    assert request.agent is not None
    assert request.agent.tenant == "team-a"


# -- what a call's caller knows beside it travels with it (``CallScope``) ------------------


def test_a_calls_scope_survives_every_copy_a_layer_makes() -> None:
    """The phase order, a resumed child's decisions and where progress goes ride on the
    call: a retry's, a hedge's or a timeout's copy, and the registry's resolved copy,
    keep them, so whatever runs inside reads them off the call it is given."""
    from guardstack.pipeline.call_context import CallScope

    order, progress = object(), ("session", 7, "request-1")
    call = ToolCall("t", {}, "c1").scoped(order=order, progress=progress)
    assert call.scope == CallScope(order, None, progress)  # type: ignore[arg-type]
    copies = [
        call.with_attempt(2),
        call.with_hedge(1),
        call.with_listener(lambda _: None),
        call.resolved(None),
        attrs.evolve(call, arguments={"x": 1}),
    ]
    assert all(copy.scope is call.scope for copy in copies)
    assert call.scoped(order=order) is call  # nothing changes: the same call
    decided = call.scoped(decisions={"child-1": "approve"})
    assert decided.scope is not None
    assert (decided.scope.order, decided.scope.progress) == (order, progress)
    assert ToolCall("t", {}, "c2").scope is None


async def test_a_layer_that_waits_outside_the_order_without_the_call_is_warned() -> None:
    """``outside_call_order(waiting)`` (0.1) still steps out of the order the registry
    placed the call in, warning; with the call it reads the call's own place."""
    import pytest

    from guardstack.pipeline.contract import outside_call_order

    seen: list[str] = []

    class Order:
        async def enter(self, phase: str) -> None:
            seen.append(f"enter {phase}")

        def leave(self, phase: str) -> None:
            seen.append(f"leave {phase}")

    async def answer() -> str:
        return "approved"

    placed = ToolCall("t", {}, "c1").scoped(order=Order())
    assert await outside_call_order(answer(), placed) == "approved"
    assert seen == ["leave pre_execute", "enter pre_execute"]
    with pytest.warns(DeprecationWarning, match=r"outside_call_order\(waiting, call\)"):
        assert await outside_call_order(answer()) == "approved"  # nothing placed: no order
    assert seen == ["leave pre_execute", "enter pre_execute"]
