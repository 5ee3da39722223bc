"""Tracing: one OpenTelemetry span per tool call, and one per layer, nested in onion order.

Instrumentation, not a layer: applying ``Tracing`` adds no layer to any stage, so
it has no position of its own. It wraps, when the chain is composed:

* every ``registry.execute`` in an ``execute_tool {tool}`` span (kind INTERNAL,
  GenAI conventions: ``gen_ai.operation.name``, ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``gen_ai.tool.type``, ``gen_ai.tool.description``; on an
  error result, status ERROR and ``error.type`` = the result's code, and an
  ``exception`` event when the tool raised). Contexts that post-execute layers
  inject — the repeat reminder's nudges — appear on it as ``guardstack.context``
  span events;
* every dispatch layer in a child span named after the layer, carrying
  ``guardstack.layer`` (its name), ``guardstack.layer.index`` (0 = outermost),
  ``guardstack.stage`` and ``guardstack.attempt`` (the attempt it was given) — and
  no ``gen_ai.*`` attribute, so backends count one tool per call, not one per layer.
  Spans nest exactly as the layers do, so the trace *shows* the order: layers
  inside a ``Retry`` appear once per attempt under the retry's span. A layer that
  returned an error result ends its span with status ERROR and ``error.type`` =
  that code; one cancelled from outside ends with ``error.type = cancelled``.

OpenTelemetry context flows through the layers because they run in the caller's
task. With tracing not applied, no span object is created at all.

Spans are not free: with the SDK, each costs about as much as a raw SDK span
(``benchmarks/wrappers.py``), several times a whole untraced call through a
typical stack. ``Tracing(layer_spans=False)`` keeps the ``execute_tool`` span and
its reminder events and drops the per-layer spans, for hot paths where one span a
call is the budget. Only the
OpenTelemetry API is used; pass your SDK ``TracerProvider`` or set the global one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from opentelemetry import context, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from guardstack.pipeline.contract import DispatchNext, Execute, Layer, LayerInfo, Scope
from guardstack.pipeline.validate import boolean, invalid
from guardstack.pipeline.values import (
    RaisedException,
    ToolCall,
    ToolDefinition,
    ToolOutcome,
    ToolResult,
    message_of,
)
from guardstack.wrappers._otel import VERSION, exception_error_type, result_error_type

__all__ = ["CONTEXT_EVENT", "Tracing"]

CONTEXT_EVENT = "guardstack.context"


def _end_with_result(span: Span, result: ToolResult) -> None:
    error_type = result_error_type(result)
    if error_type is not None:
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, result.error.message if result.error else None))


def _end_with_exception(span: Span, error: BaseException) -> None:
    error_type = exception_error_type(error)
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, error_type))
    if isinstance(error, Exception):
        # Telemetry never changes an outcome: an exception whose __str__ raises must not
        # replace the one being recorded.
        try:
            span.record_exception(error)
        except Exception:
            span.add_event(
                "exception",
                {"exception.type": type(error).__name__, "exception.message": message_of(error)},
            )


class Tracing:
    """Spans for every tool call and every dispatch layer."""

    name: ClassVar[str] = "tracing"

    def __init__(
        self, tracer_provider: TracerProvider | None = None, layer_spans: bool = True
    ) -> None:
        boolean("tracing", "layer_spans", layer_spans)
        if tracer_provider is not None and not callable(
            getattr(tracer_provider, "get_tracer", None)
        ):
            raise invalid(
                "tracing", "tracer_provider", tracer_provider, "an OpenTelemetry TracerProvider"
            )
        self.tracer_provider = tracer_provider
        self.layer_spans = layer_spans
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(
            "guardstack", VERSION
        )

    def apply(self, scope: Scope) -> None:
        """Instrument the registry (a span per call) and, optionally, every dispatch layer."""
        tools = scope.tools
        scope.adopt(tools.instrument(lambda execute: self.wrap_execute(execute, tools.get)))
        if self.layer_spans:
            scope.adopt(scope.tools.dispatch.instrument(self.wrap_layer))

    # Spans are started and made current by hand (start_span + context.attach) rather
    # than with ``start_as_current_span``: same spans, about a fifth cheaper per layer.

    def wrap_execute(
        self, execute: Execute, tool_of: Callable[[str], ToolDefinition | None] | None = None
    ) -> Execute:
        tracer = self.tracer

        async def traced_execute(call: ToolCall) -> ToolOutcome:
            attributes: dict[str, AttributeValue] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.call_id,
                "gen_ai.tool.type": "function",
            }
            tool = call.tool or (tool_of(call.name) if tool_of is not None else None)
            if tool is not None and tool.description:
                attributes["gen_ai.tool.description"] = tool.description
            span = tracer.start_span(
                f"execute_tool {call.name}", kind=SpanKind.INTERNAL, attributes=attributes
            )
            token = context.attach(trace.set_span_in_context(span))
            try:
                outcome = await execute(call)
            except BaseException as error:
                _end_with_exception(span, error)
                raise
            else:
                _end_with_result(span, outcome.result)
                raised = outcome.result.value
                if isinstance(raised, RaisedException):
                    span.add_event(
                        "exception",
                        {
                            "exception.type": raised.type,
                            "exception.message": raised.message,
                            "exception.stacktrace": raised.stacktrace,
                        },
                    )
                for injected in outcome.contexts:
                    span.add_event(
                        CONTEXT_EVENT,
                        {
                            "guardstack.context.source": injected.source.plugin
                            or injected.source.kind,
                            "guardstack.context.text": injected.text,
                        },
                    )
                return outcome
            finally:
                context.detach(token)
                span.end()

        return traced_execute

    def wrap_layer(self, layer: Layer, info: LayerInfo) -> Layer:
        tracer = self.tracer

        async def traced_layer(call: ToolCall, call_next: DispatchNext) -> ToolResult:
            span = tracer.start_span(
                info.name,
                attributes={
                    "guardstack.layer": info.name,
                    "guardstack.layer.index": info.index,
                    "guardstack.stage": info.stage,
                    "guardstack.attempt": call.attempt,
                },
            )
            token = context.attach(trace.set_span_in_context(span))
            try:
                result: ToolResult = await layer(call, call_next)
            except BaseException as error:
                _end_with_exception(span, error)
                raise
            else:
                _end_with_result(span, result)
                return result
            finally:
                context.detach(token)
                span.end()

        return traced_layer

    def __repr__(self) -> str:
        return f"Tracing(layer_spans={self.layer_spans})"
