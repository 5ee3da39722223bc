"""What shadow mode costs: each layer in shadow against the same layer enforcing, on the
calls it lets through (the usual case: a breaker closed, a limit with room, a cap not
reached), and on calls it would stop (the shadow then records a decision and runs the
call; the enforcing layer answers at once, so that row says what recording costs, not
a ratio to aim at).

Per layer: ns per guarded call through ``registry.execute`` (a tool that answers at
once), in memory, the best of nine interleaved rounds of 10,000 calls, three runs; the
ratio shadow / enforcing with its run-to-run range. The goal: at most 1.05x on the
calls let through.

    python -m benchmarks.shadow
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import anyio
import attrs

from benchmarks.timing import Operation, per_call_ns, ratio, runs_of
from guardstack.guards import ToolCallLimit
from guardstack.pipeline import Harness, ToolCall, ToolDefinition
from guardstack.wrappers import CircuitBreaker, ConcurrencyLimit, RateLimit

#: Each layer as it lets a call through.
LET_THROUGH: dict[str, Callable[[], Any]] = {
    "CircuitBreaker": lambda: CircuitBreaker(),
    "ConcurrencyLimit": lambda: ConcurrencyLimit(64),
    "RateLimit": lambda: RateLimit(1e12, burst=10**9),
    "ToolCallLimit": lambda: ToolCallLimit(per_tool={"t": 10**12}),
}


async def answer(arguments: Any = None, call: Any = None) -> str:
    return "ok"


def guarded(layer: Any) -> Operation:
    harness = Harness()
    harness.tools.register(ToolDefinition("t", answer))
    harness.plugin(layer)
    call = ToolCall("t", {}, "c1", conversation="bench")
    execute = harness.tools.execute
    return lambda: execute(call)


async def measure() -> dict[str, float]:
    operations: dict[str, Operation] = {}
    for name, make in LET_THROUGH.items():
        operations[f"{name} enforcing"] = guarded(make())
        operations[f"{name} shadow"] = guarded(attrs.evolve(make(), shadow=True))
    return await per_call_ns(operations)


def _field(name: str) -> Callable[[Mapping[str, float]], float]:
    return lambda run: run[name]


def main() -> None:
    runs = anyio.run(runs_of, measure)
    print("| layer | enforcing ns | shadow ns | shadow / enforcing |")
    print("|-------|--------------|-----------|--------------------|")
    for name in LET_THROUGH:
        enforcing = min(run[f"{name} enforcing"] for run in runs)
        shadow = min(run[f"{name} shadow"] for run in runs)
        ratios = ratio(runs, _field(f"{name} shadow"), _field(f"{name} enforcing"))
        print(f"| {name} | {enforcing:,.0f} | {shadow:,.0f} | {ratios} |")
    print("\n(the calls let through; the goal: at most 1.05x)")


if __name__ == "__main__":
    main()
