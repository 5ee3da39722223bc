"""``Retry`` never re-runs a tool declared ``idempotent=False``; ``tools``/``exclude`` choose."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.pipeline import TOOL_FAILED, TOOL_TIMEOUT, ConfigError, Harness, ToolDefinition
from guardstack.pipeline.testing import Raise, ScriptedTool
from guardstack.wrappers import Retry, Timeout, no_backoff
from tests.helpers import call
from tests.wrappers.test_ordering_properties import Behaviour, behaviour, stacks, stubborn, to_step


def flaky(name: str, idempotent: bool | None) -> tuple[ScriptedTool, ToolDefinition]:
    tool = ScriptedTool(name, [Raise(RuntimeError("down")), "sent"])
    definition = ToolDefinition(name, tool._execute, idempotent=idempotent)
    return tool, definition


async def run_once(plugin: Retry, name: str, idempotent: bool | None) -> int:
    tool, definition = flaky(name, idempotent)
    harness = Harness()
    harness.tools.register(definition)
    harness.plugin(plugin)
    with no_backoff():
        await harness.tools.execute(call(name))
    return len(tool.runs)


async def test_a_non_idempotent_tool_runs_once_and_others_are_retried() -> None:
    retry = Retry(attempts=3, retry_on=[TOOL_FAILED])
    assert await run_once(retry, "send_email", idempotent=False) == 1
    assert await run_once(retry, "read_file", idempotent=True) == 2
    assert await run_once(retry, "unknown_kind", idempotent=None) == 2


async def test_tools_and_exclude_patterns_choose_what_is_retried() -> None:
    only_reads = Retry(attempts=3, retry_on=[TOOL_FAILED], tools=["read_*"])
    assert await run_once(only_reads, "read_file", None) == 2
    assert await run_once(only_reads, "write_file", None) == 1
    not_sends = Retry(attempts=3, retry_on=[TOOL_FAILED], exclude=["send_*"])
    assert await run_once(not_sends, "send_sms", None) == 1
    assert await run_once(not_sends, "fetch", None) == 2
    assert "exclude=['send_*']" in repr(not_sends)


def test_idempotent_and_patterns_are_checked() -> None:
    with pytest.raises(ConfigError, match="`idempotent` must be True, False or None"):
        ToolDefinition("t", lambda arguments, call: "x", idempotent="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="empty on the model stage"):
        Retry(stage="model", tools=["x"])
    harness = Harness()
    harness.load([{"name": "retry", "config": {"tools": ["read_*"], "exclude": ["read_secret"]}}])


@given(
    stack=stacks(),
    behaviours=st.lists(st.one_of(behaviour, stubborn), min_size=1, max_size=4),
    budget=st.none() | st.integers(1, 40).map(lambda n: n * 100 + 7),
)
async def test_a_non_idempotent_tool_runs_at_most_once_per_call_in_any_stack(
    stack: list[tuple[str, Any]], behaviours: list[Behaviour], budget: int | None
) -> None:
    tool = ScriptedTool("pay", [to_step(item) for item in behaviours])
    harness = Harness()
    harness.tools.register(
        ToolDefinition("pay", tool._execute, timeout_ms=budget, idempotent=False)
    )
    harness.plugin(Timeout(ms=60_000, code="T_OUTER"))  # a hang always ends somewhere
    for index, (kind, parameter) in enumerate(stack):
        if kind == "timeout":
            harness.plugin(Timeout(ms=round(parameter * 1000), code=f"T{index}"))
        elif kind == "retry":
            harness.plugin(Retry(attempts=parameter, retry_on=lambda result: True))
        elif kind == "policy":
            harness.plugin(ToolCallTimeoutPolicy())
    with no_backoff():
        outcome = await harness.tools.execute(call("pay"))
    assert len(tool.runs) == 1
    assert outcome.result.code in (
        None,
        TOOL_FAILED,
        TOOL_TIMEOUT,
    ) or outcome.result.code.startswith("T")
