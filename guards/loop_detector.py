"""LoopDetector: loops the original reminder cannot see, and an escalation ladder to stop them.

Where it belongs: a post-execute layer that watches each call and its result, a
pre-execute layer that denies (or ends the turn at) a call that would continue a
detected loop once the ladder says so, and a prompt-submit layer: each new
person's prompt starts the ladder afresh (with ``monologue``, also a model-call
layer that watches text replies). It composes with ``RepeatToolReminder``: use one
or the other, or both with distinct thresholds.

**Comparing calls.** Calls are compared by tool name and canonical arguments (key
order never matters), results by content — both after normalising what is
volatile (``volatile=True``, the default; see ``guardstack.guards.volatile``), found
by how values look and behave, never by key names alone: date-times, epoch
timestamps, UUIDs and long hex ids wherever they are; a field that changes on every
repeat while the result stays the same (key names such as ``nonce`` or
``request_id`` are hints there, never the rule); counters that step by one from the
previous call of the same tool, and in the result of the same call made again;
case and whitespace in free text; times, ids and durations in results. Your own
patterns (``volatile=["nonce"]``) are masked outright. Nothing else is ever merged:
two calls that differ in a path, a plain date, a page that returned results or a
refined query stay two calls.

**Patterns** (each an int threshold, or ``None`` for off), over the calls of one
conversation's turn:

* ``identical=N`` — the N-th identical call in a row whose result did not advance
  (a result it had not returned before in the run is progress, never a loop);
* ``cycle=N`` — a sequence of k calls and their results (2 ≤ k ≤ 5, not itself one
  call repeated) repeated N times back to back, at call k·N;
* ``no_progress=N`` — the same call returning the same result N times in a row;
* ``repeated_error=N`` — the same call failing the same way N times, other calls
  between them allowed (counted back to the same call, or the same tool, answered
  otherwise);
* ``poll=N`` — the same call answered the same *pending* status ("running",
  "queued", "in progress"…) N times in a row: a poll is given longer than
  ``no_progress``, whatever the tool is called;
* ``walking=N`` — one numeric argument keeps moving (a page, an offset) while the
  tool's result stays empty or the same, N times in a row: paging past the end;
* ``monologue=N`` (opt-in) — N near-identical text replies in a row across turns
  whose prompt is one of ``continue_prompts`` (an autonomous runner's "Continue."):
  such prompts do not reset the ladder. Replies that share a long template and
  differ after it are not near-identical.

**Bookkeeping** is recognised without naming it: a call of another tool whose result
is empty (a ``think`` that returns nothing, a search that found nothing), constant
(what that tool answered last time to other arguments) or an acknowledgement
("ok", "noted", "plan updated"…) gives the next calls nothing to depend on, so the
patterns look through it (an ``update_plan`` between the rounds of a cycle does not
hide the cycle). ``exclude`` (and ``include``) stay for tools
you want ignored outright. With ``count_parallel_once`` (the default), identical
calls made in the same parallel step count once.

**Across turns** (``across_turns=True``, the default) a person's prompt starts the
ladder again but keeps the evidence: the same call answered the same way once a turn
for three turns is a loop. ``across_turns=False`` starts each turn from nothing.

**The ladder** counts detections per conversation within a turn: at detection
``remind`` the model gets an advisory message naming the loop and the fields
treated as volatile (source ``loop-detector``); from detection ``deny`` on, a call
that would continue a loop detected on its previous call gets ``TOOL_DENIED`` — a
call whose last result advanced never does; at detection ``end_turn`` the turn ends
``blocked``. ``None`` switches a rung off.

Each detection is logged on the ``guardstack`` logger (INFO) and is a span event
naming the pattern and the volatile fields. It never raises on any arguments or
results.

Defaults were chosen on the tuning halves of the generated corpus and of real
conversations (tau-bench's published airline runs; ``python -m benchmarks.loops
--tune``) and are reported on the validation halves, which the tuning never saw,
and on the shipped corpus; the README gives the tables. Three identical calls with
identical results are a loop at the defaults (``no_progress=3``).
"""

