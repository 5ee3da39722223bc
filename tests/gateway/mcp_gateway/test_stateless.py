"""MCP without sessions at the gateway: the ``mcp`` SDK's client at 2026-07-28 (no
``initialize``, no ``Mcp-Session-Id``: ``server/discover``, then each request on its
own) and at 2025-11-25 (a session) against one gateway process. Nothing counted keys
on a transport session: quotas per tenant, per key and per conversation, and a cap at
the gateway, count a stateless client's calls together; listing never spends; and a
request whose ``Mcp-Method`` or ``Mcp-Name`` header disagrees with its body is 400
whatever its protocol version."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.mcp_gateway.gateways import (
    ACCEPT,
    INITIALIZE,
    fastmcp_server,
    gateway_file,
    http_gateway,
    keys_file,
)
from tests.integrations.ports import free_port

ONE, TWO = "key-acme-one-0123456789", "key-acme-two-0123456789"
KEYS = {ONE: {"tenant": "acme", "name": "one"}, TWO: {"tenant": "acme", "name": "two"}}
QUOTAS = [
    {"server": "a", "tool": "echo", "calls_per_day": 2, "per": "key"},
    {"server": "a", "tool": "search", "calls_per_hour": 3},  # per tenant, the default
    {"server": "a", "tool": "data", "calls_per_minute": 1, "per": "conversation"},
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def connected(
    url: str, key: str, version: str, conversation: str | None = None
) -> AsyncIterator[Any]:
    """The SDK's client: at 2026-07-28 it discovers and never opens a session; at
    2025-11-25 it initializes one."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {key}"}
    if conversation is not None:
        headers["x-guardstack-conversation"] = conversation
    http = httpx2.AsyncClient(headers=headers, timeout=60)
    async with (
        http,
        streamable_http_client(url, http_client=http) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        if version == "2026-07-28":
            await session.discover()
        else:
            await session.initialize()
        yield session


def said(result: Any) -> str:
    return "".join(getattr(part, "text", "") for part in result.content)


@pytest.mark.parametrize("version", ["2026-07-28", "2025-11-25"])
async def test_quotas_say_whose_they_are_and_listing_spends_nothing(
    tmp_path: Path, version: str
) -> None:
    config = gateway_file(tmp_path, {"a": fastmcp_server(tmp_path / "a.log")})
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": KEYS, "tenants": {"acme": {
        "servers": {"a": {}}, "quotas": QUOTAS}}}), "utf-8")  # fmt: skip
    async with http_gateway(tmp_path, config, "--keys", str(keys)) as (url, _):
        async with connected(url, ONE, version) as one:
            for _ in range(10):  # listing is never counted
                await one.list_tools()
            first = [await one.call_tool("a_echo", {"message": "hi"}) for _ in range(3)]
        async with connected(url, TWO, version) as two:
            second = [await two.call_tool("a_echo", {"message": "hi"}) for _ in range(2)]
        # per tenant: three an hour, the two keys together
        async with connected(url, ONE, version) as one, connected(url, TWO, version) as two:
            searched = [
                await one.call_tool("a_search", {"query": "q"}),
                await two.call_tool("a_search", {"query": "q"}),
                await one.call_tool("a_search", {"query": "q"}),
                await two.call_tool("a_search", {"query": "q"}),
            ]
        # per conversation: one a minute in each named conversation
        async with (
            connected(url, ONE, version, conversation="x") as in_x,
            connected(url, ONE, version, conversation="y") as in_y,
        ):
            data = [await in_x.call_tool("a_data", {}), await in_x.call_tool("a_data", {}),
                    await in_y.call_tool("a_data", {})]  # fmt: skip
    assert [r.is_error for r in first] == [False, False, True]
    assert "this key has used its 2 calls today to tool a_echo" in said(first[2])
    assert [r.is_error for r in second] == [False, False]  # its own share, not shared
    assert [r.is_error for r in searched] == [False, False, False, True]
    assert "tenant 'acme' has used its 3 calls this hour" in said(searched[3])
    assert [r.is_error for r in data] == [False, True, False]
    assert "this conversation has used its 1 calls this minute" in said(data[1])


