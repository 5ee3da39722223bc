"""What the order of the same layers does to an agent's tool calls: a simulation you can read.

    python -m benchmarks.ordering

1,000 calls to a flaky search tool that declares ``timeout_ms=500``. Each attempt,
independently: 75% answer in 50–250 ms, 15% take 1–3 s, 10% hang. Every stack sees
the same draws (attempt *k* of call *n* behaves the same under every stack). The
caller gives up after 30 s, so a hang without a timeout costs 30 s.

Runs on trio's ``MockClock`` (virtual time): seconds of simulated latency take
milliseconds, and the numbers are exact and repeatable.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import attrs
import trio
import trio.testing

from benchmarks.timing import table
from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.pipeline import Harness, ToolCall, ToolDefinition
from guardstack.wrappers import Retry, Timeout

CALLS = 1_000
ATTEMPTS = 3
CALLER_GIVES_UP_S = 30.0


@attrs.frozen
class Draw:
    latency_s: float  # math.inf: hangs


def draws(seed: int = 2026, calls: int = CALLS) -> list[list[Draw]]:
    rng = random.Random(seed)

    def one() -> Draw:
        roll = rng.random()
        if roll < 0.75:
            return Draw(rng.uniform(0.05, 0.25))
        if roll < 0.90:
            return Draw(rng.uniform(1.0, 3.0))
        return Draw(math.inf)

    return [[one() for _ in range(ATTEMPTS)] for _ in range(calls)]


def stacks() -> dict[str, Callable[[], list[Any]]]:
    """Each stack's plugins, outermost first: the same three layers, in different orders."""

    def retry() -> Retry:
        return Retry(attempts=ATTEMPTS, backoff_ms=100, max_backoff_ms=400, seed=1)

    return {
        "no timeout": list,
        "policy": lambda: [ToolCallTimeoutPolicy()],
        "retry -> policy (per attempt)": lambda: [retry(), ToolCallTimeoutPolicy()],
        "policy -> retry (whole op)": lambda: [ToolCallTimeoutPolicy(), retry()],
        "1.2 s total -> retry -> policy": lambda: [
            Timeout(ms=1200, code="TOTAL_TIMEOUT"),
            retry(),
            ToolCallTimeoutPolicy(),
        ],
    }


async def run_stack(plugins: list[Any], plan: list[list[Draw]]) -> dict[str, Any]:
    runs = 0

    async def search(arguments: Mapping[str, Any], call: ToolCall) -> str:
        nonlocal runs
        runs += 1
        draw = plan[int(call.call_id)][call.attempt - 1]
        await anyio.sleep(draw.latency_s)
        return "results"

    harness = Harness()
    harness.tools.register(ToolDefinition("search", search, timeout_ms=500))
    for plugin in plugins:
        harness.plugin(plugin)
    latencies, successes = [], 0
    for index in range(len(plan)):
        started = anyio.current_time()
        with anyio.move_on_after(CALLER_GIVES_UP_S):
            outcome = await harness.tools.execute(ToolCall("search", {"q": "x"}, str(index)))
            successes += not outcome.result.is_error
        latencies.append(anyio.current_time() - started)
    latencies.sort()
    return {
        "success": successes / len(plan),
        "mean": sum(latencies) / len(latencies),
        "p95": latencies[int(0.95 * len(latencies))],
        "max": latencies[-1],
        "runs": runs / len(plan),
    }


def main() -> None:
    plan = draws()
    rows = []
    for name, plugins in stacks().items():
        clock = trio.testing.MockClock(autojump_threshold=0)
        stats = trio.run(run_stack, plugins(), plan, clock=clock)
        rows.append(
            [
                name,
                f"{stats['success']:.1%}",
                f"{stats['mean']:.2f} s",
                f"{stats['p95']:.2f} s",
                f"{stats['max']:.2f} s",
                f"{stats['runs']:.2f}",
            ]
        )
    print(
        table(
            [
                "stack (outermost first)",
                "answered",
                "mean latency",
                "p95",
                "worst",
                "tool runs per call",
            ],
            rows,
        )
    )
    print(
        f"\n{CALLS} calls; per attempt 75% fast, 15% slow (1-3 s), 10% hang; tool budget "
        f"500 ms; retry {ATTEMPTS} attempts, backoff 100 ms doubling with jitter; "
        f"the caller gives up at {CALLER_GIVES_UP_S:.0f} s."
    )


if __name__ == "__main__":
    main()
