"""What ``LoopDetector`` treats as volatile: the parts of a call or result that change
from one repetition of a loop to the next without meaning anything.

Real agents rarely repeat byte for byte: a fresh timestamp on every call, a random
request id, an attempt counter, a query retyped in another case, a test run that
reports "1 failed in 0.53s" and then "in 0.61s". What is volatile is decided by how
values look and behave, never by what a key is called:

* **arguments**, by value: a date-time with its time of day, an epoch timestamp, a
  UUID or a long hex id is replaced by a marker wherever it is (a plain date such as
  ``2024-05-13`` is not: a day-by-day search differs in it); free text (a string with
  a space in it, or under a query-like key: ``q``, ``query``, ``search``…) is
  compared ignoring case and runs of whitespace. The detector adds what it sees
  across calls: a field that changes on every repeat while everything else *and the
  result* stay the same, and counters stepping by one. ``VOLATILE_KEYS`` are hints
  there (a short token under ``request_id`` or ``nonce`` is taken for volatile once
  it behaves so), never the rule. Paths and every other value are compared exactly;
* **results**, by value: ISO dates and times, times of day, epoch timestamps, UUIDs,
  long hex ids, ids a label names ("Chunk ID: f928e9", ``PGID: 31940``), durations
  (``0.53s``, ``120 ms``, "Wall time: 0.0000 seconds") and temporary files' names
  (``/tmp/tmpk3j2h1``, ``/tmp/pytest-17``) are replaced by markers — what a shell
  tool reports differently on every run of one command (Codex's results begin with a
  fresh chunk id and wall time) — and the detector masks counters stepping by one from
  the same call's previous result.

It also names three kinds of result the rules read: *empty* (``[]``, "no results"…),
an *acknowledgement* (``ok``, "noted"…) and a *pending status* (``running``,
``queued``…) — hints, beside what the detector sees a result do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable, Mapping
from typing import Any, Final

from guardstack.guards.canonical import canonical_json

__all__ = [
    "FREE_TEXT_KEYS",
    "HINTED_KEYS",
    "MARK",
    "VOLATILE_KEYS",
    "arguments_key",
    "is_acknowledgement",
    "is_empty",
    "is_pending",
    "result_key",
    "top_level",
    "volatile_value",
]

#: Argument keys whose values change on every call of a loop (fnmatch, any case).
VOLATILE_KEYS: Final = (
    "ts",
    "timestamp",
    "time",
    "now",
    "date",
    "datetime",
    "*_at",
    "*_ts",
    "*_time",
    "*_timestamp",
    "nonce",
    "*request_id",
    "*requestid",
    "request-id",
    "trace_id",
    "traceid",
    "span_id",
    "correlation_id",
    "idempotency_key",
    "client_token",
    "cache_buster",
    "cachebuster",
    "_",
    "rid",
    "attempt",
    "attempts",
    "attempt_number",
    "retry",
    "retries",
    "try",
    "tries",
)
#: The keys whose values the detector may take for volatile from behaviour alone (any
#: value, once it changes on every repeat while the result stays the same): the
#: volatile names without the ones a real argument means (``date``, ``time``).
HINTED_KEYS: Final = tuple(
    key for key in VOLATILE_KEYS if key not in {"date", "time", "datetime", "now", "_"}
)
#: Argument keys that hold free text, compared ignoring case and whitespace.
FREE_TEXT_KEYS: Final = frozenset({"q", "query", "search", "text", "prompt", "question", "term"})

#: What a volatile value is replaced by, wherever it is compared.
MARK: Final = "\x00volatile\x00"
_SPACE = re.compile(r"\s+")
_RESULT_PARTS = (
    (
        re.compile(
            r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
        ),
        "<time>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
        "<id>",
    ),
    (re.compile(r"\b[0-9a-fA-F]{16,}\b"), "<id>"),
    # an id its label names, whatever its length: "Chunk ID: f928e9" (Codex's shell),
    # "request_id=ab12", "PGID: 31940" (Gemini CLI's), "pid 4242"
    (
        re.compile(
            r"\b((?:chunk|request|req|trace|span|session|job|task|correlation|operation|"
            r"process|process group)[ _-]?id|pid|pgid)(\s*[:=#]?\s*)[0-9A-Za-z][\w-]*",
            re.IGNORECASE,
        ),
        r"\1\2<id>",
    ),
    # a temporary file or folder, named anew each run: /tmp/tmpk3j2h1, /tmp/pytest-17/,
    # /var/folders/xy/…/T/abc123 (a segment with digits, or tmp + random letters)
    (
        re.compile(
            r"(/(?:private/)?(?:tmp|var/tmp|var/folders/[^/\s]+/[^/\s]+/T)/)"
            r"(?:tmp[A-Za-z0-9_]{3,}|[A-Za-z_.-]*\d[\w.-]*)(?=/|\s|$)"
        ),
        r"\1<tmp>",
    ),
    (re.compile(r"\b1[5-9]\d{8}(?:\d{3})?(?:\.\d+)?\b"), "<time>"),
    (
        re.compile(
            r"\b\d+(?:\.\d+)?\s?(?:ms|msec|milliseconds?|s|secs?|seconds?|m|mins?|minutes?)\b",
            re.IGNORECASE,
        ),
        "<duration>",
    ),
)
_EMPTY = re.compile(
    r"(?:|\[\s*\]|\{\s*\}|null|none|nil|0 (?:results?|items?|matches|rows|hits|files)"
    r"|no (?:results?|items?|matches|rows|hits|files|more \w+|data|entries)(?: found)?"
    r"|nothing(?: found)?|not found|empty)[.!]?",
    re.IGNORECASE,
)
_ACKNOWLEDGED = re.compile(
    r"(?:ok|okay|done|noted|saved|updated|added|recorded|success|succeeded|true|ack"
    r"|acknowledged|plan updated|todo updated|todos updated|task updated|logged|\u2713)[.!]?",
    re.IGNORECASE,
)
_PENDING = re.compile(
    r"\b(?:running|queued|pending|in[ _-]progress|waiting|processing|starting|not ready"
    r"|building|scheduled|not (?:yet )?(?:done|finished|complete))\b",
    re.IGNORECASE,
)


_VOLATILE_VALUE = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{16,}"
    r"|1[5-9]\d{8}(?:\d{3})?(?:\.\d+)?"
)


def volatile_value(value: object) -> bool:
    """Whether a value looks like one that changes on every call by its form: a
    date-time with its time of day, an epoch timestamp (seconds or milliseconds), a
    UUID or a long hex id — never a plain date, a path or a word."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return 1.5e9 <= value < 2e9 or 1.5e12 <= value < 2e12
    return (
        isinstance(value, str) and len(value) <= 64 and _VOLATILE_VALUE.fullmatch(value) is not None
    )


