"""The core's corners: a recording saved over, a disk that fills, a model adapter that edits
its request in place, name patterns in caps, hostile argument keys, a tool's
KeyboardInterrupt in a parallel step, one sync tool's hung threads."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from guardstack.guards import ToolCallLimit
from guardstack.pipeline import (
    INVALID_ARGUMENTS,
    TOOL_DENIED,
    GuardstackWarning,
    Harness,
    ModelReply,
    ScriptedModel,
    Session,
    ToolCall,
    ToolCallEvent,
    ToolCallRequest,
    ToolDefinition,
    ToolResultEvent,
)
from guardstack.pipeline.testing import ScriptedTool
from tests.helpers import call


def looped(steps: int) -> Harness:
    replies = [ModelReply(tool_calls=[ToolCallRequest("a", {"i": i})]) for i in range(steps)]
    harness = Harness(ScriptedModel([*replies, ModelReply("done")]))
    ScriptedTool("a", ["A"] * steps).register(harness.tools)
    return harness


# -- 9. record, then save, then go on ------------------------------------------------------


async def test_saving_to_the_recorded_path_keeps_the_recording_whole(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    harness = looped(4)
    agent = harness.loop.create("s")
    with agent.session.record(path):
        await agent.prompt("first")
        agent.session.save(path)  # replaces the file the recording appends to
        await agent.prompt("second")
    assert Session.load(path).messages() == agent.session.messages()
    assert len(Session.load(path).events) == len(agent.session.events)


def _full_disk_file(path: Path) -> Any:
    """A file object whose writes fail as a full disk's do."""

    class Full:
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

        def flush(self) -> None:
            raise OSError(28, "No space left on device")

        def close(self) -> None:
            raise OSError(28, "No space left on device")

    return Full()


async def test_a_failing_recording_warns_once_counts_and_leaves_a_loadable_prefix(
    tmp_path: Path,
) -> None:
    path = tmp_path / "live.jsonl"
    harness = looped(3)
    agent = harness.loop.create("s")
    recording = agent.session.record(path)
    written = len(Session.load(path).events)
    assert recording._file is not None
    recording._file.close()
    recording._file = _full_disk_file(path)  # the disk fills up from here on
    with pytest.warns(GuardstackWarning, match=f"recording to {path} failed") as warned:
        turn = await agent.prompt("go")
    assert turn.reason == "completed"  # the turn never noticed
    assert len(warned) == 1
    assert recording.unwritten == len(agent.session.events) - written
    assert isinstance(recording.error, OSError)
    recording.dispose()  # closing a full disk's file: never raises
    loaded = list(Session.load(path).events)
    assert loaded == list(agent.session.events)[:written]  # a prefix, no gap
    agent.session.save(path)  # a later save makes it whole
    assert list(Session.load(path).events) == list(agent.session.events)


