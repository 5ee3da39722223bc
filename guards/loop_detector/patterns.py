"""The shapes a loop takes, each measured on a turn's latest entries: runs, the same
failure, counting, walking, cycles."""

from __future__ import annotations

import difflib
import re
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Final

from guardstack.guards import volatile as vol
from guardstack.guards.loop_detector.entry import MONOLOGUE_SIMILARITY, Entry, fold
from guardstack.pipeline.values import (
    ToolCall,
)

if TYPE_CHECKING:
    pass


def same_failures(entries: list[Entry], last: Entry) -> int:
    """How many times the last call failed the same way, other calls between them
    allowed: counted back to the same call answered otherwise, or the same tool
    answered otherwise (a changed attempt that changed the outcome). The same tool
    failing the same way with other arguments is passed over, not counted."""
    count = 0
    for entry in reversed(entries):
        if entry.key == last.key:
            if entry.error != last.error:
                break
            count += 1
        elif entry.name == last.name and entry.error != last.error:
            break
    return count


def counted_text(before: str, after: str) -> bool:
    """Whether ``after`` is ``before`` with its whole numbers one further on (an id or a
    counter the tool steps on each call) and nothing else changed."""
    if before == after or len(after) > 4_000:
        return False
    old, new = _NUMBER.split(before), _NUMBER.split(after)
    if old[::2] != new[::2]:  # the same text around the numbers (so as many numbers)
        return False
    moved = [(a, b) for a, b in zip(old[1::2], new[1::2], strict=True) if a != b]
    return bool(moved) and all(int(b) == int(a) + 1 for a, b in moved)


_NUMBER: Final = re.compile(r"(\d{1,18})")


def run_length(entries: list[Entry], same: Any) -> int:
    count = 0
    for entry in reversed(entries):
        if not same(entry):
            break
        count += 1
    return count


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def counted_on(before: dict[str, Hashable] | None, after: dict[str, Hashable]) -> bool:
    """Whether ``after`` is ``before`` with whole-number fields one further on (a counter:
    ``attempt`` 1 → 2, ``page`` 3 → 4) and everything else the same."""
    if before is None or before.keys() != after.keys():
        return False
    moved = [key for key in after if after[key] != before[key]]
    if not moved:
        return False
    for key in moved:
        old, new = before[key], after[key]
        if not (_whole(old) and _whole(new) and new == old + 1):  # type: ignore[operator]
            return False
    return True


def walk_length(entries: list[Entry]) -> int:
    """How many calls in a row (of the last entry's tool) moved one numeric argument the
    same way while answering empty or the same result."""
    last = entries[-1]
    if not (last.empty or not last.fresh) or last.stable is None:
        return 0
    count, moving, direction = 1, None, 0
    later = last
    for entry in reversed(entries[:-1]):
        if entry.name != last.name or entry.error is not None or entry.stable is None:
            break
        if not (entry.empty and later.empty) and entry.result != later.result:
            break
        step = _numeric_step(entry.stable, later.stable or {})
        if step is None:
            break
        key, sign = step
        if moving is None:
            moving, direction = key, sign
        elif key != moving or sign != direction:
            break
        count += 1
        later = entry
    return count


def _numeric_step(
    before: dict[str, Hashable], after: dict[str, Hashable]
) -> tuple[str, int] | None:
    if before.keys() != after.keys():
        return None
    moved = [key for key in after if after[key] != before[key]]
    if len(moved) != 1:
        return None
    old, new = before[moved[0]], after[moved[0]]
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (old, new))
    if not numbers or old == new:
        return None
    return moved[0], 1 if new > old else -1  # type: ignore[operator]


def cycle_repeats(entries: list[Entry], length: int) -> int:
    """How many times the last ``length`` calls (with their results) repeat back to back
    (1 if not at all). A sequence that is one call repeated is not a cycle."""
    if len(entries) < 2 * length:
        return 1
    unit = [(e.key, e.result, e.error) for e in entries[-length:]]
    if len({key for key, _, _ in unit}) == 1:
        return 1
    for shorter in range(2, length):  # a period that itself has a shorter period
        if length % shorter == 0 and unit == unit[:shorter] * (length // shorter):
            return 1
    repeats = 1
    end = len(entries) - length
    while (
        end - length >= 0
        and [(e.key, e.result, e.error) for e in entries[end - length : end]] == unit
    ):
        repeats += 1
        end -= length
    return repeats


def differing(entries: list[Entry]) -> tuple[str, ...]:
    """The argument fields that differ among calls the detector took for the same."""
    names: set[str] = set()
    by_key: dict[str, list[dict[str, Hashable]]] = {}
    for entry in entries:
        if entry.fields is not None:
            by_key.setdefault(entry.key, []).append(entry.fields)
    for fields in by_key.values():
        for field in set().union(*fields):
            if len({f.get(field) for f in fields}) > 1:
                names.add(field)
    return tuple(sorted(names))


def step_of(call: ToolCall) -> object:
    """The loop's step a call belongs to (parallel calls share it), or a unique marker."""
    agent = call.agent
    if agent is None:
        return object()
    events = getattr(getattr(agent, "session", None), "events", ())
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if getattr(event, "type", None) == "step/start":
            return (getattr(event, "turn", None), getattr(event, "step", None))
    return object()


def _after_template(first: str, second: str) -> tuple[str, str]:
    """Both texts without the prefix they share (a reply template's header)."""
    shared = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        shared += 1
    return first[shared:], second[shared:]


def alike(first: str, second: str) -> bool:
    """Near-identical replies: equal once folded (volatile parts masked), or nearly equal
    in what follows the prefix they share — so two replies sharing a long template
    header but saying different things after it are not alike."""
    a, b = fold(vol.result_key(first)), fold(vol.result_key(second))
    if a == b:
        return True
    rest_a, rest_b = _after_template(a, b)
    return difflib.SequenceMatcher(None, rest_a, rest_b).ratio() >= MONOLOGUE_SIMILARITY
