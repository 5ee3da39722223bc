"""The seed's behaviours, as every framework test sets them up and reads them back."""

from __future__ import annotations

from typing import Any

import anyio
from opentelemetry.sdk.trace import ReadableSpan

from guardstack.guards import RepeatToolReminder, ToolCallLimit, ToolCallTimeoutPolicy
from guardstack.pipeline import Harness, ToolDefinition
from guardstack.wrappers import Metrics, Retry, Timeout, Tracing
from tests.wrappers.otel import SpanRig

#: A budget declared in the harness for a framework's tool (the framework runs it).
HANG_BUDGET_MS = 2_000
TIMEOUT_TEXT = f"Error: tool call timed out after {HANG_BUDGET_MS}ms"


async def _never(arguments: Any, call: Any) -> str:
    raise AssertionError("guardstack never runs a framework tool's harness definition")


# -- the tools every framework's agent gets (each wraps them its own way) ---------------

#: Arguments ``flaky`` was run with; odd runs hang, even runs answer.
ATTEMPTS: list[str] = []


async def search(query: str, page: int = 1) -> str:
    """Search the notes."""
    return f"results for {query} page {page}"


async def todo(item: str) -> str:
    """Note a to-do item."""
    return "noted"


async def hang(query: str) -> str:
    """Never answers."""
    await anyio.sleep(3600)
    return "never"


async def slow(query: str) -> str:
    """Declares its own 1.5 s budget to the framework."""
    await anyio.sleep(3600)
    return "never"


async def flaky(query: str) -> str:
    """Hangs on its first attempt, answers on the second."""
    ATTEMPTS.append(query)
    if len(ATTEMPTS) % 2 == 1:
        await anyio.sleep(3600)
    return "answered"


def harness(*, cap: int | None = None, rig: SpanRig | None = None) -> Harness:
    """Tracing, the timeout policy, the reminder (``todo`` excluded) and maybe a cap."""
    built = Harness()
    built.tools.register(ToolDefinition("hang", _never, timeout_ms=HANG_BUDGET_MS))
    if rig is not None:
        built.plugin(Tracing(rig.provider))
    built.plugin(ToolCallTimeoutPolicy())
    built.plugin(RepeatToolReminder(exclude=("todo",)))
    if cap is not None:
        built.plugin(ToolCallLimit(per_turn=cap, on_exceeded="end_turn"))
    return built


def traced_harness(rig: SpanRig) -> Harness:
    """Metrics outside a two-attempt retry with a per-attempt 1 s timeout, all traced."""
    built = Harness()
    built.plugin(Tracing(rig.provider))
    built.plugin(Metrics())
    built.plugin(Retry(attempts=2, backoff_ms=0))
    built.plugin(Timeout(ms=1_000))
    return built


def layer_tree(spans: list[ReadableSpan]) -> list[tuple[str, list[str]]]:
    """Each ``execute_tool`` span with its descendants' names, depth first."""
    children: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        if span.parent is not None:
            children.setdefault(span.parent.span_id, []).append(span)

    def below(span: ReadableSpan) -> list[str]:
        found: list[str] = []
        for child in sorted(children.get(span.context.span_id, []), key=_start):
            found.append(child.name)
            found.extend(below(child))
        return found

    roots = sorted((s for s in spans if s.name.startswith("execute_tool")), key=_start)
    return [(root.name, below(root)) for root in roots]


def _start(span: ReadableSpan) -> int:
    return span.start_time or 0


#: What one call of ``flaky`` (hangs once, then answers) looks like under ``traced_harness``.
FLAKY_TREE = ("execute_tool flaky", ["metrics", "retry", "timeout", "timeout"])