async def test_recording_into_a_read_only_file_raises_at_once(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        path = Path("/proc/version")  # root can write anywhere a mode allows
    else:
        path = tmp_path / "read-only.jsonl"
        path.write_text("")
        path.chmod(0o400)
    with pytest.raises(OSError):
        Session("s").record(path)


# -- 10. a model adapter cannot rewrite the log ----------------------------------------------


async def test_a_model_that_edits_its_request_in_place_cannot_change_the_log() -> None:
    class CacheHinting:
        model = "m"

        async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelReply:
            messages[-1]["cache_control"] = {"type": "ephemeral"}  # in place: refused
            return ModelReply("never")

    class CopyingFirst:
        model = "m"

        async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelReply:
            hinted = [dict(message) for message in messages]
            hinted[-1]["cache_control"] = {"type": "ephemeral"}
            messages.append({"role": "user", "content": "the list itself is a copy"})
            return ModelReply("ok")

    harness = Harness(CacheHinting())
    agent = harness.loop.create("s")
    turn = await agent.prompt("hi")
    assert turn.reason == "error"
    assert "read-only" in (turn.error or "")
    assert agent.session.messages() == agent.session.rebuild_messages()
    assert "cache_control" not in agent.session.messages()[0]
    copying = Harness(CopyingFirst()).loop.create("t")
    assert (await copying.prompt("hi")).text == "ok"
    assert copying.session.messages() == copying.session.rebuild_messages()
    assert len(copying.session.messages()) == 2


# -- 11. budgets by name pattern -------------------------------------------------------------


async def test_per_tool_budgets_take_name_patterns_shared_by_the_tools_they_match() -> None:
    harness = Harness()
    for name in ("search_web", "search_code", "deploy"):
        ScriptedTool(name, ["ok"] * 5).register(harness.tools)
    harness.plugin(ToolCallLimit(per_tool={"search_*": 2, "deploy": 1}))
    codes = [
        (await harness.tools.execute(call(name, conversation="c"))).result.code
        for name in ("search_web", "search_code", "search_web", "deploy", "deploy")
    ]
    assert codes == [None, None, TOOL_DENIED, None, TOOL_DENIED]
    denied = await harness.tools.execute(call("search_code", conversation="c"))
    assert 'tools matching "search_*" were already called 2 times' in denied.result.content


# -- 13. smaller escapes ---------------------------------------------------------------------


class Hostile:
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __hash__(self) -> int:
        return 1


async def test_an_argument_key_whose_str_raises_is_invalid_arguments_not_a_crash() -> None:
    request = ToolCallRequest("a", {Hostile(): 1})  # type: ignore[dict-item]
    harness = Harness(ScriptedModel([ModelReply(tool_calls=[request]), ModelReply("done")]))
    ScriptedTool("a", ["A"]).register(harness.tools)
    agent = harness.loop.create("s")
    turn = await agent.prompt("go")
    assert turn.reason == "completed"
    [result] = [e.result for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert result.code == INVALID_ARGUMENTS


class Stop(BaseException):
    """Not an Exception: KeyboardInterrupt's kin."""


@pytest.mark.parametrize("position", [0, 1, 2])
async def test_a_base_exception_in_a_parallel_step_leaves_every_call_answered(
    position: int,
) -> None:
    async def stop(arguments: Any, call: Any) -> str:
        raise Stop

    async def slow(arguments: Any, call: Any) -> str:
        await anyio.sleep(1)
        return "ok"

    names = ["slow", "slow", "slow"]
    names[position] = "stop"
    requests = [ToolCallRequest(name, {"i": i}, f"c{i}") for i, name in enumerate(names)]
    harness = Harness(ScriptedModel([ModelReply(tool_calls=requests)]), max_parallel_tool_calls=3)
    harness.tools.register(ToolDefinition("slow", slow))
    harness.tools.register(ToolDefinition("stop", stop))
    agent = harness.loop.create("s")
    with pytest.raises(Stop):  # as itself, not in an exception group
        await agent.prompt("go")
    called = [e.call_id for e in agent.session.events if isinstance(e, ToolCallEvent)]
    answered = [e.call_id for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert sorted(called) == sorted(answered) == ["c0", "c1", "c2"]
    assert agent.session.events[-1].type == "turn/end"


async def test_one_sync_tools_hung_threads_cannot_starve_another_sync_tool() -> None:
    """40 hung calls of one sync tool (its whole share of threads) leave another tool its own."""
    release = threading.Event()
    order: list[str] = []

    def hung(arguments: Any, call: Any) -> str:
        release.wait(10)
        return "late"

    def healthy(arguments: Any, call: Any) -> str:
        order.append("healthy ran")
        return "fine"

    def release_hung_threads() -> None:
        order.append("released")
        release.set()

    harness = Harness(thread_limit=40)

    async def run(call: ToolCall) -> None:
        await harness.tools.execute(call)

    harness.tools.register(ToolDefinition("hung", hung))
    harness.tools.register(ToolDefinition("healthy", healthy))
    # A real-time backstop, only waited for when the tools share one limiter (the bug).
    backstop = threading.Timer(2.0, release_hung_threads)
    backstop.start()
    try:
        async with anyio.create_task_group() as group:
            for index in range(40):
                group.start_soon(run, ToolCall("hung", {}, f"h{index}"))
            await anyio.lowlevel.checkpoint()
            outcome = await harness.tools.execute(ToolCall("healthy", {}, "ok"))
            backstop.cancel()
            release_hung_threads()
    finally:
        backstop.cancel()
        release.set()
    assert outcome.result.content == "fine"
    assert order == ["healthy ran", "released"]


def test_a_plugin_class_instead_of_an_instance_says_so() -> None:
    from guardstack.guards import LoopDetector

    with pytest.raises(TypeError, match=r"write harness.plugin\(LoopDetector\(\)\)"):
        Harness().plugin(LoopDetector)  # type: ignore[arg-type]


def test_a_file_that_is_not_a_session_log_says_what_it_is(tmp_path: Path) -> None:
    from guardstack.pipeline import SessionCorruptError

    path = tmp_path / "notes.txt"
    path.write_text("hello, not a log\n")
    with pytest.raises(SessionCorruptError, match=r"line 1: not JSON .*session log"):
        Session.load(path)


def test_a_tool_whose_execute_cannot_take_arguments_and_call_is_refused_at_once() -> None:
    from guardstack.pipeline import ConfigError

    async def wrong(query: str) -> str:
        return query

    with pytest.raises(
        ConfigError, match=r"`execute` must take \(arguments, call\).*from_function"
    ):
        ToolDefinition("wrong", wrong)  # type: ignore[arg-type]