def _volatile_key(key: str, patterns: re.Pattern[str] | None) -> bool:
    return patterns is not None and patterns.fullmatch(key.lower()) is not None


def _normalised(value: Any, key: str | None, patterns: re.Pattern[str] | None, depth: int) -> Any:
    if key is not None and _volatile_key(key, patterns):
        return MARK
    if volatile_value(value):
        return MARK
    if isinstance(value, str):
        if key is not None and (key.lower() in FREE_TEXT_KEYS or " " in value.strip()):
            return _SPACE.sub(" ", value).strip().casefold()
        return value
    if depth < 32 and isinstance(value, Mapping):
        try:
            items = list(value.items())
        except Exception:  # a hostile mapping: compared by its canonical form instead
            return value
        return {k: _normalised(v, str(k), patterns, depth + 1) for k, v in items}
    if depth < 32 and isinstance(value, list | tuple):
        return [_normalised(item, key, patterns, depth + 1) for item in value]
    return value


def arguments_key(arguments: Any, patterns: re.Pattern[str] | None, free_text: bool) -> str:
    """A key for ``arguments`` with volatile keys masked (and, with ``free_text``, free
    text case- and whitespace-folded): sorted-key JSON, or the reminder's canonical
    form for what JSON cannot hold (key order never matters either way)."""
    value = (
        _normalised(arguments, None, patterns, 0)
        if patterns is not None or free_text
        else arguments
    )
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return canonical_json(value)


_SCALARS = (str, int, float, bool, type(None))


def top_level(arguments: Any) -> dict[str, Hashable] | None:
    """Each top-level argument: a scalar as it is, anything else as its canonical text
    (``None`` when the arguments are not an object). What the detector compares for
    counters and walking, and to name the fields it treated as volatile."""
    if not isinstance(arguments, Mapping):
        return None
    try:
        return {
            str(key): value if isinstance(value, _SCALARS) else canonical_json(value)
            for key, value in arguments.items()
        }
    except Exception:
        return None


#: What guardstack itself adds to a tool's result — a gateway's note (a reminder, a
#: loop noticed), a denial's text with its growing count, the structured copy of a note
#: — is not the tool's progress: left out before results are compared, so a result
#: that changes only in guardstack's own words is the same result.
_OWN_WORDS: Final = (
    re.compile(
        r',\s*"guardstack_note"\s*:\s*"(?:[^"\\]|\\.)*"'
        r'|"guardstack_note"\s*:\s*"(?:[^"\\]|\\.)*"\s*,?\s*'
    ),
    re.compile(
        r"(?:^|\n)[ \t]*(?:Error: )?(?:Potential loop detected:|You are repeating the exact "
        r"same tool call|Repeated tool call detected:|Stopped by [a-z-]+:|"
        r"(?:loop-detector|tool-call-limit|repeat-tool-reminder|budget-notice):|"
        r"tool call limit reached)[^\n]*(?:\n(?![ \t]*\n)[^\n]*)*",
    ),
)


def result_key(text: str) -> str:
    """A result's text with guardstack's own words left out and its volatile parts
    (times, ids, durations) masked."""
    for own in _OWN_WORDS:
        text = own.sub("", text)
    for pattern, marker in _RESULT_PARTS:
        text = pattern.sub(marker, text)
    return text.strip()


def is_empty(text: str) -> bool:
    return len(text) <= 40 and _EMPTY.fullmatch(text.strip()) is not None


def is_acknowledgement(text: str) -> bool:
    return len(text) <= 40 and _ACKNOWLEDGED.fullmatch(text.strip()) is not None


def is_pending(text: str) -> bool:
    return len(text) <= 200 and _PENDING.search(text) is not None
