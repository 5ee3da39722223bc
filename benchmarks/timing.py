"""Timing helpers for the benchmarks: per-call cost, best of several rounds, in one process.

Results are *ratios* against peers measured in the same run, which is what carries
from one machine to another; absolute nanoseconds are printed for context only.
The garbage collector stays on, as users run: a peer's reference cycles (or ours)
are charged to whoever makes them. ``runs`` repeats a whole measurement so that
each ratio is reported with its run-to-run range, not as one lucky number.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

Operation = Callable[[], Awaitable[Any]]


async def per_call_ns(
    operations: Mapping[str, Operation], *, calls: int = 10_000, rounds: int = 9
) -> dict[str, float]:
    """Nanoseconds per awaited call of each operation: the best of ``rounds`` runs.

    Rounds are interleaved (every operation once per round), so a slow spell of the
    machine — frequency scaling, a neighbour's load — falls on all of them alike
    instead of on whichever happened to be measured then.
    """
    for operation in operations.values():  # warm up caches and specialisations
        for _ in range(min(calls, 2_000)):
            await operation()
    best = dict.fromkeys(operations, float("inf"))
    for _ in range(rounds):
        for name, operation in operations.items():
            started = time.perf_counter_ns()
            for _ in range(calls):
                await operation()
            best[name] = min(best[name], (time.perf_counter_ns() - started) / calls)
    return best


async def runs_of(
    measure: Callable[[], Awaitable[dict[str, float]]], runs: int = 3
) -> list[dict[str, float]]:
    """``measure()`` repeated ``runs`` times (each run builds its stacks afresh)."""
    return [await measure() for _ in range(runs)]


def ratio(
    runs: Sequence[Mapping[str, float]],
    ours: Callable[[Mapping[str, float]], float],
    peer: Callable[[Mapping[str, float]], float],
) -> str:
    """``ours / peer`` per run: the median, and the run-to-run range in brackets."""
    values = [ours(run) / peer(run) for run in runs]
    if len(values) == 1:
        return f"{values[0]:.2f}x"
    return f"{statistics.median(values):.2f}x ({min(values):.2f}–{max(values):.2f})"


def median(
    runs: Sequence[Mapping[str, float]], value: Callable[[Mapping[str, float]], float]
) -> float:
    """The median over runs of one derived number (nanoseconds, for context)."""
    return statistics.median(value(run) for run in runs)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table, so the output pastes into the README as it is."""
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    return "\n".join(lines)


def run_and_report(
    doc: str | None,
    measure: Callable[[], Awaitable[dict[str, float]]],
    report: Callable[[list[dict[str, float]]], str],
    switches: Mapping[str, tuple[str, Callable[[], None]]] | None = None,
) -> None:
    """The command line every per-call benchmark shares: ``--runs N``, then its report.
    ``switches`` maps a flag (``--without-x``) to its help and what it turns off first."""
    import argparse

    import anyio

    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--runs", type=int, default=3)
    for flag, (help_text, _) in (switches or {}).items():
        parser.add_argument(flag, action="store_true", help=help_text)
    arguments = parser.parse_args()
    for flag, (_, turn_off) in (switches or {}).items():
        if getattr(arguments, flag.lstrip("-").replace("-", "_")):
            turn_off()
    print(report(anyio.run(runs_of, measure, arguments.runs)))
