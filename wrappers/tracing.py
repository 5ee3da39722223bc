"""Tracing: one OpenTelemetry span per tool call, and one per layer, nested in onion order.

Instrumentation, not a layer: applying ``Tracing`` adds no layer to any stage, so
it has no position of its own. It wraps, when the chain is composed:

* every agent turn in an ``invoke_agent {session}`` span (``gen_ai.operation.name``,
  ``gen_ai.agent.name`` and ``gen_ai.conversation.id`` = the session id, the turn's
  ``gen_ai.usage.*`` totals, ``guardstack.turn.reason``; status ERROR when the turn
  ended with ``error``), so a turn is one trace;
* every model call in a ``chat {model}`` span inside it (``gen_ai.request.model``,
  ``gen_ai.response.model``, ``gen_ai.provider.name``, usage,
  ``gen_ai.response.finish_reasons``; a failed call ends with ``error.type`` = its
  ``MODEL_*`` code and an exception event), with the model stage's layers as child
  spans, as for tools;
* every ``registry.execute`` in an ``execute_tool {tool}`` span (kind INTERNAL,
  GenAI conventions: ``gen_ai.operation.name``, ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``gen_ai.tool.type``, ``gen_ai.tool.description``; on an
  error result, status ERROR and ``error.type`` = the result's code, and an
  ``exception`` event when the tool raised). Contexts that post-execute layers
  inject — the repeat reminder's nudges — appear on it as ``guardstack.context``
  span events, and a denial (a cap) as a ``guardstack.denied`` event; a turn a cap
  ended carries a ``guardstack.blocked`` event;
* every dispatch layer in a child span named after the layer, carrying
  ``guardstack.layer`` (its name), ``guardstack.layer.index`` (0 = outermost),
  ``guardstack.stage`` and ``guardstack.attempt`` (the attempt it was given) — and
  no ``gen_ai.*`` attribute, so backends count one tool per call, not one per layer.
  Spans nest exactly as the layers do, so the trace *shows* the order: layers
  inside a ``Retry`` appear once per attempt under the retry's span. A layer that
  returned an error result ends its span with status ERROR and ``error.type`` =
  that code; one cancelled from outside ends with ``error.type = cancelled``.

Content is opt-in (``Tracing(capture_content=True)``, or the GenAI conventions'
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``): tool arguments and
results (``gen_ai.tool.call.arguments`` / ``.result``) and model input and output
messages (``gen_ai.input.messages`` / ``gen_ai.output.messages``), each cut to
``max_content_chars``. Off, nothing a tool or model said leaves the process.

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

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

from opentelemetry import context, trace
from opentelemetry._logs import LoggerProvider, SeverityNumber, get_logger_provider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from guardstack.pipeline.contract import (
    CallContext,
    Execute,
    Layer,
    LayerInfo,
    ModelNext,
    ModelReply,
    ModelRequest,
    Refusal,
    Scope,
    TurnRun,
    Usage,
    adapter_for,
    model_error_code,
)
from guardstack.pipeline.errors import GuardstackError
from guardstack.pipeline.model_members import provider_of
from guardstack.pipeline.validate import boolean, integer
from guardstack.pipeline.values import (
    TOOL_DENIED,
    RaisedException,
    ToolCall,
    ToolDefinition,
    ToolResult,
    message_of,
)
from guardstack.pipeline.verdicts import ToolOutcome
from guardstack.wrappers._genai import as_json, genai_input, genai_output
from guardstack.wrappers._otel import (
    VERSION,
    check_provider,
    emit_record,
    end_span,
    exception_error_type,
    provider_name,
    request_model,
    result_error_type,
    start_span,
)

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent, TurnResult

__all__ = [
    "BLOCKED_EVENT",
    "CAPTURE_VARIABLE",
    "CONTEXT_EVENT",
    "DENIED_EVENT",
    "MODEL_EXCEPTION_EVENT",
    "TOOL_EXCEPTION_EVENT",
    "Tracing",
]

#: A call a cap (or any pre-execute layer) denied: an event on its ``execute_tool`` span.
DENIED_EVENT = "guardstack.denied"
#: A turn a cap ended (reason ``blocked``): an event on its ``invoke_agent`` span.
BLOCKED_EVENT = "guardstack.blocked"

#: The GenAI conventions' switch for content capture, honoured when not set in code.
CAPTURE_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

CONTEXT_EVENT = "guardstack.context"
#: A model call that failed: the GenAI conventions' exception event (a log record).
MODEL_EXCEPTION_EVENT = "gen_ai.client.operation.exception"
#: A tool that raised (the conventions define no tool exception event: guardstack's own).
TOOL_EXCEPTION_EVENT = "guardstack.tool.exception"

_SEVERITY: Final = {
    "DEBUG": SeverityNumber.DEBUG,
    "INFO": SeverityNumber.INFO,
    "WARN": SeverityNumber.WARN,
    "ERROR": SeverityNumber.ERROR,
}


#: On a span a failure passed through: the guardstack layer that produced it (``model``:
#: the model or its adapter), so a 429 on the span named ``timeout`` reads as what it is.
ERROR_LAYER = "guardstack.error.layer"
#: On a span whose call guardstack's own control flow ended (a cap, a denial): not an error.
BLOCKED = "guardstack.blocked"
REASON = "guardstack.reason"


def _end_with_result(span: Span, result: ToolResult) -> None:
    if result.code == TOOL_DENIED:
        # A cap's or guard's denial is guardstack's decision, not the tool failing.
        span.set_attribute(BLOCKED, True)
        span.set_attribute(REASON, result.error.message if result.error else "")
        return
    error_type = result_error_type(result)
    if error_type is not None:
        span.set_attribute("error.type", error_type)
        if isinstance(result.value, Refusal):
            span.set_attribute(ERROR_LAYER, result.value.layer)
        span.set_status(Status(StatusCode.ERROR, result.error.message if result.error else None))


def _end_with_model_error(span: Span, error: BaseException) -> None:
    """A model call (or a model-stage layer) that raised: a failure, or a cap's stop."""
    if not isinstance(error, Exception):
        _end_with_exception(span, error)
        return
    if isinstance(error, GuardstackError):
        # TurnBlocked and its kin: guardstack ended the turn; nothing failed.
        span.set_attribute(BLOCKED, True)
        span.set_attribute(REASON, message_of(error))
        return
    code = model_error_code(error)
    span.set_attribute("error.type", code)
    span.set_attribute(ERROR_LAYER, getattr(error, "layer", None) or "model")
    span.set_status(Status(StatusCode.ERROR, code))
    _record(span, error)


