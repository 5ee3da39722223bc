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


def test_configure_reads_the_standard_environment(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anyio

    from guardstack.integrations.otel import configure
    from guardstack.pipeline import Harness, ToolCall, ToolDefinition
    from guardstack.wrappers import Tracing

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agents")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    telemetry = configure(service_name="ignored-when-the-variable-is-set", set_global=False)

    async def tool(arguments: Any, call: Any) -> str:
        return "ok"

    harness = Harness()
    harness.tools.register(ToolDefinition("t", tool))
    harness.plugin(Tracing(telemetry.tracer_provider))
    anyio.run(harness.tools.execute, ToolCall("t", {}, "c1"))
    telemetry.shutdown()
    [(resource, span)] = receiver.spans()
    assert resource["service.name"] == "agents"
    assert resource["deployment.environment"] == "test"
    assert span.name == "execute_tool t"
    assert telemetry.failed_spans == 0


def test_the_demo_follows_the_environment_and_fails_loudly_when_export_fails(
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import socket

    from guardstack.cli.main import main

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    assert main(["demo"]) == 0
    assert f"Every call of this demo was traced to {receiver.url}." in capsys.readouterr().out
    assert {resource["service.name"] for resource, _ in receiver.spans()} == {"guardstack-demo"}

    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    assert main(["demo", "--otlp", f"http://127.0.0.1:{port}"]) == 2
    captured = capsys.readouterr()
    assert "could not export" in captured.err
    assert "Every call of this demo was traced" not in captured.out