from __future__ import annotations

import difflib
import itertools
import logging
import re
import weakref
from collections.abc import Collection, Hashable
from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs

from guardstack.guards import volatile as vol
from guardstack.guards.agent_state import ConversationState, Resettable
from guardstack.pipeline.contract import ModelNext, PostNext, PreNext, PromptNext, Scope
from guardstack.pipeline.errors import TurnBlocked
from guardstack.pipeline.signals import LOOP_DETECTIONS, REMINDERS, Shadow, Signals
from guardstack.pipeline.validate import (
    boolean,
    compile_patterns,
    invalid,
    optional_integer,
    patterns,
)
from guardstack.pipeline.values import (
    TOOL_DENIED,
    ContextMessage,
    Deny,
    MessageSource,
    PostDecision,
    PreDecision,
    ToolCall,
    ToolResult,
)

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent, ModelReply, ModelRequest

__all__ = ["DETECTED_EVENT", "SOURCE", "Detection", "LoopDetector"]

PLUGIN: Final = "loop-detector"
SOURCE: Final = MessageSource("plugin", PLUGIN)
#: The span event each detection adds to its call's ``execute_tool`` span.
DETECTED_EVENT: Final = "guardstack.loop_detected"
#: The longest repeated sequence ``cycle`` looks for.
MAX_CYCLE: Final = 5
#: How many of a turn's latest calls the patterns look at (runs longer than this are
#: counted as this long; every threshold is far below it).
WINDOW: Final = 64
#: How alike two text replies must be (after their shared template) to be a monologue.
MONOLOGUE_SIMILARITY: Final = 0.9

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


def _flag(key: str) -> Any:
    def check(_: Any, __: Any, value: Any) -> None:
        boolean(PLUGIN, key, value)

    return check


def _volatile(value: object) -> bool | tuple[str, ...]:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) or not isinstance(value, Collection):
        raise invalid(PLUGIN, "volatile", value, "true, false, or a list of argument key patterns")
    return patterns(PLUGIN, "volatile", list(value))


def _prompts(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Collection):
        raise invalid(PLUGIN, "continue_prompts", value, "a list of prompt texts")
    if not all(isinstance(text, str) and text.strip() for text in value):
        raise invalid(PLUGIN, "continue_prompts", value, "a list of non-empty prompt texts")
    return tuple(value)


def _fold(text: str) -> str:
    return " ".join(text.split()).casefold()


@attrs.frozen
class _Entry:
    """One watched call, as the patterns compare it."""

    key: str
    name: str
    result: str
    error: str | None
    step: object
    fields: dict[str, Hashable] | None = attrs.field(eq=False)
    raw_result: str = attrs.field(eq=False)
    #: The fields that are not volatile: what counters and walking compare.
    stable: dict[str, Hashable] | None = attrs.field(default=None, eq=False)
    acknowledgement: bool = False
    empty: bool = False
    pending: bool = False
    #: Whether this result advanced: one the same call had not returned before.
    fresh: bool = True
    #: A call the patterns look through: its result is empty, an acknowledgement, or
    #: what the same tool answered last time to other arguments (constant).
    bookkeeping: bool = False
    #: The result as the tool gave it (what a predicted repeat is assumed to answer).
    outcome: ToolResult | None = attrs.field(default=None, eq=False)


@attrs.frozen
class Detection:
    """A loop the detector saw: its pattern, the calls involved, the detection's number,
    and the argument fields it treated as volatile to see it."""

    pattern: str
    tools: tuple[str, ...]
    repeats: int
    number: int
    volatile: tuple[str, ...] = ()


class _Turn:
    """One conversation's turn: the watched calls and how many detections so far."""

    __slots__ = ("detections", "entries", "looping")

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.detections = 0
        #: Calls whose last repetition was part of a detected loop (the ones deny stops).
        self.looping: set[str] = set()


