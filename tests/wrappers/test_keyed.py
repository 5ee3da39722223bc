"""What every keyed layer shares: the codes it counts (``on=`` replaces, ``extra_on=``
adds), checked against its stage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from guardstack.pipeline import (
    TOOL_UNAVAILABLE,
    ConfigError,
    ToolError,
    ToolResult,
)
from guardstack.pipeline.testing import Reply, ScriptedTool
from guardstack.wrappers import (
    CircuitBreaker,
    Fallback,
    Retry,
)
from tests.helpers import harness_with, run


@pytest.mark.parametrize(
    ("layer", "meant"),
    [
        (lambda: Retry(stage="model", retry_on=["RATE_LIMITED"]), "MODEL_RATE_LIMITED"),
        (lambda: Retry(retry_on=["MODEL_TIMEOUT"]), "TOOL_TIMEOUT"),
        (lambda: CircuitBreaker(stage="model", on=["TOOL_FAILED"]), "MODEL_FAILED"),
        (lambda: Fallback("mirror", on=["UNAVAILABLE"]), "TOOL_UNAVAILABLE"),
    ],
)
def test_a_code_the_stage_never_gives_is_refused_naming_the_one_it_does(
    layer: Callable[[], Any], meant: str
) -> None:
    with pytest.raises(ConfigError, match=f"did you mean '{meant}'"):
        layer()
    assert Retry(retry_on=["TOOL_TIMEOUT", "MY_OWN_CODE"]).retry_on  # a tool's own code: fine


@pytest.mark.parametrize(
    "layer",
    [
        lambda: CircuitBreaker(extra_on=["MODEL_TIMEOUT"]),
        lambda: Fallback("mirror", stage="model", extra_on=["TOOL_FAILED"]),
    ],
)
def test_extra_on_is_checked_against_the_stage_as_on_is(layer: Callable[[], Any]) -> None:
    with pytest.raises(ConfigError, match="extra_on"):
        layer()


def test_on_replaces_the_defaults_and_extra_on_adds_to_them() -> None:
    """One rule in every layer: ``on=`` replaces a layer's codes, ``extra_on=`` adds."""
    default = CircuitBreaker().on
    assert CircuitBreaker(on=["MY_CODE"]).on == {"MY_CODE"}
    assert CircuitBreaker(extra_on=["MY_CODE"]).on == default | {"MY_CODE"}
    assert CircuitBreaker(on=["TOOL_FAILED"], extra_on=["MY_CODE"]).on == {
        "TOOL_FAILED",
        "MY_CODE",
    }
    assert Fallback("mirror", extra_on=["TOOL_DENIED"]).on == Fallback("mirror").on | {
        "TOOL_DENIED"
    }


async def test_a_breaker_with_extra_on_opens_on_the_added_code() -> None:
    busy = ToolResult("Error: busy", True, ToolError("busy", "Busy", "TOOL_BUSY"))
    refusing = ScriptedTool("search", [Reply(busy)])
    plain, extended = harness_with(refusing), harness_with(refusing)
    plain.plugin(CircuitBreaker(minimum_calls=2, failure_ratio=1.0))
    extended.plugin(CircuitBreaker(minimum_calls=2, failure_ratio=1.0, extra_on=["TOOL_BUSY"]))
    for _ in range(2):
        await run(plain, "search")
        await run(extended, "search")
    assert (await run(plain, "search")).code == "TOOL_BUSY"  # not a code it counts
    assert (await run(extended, "search")).code == TOOL_UNAVAILABLE
