"""What the framework adapters share: one framework tool call through a harness.

A framework (LangChain, the OpenAI Agents SDK, pydantic-ai) owns its tools and
runs them itself. An adapter hands guardstack the call and a ``run`` coroutine
that asks the framework to execute it; ``FrameworkCalls.execute`` runs the
harness's pre-execute, dispatch and post-execute stages with that coroutine
innermost (``registry.execute(call, tool=…)``), so timeouts, retries, caps, the
reminder and tracing apply exactly as in guardstack's own loop.

The tool's budget and idempotency come from a ``ToolDefinition`` of the same
name registered in the harness (its ``execute`` is never called), else from the
adapter's ``timeouts_ms`` (``*``-wildcard name patterns, first match wins); a
tool with neither has no budget, as everywhere.

Conversations: the adapter names the call's conversation (the framework's thread
or session id) and the run it belongs to; each run is a turn of its own
(``start_run`` gives its key), as a new person's prompt is in guardstack's own
loop, so two runs of one conversation at once never share or reset each other's
per-turn counts.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any, Final

from guardstack.pipeline import Harness, ToolCall, ToolDefinition, ToolOutcome, ToolResult
from guardstack.pipeline.approval import Decision
from guardstack.pipeline.tree import TREE_CAPS, RunKey
from guardstack.pipeline.validate import compile_patterns, invalid
from guardstack.pipeline.values import validate_timeout_ms

__all__ = ["FrameworkCalls", "RunKeys", "RunTool", "budget_ms", "budgets", "with_contexts"]

#: ``async (arguments, call) -> ToolResult``: the framework executing the call.
RunTool = Callable[[Mapping[str, Any], ToolCall], Awaitable[ToolResult]]

_TURNS = itertools.count(1)

#: How many conversations an adapter remembers the current run of (oldest go first).
MAX_TRACKED_RUNS: Final = 10_000


def budgets(owner: str, timeouts_ms: Mapping[str, int] | None) -> list[tuple[Any, int]]:
    """``timeouts_ms`` checked and compiled: ``(pattern, ms)`` in the caller's order."""
    if timeouts_ms is None:
        return []
    if not isinstance(timeouts_ms, Mapping):
        raise invalid(owner, "timeouts_ms", timeouts_ms, "a mapping of tool-name pattern to ms")
    compiled = []
    for pattern, ms in timeouts_ms.items():
        if not isinstance(pattern, str) or not pattern:
            raise invalid(owner, "timeouts_ms", timeouts_ms, "keyed by tool-name patterns")
        compiled.append((compile_patterns((pattern,)), validate_timeout_ms(owner, pattern, ms)))
    return compiled


def budget_ms(seconds: float | None) -> int | None:
    """A framework's own per-tool timeout in seconds as a guardstack budget (or none)."""
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return None
    return max(1, round(seconds * 1000))


def with_contexts(text: str, outcome: ToolOutcome) -> str:
    """The result text with the outcome's contexts (reminders) appended, one paragraph each.

    For places where a framework gives no way to add a message after a tool result.
    """
    return "\n\n".join([text, *(context.text for context in outcome.contexts)])


class _Run:
    """The run a conversation is in: compared by identity when it can be held weakly."""

    __slots__ = ("ref", "value")

    def __init__(self, run: object) -> None:
        try:
            self.ref: weakref.ref[Any] | None = weakref.ref(run)
            self.value: object = None
        except TypeError:
            self.ref, self.value = None, run

    def same(self, run: object) -> bool:
        if self.ref is not None:
            return self.ref() is run
        return bool(self.value == run)


class RunKeys:
    """A conversation key for each run object, for frameworks that name no conversation.

    Keyed by the run's identity (held weakly): a key is never handed to another
    run, even one that reuses a finished run's memory address.
    """

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._numbers = itertools.count(1)
        self._keys: dict[int, tuple[weakref.ref[Any], str]] = {}

    def key(self, run: object) -> str:
        entry = self._keys.get(id(run))
        if entry is not None and entry[0]() is run:
            return entry[1]
        key = f"{self._prefix}-{next(self._numbers)}"
        address = id(run)

        def forget(ref: weakref.ref[Any]) -> None:
            current = self._keys.get(address)
            if current is not None and current[0] is ref:
                del self._keys[address]

        self._keys[address] = (weakref.ref(run, forget), key)
        return key


def _charging_below(run: RunTool, caps: tuple[tuple[RunKey, Any], ...]) -> RunTool:
    """``run`` with ``caps`` charged for every guarded call made inside it: a sub-agent
    run the framework starts in a tool counts against this run's caps, no fresh
    allowance."""

    async def charged(arguments: Mapping[str, Any], call: ToolCall) -> ToolResult:
        token = TREE_CAPS.set(caps + TREE_CAPS.get())
        try:
            return await run(arguments, call)
        finally:
            TREE_CAPS.reset(token)

    return charged


