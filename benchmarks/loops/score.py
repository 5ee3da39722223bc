"""How well loop detectors separate loops from legitimate repetition, on the labelled corpus.

    python -m benchmarks.loops

Every session of ``benchmarks/loops/sessions`` (see ``corpus.py``) is replayed through
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
* ``LoopDetector`` with its defaults, and the variants the defaults were chosen from.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import anyio
import attrs

from benchmarks.loops.corpus import LABELS, SESSIONS
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
from guardstack.pipeline.values import PostDecision


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


def detectors() -> dict[str, Callable[[], Any]]:
    default = LoopDetector(exclude=["todo"])
    return {
        "original reminder @3": lambda: RepeatToolReminder(thresholds=(3,), exclude=["todo"]),
        "original reminder @5": lambda: RepeatToolReminder(thresholds=(5,), exclude=["todo"]),
        "original reminder @8": lambda: RepeatToolReminder(thresholds=(8,), exclude=["todo"]),
        "gemini-cli (cycle 1-5 x5)": GeminiCli,
        "OpenHands StuckDetector": OpenHands,
        "LoopDetector, all at 3": lambda: LoopDetector(
            identical=3, cycle=3, no_progress=3, repeated_error=3, exclude=["todo"]
        ),
        "LoopDetector, identical 4": lambda: attrs.evolve(default, identical=4),
        "LoopDetector, no_progress 6": lambda: attrs.evolve(default, no_progress=6),
        "LoopDetector, no_progress off": lambda: attrs.evolve(default, no_progress=None),
        "LoopDetector, cycle 4": lambda: attrs.evolve(default, cycle=4),
        "LoopDetector, identical 8": lambda: attrs.evolve(default, identical=8, no_progress=8),
        "LoopDetector (defaults)": lambda: default,
        "LoopDetector (defaults), poll excluded": lambda: attrs.evolve(
            default, exclude=["todo", "poll"]
        ),
    }


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


async def score(
    chosen: dict[str, Callable[[], Any]] | None = None, directory: Path = SESSIONS
) -> dict[str, dict[str, Any]]:
    """Precision, recall, steps to detection and false positives, per detector."""
    labels: dict[str, dict[str, Any]] = json.loads(LABELS.read_text(encoding="utf-8"))
    sessions = {name: Session.load(directory / f"{name}.jsonl") for name in sorted(labels)}
    results: dict[str, dict[str, Any]] = {}
    for detector, make in (chosen or detectors()).items():
        tp = fp = missed = 0
        steps: list[int] = []
        false_shapes: list[str] = []
        for name, session in sessions.items():
            start = labels[name]["loop_start"]
            found = await first_detection(session, make())
            if start is None:
                if found is not None:
                    fp += 1
                    false_shapes.append(labels[name]["shape"])
                continue
            if found is None:
                missed += 1
            elif found < start:
                fp += 1
                missed += 1
                false_shapes.append(labels[name]["shape"])
            else:
                tp += 1
                steps.append(found - start + 1)
        loops = sum(1 for label in labels.values() if label["loop_start"] is not None)
        results[detector] = {
            "precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / loops,
            "median_steps": statistics.median(steps) if steps else None,
            "false_positives": fp,
            "missed": missed,
            "false_shapes": sorted(set(false_shapes)),
        }
    return results


def render(results: dict[str, dict[str, Any]]) -> str:
    rows = [
        [
            name,
            f"{r['precision']:.2f}",
            f"{r['recall']:.2f}",
            "—" if r["median_steps"] is None else f"{r['median_steps']:g}",
            f"{r['false_positives']}",
            ", ".join(r["false_shapes"]) or "—",
        ]
        for name, r in results.items()
    ]
    labels = json.loads(LABELS.read_text(encoding="utf-8"))
    loops = sum(1 for label in labels.values() if label["loop_start"] is not None)
    return "\n".join(
        [
            table(
                ["detector", "precision", "recall", "median steps", "false pos.", "fired on"],
                rows,
            ),
            "",
            f"{len(labels)} sessions: {loops} loops, {len(labels) - loops} legitimate. Steps "
            "to detection: wasted calls made until it fired (1 = at the first wasted call).",
        ]
    )


def main() -> None:
    print(render(anyio.run(score)))


if __name__ == "__main__":
    main()
