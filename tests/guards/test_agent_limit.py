"""``AgentLimit``: agents per harness (its limits on a tree of agents are tested with
the tree, in tests/pipeline/test_tree.py)."""

from __future__ import annotations

from typing import Any

import pytest

from guardstack.guards import AgentLimit
from guardstack.pipeline import (
    AgentLimitExceeded,
    ConfigError,
    Harness,
    ScriptedModel,
)


def test_the_agent_limit_refuses_the_next_agent_naming_the_cap() -> None:
    harness = Harness(model=ScriptedModel([]))
    handle = harness.plugin(AgentLimit(2))
    harness.loop.create("one")
    harness.loop.create("two")
    with pytest.raises(AgentLimitExceeded, match=r"total agent cap \(2\)") as raised:
        harness.loop.create("three")
    assert "'three'" in str(raised.value)
    handle.dispose()
    harness.loop.create("three")


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_the_agent_limit_must_be_a_positive_integer(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_agents"):
        AgentLimit(bad)


def test_one_agent_limit_applied_to_two_harnesses_limits_each_separately() -> None:
    limit = AgentLimit(1)
    first, second = Harness(model=ScriptedModel([])), Harness(model=ScriptedModel([]))
    first.plugin(limit)
    second.plugin(limit)
    first.loop.create("a")
    second.loop.create("b")  # its own count
    with pytest.raises(AgentLimitExceeded):
        first.loop.create("c")


def test_a_disposed_then_reapplied_agent_limit_starts_fresh() -> None:
    limit = AgentLimit(1)
    harness = Harness(model=ScriptedModel([]))
    handle = harness.plugin(limit)
    harness.loop.create("a")
    handle.dispose()
    harness.plugin(limit)
    harness.loop.create("b")
    with pytest.raises(AgentLimitExceeded):
        harness.loop.create("c")
