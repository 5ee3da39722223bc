"""MCP tools through the guard stack, against a real MCP server over stdio (official SDK)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from guardstack.guards import GENTLE_TEXT, RepeatToolReminder, ToolCallTimeoutPolicy
from guardstack.integrations.mcp import mcp_tools
from guardstack.pipeline import TOOL_FAILED, TOOL_TIMEOUT, Harness, ToolCall
from guardstack.wrappers import Retry, no_backoff

ROOT = Path(__file__).parents[2]


def server_log(directory: Path) -> Path:
    return directory / "server.log"


def runs(log: Path) -> list[str]:
    return log.read_text("utf-8").splitlines() if log.exists() else []


@asynccontextmanager
async def connected(
    command: list[str],
    directory: Path,
    *,
    elicitation_callback: Any = None,
    message_handler: Any = None,
) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=command[0], args=command[1:], cwd=str(ROOT))
    stderr = directory / "stderr.log"
    try:
        with stderr.open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(
                    read,
                    write,
                    elicitation_callback=elicitation_callback,
                    message_handler=message_handler,
                ) as session,
            ):
                await session.initialize()
                yield session
    except BaseException as error:
        # A failure here is easier to read with what the server said on stderr.
        error.add_note(f"server stderr:\n{stderr.read_text('utf-8', 'replace')[-4000:]}")
        raise


def server_command(directory: Path) -> list[str]:
    return [sys.executable, "-m", "tests.integrations.mcp_server", str(server_log(directory))]


async def wait_for(log: Path, line: str) -> None:
    with anyio.fail_after(5):
        while line not in runs(log):  # noqa: ASYNC110 - another process writes it
            await anyio.sleep(0.02)


async def test_mcp_tools_become_definitions_with_budgets_and_idempotency(tmp_path: Path) -> None:
    async with connected(server_command(tmp_path), tmp_path) as session:
        tools = {
            tool.name: tool
            for tool in await mcp_tools(
                session, timeouts_ms={"hang": 300, "s*": 2_000}, default_timeout_ms=10_000
            )
        }
    assert set(tools) == {
        "echo", "search", "slow", "hang", "fail", "send_email", "picture", "data", "crash",
        "count", "chatty", "grow",
    }  # fmt: skip
    assert tools["hang"].timeout_ms == 300
    assert tools["search"].timeout_ms == tools["slow"].timeout_ms == 2_000
    assert tools["echo"].timeout_ms == 10_000
    assert (tools["echo"].idempotent, tools["search"].idempotent) == (True, True)
    assert tools["send_email"].idempotent is False
    assert tools["slow"].idempotent is None
    assert tools["echo"].description == "Say the text back."
    assert tools["echo"].parameters["properties"]["message"]["type"] == "string"


async def test_calls_results_errors_and_content_kinds(tmp_path: Path) -> None:
    async with connected(server_command(tmp_path), tmp_path) as session:
        harness = Harness()
        for tool in await mcp_tools(session):
            harness.tools.register(tool)

        async def run(name: str, **arguments: object) -> object:
            return (await harness.tools.execute(ToolCall(name, arguments, "c1"))).result

        echo = await run("echo", message="hello")
        failed = await run("fail", reason="disk full")
        picture = await run("picture")
        data = await run("data")
    assert echo.content == "hello"  # type: ignore[attr-defined]
    assert failed.code == TOOL_FAILED  # type: ignore[attr-defined]
    assert "disk full" in failed.content  # type: ignore[attr-defined]
    assert failed.content.startswith("Error: ")  # type: ignore[attr-defined]
    assert picture.content == "[image image/png, 12 bytes]"  # type: ignore[attr-defined]
    assert '"answer": 42' in data.content  # type: ignore[attr-defined]


async def test_a_timeout_cancels_the_request_on_the_server(tmp_path: Path) -> None:
    log = server_log(tmp_path)
    async with connected(server_command(tmp_path), tmp_path) as session:
        harness = Harness()
        for tool in await mcp_tools(session, timeouts_ms={"hang": 300}):
            harness.tools.register(tool)
        harness.plugin(ToolCallTimeoutPolicy())
        outcome = await harness.tools.execute(ToolCall("hang", {}, "c1", conversation="t"))
        assert outcome.result.code == TOOL_TIMEOUT
        assert outcome.result.content == "Error: tool call timed out after 300ms"
        await wait_for(log, "cancelled hang")  # the server saw the cancellation


async def test_a_tool_whose_server_reports_progress_outlives_its_budget(tmp_path: Path) -> None:
    """``count`` reports progress every 10 ms for 50 steps (0.5 s and more): its budget
    of 150 ms holds only until its first report, and Timeout(idle_ms) bounds the gaps."""
    from guardstack.wrappers import Timeout

    async with connected(server_command(tmp_path), tmp_path) as session:
        harness = Harness()
        for tool in await mcp_tools(session, timeouts_ms={"count": 150}):
            harness.tools.register(tool)
        harness.plugin(Timeout(idle_ms=2_000))
        outcome = await harness.tools.execute(ToolCall("count", {"n": 50}, "c1", conversation="t"))
        assert outcome.result.content == "counted to 50"
        # without progress bounds, the declared budget cuts it
        plain = Harness()
        for tool in await mcp_tools(session, timeouts_ms={"count": 150}):
            plain.tools.register(tool)
        plain.plugin(Timeout())
        cut = await plain.tools.execute(ToolCall("count", {"n": 50}, "c2", conversation="t"))
        assert cut.result.content == "Error: tool call timed out after 150ms"


async def test_retry_never_reruns_a_tool_the_server_marks_not_idempotent(tmp_path: Path) -> None:
    log = server_log(tmp_path)
    async with connected(server_command(tmp_path), tmp_path) as session:
        harness = Harness()
        for tool in await mcp_tools(session):
            harness.tools.register(tool)
        harness.plugin(Retry(attempts=3, retry_on=[TOOL_FAILED]))
        harness.plugin(RepeatToolReminder())
        with no_backoff():
            sent = await harness.tools.execute(
                ToolCall("send_email", {"to": "a@b"}, "c1", conversation="t")
            )
            failed = await harness.tools.execute(ToolCall("fail", {}, "c2", conversation="t"))
    assert sent.result.code == TOOL_FAILED  # the first run failed, and it is not run again
    assert runs(log).count("run send_email") == 1
    assert failed.result.code == TOOL_FAILED
    assert runs(log).count("run fail") == 3  # an undeclared tool is retried
    assert GENTLE_TEXT  # the reminder is exercised through the proxy below


def test_the_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ImportError, match=r"pip install 'guardstack\[mcp\]'"):
        anyio.run(mcp_tools, object())  # type: ignore[arg-type]
