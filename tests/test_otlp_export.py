"""Spans reach a real OTLP/HTTP endpoint: a loopback receiver decodes what the SDK sends."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from guardstack.cli.demo import run_demo


class Receiver(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[ExportTraceServiceRequest] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        found: list[tuple[dict[str, Any], Any]] = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    found.extend((resource, span) for span in scope_spans.spans)
        return found


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        assert self.path == "/v1/traces"
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.requests.append(request)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


async def test_every_demo_call_is_traced_to_an_otlp_endpoint(receiver: Receiver) -> None:
    await run_demo(io.StringIO(), otlp_endpoint=receiver.url)
    spans = receiver.spans()
    assert {resource["service.name"] for resource, _ in spans} == {"guardstack-demo"}
    by_id = {span.span_id: span for _, span in spans}
    names = {span.name for span in by_id.values()}
    assert {
        "execute_tool search",
        "execute_tool grep",
        "execute_tool web_fetch",
        "retry",
        "timeout",
        "tool-call-timeout-policy",
    } <= names

    def attribute(span: Any, key: str) -> Any:
        for item in span.attributes:
            if item.key == key:
                value = item.value
                return value.int_value if value.HasField("int_value") else value.string_value
        return None

    # Layer spans nest in registration order: each one's parent is the layer before it.
    for span in by_id.values():
        index = attribute(span, "guardstack.layer.index")
        if index:
            assert attribute(by_id[span.parent_span_id], "guardstack.layer.index") == index - 1
    timed_out = [span for span in by_id.values() if attribute(span, "error.type") == "TOOL_TIMEOUT"]
    assert timed_out
    assert all(span.status.code == span.status.STATUS_CODE_ERROR for span in timed_out)
    reminders = [
        event
        for span in by_id.values()
        for event in span.events
        if event.name == "guardstack.context"
    ]
    assert len(reminders) == 1
