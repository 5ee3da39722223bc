"""Bad input and faults: every one gives the documented result or error, and the log survives."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from guardstack.pipeline import (
    TOOL_ABORTED,
    TOOL_ABORTED_BEFORE_DISPATCH,
    AgentLoop,
    ModelReply,
    ScriptedModel,
    Session,
    SessionCorruptError,
    SessionTailWarning,
    ToolCallEvent,
    ToolCallRequest,
    ToolDefinition,
    ToolRegistry,
    ToolResultEvent,
    TurnEnd,
)
from guardstack.pipeline.testing import ScriptedTool
from tests.helpers import calls, registry_with

HEADER = '{"type": "session", "format": 1, "session_id": "s"}\n'


def answered_once(session: Session) -> bool:
    called = [e.call_id for e in session.events if isinstance(e, ToolCallEvent)]
    answered = [e.call_id for e in session.events if isinstance(e, ToolResultEvent)]
    return sorted(called) == sorted(answered) and len(set(answered)) == len(answered)


def test_a_file_cut_inside_a_multibyte_character_recovers_its_tail(tmp_path: Path) -> None:
    whole = HEADER + '{"type": "turn/start", "turn": 1}\n'
    cut = (whole + '{"type": "user/message", "text": "ü"').encode()[:-2]  # inside "ü"
    path = tmp_path / "s.jsonl"
    path.write_bytes(cut)
    with pytest.warns(SessionTailWarning):
        session = Session.load(path)
    assert [event.type for event in session.events] == ["turn/start"]


def test_an_invalid_byte_mid_file_is_corruption_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(HEADER.encode() + b'{"type": "turn/start", "turn": \xff1}\n' + b"{}\n")
    with pytest.raises(SessionCorruptError, match="line 2"):
        Session.load(path)


@pytest.mark.parametrize(
    "line",
    [
        '{"type": "tool/result", "turn": 1, "step": 1, "call_id": "c", "result": 5}',
        '{"type": "tool/result", "turn": 1, "step": 1, "call_id": "c", '
        '"result": {"content": "x", "isError": true, "error": "boom"}}',
        '{"type": "tool/result", "turn": 1, "step": 1, "call_id": "c", '
        '"result": {"content": "x", "isError": true, "error": {"message": "m", "info": 3}}}',
        '{"type": "turn/end", "turn": 1, "reason": "bogus"}',
        '{"type": "turn/end", "turn": NaN, "reason": "completed"}',
        '{"type": "turn/start", "turn": true}',
        '{"type": "turn/start", "turn": 1, "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ],
)
def test_lines_that_break_the_schema_are_corruption_naming_the_line(line: str) -> None:
    with pytest.raises(SessionCorruptError, match="line 2"):
        Session.from_jsonl(HEADER + line + "\n" + '{"type": "turn/start", "turn": 2}\n')


async def test_a_huge_integer_argument_keeps_the_turn_and_the_log_whole(tmp_path: Path) -> None:
    tool = ScriptedTool("t")
    script = [ModelReply(tool_calls=[ToolCallRequest("t", {"n": 10**5000})]), ModelReply("ok")]
    agent = AgentLoop(registry_with(tool), ScriptedModel(script)).create("s")
    turn = await agent.prompt("go")
    assert turn.reason == "completed"
    assert tool.runs == []
    assert answered_once(agent.session)
    agent.session.save(tmp_path / "s.jsonl")
    assert Session.load(tmp_path / "s.jsonl").messages() == agent.session.messages()


async def test_deeply_nested_argument_text_stays_raw_text() -> None:
    tool = ScriptedTool("t")
    script = [ModelReply(tool_calls=[ToolCallRequest("t", "[" * 100_000)]), ModelReply("ok")]
    agent = AgentLoop(registry_with(tool), ScriptedModel(script)).create("s")
    assert (await agent.prompt("go")).reason == "completed"
    (result,) = [e.result for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert result.code == "INVALID_ARGUMENTS"


async def test_a_model_error_whose_str_raises_ends_the_turn_with_error() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    agent = AgentLoop(ToolRegistry(), ScriptedModel([Unprintable()])).create("s")
    turn = await agent.prompt("go")
    assert turn.reason == "error"
    assert turn.error == "Unprintable: <unprintable Unprintable>"
    assert isinstance(agent.session.events[-1], TurnEnd)


def test_concurrent_saves_of_one_session_never_mix(tmp_path: Path) -> None:
    sessions = [Session(f"s{n}") for n in range(4)]
    for number, session in enumerate(sessions):
        for turn in range(1, 50):
            from guardstack.pipeline import TurnStart

            session.append(TurnStart(turn + number * 1000))
    path = tmp_path / "s.jsonl"
    errors: list[BaseException] = []

    def save_many(session: Session) -> None:
        try:
            for _ in range(30):
                session.save(path)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=save_many, args=(session,)) for session in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    loaded = Session.load(path)
    source = next(s for s in sessions if s.session_id == loaded.session_id)
    assert list(loaded.events) == list(source.events)
    assert [p.name for p in tmp_path.iterdir()] == ["s.jsonl"]  # no temporary left behind


@pytest.mark.parametrize("parallel", [1, 2])
async def test_a_base_exception_from_a_tool_leaves_the_log_whole(parallel: int) -> None:
    class Interrupt(BaseException):
        """Like KeyboardInterrupt, without stopping the test run or the event loop."""

    async def interrupt(arguments: Any, call: Any) -> str:
        raise Interrupt

    registry = ToolRegistry()
    registry.register(ToolDefinition("interrupt", interrupt))
    ScriptedTool("echo").register(registry)
    script = [calls(("echo", {}), ("interrupt", {}), ("echo", {"n": 2})), ModelReply("never")]
    agent = AgentLoop(registry, ScriptedModel(script), max_parallel_tool_calls=parallel).create("s")
    with pytest.raises((Interrupt, BaseExceptionGroup)):
        await agent.prompt("go")
    assert answered_once(agent.session)
    last = agent.session.events[-1]
    assert isinstance(last, TurnEnd)
    assert last.reason == "aborted"
    assert last.error in ("Interrupt", "BaseExceptionGroup")


async def test_a_mid_turn_snapshot_resumes_with_the_gap_answered_aborted(tmp_path: Path) -> None:
    lines = [
        HEADER,
        '{"type": "turn/start", "turn": 1}\n',
        '{"type": "user/message", "text": "go", "source": {"kind": "user", "plugin": null}}\n',
        '{"type": "step/start", "turn": 1, "step": 1}\n',
        '{"type": "assistant/message", "turn": 1, "step": 1, "text": "", "tool_calls": ['
        '{"name": "echo", "arguments": "{}", "call_id": "a"}, '
        '{"name": "echo", "arguments": "{}", "call_id": "b"}]}\n',
        '{"type": "tool/call", "turn": 1, "step": 1, "call_id": "a", "name": "echo", '
        '"arguments": "{}"}\n',
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    model = ScriptedModel([ModelReply("resumed")])
    agent = AgentLoop(registry_with(ScriptedTool("echo")), model).create(
        "s", session=Session.load(path)
    )
    assert (await agent.prompt("again")).reason == "completed"
    results = {
        e.call_id: e.result.code for e in agent.session.events if isinstance(e, ToolResultEvent)
    }
    assert results == {"a": TOOL_ABORTED, "b": TOOL_ABORTED_BEFORE_DISPATCH}
    request = model.requests[0]
    tool_messages = [m["tool_call_id"] for m in request if m["role"] == "tool"]
    assert tool_messages == ["a", "b"]  # every assistant tool call answered: a valid request
    assert json.dumps(request)


async def test_sync_tools_have_their_registrys_own_thread_limiter() -> None:
    """Hung threads elsewhere in the process cannot starve this registry's sync tools."""
    release = threading.Event()
    order: list[str] = []

    def instant(arguments: Any, call: Any) -> str:
        order.append("instant ran")
        return "now"

    ours = ToolRegistry(thread_limit=2)
    ours.register(ToolDefinition("instant", instant))
    from guardstack.pipeline import ToolCall

    def release_hung_threads() -> None:
        order.append("released")
        release.set()

    # A real-time backstop, only waited for when the limiter is shared (the bug):
    # virtual time would jump past a thread that is merely starting.
    backstop = threading.Timer(2.0, release_hung_threads)
    backstop.start()
    try:
        async with anyio.create_task_group() as group:
            for _ in range(45):  # more than anyio's process-wide 40 threads
                group.start_soon(anyio.to_thread.run_sync, release.wait, 10)
            await anyio.lowlevel.checkpoint()
            outcome = await ours.execute(ToolCall("instant", {}, "i"))
            backstop.cancel()
            release_hung_threads()
    finally:
        backstop.cancel()
        release.set()
    assert outcome.result.content == "now"
    assert order == ["instant ran", "released"]
