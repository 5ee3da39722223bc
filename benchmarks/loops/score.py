"""How well loop detectors separate loops from legitimate repetition, on the labelled corpus.

    python -m benchmarks.loops                  # validation and shipped tables
    python -m benchmarks.loops --set tuning     # one set's table
    python -m benchmarks.loops --tune           # the grid the defaults were chosen from

Every session of a set (see ``corpus.py``: the shipped corpus, and the tuning and
validation sets of loops that do not repeat exactly) is replayed through
each detector with the replay engine (``guardstack.cli.replay``: the logged calls run
through the guards, answered with their logged results). A detector *detects* at the
first call where it reminds, denies or ends the turn. Per session: a loop detected at
or after its first wasted call is a true positive; a detection in a legitimate
session, or before a loop began, a false positive; an undetected loop a miss.
Steps to detection count the wasted calls made before the detection fired.

Detectors:

* the original system's ``RepeatToolReminder`` with its first threshold at 3, 5 and 8;
* gemini-cli's tool-call rule, re-implemented from its public source
  (``packages/core/src/services/loopDetectionService.ts``, Apache-2.0): a tool call
  whose name and arguments hash the same as the previous ones, 5 times
  (``TOOL_CALL_LOOP_THRESHOLD = 5``), generalised — as its later versions and the
  issue describing them put it — to any cycle of 1–5 calls repeated 5 times;
* OpenHands' ``StuckDetector`` (``openhands/controller/stuck.py``, MIT; documented in
  the SDK as ``openhands.sdk.conversation.stuck_detector``): the same action with the
  same observation 4 times, the same action failing with the same error 3 times,
  or an A-B-A-B-A-B alternation (6 steps) with repeated observations;
* pydantic-ai-harness's ``LoopDetection`` capability (``pydantic_ai_harness/loop_detection``
  on its main branch, MIT; not in its 0.62.0 release), re-implemented from its README:
  the same fingerprint 5 times within the last 10 calls, the same call with a
  byte-identical result 3 times in a row, or A-B-A-B for 3 full cycles (its monologue
  tier watches text replies, which these tool-call sessions do not have);
* ``LoopDetector`` with its defaults and nothing excluded, the previous release's
  defaults, and the variants the defaults were chosen from.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections.abc import Callable, Hashable
from typing import Any

import anyio
import attrs

from benchmarks.loops.corpus import set_paths
from benchmarks.timing import table
from guardstack.cli.replay import replay
from guardstack.guards import LoopDetector, RepeatToolReminder, canonical_json
from guardstack.pipeline import (
    ContextMessage,
    Harness,
    MessageSource,
    Session,
    ToolCall,
    ToolResult,
)
from guardstack.pipeline.contract import Scope
from guardstack.pipeline.session import ToolCallEvent
from guardstack.pipeline.verdicts import PostDecision


def _key(call: ToolCall) -> str:
    return f"{call.name}{canonical_json(call.arguments)}"


@attrs.define
class _History:
    calls: list[tuple[str, str, bool]] = attrs.Factory(list)  # key, observation, failed
    fired: bool = False


class _Rule:
    """A foreign detector as a post-execute plugin: it reminds once when its rule matches."""

    name = "rule"

    def __init__(self) -> None:
        self.histories: dict[Hashable, _History] = {}

    def matches(self, calls: list[tuple[str, str, bool]]) -> bool:
        raise NotImplementedError

    def apply(self, scope: Scope) -> None:
        source = MessageSource("plugin", self.name)

        async def post(call: ToolCall, result: ToolResult, call_next: Any) -> PostDecision:
            decision: PostDecision = await call_next(call, result)
            history = self.histories.setdefault(call.agent or call.conversation, _History())
            history.calls.append((_key(call), result.content, result.is_error))
            if history.fired or not self.matches(history.calls):
                return decision
            history.fired = True
            reminder = ContextMessage(f"{self.name}: loop", source)
            return attrs.evolve(decision, additional_contexts=(reminder,))

        scope.use(scope.tools.post_execute, post, name=self.name)


class GeminiCli(_Rule):
    """Any cycle of 1–5 calls (name + arguments) repeated 5 times back to back."""

    name = "gemini-cli"

    def matches(self, calls: list[tuple[str, str, bool]]) -> bool:
        keys = [key for key, _, _ in calls]
        for length in range(1, 6):
            if len(keys) >= 5 * length and keys[-5 * length :] == keys[-length:] * 5:
                return True
        return False


class OpenHands(_Rule):
    """4 identical action/observation pairs; 3 identical failing actions; ABABAB."""

    name = "openhands"

    def matches(self, calls: list[tuple[str, str, bool]]) -> bool:
        if len(calls) >= 4 and len(set(calls[-4:])) == 1:
            return True
        last3 = calls[-3:]
        if len(last3) == 3 and len(set(last3)) == 1 and last3[0][2]:
            return True
        last6 = calls[-6:]
        return (
            len(last6) == 6
            and last6[0] == last6[2] == last6[4]
            and last6[1] == last6[3] == last6[5]
            and last6[0] != last6[1]
        )


class PydanticAiHarness(_Rule):
    """5 of the same fingerprint in the last 10; 3 identical results in a row; ABABAB."""

    name = "pydantic-ai-harness"

    def matches(self, calls: list[tuple[str, str, bool]]) -> bool:
        keys = [key for key, _, _ in calls]
        if keys and keys[-10:].count(keys[-1]) >= 5:
            return True
        last3 = calls[-3:]
        if len(last3) == 3 and len({(key, observation) for key, observation, _ in last3}) == 1:
            return True
        last6 = keys[-6:]
        return len(last6) == 6 and last6 == last6[:2] * 3 and last6[0] != last6[1]


#: The previous release's thresholds, compared exactly (the row this release improves on).
PREVIOUS: dict[str, Any] = {
    "identical": 5,
    "cycle": 3,
    "no_progress": 4,
    "repeated_error": 3,
    "volatile": False,
    "walking": None,
    "poll": None,
}


def detectors() -> dict[str, Callable[[], Any]]:
    default = LoopDetector()
    return {
        "original reminder @3": lambda: RepeatToolReminder(thresholds=(3,)),
        "original reminder @5": lambda: RepeatToolReminder(thresholds=(5,)),
        "gemini-cli (cycle 1-5 x5)": GeminiCli,
        "OpenHands StuckDetector": OpenHands,
        "pydantic-ai-harness LoopDetection": PydanticAiHarness,
        "LoopDetector, last release's thresholds, volatile off": lambda: LoopDetector(**PREVIOUS),
        "LoopDetector, volatile off": lambda: attrs.evolve(default, volatile=False),
        "LoopDetector, poll off": lambda: attrs.evolve(default, poll=None),
        "LoopDetector, walking off": lambda: attrs.evolve(default, walking=None),
        "LoopDetector (defaults)": lambda: default,
    }


#: The grid the defaults are chosen from, on the tuning set only.
GRID = {
    "identical": (3, 4, 5),
    "cycle": (2, 3),
    "no_progress": (2, 3, 4),
    "repeated_error": (2, 3),
    "walking": (3, 4),
    "poll": (8, 12),
}
#: The sets the defaults are chosen on: generated sessions and real conversations,
#: each the tuning half (``validation`` and ``real-validation`` are never seen).
TUNING_SETS = ("tuning", "real-tuning")


def _maker(settings: dict[str, Any]) -> Callable[[], Any]:
    return lambda: LoopDetector(**settings)


def grid() -> dict[str, Callable[[], Any]]:
    keys = list(GRID)
    rows: dict[str, Callable[[], Any]] = {}
    for values in itertools.product(*GRID.values()):
        settings = dict(zip(keys, values, strict=True))
        rows[", ".join(f"{k}={v}" for k, v in settings.items())] = _maker(settings)
    return rows


async def first_detection(session: Session, plugin: Any) -> int | None:
    harness = Harness()
    harness.plugin(plugin)
    report = await replay(session, harness)
    order = {
        e.call_id: index
        for index, e in enumerate(e for e in session.events if isinstance(e, ToolCallEvent))
    }
    fired = [order[r.call_id] for r in report.reminders] + [order[c.call_id] for c in report.caps]
    return min(fired, default=None)


def load(which: str) -> tuple[dict[str, dict[str, Any]], dict[str, Session]]:
    directory, labels_path = set_paths(which)
    labels: dict[str, dict[str, Any]] = json.loads(labels_path.read_text(encoding="utf-8"))
    return labels, {name: Session.load(directory / f"{name}.jsonl") for name in sorted(labels)}


def load_many(sets: tuple[str, ...]) -> tuple[dict[str, dict[str, Any]], dict[str, Session]]:
    """Several sets as one (their session names are distinct)."""
    labels: dict[str, dict[str, Any]] = {}
    sessions: dict[str, Session] = {}
    for which in sets:
        more_labels, more_sessions = load(which)
        labels |= more_labels
        sessions |= more_sessions
    return labels, sessions


async def score(
    chosen: dict[str, Callable[[], Any]] | None = None, which: str = "shipped"
) -> dict[str, dict[str, Any]]:
    """Precision, recall, steps to detection and false positives, per detector."""
    labels, sessions = load(which)
    return await score_loaded(chosen or detectors(), labels, sessions)


async def score_loaded(
    chosen: dict[str, Callable[[], Any]],
    labels: dict[str, dict[str, Any]],
    sessions: dict[str, Session],
) -> dict[str, dict[str, Any]]:
    """``score`` over sessions already loaded (the tuning grid scores many detectors)."""
    results: dict[str, dict[str, Any]] = {}
    for detector, make in chosen.items():
        tp = fp = missed = 0
        steps: list[int] = []
        false_shapes: list[str] = []
        false_names: list[str] = []
        missed_shapes: list[str] = []
        for name, session in sessions.items():
            start = labels[name]["loop_start"]
            found = await first_detection(session, make())
            if start is None:
                if found is not None:
                    fp += 1
                    false_shapes.append(labels[name]["shape"])
                    false_names.append(name)
                continue
            if found is None:
                missed += 1
                missed_shapes.append(labels[name]["shape"])
            elif found < start:
                fp += 1
                missed += 1
                false_shapes.append(labels[name]["shape"])
                missed_shapes.append(labels[name]["shape"])
            else:
                tp += 1
                steps.append(found - start + 1)
        loops = sum(1 for label in labels.values() if label["loop_start"] is not None)
        loop_free = len(labels) - loops
        alarms = sum(1 for name in false_names if labels[name]["loop_start"] is None)
        results[detector] = {
            "false_alarms_per_100": 100 * alarms / loop_free if loop_free else 0.0,
            "precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / loops,
            "median_steps": statistics.median(steps) if steps else None,
            "false_positives": fp,
            "missed": missed,
            "false_shapes": sorted(set(false_shapes)),
            "missed_shapes": {
                shape: missed_shapes.count(shape) for shape in sorted(set(missed_shapes))
            },
        }
    return results


def render(
    results: dict[str, dict[str, Any]],
    which: str = "shipped",
    labels: dict[str, dict[str, Any]] | None = None,
) -> str:
    rows = [
        [
            name,
            f"{r['precision']:.2f}",
            f"{r['recall']:.2f}",
            "—" if r["median_steps"] is None else f"{r['median_steps']:g}",
            f"{r['false_positives']}",
            f"{r['false_alarms_per_100']:.1f}",
            ", ".join(r["false_shapes"]) or "—",
        ]
        for name, r in results.items()
    ]
    if labels is None:
        labels = json.loads(set_paths(which)[1].read_text(encoding="utf-8"))
    loops = sum(1 for label in labels.values() if label["loop_start"] is not None)
    return "\n".join(
        [
            table(
                [
                    "detector",
                    "precision",
                    "recall",
                    "median steps",
                    "false pos.",
                    "alarms / 100 loop-free",
                    "fired on",
                ],
                rows,
            ),
            "",
            f"{which} set, {len(labels)} sessions: {loops} loops, {len(labels) - loops} "
            "legitimate. Steps "
            "to detection: wasted calls made until it fired (1 = at the first wasted call).",
        ]
    )


def catches_a_plain_repeat(name: str) -> bool:
    """Whether a grid row sees three identical calls with identical results: a row
    that does not is never a default, whatever it scores."""
    settings = dict(part.split("=") for part in name.split(", "))
    return min(int(settings["identical"]), int(settings["no_progress"])) <= 3


def choose(results: dict[str, dict[str, Any]]) -> str:
    """The grid row the defaults take: of the rows that catch a plain repeat of three,
    the best precision and recall together (their smaller, then their sum); among the
    rows that tie, one that keeps the median steps to detection within
    ``MAX_MEDIAN_STEPS``; among those, the gentlest (the largest thresholds: the
    least likely to fire on a look-alike the tuning sets lack)."""

    def merit(name: str) -> tuple[bool, float, float, bool, int, str]:
        r = results[name]
        steps = r["median_steps"] if r["median_steps"] is not None else 99.0
        gentleness = sum(int(part.split("=")[1]) for part in name.split(", "))
        return (
            catches_a_plain_repeat(name),
            min(r["precision"], r["recall"]),
            r["precision"] + r["recall"],
            steps <= MAX_MEDIAN_STEPS,
            gentleness,
            name,
        )

    return max(results, key=merit)


#: The issue's goal for the wasted calls before a detection, on the median.
MAX_MEDIAN_STEPS = 4


async def tune() -> tuple[str, dict[str, dict[str, Any]]]:
    labels, sessions = load_many(TUNING_SETS)
    results = await score_loaded(grid(), labels, sessions)
    return choose(results), results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loops")
    parser.add_argument(
        "--set",
        choices=["shipped", "tuning", "validation", "real-tuning", "real-validation", "fresh"],
        action="append",
    )
    parser.add_argument("--tune", action="store_true", help="score the grid on the tuning set")
    parser.add_argument(
        "--text",
        action="store_true",
        help="loops inside an answer's text (benchmarks/loops/text.py)",
    )
    options = parser.parse_args(argv)
    if options.text:
        from benchmarks.loops.text import main as text_main

        text_main()
        return
    if options.tune:
        chosen, results = anyio.run(tune)
        ranked = sorted(
            results,
            key=lambda n: (
                min(results[n]["precision"], results[n]["recall"]),
                results[n]["precision"] + results[n]["recall"],
            ),
        )
        shown = [name for name in ranked[-11:] if name != chosen] + [chosen]
        labels, _ = load_many(TUNING_SETS)
        print(render({name: results[name] for name in shown}, " + ".join(TUNING_SETS), labels))
        print(f"{len(results)} rows scored; the best ten and the chosen one (last) shown")
        print(f"\nchosen on the tuning set: {chosen}")
        return
    for which in options.set or ["validation", "shipped"]:
        results = anyio.run(score, None, which)
        print(render(results, which))
        misses = results["LoopDetector (defaults)"]["missed_shapes"]
        print(f"LoopDetector (defaults) misses: {misses or 'none'}\n")


if __name__ == "__main__":
    main()
