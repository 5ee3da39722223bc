"""Per-conversation guard state: weak per agent, bounded per conversation key, reset per turn.

``RepeatToolReminder`` (its chain) and ``ToolCallLimit`` (its per-turn counts) keep
state per conversation. A call made by the agent loop belongs to its ``agent``;
a call made outside it (``registry.execute``, a framework adapter, the MCP proxy)
belongs to ``call.conversation``, which adapters fill with their framework's
thread or session id. A call with neither is counted in one anonymous
conversation, and the guard warns once (``GuardstackWarning``): a guard never
silently does nothing.

State never outlives what it is about: agents are held weakly, so their state
dies with them; conversation keys are kept in a bounded map (the least recently
used beyond ``MAX_CONVERSATIONS`` are forgotten), so a long-running server with
many conversations does not grow without bound. Each application of a guard
creates its own state, so one guard applied to two harnesses keeps two.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Final, Generic, TypeVar
from weakref import ref

from guardstack.pipeline.contract import new_token
from guardstack.pipeline.errors import GuardstackWarning
from guardstack.pipeline.values import ToolCall

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["ANONYMOUS", "MAX_CONVERSATIONS", "ConversationState", "Resettable", "new_turn_token"]

T = TypeVar("T")

#: How many keyed conversations a guard remembers (least recently used go first).
MAX_CONVERSATIONS: Final = 10_000


def new_turn_token() -> str:
    """A token no other turn, in this process or another, has: a turn's key prefix."""
    return new_token()


class _Anonymous:
    def __repr__(self) -> str:
        return "<anonymous conversation>"


#: The conversation of calls that name neither an agent nor a conversation.
ANONYMOUS: Final = _Anonymous()


class ConversationState(Generic[T]):
    """A guard application's state, one value per conversation."""

    def __init__(
        self,
        owner: str,
        max_conversations: int = MAX_CONVERSATIONS,
        *,
        on_forget: Callable[[T], None] | None = None,
    ) -> None:
        self.owner = owner
        self.max_conversations = max_conversations
        #: Told of each keyed conversation's state when it is forgotten (the least
        #: recently used past the bound, or reset): what it kept elsewhere can go too.
        self.on_forget = on_forget
        self._agents: weakref.WeakKeyDictionary[Agent, T] = weakref.WeakKeyDictionary()
        #: The weak map's own dict (weak reference -> state), read without its methods.
        self._by_reference: dict[ref[Agent], T] = vars(self._agents)["data"]
        self._keyed: OrderedDict[Hashable, T] = OrderedDict()
        self._warned = False

    def __len__(self) -> int:
        """How many conversations have state (agents and keys)."""
        return len(self._agents) + len(self._keyed)

    def conversation(self, call: ToolCall) -> Hashable:
        """The conversation a call belongs to: its agent, its key, or the anonymous one."""
        if call.agent is not None:
            return call.agent
        if call.conversation is not None:
            return call.conversation
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.owner}: a tool call with neither an agent nor a conversation; every "
                "such call counts in one shared conversation. Set ToolCall.conversation (your "
                "framework's thread or session id) to keep conversations apart.",
                GuardstackWarning,
                stacklevel=2,
            )
        return ANONYMOUS

    def get(self, call: ToolCall) -> T | None:
        """The state of the call's conversation, or ``None`` before its first call."""
        if call.agent is not None:  # the weak map's own lookup, without its method call
            return self._by_reference.get(ref(call.agent))
        key = self.conversation(call)
        state = self._keyed.get(key)
        if state is not None:
            self._keyed.move_to_end(key)
        return state

    def set(self, call: ToolCall, state: T) -> None:
        """Replace the state of the call's conversation."""
        if call.agent is not None:
            self._agents[call.agent] = state
            return
        key = self.conversation(call)
        self._keyed[key] = state
        self._keyed.move_to_end(key)
        while len(self._keyed) > self.max_conversations:
            _, forgotten = self._keyed.popitem(last=False)
            if self.on_forget is not None:
                self.on_forget(forgotten)

    def of_agent(self, agent: Agent) -> T | None:
        """The state of an agent's conversation (for layers on the loop's own stages)."""
        return self._by_reference.get(ref(agent))

    def set_agent(self, agent: Agent, state: T) -> None:
        self._agents[agent] = state

    def reset(self, conversation: Hashable | None) -> None:
        """Forget a conversation's state (an agent, a key, or ``None`` for the anonymous one)."""
        key = ANONYMOUS if conversation is None else conversation
        if isinstance(key, Hashable) and key in self._keyed:
            forgotten = self._keyed.pop(key)
            if self.on_forget is not None:
                self.on_forget(forgotten)
            return
        with contextlib.suppress(TypeError):  # not weak-referenceable: never an agent
            self._agents.pop(key, None)  # type: ignore[call-overload]

    async def reset_on_prompt(
        self, agent: Agent, text: str, call_next: Callable[[Agent, str], Awaitable[str]]
    ) -> str:
        """A ``prompt_submit`` layer: each new person's prompt starts the agent afresh."""
        self._agents.pop(agent, None)
        return await call_next(agent, text)

    def start_on_prompt(
        self, fresh: Callable[[], T]
    ) -> Callable[[Agent, str, Callable[[Agent, str], Awaitable[str]]], Awaitable[str]]:
        """A ``prompt_submit`` layer giving each new person's prompt the state ``fresh()``
        (where ``reset_on_prompt`` leaves none): the turn's first call then finds its
        state made, and only a turn this process did not start (resumed elsewhere)
        finds none."""

        async def start(
            agent: Agent, text: str, call_next: Callable[[Agent, str], Awaitable[str]]
        ) -> str:
            self._agents[agent] = fresh()
            return await call_next(agent, text)

        return start


class Resettable:
    """What a per-conversation guard keeps to offer ``reset(conversation)``.

    The guard's own fields are its frozen configuration; the states its
    applications create are remembered weakly here, so a reset reaches every
    harness the guard is applied to and a disposed application is forgotten.
    """

    def __init__(self) -> None:
        self._states: weakref.WeakSet[ConversationState[object]] = weakref.WeakSet()

    def track(self, state: ConversationState[T]) -> ConversationState[T]:
        self._states.add(state)  # type: ignore[arg-type]
        return state

    def reset(self, conversation: Hashable | None) -> None:
        for state in list(self._states):
            state.reset(conversation)
