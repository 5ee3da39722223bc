"""MCP spans: the caller's trace carried in each request's ``_meta``, so a real MCP
server's own spans (the SDK's, written to a file by the test server) join it — from
``mcp_tools`` with a private tracer provider, and through ``guardstack mcp-proxy``
exporting over OTLP to a loopback receiver."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from guardstack.integrations.mcp import mcp_tools
from guardstack.pipeline import Harness, ToolCall
from guardstack.wrappers import Tracing
from tests.integrations.test_mcp import server_log
from tests.wrappers.otel import SpanRig

ROOT = Path(__file__).parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def server_spans(directory: Path) -> list[dict[str, Any]]:
    path = server_log(directory).with_suffix(".spans.jsonl")
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def hex_id(number: int, width: int) -> str:
    return format(number, f"0{width}x")


async def test_mcp_tools_span_is_the_parent_of_the_servers_span(tmp_path: Path) -> None:
    rig = SpanRig()  # a provider of the caller's own, not the global one
    harness = Harness()
    harness.plugin(Tracing(rig.provider))
    command = [sys.executable, "-m", "tests.integrations.mcp_server", str(server_log(tmp_path)),
               "--spans"]  # fmt: skip
    params = StdioServerParameters(command=command[0], args=command[1:], cwd=str(ROOT))
    with (tmp_path / "stderr.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            for tool in await mcp_tools(session, tracer_provider=rig.provider):
                harness.tools.register(tool)
            outcome = await harness.tools.execute(ToolCall("echo", {"message": "hi"}, "c1"))
    assert outcome.result.content == "hi"
    [execute] = [s for s in rig.spans if s.name == "execute_tool echo"]
    [client] = [s for s in rig.spans if s.name == "tools/call echo"]
    assert client.kind.name == "CLIENT"
    assert client.parent is not None
    assert client.parent.span_id == execute.context.span_id
    assert dict(client.attributes or {})["mcp.method.name"] == "tools/call"
    [server] = [s for s in server_spans(tmp_path) if s["name"] == "tools/call echo"]
    assert server["kind"] == "SERVER"
    assert server["trace_id"] == hex_id(execute.context.trace_id, 32)
    assert server["parent_id"] == hex_id(client.context.span_id, 16)


class Receiver:
    """A loopback OTLP/HTTP receiver: the spans of every trace export, decoded."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[Any] = []
        spans = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            spans.extend(scope.spans)
                self.send_response(200)  # logs and metrics: accepted, not read
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    try:
        yield running
    finally:
        running.close()


async def test_one_trace_from_the_client_through_the_proxy_to_the_server(
    tmp_path: Path, receiver: Receiver
) -> None:
    config = tmp_path / "guards.yaml"
    config.write_text("- name: tracing\n- name: repeat-tool-reminder\n", "utf-8")
    proxy = [sys.executable, "-c", "from guardstack.cli.main import main; raise SystemExit(main())",
             "mcp-proxy", "--config", str(config), "--", sys.executable, "-m",
             "tests.integrations.mcp_server", str(server_log(tmp_path)), "--spans"]  # fmt: skip
    environment = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                   "OTEL_SERVICE_NAME": "proxy-under-test"}  # fmt: skip
    params = StdioServerParameters(command=proxy[0], args=proxy[1:], cwd=str(ROOT), env=environment)
    caller = SpanRig()
    span = caller.provider.get_tracer("test").start_span("the agent's call")
    context = span.get_span_context()
    traceparent = f"00-{hex_id(context.trace_id, 32)}-{hex_id(context.span_id, 16)}-01"
    with (tmp_path / "stderr.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            meta: Any = {"traceparent": traceparent}  # the W3C keys, unprefixed (SEP-414)
            result = await session.call_tool("echo", {"message": "hi"}, meta=meta)
    span.end()
    assert getattr(result.content[0], "text", None) == "hi"
    with anyio.fail_after(10):  # the proxy flushes its spans as it exits
        while not any(s.name.startswith("execute_tool") for s in receiver.spans):  # noqa: ASYNC110
            await anyio.sleep(0.05)
    by_id = {s.span_id.hex(): s for s in receiver.spans}
    [execute] = [s for s in receiver.spans if s.name == "execute_tool echo"]
    trace_id = hex_id(context.trace_id, 32)
    assert execute.trace_id.hex() == trace_id  # the agent's trace, carried in _meta
    # up from guardstack's span: the proxy's server span, whose parent is the agent's call
    proxy_server_span = by_id[execute.parent_span_id.hex()]
    assert proxy_server_span.name == "tools/call echo"
    assert proxy_server_span.parent_span_id.hex() == hex_id(context.span_id, 16)
    # down: the proxy's client span to the server, the parent of the server's own span
    [downstream_call] = [s for s in receiver.spans if s.parent_span_id == execute.span_id]
    assert downstream_call.name == "MCP send tools/call echo"  # the MCP SDK's client span
    [server] = [s for s in server_spans(tmp_path) if s["name"] == "tools/call echo"]
    assert server["trace_id"] == trace_id
    assert server["parent_id"] == downstream_call.span_id.hex()
