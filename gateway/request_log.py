"""The request log (``--request-log FILE|-|off``, default off): one JSON line per request
the model proxy answered — who, which model and wire, which upstream, the status, the
tokens and dollars, how long it took and how much of that was the proxy's own, and
the stop if it was one. Never a key, never what a message or an answer said.

::

    {"ts": 1796619166.316, "tenant": "acme", "team": "ci", "key_name": "acme/ci-bot",
     "conversation": "…", "model": "gpt-4o", "wire": "chat", "upstream": "openai",
     "stream": true, "status": 200, "input_tokens": 1200, "output_tokens": 300,
     "usd": 0.006, "ms": 812.4, "overhead_ms": 0.31, "stopped": null}

Summed over a day, its ``usd`` is what ``/admin/spend`` reports for the day (the
request log is written as each request is settled).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from typing import Any, Final, TextIO

import attrs

from guardstack.gateway.decision_log import open_log

__all__ = ["FIELDS", "Finished", "RequestLog"]

FIELDS: Final = (
    "ts", "tenant", "team", "key_name", "conversation", "model", "wire", "upstream",
    "stream", "status", "input_tokens", "output_tokens", "usd", "ms", "overhead_ms",
    "stopped",
)  # fmt: skip


@attrs.frozen
class Finished:
    """One answered request, as the log and the metrics read it."""

    tenant: str | None
    team: str | None
    key_name: str | None
    conversation: str | None
    model: str | None
    wire: str
    upstream: str | None
    stream: bool
    status: int
    input_tokens: int | None
    output_tokens: int | None
    usd: float | None
    ms: float
    overhead_ms: float
    stopped: str | None

    def line(self) -> str:
        record: dict[str, Any] = {"ts": round(time.time(), 3)}
        record.update(attrs.asdict(self))
        for name in ("usd", "ms", "overhead_ms"):
            if record[name] is not None:
                record[name] = round(record[name], 10 if name == "usd" else 3)
        return json.dumps(record, ensure_ascii=False)


class RequestLog:
    """Where the lines go: ``-`` is standard output (standard error is the decision
    log's), a path is appended to, ``off`` is nowhere."""

    def __init__(self, target: str = "off") -> None:
        self.target = target
        self._lock = threading.Lock()
        self._stream: TextIO | None = open_log(target, sys.stdout)

    @property
    def on(self) -> bool:
        return self._stream is not None

    def write(self, finished: Finished) -> None:
        stream = self._stream
        if stream is None:
            return
        line = finished.line() + "\n"
        with self._lock, contextlib.suppress(Exception):  # a log that fails loses a line
            stream.write(line)
            stream.flush()

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None and stream is not sys.stdout:
            stream.close()
