"""A conversation's guards behind the proxy: its turns, the tool calls in its history, the
calls its model's answers ask for, and a client's resends.

What is decided where (``docs/model-proxy.md`` has the table):

* **On the answer that asks** (``decide``): every pre-execute layer — a tool-call cap, a
  loop denial, a paused tool — for each call the model's answer asks for, before the
  agent runs it. A call let through is counted then, and marked decided.
* **On the next request** (``history``): what needs the call's result — the
  post-execute layers (the loop detector's evidence, reminders, a block that ends the
  turn) — for each result the history brings. A call the proxy never saw asked (a
  conversation met afresh, an answer that did not pass through this process) goes
  through the whole tool stage here instead, as before.

A **resend** is the same model and history again in the same conversation (official
clients retry by themselves and ignore ``x-should-retry: false``): its upstream calls
are attempts of one operation, so a model-stage ``retry {attempts: N}`` makes at most
N upstream calls for it however often the client sends it, and the resends past those
are answered with the upstream's last error without going upstream.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from guardstack.gateway.model_proxy.answers import Asked, Decide
from guardstack.gateway.model_proxy.conversations import Conversation
from guardstack.gateway.model_proxy.wires import Wire
from guardstack.pipeline import ToolCall, ToolDefinition, ToolOutcome, ToolResult
from guardstack.pipeline.decisions import layer_of
from guardstack.pipeline.values import TOOL_DENIED

if TYPE_CHECKING:
    from guardstack.pipeline import Harness

__all__ = ["Attempts", "Guard", "plugin_of"]

#: How many failed operations a conversation remembers (the most recent).
MAX_RESENDS: Final = 32


def plugin_of(text: str) -> str:
    """The plugin a refusal's text names (``tool-call-limit: …``), else ``guardstack``."""
    return layer_of(text)


def _answered(content: str) -> Callable[[Any, ToolCall], Awaitable[ToolResult]]:
    async def already_ran(arguments: Any, call: ToolCall) -> ToolResult:
        return ToolResult(content)  # the client ran it: this is what it answered

    return already_ran


async def _never(arguments: Any, call: ToolCall) -> ToolResult:
    return ToolResult("")  # the client runs it; decide() never reaches a tool


class Attempts:
    """One operation's calls to each upstream across a client's resends, and the last
    failure each answered (status, body, content type, headers). A fallback to another
    upstream is not a retry: each upstream counts its own."""

    __slots__ = ("failures", "used")

    def __init__(self) -> None:
        self.used: dict[str, int] = {}
        self.failures: dict[str, tuple[int, bytes, str | None, dict[str, str]]] = {}

    def answered(self) -> None:
        """The operation got its answer: the same body sent later is a new operation."""
        self.used.clear()
        self.failures.clear()


class Guard:
    """The guards of ``harness`` applied to the proxy's conversations."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness

    # -- turns --------------------------------------------------------------------------

    async def start_turn_if_new(
        self, conversation: Conversation, wire: Wire, messages: list[Any]
    ) -> None:
        """A new person's message starts a new turn: the last one ends, per-turn guards
        start again."""
        prompts = wire.prompts(messages)
        if prompts == conversation.prompts:
            return
        agent, loop = conversation.agent, self.harness.loop
        if conversation.prompts >= 0:
            await loop.turn_ended(agent)
        conversation.prompts = prompts
        conversation.succeeded, conversation.failed = False, None
        await loop.prompt_submit(agent, wire.last_prompt(messages))
        agent.start_turn()

    # -- the history: results of calls that ran ----------------------------------------

    async def history(
        self, conversation: Conversation, wire: Wire, messages: list[Any]
    ) -> tuple[tuple[str, str] | None, list[str]]:
        """The history's results the guards have not seen, through the post-execute
        stage (a call decided on its answer) or the whole tool stage (one never seen
        asked): the stop ``(plugin, text)`` if one refuses, and the reminders."""
        reminders: list[str] = []
        agent = conversation.agent
        tools = self.harness.tools
        for call_id, name, arguments, content in wire.calls(messages):
            if call_id in conversation.calls:
                continue
            conversation.calls.add(call_id)
            call = ToolCall(name, arguments, call_id, agent)
            definition = ToolDefinition(name, _answered(content))
            if call_id in conversation.decided:
                conversation.decided.discard(call_id)
                outcome = await tools.review(call, ToolResult(content), tool=definition)
            else:
                outcome = await tools.execute(call, tool=definition)
            reminders.extend(context.text for context in outcome.contexts)
            if outcome.result.code == TOOL_DENIED or outcome.ends_turn:
                text = outcome.result.error.message if outcome.result.error else ""
                return (plugin_of(text), text), reminders
        return None, reminders

    # -- the answer: calls it asks for -------------------------------------------------

    def deciding(
        self, conversation: Conversation, on_stop: Callable[[str, str], None] | None = None
    ) -> Decide:
        """What decides the calls an answer of ``conversation``'s model asks for: the
        stop's text (``Stopped by PLUGIN: …``), or ``None`` to let them run. ``on_stop``
        is told of every stop it decides: its layer and its text."""
        tools = self.harness.tools

        async def decide(asked: list[Asked]) -> str | None:
            agent = conversation.agent
            for call_id, name, arguments in asked:
                if call_id in conversation.decided or call_id in conversation.calls:
                    continue  # the same answer again (a resend): decided once
                call = ToolCall(name, arguments if isinstance(arguments, dict) else {},
                                call_id, agent)  # fmt: skip
                decided = await tools.decide(call, tool=ToolDefinition(name, _never))
                if isinstance(decided, ToolOutcome):
                    result = decided.result
                    if result.code == TOOL_DENIED or decided.ends_turn or result.is_error:
                        conversation.calls.add(call_id)  # it never runs: nothing to review
                        text = result.error.message if result.error else result.content
                        if on_stop is not None:
                            on_stop(plugin_of(text), text)
                        return f"Stopped by {plugin_of(text)}: {text}"
                conversation.decided.add(call_id)
            return None

        return decide

    # -- resends ----------------------------------------------------------------------

    @staticmethod
    def attempts(conversation: Conversation, history: list[str]) -> Attempts:
        """The operation a request is in ``conversation``: the same model and history
        again is a resend (a client's retry may change its metadata — Codex's turn
        ids — never the conversation it asks about)."""
        resends: OrderedDict[str, Attempts] = conversation.resends
        digest = hashlib.sha256("\n".join(history).encode()).hexdigest()[:32]
        found = resends.get(digest)
        if found is None:
            found = resends[digest] = Attempts()
            while len(resends) > MAX_RESENDS:
                resends.popitem(last=False)
        else:
            resends.move_to_end(digest)
        return found
