"""The telemetry helpers every exporting layer shares: a call's ``error.type``, the model
a request goes to, a provider checked at construction, and telemetry that raises never
changing a call (reported once per kind)."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
from opentelemetry import trace

from guardstack.pipeline import (
    ConfigError,
    Harness,
    ModelRequest,
    ScriptedModel,
    ToolResult,
)
from guardstack.wrappers._otel import (
    check_provider,
    emit_record,
    end_span,
    exception_error_type,
    request_model,
    result_error_type,
    start_span,
)


async def test_error_type_names_the_code_the_kind_or_cancelled() -> None:
    assert result_error_type(ToolResult("ok")) is None
    assert result_error_type(ToolResult.failure("x", code="TOOL_TIMEOUT")) == "TOOL_TIMEOUT"
    assert result_error_type(ToolResult("x", is_error=True)) == "_OTHER"
    assert exception_error_type(KeyError()) == "KeyError"


async def test_a_cancelled_call_is_cancelled_on_both_backends() -> None:
    caught: list[BaseException] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep(1)
        except BaseException as error:
            caught.append(error)
            raise
    assert [exception_error_type(error) for error in caught] == ["cancelled"]


def test_the_request_model_is_the_answering_models_else_the_agents() -> None:
    agent = Harness(ScriptedModel([], model="agent-model")).loop.create("a")
    assert request_model(ModelRequest(agent, [], [])) == "agent-model"
    assert request_model(ModelRequest(agent, [], [], model=ScriptedModel([], model="up"))) == "up"
    assert request_model(ModelRequest(agent, [], [], model=ScriptedModel([]))) is None


def test_a_provider_that_is_none_is_refused_at_construction() -> None:
    assert check_provider("tracing", "tracer_provider", None, "get_tracer") is None
    with pytest.raises(ConfigError, match="an OpenTelemetry TracerProvider"):
        check_provider("tracing", "tracer_provider", "not a provider", "get_tracer")


class _Raising:
    def start_span(self, name: str, **options: Any) -> Any:
        raise RuntimeError("processor broke")


class _Ending:
    def end(self) -> None:
        raise RuntimeError("on_end broke")


def test_telemetry_that_raises_is_reported_once_and_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="guardstack"):
        for _ in range(3):
            assert start_span(_Raising(), "span") is trace.INVALID_SPAN
            end_span(_Ending())  # type: ignore[arg-type]
            emit_record(lambda **record: 1 / 0, body="x")
    said = [record.getMessage() for record in caplog.records]
    for what in ("starting a span", "ending a span", "emitting a log record"):
        assert sum(what in line for line in said) <= 1  # once per kind, ever
