"""``guardstack replay``: a recorded session's calls through guards, answered from the log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guardstack.cli.main import main
from guardstack.cli.replay import replay
from guardstack.guards import RepeatToolReminder, ToolCallLimit
from guardstack.pipeline import (
    Harness,
    ModelReply,
    ScriptedModel,
    Session,
    ToolCallEvent,
    ToolResultEvent,
    UserMessage,
)
from guardstack.pipeline.testing import ScriptedTool
from tests.helpers import calls

CONFIG = [
    {"name": "tool-call-limit", "config": {"per_turn": 6}},
    {"name": "repeat-tool-reminder", "config": {"thresholds": [2, 4]}},
]


async def live_session() -> Session:
    """Two turns of an agent that loops on the same read, with a bookkeeping call between."""
    read: tuple[str, dict[str, object]] = ("read", {"path": "a.txt"})
    note: tuple[str, dict[str, object]] = ("todo_write", {"items": []})
    script = [calls(read), calls(read), calls(note), calls(read), calls(read), ModelReply("ok")]
    script += [calls(read)] * 7 + [ModelReply("done")]
    harness = Harness(ScriptedModel(script))
    ScriptedTool("read", ["contents"]).register(harness.tools)
    ScriptedTool("todo_write", ["saved"]).register(harness.tools)
    harness.load(CONFIG)
    agent = harness.loop.create("live")
    await agent.prompt("first")
    await agent.prompt("second")
    return agent.session


def live_reminders(session: Session) -> list[tuple[str, str]]:
    """(the call a reminder follows, its text), from the live log."""
    found, last_call = [], ""
    for event in session.events:
        if isinstance(event, ToolCallEvent):
            last_call = event.call_id
        if isinstance(event, UserMessage) and event.source.plugin == "repeat-tool-reminder":
            found.append((last_call, event.text))
    return found


async def test_replay_reproduces_the_live_runs_reminders_and_caps_exactly() -> None:
    session = await live_session()
    harness = Harness()
    harness.load(CONFIG)
    report = await replay(Session.from_jsonl(session.to_jsonl()), harness)
    assert [(r.call_id, r.text) for r in report.reminders] == live_reminders(session)
    assert [r.count for r in report.reminders] == [2, 2, 2, 4]  # todo_write broke the chain
    live_denied = [
        event.call_id
        for event in session.events
        if isinstance(event, ToolResultEvent) and event.result.code == "TOOL_DENIED"
    ]
    assert [cap.call_id for cap in report.caps] == live_denied == ["call_2_7_0"]
    assert report.caps[0].decision == "deny"


async def test_other_thresholds_show_where_they_would_fire() -> None:
    session = await live_session()
    harness = Harness()
    harness.plugin(RepeatToolReminder(thresholds=(3,)))
    harness.plugin(ToolCallLimit(per_turn=20))
    report = await replay(session, harness)
    # turn 1 never has three reads in a row (todo_write breaks the chain); turn 2 does
    assert [(r.call_id, r.count) for r in report.reminders] == [("call_2_3_0", 3)]
    assert report.caps == ()
    assert report.calls == 12


def test_the_command_prints_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import anyio

    session = anyio.run(live_session)
    session.save(tmp_path / "live.jsonl")
    (tmp_path / "guards.json").write_text(json.dumps(CONFIG), "utf-8")
    args = ["replay", str(tmp_path / "live.jsonl"), "--config", str(tmp_path / "guards.json")]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert text.startswith(
        "12 tool calls replayed\nrepeat-tool-reminder after call_1_2_0 (read, 2 in a row)"
    )
    assert "cap deny at call_2_7_0: tool call limit reached" in text
    assert main([*args, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [r["call_id"] for r in printed["reminders"]] == [
        "call_1_2_0",
        "call_1_5_0",
        "call_2_2_0",
        "call_2_4_0",
    ]
    assert printed["caps"][0]["decision"] == "deny"
