"""Session logs written by earlier releases load, rebuild their requests, and go on.

The fixtures in ``tests/fixtures/logs`` were written by the code of each release
(``make.py`` there, run with that release's tree): the first layout (2026-11-30,
c0dd39a) and the last release before 0.1.0 (2026-12-01, d5378c4), whose paused turn
waits for a person's decision in a child agent. The log format is 1 throughout; a
change to it bumps ``format`` and keeps a loader for the old one, and these stay."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from guardstack.guards import Approval
from guardstack.pipeline import (
    AgentTool,
    Approve,
    Harness,
    ModelReply,
    ScriptedModel,
    Session,
    ToolDefinition,
)

LOGS = Path(__file__).parents[2] / "fixtures" / "logs"
WRITTEN = sorted(path for path in LOGS.glob("*.jsonl") if "paused" not in path.name)


def test_there_is_a_fixture_for_each_release() -> None:
    assert [path.name for path in WRITTEN] == [
        "2026-11-30-c0dd39a.jsonl",
        "2026-12-01-d5378c4.jsonl",
    ]


@pytest.mark.parametrize("path", WRITTEN, ids=lambda path: path.stem)
async def test_an_earlier_releases_log_loads_rebuilds_and_goes_on(path: Path) -> None:
    session = Session.load(path)
    messages = session.messages()
    assert messages[-1] == {"role": "assistant", "content": "Again: found it."}
    tools = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["c1", "c2", "c3"]
    assert tools[0]["content"] == "results for needle"
    assert tools[2]["content"].startswith("Error: ")  # the unparseable arguments, refused
    model = ScriptedModel([ModelReply("Once more.")])
    agent = Harness(model).loop.create(session.session_id, session=session)
    assert (await agent.prompt("and once more")).reason == "completed"
    assert model.requests[0][: len(messages)] == messages  # the old log is the request's head


async def test_a_paused_tree_from_the_last_release_resumes() -> None:
    session = Session.load(LOGS / "2026-12-01-d5378c4-paused.jsonl")
    assert list(session.children) == ["paused/ops/1"]

    ran: list[str] = []

    async def deploy(arguments: Mapping[str, Any], call: object) -> str:
        ran.append(arguments["target"])
        return f"deployed to {arguments['target']}"

    def operator() -> Harness:
        child = Harness(ScriptedModel([ModelReply("shipped")]))
        child.tools.register(ToolDefinition("deploy", deploy))
        child.plugin(Approval(require=("deploy",)))
        return child

    parent = Harness(ScriptedModel([ModelReply("released")]))
    parent.tools.register(AgentTool("ops", operator, description="Operations."))
    agent = parent.loop.create("paused", session=session)
    [waiting] = agent.pending
    assert waiting.call_id == "paused/ops/1#d1"
    result = await agent.resume({waiting.call_id: Approve(digest=waiting.digest)})
    assert result.reason == "completed"
    assert ran == ["prod"]