@attrs.frozen
class LoopDetector:
    """Detects loops that do not repeat exactly; remind → deny → end the turn."""

    name: ClassVar[str] = PLUGIN

    identical: int | None = attrs.field(default=5, validator=_threshold("identical"))
    cycle: int | None = attrs.field(default=3, validator=_threshold("cycle"))
    no_progress: int | None = attrs.field(default=3, validator=_threshold("no_progress"))
    repeated_error: int | None = attrs.field(default=3, validator=_threshold("repeated_error"))
    remind: int | None = attrs.field(default=1, validator=optional_integer(PLUGIN, "remind"))
    deny: int | None = attrs.field(default=5, validator=optional_integer(PLUGIN, "deny"))
    end_turn: int | None = attrs.field(default=10, validator=optional_integer(PLUGIN, "end_turn"))
    include: tuple[str, ...] = attrs.field(default=(), converter=_include)
    exclude: tuple[str, ...] = attrs.field(default=(), converter=_exclude)
    count_parallel_once: bool = attrs.field(default=True, validator=_flag("count_parallel_once"))
    volatile: bool | tuple[str, ...] = attrs.field(default=True, converter=_volatile)
    walking: int | None = attrs.field(default=4, validator=_threshold("walking"))
    poll: int | None = attrs.field(default=12, validator=_threshold("poll"))
    monologue: int | None = attrs.field(default=None, validator=_threshold("monologue"))
    continue_prompts: tuple[str, ...] = attrs.field(default=(), converter=_prompts)
    across_turns: bool = attrs.field(default=True, validator=_flag("across_turns"))
    #: Detect as usual, record what it would have done (remind, deny, end the turn), act
    #: on nothing.
    shadow: bool = attrs.field(default=False, validator=_flag("shadow"), kw_only=True)
    _include: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)
    _exclude: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)
    _volatile_keys: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)
    _hinted_keys: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)
    _resets: Resettable = attrs.field(init=False, repr=False, eq=False, factory=Resettable)

    def __attrs_post_init__(self) -> None:
        tool_patterns = (
            self.identical,
            self.cycle,
            self.no_progress,
            self.repeated_error,
            self.walking,
            self.poll,
        )
        if not any(tool_patterns) and not self.monologue:
            raise invalid(PLUGIN, "identical", None, "set (or another pattern): all are off")
        if self.monologue and not self.continue_prompts:
            raise invalid(
                PLUGIN,
                "continue_prompts",
                (),
                "given with `monologue` (the automatic prompts a monologue runs across)",
            )
        rungs = [(k, v) for k, v in (("remind", self.remind), ("deny", self.deny)) if v]
        rungs += [("end_turn", self.end_turn)] if self.end_turn else []
        for (low, low_at), (high, high_at) in itertools.pairwise(rungs):
            if high_at < low_at:
                raise invalid(PLUGIN, high, high_at, f">= `{low}` ({low_at}): the ladder climbs")
        object.__setattr__(self, "_include", compile_patterns(self.include))
        object.__setattr__(self, "_exclude", compile_patterns(self.exclude))
        # volatile=True: values by their form, fields by behaviour (names only hint);
        # volatile=[...]: those keys are masked outright as well
        keys: tuple[str, ...] = ()
        hints: tuple[str, ...] = ()
        if self.volatile is True:
            hints = vol.HINTED_KEYS
        elif self.volatile:
            keys = hints = tuple(key.lower() for key in self.volatile)
        object.__setattr__(self, "_volatile_keys", compile_patterns(keys))
        object.__setattr__(self, "_hinted_keys", compile_patterns(hints))

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
        watcher = _Watcher(self, turns, scope.signals)
        scope.use(scope.tools.pre_execute, watcher.pre_execute, name=PLUGIN)
        scope.use(scope.tools.post_execute, watcher.post_execute, name=PLUGIN)
        scope.use(scope.loop.prompt_submit, watcher.prompt_submit, name=PLUGIN)
        if self.monologue:
            scope.use(scope.loop.model_call, watcher.model_call, name=PLUGIN)

    # -- comparing calls ------------------------------------------------------------------

    def entry(
        self, call: ToolCall, result: ToolResult, step: object, previous: list[_Entry]
    ) -> _Entry:
        """A call and its result as the patterns compare them (``previous``: the turn's
        entries so far, for what varies across repeats and whether the result advanced)."""
        normalise = self.volatile is not False
        fields = vol.top_level(call.arguments)
        keys = self._volatile_keys
        stable = (
            {
                k: vol.MARK if normalise and vol.volatile_value(v) else v
                for k, v in fields.items()
                if keys is None or not keys.fullmatch(k.lower())
            }
            if fields is not None
            else None
        )
        exact = f"{len(call.name)}:{call.name}" + vol.arguments_key(
            call.arguments, self._volatile_keys, normalise
        )
        key = exact
        if result.is_error:
            error = result.error
            code = error.code if error is not None else None
            text = error.message if error is not None else result.content
            raw = f"{code}:{text}"
            content, failure = "", f"{code}:{vol.result_key(text) if normalise else text}"
        else:
            raw = result.content
            content = vol.result_key(raw) if normalise else raw
            failure = None
        last = next((e for e in reversed(previous[-16:]) if e.name == call.name), None)
        if normalise and last is not None:
            if (
                previous[-1] is last
                and last.key == exact
                and failure is None
                and last.error is None
            ):
                # an id the tool steps on each identical call is not news; a pending
                # status whose count moves on is (a poll's rows processed)
                if not vol.is_pending(raw) and _counted_text(last.raw_result, raw):
                    content = last.result  # the same call, its result's counter one on
            elif stable is not None and _counted_on(last.stable, stable):
                key = last.key  # the same call with a counter one further on
            elif (
                stable is not None
                and (last.result, last.error) == (content, failure)
                and self._varies_only_in_hinted(last.stable, stable)
            ):
                key = last.key  # a request id, a nonce: new each time, the result the same
        seen = (e for e in previous[-WINDOW:] if e.key == key)
        fresh = all(e.result != content or e.error != failure for e in seen)
        empty = failure is None and (not raw.strip() or vol.is_empty(raw))
        acknowledgement = failure is None and vol.is_acknowledgement(raw)
        constant = (
            last is not None
            and last.key != key
            and failure is None
            and last.error is None
            and last.raw_result == raw
        )
        return _Entry(
            key,
            call.name,
            content,
            failure,
            step,
            fields,
            raw,
            stable=stable,
            acknowledgement=acknowledgement,
            empty=empty,
            pending=failure is None and vol.is_pending(raw),
            fresh=fresh,
            bookkeeping=acknowledgement or empty or constant,
            outcome=result,
        )

    def _varies_only_in_hinted(
        self, before: dict[str, Hashable] | None, after: dict[str, Hashable]
    ) -> bool:
        hints = self._hinted_keys
        if hints is None or before is None or before.keys() != after.keys():
            return False
        moved = [key for key in after if after[key] != before[key]]
        return bool(moved) and all(hints.fullmatch(key.lower()) for key in moved)

    # -- the patterns ---------------------------------------------------------------------

    def detect(self, entries: list[_Entry]) -> Detection | None:
        """The loop the last entry completes (most specific pattern first), or ``None``."""
        if not entries:
            return None
        entries = entries[-WINDOW:]
        last = entries[-1]
        # Bookkeeping (another tool's call that answered nothing to depend on) is looked
        # through: an empty or constant result, an acknowledgement.
        view = [e for e in entries if e.name == last.name or not e.bookkeeping]
        found = self._detect(view, last)
        if found is None:
            return None
        involved = view[-max(found.repeats * len(found.tools), 1) :]
        return attrs.evolve(found, volatile=_differing(involved))

    def _detect(self, entries: list[_Entry], last: _Entry) -> Detection | None:
        same_call = _run_length(entries, lambda e: e.key == last.key)
        if self.repeated_error and last.error is not None:
            same = _same_failures(entries, last)
            if same >= self.repeated_error:
                return Detection("repeated_error", (last.name,), same, 0)
        if self.poll and last.error is None and last.pending:
            same = _run_length(
                entries,
                lambda e: e.key == last.key and e.error is None and e.result == last.result,
            )
            if same >= self.poll:
                return Detection("poll", (last.name,), same, 0)
            return None  # a poll is given its own patience, and nothing else
        if self.no_progress and last.error is None:
            same = _run_length(
                entries, lambda e: e.key == last.key and e.error is None and e.result == last.result
            )
            if same >= self.no_progress:
                return Detection("no_progress", (last.name,), same, 0)
        if self.identical and same_call >= self.identical and not last.fresh:
            return Detection("identical", (last.name,), same_call, 0)
        if self.walking and last.error is None:
            walked = _walk_length(entries)
            if walked >= self.walking:
                return Detection("walking", (last.name,), walked, 0)
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
        besides = (
            f" (differing only in {', '.join(found.volatile)}, which change on every call)"
            if found.volatile
            else ""
        )
        if found.pattern == "repeated_error":
            return (
                f"Potential loop detected: {tools} failed the same way {found.repeats} times "
                f"in a row with the same arguments{besides}. Do not call it again like this: "
                "read the error, change the arguments or the approach, or report what is "
                "blocking you."
            )
        if found.pattern == "no_progress":
            return (
                f"Potential loop detected: {tools} returned the same result {found.repeats} "
                f"times in a row{besides}, so calling it again will not tell you anything "
                "new. Use that result, or step back and try a different approach."
            )
        if found.pattern == "poll":
            return (
                f"Potential loop detected: {tools} has answered the same pending status "
                f"{found.repeats} times in a row{besides}. Wait longer between checks, stop "
                "polling and report the status, or find out why it does not move."
            )
        if found.pattern == "walking":
            return (
                f"Potential loop detected: {tools} was called {found.repeats} times with one "
                "argument moving on (the next page, a larger offset) and returned nothing "
                "new each time: there is nothing further that way. Use what you have."
            )
        if found.pattern == "monologue":
            return (
                f"Potential loop detected: your last {found.repeats} replies said nearly the "
                "same thing. Do not repeat it: act on it with a tool, or say plainly that "
                "you are done or what is blocking you."
            )
        if found.pattern == "identical":
            return (
                f"Potential loop detected: {tools} was called with the same arguments "
                f"{found.repeats} times in a row{besides}. Step back: use what it returned, "
                "or try a different approach."
            )
        return (
            f"Potential loop detected: the sequence {tools} repeated {found.repeats} times "
            f"in a row without progress{besides}. Step back and try a different approach, "
            "or finish with what you have."
        )


