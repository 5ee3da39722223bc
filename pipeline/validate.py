"""One helper per validation rule, shared by every plugin's configuration.

Each raises ``ConfigError`` naming the owner (the plugin's config name), the key and
the value — once, with long values cut — so a log line alone is enough to fix a
file. ``harness.load`` re-words the same error with the entry's id instead of the
owner, never adding a second copy.
"""

from __future__ import annotations

import difflib
import math
import re
import warnings
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal, TypeAlias

from guardstack.pipeline.errors import ConfigError

__all__ = [
    "boolean",
    "compile_patterns",
    "cut",
    "did_you_mean",
    "flag",
    "integer",
    "invalid",
    "non_empty_text",
    "number",
    "optional_integer",
    "patterns",
    "rejected",
    "stage",
]

#: Where a wrapper sits: around each tool call, or around each model call.
StageName: TypeAlias = Literal["dispatch", "model"]

#: Values longer than this are cut in messages (a YAML alias bomb must not make an 8 MB error).
MAX_VALUE_CHARS = 120


def cut(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters; never raises."""
    try:
        text = _bounded_repr(value, limit)
    except Exception:
        return f"<unprintable {type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bounded_repr(value: object, limit: int) -> str:
    # repr() of a huge nested list is built whole before it could be cut; build the
    # prefix only, for the containers a config file can hold.
    if isinstance(value, list | tuple | dict):
        brackets = "{}" if isinstance(value, dict) else "()" if isinstance(value, tuple) else "[]"
        opening, closing = brackets[0], brackets[1]
        items = value.items() if isinstance(value, dict) else value
        parts: list[str] = []
        length = 0
        for item in items:
            if length > limit:
                parts.append("…")
                break
            if isinstance(item, tuple) and isinstance(value, dict):
                part = f"{_bounded_repr(item[0], limit)}: {_bounded_repr(item[1], limit)}"
            else:
                part = _bounded_repr(item, limit)
            parts.append(part)
            length += len(part) + 2
        return opening + ", ".join(parts) + closing
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit])
    return repr(value)


def did_you_mean(name: object, known: Collection[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest known name, else ``""``."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def invalid(owner: str, key: str, value: object, requirement: str) -> ConfigError:
    """``ConfigError``: ``<owner>: `<key>` must be <requirement>, got <value>``, to raise."""
    return ConfigError(
        f"{owner}: `{key}` must be {requirement}, got {cut(value)}",
        plugin=owner,
        key=key,
        value=value,
        reason=f"must be {requirement}",
    )


def rejected(owner: str, key: str, value: object, reason: str) -> ConfigError:
    """``ConfigError``: ``<owner>: <reason>``, for a rule whose wording is fixed elsewhere."""
    return ConfigError(f"{owner}: {reason}", plugin=owner, key=key, value=value, reason=reason)


def integer(owner: str, key: str, value: object, *, minimum: int = 1) -> int:
    """An ``int`` (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise invalid(owner, key, value, f"an integer >= {minimum}")
    return value


def number(owner: str, key: str, value: object, *, minimum: float = 0.0) -> float:
    """A finite ``int`` or ``float`` (not a bool) of at least ``minimum``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < minimum
    ):
        raise invalid(owner, key, value, f"a number >= {minimum:g}")
    return float(value)


def boolean(owner: str, key: str, value: object) -> bool:
    """``True`` or ``False``; no truthy stand-ins."""
    if not isinstance(value, bool):
        raise invalid(owner, key, value, "true or false")
    return value


def non_empty_text(owner: str, key: str, value: object) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise invalid(owner, key, value, "a non-empty string")
    return value


def patterns(owner: str, key: str, value: object) -> tuple[str, ...]:
    """A list of tool-name patterns (non-empty strings; ``*`` matches anything)."""
    if (
        isinstance(value, str | bytes)
        or not isinstance(value, Sequence)
        or not all(isinstance(pattern, str) and pattern for pattern in value)
    ):
        raise invalid(
            owner, key, value, "a list of tool-name patterns (non-empty strings, `*` wildcards)"
        )
    return tuple(value)


def codes(owner: str, key: str, value: object) -> frozenset[str]:
    """A non-empty collection of result codes (one code alone is accepted too)."""
    if isinstance(value, str):
        value = (value,)
    if (
        not isinstance(value, Collection)
        or not value
        or not all(isinstance(code, str) and code for code in value)
    ):
        raise invalid(owner, key, value, "a non-empty list of result codes")
    return frozenset(value)


def compile_patterns(names: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regular expression matching a whole name against any of ``names``."""
    if not names:
        return None
    alternatives = (
        "".join(".*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", name))
        for name in names
    )
    return re.compile("|".join(f"(?:{alternative})" for alternative in alternatives), re.DOTALL)


def stage(owner: str, value: object) -> StageName:
    """``"dispatch"`` (around each tool call) or ``"model"`` (around each model call)."""
    if value == "dispatch":
        return "dispatch"
    if value == "model":
        return "model"
    raise invalid(owner, "stage", value, "'dispatch' (tool calls) or 'model' (model calls)")


def optional_integer(owner: str, key: str) -> Callable[[Any, Any, Any], None]:
    """An attrs validator: ``None`` (off), or an ``int`` of at least 1."""

    def check(_: Any, __: Any, value: Any) -> None:
        if value is not None:
            integer(owner, key, value)

    return check


def flag(owner: str, key: str) -> Callable[[Any, Any, Any], None]:
    """An attrs validator: ``True`` or ``False`` (``shadow=``, ``wait=``…)."""

    def check(_: Any, __: Any, value: Any) -> None:
        boolean(owner, key, value)

    return check


def in_ms(
    owner: str, name: str, seconds: float | None, milliseconds: float, old: str | None = None
) -> float:
    """``<name>_ms``, or the deprecated ``<name>_s`` (or ``old``) converted (every public
    duration is in milliseconds); the old spelling warns, naming its replacement, until 0.3."""
    if seconds is None:
        return milliseconds
    old = old or f"{name}_s"
    converted = number(owner, old, seconds, minimum=1e-9) * 1000
    warnings.warn(
        f"{owner}: {old} is deprecated in 0.2 and removed in 0.3 (every duration is in "
        f"milliseconds); write {name}_ms={converted:.12g}",
        DeprecationWarning,
        stacklevel=3,
    )
    return converted
