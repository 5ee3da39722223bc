"""The labelled loop corpus: seeded, generated sessions of each loop shape and of look-alikes.

    python -m benchmarks.loops.corpus      # writes every set's sessions and labels

Three sets: the **shipped** corpus below (``sessions/``, ``labels.json``), and the
**tuning** and **validation** sets of ``shapes.py`` (``sessions-tuning/``,
``sessions-validation/``): loops that do not repeat exactly and their look-alikes,
drawn in two vocabularies with two seeds. Defaults are chosen on tuning only.

Each case is a list of tool calls with the results they got, after a short, varied
prefix of legitimate work. Loops (label: the index of the first *wasted* call, the
first call of the second repetition):

* ``identical`` — the same call again and again (the same grep, read or commit);
* ``cycle2`` / ``cycle3`` — A-B-A-B… or A-B-C-A-B-C… with nothing changing;
* ``poll_forever`` — a status poll whose answer never changes;
* ``same_error`` — the same failing call, failing the same way;
* ``identical_with_bookkeeping`` — identical calls with a to-do update between them.

Legitimate repetition (label: none):

* ``batch_edit`` — one tool over many files; ``pagination`` — page 1, 2, 3…;
* ``poll_until_done`` — the same poll answered "running" up to 8 times, then "done";
* ``retry_changed_argument`` — a failing call retried with a different argument;
* ``test_fix_test`` — edit, run the tests, edit again: the patch and the failures
  change every round;
* ``reread_after_edit`` — read a file, edit it, read it again (it changed).

The sessions are real guardstack session logs (``Session.load`` reads them), made by
the agent loop with a scripted model and tools answering from the case: the replay
engine (``guardstack replay``) runs detectors over them exactly as over a recorded
production log. No public agent trajectories are included: none we found could be
shipped under a licence that allows it with their tool results intact.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import attrs

from benchmarks.loops import shapes
from guardstack.pipeline import (
    Harness,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolCallRequest,
    ToolDefinition,
    ToolResult,
)

HERE = Path(__file__).parent
SESSIONS = HERE / "sessions"
LABELS = HERE / "labels.json"
SEED = 20261130
PER_SHAPE = 12
#: The generalisation sets: (vocabulary, seed), each with its sessions and labels.
SETS = {"tuning": (shapes.TUNING, 20261201), "validation": (shapes.VALIDATION, 20261202)}
SET_PER_SHAPE = 8


def set_paths(name: str) -> tuple[Path, Path]:
    """Where a set's sessions and labels are: the shipped corpus, or a generalisation set."""
    if name == "shipped":
        return SESSIONS, LABELS
    return HERE / f"sessions-{name}", HERE / f"labels-{name}.json"


Step = tuple[str, dict[str, Any], str, bool]  # tool, arguments, result, failed


@attrs.frozen
class Case:
    name: str
    shape: str
    steps: tuple[Step, ...]
    #: Index of the first wasted call, or ``None`` for legitimate repetition.
    loop_start: int | None


def _prefix(rng: random.Random) -> list[Step]:
    files = ["app.py", "db.py", "api.py", "util.py", "README.md"]
    steps: list[Step] = []
    for n in range(rng.randint(0, 5)):
        file = rng.choice(files)
        kind = rng.choice(["read", "grep", "list"])
        if kind == "read":
            steps.append(("read", {"path": file, "n": n}, f"contents of {file} ({n})", False))
        elif kind == "grep":
            steps.append(("grep", {"q": f"TODO{n}"}, f"{file}:{n}: TODO", False))
        else:
            steps.append(("list", {"dir": f"src/{n}"}, f"{n} files", False))
    return steps


def _repeat(unit: list[Step], times: int) -> list[Step]:
    return [step for _ in range(times) for step in unit]


def _loops(rng: random.Random) -> dict[str, Callable[[], tuple[list[Step], int]]]:
    def identical() -> tuple[list[Step], int]:
        call: Step = ("grep", {"q": "def main", "path": "src"}, "src/app.py:3: def main", False)
        return _repeat([call], rng.randint(6, 20)), 1

    def cycle2() -> tuple[list[Step], int]:
        unit: list[Step] = [
            ("read", {"path": "app.py"}, "def main(): pass", False),
            ("edit", {"path": "app.py", "patch": "+x"}, "patch does not apply", True),
        ]
        return _repeat(unit, rng.randint(4, 10)), 2

    def cycle3() -> tuple[list[Step], int]:
        unit: list[Step] = [
            ("read", {"path": "db.py"}, "class DB: ...", False),
            ("edit", {"path": "db.py", "patch": "+y"}, "ok", False),
            ("test", {"suite": "db"}, "1 failed: test_connect", False),
        ]
        return _repeat(unit, rng.randint(3, 8)), 3

    def poll_forever() -> tuple[list[Step], int]:
        call: Step = ("poll", {"job": 42}, "status: queued", False)
        return _repeat([call], rng.randint(12, 25)), 1

    def same_error() -> tuple[list[Step], int]:
        call: Step = ("run", {"cmd": "make"}, "make: *** No rule to make target", True)
        return _repeat([call], rng.randint(4, 10)), 1

    def identical_with_bookkeeping() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for n in range(rng.randint(6, 12)):
            steps.append(("read", {"path": "api.py"}, "def handler(): ...", False))
            steps.append(("todo", {"item": f"check api {n}"}, "noted", False))
        return steps, 2

    return {
        "identical": identical,
        "cycle2": cycle2,
        "cycle3": cycle3,
        "poll_forever": poll_forever,
        "same_error": same_error,
        "identical_with_bookkeeping": identical_with_bookkeeping,
    }


