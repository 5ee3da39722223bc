"""Adaptive concurrency against every fixed guess, on a provider whose capacity it never
sees — through the ``compare`` engine, in virtual time.

The provider (``compare``'s provider model): one model-like tool, 400 ms median
latency (p99 1.2 s), capacity 12 concurrent calls — past that it answers 429 with
Retry-After: 1 s, and latency grows with load as an M/M/1 queue's does. 48 callers
each make their calls one after another. Every stack has the same ``Retry`` (6
attempts, rate limits only, honouring Retry-After) outside its limit, so the limit
counts attempts:

* ``AdaptiveConcurrencyLimit`` with ``aimd`` and with ``gradient2`` (initial 4, 1–64);
* ``ConcurrencyLimit`` fixed at 2, 4, 8, 16 and 32 (callers beyond it wait);
* no limit.

Per stack: goodput (successful calls per virtual second), 429s per success, p50 and
p99 latency. Then the same with the capacity halved at 60 s and restored at 120 s
(``--change``); ``--plot FILE`` draws each adaptive limit over time against the
capacity.

    python -m benchmarks.adaptive [--calls 3000] [--change] [--plot limits.png]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from benchmarks.timing import table
from guardstack.cli.compare import StackStats, compare, load_scenario
from guardstack.pipeline import TOOL_RATE_LIMITED, Harness
from guardstack.wrappers import AdaptiveConcurrencyLimit, ConcurrencyLimit, Retry

CAPACITY = 12
FIXED = (2, 4, 8, 16, 32)


#: The provider the table is reported on, and a second one nothing was ever looked at
#: against before it was run (``--provider other``): twice the capacity, twice as slow.
#: ``hardcap``: the provider users met — 429 above four calls in flight, its latency flat
#: up to there (no queueing signal for a latency-based algorithm to read).
PROVIDERS: dict[str, dict[str, Any]] = {
    "main": {"capacity": CAPACITY, "median": 400, "p99": 1200, "callers": 48},
    "other": {"capacity": 24, "median": 800, "p99": 2400, "callers": 96},
    "hardcap": {"capacity": 4, "median": 400, "p99": 800, "callers": 16, "flat": True},
}


def scenario(calls: int, change: bool, provider: str = "main") -> Any:
    shape = PROVIDERS[provider]
    tool: dict[str, Any] = {
        "latency_ms": {"median": shape["median"], "p99": shape["p99"]},
        "capacity": {"concurrent": shape["capacity"], "latency_grows": not shape.get("flat")},
    }
    if change:
        tool["capacity_change"] = [{"at_s": 60, "factor": 0.5}, {"at_s": 120, "factor": 1.0}]
    return load_scenario(
        {
            "calls": calls,
            "concurrency": shape["callers"],
            "give_up_s": 600,
            "tools": {"llm": tool},
        }
    )


def retry() -> Retry:
    return Retry(attempts=6, retry_on=[TOOL_RATE_LIMITED], backoff_ms=200)


def stacks() -> tuple[list[tuple[str, Callable[[], Harness]]], dict[str, Any]]:
    """Each stack's builder, and the adaptive plugins (to read their limits)."""
    adaptive = {
        algorithm: AdaptiveConcurrencyLimit(initial=4, min=1, max=64, algorithm=algorithm)
        for algorithm in ("aimd", "gradient2")
    }

    def with_limit(limit: Any) -> Callable[[], Harness]:
        def build() -> Harness:
            harness = Harness()
            harness.plugin(retry())
            if limit is not None:
                harness.plugin(limit)
            return harness

        return build

    built: list[tuple[str, Callable[[], Harness]]] = [
        (f"adaptive {name}", with_limit(plugin)) for name, plugin in adaptive.items()
    ]
    built += [
        (f"fixed {n}", with_limit(ConcurrencyLimit(max_concurrent=n, queue=10_000))) for n in FIXED
    ]
    built.append(("no limit", with_limit(None)))
    return built, adaptive


def run(
    calls: int, change: bool, provider: str = "main"
) -> tuple[list[StackStats], dict[str, Any]]:
    built, adaptive = stacks()
    plugins = {f"adaptive {name}": plugin for name, plugin in adaptive.items()}
    results = []
    for label, build in built:
        plugin = plugins.get(label)
        watch = (lambda harness, plugin=plugin: plugin.current()) if plugin else None
        played = scenario(calls, change, provider)
        [stats] = compare([(label, build)], played, seed=11, watch=watch)
        results.append(stats)
    return results, adaptive


def render(results: list[StackStats]) -> str:
    rows = [
        [
            stats.config,
            f"{stats.goodput_per_s:.2f}",
            f"{stats.rate_limited_per_success:.2f}",
            f"{stats.p50_ms:,.0f}",
            f"{stats.p99_ms:,.0f}",
            f"{stats.success_rate:.1%}",
        ]
        for stats in results
    ]
    return table(["stack", "goodput /s", "429s / success", "p50 ms", "p99 ms", "success"], rows)


def recovery(results: list[StackStats]) -> str:
    """Goodput in the 30 s after each capacity change, against each window's best fixed."""
    windows = [("halved", 60.0, 90.0), ("restored", 120.0, 150.0)]
    fixed = [stats for stats in results if stats.config.startswith("fixed")]
    rows = []
    for stats in results:
        if not stats.config.startswith("adaptive"):
            continue
        row = [stats.config]
        for _, start, end in windows:
            best = max(f.goodput_between(start, end) for f in fixed)
            mine = stats.goodput_between(start, end)
            row.append(f"{mine:.2f} ({mine / best:.0%} of the best fixed, {best:.2f})")
        rows.append(row)
    return table(["stack", *(f"{name}: first 30 s" for name, _, _ in windows)], rows)


def plot(results: list[StackStats], change: bool, path: str, provider: str = "main") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    drawn, axes = pyplot.subplots(figsize=(9, 4))
    for stats in results:
        if stats.watched:
            times, limits = zip(*stats.watched, strict=True)
            axes.step(times, limits, where="post", label=stats.config)
    end = max((stats.watched[-1][0] for stats in results if stats.watched), default=180)
    capacity = PROVIDERS[provider]["capacity"]
    if change:
        steps = [(0, capacity), (60, capacity / 2), (120, capacity), (end, capacity)]
    else:
        steps = [(0, capacity), (end, capacity)]
    axes.step(*zip(*steps, strict=True), where="post", color="black", linestyle="--",
              label="provider capacity")  # fmt: skip
    axes.set_xlabel("virtual seconds")
    axes.set_ylabel("concurrency limit")
    axes.legend(fontsize="small")
    axes.grid(alpha=0.3)
    drawn.tight_layout()
    drawn.savefig(path, dpi=110)
    pyplot.close(drawn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3_000)
    parser.add_argument("--change", action="store_true", help="halve the capacity at 60 s")
    parser.add_argument("--plot", metavar="FILE")
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="main")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    results, _ = run(options.calls, options.change, options.provider)
    if options.json:
        print(json.dumps([stats.to_dict() for stats in results]))
    else:
        print(render(results))
        if options.change:
            print()
            print(recovery(results))
    if options.plot:
        plot(results, options.change, options.plot, options.provider)


if __name__ == "__main__":
    main()
