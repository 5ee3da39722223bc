"""``BudgetNotice``: what is left of every cap, said to the model and logged — for a
child, what its ancestors have left too (virtual time, both backends)."""

from __future__ import annotations

import pytest

from guardstack.guards import BudgetNotice, ToolCallLimit, TurnDeadline, UsageLimit
from guardstack.pipeline import (
    AgentTool,
    Harness,
    UserMessage,
)
from tests.pipeline.trees import Plan, calls, search


async def test_budget_notice_says_what_is_left_and_is_logged() -> None:
    model = Plan([calls("search", q="a")])
    harness = Harness(model, max_steps=10)
    harness.tools.register(search)
    harness.plugin(ToolCallLimit(per_turn=3))
    harness.plugin(UsageLimit(usd_per_session=1.0, prices={"m": (0.0, 1.0)}))
    harness.plugin(TurnDeadline(ms=90_400))
    harness.plugin(BudgetNotice())
    agent = harness.loop.create("s")
    await agent.prompt("go")
    first, second = (request[-1]["content"] for request in model.requests)
    assert first == (
        "Budget left: 9 more steps after this one, 3 tool calls, $1.00, 90 s. "
        "Plan to finish within it."
    )
    assert second.startswith("Budget left: 8 more steps after this one, 2 tool calls,")
    notices = [
        e
        for e in agent.session.events
        if isinstance(e, UserMessage) and e.source.plugin == "budget-notice"
    ]
    assert len(notices) == 2
    assert agent.session.rebuild_messages()[: len(model.requests[1])] == model.requests[1]


async def test_a_childs_notice_counts_what_its_ancestors_have_left() -> None:
    child_model = Plan([])

    def child() -> Harness:
        harness = Harness(child_model)
        harness.plugin(ToolCallLimit(per_turn=10))
        harness.plugin(BudgetNotice(show=("tool_calls",)))
        return harness

    parent = Harness(Plan([calls("research")]))
    parent.tools.register(AgentTool("research", child, description="R."))
    parent.plugin(ToolCallLimit(per_turn=3))
    await parent.loop.create("p").prompt("go")
    # the parent's 3, less its own research call, is stricter than the child's own 10
    assert child_model.requests[0][-1]["content"].startswith("Budget left: 2 tool calls.")


async def test_budget_notice_rejects_what_it_cannot_show() -> None:
    from guardstack.pipeline import ConfigError

    with pytest.raises(ConfigError, match="one of steps, tool_calls"):
        BudgetNotice(show=("dollars",))
