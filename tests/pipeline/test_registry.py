"""The registry: pre-execute, dispatch and post-execute, and bad input that never crashes."""

from __future__ import annotations

import math
from typing import Any

import anyio
import anyio.from_thread
import pytest

from guardstack.pipeline import (
    INVALID_ARGUMENTS,
    TOOL_DENIED,
    TOOL_FAILED,
    UNKNOWN_TOOL,
    Accept,
    Allow,
    Block,
    ContextMessage,
    Deny,
    DuplicateToolError,
    MessageSource,
    ToolCall,
    ToolDefinition,
    ToolError,
    ToolRegistry,
    ToolResult,
)
from guardstack.pipeline.testing import Hang, RecordingLayer, ScriptedTool
from tests.helpers import call, registry_with

PLUGIN = MessageSource("plugin", "test")


def test_a_duplicate_name_raises_and_a_registration_unregisters() -> None:
    registry = ToolRegistry()
    tool = ScriptedTool("echo")
    registration = tool.register(registry)
    with pytest.raises(DuplicateToolError, match="echo"):
        tool.register(registry)
    assert registry.get("echo") is tool.definition
    assert "echo" in registry
    registration.dispose()
    assert registry.get("echo") is None
    assert registry.schemas() == []


async def test_layers_find_the_resolved_definition_on_the_call() -> None:
    budgets: list[int | None] = []

    async def read_budget(tool_call: ToolCall, call_next: Any) -> ToolResult:
        assert tool_call.tool is not None
        budgets.append(tool_call.tool.timeout_ms)
        result: ToolResult = await call_next(tool_call)
        return result

    registry = registry_with(ScriptedTool("slow", timeout_ms=1234))
    registry.dispatch.use(read_budget)
    await registry.execute(call("slow"))
    assert budgets == [1234]


async def test_stages_run_pre_then_dispatch_then_post() -> None:
    log: list[tuple[str, str]] = []
    registry = registry_with(ScriptedTool("echo", ["hi"]))
    registry.post_execute.use(RecordingLayer("post", log))
    registry.dispatch.use(RecordingLayer("dispatch", log))
    registry.pre_execute.use(RecordingLayer("pre", log))
    outcome = await registry.execute(call("echo"))
    assert outcome.result == ToolResult("hi")
    assert log == [
        ("enter", "pre"),
        ("exit", "pre"),
        ("enter", "dispatch"),
        ("exit", "dispatch"),
        ("enter", "post"),
        ("exit", "post"),
    ]


