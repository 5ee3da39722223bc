"""The session log: lossless JSONL, a cut-off tail recovered, garbage named."""

from __future__ import annotations

from pathlib import Path

import pytest

from guardstack.pipeline import (
    AgentLoop,
    MessageSource,
    ModelReply,
    ScriptedModel,
    Session,
    SessionCorruptError,
    SessionTailWarning,
    ToolCallRequest,
)
from guardstack.pipeline.session import AssistantMessage, TurnStart, UserMessage
from guardstack.pipeline.testing import ScriptedTool
from tests.helpers import calls, registry_with


async def finished_session() -> Session:
    model = ScriptedModel(
        [
            ModelReply(
                "thinking…",
                [
                    ToolCallRequest("echo", '{"q":"ünï"}', "c1"),
                    ToolCallRequest("missing", {"x": [1, 2.5, None]}, "c2"),
                ],
            ),
            ModelReply("done ✓"),
        ]
    )
    agent = AgentLoop(registry_with(ScriptedTool("echo", ["résultat"])), model).create("s-1")
    await agent.prompt("héllo")
    return agent.session


async def test_save_and_load_round_trip_every_event(tmp_path: Path) -> None:
    session = await finished_session()
    session.save(tmp_path / "log.jsonl")
    loaded = Session.load(tmp_path / "log.jsonl")
    assert loaded.session_id == "s-1"
    assert list(loaded.events) == list(session.events)
    assert loaded.messages() == session.messages()
    assert loaded.to_jsonl() == session.to_jsonl()
    assert loaded.damaged_tail is None


async def test_a_cut_off_last_line_loads_every_complete_event(tmp_path: Path) -> None:
    session = await finished_session()
    text = session.to_jsonl()
    path = tmp_path / "log.jsonl"
    path.write_text(text[: len(text) - 20], encoding="utf-8")
    with pytest.warns(SessionTailWarning, match="cut off mid-write"):
        loaded = Session.load(path)
    assert list(loaded.events) == list(session.events)[:-1]
    assert loaded.damaged_tail is not None
    assert text.splitlines()[-1].startswith(loaded.damaged_tail)


async def test_garbage_in_the_middle_raises_naming_the_line(tmp_path: Path) -> None:
    lines = (await finished_session()).to_jsonl().splitlines(keepends=True)
    lines[3] = "{not json\n"
    path = tmp_path / "log.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(SessionCorruptError, match=r"log\.jsonl: line 4"):
        Session.load(path)


@pytest.mark.parametrize(
    "bad", ['{"type": "nonsense/event"}\n', "[1, 2]\n", '{"type": "tool/result", "turn": 1}\n']
)
def test_an_unknown_or_malformed_event_is_corruption(bad: str) -> None:
    header = '{"type": "session", "format": 1, "session_id": "s"}\n'
    with pytest.raises(SessionCorruptError, match="line 2"):
        Session.from_jsonl(header + bad + '{"type": "turn/start", "turn": 1}\n')


def test_an_empty_or_headerless_file_is_corruption() -> None:
    with pytest.raises(SessionCorruptError, match="no session header"):
        Session.from_jsonl("")
    with pytest.raises(SessionCorruptError, match="line 1"):
        Session.from_jsonl('{"type": "turn/start", "turn": 1}\n')


def test_events_are_read_only_and_messages_skip_empty_assistant_turns() -> None:
    session = Session("s")
    session.append(TurnStart(1))
    session.append(UserMessage("hi", MessageSource("user")))
    session.append(AssistantMessage(1, 1, ""))
    assert session.messages() == [{"role": "user", "content": "hi"}]
    assert not hasattr(session.events, "append")
    assert session.events[0] == TurnStart(1)
    assert len(session.events) == 3


async def test_save_replaces_the_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text("old", encoding="utf-8")
    session = await finished_session()
    session.save(path)
    assert path.read_text(encoding="utf-8") == session.to_jsonl()
    assert list(tmp_path.iterdir()) == [path]


async def test_scripted_model_records_a_copy_of_each_request() -> None:
    model = ScriptedModel([ModelReply("x")])
    assert model.remaining == 1
    messages = [{"role": "user", "content": "hi"}]
    await model.complete(messages, [])
    messages[0]["content"] = "changed afterwards"
    assert model.requests == [[{"role": "user", "content": "hi"}]]
    assert model.remaining == 0


async def test_text_a_file_cannot_hold_raw_still_saves_and_loads(tmp_path: Path) -> None:
    half_pair = "half a pair: \ud800 ✓"
    model = ScriptedModel([calls(("echo", {"text": half_pair})), ModelReply(half_pair)])
    agent = AgentLoop(registry_with(ScriptedTool("echo", [half_pair])), model).create("s")
    await agent.prompt(half_pair)
    agent.session.save(tmp_path / "log.jsonl")
    loaded = Session.load(tmp_path / "log.jsonl")
    assert list(loaded.events) == list(agent.session.events)
    assert loaded.messages() == agent.session.messages()
