"""LoopDetector: loops the seed's reminder cannot see, and an escalation ladder to stop them.

Where it belongs: a post-execute layer that watches each call and its result, a
pre-execute layer that denies (or ends the turn at) a call that would continue a
detected loop once the ladder says so, and a prompt-submit layer: each new
person's prompt starts the ladder afresh. It composes with ``RepeatToolReminder``:
use one or the other, or both with distinct thresholds (the reminder for the
seed's exact texts at 3/5/8 identical calls, the detector for the other shapes and
the ladder).

**Patterns** (each an int threshold, or ``None`` for off), over the calls of one
conversation's turn, compared by tool name and canonical arguments (key order
never matters) and, for results, by canonical content:

* ``identical=N`` — the N-th identical call in a row;
* ``cycle=N`` — a sequence of k calls (2 ≤ k ≤ 5, not itself one call repeated)
  repeated N times back to back, at call k·N (A-B-A-B…, edit-test-edit-test…);
* ``no_progress=N`` — the same call returning the same result N times in a row
  (no new information: a poll that never changes);
* ``repeated_error=N`` — the same call failing the same way N times in a row.

Every later call that still matches is another detection. Excluded tools (and,
with ``include``, tools not named) are transparent, as in the seed: they neither
count nor break a chain. With ``count_parallel_once`` (the default), identical
calls made in the same parallel step count once.

**The ladder** counts detections per conversation within a turn: at detection
``remind`` the model gets an advisory message naming the loop (source
``loop-detector``); from detection ``deny`` on, the call that would continue the
loop gets ``TOOL_DENIED`` with a text naming it; at detection ``end_turn`` the
turn ends ``blocked`` with no further model request. ``None`` switches a rung
off; the ladder only moves forward within a turn.

Each detection is logged on the ``guardstack`` logger (INFO) naming the pattern,
and its reminder is a span event when ``Tracing`` is applied. It never raises on
any arguments or results: canonicalisation is the reminder's.

Defaults (``identical=5, cycle=3, no_progress=4, repeated_error=3, remind=1,
deny=5, end_turn=10``) were chosen from the table ``python -m benchmarks.loops``
prints on a labelled corpus; the README gives the table and the reasons. The one
look-alike no detector can tell from a loop is a poll that legitimately answers
"running" many times: exclude polling tools (``exclude=["poll*"]``), which is why
the ladder waits for the fifth detection before it denies anything.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Hashable
from typing import Any, ClassVar, Final

import attrs
from opentelemetry import trace

from guardstack.guards.agent_state import ConversationState, Resettable
from guardstack.guards.canonical import canonical_json
from guardstack.pipeline.contract import PostNext, PreNext, Scope
from guardstack.pipeline.validate import (
    boolean,
    compile_patterns,
    invalid,
    optional_integer,
    patterns,
)
from guardstack.pipeline.values import (
    ContextMessage,
    Deny,
    MessageSource,
    PostDecision,
    PreDecision,
    ToolCall,
    ToolResult,
)

__all__ = ["DETECTED_EVENT", "SOURCE", "Detection", "LoopDetector"]

PLUGIN: Final = "loop-detector"
SOURCE: Final = MessageSource("plugin", PLUGIN)
#: The span event each detection adds to its call's ``execute_tool`` span.
DETECTED_EVENT: Final = "guardstack.loop_detected"
#: The longest repeated sequence ``cycle`` looks for.
MAX_CYCLE: Final = 5

logger = logging.getLogger("guardstack")


def _threshold(key: str) -> Any:
    check = optional_integer(PLUGIN, key)

    def at_least_two(instance: Any, attribute: Any, value: Any) -> None:
        check(instance, attribute, value)
        if value is not None and value < 2:
            raise invalid(PLUGIN, key, value, "an integer >= 2, or None (off)")

    return at_least_two


def _include(value: object) -> tuple[str, ...]:
    return patterns(PLUGIN, "include", value)


def _exclude(value: object) -> tuple[str, ...]:
    return patterns(PLUGIN, "exclude", value)


def _flag(_: Any, __: Any, value: Any) -> None:
    boolean(PLUGIN, "count_parallel_once", value)


@attrs.frozen
class _Entry:
    """One watched call: its key, its result's key, its error's key (or ``None``)."""

    key: str
    name: str
    result: str
    error: str | None
    step: object


@attrs.frozen
class Detection:
    """A loop the detector saw: its pattern, the calls involved, the detection's number."""

    pattern: str
    tools: tuple[str, ...]
    repeats: int
    number: int


class _Turn:
    """One conversation's turn: the watched calls and how many detections so far."""

    __slots__ = ("detections", "entries")

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.detections = 0


