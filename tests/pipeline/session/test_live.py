"""Watching a turn: subscribers, a log written as it runs, resume after a cut mid-step."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from guardstack.pipeline import (
    TOOL_ABORTED,
    TOOL_ABORTED_BEFORE_DISPATCH,
    Event,
    Harness,
    ModelReply,
    ScriptedModel,
    Session,
    SessionTailWarning,
    ToolCallRequest,
    ToolResultEvent,
)
from guardstack.pipeline.testing import ScriptedTool


def two_call_harness(model: ScriptedModel) -> Harness:
    harness = Harness(model, system="sys")
    ScriptedTool("a", ["A"]).register(harness.tools)
    ScriptedTool("b", ["B"]).register(harness.tools)
    return harness


def two_calls() -> ModelReply:
    return ModelReply(tool_calls=(ToolCallRequest("a", {}, "ca"), ToolCallRequest("b", {}, "cb")))


async def test_subscribers_see_every_event_as_it_is_appended_in_order() -> None:
    harness = two_call_harness(ScriptedModel([two_calls(), ModelReply("done")]))
    agent = harness.loop.create("s")
    seen: list[Event] = []
    lengths: list[int] = []

    def watch(event: Event) -> None:
        seen.append(event)
        lengths.append(len(agent.session.events))

    registration = agent.session.subscribe(watch)
    await agent.prompt("go")
    assert seen == list(agent.session.events)[1:]  # all but the system prompt, logged earlier
    assert lengths == list(range(2, len(agent.session.events) + 1))  # called right after each
    registration.dispose()
    count = len(seen)
    agent.session.append(agent.session.events[-1])
    assert len(seen) == count


async def test_a_failing_subscriber_is_logged_and_the_turn_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    harness = two_call_harness(ScriptedModel([ModelReply("done")]))
    agent = harness.loop.create("s")

    def broken(event: Event) -> None:
        raise OSError("disk full")

    agent.session.subscribe(broken)
    with caplog.at_level(logging.ERROR, logger="guardstack"):
        result = await agent.prompt("go")
    assert result.reason == "completed"
    assert "subscriber" in caplog.text
    assert "disk full" in caplog.text


async def test_record_keeps_the_file_equal_to_the_log_at_every_event(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    harness = two_call_harness(ScriptedModel([two_calls(), ModelReply("done")]))
    agent = harness.loop.create("s")
    snapshots: list[str] = []
    recording = agent.session.record(path)
    agent.session.subscribe(lambda event: snapshots.append(path.read_text("utf-8")))
    await agent.prompt("go")
    recording.dispose()
    assert path.read_text("utf-8") == agent.session.to_jsonl()
    # each snapshot (taken after the writer's own callback) is a whole, loadable log
    for count, text in enumerate(snapshots, start=2):
        assert len(Session.from_jsonl(text).events) == count


async def test_a_log_cut_mid_step_resumes_with_the_unanswered_calls_aborted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "live.jsonl"
    harness = two_call_harness(ScriptedModel([two_calls(), ModelReply("done")]))
    agent = harness.loop.create("s")
    crash: list[str] = []

    def crash_after_first_result(event: Event) -> None:
        if isinstance(event, ToolResultEvent) and not crash:
            crash.append(path.read_text("utf-8"))  # what a crash right now leaves behind

    with agent.session.record(path):
        agent.session.subscribe(crash_after_first_result)
        await agent.prompt("go")
    # the process died while the line after it was being written
    cut = crash[0] + '{"type": "tool/call", "turn": 1, "st'
    (tmp_path / "crashed.jsonl").write_text(cut, "utf-8")
    with pytest.warns(SessionTailWarning):
        loaded = Session.load(tmp_path / "crashed.jsonl")
    model = ScriptedModel([ModelReply("resumed")])
    resumed = harness.loop.create("s", session=loaded, model=model)
    results = {
        event.call_id: event.result.code
        for event in resumed.session.events
        if isinstance(event, ToolResultEvent)
    }
    assert results == {"ca": None, "cb": TOOL_ABORTED_BEFORE_DISPATCH}
    assert (await resumed.prompt("continue")).reason == "completed"
    request = model.requests[0]
    assert [message["role"] for message in request] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "user",
    ]
    assert resumed.session.rebuild_messages() == resumed.session.messages()
    assert TOOL_ABORTED == "ABORTED"