def _same_failures(entries: list[_Entry], last: _Entry) -> int:
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


def _counted_text(before: str, after: str) -> bool:
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


def _run_length(entries: list[_Entry], same: Any) -> int:
    count = 0
    for entry in reversed(entries):
        if not same(entry):
            break
        count += 1
    return count


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _counted_on(before: dict[str, Hashable] | None, after: dict[str, Hashable]) -> bool:
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


def _walk_length(entries: list[_Entry]) -> int:
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


def _cycle_repeats(entries: list[_Entry], length: int) -> int:
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


def _differing(entries: list[_Entry]) -> tuple[str, ...]:
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


def _after_template(first: str, second: str) -> tuple[str, str]:
    """Both texts without the prefix they share (a reply template's header)."""
    shared = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        shared += 1
    return first[shared:], second[shared:]


def _alike(first: str, second: str) -> bool:
    """Near-identical replies: equal once folded (volatile parts masked), or nearly equal
    in what follows the prefix they share — so two replies sharing a long template
    header but saying different things after it are not alike."""
    a, b = _fold(vol.result_key(first)), _fold(vol.result_key(second))
    if a == b:
        return True
    rest_a, rest_b = _after_template(a, b)
    return difflib.SequenceMatcher(None, rest_a, rest_b).ratio() >= MONOLOGUE_SIMILARITY