@attrs.frozen
class LoopDetector:
    """Detects identical, cyclic, no-progress and repeated-error loops; remind → deny → end."""

    name: ClassVar[str] = PLUGIN

    identical: int | None = attrs.field(default=5, validator=_threshold("identical"))
    cycle: int | None = attrs.field(default=3, validator=_threshold("cycle"))
    no_progress: int | None = attrs.field(default=4, validator=_threshold("no_progress"))
    repeated_error: int | None = attrs.field(default=3, validator=_threshold("repeated_error"))
    remind: int | None = attrs.field(default=1, validator=optional_integer(PLUGIN, "remind"))
    deny: int | None = attrs.field(default=5, validator=optional_integer(PLUGIN, "deny"))
    end_turn: int | None = attrs.field(default=10, validator=optional_integer(PLUGIN, "end_turn"))
    include: tuple[str, ...] = attrs.field(default=(), converter=_include)
    exclude: tuple[str, ...] = attrs.field(default=(), converter=_exclude)
    count_parallel_once: bool = attrs.field(default=True, validator=_flag)
    _include: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)
    _exclude: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)
    _resets: Resettable = attrs.field(init=False, repr=False, eq=False, factory=Resettable)

    def __attrs_post_init__(self) -> None:
        if not any((self.identical, self.cycle, self.no_progress, self.repeated_error)):
            raise invalid(PLUGIN, "identical", None, "set (or another pattern): all are off")
        rungs = [(k, v) for k, v in (("remind", self.remind), ("deny", self.deny)) if v]
        rungs += [("end_turn", self.end_turn)] if self.end_turn else []
        for (low, low_at), (high, high_at) in itertools.pairwise(rungs):
            if high_at < low_at:
                raise invalid(PLUGIN, high, high_at, f">= `{low}` ({low_at}): the ladder climbs")
        object.__setattr__(self, "_include", compile_patterns(self.include))
        object.__setattr__(self, "_exclude", compile_patterns(self.exclude))

    def tracks(self, tool_name: str) -> bool:
        """Whether calls to ``tool_name`` are watched (others are transparent)."""
        if self._include is not None and not self._include.fullmatch(tool_name):
            return False
        return self._exclude is None or not self._exclude.fullmatch(tool_name)

    def reset(self, conversation: Hashable | None) -> None:
        """Start a new turn for ``conversation`` (callers outside the agent loop)."""
        self._resets.reset(conversation)

    def apply(self, scope: Scope) -> None:
        """Register the watching, denying and resetting layers, with fresh state."""
        turns: ConversationState[_Turn] = self._resets.track(ConversationState(PLUGIN))
        watcher = _Watcher(self, turns)
        scope.use(scope.tools.pre_execute, watcher.pre_execute, name=PLUGIN)
        scope.use(scope.tools.post_execute, watcher.post_execute, name=PLUGIN)
        scope.use(scope.loop.prompt_submit, turns.reset_on_prompt, name=PLUGIN)

    # -- the patterns ---------------------------------------------------------------------

    def detect(self, entries: list[_Entry]) -> Detection | None:
        """The loop the last entry completes (most specific pattern first), or ``None``."""
        if not entries:
            return None
        last = entries[-1]
        run = _run_length(entries, lambda e: e.key == last.key)
        if self.repeated_error and last.error is not None:
            same = _run_length(entries, lambda e: e.key == last.key and e.error == last.error)
            if same >= self.repeated_error:
                return Detection("repeated_error", (last.name,), same, 0)
        if self.no_progress and last.error is None:
            same = _run_length(
                entries, lambda e: e.key == last.key and e.error is None and e.result == last.result
            )
            if same >= self.no_progress:
                return Detection("no_progress", (last.name,), same, 0)
        if self.identical and run >= self.identical:
            return Detection("identical", (last.name,), run, 0)
        if self.cycle:
            for length in range(2, MAX_CYCLE + 1):
                repeats = _cycle_repeats(entries, length)
                if repeats >= self.cycle:
                    names = tuple(e.name for e in entries[-length:])
                    return Detection("cycle", names, repeats, 0)
        return None

    def text(self, found: Detection) -> str:
        """The advisory message for a detection."""
        tools = " → ".join(f'"{name}"' for name in found.tools)
        if found.pattern == "repeated_error":
            return (
                f"Potential loop detected: {tools} failed the same way {found.repeats} times "
                "in a row with the same arguments. Do not call it again like this: read the "
                "error, change the arguments or the approach, or report what is blocking you."
            )
        if found.pattern == "no_progress":
            return (
                f"Potential loop detected: {tools} returned the same result {found.repeats} "
                "times in a row, so calling it again will not tell you anything new. Use "
                "that result, or step back and try a different approach."
            )
        if found.pattern == "identical":
            return (
                f"Potential loop detected: {tools} was called with the same arguments "
                f"{found.repeats} times in a row. Step back: use what it returned, or try "
                "a different approach."
            )
        return (
            f"Potential loop detected: the sequence {tools} repeated {found.repeats} times "
            "in a row without progress. Step back and try a different approach, or finish "
            "with what you have."
        )


