"""Tracing: one OpenTelemetry span per tool call, and one per layer, nested in onion order.

Instrumentation, not a layer: applying ``Tracing`` adds no layer to any stage, so
it has no position of its own. It wraps, when the chain is composed:

* every ``registry.execute`` in an ``execute_tool {tool}`` span (kind INTERNAL,
  GenAI conventions: ``gen_ai.operation.name``, ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``; on an error result, status ERROR and ``error.type`` = the
  result's code). Contexts that post-execute layers inject — the repeat reminder's
  nudges — appear on it as ``guardstack.context`` span events;
* every dispatch layer in a child span named after the layer, carrying
  ``guardstack.layer`` (its name), ``guardstack.layer.index`` (0 = outermost) and
  ``guardstack.attempt`` (the attempt it was given). Spans nest exactly as the
  layers do, so the trace *shows* the order: layers inside a ``Retry`` appear once
  per attempt under the retry's span. A layer that returned an error result ends
  its span with status ERROR and ``error.type`` = that code; one cancelled from
  outside ends with ``error.type = cancelled``.

OpenTelemetry context flows through the layers because they run in the caller's
task. With tracing not applied, no span object is created at all. Only the
OpenTelemetry API is used; pass your SDK ``TracerProvider`` or set the global one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from pipeline.onion import Layer, LayerInfo
from pipeline.values import ToolCall, ToolOutcome, ToolResult
from wrappers._otel import exception_error_type, result_error_type

if TYPE_CHECKING:
    from pipeline.harness import Scope
    from pipeline.registry import DispatchNext, Execute

__all__ = ["CONTEXT_EVENT", "Tracing"]

CONTEXT_EVENT = "guardstack.context"
_VERSION = "0.1.0"


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
        span.record_exception(error)


class Tracing:
    """Spans for every tool call and every dispatch layer."""

    name: ClassVar[str] = "tracing"

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self.tracer_provider = tracer_provider
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(
            "guardstack", _VERSION
        )

    def apply(self, scope: Scope) -> None:
        scope.adopt(scope.tools.instrument(self.wrap_execute))
        scope.adopt(scope.tools.dispatch.instrument(self.wrap_layer))

    def wrap_execute(self, execute: Execute) -> Execute:
        tracer = self.tracer

        async def traced_execute(call: ToolCall) -> ToolOutcome:
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.call_id,
            }
            with tracer.start_as_current_span(
                f"execute_tool {call.name}",
                kind=SpanKind.INTERNAL,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    outcome = await execute(call)
                except BaseException as error:
                    _end_with_exception(span, error)
                    raise
                _end_with_result(span, outcome.result)
                for context in outcome.contexts:
                    span.add_event(
                        CONTEXT_EVENT,
                        {
                            "guardstack.context.source": context.source.plugin
                            or context.source.kind,
                            "guardstack.context.text": context.text,
                        },
                    )
                return outcome

        return traced_execute

    def wrap_layer(self, layer: Layer, info: LayerInfo) -> Layer:
        tracer = self.tracer

        async def traced_layer(call: ToolCall, call_next: DispatchNext) -> ToolResult:
            attributes: dict[str, Any] = {
                "guardstack.layer": info.name,
                "guardstack.layer.index": info.index,
                "guardstack.attempt": call.attempt,
                "gen_ai.tool.name": call.name,
            }
            with tracer.start_as_current_span(
                info.name,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    result: ToolResult = await layer(call, call_next)
                except BaseException as error:
                    _end_with_exception(span, error)
                    raise
                _end_with_result(span, result)
                return result

        return traced_layer

    def __repr__(self) -> str:
        return "Tracing()"