async def test_a_cap_at_the_gateway_counts_a_stateless_clients_calls_together(
    tmp_path: Path,
) -> None:
    """Reported: with ``tool-call-limit {per_turn: 2}`` a 2026-07-28 client's third call
    ran — the gateway tied a conversation to the SDK's connection, new every request."""
    config = gateway_file(
        tmp_path,
        {"a": fastmcp_server(tmp_path / "a.log")},
        [{"name": "tool-call-limit", "config": {"per_turn": 2}}],
    )
    keys = keys_file(tmp_path, {"acme": {"servers": {"a": {}}}}, {ONE: "acme"})
    metrics = free_port()
    async with http_gateway(
        tmp_path, config, "--keys", str(keys), "--metrics-listen", f"127.0.0.1:{metrics}"
    ) as (url, _):
        async with connected(url, ONE, "2026-07-28") as client:
            results = [await client.call_tool("a_echo", {"message": "hi"}) for _ in range(3)]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{metrics}") as raw:
            scraped = await raw.get("/metrics")
    assert [r.is_error for r in results] == [False, False, True]
    assert "tool call limit" in said(results[2])
    # the gateway's metrics for a Prometheus (--metrics-listen), read by its own parser
    from prometheus_client.parser import text_string_to_metric_families

    names = {family.name for family in text_string_to_metric_families(scraped.text)}
    assert "mcp_server_operation_duration_seconds" in names  # the calls it served


@pytest.mark.parametrize("version", ["2026-07-28", "2025-11-25"])
@pytest.mark.parametrize(
    ("headers", "body_method", "body_name"),
    [
        ({"mcp-method": "tools/list"}, "tools/call", "a_echo"),  # the method lies
        ({"mcp-method": "tools/call", "mcp-name": "a_search"}, "tools/call", "a_echo"),
        ({"mcp-name": "a_echo"}, "tools/list", None),  # a name for a method with none
    ],
)
async def test_a_header_that_disagrees_with_its_body_is_400_at_any_version(
    tmp_path: Path,
    version: str,
    headers: dict[str, str],
    body_method: str,
    body_name: str | None,
) -> None:
    """Reported: a ``tools/call`` sent with ``Mcp-Method: tools/list`` in a 2025-11-25
    session reached the downstream server."""
    log = tmp_path / "a.log"
    config = gateway_file(tmp_path, {"a": fastmcp_server(log)})
    async with http_gateway(tmp_path, config) as (url, _), httpx.AsyncClient(timeout=30) as raw:
        session: dict[str, str] = {}
        if version == "2025-11-25":
            opened = await raw.post(url, json=INITIALIZE, headers=ACCEPT)
            session = {"mcp-session-id": opened.headers["mcp-session-id"],
                       "mcp-protocol-version": version}  # fmt: skip
        params: dict[str, Any] = {"name": body_name, "arguments": {"message": "hi"}}
        if version == "2026-07-28":
            params["_meta"] = {"io.modelcontextprotocol/protocolVersion": version,
                               "io.modelcontextprotocol/clientCapabilities": {}}  # fmt: skip
            session = {"mcp-protocol-version": version}
        body = {"jsonrpc": "2.0", "id": 7, "method": body_method,
                "params": params if body_name else {}}  # fmt: skip
        answer = await raw.post(url, json=body, headers={**ACCEPT, **session, **headers})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == -32020
    assert "does not match" in answer.json()["error"]["message"] or "a name" in answer.text
    calls = [line for line in (log.read_text("utf-8") if log.exists() else "").splitlines()
             if line.startswith("run echo")]  # fmt: skip
    assert calls == []  # nothing reached the downstream server


async def test_a_body_past_the_bound_with_routing_headers_is_413_never_cut_short(
    tmp_path: Path,
) -> None:
    """A request carrying ``Mcp-Method`` is read whole to check it against its body; one
    past the gateway's bound — sent chunked, with no length to refuse it by up front —
    is refused, never handed on cut short."""
    log = tmp_path / "a.log"
    config = gateway_file(tmp_path, {"a": fastmcp_server(log)})
    async with http_gateway(tmp_path, config) as (url, _), httpx.AsyncClient(timeout=30) as raw:
        params = {"name": "a_echo", "arguments": {"message": "x" * 5_000_000}}
        huge = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        routing = {"mcp-method": "tools/call", "mcp-name": "a_echo"}
        data = json.dumps(huge).encode()

        async def chunked() -> AsyncIterator[bytes]:
            for start in range(0, len(data), 65_536):
                yield data[start : start + 65_536]

        answer = await raw.post(url, content=chunked(), headers={**ACCEPT, **routing,
                                "content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 413
    assert answer.json()["error"]["message"] == "the body is too large"