class _Monologue:
    """An agent's text replies across automatic continuations."""

    __slots__ = ("continued", "detections", "pending", "replies")

    def __init__(self) -> None:
        self.replies: list[str] = []
        self.continued = False
        self.detections = 0
        self.pending: Detection | None = None


class _Watcher:
    """One application's turns, and the layers that watch and stop loops."""

    __slots__ = ("config", "monologues", "shadow", "signals", "turns")

    def __init__(
        self, config: LoopDetector, turns: ConversationState[_Turn], signals: Signals
    ) -> None:
        self.config = config
        self.turns = turns
        self.signals = signals
        self.shadow = Shadow(PLUGIN, signals) if config.shadow else None
        self.monologues: weakref.WeakKeyDictionary[Agent, _Monologue] = weakref.WeakKeyDictionary()

    def _turn(self, call: ToolCall) -> _Turn:
        turn = self.turns.get(call)
        if turn is None:
            turn = _Turn()
            self.turns.set(call, turn)
        return turn

    def _is_parallel_repeat(self, turn: _Turn, entry: _Entry) -> bool:
        if not self.config.count_parallel_once:
            return False
        return any(e.step == entry.step and e.key == entry.key for e in turn.entries[-8:])

    async def prompt_submit(self, agent: Agent, text: str, call_next: PromptNext) -> str:
        """A person's prompt starts the ladder afresh; an automatic continuation does not
        (with ``monologue``), and carries the monologue reminder when one is due."""
        config = self.config
        automatic = bool(config.monologue) and _fold(text) in {
            _fold(prompt) for prompt in config.continue_prompts
        }
        monologue = self.monologues.get(agent)
        if not automatic:
            turn = self.turns.of_agent(agent) if config.across_turns else None
            if turn is not None:  # the ladder starts again; the evidence stays
                turn.detections = 0
                turn.looping.clear()
            else:
                await self.turns.reset_on_prompt(agent, text, _echo)
            self.monologues.pop(agent, None)
            return await call_next(agent, text)
        if monologue is None:
            monologue = self.monologues[agent] = _Monologue()
        monologue.continued = True
        found, monologue.pending = monologue.pending, None
        if found is not None and config.remind is not None and found.number == config.remind:
            if self.shadow is None:
                text = f"{text}\n\n{config.text(found)}"
            else:
                self.shadow.would("remind", f"agent {agent.session_id}", found.pattern)
        return await call_next(agent, text)

    async def model_call(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        """Watch text replies across automatic continuations (``monologue``); past the
        ``deny`` (or ``end_turn``) detection, a continuation gets no model request."""
        config = self.config
        agent = request.agent
        monologue = self.monologues.get(agent)
        if monologue is not None and monologue.continued and monologue.detections:
            stops = [rung for rung in (config.deny, config.end_turn) if rung is not None]
            if stops and monologue.detections >= min(stops):
                found = Detection("monologue", (), len(monologue.replies), monologue.detections)
                if self.shadow is None:
                    raise TurnBlocked(f"{PLUGIN}: {config.text(found)} (turn ended)")
                self.shadow.would("end the turn", f"agent {agent.session_id}", found.pattern)
        reply = await call_next(request)
        if reply.tool_calls:
            if monologue is not None:
                monologue.replies.clear()
            return reply
        if monologue is None:
            monologue = self.monologues[agent] = _Monologue()
        if monologue.replies and not _alike(monologue.replies[-1], reply.text):
            monologue.replies.clear()
        monologue.replies.append(reply.text)
        repeats = len(monologue.replies)
        if config.monologue and repeats >= config.monologue:
            monologue.detections += 1
            monologue.pending = Detection("monologue", (), repeats, monologue.detections)
            _report(monologue.pending, monologue.detections, self.signals)
        return reply

    async def pre_execute(self, call: ToolCall, call_next: PreNext) -> PreDecision:
        config = self.config
        if (config.deny is None and config.end_turn is None) or not config.tracks(call.name):
            return await call_next(call)
        turn = self._turn(call)
        if not turn.looping or turn.detections + 1 < min(
            value for value in (config.deny, config.end_turn) if value is not None
        ):
            return await call_next(call)
        # Would this call continue a loop detected on its previous repetition? Assume it
        # answers as the tool's last call did (a call whose last result advanced is
        # never stopped).
        last = next((e for e in reversed(turn.entries) if e.name == call.name), None)
        probe = last.outcome if last is not None and last.outcome is not None else ToolResult("")
        predicted = config.entry(call, probe, _step(call), turn.entries)
        previous = next((e for e in reversed(turn.entries) if e.key == predicted.key), None)
        if previous is None or previous.key not in turn.looping or previous.fresh:
            return await call_next(call)
        predicted = attrs.evolve(previous, step=predicted.step, fresh=False)
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
            if self.shadow is None:
                return Deny(reason, end_turn=ends)
            decision = "end the turn" if ends else "deny"
            self.shadow.would(decision, f'tool "{call.name}"', f"{found.pattern} loop")
        return await call_next(call)

    async def post_execute(
        self, call: ToolCall, result: ToolResult, call_next: PostNext
    ) -> PostDecision:
        config = self.config
        if not config.tracks(call.name):
            return await call_next(call, result)
        turn = self._turn(call)
        decision = await call_next(call, result)
        denial = result.error.message if result.error is not None else ""
        if result.code == TOOL_DENIED and denial.startswith(f"{PLUGIN}:"):
            turn.detections += 1  # our own denial: the loop went on, and nothing ran
            return decision
        entry = config.entry(call, result, _step(call), turn.entries)
        if self._is_parallel_repeat(turn, entry):
            return decision
        turn.entries.append(entry)
        if len(turn.entries) > MAX_CYCLE * 32:
            del turn.entries[: MAX_CYCLE * 16]
        found = config.detect(turn.entries)
        if found is None:
            turn.looping.discard(entry.key)
            return decision
        turn.looping.add(entry.key)
        turn.detections += 1
        _report(found, turn.detections, self.signals)
        if config.remind is None or turn.detections != config.remind:
            return decision
        if self.shadow is not None:
            self.shadow.would("remind", f'tool "{call.name}"', f"{found.pattern} loop")
            return decision
        reminder = ContextMessage(config.text(found), SOURCE)
        self.signals.add(REMINDERS, 1, {"pattern": found.pattern})
        return attrs.evolve(decision, additional_contexts=(reminder, *decision.additional_contexts))


async def _echo(agent: Agent, text: str) -> str:
    return text


def _report(found: Detection, number: int, signals: Signals) -> None:
    signals.add(LOOP_DETECTIONS, 1, {"pattern": found.pattern})
    if signals.listened:
        signals.event(
            DETECTED_EVENT,
            {
                "guardstack.loop.pattern": found.pattern,
                "guardstack.loop.tools": list(found.tools),
                "guardstack.loop.repeats": found.repeats,
                "guardstack.loop.detection": number,
                "guardstack.loop.volatile": list(found.volatile),
            },
            "WARN",
        )
    logger.info(
        "loop-detector: %s loop (%s, %d times), detection %d%s",
        found.pattern,
        " -> ".join(found.tools) or "text replies",
        found.repeats,
        number,
        f", volatile: {', '.join(found.volatile)}" if found.volatile else "",
    )
