"""What ``quick_init`` buys: the frozen values built on every call, against attrs' ``__init__``.

    python -m benchmarks.construction

Each value is built the way the loop and the registry build it, once through the
``__init__`` ``quick_init`` generates and once through the one attrs generated for
the same class (kept as ``__init_by_attrs__``), both on a fresh ``object.__new__``
instance so only the ``__init__`` differs. An agent step builds about a dozen such
values (a ``ModelRequest``, a ``ModelReply``, a ``ToolCall`` and its result per call,
the session's events), so the per-value saving times a dozen is what a step gains.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from benchmarks.timing import median, ratio, run_and_report, table
from guardstack.pipeline import (
    Harness,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    ToolCall,
    ToolResult,
    Usage,
)
from guardstack.pipeline.session import AssistantMessage, ToolResultEvent

CALLS = 20_000


def cases() -> dict[str, tuple[type, tuple[Any, ...], dict[str, Any]]]:
    agent = Harness(ScriptedModel([])).loop.create("bench")
    result = ToolResult("ok")
    return {
        "ToolCall": (ToolCall, ("search", {"q": "x"}, "call_1", agent), {}),
        "ToolResult": (ToolResult, ("ok",), {}),
        "ModelRequest": (ModelRequest, (agent, [], []), {}),
        "ModelReply": (ModelReply, ("done",), {"usage": Usage(10, 5)}),
        "ToolResultEvent": (ToolResultEvent, (1, 1, "call_1", result), {}),
        "AssistantMessage": (AssistantMessage, (1, 1, "done"), {}),
    }


def _timed(build: Callable[[], object]) -> float:
    started = time.perf_counter_ns()
    for _ in range(CALLS):
        build()
    return (time.perf_counter_ns() - started) / CALLS


def _builder(
    kind: type, init: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[], object]:
    new = object.__new__

    def build() -> object:
        value: object = new(kind)
        init(value, *args, **kwargs)
        return value

    return build


async def measure() -> dict[str, float]:
    found: dict[str, float] = {}
    for name, (kind, args, kwargs) in cases().items():
        with_quick = _builder(kind, vars(kind)["__init__"], args, kwargs)
        with_attrs = _builder(kind, vars(kind)["__init_by_attrs__"], args, kwargs)
        for build in (with_quick, with_attrs):  # warm up
            _timed(build)
        found[f"{name} quick"] = min(_timed(with_quick) for _ in range(5))
        found[f"{name} attrs"] = min(_timed(with_attrs) for _ in range(5))
        await anyio.lowlevel.checkpoint()
    return found


def _row(runs: list[dict[str, float]], name: str) -> list[str]:
    def quick(run: Mapping[str, float]) -> float:
        return run[f"{name} quick"]

    def by_attrs(run: Mapping[str, float]) -> float:
        return run[f"{name} attrs"]

    return [
        name,
        f"{median(runs, quick):,.0f}",
        f"{median(runs, by_attrs):,.0f}",
        ratio(runs, quick, by_attrs),
    ]


def report(runs: list[dict[str, float]]) -> str:
    names = [key.removesuffix(" quick") for key in runs[0] if key.endswith(" quick")]
    rows = [_row(runs, name) for name in names]
    saved = median(
        runs, lambda run: sum(run[f"{n} attrs"] - run[f"{n} quick"] for n in names) / len(names)
    )
    return (
        table(["value", "quick_init ns", "attrs ns", "quick / attrs"], rows)
        + f"\n\nMedians of {len(runs)} runs (range in brackets); GC on. quick_init saves "
        f"{saved:,.0f} ns a value on average: about {saved * 12 / 1000:.1f} µs an agent step "
        "that builds a dozen."
    )


if __name__ == "__main__":
    run_and_report(__doc__, measure, report)
