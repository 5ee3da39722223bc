"""``guardstack mcp-proxy`` end to end: the SDK's client on one side, a real server on the other."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
from mcp.types import ImageContent, TextContent

from guardstack.guards import GENTLE_TEXT
from tests.integrations.ports import free_port, until_listening
from tests.integrations.test_mcp import connected, runs, server_command, server_log, wait_for

CONFIG = """\
- name: tool-call-limit
  config: {per_turn: 8}
- name: retry
  config: {attempts: 2, retry_on: [TOOL_FAILED]}
- name: tool-call-timeout-policy
- name: repeat-tool-reminder
"""


GUARDSTACK = [
    sys.executable,
    "-c",
    "from guardstack.cli.main import main; raise SystemExit(main())",
]


def proxy_command(
    directory: Path, config_text: str = CONFIG, *options: str, name: str = "guards.yaml"
) -> list[str]:
    """``guardstack mcp-proxy`` with ``config_text`` as its config, in front of the test
    server over stdio (``options`` before ``--``)."""
    config = directory / name
    config.write_text(config_text, "utf-8")
    if config_text == CONFIG and not options:
        options = ("--timeout", "hang=300")
    return [*GUARDSTACK, "mcp-proxy", "--config", str(config), *options, "--",
            *server_command(directory)]  # fmt: skip


def texts(result: Any) -> list[str]:
    return [block.text for block in result.content if isinstance(block, TextContent)]


async def test_the_proxy_guards_every_call_and_passes_the_rest_through(tmp_path: Path) -> None:
    log = server_log(tmp_path)
    async with connected(server_command(tmp_path), tmp_path) as direct:
        direct_tools = [tool.name for tool in (await direct.list_tools()).tools]
    log.unlink()
    async with connected(proxy_command(tmp_path), tmp_path) as proxy:
        proxied_tools = [tool.name for tool in (await proxy.list_tools()).tools]
        hang = await proxy.call_tool("hang", {})
        await wait_for(log, "cancelled hang")
        email = await proxy.call_tool("send_email", {"to": "a@example.org"})
        fail = await proxy.call_tool("fail", {})
        searches = [await proxy.call_tool("search", {"query": "x"}) for _ in range(3)]
        echo = await proxy.call_tool("echo", {"message": "hi"})
        picture = await proxy.call_tool("picture", {})
        denied = await proxy.call_tool("echo", {"message": "one too many"})
    assert proxied_tools == direct_tools
    assert hang.is_error
    assert texts(hang) == ["Error: tool call timed out after 300ms"]
    assert email.is_error
    assert runs(log).count("run send_email") == 1  # not idempotent: never retried
    assert fail.is_error
    assert runs(log).count("run fail") == 2  # undeclared: retried once
    assert [GENTLE_TEXT in texts(result) for result in searches] == [False, False, True]
    assert texts(searches[2])[0] == "no results for 'x'"  # the tool's own text comes first
    assert texts(echo) == ["hi"]
    assert isinstance(picture.content[0], ImageContent)  # other content passes through
    assert denied.is_error
    assert texts(denied)[0].startswith("Error: tool call limit reached")
    # The client went away: the proxy stopped its server.
    pid = int(next(line for line in runs(log) if line.startswith("pid ")).split()[1])
    with anyio.fail_after(5):
        while _alive(pid):  # noqa: ASYNC110 - another process, no event to wait on
            await anyio.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_budgets_given_on_the_command_line_are_enforced_without_a_config(
    tmp_path: Path,
) -> None:
    command = [
        *GUARDSTACK,
        "mcp-proxy",
        "--timeout",
        "hang=300",
        "--",
        *server_command(tmp_path),
    ]
    async with connected(command, tmp_path) as proxy:
        result = await proxy.call_tool("hang", {})
    assert result.is_error
    assert texts(result) == ["Error: tool call timed out after 300ms"]


APPROVAL_CONFIG = """\
- name: tool-call-limit
  config: {per_turn: 8}
