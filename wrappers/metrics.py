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
metrics around each model call, as the current GenAI conventions name them (every
point with ``gen_ai.operation.name=chat``, ``gen_ai.provider.name`` — the model's
``provider``, ``_OTHER`` when it names none — ``gen_ai.request.model`` and
``gen_ai.response.model``):

* ``gen_ai.client.operation.duration`` (seconds; ``error.type`` = the ``ModelError``
  code on failure);
* the token counters ``gen_ai.client.inference.usage.input_tokens``,
  ``.output_tokens``, and their subsets ``.cache_read.input_tokens``,
  ``.cache_write.input_tokens`` and ``.reasoning.output_tokens``, with
  ``gen_ai.token.modality=unknown`` (a reply's usage does not say which modality)
  — the totals and rates to compute cost from;
* the per-operation histograms ``gen_ai.client.inference.operation.input_tokens`` and
  ``.output_tokens`` (percentiles only);
* and, until 0.3, the name these replaced: ``gen_ai.client.token.usage`` (one point
  each for ``gen_ai.token.type`` ``input`` and ``output``); ``legacy_token_usage=False``
  leaves it out now.

Outside a model-stage ``Retry`` a point is a whole operation; inside, an attempt.

Durations use ``anyio.current_time()``, so they are exact in virtual time.
Cancellation always propagates; the point is recorded on the way out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic

import anyio
from opentelemetry import metrics
from opentelemetry.metrics import MeterProvider

from guardstack.pipeline.contract import (
    MODEL,
    ItemT,
    ModelReply,
    ModelRequest,
    Next,
    Scope,
    StageAdapter,
    StageAnswerT,
    StageCallT,
    ValueT,
    adapter_for,
    stage_of,
)
from guardstack.pipeline.validate import StageName, invalid
from guardstack.pipeline.values import ToolCall, ToolResult
from guardstack.wrappers._keyed import register, stage_repr
from guardstack.wrappers._otel import (
    OTHER,
    VERSION,
    check_provider,
    exception_error_type,
    provider_name,
    request_model,
)

__all__ = [
    "CALLS_METRIC",
    "DURATION_METRIC",
    "MODEL_DURATION_METRIC",
    "OPERATION_HISTOGRAMS",
    "TOKEN_USAGE_METRIC",
    "USAGE_COUNTERS",
    "Metrics",
]

DURATION_METRIC = "gen_ai.execute_tool.duration"
CALLS_METRIC = "guardstack.tool.calls"
MODEL_DURATION_METRIC = "gen_ai.client.operation.duration"
TOKEN_USAGE_METRIC = "gen_ai.client.token.usage"
#: The GenAI conventions' token counters, by which of a reply's counts each adds.
USAGE_COUNTERS = {
    "gen_ai.client.inference.usage.input_tokens": "input_tokens",
    "gen_ai.client.inference.usage.output_tokens": "output_tokens",
    "gen_ai.client.inference.usage.cache_read.input_tokens": "cached_input_tokens",
    "gen_ai.client.inference.usage.cache_write.input_tokens": "cache_write_tokens",
    "gen_ai.client.inference.usage.reasoning.output_tokens": "reasoning_tokens",
}
#: ... and its per-operation histograms.
OPERATION_HISTOGRAMS = {
    "gen_ai.client.inference.operation.input_tokens": "input_tokens",
    "gen_ai.client.inference.operation.output_tokens": "output_tokens",
}
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


class Metrics(Generic[StageCallT, StageAnswerT]):
    """Duration histogram and call counter for every call through this layer (typed for
    the model stage when built with ``stage=MODEL``, as ``Retry`` is)."""

    name: ClassVar[str] = "metrics"

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        *,
        stage: StageAdapter[StageCallT, StageAnswerT, Any] | str = "dispatch",
        legacy_token_usage: bool = True,
    ) -> None:
        self.meter_provider = check_provider(
            "metrics", "meter_provider", meter_provider, "get_meter"
        )
        self.stage: StageName = stage_of("metrics", stage)
        if not isinstance(legacy_token_usage, bool):
            raise invalid("metrics", "legacy_token_usage", legacy_token_usage, "true or false")
        self.legacy_token_usage = legacy_token_usage
        self._stage: StageAdapter[Any, Any, Any] = adapter_for(self.stage)
        # What a point records differs by stage (the GenAI tool metrics, or its client
        # metrics); how a call is measured does not.
        self._points: Callable[[Any, float, Any, str | None], None] = (
            self._model_points if self._stage is MODEL else self._tool_points
        )
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
            description="Number of input and output tokens used (deprecated: "
            "gen_ai.client.inference.usage.*)",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self._usage = [
            (meter.create_counter(name, unit="{token}", description=f"Tokens used: {field}"),
             field)
            for name, field in USAGE_COUNTERS.items()
        ]  # fmt: skip
        self._per_operation = [
            (
                meter.create_histogram(
                    name,
                    unit="{token}",
                    description=f"Tokens used per operation: {field}",
                    explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
                ),
                field,
            )
            for name, field in OPERATION_HISTOGRAMS.items()
        ]

    def __call__(
        self, call: StageCallT, call_next: Callable[[StageCallT], Awaitable[StageAnswerT]]
    ) -> Awaitable[StageAnswerT]:
        """Used directly as a layer (``registry.dispatch.use(Metrics())``)."""
        return self._layer(call, call_next)

    def apply(self, scope: Scope) -> None:
        """Register on the stage it names; the harness's resilience metrics (breakers,
        limiters, retries…) report through this meter provider from now on."""
        if self.meter_provider is not None:
            scope.signals.bind(self.meter_provider)
        register(scope, self.stage, self._layer, self.name)

    async def _layer(self, item: ItemT, call_next: Next[ItemT, ValueT]) -> ValueT:
        """The layer on either stage: time the inner chain, record one point."""
        stage: StageAdapter[ItemT, ValueT, Any] = self._stage
        started = anyio.current_time()
        try:
            outcome = await stage.attempt(call_next, item)
        except BaseException as error:  # cancelled from outside
            self._points(item, anyio.current_time() - started, None, exception_error_type(error))
            raise
        failed = stage.failure_of(outcome)  # a code, on either stage; ``_OTHER`` for none
        error_type = None if failed is None else failed.code or OTHER
        self._points(item, anyio.current_time() - started, outcome, error_type)
        return stage.deliver(outcome)

    def _tool_points(
        self, call: ToolCall, seconds: float, result: ToolResult | None, error_type: str | None
    ) -> None:
        attributes = {"gen_ai.tool.name": call.name}
        if error_type is not None:
            attributes["error.type"] = error_type
        self._duration.record(seconds, attributes)
        self._calls.add(1, attributes)

    def _model_points(
        self, request: ModelRequest, seconds: float, reply: object, error_type: str | None
    ) -> None:
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_name(request),
        }
        model = request_model(request)
        if model is not None:
            attributes["gen_ai.request.model"] = model
        if error_type is not None:
            self._model_duration.record(seconds, {**attributes, "error.type": error_type})
            return
        if isinstance(reply, ModelReply) and reply.model:
            attributes["gen_ai.response.model"] = reply.model
        self._model_duration.record(seconds, attributes)
        usage = reply.usage if isinstance(reply, ModelReply) else None
        if usage is None:
            return
        for histogram, field in self._per_operation:
            histogram.record(getattr(usage, field), attributes)
        counted = {**attributes, "gen_ai.token.modality": "unknown"}
        for counter, field in self._usage:
            counter.add(getattr(usage, field), counted)
        if self.legacy_token_usage:
            self._tokens.record(usage.input_tokens, {**attributes, "gen_ai.token.type": "input"})
            self._tokens.record(usage.output_tokens, {**attributes, "gen_ai.token.type": "output"})

    def __repr__(self) -> str:
        return f"Metrics({stage_repr(self.stage).lstrip(', ')})"