async def test_a_denied_call_skips_dispatch_and_still_runs_post_execute() -> None:
    tool = ScriptedTool("rm")
    registry = registry_with(tool)
    seen: list[ToolResult] = []

    async def deny(tool_call: ToolCall, call_next: Any) -> Any:
        return Deny("rm is not allowed here")

    async def post(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        seen.append(result)
        return await call_next(tool_call, result)

    registry.pre_execute.use(deny)
    registry.post_execute.use(post)
    outcome = await registry.execute(call("rm"))
    assert outcome.result.content == "Error: rm is not allowed here"
    assert outcome.result.code == TOOL_DENIED
    assert outcome.result.error is not None
    assert outcome.result.error.message == "rm is not allowed here"
    assert tool.runs == []
    assert seen == [outcome.result]


async def test_block_turns_the_result_into_an_error_whose_content_is_the_feedback() -> None:
    registry = registry_with(ScriptedTool("read", ["secret"]))
    context = ContextMessage("note", PLUGIN)

    async def block(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        return Block("redacted by policy", additional_contexts=[context])

    registry.post_execute.use(block)
    outcome = await registry.execute(call("read"))
    assert outcome.result.is_error
    assert outcome.result.content == "redacted by policy"
    assert outcome.result.error is not None
    assert outcome.result.error.message == "redacted by policy"
    assert outcome.contexts == (context,)


async def test_block_with_empty_feedback_gets_the_default_message() -> None:
    registry = registry_with(ScriptedTool("read"))

    async def block(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        return Block("")

    registry.post_execute.use(block)
    outcome = await registry.execute(call("read"))
    assert outcome.result.error is not None
    assert outcome.result.error.message == "tool result blocked by post-execute policy"


async def test_accept_with_a_value_replaces_value_and_content() -> None:
    registry = registry_with(ScriptedTool("count", ["3"]))

    async def replace(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        return Accept(value={"count": 4})

    registry.post_execute.use(replace)
    outcome = await registry.execute(call("count"))
    assert outcome.result == ToolResult('{"count": 4}', value={"count": 4})
    assert outcome.result.value == {"count": 4}


async def test_replacing_the_value_of_an_error_result_is_a_final_failure() -> None:
    registry = registry_with()

    async def replace(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        return Accept(value="fixed")

    registry.post_execute.use(replace)
    outcome = await registry.execute(call("missing"))
    assert outcome.result.code == TOOL_FAILED
    assert "cannot replace the value of a failed result" in outcome.result.content


async def test_an_unknown_tool_gets_a_result_and_post_execute_runs() -> None:
    registry = registry_with()
    posts: list[str] = []

    async def post(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        posts.append(tool_call.name)
        return await call_next(tool_call, result)

    registry.post_execute.use(post)
    outcome = await registry.execute(call("nope"))
    assert outcome.result.content == 'Error: unknown tool "nope"'
    assert outcome.result.error is not None
    assert (outcome.result.error.name, outcome.result.code) == ("ToolNotFoundError", UNKNOWN_TOOL)
    assert posts == ["nope"]


async def test_a_raising_tool_gets_tool_failed_and_post_execute_runs() -> None:
    async def explode(arguments: Any, tool_call: ToolCall) -> str:
        raise KeyError("missing key")

    registry = ToolRegistry()
    registry.register(ToolDefinition("explode", explode))
    posts: list[ToolResult] = []

    async def post(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        posts.append(result)
        return await call_next(tool_call, result)

    registry.post_execute.use(post)
    outcome = await registry.execute(call("explode"))
    assert outcome.result.content == "Error: 'missing key'"
    assert outcome.result.error is not None
    assert (outcome.result.error.name, outcome.result.code) == ("KeyError", TOOL_FAILED)
    assert posts == [outcome.result]


@pytest.mark.parametrize(
    "arguments",
    [
        '{"not": json',
        "[1, 2]",
        ["a"],
        {"s": {1, 2}},
        {"n": math.nan},
        {1: "int key"},
        {"deep": object()},
    ],
    ids=["bad-json-text", "array-text", "list", "set", "nan", "int-key", "object"],
)
async def test_arguments_that_are_not_a_json_object_are_answered_without_running(
    arguments: Any,
) -> None:
    tool = ScriptedTool("t")
    registry = registry_with(tool)
    posts: list[str] = []

    async def post(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        posts.append(tool_call.call_id)
        return await call_next(tool_call, result)

    registry.post_execute.use(post)
    outcome = await registry.execute(ToolCall("t", arguments, "c"))
    assert outcome.result.code == INVALID_ARGUMENTS
    assert outcome.result.content.startswith("Error: tool call arguments must be")
    assert tool.runs == []
    assert posts == ["c"]


async def test_circular_arguments_are_invalid_not_a_crash() -> None:
    arguments: dict[str, Any] = {}
    arguments["self"] = arguments
    outcome = await registry_with(ScriptedTool("t")).execute(ToolCall("t", arguments, "c"))
    assert outcome.result.code == INVALID_ARGUMENTS


@pytest.mark.parametrize("stage", ["pre_execute", "dispatch", "post_execute"])
async def test_a_raising_layer_gives_a_final_result_naming_it(stage: str) -> None:
    tool = ScriptedTool("t")
    registry = registry_with(tool)
    posts: list[str] = []

    class Buggy:
        name = "buggy-middleware"

        async def __call__(self, *args: Any) -> Any:
            raise RuntimeError("oops")

    async def post(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        posts.append("post")
        return await call_next(tool_call, result)

    if stage == "post_execute":
        registry.post_execute.use(Buggy())
        registry.post_execute.use(post)  # inside the buggy one: never reached
    else:
        registry.post_execute.use(post)
        getattr(registry, stage).use(RecordingLayer("fine"))
        getattr(registry, stage).use(Buggy())
    outcome = await registry.execute(call("t"))
    assert outcome.result.content == f'Error: {stage} layer "buggy-middleware" failed: oops'
    assert outcome.result.error is not None
    assert (outcome.result.error.name, outcome.result.code) == ("RuntimeError", TOOL_FAILED)
    assert outcome.contexts == ()
    assert posts == []


async def test_a_layer_returning_the_wrong_type_is_a_final_failure() -> None:
    registry = registry_with(ScriptedTool("t"))

    async def wrong(tool_call: ToolCall, call_next: Any) -> Any:
        return "not a result"

    registry.dispatch.use(wrong)
    outcome = await registry.execute(call("t"))
    assert outcome.result.code == TOOL_FAILED
    assert "expected a ToolResult" in outcome.result.content


async def test_a_tool_result_whose_content_is_not_text_is_an_error() -> None:
    async def odd(arguments: Any, tool_call: ToolCall) -> ToolResult:
        return ToolResult(content=123)  # type: ignore[arg-type]

    registry = ToolRegistry()
    registry.register(ToolDefinition("odd", odd))
    outcome = await registry.execute(call("odd"))
    assert outcome.result.code == TOOL_FAILED
    assert "content is not text: int" in outcome.result.content


@pytest.mark.parametrize("value", [{1, 2}, math.nan, object(), {"x": b"bytes"}])
async def test_a_tool_returning_garbage_gets_an_error_result(value: Any) -> None:
    async def garbage(arguments: Any, tool_call: ToolCall) -> Any:
        return value

    registry = ToolRegistry()
    registry.register(ToolDefinition("garbage", garbage))
    outcome = await registry.execute(call("garbage"))
    assert outcome.result.code == TOOL_FAILED
    assert "returned a value that is not JSON-serialisable" in outcome.result.content


async def test_a_tool_may_return_its_own_result() -> None:
    own = ToolResult.failure("upstream aborted", name="WebError", code="WEB_ABORTED")

    async def fetch(arguments: Any, tool_call: ToolCall) -> ToolResult:
        return own

    registry = ToolRegistry()
    registry.register(ToolDefinition("fetch", fetch))
    assert (await registry.execute(call("fetch"))).result is own


async def test_a_plain_function_tool_runs_in_a_worker_thread() -> None:
    def blocking(arguments: Any, tool_call: ToolCall) -> dict[str, Any]:
        anyio.from_thread.check_cancelled()
        return {"got": arguments["x"]}

    registry = ToolRegistry()
    registry.register(ToolDefinition("blocking", blocking))
    outcome = await registry.execute(call("blocking", {"x": 7}))
    assert outcome.result.content == '{"got": 7}'


async def test_a_plain_function_returning_a_coroutine_is_a_tool_failure() -> None:
    async def inner() -> str:
        return "never awaited"

    registry = ToolRegistry()
    registry.register(ToolDefinition("confused", lambda arguments, tool_call: inner()))
    outcome = await registry.execute(call("confused"))
    assert outcome.result.code == TOOL_FAILED
    assert "declare it `async def`" in outcome.result.content


async def test_the_callers_cancellation_propagates_and_is_never_a_result() -> None:
    registry = registry_with(ScriptedTool("hang", [Hang()]))
    outcomes = []
    with anyio.move_on_after(5) as scope:
        outcomes.append(await registry.execute(call("hang")))
    assert scope.cancelled_caught
    assert outcomes == []


async def test_a_pre_execute_layer_may_allow_explicitly() -> None:
    registry = registry_with(ScriptedTool("t", ["done"]))

    async def allow(tool_call: ToolCall, call_next: Any) -> Any:
        return Allow()

    registry.pre_execute.use(allow)
    assert (await registry.execute(call("t"))).result.content == "done"


def test_describe_lists_every_stage() -> None:
    registry = ToolRegistry()
    registry.dispatch.use(RecordingLayer("outer"))
    registry.dispatch.use(RecordingLayer("inner"))
    assert registry.describe().splitlines() == [
        "pre_execute:",
        "  (no layers)",
        "dispatch:",
        "  0. outer: RecordingLayer('outer')",
        "  1. inner: RecordingLayer('inner')",
        "post_execute:",
        "  (no layers)",
    ]


async def test_str_and_int_subclass_arguments_are_json_and_reach_the_tool() -> None:
    import enum

    class Colour(enum.StrEnum):
        RED = "red"

    class Size(enum.IntEnum):
        BIG = 3

    class Items(list[Any]):
        pass

    class Options(dict[str, Any]):
        pass

    tool = ScriptedTool("paint", ["painted"])
    registry = registry_with(tool)
    arguments = Options(colour=Colour.RED, size=Size.BIG, items=Items([Colour.RED]))
    outcome = await registry.execute(call("paint", arguments))
    assert outcome.result.content == "painted"
    assert tool.runs[0].call.arguments == arguments


async def test_one_function_registered_twice_is_blamed_under_the_inner_name() -> None:
    seen: list[int] = []

    async def flaky(tool_call: ToolCall, call_next: Any) -> ToolResult:
        seen.append(1)
        if len(seen) == 2:
            raise RuntimeError("inner copy broke")
        result: ToolResult = await call_next(tool_call)
        return result

    registry = registry_with(ScriptedTool("echo"))
    registry.dispatch.use(flaky, name="outer")
    registry.dispatch.use(flaky, name="inner")
    outcome = await registry.execute(call("echo"))
    assert outcome.result.code == TOOL_FAILED
    assert 'dispatch layer "inner" failed: inner copy broke' in outcome.result.content


async def test_a_raising_post_execute_layer_keeps_a_caps_end_of_turn() -> None:
    async def end_turn(tool_call: ToolCall, call_next: Any) -> Any:
        return Deny("over the cap", end_turn=True)

    async def broken(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        raise RuntimeError("post layer bug")

    registry = registry_with(ScriptedTool("echo"))
    registry.pre_execute.use(end_turn)
    registry.post_execute.use(broken)
    outcome = await registry.execute(call("echo"))
    assert outcome.result.code == TOOL_FAILED
    assert outcome.ends_turn


async def test_arguments_whose_iteration_raises_are_invalid_not_a_crash() -> None:
    from collections.abc import Iterator, Mapping

    class Hostile(Mapping[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise KeyError(key)

        def __iter__(self) -> Iterator[str]:
            raise RuntimeError("no iterating me")

        def __len__(self) -> int:
            return 1

    tool = ScriptedTool("echo")
    outcome = await registry_with(tool).execute(call("echo", Hostile()))
    assert outcome.result.code == INVALID_ARGUMENTS
    assert "RuntimeError" in outcome.result.content
    assert tool.runs == []


async def test_an_integer_too_large_for_json_is_invalid_arguments() -> None:
    tool = ScriptedTool("echo")
    outcome = await registry_with(tool).execute(call("echo", {"n": 10**5000}))
    assert outcome.result.code == INVALID_ARGUMENTS
    assert tool.runs == []


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        (ToolResult("x", True, "boom"), "error is not a ToolError: str"),  # type: ignore[arg-type]
        (ToolResult("x", True, ToolError(123)), "error message is not text: int"),  # type: ignore[arg-type]
        (ToolResult("x", "yes"), "is_error is not a bool: str"),  # type: ignore[arg-type]
    ],
)
async def test_a_malformed_tool_result_is_failed_at_the_boundary(
    result: ToolResult, problem: str, tmp_path: Any
) -> None:
    """So that it never reaches the log, where saving would raise."""

    async def odd(arguments: Any, tool_call: ToolCall) -> ToolResult:
        return result

    registry = ToolRegistry()
    registry.register(ToolDefinition("odd", odd))
    outcome = await registry.execute(call("odd"))
    assert outcome.result.code == TOOL_FAILED
    assert problem in outcome.result.content
