"""The servers, gateway files and client keys the gateway tests share."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from benchmarks.mcp_proxy import http_session
from tests.integrations.ports import free_port, until_listening
from tests.integrations.test_mcp import ROOT
from tests.integrations.test_mcp_proxy import GUARDSTACK

TIME_SERVER = shutil.which(
    "mcp-server-time", path=str(Path(sys.executable).parent)
) or shutil.which("mcp-server-time")


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"},
    },
}


ACCEPT = {"Accept": "application/json, text/event-stream"}


KEY_A = "key-team-a-0123456789"


KEY_B = "key-team-b-0123456789"


def fastmcp_server(log: Path, *extra: str) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": ["-m", "tests.integrations.mcp_server", str(log), *extra],
    }


def time_server() -> dict[str, Any]:
    if TIME_SERVER is None:
        pytest.fail(
            "mcp-server-time is not installed (a test dependency: pip install mcp-server-time)"
        )
    return {"command": TIME_SERVER, "args": ["--local-timezone", "UTC"]}


def gateway_file(
    directory: Path, servers: Mapping[str, Any], plugins: list[Any] | None = None
) -> Path:
    path = directory / "gateway.json"
    path.write_text(json.dumps({"servers": dict(servers), "plugins": plugins or []}), "utf-8")
    return path


def keys_file(
    directory: Path, tenants: Mapping[str, Any], keys: Mapping[str, str] | None = None
) -> Path:
    path = directory / "keys.json"
    keys = keys or {KEY_A: "team-a", KEY_B: "team-b"}
    path.write_text(json.dumps({"keys": dict(keys), "tenants": dict(tenants)}), "utf-8")
    return path


STACK = [
    {"name": "tool-call-timeout-policy"},
    {"name": "retry", "config": {"attempts": 2, "retry_on": ["TOOL_FAILED"]}},
]


def two_servers_and_time(directory: Path) -> Path:
    return gateway_file(
        directory,
        {
            "a": fastmcp_server(directory / "a.log"),
            "b": {**fastmcp_server(directory / "b.log"), "timeouts_ms": {"hang": 300}},
            "time": time_server(),
        },
        STACK,
    )


@asynccontextmanager
async def http_gateway(
    directory: Path, config: Path, *options: str, host: str = "127.0.0.1"
) -> AsyncIterator[tuple[str, Any]]:
    """The gateway over streamable HTTP: its URL and its process."""
    port = free_port()
    stderr = (directory / "gateway.err").open("w")
    process = await anyio.open_process(
        [*GUARDSTACK, "mcp-proxy", "--config", str(config), "--transport", "http",
         "--listen", f"{host}:{port}", *options],
        cwd=ROOT,
        stderr=stderr,
    )  # fmt: skip
    try:
        with anyio.fail_after(20):
            while True:  # listening, or gone (then its stderr says why)
                if process.returncode is not None:
                    said = (directory / "gateway.err").read_text("utf-8")
                    raise AssertionError(f"the gateway exited {process.returncode}: {said}")
                try:
                    await until_listening(port, timeout_s=0.2, host=host)
                    break
                except TimeoutError:
                    continue
        yield f"http://{host}:{port}/mcp", process
    finally:
        if process.returncode is None:
            process.terminate()
        with anyio.fail_after(10):
            await process.wait()
        stderr.close()


def client(url: str, key: str | None = None) -> Any:
    """The official client in a session with the gateway at ``url``, with a key."""
    return http_session(url, key)


def tenants() -> dict[str, Any]:
    return {
        "team-a": {
            "servers": {"a": {}, "time": {"tools": ["get_current_time"]}},
            "quotas": [{"server": "a", "tool": "echo", "calls_per_day": 2}],
        },
        "team-b": {"servers": {"b": {}}, "quotas": [{"server": "b", "calls_per_day": 3}]},
    }
