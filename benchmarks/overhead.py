"""Per-call overhead of the onion, against a bare await and a hand-written closure onion.

    python -m benchmarks.overhead

Measures, in one run on asyncio: ``await tool()`` (the floor), a hand-written onion
of closures ``depth`` deep, and ``registry.execute`` with ``depth`` pass-through
dispatch layers, for depth 0, 1, 5 and 10. Goals: each pass-through layer costs at
most 2x a hand-written closure layer; an empty ``registry.execute`` at most 25x a
bare await. Also the model-call stage: an empty ``model_call`` stage as the loop
runs it each step (building the ``ModelRequest`` included) against calling the
model directly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from benchmarks.timing import Operation, median, per_call_ns, ratio, run_and_report, table
from guardstack.pipeline import (
    AgentLoop,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolDefinition,
    ToolRegistry,
)

DEPTHS = (0, 1, 5, 10)


async def tool(arguments: Any, call: Any) -> str:
    return "ok"


async def passthrough(call: ToolCall, call_next: Callable[[ToolCall], Awaitable[Any]]) -> Any:
    return await call_next(call)


def closure_onion(depth: int) -> Callable[[ToolCall], Awaitable[Any]]:
    async def innermost(call: ToolCall) -> Any:
        return await tool(call.arguments, call)

    chain: Callable[[ToolCall], Awaitable[Any]] = innermost
    for _ in range(depth):

        def wrap(
            inner: Callable[[ToolCall], Awaitable[Any]],
        ) -> Callable[[ToolCall], Awaitable[Any]]:
            async def layer(call: ToolCall) -> Any:
                return await inner(call)

            return layer

        chain = wrap(chain)
    return chain


async def measure() -> dict[str, float]:
    call = ToolCall("t", {"q": "x"}, "c1")
    operations: dict[str, Operation] = {"bare await": partial(tool, call.arguments, call)}
    for depth in DEPTHS:
        operations[f"closures {depth}"] = partial(closure_onion(depth), call)
        registry = ToolRegistry()
        registry.register(ToolDefinition("t", tool))
        for _ in range(depth):
            registry.dispatch.use(passthrough)
        operations[f"execute {depth}"] = partial(registry.execute, call)
    loop = AgentLoop(ToolRegistry(), _Model())
    agent = loop.create("s")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]

    async def through_the_stage() -> ModelReply:
        reply: ModelReply = await loop.model_call.entry(ModelRequest(agent, messages, []))
        return reply

    operations["model: direct"] = partial(agent.model.complete, messages, [])
    operations["model: empty model_call stage"] = through_the_stage
    return await per_call_ns(operations)


class _Model:
    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return _REPLY


_REPLY = ModelReply("ok")


def report(runs: list[dict[str, float]]) -> str:
    rows = []
    for depth in DEPTHS:
        closures, execute = f"closures {depth}", f"execute {depth}"
        per_layer = "—"
        if depth:

            def ours(run: Mapping[str, float], depth: int = depth) -> float:
                return (run[f"execute {depth}"] - run["execute 0"]) / depth

            def theirs(run: Mapping[str, float], depth: int = depth) -> float:
                return (run[f"closures {depth}"] - run["closures 0"]) / depth

            per_layer = ratio(runs, ours, theirs)
        rows.append(
            [
                str(depth),
                ratio(runs, _of(closures), _of("bare await")),
                ratio(runs, _of(execute), _of("bare await")),
                per_layer,
                f"{median(runs, _of(execute)):,.0f}",
            ]
        )
    deepest = DEPTHS[-1]

    def slope_ours(run: Mapping[str, float]) -> float:
        return run[f"execute {deepest}"] - run["execute 0"]

    def slope_theirs(run: Mapping[str, float]) -> float:
        return run[f"closures {deepest}"] - run["closures 0"]

    return "\n".join(
        [
            table(
                [
                    "layers",
                    "closure onion / bare",
                    "registry.execute / bare",
                    "per layer: ours / closure",
                    "execute ns/call",
                ],
                rows,
            ),
            "",
            f"Medians of {len(runs)} runs, ranges in brackets; GC on. Per layer over "
            f"0..{deepest} layers: {ratio(runs, slope_ours, slope_theirs)} a closure layer "
            "(goal <= 2x; the depth-1 ratio is the difference of two close numbers and noisy). "
            f"Empty execute: {ratio(runs, _of('execute 0'), _of('bare await'))} a bare await "
            "(goal <= 25x).",
            f"An empty model_call stage, request built: "
            f"{median(runs, _of('model: empty model_call stage')):,.0f} ns against "
            f"{median(runs, _of('model: direct')):,.0f} ns calling the model directly, "
            f"{ratio(runs, _of('model: empty model_call stage'), _of('model: direct'))}.",
        ]
    )


def _of(name: str) -> Callable[[Mapping[str, float]], float]:
    return lambda run: run[name]


def _attrs_init() -> None:
    """Every ``quick_init`` class back on attrs' own ``__init__`` (what removing it costs)."""
    from guardstack.pipeline.frozen import _TWINS

    for kind in _TWINS:
        type.__setattr__(kind, "__init__", vars(kind)["__init_by_attrs__"])


def _public_anyio() -> None:
    """``runtime`` on anyio's public calls only: no read of its asyncio backend's state."""
    from guardstack.pipeline import runtime

    runtime._STATES = runtime._SCOPE = None


SWITCHES: Mapping[str, tuple[str, Callable[[], None]]] = {
    "--without-quick-init": ("attrs' own __init__ for every value", _attrs_init),
    "--public-anyio": ("anyio's public scope and cancel calls only", _public_anyio),
}


def main() -> None:
    run_and_report(__doc__, measure, report, SWITCHES)


if __name__ == "__main__":
    main()
