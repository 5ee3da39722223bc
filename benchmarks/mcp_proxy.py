"""What ``guardstack mcp-proxy`` adds per tool call, against calling the server directly.

    python -m benchmarks.mcp_proxy [--calls 300] [--runs 3] [--clients 50]

Both sides talk to the same kind of real MCP server (the tests' server,
``tests/integrations/mcp_server.py``), through the official SDK's client; the proxy
runs a typical stack (tool-call limit, retry, the timeout policy, the reminder).
Calls are ``echo`` (answers at once), timed in interleaved batches; the ratio is
the median over runs, with the range.

The gateway's rows: two downstream servers over streamable HTTP, and in front of both
the gateway over streamable HTTP (the same stack, a client key) or the single-server
proxy (``--connect``, no plugins: the cost of an SDK hop alone), against calling the
first server directly — one client calling in turn, then ``--clients`` clients at once
(each its own session, kept across runs, 4 calls each); each the median latency of a
call. Each path has downstream servers of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

from benchmarks.timing import median, ratio, table

CONFIG = """\
- name: tool-call-limit
  config: {per_turn: 1000000}
- name: retry
- name: tool-call-timeout-policy
- name: repeat-tool-reminder
  config: {exclude: [echo]}
"""
ROOT = Path(__file__).parents[1]


def commands(directory: Path) -> dict[str, list[str]]:
    server = [sys.executable, "-m", "tests.integrations.mcp_server", str(directory / "log")]
    config = directory / "guards.yaml"
    config.write_text(CONFIG, "utf-8")
    cli = [sys.executable, "-c", "from guardstack.cli.main import main; raise SystemExit(main())"]
    proxy = [*cli, "mcp-proxy", "--config", str(config), "--default-timeout", "10000", "--"]
    return {
        "direct": server,
        "proxy": [*proxy, *server],
        "bare": [*cli, "mcp-proxy", "--", *server],
    }


async def per_call_ms(session: ClientSession, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        await session.call_tool("echo", {"message": "hi"})
    return (time.perf_counter() - started) / calls * 1000


async def measure(calls: int, runs: int) -> list[dict[str, float]]:
    results: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as scratch, (Path(scratch) / "err").open("w") as errlog:
        params = {
            name: StdioServerParameters(command=command[0], args=command[1:], cwd=str(ROOT))
            for name, command in commands(Path(scratch)).items()
        }
        async with (
            stdio_client(params["direct"], errlog=errlog) as (direct_read, direct_write),
            ClientSession(direct_read, direct_write) as direct,
            stdio_client(params["proxy"], errlog=errlog) as (proxy_read, proxy_write),
            ClientSession(proxy_read, proxy_write) as proxy,
            stdio_client(params["bare"], errlog=errlog) as (bare_read, bare_write),
            ClientSession(bare_read, bare_write) as bare,
        ):
            sessions = {"direct": direct, "proxy": proxy, "bare": bare}
            for session in sessions.values():
                await session.initialize()
                await per_call_ms(session, 20)  # warm up
            for _ in range(runs):
                results.append(
                    {name: await per_call_ms(session, calls) for name, session in sessions.items()}
                )
    return results


def _of(name: str) -> Callable[[Mapping[str, float]], float]:
    return lambda run: run[name]


def _gap(name: str, base: str) -> Callable[[Mapping[str, float]], float]:
    return lambda run: run[name] - run[base]


def _added(name: str) -> Callable[[Mapping[str, float]], float]:
    return lambda run: run[name] - run["direct"]


GATEWAY_KEY = "bench-key-0123456789"
CLI = [sys.executable, "-c", "from guardstack.cli.main import main; raise SystemExit(main())"]


@contextlib.asynccontextmanager
async def http_session(url: str, key: str | None = None) -> AsyncIterator[ClientSession]:
    """The official client in a session over streamable HTTP, with a client key."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    http = httpx2.AsyncClient(headers=headers, timeout=60)
    async with (
        http,
        streamable_http_client(url, http_client=http) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        await session.initialize()
        yield session


async def latencies_ms(sessions: list[ClientSession], tool: str, calls: int) -> list[float]:
    """Every call's latency, the ``sessions`` calling ``tool`` ``calls`` times each, at once."""
    seen: list[float] = []

    async def client(session: ClientSession) -> None:
        for _ in range(calls):
            started = time.perf_counter()
            await session.call_tool(tool, {"message": "hi"})
            seen.append((time.perf_counter() - started) * 1000)

    async with anyio.create_task_group() as group:
        for session in sessions:
            group.start_soon(client, session)
    return seen


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _listening(port: int) -> None:
    with anyio.fail_after(30):
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return
            except OSError:
                await anyio.sleep(0.05)


def _gateway_files(directory: Path, ports: list[int]) -> list[str]:
    """The gateway's files (two servers, the typical stack, one key): its options."""
    plugins: list[Any] = [
        {"name": "tool-call-limit", "config": {"per_turn": 1_000_000}},
        {"name": "retry"},
        {"name": "tool-call-timeout-policy"},
        {"name": "repeat-tool-reminder", "config": {"exclude": ["a_echo"]}},
    ]
    servers = {
        name: {"url": f"http://127.0.0.1:{port}/mcp", "timeouts_ms": {"*": 10_000}}
        for name, port in zip("ab", ports, strict=True)
    }
    gateway, keys = directory / "gateway.json", directory / "keys.json"
    gateway.write_text(json.dumps({"servers": servers, "plugins": plugins}), "utf-8")
    tenants: dict[str, Any] = {"bench": {"servers": {"a": {}, "b": {}}}}
    keys.write_text(json.dumps({"keys": {GATEWAY_KEY: "bench"}, "tenants": tenants}), "utf-8")
    return ["--config", str(gateway), "--keys", str(keys)]


async def measure_gateway(calls: int, runs: int, clients: int) -> list[dict[str, float]]:
    results: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        # Each measured path has servers of its own: the SDK's streamable-HTTP server
        # wedges after a few thousand calls from 50 sessions (no guardstack involved).
        first, second, third, fourth, gateway, proxy = (_free_port() for _ in range(6))
        server = [sys.executable, "-m", "tests.integrations.mcp_server", str(directory / "log")]
        quiet = subprocess.DEVNULL
        started = []
        try:
            for port in (first, second, third, fourth):
                started.append(
                    await anyio.open_process([*server, str(port)], cwd=ROOT, stderr=quiet)
                )
                await _listening(port)
            http = ["--transport", "http", "--listen"]
            for command in (
                [*_gateway_files(directory, [third, fourth]), *http, f"127.0.0.1:{gateway}"],
                [*http, f"127.0.0.1:{proxy}", "--connect", f"http://127.0.0.1:{second}/mcp"],
            ):
                started.append(
                    await anyio.open_process([*CLI, "mcp-proxy", *command], cwd=ROOT, stderr=quiet)
                )
            await _listening(gateway)
            await _listening(proxy)
            # The sessions are opened once and kept, as clients keep them.
            async with contextlib.AsyncExitStack() as stack:
                targets = {}
                for name, port, tool, key in (
                    ("direct", first, "echo", None),
                    ("proxy", proxy, "echo", None),
                    ("gateway", gateway, "a_echo", GATEWAY_KEY),
                ):
                    url = f"http://127.0.0.1:{port}/mcp"
                    sessions = [
                        await stack.enter_async_context(http_session(url, key))
                        for _ in range(clients)
                    ]
                    await latencies_ms(sessions, tool, 1)  # warm up
                    targets[name] = (sessions, tool)
                for _ in range(runs):
                    run: dict[str, float] = {}
                    for label, count, each in (("one", 1, calls), ("many", clients, 4)):
                        for name, (sessions, tool) in targets.items():
                            seen = await latencies_ms(sessions[:count], tool, each)
                            run[f"{name}_{label}"] = statistics.median(seen)
                    results.append(run)
        finally:
            for process in reversed(started):
                process.terminate()
                with anyio.move_on_after(5):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    return results


def gateway_table(runs: list[dict[str, float]], clients: int) -> str:
    rows = [
        [
            f"{label} ({count} client{'s' if count > 1 else ''})",
            f"{median(runs, _of(name + '_' + which)):.3f}",
            f"{median(runs, _gap(name + '_' + which, 'direct_' + which)):.3f}",
            ratio(runs, _of(name + "_" + which), _of("direct_" + which)),
        ]
        for which, count in (("one", 1), ("many", clients))
        for label, name in (
            ("direct", "direct"),
            ("mcp-proxy --connect, no plugins", "proxy"),
            ("gateway, two servers, typical stack", "gateway"),
        )
    ]
    headers = ["echo over streamable HTTP", "median ms per call", "added ms", "ratio to direct"]
    return table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", type=int, default=50)
    arguments = parser.parse_args()
    runs = anyio.run(measure, arguments.calls, arguments.runs)
    rows = [
        [
            label,
            f"{median(runs, _of(name)):.3f}",
            f"{median(runs, _added(name)):.3f}",
            ratio(runs, _of(name), _of("direct")),
        ]
        for label, name in (
            ("direct", "direct"),
            ("mcp-proxy, no plugins", "bare"),
            ("mcp-proxy, typical stack", "proxy"),
        )
    ]
    print(table(["echo over stdio", "ms per call", "added ms", "ratio to direct"], rows))
    gateway_runs = anyio.run(measure_gateway, arguments.calls, arguments.runs, arguments.clients)
    print()
    print(gateway_table(gateway_runs, arguments.clients))


if __name__ == "__main__":
    main()
