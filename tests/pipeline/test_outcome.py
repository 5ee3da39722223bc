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
