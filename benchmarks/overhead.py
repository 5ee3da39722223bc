"""Per-call overhead of the onion, against a bare await and a hand-written closure onion.

    python -m benchmarks.overhead

Measures, in one run on asyncio: ``await tool()`` (the floor), a hand-written onion
of closures ``depth`` deep, and ``registry.execute`` with ``depth`` pass-through
dispatch layers, for depth 0, 1, 5 and 10. Goals: each pass-through layer costs at
most 2x a hand-written closure layer; an empty ``registry.execute`` at most 25x a
bare await.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio

from benchmarks.timing import Operation, per_call_ns, table
from guardstack.pipeline import ToolCall, ToolDefinition, ToolRegistry

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
    return await per_call_ns(operations)


def report(results: dict[str, float]) -> str:
    bare = results["bare await"]
    rows = []
    for depth in DEPTHS:
        closures, execute = results[f"closures {depth}"], results[f"execute {depth}"]
        per_layer = "—"
        if depth:
            ours = (execute - results["execute 0"]) / depth
            theirs = (closures - results["closures 0"]) / depth
            per_layer = f"{ours / theirs:.2f}x"
        rows.append(
            [
                str(depth),
                f"{closures / bare:.1f}x",
                f"{execute / bare:.1f}x",
                per_layer,
                f"{execute:,.0f}",
            ]
        )
    deepest = DEPTHS[-1]
    slope = (results[f"execute {deepest}"] - results["execute 0"]) / (
        results[f"closures {deepest}"] - results["closures 0"]
    )
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
            f"bare await: {bare:,.0f} ns/call. Per layer over 0..{deepest} layers: {slope:.2f}x a "
            "closure layer (goal <= 2x; the depth-1 ratio is the difference of two close numbers "
            f"and noisy). Empty execute: {results['execute 0'] / bare:.1f}x a bare await "
            "(goal <= 25x).",
        ]
    )


def main() -> None:
    print(report(anyio.run(measure)))


if __name__ == "__main__":
    main()
