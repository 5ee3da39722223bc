"""Canonical arguments: the repeat reminder's chain key, byte-for-byte like the original.

The original keys a call on ``JSON.stringify(deepKeySort(args))``. This module
reproduces that in Python, so a chain means the same thing here as there:

* object keys sorted by UTF-16 code units, then — as a JavaScript object orders its
  own keys — integer-like keys first, in numeric order; arrays keep their order;
* compact JSON, non-ASCII characters left raw, lone surrogates escaped;
* numbers as JavaScript prints them: ``1`` and ``1.0`` are both ``1``, ``1e-7`` is
  ``1e-7``, NaN and infinities are ``null``.

It never raises, whatever a caller passes: sets become sorted arrays, bytes a hex
string, cycles ``"[Circular]"``, objects their public attributes or ``str()``, so
such calls are still tracked deterministically.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from json.encoder import encode_basestring as _encode_string

__all__ = ["canonical_json", "utf16_length", "utf16_prefix"]

_MAX_DEPTH = 100
_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")
_SURROGATE = re.compile("[\ud800-\udfff]")


def canonical_json(value: object) -> str:
    """``JSON.stringify(deepKeySort(value))`` as the original computes it."""
    if type(value) is dict:
        flat = _flat_object(value)
        if flat is not None:
            return flat
    parts: list[str] = []
    _write(value, parts, set(), 0)
    return "".join(parts)


#: Integers the flat-object path writes with ``str`` (JavaScript prints them alike).
_PLAIN_INT = 2**53


def _flat_object(mapping: dict[object, object]) -> str | None:
    """The usual arguments — one object of ASCII keys (none integer-like) holding text,
    integers, booleans and nulls — written in one pass; ``None`` for anything else,
    which the general writer then takes. ASCII keys sort by UTF-16 code units as
    Python sorts them."""
    items: list[tuple[str, str]] = []
    for key, item in mapping.items():
        if type(key) is not str or not key.isascii() or key.isdigit():
            return None
        kind = type(item)
        if kind is str:
            text = _string(item)  # type: ignore[arg-type]
        elif item is None:
            text = "null"
        elif kind is bool:
            text = "true" if item else "false"
        elif kind is int and -_PLAIN_INT < item < _PLAIN_INT:  # type: ignore[operator]
            text = str(item)
        else:
            return None
        items.append((key, text))
    items.sort()
    return "{" + ",".join([f"{_encode_string(key)}:{text}" for key, text in items]) + "}"


def utf16_length(text: str) -> int:
    """Length in UTF-16 code units, as JavaScript counts it."""
    return len(text) + sum(1 for character in text if ord(character) > 0xFFFF)


def utf16_prefix(text: str, units: int) -> str:
    """The longest prefix of ``text`` that fits in ``units`` UTF-16 code units.

    Never splits a surrogate pair (where JavaScript would leave half of one), so
    the prefix stays valid Unicode and safe to write to the session log.
    """
    used = 0
    for index, character in enumerate(text):
        used += 2 if ord(character) > 0xFFFF else 1
        if used > units:
            return text[:index]
    return text


def _string(text: str) -> str:
    encoded = _encode_string(text)  # what json.dumps(text, ensure_ascii=False) calls
    if _SURROGATE.search(encoded):
        encoded = _SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", encoded)
    return encoded


def js_number(number: float | int) -> str:
    """A number as JavaScript's ``JSON.stringify`` writes it."""
    if isinstance(number, int):
        try:
            return str(number)
        except ValueError:  # beyond Python's digit limit; in JavaScript, Infinity: null
            return "null"
    if not math.isfinite(number):
        return "null"
    if number == 0:
        return "0"
    if number.is_integer() and abs(number) < 2**53:
        return str(int(number))
    sign = "-" if number < 0 else ""
    mantissa, _, exponent_text = repr(abs(number)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    exponent = (int(exponent_text) if exponent_text else 0) - len(fraction)
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    significant = stripped.lstrip("0")
    k = len(significant)
    n = exponent + k  # value = 0.<significant> * 10**n
    if k <= n <= 21:
        text = significant + "0" * (n - k)
    elif 0 < n <= 21:
        text = significant[:n] + "." + significant[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + significant
    else:
        power = n - 1
        head = significant[0] + ("." + significant[1:] if k > 1 else "")
        text = f"{head}e{'+' if power >= 0 else '-'}{abs(power)}"
    return sign + text


def _key_text(key: object) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int | float):
        return js_number(key)
    if key is None:
        return "null"
    return _safe_str(key)


def _key_order(key: str) -> tuple[int, int, bytes]:
    if _ARRAY_INDEX.fullmatch(key) and int(key) < 2**32 - 1:
        return (0, int(key), b"")
    return (1, 0, key.encode("utf-16-be", "surrogatepass"))


def _safe_str(value: object) -> str:
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _write(value: object, parts: list[str], active: set[int], depth: int) -> None:
    if value is None:
        parts.append("null")
    elif value is True or value is False:
        parts.append("true" if value else "false")
    elif isinstance(value, int | float):
        parts.append(js_number(value))
    elif isinstance(value, str):
        parts.append(_string(value))
    elif isinstance(value, bytes | bytearray | memoryview):
        parts.append(_string(bytes(value).hex()))
    elif id(value) in active:
        parts.append('"[Circular]"')
    elif depth >= _MAX_DEPTH:
        parts.append('"[Too deep]"')
    else:
        active.add(id(value))
        try:
            _write_container(value, parts, active, depth + 1)
        finally:
            active.discard(id(value))


def _write_container(value: object, parts: list[str], active: set[int], depth: int) -> None:
    if isinstance(value, Mapping):
        try:
            items = list(value.items())
        except Exception:
            parts.append(_string(_safe_str(value)))
            return
        _write_object({_key_text(key): item for key, item in items}, parts, active, depth)
    elif isinstance(value, list | tuple):
        _write_array(list(value), parts, active, depth)
    elif isinstance(value, set | frozenset):
        members = sorted(_canonical_at(item, active, depth) for item in value)
        parts.append("[" + ",".join(members) + "]")
    elif hasattr(value, "__dict__") and not callable(value):
        public = {key: item for key, item in vars(value).items() if not key.startswith("_")}
        _write_object(public, parts, active, depth)
    else:
        parts.append(_string(_safe_str(value)))


def _write_object(
    mapping: dict[str, object], parts: list[str], active: set[int], depth: int
) -> None:
    parts.append("{")
    for position, key in enumerate(sorted(mapping, key=_key_order)):
        if position:
            parts.append(",")
        parts.append(_string(key))
        parts.append(":")
        _write(mapping[key], parts, active, depth)
    parts.append("}")


def _write_array(items: list[object], parts: list[str], active: set[int], depth: int) -> None:
    parts.append("[")
    for position, item in enumerate(items):
        if position:
            parts.append(",")
        _write(item, parts, active, depth)
    parts.append("]")


def _canonical_at(value: object, active: set[int], depth: int) -> str:
    parts: list[str] = []
    _write(value, parts, active, depth)
    return "".join(parts)
