"""The outcome core's stage adapters: what both stages' calls share is answered once."""

from __future__ import annotations

from typing import Any

import pytest

from guardstack.pipeline import Agent, Harness, ModelRequest, ScriptedModel, ToolCall
from guardstack.pipeline.contract import DISPATCH, MODEL, StageAdapter


def an_agent() -> Agent:
    agent = Harness(ScriptedModel([])).loop.create("s")
    agent.tenant, agent.priority = "team-a", 3
    return agent


def stage_and_item(stage: str) -> tuple[StageAdapter[Any, Any, Any], Any]:
    agent = an_agent()
    if stage == "model":
        return MODEL, ModelRequest(agent, [], [])
    return DISPATCH, ToolCall("search", {}, "c1", agent)


@pytest.mark.parametrize("stage", ["dispatch", "model"])
def test_a_call_without_its_own_tenant_or_priority_takes_its_agents(stage: str) -> None:
    adapter, item = stage_and_item(stage)
    assert (adapter.tenant_of(item), adapter.priority_of(item)) == ("team-a", 3)


def test_a_calls_own_tenant_and_priority_come_before_its_agents() -> None:
    agent = an_agent()
    assert DISPATCH.tenant_of(ToolCall("x", {}, "c", agent, tenant="team-b")) == "team-b"
    assert MODEL.tenant_of(ModelRequest(agent, [], [])) == "team-a"  # its agent's, always
    assert MODEL.priority_of(ModelRequest(agent, [], [], priority=9)) == 9
    assert DISPATCH.priority_of(ToolCall("x", {}, "c", agent, priority=0)) == 0


def test_a_call_of_no_agent_is_the_default_tenants_at_priority_zero() -> None:
    call = ToolCall("x", {}, "c")
    assert (DISPATCH.tenant_of(call), DISPATCH.priority_of(call)) == ("default", 0)


@pytest.mark.parametrize("stage", ["dispatch", "model"])
def test_attempt_and_hedge_change_only_a_copy_and_only_when_they_differ(stage: str) -> None:
    adapter, item = stage_and_item(stage)
    assert adapter.with_attempt(item, 1) is item
    second = adapter.with_attempt(item, 2)
    assert (adapter.attempt_of(second), adapter.attempt_of(item)) == (2, 1)
    hedged = adapter.with_hedge(second, 1)
    assert (adapter.hedge_of(hedged), adapter.attempt_of(hedged)) == (1, 2)
    assert adapter.with_hedge(hedged, 1) is hedged


# -- a note is added to an outcome, never a new outcome made that forgets ---------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from guardstack.pipeline import ModelError, ToolError, ToolResult  # noqa: E402

_codes = st.sampled_from(["MODEL_RATE_LIMITED", "MODEL_UNAVAILABLE", "MODEL_FAILED", "X"])
_waits = st.none() | st.floats(0, 1e6, allow_nan=False)


@given(
    message=st.text(max_size=40),
    code=_codes,
    retry_after_s=_waits,
    layer=st.none() | st.sampled_from(["rate-limit", "circuit-breaker"]),
    refused=st.booleans(),
    partial=st.none() | st.text(max_size=20),
    note=st.text(min_size=1, max_size=40),
)
def test_a_model_failure_explained_keeps_all_it_carried(
    message: str,
    code: str,
    retry_after_s: float | None,
    layer: str | None,
    refused: bool,
    partial: str | None,
    note: str,
) -> None:
    failure = ModelError(
        message, code, retry_after_s, layer=layer, refused=refused, partial=partial
    )
    explained = MODEL.explained(failure, note)
    assert isinstance(explained, ModelError)
    assert (explained.code, explained.retry_after_s, explained.layer) == (
        code,
        retry_after_s,
        layer,
    )
    assert (explained.refused, explained.partial) == (refused, partial)
    assert explained.message == f"{message} ({note})"
    assert str(explained) == f"{code}: {message} ({note})"  # the code once
    assert explained.__cause__ is failure


@given(
    content=st.text(max_size=40),
    code=st.none() | st.sampled_from(["TOOL_RATE_LIMITED", "TOOL_TIMEOUT"]),
    retry_after_s=_waits,
    note=st.text(min_size=1, max_size=40),
)
def test_a_tool_failure_explained_keeps_all_it_carried(
    content: str, code: str | None, retry_after_s: float | None, note: str
) -> None:
    value = object()
    failure = ToolResult(
        content, True, ToolError(content, "Busy", code, retry_after_s=retry_after_s), value
    )
    explained = DISPATCH.explained(failure, note)
    assert explained.error is not None
    assert (explained.code, explained.error.retry_after_s, explained.error.name) == (
        code,
        retry_after_s,
        "Busy",
    )
    assert explained.value is value
    assert explained.content == f"{content} ({note})"
    assert explained.error.message == f"{content} ({note})"


def test_a_subclass_that_cannot_be_copied_is_explained_with_its_fields() -> None:
    class Strict(ModelError):
        def __init__(self, message: str, extra: int) -> None:
            super().__init__(message, "MODEL_RATE_LIMITED", 3.0, refused=True)

    explained = MODEL.explained(Strict("busy", 1), "not retried")
    assert isinstance(explained, ModelError)
    assert (explained.refused, explained.retry_after_s) == (True, 3.0)
