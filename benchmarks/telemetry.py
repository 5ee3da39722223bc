"""What the resilience metrics cost: a guarded call with ``Metrics`` applied, in this
tree and in an older one (before the layers reported their state), in the same run.

The stack is a user's: ``Metrics`` (a real SDK ``MeterProvider`` with an in-memory
reader, collected once a round, so the points are really aggregated), ``Retry``,
``CircuitBreaker``, ``ConcurrencyLimit``, ``RateLimit`` and ``Timeout`` around a tool
that answers at once. Tracing is off (its cost is in ``benchmarks/wrappers.py``).
Each tree runs in its own processes, three of them each, alternating; a process
reports the best of nine interleaved rounds of 10,000 calls, GC on. The ratio is
this tree's median over the older tree's, with the range over the process pairs.

    git worktree add /tmp/guardstack-before <commit>
    python -m benchmarks.telemetry --before /tmp/guardstack-before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).parents[1]


def measure() -> float:
    """Nanoseconds per guarded call, in whichever guardstack this process imports."""
    import anyio
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from benchmarks.timing import per_call_ns
    from guardstack.pipeline import Harness, ToolCall, ToolDefinition
    from guardstack.wrappers import (
        CircuitBreaker,
        ConcurrencyLimit,
        Metrics,
        RateLimit,
        Retry,
        Timeout,
    )

    async def answer(arguments: object, call: object) -> str:
        return "ok"

    reader = InMemoryMetricReader()
    harness = Harness()
    harness.tools.register(ToolDefinition("lookup", answer, timeout_ms=1_000))
    harness.plugin(Metrics(MeterProvider(metric_readers=[reader])))
    harness.plugin(Retry(attempts=3, backoff_ms=0))
    harness.plugin(CircuitBreaker())
    harness.plugin(ConcurrencyLimit(max_concurrent=64))
    harness.plugin(RateLimit(per_second=1e9, burst=1_000_000))
    harness.plugin(Timeout(ms=1_000))
    call = ToolCall("lookup", {}, "c1")
    execute = harness.tools.execute

    async def guarded() -> None:
        await execute(call)

    async def run() -> float:
        result = await per_call_ns({"guarded": guarded})
        reader.get_metrics_data()  # the points were really aggregated
        return result["guarded"]

    return anyio.run(run)


def _in_process(tree: Path | None) -> float:
    environment = dict(os.environ)
    if tree is not None:  # import guardstack from the older tree
        links = Path(tempfile.mkdtemp())
        (links / "guardstack").symlink_to(tree.resolve())
        environment["PYTHONPATH"] = f"{links}{os.pathsep}{ROOT}"
    code = "from benchmarks.telemetry import measure; print(measure())"
    output = subprocess.run(
        [sys.executable, "-c", code], cwd=str(ROOT), env=environment,
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return float(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older tree's checkout")
    parser.add_argument("--processes", type=int, default=3)
    options = parser.parse_args()
    now: list[float] = []
    before: list[float] = []
    for _ in range(options.processes):
        before.append(_in_process(options.before))
        now.append(_in_process(None))
    ratios = [n / b for n, b in zip(now, before, strict=True)]
    print(json.dumps({"before_ns": before, "now_ns": now}))
    print("| tree | ns per guarded call (median) |")
    print("|------|------------------------------|")
    print(f"| before | {statistics.median(before):,.0f} |")
    print(f"| now | {statistics.median(now):,.0f} |")
    print(
        f"\nnow / before: {statistics.median(ratios):.2f}x "
        f"({min(ratios):.2f}–{max(ratios):.2f}) (goal: at most 1.10x)"
    )


if __name__ == "__main__":
    main()
