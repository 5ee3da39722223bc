"""What the telemetry wrappers record as ``error.type``, in one place; and spans and log
records made so that telemetry never changes an outcome.

An SDK's span or log-record processor runs inside ``start_span``, ``span.end()`` and
``logger.emit``: one that raises would raise into the call being traced. Every span
and record is made through ``start_span``, ``end_span`` and ``emit_record`` here,
which log such a failure (once per kind) and go on: the call's result never depends on
its telemetry. (Exporters already run apart, in the SDK's own batch processors.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
from opentelemetry import trace
from opentelemetry.trace import Span

from guardstack.pipeline.contract import ModelRequest
from guardstack.pipeline.model_members import model_name_of, provider_of
from guardstack.pipeline.signals import VERSION as VERSION  # re-exported: one version, read once
from guardstack.pipeline.validate import invalid
from guardstack.pipeline.values import ToolResult

#: ``error.type`` for an error result without a code (the semantic conventions' fallback).
OTHER = "_OTHER"
#: ``error.type`` when the call was cancelled from outside the layer.
CANCELLED = "cancelled"


def result_error_type(result: ToolResult) -> str | None:
    """The result's error code, ``_OTHER`` for an uncoded error, ``None`` for success."""
    if not result.is_error:
        return None
    return result.code or OTHER


def exception_error_type(error: BaseException) -> str:
    """``cancelled`` for cancellation, else the exception's class name."""
    if isinstance(error, anyio.get_cancelled_exc_class()):
        return CANCELLED
    return type(error).__name__


def request_model(request: ModelRequest) -> str | None:
    """The model name a request goes to: the ``model`` attribute, if text, of the request's
    own model (a child's, the proxy's upstream) or else its agent's."""
    return model_name_of(request.model if request.model is not None else request.agent.model)


def provider_name(request: ModelRequest) -> str:
    """``gen_ai.provider.name`` (required by the GenAI conventions): the answering model's
    ``provider`` (the adapters set it; the proxy's upstream names its wire), else
    ``_OTHER``, the conventions' value for a provider they do not list."""
    answering = request.model if request.model is not None else request.agent.model
    return provider_of(answering) or "_OTHER"


_PROVIDED = {"get_tracer": "TracerProvider", "get_meter": "MeterProvider",
             "get_logger": "LoggerProvider"}  # fmt: skip


def check_provider(owner: str, key: str, provider: Any, method: str) -> Any:
    """``provider`` if it is ``None`` or an OpenTelemetry provider (has ``method``), else
    the configuration error naming it."""
    if provider is not None and not callable(getattr(provider, method, None)):
        raise invalid(owner, key, provider, f"an OpenTelemetry {_PROVIDED[method]}")
    return provider


logger = logging.getLogger("guardstack")
_REPORTED: set[str] = set()


def _failed(what: str, error: Exception) -> None:
    if what not in _REPORTED:  # once per kind: a broken processor would flood the log
        _REPORTED.add(what)
        logger.warning(
            "telemetry: %s raised %s: %s (the call goes on; reported once)",
            what,
            type(error).__name__,
            error,
        )


def start_span(tracer: Any, name: str, **options: Any) -> Span:
    """``tracer.start_span(name, **options)``; a span that records nothing if a processor
    (its ``on_start``) raises."""
    try:
        span: Span = tracer.start_span(name, **options)
    except Exception as error:
        _failed("starting a span", error)
        return trace.INVALID_SPAN
    return span


def end_span(span: Span) -> None:
    """``span.end()``, whatever a processor's ``on_end`` does."""
    try:
        span.end()
    except Exception as error:
        _failed("ending a span", error)


def emit_record(emit: Callable[..., Any], **record: Any) -> None:
    """``logger.emit(**record)``, whatever a log-record processor does."""
    try:
        emit(**record)
    except Exception as error:
        _failed("emitting a log record", error)