def _end_with_exception(span: Span, error: BaseException) -> None:
    error_type = exception_error_type(error)
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, error_type))
    if isinstance(error, Exception):
        _record(span, error)


#: The stack version a span's call ran on (after a ``Harness.reload``; none before one).
STACK_VERSION = "guardstack.stack.version"


def _stack(version: int) -> dict[str, AttributeValue]:
    return {STACK_VERSION: version} if version else {}


def _record(span: Span, error: Exception) -> None:
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
        self,
        tracer_provider: TracerProvider | None = None,
        layer_spans: bool = True,
        *,
        capture_content: bool | None = None,
        max_content_chars: int = 4_000,
        span_events: bool = True,
        logger_provider: LoggerProvider | None = None,
    ) -> None:
        boolean("tracing", "layer_spans", layer_spans)
        boolean("tracing", "span_events", span_events)
        check_provider("tracing", "logger_provider", logger_provider, "get_logger")
        #: Events as span events too (Phoenix reads span events, not log records, today).
        self.span_events = span_events
        self.logger_provider = logger_provider
        self.logger = (logger_provider or get_logger_provider()).get_logger("guardstack", VERSION)
        if capture_content is None:
            flag = os.environ.get(CAPTURE_VARIABLE, "")
            capture_content = flag.strip().lower() in ("true", "1", "yes")
        boolean("tracing", "capture_content", capture_content)
        #: Send tool arguments and results and model messages (opt-in: they may be private).
        self.capture_content = capture_content
        self.max_content_chars = integer("tracing", "max_content_chars", max_content_chars)
        check_provider("tracing", "tracer_provider", tracer_provider, "get_tracer")
        self.tracer_provider = tracer_provider
        self.layer_spans = layer_spans
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(
            "guardstack", VERSION
        )

    def apply(self, scope: Scope) -> None:
        """Instrument turns, model calls and tool calls, and (optionally) every layer."""
        tools = scope.tools
        version = getattr(scope, "version", 0)
        scope.adopt(scope.signals.listen(self.emit))
        scope.adopt(
            tools.instrument(lambda execute: self.wrap_execute(execute, tools.get, version))
        )
        scope.adopt(scope.loop.instrument_turn(lambda run: self.wrap_turn(run, version)))
        scope.adopt(
            scope.loop.instrument_model_call(lambda call: self.wrap_model_call(call, version))
        )
        if self.layer_spans:

            def wrap_layer(layer: Layer, info: LayerInfo) -> Layer:
                return self.wrap_layer(layer, info, version)

            scope.adopt(scope.tools.dispatch.instrument(wrap_layer))
            scope.adopt(scope.loop.model_call.instrument(wrap_layer))

    def emit(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue],
        severity: str = "INFO",
        span: Span | None = None,
        *,
        as_span_event: bool = True,
    ) -> None:
        """An event: a log record through the Logs API (``event_name`` = ``name``, in the
        context of ``span`` or the current one) and, with ``span_events``, an event on
        that span (``as_span_event=False``: the span has its own ``exception`` event)."""
        if span is None:
            span = trace.get_current_span()
        if as_span_event and self.span_events and span.is_recording():
            span.add_event(name, attributes)
        number = _SEVERITY.get(severity, SeverityNumber.INFO)
        emit_record(
            self.logger.emit,
            event_name=name,
            attributes=attributes,
            severity_number=number,
            severity_text=severity,
            context=trace.set_span_in_context(span),
        )

    def wrap_turn(self, run: TurnRun, version: int = 0) -> TurnRun:
        tracer = self.tracer

        async def traced_turn(agent: Agent, text: str) -> TurnResult:
            span = start_span(
                tracer,
                f"invoke_agent {agent.session_id}",
                kind=SpanKind.INTERNAL,
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    # required on every GenAI span: the agent's own model's provider
                    "gen_ai.provider.name": provider_of(agent.model) or "_OTHER",
                    "gen_ai.agent.name": agent.session_id,
                    "gen_ai.conversation.id": agent.session_id,
                    **_stack(version),
                },
            )
            token = context.attach(trace.set_span_in_context(span))
            try:
                result = await run(agent, text)
            except BaseException as error:
                _end_with_exception(span, error)
                raise
            else:
                span.set_attribute("guardstack.turn.reason", result.reason)
                span.set_attribute("gen_ai.usage.input_tokens", result.usage.input_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", result.usage.output_tokens)
                if result.reason == "error":
                    span.set_status(Status(StatusCode.ERROR, result.error))
                if result.reason == "blocked":
                    self.emit(BLOCKED_EVENT, {"guardstack.reason": result.error or ""}, span=span)
                return result
            finally:
                context.detach(token)
                end_span(span)

        return traced_turn

    def wrap_model_call(self, call_model: ModelNext, version: int = 0) -> ModelNext:
        tracer = self.tracer

        async def traced_model_call(request: ModelRequest) -> ModelReply:
            name = request_model(request)
            attributes: dict[str, AttributeValue] = {"gen_ai.operation.name": "chat"}
            if version:
                attributes[STACK_VERSION] = version
            if name is not None:
                attributes["gen_ai.request.model"] = name
            attributes["gen_ai.provider.name"] = provider_name(request)
            if self.capture_content:
                system, chat = genai_input(request.messages, self._cut)
                if system:
                    attributes["gen_ai.system_instructions"] = as_json(system)
                attributes["gen_ai.input.messages"] = as_json(chat)
            span = start_span(
                tracer,
                f"chat {name}" if name is not None else "chat",
                kind=SpanKind.CLIENT,
                attributes=attributes,
            )
            token = context.attach(trace.set_span_in_context(span))
            try:
                reply = await call_model(request)
            except BaseException as error:
                _end_with_model_error(span, error)
                if isinstance(error, Exception) and not isinstance(error, GuardstackError):
                    self.emit(
                        MODEL_EXCEPTION_EVENT,
                        {
                            "exception.type": type(error).__qualname__,
                            "exception.message": message_of(error),
                            "error.type": model_error_code(error),
                        },
                        "WARN",
                        span,
                        as_span_event=False,
                    )
                raise
            else:
                if isinstance(reply, ModelReply):
                    if reply.model:
                        span.set_attribute("gen_ai.response.model", reply.model)
                    if reply.usage is not None:
                        span.set_attributes(usage_attributes(reply.usage))
                    if reply.finish_reason:
                        span.set_attribute("gen_ai.response.finish_reasons", [reply.finish_reason])
                    if self.capture_content:
                        output = genai_output(reply, self._cut)
                        span.set_attribute("gen_ai.output.messages", as_json(output))
                return reply
            finally:
                context.detach(token)
                end_span(span)

        return traced_model_call

    # Spans are started and made current by hand (start_span + context.attach) rather
    # than with ``start_as_current_span``: same spans, about a fifth cheaper per layer.

    def wrap_execute(
        self,
        execute: Execute,
        tool_of: Callable[[str], ToolDefinition | None] | None = None,
        version: int = 0,
    ) -> Execute:
        tracer = self.tracer

        async def traced_execute(call: ToolCall) -> ToolOutcome:
            attributes: dict[str, AttributeValue] = {
                **_stack(version),
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.call_id,
                "gen_ai.tool.type": "function",
            }
            tool = call.tool or (tool_of(call.name) if tool_of is not None else None)
            if tool is not None and tool.description:
                attributes["gen_ai.tool.description"] = tool.description
            if self.capture_content:
                arguments = self._cut(as_json(call.arguments))
                attributes["gen_ai.tool.call.arguments"] = arguments
                # OpenInference's name too: Phoenix and Arize show it as the call's Input
                # (they file gen_ai.tool.call.arguments under the tool's parameters only).
                attributes["input.value"] = arguments
            span = start_span(
                tracer, f"execute_tool {call.name}", kind=SpanKind.INTERNAL, attributes=attributes
            )
            token = context.attach(trace.set_span_in_context(span))
            try:
                outcome = await execute(call)
            except BaseException as error:
                _end_with_exception(span, error)
                raise
            else:
                _end_with_result(span, outcome.result)
                if self.capture_content:
                    span.set_attribute("gen_ai.tool.call.result", self._cut(outcome.result.content))
                if outcome.result.code == TOOL_DENIED:
                    denial = outcome.result.error
                    self.emit(
                        DENIED_EVENT,
                        {
                            "gen_ai.tool.name": call.name,
                            "gen_ai.tool.call.id": call.call_id,
                            "guardstack.reason": denial.message if denial else "",
                            "guardstack.ends_turn": outcome.ends_turn,
                        },
                        span=span,
                    )
                raised = outcome.result.value
                if isinstance(raised, RaisedException):
                    exception = {
                        "exception.type": raised.type,
                        "exception.message": raised.message,
                        "exception.stacktrace": raised.stacktrace,
                    }
                    span.add_event("exception", exception)  # the span's own exception event
                    self.emit(
                        TOOL_EXCEPTION_EVENT,
                        {**exception, "gen_ai.tool.name": call.name},
                        "WARN",
                        span,
                        as_span_event=False,
                    )
                for injected in outcome.contexts:
                    # A reminder may quote the call's arguments (the original's detailed
                    # one does): its text is content, sent only when content is.
                    said: dict[str, AttributeValue] = {
                        "gen_ai.tool.name": call.name,
                        "gen_ai.tool.call.id": call.call_id,
                        "guardstack.context.source": injected.source.plugin or injected.source.kind,
                        "guardstack.context.chars": len(injected.text),
                    }
                    if self.capture_content:
                        said["guardstack.context.text"] = self._cut(injected.text)
                    self.emit(CONTEXT_EVENT, said, span=span)
                return outcome
            finally:
                context.detach(token)
                end_span(span)

        return traced_execute

    def wrap_layer(self, layer: Layer, info: LayerInfo, version: int = 0) -> Layer:
        tracer = self.tracer
        # On tools an exception out of a layer is a bug in it; on models, how calls fail.
        raising = adapter_for(info.stage).fails_by_raising
        on_error = _end_with_model_error if raising else _end_with_exception

        async def traced_layer(call: CallContext, call_next: Any) -> Any:
            span = start_span(
                tracer,
                info.name,
                attributes={
                    **_stack(version),
                    "guardstack.layer": info.name,
                    "guardstack.layer.index": info.index,
                    "guardstack.stage": info.stage,
                    "guardstack.attempt": call.attempt,
                },
            )
            token = context.attach(trace.set_span_in_context(span))
            try:
                result = await layer(call, call_next)
            except BaseException as error:
                on_error(span, error)
                raise
            else:
                if isinstance(result, ToolResult):
                    _end_with_result(span, result)
                return result
            finally:
                context.detach(token)
                end_span(span)

        return traced_layer

    def _cut(self, text: str) -> str:
        limit = self.max_content_chars
        if len(text) <= limit:
            return text
        return f"{text[:limit]}… (+{len(text) - limit} chars)"

    def __repr__(self) -> str:
        capture = ", capture_content=True" if self.capture_content else ""
        events = "" if self.span_events else ", span_events=False"
        return f"Tracing(layer_spans={self.layer_spans}{capture}{events})"


def usage_attributes(usage: Usage) -> dict[str, AttributeValue]:
    """A reply's usage as the GenAI conventions' span attributes: input and output, and
    the cache-read, cache-write and reasoning subsets when there are any."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
    }
    for name, count in (
        ("gen_ai.usage.cache_read.input_tokens", usage.cached_input_tokens),
        ("gen_ai.usage.cache_creation.input_tokens", usage.cache_write_tokens),
        ("gen_ai.usage.reasoning.output_tokens", usage.reasoning_tokens),
    ):
        if count:
            attributes[name] = count
    return attributes
