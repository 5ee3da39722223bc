"""Mutation testing of the core (cosmic-ray): does a test fail when the code is wrong?

Each mutant is one small change cosmic-ray's operators make to one module — ``<`` for
``<=``, ``+`` for ``-``, ``True`` for ``False``, a number off by one, a ``break`` for a
``continue`` — and the module's own tests run against it (``-x``: the first failure
kills it). A mutant the tests let pass *survives*: a behaviour nothing checks, or a
change that means nothing (an equivalent mutant; ``docs/testing.md`` lists those).

    python .ci/mutation_sample.py --sample 40 [--seed N] [--floor 0.75]   # CI
    python .ci/mutation_sample.py --all --out build/mutation              # make mutation

The modules: the outcome core, the store and ledger, every resilience layer and every
cap (``TARGETS``). ``--sample N`` tests N mutants drawn at random across them and fails
when the share killed falls below ``--floor`` (the score recorded in
``docs/testing.md``, less the sampling margin); ``--all`` tests every mutant and writes
a report per module.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST = f"{sys.executable} -m pytest -x -q -p no:cacheprovider --no-header"

#: Each mutated module, and the tests that must kill its mutants.
TARGETS: dict[str, list[str]] = {
    "pipeline/outcome.py": [
        "tests/wrappers/test_circuit_breaker.py", "tests/wrappers/test_concurrency_limit.py",
        "tests/wrappers/test_fallback.py", "tests/wrappers/test_keyed.py",
        "tests/wrappers/test_hedge.py", "tests/wrappers/test_chaos.py",
        "tests/pipeline/test_model.py", "tests/pipeline/test_outcome.py",
        "tests/wrappers/test_retry.py",
    ],
    "pipeline/ledger.py": [
        "tests/pipeline/test_ledger.py", "tests/guards/test_ledger_defects.py",
        "tests/guards/test_usage_limit.py", "tests/wrappers/test_token_rate_limit.py",
    ],
    "pipeline/store.py": [
        "tests/wrappers/test_circuit_breaker.py", "tests/wrappers/test_concurrency_limit.py",
        "tests/wrappers/test_rate_limit.py", "tests/wrappers/test_corners.py",
        "tests/pipeline/test_control.py",
        "tests/pipeline/test_store.py",
    ],
    "pipeline/keys.py": ["tests/pipeline/test_keys.py"],
    "wrappers/timeout.py": ["tests/wrappers/test_timeout.py"],
    "wrappers/retry.py": [
        "tests/wrappers/test_retry.py", "tests/wrappers/test_idempotency.py",
    ],
    "wrappers/circuit_breaker.py": [
        "tests/wrappers/test_circuit_breaker.py", "tests/wrappers/test_keyed.py",
        "tests/wrappers/test_corners.py", "tests/wrappers/test_fallback.py",
        "tests/pipeline/test_control.py",
        "tests/pipeline/test_signals.py",
    ],
    "wrappers/concurrency_limit.py": [
        "tests/wrappers/test_concurrency_limit.py", "tests/wrappers/test_corners.py",
        "tests/pipeline/test_control.py",
        "tests/guards/test_ledger_defects.py",
    ],
    "wrappers/adaptive_concurrency_limit.py": [
        "tests/wrappers/test_adaptive_concurrency_limit.py", "tests/guards/test_ledger_defects.py",
    ],
    "wrappers/rate_limit.py": [
        "tests/wrappers/test_rate_limit.py", "tests/wrappers/test_corners.py",
        "tests/guards/test_ledger_defects.py",
    ],
    "wrappers/fallback.py": ["tests/wrappers/test_fallback.py", "tests/wrappers/test_keyed.py"],
    "wrappers/hedge.py": [
        "tests/wrappers/test_hedge.py", "tests/wrappers/test_concurrency_limit.py",
        "tests/wrappers/test_corners.py",
    ],
    "guards/tool_call_limit.py": [
        "tests/guards/test_tool_call_limit.py", "tests/guards/test_conversations.py",
        "tests/guards/test_approval.py", "tests/pipeline/test_control.py",
        "tests/pipeline/test_corners.py",
    ],
    "guards/model_call_limit.py": [
        "tests/guards/test_model_call_limit.py", "tests/pipeline/test_control.py",
    ],
    "guards/usage_limit.py": [
        "tests/guards/test_model_call_limit.py", "tests/guards/test_usage_limit.py",
        "tests/guards/test_ledger_defects.py",
    ],
    "guards/agent_limit.py": ["tests/pipeline/test_tree.py", "tests/guards/test_agent_limit.py"],
    "guards/_accounts.py": [
        "tests/guards/test_model_call_limit.py", "tests/guards/test_tool_call_limit.py",
    ],
}  # fmt: skip
TIMEOUT_S = 120.0


def _annotations(module: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where ``module``'s annotations are: every guardstack module starts with ``from
    __future__ import annotations``, so an annotation is never evaluated and a mutant
    inside one (``str | None`` to ``str & None``) is equivalent by construction."""
    import ast

    tree = ast.parse((ROOT / module).read_text("utf-8"))
    spans = []
    for node in ast.walk(tree):
        found: list[ast.expr | None] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(node.returns)
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            found.extend(argument.annotation for argument in every)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
        for annotation in found:
            if annotation is not None and annotation.end_lineno is not None:
                spans.append(
                    (
                        (annotation.lineno, annotation.col_offset),
                        (annotation.end_lineno, annotation.end_col_offset or 0),
                    )
                )
    return spans