- name: approval
"""


def approval_proxy(directory: Path) -> list[str]:
    return proxy_command(directory, APPROVAL_CONFIG, name="approval.yaml")


async def test_a_destructive_call_is_asked_of_the_person_through_elicitation(
    tmp_path: Path,
) -> None:
    from mcp.types import ElicitResult

    log = server_log(tmp_path)
    answers: Iterator[dict[str, str | int | float | bool | list[str] | None]] = iter(
        [
            {"decision": "approve"},
            {"decision": "reject", "reason": "not that address"},
            {"decision": "edit", "edit.to": "b@example.org"},
        ]
    )
    asked: list[Any] = []

    async def person(context: Any, params: Any) -> ElicitResult:
        asked.append(params)
        return ElicitResult(action="accept", content=next(answers))

    async with connected(approval_proxy(tmp_path), tmp_path, elicitation_callback=person) as proxy:
        approved = await proxy.call_tool("send_email", {"to": "a@example.org"})
        rejected = await proxy.call_tool("send_email", {"to": "a@example.org"})
        edited = await proxy.call_tool("send_email", {"to": "a@example.org"})
        echo = await proxy.call_tool("echo", {"message": "hi"})  # read-only: nobody is asked
    assert len(asked) == 3
    assert asked[0].message == 'Allow tool "send_email" with arguments {"to": "a@example.org"}?'
    schema = asked[0].requested_schema
    assert schema["properties"]["decision"]["enum"] == ["approve", "reject", "edit"]
    assert schema["properties"]["edit.to"]["default"] == "a@example.org"
    # approved: it ran (this server fails a first send with a 451)
    assert "SMTP server said 451" in texts(approved)[0]
    assert rejected.is_error
    assert texts(rejected) == ["Error: rejected: not that address"]
    assert texts(edited) == ["sent to b@example.org"]  # ran with the person's arguments
    assert texts(echo) == ["hi"]
    assert runs(log).count("run send_email") == 2  # the rejected call never reached it


async def test_a_client_that_cannot_elicit_gets_the_call_rejected_with_why(
    tmp_path: Path,
) -> None:
    log = server_log(tmp_path)
    async with connected(approval_proxy(tmp_path), tmp_path) as proxy:
        result = await proxy.call_tool("send_email", {"to": "a@example.org"})
    assert result.is_error
    assert texts(result) == [
        'Error: rejected: tool "send_email" needs a person\'s approval, and this MCP client '
        "cannot ask for it (it does not support elicitation)"
    ]
    assert not [line for line in runs(log) if line.startswith("run send_email")]


async def test_prompts_resources_and_completions_pass_through_unchanged(tmp_path: Path) -> None:
    from mcp.types import PromptReference

    async def everything(session: Any) -> list[Any]:
        return [
            (await session.list_prompts()).prompts,
            (await session.get_prompt("review", {"language": "python"})).messages,
            (await session.list_resources()).resources,
            (await session.list_resource_templates()).resource_templates,
            (await session.read_resource("notes://today")).contents,
            (await session.read_resource("notes://monday")).contents,
            (
                await session.complete(
                    PromptReference(name="review"), {"name": "language", "value": "p"}
                )
            ).completion.values,
        ]

    async with connected(server_command(tmp_path), tmp_path) as direct:
        expected = await everything(direct)
    async with connected(proxy_command(tmp_path), tmp_path) as proxy:
        proxied = await everything(proxy)
    assert proxied == expected
    assert expected[6] == ["python", "pascal", "perl"]


async def test_the_proxy_over_streamable_http_in_front_of_a_server_over_http(
    tmp_path: Path,
) -> None:
    import subprocess

    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    downstream_port, proxy_port = free_port(), free_port()
    log = server_log(tmp_path)
    config = tmp_path / "guards.yaml"
    config.write_text(CONFIG, "utf-8")
    root = str(Path(__file__).parents[2])
    server = [sys.executable, "-m", "tests.integrations.mcp_server", str(log)]
    proxy = [
        *GUARDSTACK,
        "mcp-proxy",
        "--config",
        str(config),
        "--transport",
        "http",
        "--listen",
        f"127.0.0.1:{proxy_port}",
        "--connect",
        f"http://127.0.0.1:{downstream_port}/mcp",
    ]
    started = []
    try:
        quiet = subprocess.DEVNULL
        started.append(
            await anyio.open_process([*server, str(downstream_port)], cwd=root, stderr=quiet)
        )
        await until_listening(downstream_port)
        started.append(await anyio.open_process(proxy, cwd=root, stderr=quiet))
        await until_listening(proxy_port)
        url = f"http://127.0.0.1:{proxy_port}/mcp"
        async with (
            streamable_http_client(url) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            await session.initialize()
            names = [tool.name for tool in (await session.list_tools()).tools]
            searches = [await session.call_tool("search", {"query": "x"}) for _ in range(3)]
            prompts = [prompt.name for prompt in (await session.list_prompts()).prompts]
            read = await session.read_resource("notes://today")
    finally:
        for process in reversed(started):
            process.terminate()
            with anyio.fail_after(10):
                await process.wait()
    assert "search" in names
    assert [GENTLE_TEXT in texts(result) for result in searches] == [False, False, True]
    assert prompts == ["review"]
    assert read.contents[0].text == "ship the proxy"  # type: ignore[union-attr]


async def test_a_downstream_that_dies_mid_call_answers_every_pending_call_and_stops_the_proxy(
    tmp_path: Path,
) -> None:
    answers: dict[str, Any] = {}
    async with connected(proxy_command(tmp_path), tmp_path) as proxy:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:

                async def call(name: str, arguments: dict[str, Any]) -> None:
                    answers[name] = await proxy.call_tool(name, arguments)

                group.start_soon(call, "slow", {"seconds": 5})
                await anyio.sleep(0.1)
                group.start_soon(call, "crash", {})  # the server exits 0.2 s into it
        stderr = tmp_path / "stderr.log"
        with anyio.fail_after(10):
            while "the proxy stops too" not in stderr.read_text("utf-8"):  # noqa: ASYNC110
                await anyio.sleep(0.05)
    for name in ("slow", "crash"):
        assert answers[name].is_error
        assert texts(answers[name]) == [
            f"Error: the MCP server behind tool {name!r} stopped (its connection closed); "
            "the call did not complete"
        ]
    assert "guardstack: the MCP server behind the proxy stopped" in stderr.read_text("utf-8")


async def test_the_downstreams_progress_reaches_the_client_through_the_proxy(
    tmp_path: Path,
) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async with connected(proxy_command(tmp_path), tmp_path) as proxy:
        result = await proxy.call_tool("count", {"n": 3}, progress_callback=progress)  # type: ignore[call-overload]
    assert texts(result) == ["counted to 3"]
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_the_downstreams_logs_and_list_changes_reach_the_client_and_new_tools_are_guarded(
    tmp_path: Path,
) -> None:
    from mcp import types

    heard: list[Any] = []

    async def listen(message: Any) -> None:
        if not isinstance(message, Exception):
            heard.append(message)

    def of(kind: type) -> list[Any]:
        return [message for message in heard if isinstance(message, kind)]

    async with connected(proxy_command(tmp_path), tmp_path, message_handler=listen) as proxy:
        said = await proxy.call_tool("chatty", {"n": 3})
        assert texts(said) == ["said 3 things"]
        grew = await proxy.call_tool("grow", {})
        assert texts(grew) == ["grew"]
        with anyio.fail_after(5):
            while not of(types.ToolListChangedNotification):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        names = [tool.name for tool in (await proxy.list_tools()).tools]
        ran = await proxy.call_tool("grown", {})
    logs = [
        (m.params.level, m.params.logger, m.params.data)
        for m in of(types.LoggingMessageNotification)
    ]
    assert logs == [("info", "chatty", f"working on {n} of 3") for n in (1, 2, 3)]
    assert "grown" in names
    assert texts(ran) == ["grown ran"]  # the proxy registered the new tool: guarded, run
    assert "run grown" in runs(server_log(tmp_path))
    assert [str(m.params.uri) for m in of(types.ResourceUpdatedNotification)] == ["notes://today"]


async def test_watch_reloads_the_stack_while_a_client_is_connected(tmp_path: Path) -> None:
    """``mcp-proxy --watch``: the limit raised in the file applies to the next calls of
    the same client session; the counts made so far carry over."""
    stack = "- name: tool-call-limit\n  config: {per_turn: 2}\n"
    command = proxy_command(tmp_path, stack, "--watch")
    config = tmp_path / "guards.yaml"
    async with connected(command, tmp_path) as proxy:
        first = [await proxy.call_tool("echo", {"message": str(n)}) for n in range(3)]
        config.write_text(stack.replace("per_turn: 2", "per_turn: 4"), "utf-8")
        with anyio.fail_after(15):  # the file is looked at every second
            while (again := await proxy.call_tool("echo", {"message": "again"})).is_error:  # noqa: ASYNC110 - another process reloads, no event to wait on
                await anyio.sleep(0.2)
        more = await proxy.call_tool("echo", {"message": "one more"})
        over = await proxy.call_tool("echo", {"message": "over"})
    assert [result.is_error for result in first] == [False, False, True]
    assert texts(again) == ["again"]
    assert not more.is_error
    assert over.is_error  # 4 ran: two before the reload, two after
