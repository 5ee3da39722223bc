"""``guardstack mcp-proxy``: any MCP server's tools, through an assembled guard stack.

    guardstack mcp-proxy --config guards.yaml --timeout 'search_*=5000' -- npx some-mcp-server

Starts ``COMMAND [ARGS…]`` as the downstream MCP server (stdio), registers its
tools with their budgets (``--timeout PATTERN=MS``, ``--default-timeout MS``) and
idempotency (from the server's annotations), applies the plugins of ``--config``,
and serves the same tools over this process's stdin/stdout. The configuration is
read before anything is started, so a bad file fails at once; the child process
is stopped when the client disconnects.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from guardstack.integrations.mcp import mcp_tools, serve_proxy
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import Harness

__all__ = ["parse_timeouts", "run_proxy"]


def parse_timeouts(values: Sequence[str]) -> dict[str, int]:
    """``PATTERN=MS`` options as a mapping, or ``ConfigError`` naming the bad one."""
    timeouts = {}
    for value in values:
        pattern, separator, ms = value.rpartition("=")
        if not separator or not pattern or not ms.isdigit():
            raise ConfigError(
                f"mcp-proxy: --timeout {value!r} must be PATTERN=MS, e.g. 'search_*=5000'",
                key="timeout",
                value=value,
            )
        timeouts[pattern] = int(ms)
    return timeouts


async def run_proxy(
    config: Path | None,
    command: Sequence[str],
    *,
    allow_imports: bool = False,
    timeouts_ms: dict[str, int] | None = None,
    default_timeout_ms: int | None = None,
) -> None:
    """Proxy ``command``'s MCP server over stdio until the client disconnects."""
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.server.stdio import stdio_server

    if not command:
        raise ConfigError("mcp-proxy: give the server to start after --, e.g. -- npx server")
    harness = Harness()
    if config is not None:
        harness.load(config, allow_imports=allow_imports)
    params = StdioServerParameters(command=command[0], args=list(command[1:]))
    async with (
        stdio_client(params, errlog=sys.stderr) as (read, write),
        ClientSession(read, write) as downstream,
    ):
        await downstream.initialize()
        tools = await mcp_tools(
            downstream, timeouts_ms=timeouts_ms, default_timeout_ms=default_timeout_ms
        )
        for tool in tools:
            harness.tools.register(tool)
        async with stdio_server() as (server_read, server_write):
            await serve_proxy(harness, downstream, server_read, server_write)