def mutants(module: str, work: Path) -> list[object]:
    """Every mutation cosmic-ray's core operators make in ``module``, but those inside
    an annotation (see ``_annotations``)."""
    from cosmic_ray.commands.init import init
    from cosmic_ray.work_db import WorkDB, use_db

    database = work / f"{module.replace('/', '_')}.sqlite"
    with use_db(str(database), WorkDB.Mode.create) as db:
        init([ROOT / module], db, {})  # every operator that takes no arguments
        spans = _annotations(module)
        found = []
        for item in db.pending_work_items:
            for mutation in item.mutations:
                at = (mutation.start_pos[0], mutation.start_pos[1])
                if not any(start <= at < end for start, end in spans):
                    found.append(mutation)
        return found


def test(module: str, mutation: object) -> tuple[str, str]:
    """``killed``, ``survived`` or ``incompetent`` (the mutant does not import), and the diff."""
    from cosmic_ray.mutating import mutate_and_test

    command = f"{PYTEST} {' '.join(TARGETS[module])}"
    result = mutate_and_test([mutation], command, TIMEOUT_S)
    outcome = result.test_outcome.value if result.test_outcome is not None else "incompetent"
    return str(outcome), result.diff or ""


def _stop_cleanly(signum: int, frame: object) -> None:
    """A mutant is applied to the working tree while its tests run: a termination is
    raised as an interrupt, so cosmic-ray's context manager puts the file back."""
    raise KeyboardInterrupt


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _stop_cleanly)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=0)
    parser.add_argument("--all", action="store_true")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the sample's seed (default: drawn from the commit, so a run is repeatable)",
    )
    parser.add_argument("--floor", type=float, default=0.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", action="append", default=[], help="limit to these modules")
    options = parser.parse_args()
    modules = options.only or list(TARGETS)
    work = Path(tempfile.mkdtemp(prefix="guardstack-mutation-"))
    pool = [(module, mutation) for module in modules for mutation in mutants(module, work)]
    if options.seed is None:
        import subprocess

        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        options.seed = int(head[:8] or "0", 16)
    rng = random.Random(options.seed)
    chosen = pool if options.all else rng.sample(pool, min(options.sample, len(pool)))
    print(f"mutation: {len(chosen)} of {len(pool)} mutants (seed {options.seed})", flush=True)
    results: dict[str, dict[str, list[str]]] = {}
    started = time.monotonic()
    for number, (module, mutation) in enumerate(chosen, 1):
        outcome, diff = test(module, mutation)
        results.setdefault(module, {}).setdefault(outcome, []).append(diff)
        mark = {"killed": ".", "survived": "S"}.get(outcome, "i")
        print(mark, end="\n" if number % 60 == 0 else "", flush=True)
    print()
    killed = sum(len(r.get("killed", [])) for r in results.values())
    survived = sum(len(r.get("survived", [])) for r in results.values())
    score = killed / max(1, killed + survived)
    for module, outcomes in sorted(results.items()):
        counts = {kind: len(diffs) for kind, diffs in outcomes.items()}
        print(f"  {module}: {counts}")
        for diff in outcomes.get("survived", []):
            changed = [
                line
                for line in diff.splitlines()
                if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))
            ]
            print("    survived:", " | ".join(changed)[:200])
    print(
        f"mutation score {score:.1%}: {killed} killed, {survived} survived "
        f"({time.monotonic() - started:.0f} s)"
    )
    if options.out is not None:
        options.out.mkdir(parents=True, exist_ok=True)
        (options.out / "results.json").write_text(json.dumps(results, indent=1))
    if score < options.floor:
        raise SystemExit(f"mutation score {score:.1%} is below the floor {options.floor:.0%}")


if __name__ == "__main__":
    main()
