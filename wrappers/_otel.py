"""What the telemetry wrappers record as ``error.type``, in one place."""

from __future__ import annotations

from typing import Any

import anyio

from guardstack.pipeline.contract import ModelRequest
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
    """The model name a request goes to: the agent's model's ``model`` attribute, if text."""
    name = getattr(request.agent.model, "model", None)
    return name if isinstance(name, str) and name else None


_PROVIDED = {"get_tracer": "TracerProvider", "get_meter": "MeterProvider",
             "get_logger": "LoggerProvider"}  # fmt: skip


def check_provider(owner: str, key: str, provider: Any, method: str) -> Any:
    """``provider`` if it is ``None`` or an OpenTelemetry provider (has ``method``), else
    the configuration error naming it."""
    if provider is not None and not callable(getattr(provider, method, None)):
        raise invalid(owner, key, provider, f"an OpenTelemetry {_PROVIDED[method]}")
    return provider
