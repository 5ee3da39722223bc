"""What the order of the same layers does to an agent's tool calls: a simulation you can read.

    python -m benchmarks.ordering

1,000 calls to a flaky search tool that declares ``timeout_ms=500``. Each attempt,
independently: 10% hang; the rest answer after a lognormal latency with a median
of 150 ms and a p99 of 2.5 s (so about 1 in 6 attempts is slower than the 500 ms
budget). Every stack sees the same draws (attempt *k* of call *n* behaves the
same under every stack). The caller gives up after 30 s, so a hang without a
timeout costs 30 s.

It is ``guardstack compare`` (``guardstack.cli.compare``) with five built-in
orders of the same three layers: trio's ``MockClock``, seconds of simulated
latency in milliseconds, the same numbers for the same seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from guardstack.cli.compare import Scenario, compare, load_scenario, render
from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.pipeline import Harness
from guardstack.wrappers import Retry, Timeout

ATTEMPTS = 3
SCENARIO: dict[str, Any] = {
    "calls": 1_000,
    "give_up_s": 30,
    "tools": {
        "search": {
            "timeout_ms": 500,
            "latency_ms": {"median": 150, "p99": 2_500},
            "hang_probability": 0.10,
        }
    },
}


def scenario(calls: int | None = None) -> Scenario:
    return load_scenario({**SCENARIO, "calls": calls or SCENARIO["calls"]})


def stacks() -> dict[str, Callable[[], Harness]]:
    """Each stack, outermost first: the same three layers, in different orders."""

    def build(*plugins: Callable[[], Any]) -> Callable[[], Harness]:
        def harness() -> Harness:
            built = Harness()
            for plugin in plugins:
                built.plugin(plugin())
            return built

        return harness

    def retry() -> Retry:
        return Retry(attempts=ATTEMPTS, backoff_ms=100, max_backoff_ms=400, seed=1)

    return {
        "no timeout": build(),
        "policy": build(ToolCallTimeoutPolicy),
        "retry -> policy (per attempt)": build(retry, ToolCallTimeoutPolicy),
        "policy -> retry (whole op)": build(ToolCallTimeoutPolicy, retry),
        "1.2 s total -> retry -> policy": build(
            lambda: Timeout(ms=1200, code="TOTAL_TIMEOUT"), retry, ToolCallTimeoutPolicy
        ),
    }


def main() -> None:
    print(render(compare(list(stacks().items()), scenario(), seed=2026)))
    print(
        f"\n{SCENARIO['calls']:,} calls; per attempt 10% hang, else lognormal latency (median "
        f"150 ms, p99 2.5 s); tool budget 500 ms; retry {ATTEMPTS} attempts, backoff 100 ms "
        "doubling with jitter; the caller gives up at 30 s."
    )


if __name__ == "__main__":
    main()
