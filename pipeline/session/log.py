"""``Session``: the append-only log itself — append, subscribe, record, save and load."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import urllib.parse
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, overload

from guardstack.pipeline.errors import GuardstackWarning, SessionCorruptError, SessionTailWarning
from guardstack.pipeline.model import NO_USAGE, Usage
from guardstack.pipeline.onion import Registration
from guardstack.pipeline.session.events import (
    ApprovalRequest,
    AssistantMessage,
    Event,
    StepEnd,
    StepStart,
    SystemMessage,
    ToolCallEvent,
    ToolResultEvent,
    TurnEnd,
    TurnStart,
)
from guardstack.pipeline.session.messages import (
    BUILDERS,
    _nothing,
    builder_of,
    place,
    provider_message_of,
)
from guardstack.pipeline.session.wire import (
    FORMAT,
    SchemaError,
    _field,
    event_from_wire,
    event_to_wire,
    json_line,
)
from guardstack.pipeline.values import aborted_result

logger = logging.getLogger("guardstack")


class _EventView(Sequence[Event]):
    """A read-only view of the log: the loop appends, nobody rewrites."""

    __slots__ = ("_events",)

    def __init__(self, events: list[Event]) -> None:
        self._events = events

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Event]: ...
    def __getitem__(self, index: int | slice) -> Event | Sequence[Event]:
        return self._events[index]

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __reversed__(self) -> Iterator[Event]:
        return reversed(self._events)

    def __repr__(self) -> str:
        return f"<{len(self._events)} session events>"


def _path_key(path: str) -> str:
    return os.path.realpath(path)


def _write_atomically(target: str, text: str) -> None:
    directory, name = os.path.split(os.path.abspath(target))
    handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class Recording(Registration):
    """A session written to a JSONL file as it grows (``Session.record``).

    ``unwritten`` counts the events the file is missing since a write failed
    (``error`` says how); ``dispose()`` stops and closes the file, and never raises.
    """

    def __init__(self, session: Session, path: str) -> None:
        self.session = session
        self.path = path
        self.key = _path_key(path)
        self.unwritten = 0
        self.error: OSError | None = None
        session.save(path)  # raises here, at the start, if the path cannot be written
        self._file: IO[str] | None = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._subscription = session.subscribe(self._write)
        self._children: list[Recording] = []
        super().__init__(self._stop)
        for child_id, child in session.children.items():
            self.follow(child, child_id)

    def follow(self, child: Session, child_id: str | None = None) -> None:
        """Record a child session beside this file, for as long as this recording."""
        self._children.append(child.record(child_path(self.path, child_id or child.session_id)))

    def _write(self, event: Event) -> None:
        file = self._file
        if file is None or self.error is not None:
            self.unwritten += 1  # after a failure nothing is appended: no gap mid-file
            return
        try:
            file.write(json_line(event_to_wire(event)))
            file.flush()
        except (OSError, ValueError) as error:  # ValueError: a file closed under us
            self.error = error if isinstance(error, OSError) else OSError(str(error))
            self.unwritten += 1
            message = (
                f"session {self.session.session_id!r}: recording to {self.path} failed "
                f"({error}); no later event is written there (save() it again to make it whole)"
            )
            logger.exception("%s", message)
            warnings.warn(message, GuardstackWarning, stacklevel=2)

    def reopen(self) -> None:
        """The file was just saved whole: append to it from now on."""
        self._close()
        try:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        except OSError as error:
            self._file, self.error = None, error
            return
        self.error, self.unwritten = None, 0

    def _close(self) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        try:
            file.close()
        except OSError:
            logger.warning(
                "session recording %s: closing the file failed", self.path, exc_info=True
            )

    def _stop(self) -> None:
        for child in self._children:
            child.dispose()
        self._subscription.dispose()
        self._close()
        if self.session._recordings.get(self.key) is self:
            del self.session._recordings[self.key]


class Session:
    """One agent's append-only log of events."""

    def __init__(self, session_id: str, events: Sequence[Event] = ()) -> None:
        self.session_id = session_id
        self._events: list[Event] = []
        self._view = _EventView(self._events)  # read-only, and always the same list
        self._messages: list[dict[str, Any]] = []
        #: The last assistant message's call ids, in the order it asked for them.
        self._asked: dict[str, int] = {}
        self._subscribers: list[Callable[[Event], object]] = []
        self._recordings: dict[str, Recording] = {}
        self.damaged_tail: str | None = None
        #: The sessions of the child agents this one started (``AgentTool``), by id.
        self.children: dict[str, Session] = {}
        for event in events:
            self.append(event)

    @property
    def events(self) -> Sequence[Event]:
        return self._view

    def append(self, event: Event) -> None:
        """Add ``event`` at the end (the log is never rewritten) and tell the subscribers."""
        self._events.append(event)
        build = BUILDERS.get(type(event)) or builder_of(type(event))
        if build is not _nothing:  # most events are no message: no call for them
            message = build(event)
            if message is not None:
                place(self._messages, message, self._asked)
        if self._subscribers:
            self._notify(event)

    def _notify(self, event: Event) -> None:
        for subscriber in tuple(self._subscribers):
            try:
                subscriber(event)
            except Exception:
                # A display or a writer that fails never breaks the turn or the log.
                logger.exception(
                    "session %r: subscriber %r failed on %s",
                    self.session_id,
                    subscriber,
                    event.type,
                )

    def subscribe(self, subscriber: Callable[[Event], object]) -> Registration:
        """Call ``subscriber(event)`` for every event appended from now on, in order.

        It runs inside ``append``, in the loop's task: keep it quick (a progress
        display, a line written to a file). An exception it raises is logged on the
        ``guardstack`` logger and the turn goes on. ``dispose()`` the returned
        registration to stop.
        """
        self._subscribers.append(subscriber)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._subscribers.remove(subscriber)

        return Registration(remove)

    def record(self, path: str | os.PathLike[str]) -> Recording:
        """Keep ``path`` an up-to-date JSONL copy of this log as it grows.

        The events so far are saved at once (atomically, as ``save`` does); every
        later event is appended as one line and flushed when it happens, so a crash
        loses at most the line being written. Resume with ``Session.load(path)``.
        ``save(path)`` to the same path flushes the recording and keeps it whole.

        A write that fails (a full disk, a file made read-only) is reported when it
        happens — one ``GuardstackWarning`` naming the path, an error on the
        ``guardstack`` logger — and nothing more is appended, so the file stays a
        loadable prefix of the log, never a log with a gap in it; the recording
        counts the events not written (``unwritten``) until a ``save`` to the path
        makes it whole again. ``dispose()`` the returned recording to stop and close
        the file; stopping never raises.
        """
        recording = Recording(self, os.fspath(path))
        self._recordings[recording.key] = recording
        return recording

    @property
    def system(self) -> str | None:
        """The system prompt this session started with, if any."""
        first = self._events[0] if self._events else None
        return first.text if isinstance(first, SystemMessage) else None

    def usage(self) -> Usage:
        """The tokens every logged model reply used, summed, with the children's (a
        child's usage is rolled up into its parent's, as its turn counted it)."""
        total = NO_USAGE
        for event in self._events:
            if isinstance(event, AssistantMessage) and event.usage is not None:
                total += event.usage
        for child in self.children.values():
            total += child.usage()
        return total

    def add_child(self, child: Session) -> None:
        """Link a child agent's session (``AgentTool`` does): it is saved beside this
        one, recorded beside every recording of this one, and found by ``load``."""
        self.children[child.session_id] = child
        for recording in tuple(self._recordings.values()):
            recording.follow(child)

    def close_open_turn(self) -> bool:
        """End a turn the log left open (a crash or a mid-turn snapshot); say if it did.

        Every call the model asked for in the open step is answered — ``ABORTED`` if it
        was logged as started, ``ABORTED_BEFORE_DISPATCH`` (with its ``tool/call``) if
        not — then the step and the turn end (reason ``aborted``), so the next request
        rebuilt from the log is one a provider accepts. Nothing is removed. A turn
        paused for approval is not open (it ended, reason ``approval``); one whose
        resume was interrupted is.
        """
        turn_start = next(
            (
                i
                for i in range(len(self._events) - 1, -1, -1)
                if isinstance(self._events[i], TurnStart)
            ),
            None,
        )
        if turn_start is None:
            return False
        open_turn = self._events[turn_start:]
        if isinstance(open_turn[-1], TurnEnd):
            return False  # ended (a turn paused for approval ends, and a resume goes on)
        turn = open_turn[0].turn  # type: ignore[union-attr]
        called = {e.call_id for e in open_turn if isinstance(e, ToolCallEvent)}
        answered = {e.call_id for e in open_turn if isinstance(e, ToolResultEvent)}
        step = 0
        for event in open_turn:
            if isinstance(event, StepStart):
                step = event.step
            elif isinstance(event, AssistantMessage):
                for request in event.tool_calls:
                    if request.call_id in answered:
                        continue
                    started = request.call_id in called
                    if not started:
                        self.append(ToolCallEvent.of(turn, event.step, request))
                    result = aborted_result(before_dispatch=not started)
                    self.append(ToolResultEvent(turn, event.step, request.call_id, result))
                    answered.add(request.call_id)
        if step and not isinstance(self._events[-1], StepEnd):
            self.append(StepEnd(turn, step))
        self.append(TurnEnd(turn, "aborted", "the turn was interrupted; closed on resume"))
        return True

    def messages(self) -> list[dict[str, Any]]:
        """The model request this log implies, in OpenAI chat format.

        Built incrementally as events are appended, so a step costs the same at
        step 5,000 as at step 5; the result is a fresh list (append to it freely),
        but its message dicts are the log's own and read-only (changing one raises
        ``TypeError``; ``dict(message)`` is a copy to change).
        """
        return list(self._messages)

    def rebuild_messages(self) -> list[dict[str, Any]]:
        """``messages()`` computed from scratch from the events (the same list, always)."""
        messages: list[dict[str, Any]] = []
        asked: dict[str, int] = {}
        for event in self._events:
            message = provider_message_of(event)
            if message is not None:
                place(messages, message, asked)
        return messages

    # -- persistence -------------------------------------------------------------------

    def to_jsonl(self) -> str:
        header = {"type": "session", "format": FORMAT, "session_id": self.session_id}
        lines = [header, *(event_to_wire(event) for event in self._events)]
        return "".join(json_line(line) for line in lines)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the log as JSON Lines, atomically (a crash leaves the old file whole).

        Each save writes its own temporary file in the same directory, so concurrent
        saves to one path never mix: the file is always one whole session.
        """
        target = os.fspath(path)
        for child_id, child in self.children.items():
            child.save(child_path(target, child_id))  # children first: a parent never
            # names a child log that is not there
        _write_atomically(target, self.to_jsonl())
        recording = self._recordings.get(_path_key(target))
        if recording is not None:
            recording.reopen()  # the file now holds every event: append from here

    @classmethod
    def from_jsonl(cls, text: str | bytes, *, origin: str = "<session>") -> Session:
        """Read a log written by ``to_jsonl``; a damaged line raises, a cut-off last line warns."""
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        lines = raw.split(b"\n")
        cut_off = lines[-1] != b""  # a complete file ends with a newline
        if not cut_off:
            lines.pop()
        events: list[Event] = []
        session_id = None
        damaged_tail = None
        for number, line in enumerate(lines, start=1):
            try:
                wire = json.loads(line.decode("utf-8"))
                if not isinstance(wire, dict) or "type" not in wire:
                    raise SchemaError("not an event object")
                if number == 1:
                    if wire["type"] != "session":
                        raise SchemaError("the first line is not a session header")
                    session_id = _field(wire, "session_id", str)
                else:
                    events.append(event_from_wire(wire))
            except (ValueError, TypeError, KeyError, RecursionError) as error:
                # UnicodeDecodeError is a ValueError: a line cut inside a character.
                if cut_off and number == len(lines) and number > 1:
                    damaged_tail = line.decode("utf-8", "replace")
                    break
                reason: object = error
                if isinstance(error, RecursionError):
                    reason = "nested too deeply"
                elif isinstance(error, json.JSONDecodeError):
                    reason = f"not JSON ({error.msg} at column {error.colno})"
                    if number == 1:
                        reason = f"{reason}; is this a guardstack session log (JSON Lines)?"
                raise SessionCorruptError(f"{origin}: line {number}: {reason}") from error
        if session_id is None:
            raise SessionCorruptError(f"{origin}: empty file, no session header")
        session = cls(session_id, events)
        if damaged_tail is not None:
            session.damaged_tail = damaged_tail
            warnings.warn(
                f"{origin}: the last line was cut off mid-write and was not loaded "
                f"({len(damaged_tail)} characters); {len(events)} complete events loaded",
                SessionTailWarning,
                stacklevel=3,
            )
        return session

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Session:
        """Read a log written by ``save``, with its children's logs beside it (a child
        log that is missing warns and is left out). Guard state is never part of it."""
        source = os.fspath(path)
        with open(source, "rb") as file:
            session = cls.from_jsonl(file.read(), origin=source)
        for child_id in dict.fromkeys(_children_named(session._events)):
            found = child_path(source, child_id)
            if os.path.exists(found):
                session.children[child_id] = cls.load(found)
            else:
                warnings.warn(
                    f"{source}: the log of child session {child_id!r} is not at {found}; "
                    "loaded without it",
                    GuardstackWarning,
                    stacklevel=2,
                )
        return session


def _children_named(events: Sequence[Event]) -> Iterator[str]:
    """The child sessions a log names: in its results, and in its calls waiting on one."""
    for event in events:
        if isinstance(event, ToolResultEvent) and event.child_session is not None:
            yield event.child_session
        elif isinstance(event, ApprovalRequest) and event.asked_by.startswith("agent:"):
            yield event.asked_by.removeprefix("agent:")


def child_path(parent: str, child_id: str) -> str:
    """Where a child session's log lives beside its parent's: ``<parent stem>.<child id,
    percent-quoted>.jsonl``."""
    stem, _ = os.path.splitext(parent)
    return f"{stem}.{urllib.parse.quote(child_id, safe='')}.jsonl"