def _legitimate(rng: random.Random) -> dict[str, Callable[[], list[Step]]]:
    def batch_edit() -> list[Step]:
        return [
            ("edit", {"path": f"src/m{n}.py", "patch": "-old +new"}, "ok", False)
            for n in range(rng.randint(8, 30))
        ]

    def pagination() -> list[Step]:
        return [
            ("list", {"dir": "issues", "page": n}, f"issues {n * 20}-{n * 20 + 19}", False)
            for n in range(1, rng.randint(5, 20))
        ]

    def poll_until_done() -> list[Step]:
        running = rng.randint(1, 8)
        call = ("poll", {"job": 7})
        return [(*call, "status: running", False) for _ in range(running)] + [
            (*call, "status: done", False)
        ]

    def retry_changed_argument() -> list[Step]:
        tries = rng.randint(2, 5)
        steps: list[Step] = [
            ("grep", {"q": "(" * (n + 1)}, "error: unbalanced parenthesis", True)
            for n in range(tries)
        ]
        return [*steps, ("grep", {"q": "\\("}, "app.py:9: print(x)", False)]

    def test_fix_test() -> list[Step]:
        rounds = rng.randint(3, 10)
        steps: list[Step] = []
        for n in range(rounds):
            steps.append(("edit", {"path": "app.py", "patch": f"fix {n}"}, "ok", False))
            steps.append(("test", {}, f"{rounds - n - 1} failed", False))
        return steps

    def reread_after_edit() -> list[Step]:
        steps: list[Step] = []
        for n in range(rng.randint(3, 8)):
            steps.append(("read", {"path": "app.py"}, f"version {n}", False))
            steps.append(("edit", {"path": "app.py", "patch": f"step {n}"}, "ok", False))
        return steps

    return {
        "batch_edit": batch_edit,
        "pagination": pagination,
        "poll_until_done": poll_until_done,
        "retry_changed_argument": retry_changed_argument,
        "test_fix_test": test_fix_test,
        "reread_after_edit": reread_after_edit,
    }


def cases(seed: int = SEED, per_shape: int = PER_SHAPE) -> list[Case]:
    """Every case of the corpus, the same for the same seed."""
    rng = random.Random(seed)
    made: list[Case] = []
    for shape, make in _loops(rng).items():
        for n in range(per_shape):
            prefix = _prefix(rng)
            steps, wasted_after = make()
            made.append(
                Case(f"{shape}-{n:02d}", shape, (*prefix, *steps), len(prefix) + wasted_after)
            )
    for shape, legit in _legitimate(rng).items():
        for n in range(per_shape):
            made.append(Case(f"{shape}-{n:02d}", shape, (*_prefix(rng), *legit()), None))
    return made


async def record(case: Case) -> Any:
    """The case as a real session log: the agent loop, a scripted model, scripted tools."""
    replies = [ModelReply(tool_calls=[ToolCallRequest(n, a)]) for n, a, _, _ in case.steps]
    harness = Harness(ScriptedModel([*replies, ModelReply("done")]), max_steps=len(replies) + 1)
    answers = iter(case.steps)

    async def answer(arguments: Any, call: ToolCall) -> ToolResult:
        _, _, text, failed = next(answers)
        return ToolResult.failure(text, code="TOOL_FAILED") if failed else ToolResult(text)

    for name in dict.fromkeys(step[0] for step in case.steps):
        harness.tools.register(ToolDefinition(name, answer))
    agent = harness.loop.create(case.name)
    await agent.prompt("Do the task.")
    return agent.session


def set_cases(name: str, per_shape: int = SET_PER_SHAPE) -> list[Case]:
    """Every case of a generalisation set, the same for the same name."""
    vocabulary, seed = SETS[name]
    rng = random.Random(seed)
    made: list[Case] = []
    for shape, make in shapes.loops(vocabulary, rng).items():
        for n in range(per_shape):
            prefix = _prefix(rng)
            steps, wasted_after = make()
            made.append(
                Case(f"{shape}-{n:02d}", shape, (*prefix, *steps), len(prefix) + wasted_after)
            )
    for shape, legit in shapes.look_alikes(vocabulary, rng).items():
        for n in range(per_shape):
            made.append(Case(f"{shape}-{n:02d}", shape, (*_prefix(rng), *legit()), None))
    return made


def write_set(made: list[Case], directory: Path, labels_path: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    labels = {}
    for case in made:
        session = anyio.run(record, case)
        session.save(directory / f"{case.name}.jsonl")
        labels[case.name] = {"shape": case.shape, "loop_start": case.loop_start}
    labels_path.write_text(json.dumps(labels, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def write() -> None:
    write_set(cases(), SESSIONS, LABELS)
    for name in SETS:
        write_set(set_cases(name), *set_paths(name))


if __name__ == "__main__":
    write()