def _run_length(entries: list[_Entry], same: Any) -> int:
    count = 0
    for entry in reversed(entries):
        if not same(entry):
            break
        count += 1
    return count


def _cycle_repeats(entries: list[_Entry], length: int) -> int:
    """How many times the last ``length`` calls repeat back to back (1 if not at all).

    A sequence that is one call repeated is the ``identical`` pattern's, not a cycle.
    """
    if len(entries) < 2 * length:
        return 1
    unit = [e.key for e in entries[-length:]]
    if len(set(unit)) == 1:
        return 1
    for shorter in range(2, length):  # a period that itself has a shorter period
        if length % shorter == 0 and unit == unit[:shorter] * (length // shorter):
            return 1
    repeats = 1
    end = len(entries) - length
    while end - length >= 0 and [e.key for e in entries[end - length : end]] == unit:
        repeats += 1
        end -= length
    return repeats


def _key(call: ToolCall) -> str:
    """A call's identity: its tool's name and canonical arguments (key order never matters)."""
    return f"{len(call.name)}:{call.name}{canonical_json(call.arguments)}"


def _result_key(result: ToolResult) -> tuple[str, str | None]:
    if result.is_error:
        error = result.error
        code = error.code if error is not None else None
        return "", f"{code}:{error.message if error is not None else result.content}"
    return result.content, None


def _step(call: ToolCall) -> object:
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


class _Watcher:
    """One application's turns, and the layers that watch and stop loops."""

    __slots__ = ("config", "turns")

    def __init__(self, config: LoopDetector, turns: ConversationState[_Turn]) -> None:
        self.config = config
        self.turns = turns

    def _turn(self, call: ToolCall) -> _Turn:
        turn = self.turns.get(call)
        if turn is None:
            turn = _Turn()
            self.turns.set(call, turn)
        return turn

    def _entry(self, call: ToolCall, result: ToolResult, step: object) -> _Entry:
        content, error = _result_key(result)
        return _Entry(_key(call), call.name, content, error, step)

    def _is_parallel_repeat(self, turn: _Turn, entry: _Entry) -> bool:
        if not self.config.count_parallel_once:
            return False
        return any(e.step == entry.step and e.key == entry.key for e in turn.entries[-8:])

    async def pre_execute(self, call: ToolCall, call_next: PreNext) -> PreDecision:
        config = self.config
        if (config.deny is None and config.end_turn is None) or not config.tracks(call.name):
            return await call_next(call)
        turn = self._turn(call)
        # Would this call continue a loop? Assume it answers as its last identical call did.
        key = _key(call)
        previous = next((e for e in reversed(turn.entries) if e.key == key), None)
        step = _step(call)
        predicted = (
            attrs.evolve(previous, step=step)
            if previous is not None
            else _Entry(key, call.name, "", None, step)
        )
        if self._is_parallel_repeat(turn, predicted):
            return await call_next(call)
        found = config.detect([*turn.entries[-(MAX_CYCLE * 16) :], predicted])
        if found is None:
            return await call_next(call)
        number = turn.detections + 1
        ends = config.end_turn is not None and number >= config.end_turn
        if ends or (config.deny is not None and number >= config.deny):
            what = "turn ended" if ends else "call denied"
            reason = f"{config.name}: {config.text(found)} ({what}: this loop was not broken)"
            return Deny(reason, end_turn=ends)
        return await call_next(call)

    async def post_execute(
        self, call: ToolCall, result: ToolResult, call_next: PostNext
    ) -> PostDecision:
        config = self.config
        if not config.tracks(call.name):
            return await call_next(call, result)
        turn = self._turn(call)
        entry = self._entry(call, result, _step(call))
        decision = await call_next(call, result)
        if self._is_parallel_repeat(turn, entry):
            return decision
        turn.entries.append(entry)
        if len(turn.entries) > MAX_CYCLE * 32:
            del turn.entries[: MAX_CYCLE * 16]
        found = config.detect(turn.entries)
        if found is None:
            return decision
        turn.detections += 1
        trace.get_current_span().add_event(
            DETECTED_EVENT,
            {
                "guardstack.loop.pattern": found.pattern,
                "guardstack.loop.tools": list(found.tools),
                "guardstack.loop.repeats": found.repeats,
                "guardstack.loop.detection": turn.detections,
            },
        )
        logger.info(
            "loop-detector: %s loop (%s, %d times), detection %d",
            found.pattern,
            " -> ".join(found.tools),
            found.repeats,
            turn.detections,
        )
        if config.remind is None or turn.detections != config.remind:
            return decision
        reminder = ContextMessage(config.text(found), SOURCE)
        return attrs.evolve(decision, additional_contexts=(reminder, *decision.additional_contexts))
