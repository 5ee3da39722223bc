"""Where a gateway's decision log goes: standard error by default, a file, or nowhere
(``--decision-log FILE|-|off``), and the last 1,000 lines kept for
``GET /admin/decisions?since=TS`` (``pipeline/decisions.py`` says what a line holds)."""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
from pathlib import Path
from typing import Any, Final, TextIO

from guardstack.pipeline.decisions import logger as decision_logger

__all__ = ["DecisionLog", "open_log"]

#: How many decisions the admin route can show.
KEPT: Final = 1_000


def open_log(target: str, dash: TextIO) -> TextIO | None:
    """Where a gateway's log goes (``FILE|-|off``): ``dash`` for ``-``, nowhere for
    ``off``, else the file appended to (its folder made)."""
    if target == "-":
        return dash
    if target == "off":
        return None
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("a", encoding="utf-8")


class DecisionLog(logging.Handler):
    """A handler on ``guardstack.decisions``: each line written where ``target`` says
    (``-``: standard error; a path: appended to that file; ``off``: nowhere) and the
    last ``KEPT`` kept in memory."""

    def __init__(self, target: str = "-", *, keep: int = KEPT) -> None:
        super().__init__(logging.INFO)
        self.target = target
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self._stream: TextIO | None = open_log(target, sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        decision = getattr(record, "decision", None)
        if isinstance(decision, dict):
            self.recent.append(decision)
        if self._stream is not None:
            try:
                self._stream.write(record.getMessage() + "\n")
                self._stream.flush()
            except Exception:
                self.handleError(record)

    def since(self, ts: float) -> list[dict[str, Any]]:
        """The kept decisions made after ``ts`` (seconds since the epoch), oldest first."""
        return [decision for decision in self.recent if float(decision.get("ts") or 0) > ts]

    def attach(self) -> DecisionLog:
        decision_logger.addHandler(self)
        if decision_logger.level == logging.NOTSET or decision_logger.level > logging.INFO:
            decision_logger.setLevel(logging.INFO)
        return self

    def detach(self) -> None:
        """Stop logging here: off the logger, and the file closed."""
        decision_logger.removeHandler(self)
        if self._stream is not None and self._stream is not sys.stderr:
            self._stream.close()
        self._stream = None
        super().close()

    def close(self) -> None:
        """Flush only: ``logging.config.dictConfig`` (uvicorn's, at every server's
        start) closes every handler there is, and the log must outlive that."""
        self.flush()

    def flush(self) -> None:
        stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):  # a log that cannot flush loses lines only
                stream.flush()
