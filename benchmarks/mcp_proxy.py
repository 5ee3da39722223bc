"""What ``guardstack mcp-proxy`` adds per tool call, against calling the server directly.

    python -m benchmarks.mcp_proxy [--calls 300] [--runs 3]

Both sides talk to the same kind of real MCP server over stdio (the tests' server,
``tests/integrations/mcp_server.py``), through the official SDK's client; the proxy
runs a typical stack (tool-call limit, retry, the timeout policy, the reminder).
Calls are ``echo`` (answers at once), timed in interleaved batches; the ratio is
the median over runs, with the range.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

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
        await session.call_tool("echo", {"text": "hi"})
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


def _added(name: str) -> Callable[[Mapping[str, float]], float]:
    return lambda run: run[name] - run["direct"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
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


if __name__ == "__main__":
    main()
