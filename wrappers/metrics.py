"""Metrics: how long tool calls take and how many fail, as OpenTelemetry instruments.

Records, through the OpenTelemetry *API* only (the SDK and exporters are yours):

* ``gen_ai.execute_tool.duration`` — histogram, seconds, with the GenAI bucket
  boundaries (0.01 … 81.92 s): ``gen_ai.tool.name``, and ``error.type`` (the
  result's error code) on failures;
* ``guardstack.tool.calls`` — counter, one per call, same attributes.

Where it belongs: a dispatch layer, and **its position decides what a "call" is**.
Registered outside a ``Retry`` it measures operations (one point per tool call,
duration including every attempt and backoff); inside it, attempts (one point per
attempt). Outside a ``Timeout`` it sees the timeout's result (``error.type =
TOOL_TIMEOUT``); inside it, a call cut short by that timeout is recorded with
``error.type = cancelled`` when the cancellation passes through.

On the model stage (``Metrics(stage="model")``) it records the GenAI *client*
metrics around each model call: ``gen_ai.client.operation.duration`` (seconds;
``gen_ai.operation.name=chat``, ``gen_ai.request.model``, ``gen_ai.response.model``,
``error.type`` = the ``ModelError`` code on failure) and ``gen_ai.client.token.usage``
(tokens, one point each for ``gen_ai.token.type`` ``input`` and ``output``).
Outside a model-stage ``Retry`` a point is a whole operation; inside, an attempt.

Durations use ``anyio.current_time()``, so they are exact in virtual time.
Cancellation always propagates; the point is recorded on the way out.
"""

from __future__ import annotations

from typing import ClassVar

import anyio
from opentelemetry import metrics
from opentelemetry.metrics import MeterProvider

from guardstack.pipeline.contract import (
    DispatchNext,
    ModelNext,
    ModelReply,
    ModelRequest,
    Scope,
    model_error_code,
)
from guardstack.pipeline.validate import StageName, invalid
from guardstack.pipeline.validate import stage as check_stage
from guardstack.pipeline.values import ToolCall, ToolResult
from guardstack.wrappers._otel import (
    VERSION,
    exception_error_type,
    request_model,
    result_error_type,
)

__all__ = [
    "CALLS_METRIC",
    "DURATION_METRIC",
    "MODEL_DURATION_METRIC",
    "TOKEN_USAGE_METRIC",
    "Metrics",
]

DURATION_METRIC = "gen_ai.execute_tool.duration"
CALLS_METRIC = "guardstack.tool.calls"
MODEL_DURATION_METRIC = "gen_ai.client.operation.duration"
TOKEN_USAGE_METRIC = "gen_ai.client.token.usage"
#: The GenAI semantic conventions' bucket boundaries for durations (seconds) ...
DURATION_BUCKETS = [
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
]
#: ... and for token counts.
TOKEN_BUCKETS = [4**power for power in range(14)]


class Metrics:
    """Duration histogram and call counter for every call through this layer."""

    name: ClassVar[str] = "metrics"

    def __init__(
        self, meter_provider: MeterProvider | None = None, *, stage: StageName = "dispatch"
    ) -> None:
        if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
            raise invalid(
                "metrics", "meter_provider", meter_provider, "an OpenTelemetry MeterProvider"
            )
        self.meter_provider = meter_provider
        self.stage = check_stage("metrics", stage)
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("guardstack", VERSION)
        self._duration = meter.create_histogram(
            DURATION_METRIC,
            unit="s",
            description="Duration of tool executions",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._calls = meter.create_counter(
            CALLS_METRIC, unit="{call}", description="Tool executions, by tool and error type"
        )
        self._model_duration = meter.create_histogram(
            MODEL_DURATION_METRIC,
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._tokens = meter.create_histogram(
            TOKEN_USAGE_METRIC,
            unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
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
        attributes = {"gen_ai.tool.name": call.name}
        if error_type is not None:
            attributes["error.type"] = error_type
        self._duration.record(anyio.current_time() - started, attributes)
        self._calls.add(1, attributes)

    async def model_layer(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        """The model-stage layer: operation duration and token usage per model call."""
        started = anyio.current_time()
        attributes = {"gen_ai.operation.name": "chat"}
        model = request_model(request)
        if model is not None:
            attributes["gen_ai.request.model"] = model
        try:
            reply = await call_next(request)
        except BaseException as error:
            is_exception = isinstance(error, Exception)
            code = model_error_code(error) if is_exception else exception_error_type(error)
            self._model_duration.record(
                anyio.current_time() - started, {**attributes, "error.type": code}
            )
            raise
        if isinstance(reply, ModelReply) and reply.model:
            attributes["gen_ai.response.model"] = reply.model
        self._model_duration.record(anyio.current_time() - started, attributes)
        usage = reply.usage if isinstance(reply, ModelReply) else None
        if usage is not None:
            self._tokens.record(usage.input_tokens, {**attributes, "gen_ai.token.type": "input"})
            self._tokens.record(usage.output_tokens, {**attributes, "gen_ai.token.type": "output"})
        return reply

    def apply(self, scope: Scope) -> None:
        """Register on the stage it names."""
        if self.stage == "model":
            scope.use(scope.loop.model_call, self.model_layer, name=self.name)
        else:
            scope.use(scope.tools.dispatch, self)

    def __repr__(self) -> str:
        return "Metrics(stage='model')" if self.stage == "model" else "Metrics()"
