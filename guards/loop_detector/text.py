"""Loops inside an answer's text: a block that keeps repeating, found as the text streams.

A model that loops in its text writes the same block again and again — a paragraph, a
line of reasoning, a few words — until its output limit. ``TextRepeats`` is fed the
answer piece by piece and finds the moment its end is a block written ``repeats``
times in a row, back to back, each at least ``min_block`` characters and together at
least ``min_chars`` (what a healthy answer rarely does: a table's rows, a list's items
and code's lines differ from one another; a separator row is short; and a short line
shaped as data — a checklist's ``- [x] passed``, a table's row, a log line — may
repeat in a healthy answer, so it is never a loop).

Cost: each piece is appended; the end of the text is looked at once every ``STEP``
new characters (a ``str.rfind`` of its last ``PROBE`` characters in the text before —
C speed), so a 1,000-piece answer pays microseconds a piece (``benchmarks.loops
--text``).
"""

from __future__ import annotations

from typing import Final

import attrs

__all__ = ["PROBE", "STEP", "Repeat", "TextRepeats", "find_repeat"]

#: How many new characters between two looks at the end of the text.
STEP: Final = 32
#: How much of the text's end is searched for earlier in it: a block shorter than this
#: repeats inside it, and is found as a multiple of itself.
PROBE: Final = 24
#: How far back a repeating block is looked for (a loop repeats what it just wrote).
HORIZON: Final = 16_000


@attrs.frozen
class Repeat:
    """A block repeated at the end of a text: where its first copy ends (the text up to
    there is kept: what was said once), the block's length, how many whole copies.
    The end of a text that is a run of something shorter than a block — padding, a
    rule of dashes, a row of zeros — is not a loop."""

    kept: int
    block: int
    repeats: int


def find_repeat(text: str, *, min_block: int, repeats: int, min_chars: int) -> Repeat | None:
    """The repetition ``text`` ends with, if it is ``repeats`` or more copies of one
    block of ``min_block`` characters or more, ``min_chars`` or more in all (``kept``:
    an index into ``text``)."""
    size = len(text)
    if size < max(min_chars, min_block * repeats, PROBE + 1):
        return None
    start = max(0, size - HORIZON)
    probe = text[-PROBE:]
    # each earlier place the text's end also appears is a period to try, nearest first
    at = text.rfind(probe, start, size - 1)
    for _ in range(_TRIES):
        if at < 0:
            return None
        period = size - PROBE - at
        if period < min_block:
            return None  # the end is a run of something short: padding, a rule, data
        tail = text[size - period :]
        count = 1
        while (
            size - (count + 1) * period >= start
            and text[size - (count + 1) * period : size - count * period] == tail
        ):
            count += 1
        if count >= repeats and count * period >= min_chars:
            if _is_data_line(tail):
                return None  # a checklist's, a table's or a log's short line: data
            first = size - count * period  # where the repetition began, to the character
            while first > start and text[first - 1] == text[first - 1 + period]:
                first -= 1
            kept = first + period
            # cut at a line's or a word's end, not inside one (the copies are alike)
            for boundary in ("\n", " "):
                found = text.find(boundary, kept - 1, kept - 1 + period)
                if found >= 0:
                    kept = found + 1
                    break
            return Repeat(kept, period, count)
        at = text.rfind(probe, start, at + PROBE - 1)
    return None


#: How many earlier places of the text's end are tried as periods.
_TRIES: Final = 8
#: A repeated block that is one line opening as a list item, a table row, a quote or a
#: log line does and shorter than this is data (``- [x] passed``, ``| ok |``), not a
#: loop: a list may hold the same short item many times.
DATA_LINE_CHARS: Final = 48
_DATA_OPENINGS: Final = ("- ", "* ", "+ ", "|", "> ", "[", "#")


def _is_data_line(block: str) -> bool:
    """Whether ``block`` is one short line shaped as data (``DATA_LINE_CHARS``). The
    block is found wherever the text's end stopped, mid-line as often as not: it is
    read from its line's start."""
    if block.count("\n") != 1:
        return False
    end = block.index("\n")
    line = (block[end + 1 :] + block[: end + 1]).strip()
    if not line or "\n" in line or len(line) >= DATA_LINE_CHARS:
        return False
    if line.startswith(_DATA_OPENINGS):
        return True
    number, dot, _ = line.partition(".")  # a numbered item: "3. passed"
    return bool(dot) and number.isdigit()


class TextRepeats:
    """Fed an answer's pieces as they arrive; says when its end has started looping."""

    __slots__ = ("_checked", "_dropped", "_size", "min_block", "min_chars", "pieces", "repeats")

    def __init__(self, *, min_block: int, repeats: int, min_chars: int) -> None:
        self.min_block, self.repeats, self.min_chars = min_block, repeats, min_chars
        self.pieces: list[str] = []
        self._size = 0
        self._checked = 0
        #: Characters dropped from the front of ``pieces`` (older than ``HORIZON``).
        self._dropped = 0

    def feed(self, piece: str) -> Repeat | None:
        """One more piece; the repetition found, if the text now ends with one (its
        ``kept`` an index into the whole text fed so far)."""
        if not piece:
            return None
        self.pieces.append(piece)
        self._size += len(piece)
        if self._size - self._checked < STEP:
            return None
        self._checked = self._size
        window = "".join(self.pieces)
        if len(window) > 2 * HORIZON:  # only the last HORIZON characters are looked at
            self._dropped += len(window) - HORIZON
            window = window[-HORIZON:]
        self.pieces = [window]
        found = find_repeat(
            window, min_block=self.min_block, repeats=self.repeats, min_chars=self.min_chars
        )
        if found is None:
            return None
        return attrs.evolve(found, kept=found.kept + self._dropped)
