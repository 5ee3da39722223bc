"""What the detector keeps: a watched call as the patterns compare it, a turn's calls,
a detection."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Final

import attrs

from guardstack.pipeline.values import (
    MessageSource,
    ToolResult,
)

if TYPE_CHECKING:
    pass


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


def fold(text: str) -> str:
    return " ".join(text.split()).casefold()


@attrs.frozen
class Entry:
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


class Turn:
    """One conversation's turn: the watched calls and how many detections so far."""

    __slots__ = ("denied", "detections", "entries", "looping")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.detections = 0
        #: Calls whose last repetition was part of a detected loop (the ones deny stops).
        self.looping: set[str] = set()
        #: How many calls it denied since the last call that ran: each was one more
        #: repetition of the loop, and its message counts it.
        self.denied = 0
