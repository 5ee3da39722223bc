"""``LoopDetector``: its settings, how it turns a call into an entry, and which
pattern a turn's entries show."""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Hashable
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from guardstack.guards import volatile as vol
from guardstack.guards.agent_state import ConversationState, Resettable
from guardstack.guards.loop_detector.entry import MAX_CYCLE, PLUGIN, WINDOW, Detection, Entry, Turn
from guardstack.guards.loop_detector.patterns import (
    counted_on,
    counted_text,
    cycle_repeats,
    differing,
    run_length,
    same_failures,
    walk_length,
)
from guardstack.guards.loop_detector.text_watch import TextWatch
from guardstack.guards.loop_detector.watcher import Watcher
from guardstack.pipeline.contract import Scope
from guardstack.pipeline.validate import (
    boolean,
    compile_patterns,
    invalid,
    optional_integer,
    patterns,
)
from guardstack.pipeline.values import (
    ToolCall,
    ToolResult,
)

if TYPE_CHECKING:
    pass


#: The text-loop defaults, chosen on the tuning corpus (``benchmarks.loops --text``).
TEXT_REPEATS = 3
TEXT_MIN_BLOCK = 12
TEXT_MIN_CHARS = 80


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
    #: Watch each answer's text (and reasoning) for a block that keeps repeating: cut it
    #: there, a note the first time, the end of the turn the next (``text_watch``).
    text: bool = attrs.field(default=False, validator=_flag("text"))
    #: A text loop: ``text_repeats`` copies of a block of ``text_min_block`` characters
    #: or more, ``text_min_chars`` in all (chosen on a tuning corpus: ``benchmarks.loops
    #: --text``).
    text_repeats: int = attrs.field(default=TEXT_REPEATS, validator=_threshold("text_repeats"))
    text_min_block: int = attrs.field(
        default=TEXT_MIN_BLOCK, validator=optional_integer(PLUGIN, "text_min_block")
    )
    text_min_chars: int = attrs.field(
        default=TEXT_MIN_CHARS, validator=optional_integer(PLUGIN, "text_min_chars")
    )
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
        if not any(tool_patterns) and not self.monologue and not self.text:
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
        turns: ConversationState[Turn] = self._resets.track(ConversationState(PLUGIN))
        watcher = Watcher(self, turns, scope.signals)
        scope.use(scope.tools.pre_execute, watcher.pre_execute, name=PLUGIN)
        scope.use(scope.tools.post_execute, watcher.post_execute, name=PLUGIN)
        scope.use(scope.loop.prompt_submit, watcher.prompt_submit, name=PLUGIN)
        if self.monologue:
            scope.use(scope.loop.model_call, watcher.model_call, name=PLUGIN)
        if self.text:
            texts = TextWatch(self, scope.signals, watcher.shadow)
            scope.use(scope.loop.model_call, texts.model_call, name=PLUGIN)

    # -- comparing calls ------------------------------------------------------------------

    def entry(
        self, call: ToolCall, result: ToolResult, step: object, previous: list[Entry]
    ) -> Entry:
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
                if not vol.is_pending(raw) and counted_text(last.raw_result, raw):
                    content = last.result  # the same call, its result's counter one on
            elif stable is not None and counted_on(last.stable, stable):
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
        return Entry(
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

    def detect(self, entries: list[Entry]) -> Detection | None:
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
        return attrs.evolve(found, volatile=differing(involved))

    def _detect(self, entries: list[Entry], last: Entry) -> Detection | None:
        same_call = run_length(entries, lambda e: e.key == last.key)
        if self.repeated_error and last.error is not None:
            same = same_failures(entries, last)
            if same >= self.repeated_error:
                return Detection("repeated_error", (last.name,), same, 0)
        if self.poll and last.error is None and last.pending:
            same = run_length(
                entries,
                lambda e: e.key == last.key and e.error is None and e.result == last.result,
            )
            if same >= self.poll:
                return Detection("poll", (last.name,), same, 0)
            return None  # a poll is given its own patience, and nothing else
        if self.no_progress and last.error is None:
            same = run_length(
                entries, lambda e: e.key == last.key and e.error is None and e.result == last.result
            )
            if same >= self.no_progress:
                return Detection("no_progress", (last.name,), same, 0)
        if self.identical and same_call >= self.identical and not last.fresh:
            return Detection("identical", (last.name,), same_call, 0)
        if self.walking and last.error is None:
            walked = walk_length(entries)
            if walked >= self.walking:
                return Detection("walking", (last.name,), walked, 0)
        if self.cycle:
            for length in range(2, MAX_CYCLE + 1):
                repeats = cycle_repeats(entries, length)
                if repeats >= self.cycle:
                    names = tuple(e.name for e in entries[-length:])
                    return Detection("cycle", names, repeats, 0)
        return None

    def advice(self, found: Detection) -> str:
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
