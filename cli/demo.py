"""``guardstack demo``: the guards, the caps and the meaning of order, on a scripted agent.

Everything here runs through the public API. The demo is a coroutine, so the CLI
runs it on a real clock and the tests run it in virtual time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio

from guardstack.guards import ToolCallLimit, ToolCallTimeoutPolicy
from guardstack.pipeline.errors import GuardstackError
from guardstack.pipeline.harness import Harness
from guardstack.pipeline.model import ModelReply, ToolCallRequest
from guardstack.pipeline.session import ToolCallEvent, ToolResultEvent, TurnEnd, UserMessage
from guardstack.pipeline.testing import Hang, Reply, ScriptedModel, ScriptedTool
from guardstack.pipeline.values import TOOL_UNAVAILABLE, ToolCall
from guardstack.wrappers import CircuitBreaker, Retry, Timeout, Tracing

__all__ = ["SEED_CONFIG", "DemoTelemetry", "order_stacks", "run_demo"]

SEED_CONFIG: list[dict[str, Any]] = [
    {"id": "timeout-policy", "name": "@deepseek-ai/dsh-tool-call-timeout-policy"},
    {
        "id": "repeat-tool-reminder",
        "name": "@deepseek-ai/dsh-repeat-tool-reminder",
        "config": {
            "thresholds": [3, 5, 8],
            "include": [],
            "exclude": ["todo_write"],
            "argumentsPreviewChars": 500,
        },
    },
]


def _search_tool() -> ScriptedTool:
    """Hangs on its first two runs, answers on the third; declares a 200 ms budget."""
    return ScriptedTool("search", [Hang(), Hang(), Reply("3 results", after_ms=50)], timeout_ms=200)


def order_stacks() -> list[tuple[str, Callable[[Harness], None]]]:
    """The same three layers in different orders, and what each order means."""

    def per_attempt(harness: Harness) -> None:
        harness.plugin(Retry(attempts=3, backoff_ms=50, jitter=False))
        harness.plugin(ToolCallTimeoutPolicy())

    def whole_operation(harness: Harness) -> None:
        harness.plugin(ToolCallTimeoutPolicy())
        harness.plugin(Retry(attempts=3, backoff_ms=50, jitter=False))

    def both(harness: Harness) -> None:
        harness.plugin(Timeout(ms=400, code="TOTAL_TIMEOUT"))
        harness.plugin(Retry(attempts=3, backoff_ms=50, jitter=False))
        harness.plugin(ToolCallTimeoutPolicy())

    return [
        ("timeout inside retry: the tool's 200 ms budget per attempt", per_attempt),
        ("timeout outside retry: one 200 ms budget for the whole operation", whole_operation),
        ("a 400 ms total outside, the tool's budget per attempt inside", both),
    ]


async def _order_section(out: TextIO, telemetry: DemoTelemetry) -> None:
    out.write("1. Order is meaning — one hanging tool, three stacks\n")
    out.write("   `search` hangs twice, then answers; it declares timeout_ms=200.\n\n")
    for title, build in order_stacks():
        harness = Harness()
        tool = _search_tool()
        tool.register(harness.tools)
        telemetry.trace(harness)
        build(harness)
        started = anyio.current_time()
        outcome = await harness.tools.execute(ToolCall("search", {"q": "guards"}, "call-1"))
        elapsed_ms = (anyio.current_time() - started) * 1000
        layers = " -> ".join(harness.tools.dispatch.names())
        shown = outcome.result.content
        out.write(f"   {title}\n")
        out.write(f"     onion    {layers} -> tool\n")
        out.write(f"     result   {shown}\n")
        out.write(f"     attempts {len(tool.runs)}, elapsed {elapsed_ms:.0f} ms\n\n")


def _agent_script() -> list[ModelReply]:
    def ask(name: str, arguments: dict[str, Any]) -> ModelReply:
        return ModelReply(tool_calls=[ToolCallRequest(name, arguments)])

    grep = {"pattern": "TODO", "path": "src/"}
    return [
        ask("grep", grep),
        ask("todo_write", {"items": ["look again"]}),
        ask("grep", {"path": "src/", "pattern": "TODO"}),  # same call, keys reordered
        ask("grep", grep),
        ask("web_fetch", {"url": "https://example.invalid/slow"}),
        ModelReply("Nothing new in src/, and the page would not load: stopping here."),
    ]


def _describe_event(event: Any) -> str | None:
    if isinstance(event, UserMessage):
        who = event.source.plugin or event.source.kind
        text = event.text if len(event.text) <= 90 else event.text[:87] + "..."
        return f"[{who}] {text}"
    if isinstance(event, ToolCallEvent):
        return f"  call   {event.name}({event.arguments_json})"
    if isinstance(event, ToolResultEvent):
        return f"  result {event.result.content}"
    if isinstance(event, TurnEnd):
        return f"turn ended: {event.reason}"
    return None


async def _agent_section(out: TextIO, telemetry: DemoTelemetry, save_to: Path | None) -> None:
    out.write("2. The original system's two guards on a looping agent (its YAML, as entries)\n\n")
    model = ScriptedModel(_agent_script())
    harness = Harness(model=model)
    for tool in (
        ScriptedTool("grep", ["src/app.py:12: # TODO: remove"]),
        ScriptedTool("todo_write", ["saved"]),
        ScriptedTool("web_fetch", [Hang()], timeout_ms=300),
    ):
        tool.register(harness.tools)
    telemetry.trace(harness)
    harness.load(SEED_CONFIG)
    for line in harness.describe().splitlines():
        out.write(f"   {line}\n")
    agent = harness.loop.create("demo-session")
    result = await agent.prompt("Find the TODOs in src/ and check the docs page.")
    out.write("\n")
    for event in agent.session.events:
        described = _describe_event(event)
        if described is not None:
            out.write(f"   {described}\n")
    rebuilt = model.requests[-1] == agent.session.messages()[:-1]  # all but the answer
    out.write(
        f"\n   The model was asked {len(model.requests)} times; every request is the "
        f"session log rebuilt ({'verified' if rebuilt else 'MISMATCH'}).\n"
    )
    out.write(f"   Turn: {result.reason} after {result.steps} steps.\n")
    out.write(
        "   The reminder came after the third identical grep: key order does not matter,\n"
        "   and todo_write is excluded, so it neither counted nor broke the chain. The\n"
        "   hung web_fetch ended at its own 300 ms budget with the original system's error.\n"
    )
    if save_to is not None:
        agent.session.save(save_to)
        out.write(f"   Session log saved to {save_to} (JSON Lines).\n")
    out.write("\n")


class DemoTelemetry:
    """The demo's spans: kept in memory for section 3, and sent over OTLP if asked.

    With an OTLP endpoint every harness of the demo is traced, so a backend (Jaeger,
    Tempo, an OpenTelemetry Collector…) shows the whole demo, one span per layer.
    """

    def __init__(self, otlp_endpoint: str | None = None) -> None:
        env_endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        #: Where spans go: ``--otlp``, else the standard OTEL_* variables, else nowhere.
        self.otlp_endpoint = otlp_endpoint or env_endpoint
        self.exporting: Any = None
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )
        except ImportError:
            if otlp_endpoint is not None:
                raise GuardstackError(
                    "sending spans needs the SDK: pip install 'guardstack[otlp]'"
                ) from None
            self.provider: Any = None
            return
        self.memory = InMemorySpanExporter()
        if self.otlp_endpoint is None:
            self.provider = TracerProvider(resource=Resource({"service.name": "guardstack-demo"}))
        else:
            from guardstack.integrations.otel import configure

            try:
                self.exporting = configure(
                    service_name="guardstack-demo",
                    traces_endpoint=otlp_endpoint,  # None: the OTEL_* variables decide
                    metrics=False,
                    set_global=False,
                )
            except ImportError:
                raise GuardstackError(
                    "sending spans over OTLP needs: pip install 'guardstack[otlp]'"
                ) from None
            self.provider = self.exporting.tracer_provider
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))

    def trace(self, harness: Harness, *, always: bool = False) -> None:
        """Trace ``harness`` if the demo sends spans somewhere (or ``always``)."""
        if self.provider is not None and (always or self.otlp_endpoint is not None):
            harness.plugin(Tracing(self.provider))

    def shutdown(self) -> None:
        """Flush what is still batched; raise if spans could not be delivered."""
        if self.provider is not None:
            self.provider.shutdown()
        if self.exporting is not None and self.exporting.failed_spans:
            raise GuardstackError(
                f"could not export {self.exporting.failed_spans} spans to "
                f"{self.otlp_endpoint} ({self.exporting.last_error})"
            )


async def _tracing_section(out: TextIO, telemetry: DemoTelemetry) -> None:
    out.write("3. One span per call and per layer (OpenTelemetry SDK)\n\n")
    if telemetry.provider is None:
        out.write("   (skipped: pip install 'guardstack[otel]' to see the spans)\n\n")
        return
    harness = Harness()
    _search_tool().register(harness.tools)
    telemetry.trace(harness, always=True)
    order_stacks()[0][1](harness)
    await harness.tools.execute(ToolCall("search", {"q": "guards"}, "call-7"))
    spans = list(telemetry.memory.get_finished_spans())
    root = next(
        span for span in spans if (span.attributes or {}).get("gen_ai.tool.call.id") == "call-7"
    )
    children: dict[int, list[Any]] = {}
    for span in spans:
        if span.parent is not None and span.context.trace_id == root.context.trace_id:
            children.setdefault(span.parent.span_id, []).append(span)

    def show(span: Any, depth: int) -> None:
        attributes = span.attributes or {}
        duration_ms = (span.end_time - span.start_time) / 1e6
        notes = [f"{duration_ms:.0f} ms"]
        below = children.get(span.context.span_id, [])
        if attributes.get("guardstack.layer") == "retry":
            notes.append(f"{len(below)} attempts")  # the retry wraps them; it is not one
        elif "guardstack.attempt" in attributes and "guardstack.layer" in attributes:
            notes.append(f"attempt {attributes['guardstack.attempt']}")
        if "error.type" in attributes:
            notes.append(f"error.type={attributes['error.type']}")
        out.write(f"   {'  ' * depth}{span.name}  ({', '.join(notes)})\n")
        for child in sorted(below, key=lambda s: s.start_time):
            show(child, depth + 1)

    show(root, 0)
    out.write("\n")


async def _caps_section(out: TextIO, telemetry: DemoTelemetry) -> None:
    out.write("4. A cap stops loss: a model that never stops calling tools\n\n")
    model = ScriptedModel(
        [ModelReply(tool_calls=[ToolCallRequest("grep", {"page": page})]) for page in range(100)]
    )
    harness = Harness(model=model, max_steps=50)
    grep = ScriptedTool("grep", ["more results"])
    grep.register(harness.tools)
    telemetry.trace(harness)
    harness.plugin(ToolCallLimit(per_turn=5, on_exceeded="end_turn"))
    result = await harness.loop.create("runaway").prompt("Read every page.")
    out.write(
        "   ToolCallLimit(per_turn=5, on_exceeded='end_turn'): the 6th call was denied and the\n"
        f"   turn ended {result.reason} after {len(grep.runs)} tool runs and {result.steps} model "
        "calls\n   (max_steps=50 alone would have paid for 50).\n\n"
    )


async def _breaker_section(out: TextIO, telemetry: DemoTelemetry) -> None:
    out.write("5. A circuit breaker: an agent that keeps calling a dead tool\n\n")
    loops = 8
    model = ScriptedModel(
        [ModelReply(tool_calls=[ToolCallRequest("status", {"job": 7})]) for _ in range(loops)]
        + [ModelReply("The status service is down; I will report that.")]
    )
    harness = Harness(model=model, max_steps=20)
    dead = ScriptedTool("status", [Hang()], timeout_ms=100)
    dead.register(harness.tools)
    telemetry.trace(harness)
    harness.plugin(CircuitBreaker(minimum_calls=3, failure_ratio=1.0, break_s=30))
    harness.plugin(ToolCallTimeoutPolicy())
    started = anyio.current_time()
    agent = harness.loop.create("dead-tool")
    await agent.prompt("Is job 7 done?")
    spent = anyio.current_time() - started
    results = [e.result for e in agent.session.events if isinstance(e, ToolResultEvent)]
    refused = [r for r in results if r.code == TOOL_UNAVAILABLE]
    out.write(
        f"   circuit-breaker -> tool-call-timeout-policy: the first {len(dead.runs)} calls waited "
        f"out\n   their 100 ms budget; then the breaker opened and the other {len(refused)} "
        "were answered at once:\n"
        f"     {refused[0].content[:94]}…\n"
        f"   {spent:.2f} s spent on the dead tool (without the breaker: {loops * 0.1:.2f} s, "
        f"and {loops} hung calls).\n\n"
    )


async def run_demo(
    out: TextIO,
    *,
    save_to: Path | None = None,
    otlp_endpoint: str | None = None,
    sections: Sequence[str] = ("order", "agent", "tracing", "caps", "breaker", "gateway"),
) -> None:
    """Write the demo to ``out``; with ``otlp_endpoint``, also send every span there."""
    telemetry = DemoTelemetry(otlp_endpoint)
    out.write("guardstack demo: guards and wrappers for AI-agent tool calls\n\n")
    try:
        if "order" in sections:
            await _order_section(out, telemetry)
        if "agent" in sections:
            await _agent_section(out, telemetry, save_to)
        if "tracing" in sections:
            await _tracing_section(out, telemetry)
        if "caps" in sections:
            await _caps_section(out, telemetry)
        if "breaker" in sections:
            await _breaker_section(out, telemetry)
        if "gateway" in sections:
            from guardstack.cli.demo_gateway import gateway_section

            await gateway_section(out)
    finally:
        telemetry.shutdown()
    if telemetry.otlp_endpoint is not None:
        out.write(f"Every call of this demo was traced to {telemetry.otlp_endpoint}.\n")
