"""Repeat-tool reminder: notice an agent making the same call again and again, and say so.

The seed's ``@deepseek-ai/dsh-repeat-tool-reminder``: an advisory loop-breaker for
the failure no timeout can catch — every call succeeds quickly, and the agent
makes no progress. It counts *consecutive identical* calls per agent and, at the
configured thresholds, adds a reminder to the model's context. It never blocks,
delays or rewrites a call; the model keeps the decision.

Where it belongs: a post-execute layer (plus a prompt-submit layer that resets the
chain). Counting happens in post-execute, which runs for every call that reached
the registry — so denied calls, unknown tools, errors and timeouts count too (a
model hammering a denied call is exactly the loop to break); only final results
of a broken layer and calls cancelled with their turn do not. Its position among
other post-execute layers does not change what it counts; it only decides whose
contexts come first (its reminder is put before the downstream decision's).

Rules (the original's, R17–R23):

* chain key = tool name + canonical arguments (``guards.canonical``: deep key sort,
  compact JSON, so key order does not matter and ``1`` equals ``1.0``);
* ``include`` / ``exclude`` are ``*``-wildcard patterns matched against the whole
  name; an untracked call neither counts nor resets the chain, so a bookkeeping
  tool between two identical calls cannot launder the loop;
* at ``thresholds[0]`` (after sorting) a short gentle reminder, at every later
  threshold a detailed one naming the tool, the count and the arguments (preview
  capped at ``arguments_preview_chars`` UTF-16 units); nothing after the last;
* each agent (and subagent) has its own chain, held in a weak map keyed on the
  agent object, so it dies with the agent; each new person's prompt resets that
  agent's chain; nothing is persisted, so a restored session starts fresh;
* a call outside the agent loop counts in its ``call.conversation`` (a framework's
  thread id), or, with neither, in one anonymous conversation with a
  ``GuardstackWarning`` (``guards.agent_state``); ``reset(conversation)`` starts a
  conversation's new turn for callers without a ``prompt_submit`` stage.

The reminder is a user message with source ``{kind: plugin, plugin:
repeat-tool-reminder}``, added after the step's tool results; the tool's own output
stays in the log untouched.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from typing import ClassVar, Final

import attrs

from guardstack.guards.agent_state import ConversationState, Resettable
from guardstack.guards.canonical import canonical_json, utf16_length, utf16_prefix
from guardstack.pipeline.contract import PostNext, Scope
from guardstack.pipeline.signals import REMINDERS, Shadow, Signals
from guardstack.pipeline.validate import compile_patterns, cut, flag, invalid, patterns, rejected
from guardstack.pipeline.values import ContextMessage, MessageSource, ToolCall, ToolResult
from guardstack.pipeline.verdicts import PostDecision

__all__ = ["DETAILED_TEMPLATE", "GENTLE_TEXT", "SOURCE", "RepeatToolReminder"]

PLUGIN: Final = "repeat-tool-reminder"
SOURCE: Final = MessageSource("plugin", PLUGIN)

GENTLE_TEXT: Final = (
    "You are repeating the exact same tool call with identical arguments. Carefully analyze "
    "the previous result before calling again: if the task is not complete, try a different "
    "approach or different arguments instead of repeating the call."
)
DETAILED_TEMPLATE: Final = (
    "Repeated tool call detected:\n"
    "- tool: {tool}\n"
    "- consecutive_calls: {count}\n"
    "- arguments: {arguments}\n"
    "The repeated calls are not making progress. Do not call this tool with these exact "
    "arguments again. Inspect the latest result and choose a different action, different "
    "arguments, or finish the task if enough evidence has been gathered."
)


def _thresholds(value: object) -> tuple[int, ...]:
    # The original's own messages (reference R-config), with this plugin's name.
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise invalid(PLUGIN, "thresholds", value, "a list of integers")
    if not value:
        raise rejected(PLUGIN, "thresholds", value, "`thresholds` must not be empty")
    thresholds = []
    for threshold in value:
        integral = isinstance(threshold, int) or (
            isinstance(threshold, float) and threshold.is_integer()
        )
        if isinstance(threshold, bool) or not integral or threshold < 2:
            raise rejected(
                PLUGIN,
                "thresholds",
                value,
                f"invalid threshold {cut(threshold)} — every threshold must be an integer >= 2",
            )
        thresholds.append(int(threshold))
    if len(set(thresholds)) != len(thresholds):
        raise rejected(PLUGIN, "thresholds", value, "`thresholds` must not contain duplicates")
    return tuple(sorted(thresholds))


def _include(value: object) -> tuple[str, ...]:
    return patterns(PLUGIN, "include", value)


def _exclude(value: object) -> tuple[str, ...]:
    return patterns(PLUGIN, "exclude", value)


def _preview_chars(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise rejected(
            PLUGIN,
            "arguments_preview_chars",
            value,
            f"invalid arguments_preview_chars {cut(value)} — must be an integer >= 1",
        )
    return value


@attrs.frozen
class _Chain:
    key: str
    count: int


@attrs.frozen
class RepeatToolReminder:
    """Reminds an agent, at ``thresholds`` consecutive identical calls, to change course."""

    name: ClassVar[str] = PLUGIN

    thresholds: tuple[int, ...] = attrs.field(default=(3, 5, 8), converter=_thresholds)
    include: tuple[str, ...] = attrs.field(default=(), converter=_include)
    exclude: tuple[str, ...] = attrs.field(default=(), converter=_exclude)
    arguments_preview_chars: int = attrs.field(default=500, converter=_preview_chars)
    #: Count as usual, record the reminders it would add, add none.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)
    _include: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)
    _exclude: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)
    _resets: Resettable = attrs.field(init=False, repr=False, eq=False, factory=Resettable)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_include", compile_patterns(self.include))
        object.__setattr__(self, "_exclude", compile_patterns(self.exclude))

    def tracks(self, tool_name: str) -> bool:
        """Whether calls to ``tool_name`` count (and break chains)."""
        if self._include is not None and not self._include.fullmatch(tool_name):
            return False
        return self._exclude is None or not self._exclude.fullmatch(tool_name)

    def reminder(self, tool_name: str, canonical: str, count: int) -> ContextMessage:
        """The text the model gets at ``count`` consecutive calls (a threshold)."""
        if count == self.thresholds[0]:
            return ContextMessage(GENTLE_TEXT, SOURCE)
        cap = self.arguments_preview_chars
        preview = canonical
        if utf16_length(canonical) > cap:
            preview = utf16_prefix(canonical, cap)
            hidden = utf16_length(canonical) - utf16_length(preview)
            preview = f"{preview}… (+{hidden} more chars)"
        text = DETAILED_TEMPLATE.format(tool=tool_name, count=count, arguments=preview)
        return ContextMessage(text, SOURCE)

    def reset(self, conversation: Hashable | None) -> None:
        """Start a new turn for ``conversation`` (a key, an agent, or ``None``: anonymous).

        For callers outside the agent loop, where no ``prompt_submit`` stage resets it.
        """
        self._resets.reset(conversation)

    def apply(self, scope: Scope) -> None:
        """Register the counting post-execute layer and the prompt reset, with fresh chains."""
        chains: ConversationState[_Chain] = self._resets.track(ConversationState(PLUGIN))
        counter = _ChainCounter(self, chains, scope.signals)
        scope.use(scope.tools.post_execute, counter.post_execute, name=self.name)
        # a new person's prompt resets the submitting agent's chain
        scope.use(scope.loop.prompt_submit, chains.reset_on_prompt, name=self.name)


class _ChainCounter:
    """One application's chains, and the post-execute layer that counts them."""

    __slots__ = ("chains", "config", "shadow", "signals")

    def __init__(
        self, config: RepeatToolReminder, chains: ConversationState[_Chain], signals: Signals
    ) -> None:
        self.config = config
        self.chains = chains
        self.signals = signals
        self.shadow = Shadow(PLUGIN, signals) if config.shadow else None

    async def post_execute(
        self, call: ToolCall, result: ToolResult, call_next: PostNext
    ) -> PostDecision:
        config = self.config
        if not config.tracks(call.name):
            return await call_next(call, result)
        canonical = canonical_json(call.arguments)
        # The chain key: the tool's name and its canonical arguments, computed once.
        key = f"{len(call.name)}:{call.name}{canonical}"
        previous = self.chains.get(call)
        count = previous.count + 1 if previous is not None and previous.key == key else 1
        self.chains.set(call, _Chain(key, count))
        decision = await call_next(call, result)
        if count not in config.thresholds:
            return decision
        if self.shadow is not None:
            self.shadow.would("remind", f'tool "{call.name}"', f"{count} identical calls in a row")
            return decision
        reminder = config.reminder(call.name, canonical, count)
        self.signals.add(REMINDERS, 1, {"pattern": "repeat", "gen_ai.tool.name": call.name})
        contexts: tuple[ContextMessage, ...] = (reminder, *decision.additional_contexts)
        return attrs.evolve(decision, additional_contexts=contexts)
