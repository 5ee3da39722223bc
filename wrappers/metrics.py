"""Metrics: how long tool calls take and how many fail, as OpenTelemetry instruments.

Records, through the OpenTelemetry *API* only (the SDK and exporters are yours):

* ``gen_ai.execute_tool.duration`` — histogram, seconds, per the GenAI semantic
  conventions: ``gen_ai.operation.name=execute_tool``, ``gen_ai.tool.name``, and
  ``error.type`` (the result's error code) on failures;
* ``guardstack.tool.calls`` — counter, one per call, same attributes.

Where it belongs: a dispatch layer, and **its position decides what a "call" is**.
Registered outside a ``Retry`` it measures operations (one point per tool call,
duration including every attempt and backoff); inside it, attempts (one point per
attempt). Outside a ``Timeout`` it sees the timeout's result (``error.type =
TOOL_TIMEOUT``); inside it, a call cut short by that timeout is recorded with
``error.type = cancelled`` when the cancellation passes through.

Durations use ``anyio.current_time()``, so they are exact in virtual time.
Cancellation always propagates; the point is recorded on the way out.
"""

from __future__ import annotations

from typing import ClassVar

import anyio
from opentelemetry import metrics
from opentelemetry.metrics import MeterProvider

from guardstack.pipeline.contract import DispatchNext, Scope
from guardstack.pipeline.validate import invalid
from guardstack.pipeline.values import ToolCall, ToolResult
from guardstack.wrappers._otel import VERSION, exception_error_type, result_error_type

__all__ = ["CALLS_METRIC", "DURATION_METRIC", "Metrics"]

DURATION_METRIC = "gen_ai.execute_tool.duration"
CALLS_METRIC = "guardstack.tool.calls"


class Metrics:
    """Duration histogram and call counter for every call through this layer."""

    name: ClassVar[str] = "metrics"

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
            raise invalid(
                "metrics", "meter_provider", meter_provider, "an OpenTelemetry MeterProvider"
            )
        self.meter_provider = meter_provider
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("guardstack", VERSION)
        self._duration = meter.create_histogram(
            DURATION_METRIC, unit="s", description="Duration of tool executions"
        )
        self._calls = meter.create_counter(
            CALLS_METRIC, unit="{call}", description="Tool executions, by tool and error type"
        )

    async def __call__(self, call: ToolCall, call_next: DispatchNext) -> ToolResult:
        started = anyio.current_time()
        try:
            result = await call_next(call)
        except BaseException as error:
            self._record(call, started, exception_error_type(error))
            raise
        self._record(call, started, result_error_type(result))
        return result

    def _record(self, call: ToolCall, started: float, error_type: str | None) -> None:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name}
        if error_type is not None:
            attributes["error.type"] = error_type
        self._duration.record(anyio.current_time() - started, attributes)
        self._calls.add(1, attributes)

    def apply(self, scope: Scope) -> None:
        """Register as a dispatch layer."""
        scope.use(scope.tools.dispatch, self)

    def __repr__(self) -> str:
        return "Metrics()"
