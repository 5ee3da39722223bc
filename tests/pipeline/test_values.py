"""Values: validation at construction, and the seed's wire shapes."""

from __future__ import annotations

from typing import Any

import pytest

from guardstack.pipeline import (
    MAX_TIMEOUT_MS,
    TOOL_TIMEOUT,
    ConfigError,
    GuardstackError,
    MessageSource,
    ToolDefinition,
    ToolError,
    ToolResult,
    timeout_result,
)


async def noop(arguments: Any, call: Any) -> str:
    return "ok"


@pytest.mark.parametrize("bad", [0, -1, 1.5, 100.0, True, "100", MAX_TIMEOUT_MS + 1, float("inf")])
def test_tool_budget_must_be_a_positive_whole_number_of_milliseconds(bad: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        ToolDefinition("web_fetch", noop, timeout_ms=bad)
    message = str(raised.value)
    assert "tool 'web_fetch'" in message
    assert "timeout_ms" in message
    assert repr(bad) in message
    assert raised.value.key == "timeout_ms"
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value, GuardstackError)


@pytest.mark.parametrize("good", [1, 5_000, MAX_TIMEOUT_MS])
def test_valid_budgets_are_kept(good: int) -> None:
    assert ToolDefinition("t", noop, timeout_ms=good).timeout_ms == good


@pytest.mark.parametrize("bad", ["", "  ", None, 3])
def test_tool_name_must_be_a_non_empty_string(bad: Any) -> None:
    with pytest.raises(ConfigError, match="name"):
        ToolDefinition(bad, noop)


def test_execute_must_be_callable() -> None:
    with pytest.raises(ConfigError, match="execute"):
        ToolDefinition("t", "not callable")  # type: ignore[arg-type]


def test_schema_is_the_openai_function_shape_with_only_name_description_parameters() -> None:
    parameters = {"type": "object", "properties": {"q": {"type": "string"}}}
    tool = ToolDefinition("grep", noop, "search files", parameters, timeout_ms=10)
    assert tool.schema() == {
        "type": "function",
        "function": {"name": "grep", "description": "search files", "parameters": parameters},
    }
    assert ToolDefinition("bare", noop).schema()["function"]["parameters"] == {
        "type": "object",
        "properties": {},
    }


def test_error_result_wire_shape_matches_the_seed() -> None:
    result = ToolResult.failure("boom", name="ValueError", code="TOOL_FAILED")
    assert result.to_dict() == {
        "isError": True,
        "error": {"message": "boom", "info": {"name": "ValueError", "code": "TOOL_FAILED"}},
        "content": "Error: boom",
    }


def test_info_holds_only_the_keys_that_are_set() -> None:
    assert ToolResult.failure("x", code="C").to_dict()["error"] == {
        "message": "x",
        "info": {"code": "C"},
    }
    assert ToolResult.failure("x").to_dict()["error"] == {"message": "x"}
    assert ToolResult("fine").to_dict() == {"isError": False, "content": "fine"}


def test_the_timeout_result_is_exactly_the_seeds() -> None:
    result = timeout_result(250, TOOL_TIMEOUT)
    assert result.content == "Error: tool call timed out after 250ms"
    assert result.is_error
    assert result.error == ToolError(
        "tool call timed out after 250ms", "ToolTimeoutError", "TOOL_TIMEOUT"
    )


def test_results_round_trip_through_the_wire_shape() -> None:
    for result in (
        ToolResult("ok"),
        ToolResult.failure("m", name="N", code="C"),
        ToolResult.failure("m"),
    ):
        assert ToolResult.from_dict(result.to_dict()) == result


def test_values_render_as_json_and_strings_as_themselves() -> None:
    assert ToolResult.of("plain").content == "plain"
    assert ToolResult.of({"ünï": [1, 2.5, None]}).content == '{"ünï": [1, 2.5, null]}'


def test_message_source_kind_is_checked() -> None:
    with pytest.raises(ConfigError, match="kind"):
        MessageSource("robot")  # type: ignore[arg-type]
