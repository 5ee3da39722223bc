"""Chaos: faults injected on purpose, reproducibly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from guardstack.pipeline import (
    TOOL_FAILED,
    TOOL_TIMEOUT,
    TOOL_UNAVAILABLE,
    ConfigError,
    Harness,
    ToolResult,
)
from guardstack.pipeline.testing import ScriptedTool
from guardstack.wrappers import (
    Chaos,
    Timeout,
)
from tests.helpers import harness_with, run


async def test_chaos_injects_each_fault() -> None:
    cases: list[tuple[str, Callable[[ToolResult, float], bool]]] = [
        ("latency:250", lambda r, t: r.content == "ok" and t == 0.25),
        ("fail:TOOL_UNAVAILABLE", lambda r, t: r.code == TOOL_UNAVAILABLE),
        (
            "raise",
            lambda r, t: (
                r.code == TOOL_FAILED and r.error is not None and r.error.name == "ChaosError"
            ),
        ),
        ("hang", lambda r, t: r.code == TOOL_TIMEOUT and t == 1.0),
    ]
    for fault, check in cases:
        built = harness_with(ScriptedTool("api"))
        built.plugin(Timeout(ms=1_000))
        built.plugin(Chaos(rate=1.0, fault=fault))
        started = anyio.current_time()
        result = await run(built, "api")
        assert check(result, anyio.current_time() - started), fault


async def test_chaos_at_a_rate_is_repeatable_with_a_seed() -> None:
    def outcomes() -> Any:
        built = harness_with(ScriptedTool("api"))
        built.plugin(Chaos(rate=0.3, fault="fail:TOOL_FAILED", seed=7))
        return built

    first, second = outcomes(), outcomes()
    a = [(await run(first, "api")).is_error for _ in range(50)]
    b = [(await run(second, "api")).is_error for _ in range(50)]
    assert a == b
    assert 5 < sum(a) < 25


@pytest.mark.parametrize(
    ("plugin", "config", "key"),
    [
        ("circuit-breaker", {"failureRatio": 1.5}, "failureRatio"),
        ("concurrency-limit", {"maxConcurrent": 0}, "maxConcurrent"),
        ("rate-limit", {"perSecond": 0}, "perSecond"),
        ("hedge", {"delayMs": -1}, "delayMs"),
        ("chaos", {"rate": 0.5, "fault": "explode"}, "fault"),
        ("fallback", {"to": 3}, "to"),
    ],
)
def test_bad_config_names_the_plugin_key_and_value(
    plugin: str, config: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        Harness().load([{"id": "x", "name": plugin, "config": config}])
    assert plugin in str(raised.value)
    assert key in str(raised.value)
