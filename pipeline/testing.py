"""Test doubles for your own stacks, shipped as public API (like httpx's MockTransport).

* ``RecordingLayer`` — a pass-through layer for any stage that records when it was
  entered and left, into a log you can share between layers to see the nesting.
* ``ScriptedTool`` — a tool that follows a script per call (reply, raise, hang, reply
  late while ignoring cancellation) and records every run with its virtual start
  and end times.
* ``ScriptedModel`` — a deterministic model that answers each request with the next
  step of its script.

``guardstack.wrappers.no_backoff()`` turns retry waits off in a scope.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias, overload

import anyio
import attrs

from guardstack.pipeline.errors import ScriptExhaustedError
from guardstack.pipeline.model import ModelReply
from guardstack.pipeline.onion import Registration
from guardstack.pipeline.validate import in_ms
from guardstack.pipeline.values import ToolCall, ToolDefinition

__all__ = [
    "Hang",
    "Raise",
    "RecordedRequests",
    "RecordingLayer",
    "Reply",
    "ScriptStep",
    "ScriptedModel",
    "ScriptedTool",
    "Streamed",
    "ToolRun",
    "ToolStep",
]


@attrs.frozen
class Reply:
    """Return ``value`` after ``after_ms``; with ``ignore_cancel``, finish anyway."""

    value: object = "ok"
    #: Deprecated in 0.2 (removed in 0.3): ``after_ms``, as every duration is.
    after_s: float | None = attrs.field(default=None, repr=False)
    ignore_cancel: bool = False
    after_ms: float = attrs.field(default=0.0, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.after_s is not None:  # the old spelling, converted once: equal to the new
            object.__setattr__(self, "after_ms", in_ms("Reply", "after", self.after_s, 0.0))
            object.__setattr__(self, "after_s", None)


@attrs.frozen
class Raise:
    """Raise ``error`` after ``after_ms``."""

    error: Exception
    #: Deprecated in 0.2 (removed in 0.3): ``after_ms``, as every duration is.
    after_s: float | None = attrs.field(default=None, repr=False)
    after_ms: float = attrs.field(default=0.0, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.after_s is not None:  # the old spelling, converted once: equal to the new
            object.__setattr__(self, "after_ms", in_ms("Raise", "after", self.after_s, 0.0))
            object.__setattr__(self, "after_s", None)


@attrs.frozen
class Hang:
    """Wait until cancelled."""


ToolStep: TypeAlias = Reply | Raise | Hang


@attrs.frozen
class ToolRun:
    """One run of a scripted tool: the call, when it started and ended, how it ended."""

    call: ToolCall
    started: float
    ended: float | None
    outcome: str  # "returned", "raised", "cancelled"


class ScriptedTool:
    """A tool whose n-th run follows the n-th step of its script (the last step repeats)."""

    def __init__(
        self,
        name: str,
        steps: Sequence[ToolStep | str] = ("ok",),
        *,
        timeout_ms: int | None = None,
        description: str = "",
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        if not steps:
            raise ValueError("ScriptedTool needs at least one step")
        self.steps: list[ToolStep] = [
            Reply(step) if isinstance(step, str) else step for step in steps
        ]
        self.runs: list[ToolRun] = []
        self.definition = ToolDefinition(
            name, self._execute, description, dict(parameters or {}), timeout_ms
        )

    @property
    def calls(self) -> list[ToolCall]:
        return [run.call for run in self.runs]

    def register(self, registry: Any) -> Registration:
        registration: Registration = registry.register(self.definition)
        return registration

    async def _execute(self, arguments: Mapping[str, Any], call: ToolCall) -> object:
        step = self.steps[min(len(self.runs), len(self.steps) - 1)]
        index = len(self.runs)
        started = anyio.current_time()
        self.runs.append(ToolRun(call, started, None, "cancelled"))

        def finish(outcome: str) -> None:
            self.runs[index] = ToolRun(call, started, anyio.current_time(), outcome)

        try:
            if isinstance(step, Hang):
                await anyio.sleep(math.inf)
            elif isinstance(step, Raise):
                await anyio.sleep(step.after_ms / 1000)
                finish("raised")
                raise step.error
            else:
                with anyio.CancelScope(shield=step.ignore_cancel):
                    await anyio.sleep(step.after_ms / 1000)
                finish("returned")
                return step.value
        except anyio.get_cancelled_exc_class():
            finish("cancelled")
            raise
        raise AssertionError("unreachable")  # pragma: no cover


class RecordingLayer:
    """A pass-through layer for any stage that appends ``("enter"|"exit", name)`` to ``log``.

    Share one ``log`` list between several layers to observe their nesting; ``exit``
    is recorded even when an inner layer raises or the call is cancelled.
    """

    def __init__(self, name: str, log: list[tuple[str, str]] | None = None) -> None:
        self.name = name
        self.log: list[tuple[str, str]] = log if log is not None else []

    async def __call__(self, *args: Any) -> Any:
        *given, call_next = args
        self.log.append(("enter", self.name))
        try:
            return await call_next(*given)
        finally:
            self.log.append(("exit", self.name))

    def __repr__(self) -> str:
        return f"RecordingLayer({self.name!r})"


def _pieces(pieces: Iterable[tuple[float, str]]) -> tuple[tuple[float, str], ...]:
    return tuple(pieces)


@attrs.frozen
class Streamed:
    """A ``ScriptedModel`` step that streams: each piece ``(wait_s, text)`` arrives
    ``wait_s`` after the one before (in the test's virtual time) and is reported to a
    listening ``Timeout``; then the reply (``reply``, else the pieces' text), or
    ``fail`` raised. A long wait is a stream that stalls; a long first wait, one that
    never starts."""

    pieces: tuple[tuple[float, str], ...] = attrs.field(converter=_pieces)
    reply: ModelReply | None = None
    #: Raised after the pieces instead of replying (a stream that breaks).
    fail: BaseException | None = None

    async def play(self, on_chunk: Callable[[str], None] | None) -> ModelReply:
        for wait_s, text in self.pieces:
            await anyio.sleep(wait_s)
            if on_chunk is not None:
                on_chunk(text)
        if self.fail is not None:
            raise self.fail
        if self.reply is not None:
            return self.reply
        return ModelReply("".join(text for _, text in self.pieces))


ScriptStep: TypeAlias = (
    ModelReply
    | BaseException
    | Streamed
    | Callable[[list[dict[str, Any]]], ModelReply | Awaitable[ModelReply]]
)


class RecordedRequests(Sequence[list[dict[str, Any]]]):
    """Every message list a model was sent, without copying the shared history each time.

    An agent's requests grow by appending (each is the log rebuilt), so a request
    that extends the previous one is kept as a length into one shared list: memory
    and time stay linear in the conversation, not quadratic. A request that does not
    extend it (another agent sharing the model) is kept as its own copy.
    """

    def __init__(self) -> None:
        self._shared: list[dict[str, Any]] = []  # copies, safe from later mutation
        self._last: object = None  # the caller's object behind the last shared message
        self._records: list[int | list[dict[str, Any]]] = []

    def record(self, messages: list[dict[str, Any]]) -> None:
        """Keep a copy of what this request held (copying only what is new)."""
        shared = self._shared
        known = len(shared)
        if len(messages) >= known and (known == 0 or messages[known - 1] is self._last):
            shared.extend(copy.deepcopy(messages[known:]))
            if messages:
                self._last = messages[-1]
            self._records.append(len(messages))
        else:
            self._records.append(copy.deepcopy(messages))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordedRequests):
            return list(self) == list(other)
        return isinstance(other, list) and list(self) == other

    __hash__ = None  # type: ignore[assignment]

    @overload
    def __getitem__(self, index: int) -> list[dict[str, Any]]: ...
    @overload
    def __getitem__(self, index: slice) -> list[list[dict[str, Any]]]: ...
    def __getitem__(self, index: int | slice) -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
        if isinstance(index, slice):
            return [self._request(record) for record in self._records[index]]
        return self._request(self._records[index])

    def _request(self, record: int | list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self._shared[:record] if isinstance(record, int) else record

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"<{len(self._records)} recorded requests>"


class ScriptedModel:
    """A deterministic model: answers each request with the next step of its script.

    A step is a ``ModelReply``; an exception instance (raised, to test a failing
    provider); or a callable ``(messages) -> ModelReply`` (sync or async) for replies
    that depend on the request or that wait. ``requests`` records a copy of
    every message list sent (sharing the common history, see ``RecordedRequests``),
    ``tool_schemas`` the tools offered. Running out of
    script raises ``ScriptExhaustedError``, which ends the turn with reason
    ``error`` instead of hanging.
    """

    #: The model its replies report (a reply naming none is given this name), and the name
    #: priced caps read as the model asked for; ``None``: replies name none.
    model: str | None = None
    #: Its ``Streamed`` steps report their pieces to ``on_chunk``.
    reports_chunks = True

    def __init__(self, replies: Sequence[ScriptStep], *, model: str | None = None) -> None:
        self._script = list(replies)
        if model is not None:
            self.model = model
        self.requests = RecordedRequests()
        self.tool_schemas: list[list[dict[str, Any]]] = []

    @property
    def remaining(self) -> int:
        return len(self._script) - len(self.requests)

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_chunk: Callable[[str], None] | None = None,
    ) -> ModelReply:
        index = len(self.requests)
        self.requests.record(messages)
        self.tool_schemas.append(list(tools))
        if index >= len(self._script):
            raise ScriptExhaustedError(
                f"ScriptedModel has no reply for request {index + 1}: "
                f"its script holds {len(self._script)}"
            )
        step = self._script[index]
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, ModelReply):
            return self._named(step)
        if isinstance(step, Streamed):
            return self._named(await step.play(on_chunk))
        reply = step(messages)
        if inspect.isawaitable(reply):
            reply = await reply
        if not isinstance(reply, ModelReply):
            raise TypeError(f"script step {index + 1} returned {reply!r}, not a ModelReply")
        return self._named(reply)

    def _named(self, reply: ModelReply) -> ModelReply:
        if self.model is None or reply.model is not None:
            return reply
        return attrs.evolve(reply, model=self.model)