class FrameworkCalls:
    """One adapter's way into a harness: budgets, conversations, runs."""

    def __init__(self, harness: Harness, owner: str, timeouts_ms: Mapping[str, int] | None) -> None:
        if not isinstance(harness, Harness):
            raise TypeError(f"{owner} takes a guardstack Harness, got {harness!r}")
        self.harness = harness
        self.owner = owner
        self._budgets = budgets(owner, timeouts_ms)
        self._runs: OrderedDict[tuple[Hashable, int], tuple[_Run, Hashable]] = OrderedDict()
        self._named: OrderedDict[tuple[Hashable, str], Hashable] = OrderedDict()

    def definition(
        self,
        name: str,
        run: RunTool,
        description: str = "",
        parameters: Mapping[str, Any] | None = None,
        timeout_ms: int | None = None,
    ) -> ToolDefinition:
        """The definition guardstack's layers see for the framework's tool ``name``.

        Its budget: the harness's definition's, else the first matching
        ``timeouts_ms`` pattern's, else ``timeout_ms`` (one the framework declared).
        """
        registered = self.harness.tools.get(name)
        if registered is not None:
            return ToolDefinition(
                name,
                run,
                registered.description or description,
                dict(registered.parameters) or dict(parameters or {}),
                registered.timeout_ms,
                registered.idempotent,
            )
        budget = next((ms for pattern, ms in self._budgets if pattern.fullmatch(name)), timeout_ms)
        return ToolDefinition(name, run, description, dict(parameters or {}), budget)

    def named_run(self, conversation: Hashable, run: str) -> Hashable:
        """The key of the turn of the run *named* ``run`` in ``conversation`` — by the
        name's value, for frameworks that name a run by an id in each message (the
        Claude Agent SDK's ``prompt_id``: every hook input carries a fresh copy of the
        text, so its identity says nothing). A name seen for the first time starts a
        fresh turn."""
        slot = (conversation, run)
        turn = self._named.get(slot)
        if turn is not None:
            self._named.move_to_end(slot)
            return turn
        turn = self._named[slot] = (conversation, next(_TURNS))
        while len(self._named) > MAX_TRACKED_RUNS:
            self._named.popitem(last=False)
        return turn

    def start_run(self, conversation: Hashable, run: object) -> Hashable:
        """The key of ``run``'s turn in ``conversation``, for its calls' ``conversation``.

        Every call of one run shares it and two runs never do — not even two runs of
        one conversation at once, which would otherwise reset (or share) each other's
        per-turn counts. A run seen for the first time starts a fresh turn. A run named
        by text (an id a framework puts in each message) is keyed by its value
        (``named_run``): two equal ids are one run, whatever their identity.
        """
        if isinstance(run, str):
            return self.named_run(conversation, run)
        slot = (conversation, id(run))
        entry = self._runs.get(slot)
        if entry is not None and entry[0].same(run):
            self._runs.move_to_end(slot)
            return entry[1]
        turn = (conversation, next(_TURNS))  # unique in the process, across adapters
        self._runs[slot] = (_Run(run), turn)
        while len(self._runs) > MAX_TRACKED_RUNS:
            self._runs.popitem(last=False)
        return turn

    async def execute(
        self,
        name: str,
        arguments: Mapping[str, Any] | str,
        call_id: str,
        conversation: Hashable,
        run: RunTool,
        *,
        description: str = "",
        parameters: Mapping[str, Any] | None = None,
        timeout_ms: int | None = None,
        decision: Decision | None = None,
    ) -> ToolOutcome:
        """Run one framework tool call through the harness's three tool stages; with a
        ``decision``, a call paused for approval and now decided, from inside
        ``Approval`` (the layers before it decided before the pause)."""
        call = ToolCall(name, arguments, call_id, conversation=conversation)
        tool = self._tool(name, run, conversation, description, parameters, timeout_ms)
        if decision is not None:
            return await self.harness.tools.run_decided(call, decision, tool=tool)
        return await self.harness.tools.execute(call, tool=tool)

    def _tool(
        self,
        name: str,
        run: RunTool,
        conversation: Hashable,
        description: str,
        parameters: Mapping[str, Any] | None,
        timeout_ms: int | None,
    ) -> ToolDefinition:
        caps = self.harness.loop.tree.tool_caps
        if caps:
            run = _charging_below(run, tuple((RunKey(conversation), cap) for cap in caps))
        return self.definition(name, run, description, parameters, timeout_ms)
