"""What the admission line costs: priority and fair shares against the first-come line
they replaced, in this tree and an older one (before ``wrappers/_line.py``), one run.

Three cases per tree, wall-clock, GC on, each the best of seven interleaved rounds:

* **uncontended** — a ``ConcurrencyLimit(64)`` that never fills: the path every call
  takes when nobody waits (no line is made);
* **contended** — 200 callers through ``ConcurrencyLimit(1, queue=10_000)``, each call
  held for one scheduler turn, so every call joins the line, waits, and is woken;
* **contended, priorities and fair** (this tree only) — the same, with random
  priorities 0–3 and four tenants in weighted turns (``fair=True``).

Each tree runs in its own processes (three each, alternating); the ratio is this tree's
median over the older tree's, with the range over the process pairs.

    git worktree add /tmp/guardstack-fifo <commit before the line>
    python -m benchmarks.queue --before /tmp/guardstack-fifo
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
CALLERS = 200
CALLS_EACH = 25


def measure(mixed: bool = False) -> dict[str, float]:
    """Microseconds per call of each case, in whichever guardstack this process imports."""
    import random

    import anyio

    from guardstack.pipeline import Harness, ToolCall, ToolDefinition
    from guardstack.wrappers import ConcurrencyLimit

    async def held(arguments: object, call: object) -> str:
        await anyio.lowlevel.checkpoint()
        return "ok"

    def harness(limit: ConcurrencyLimit) -> Harness:
        made = Harness()
        made.tools.register(ToolDefinition("work", held))
        made.plugin(limit)
        return made

    draw = random.Random(7)

    def calls(tagged: bool) -> list[list[ToolCall]]:
        if not tagged:
            return [[ToolCall("work", {}, f"c{n}-{k}") for k in range(CALLS_EACH)]
                    for n in range(CALLERS)]  # fmt: skip
        return [
            [
                ToolCall("work", {}, f"c{n}-{k}", priority=draw.randint(0, 3), tenant=f"t{n % 4}")
                for k in range(CALLS_EACH)
            ]
            for n in range(CALLERS)
        ]

    async def run(made: Harness, work: list[list[ToolCall]]) -> float:
        execute = made.tools.execute

        async def caller(mine: list[ToolCall]) -> None:
            for call in mine:
                await execute(call)

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for mine in work:
                group.start_soon(caller, mine)
        return (time.perf_counter() - started) / (CALLERS * CALLS_EACH) * 1e6

    async def rounds() -> dict[str, float]:
        best: dict[str, float] = {}
        for _ in range(7):
            cases = {
                "uncontended": (ConcurrencyLimit(64), False),
                "contended": (ConcurrencyLimit(1, queue=10_000), False),
            }
            if mixed:
                cases["contended, priorities and fair"] = (
                    ConcurrencyLimit(1, queue=10_000, fair=True),
                    True,
                )
            for name, (limit, tagged) in cases.items():
                spent = await run(harness(limit), calls(tagged))
                best[name] = min(best.get(name, spent), spent)
        return best

    return anyio.run(rounds)


def _in_process(tree: Path | None) -> dict[str, float]:
    environment = dict(os.environ)
    if tree is not None:  # import guardstack from the older tree
        links = Path(tempfile.mkdtemp())
        (links / "guardstack").symlink_to(tree.resolve())
        environment["PYTHONPATH"] = f"{links}{os.pathsep}{ROOT}"
    mixed = tree is None
    code = f"import json; from benchmarks.queue import measure; print(json.dumps(measure({mixed})))"
    output = subprocess.run(
        [sys.executable, "-c", code], cwd=str(ROOT), env=environment,
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    result: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older tree's checkout")
    parser.add_argument("--processes", type=int, default=3)
    options = parser.parse_args()
    now: list[dict[str, float]] = []
    before: list[dict[str, float]] = []
    for _ in range(options.processes):
        before.append(_in_process(options.before))
        now.append(_in_process(None))
    print(json.dumps({"before_us": before, "now_us": now}))
    print("| case | before µs/call | now µs/call | now / before |")
    print("|------|----------------|-------------|--------------|")
    for case in now[0]:
        mine = [run[case] for run in now]
        theirs = [run.get(case, run["contended"]) for run in before]
        ratios = [m / t for m, t in zip(mine, theirs, strict=True)]
        print(
            f"| {case} | {statistics.median(theirs):.1f} | {statistics.median(mine):.1f} | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}–{max(ratios):.2f}) |"
        )
    print("\n(the goal: the line at most 1.10x the first-come line it replaced)")


if __name__ == "__main__":
    main()
