"""A turn's result as its log records it: what a layer that ends a turn from outside it
(``TurnDeadline``) hands back is what the loop itself would have returned."""

from __future__ import annotations

from guardstack.guards import TurnDeadline
from guardstack.pipeline import ModelReply, ScriptedModel, ToolRegistry, Usage
from guardstack.pipeline.loop import AgentLoop
from guardstack.pipeline.testing import Hang, ScriptedTool
from tests.helpers import calls, harness_with, registry_with


async def test_the_last_turn_read_from_the_log_is_the_turn_the_loop_returned() -> None:
    model = ScriptedModel([calls(("echo", {})), ModelReply("done", usage=Usage(3, 4))])
    agent = AgentLoop(registry_with(ScriptedTool("echo")), model).create("s")
    returned = await agent.prompt("go")
    assert returned.reason == "completed"
    assert agent.last_turn_result() == returned
    assert (returned.text, returned.steps) == ("done", 2)


async def test_a_turn_cut_from_outside_is_read_back_from_its_log() -> None:
    harness = harness_with(ScriptedTool("hang", [Hang()]))
    harness.loop.model = ScriptedModel([ModelReply("looking", [*calls(("hang", {})).tool_calls])])
    harness.plugin(TurnDeadline(ms=100))
    agent = harness.loop.create("s")
    result = await agent.prompt("go")
    assert result.reason == "deadline"
    assert result == agent.last_turn_result()
    assert result.text == "looking"


def test_an_agent_with_no_turn_yet_reads_as_aborted() -> None:
    agent = AgentLoop(ToolRegistry(), ScriptedModel([])).create("s")
    assert agent.last_turn_result().reason == "aborted"
