"""What a tool call's arguments must be before a tool sees them: a JSON object, not too
deep, with integers JSON can hold."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Final

from guardstack.pipeline.values import ToolResult, invalid_arguments_result

_MAX_ARGUMENT_DEPTH = 64
#: Python refuses to print an int with more than 4,300 digits; JSON cannot hold it then.
_MAX_INT_BITS = 14_000
_INT_LIMIT = 2**63  # integers the flat-arguments check passes without asking


def check_arguments(arguments: object) -> ToolResult | None:
    """An ``INVALID_ARGUMENTS`` result for arguments that are not a JSON object."""
    if type(arguments) is dict:  # the usual case, without the ABC isinstance
        for key, value in arguments.items():
            if type(key) is not str:
                break
            kind = type(value)
            if kind not in _SCALARS and (kind is not int or not -_INT_LIMIT < value < _INT_LIMIT):
                break
        else:
            return None  # flat text, numbers, booleans and nulls: no call needed to see it
        if _json_problem(arguments, 0) is None:
            return None
    problem = _json_object_problem(arguments)
    return None if problem is None else invalid_arguments_result(problem)


def _json_object_problem(arguments: object) -> str | None:
    """Why ``arguments`` is not a JSON object, or ``None``. Never raises."""
    if isinstance(arguments, str):
        preview = arguments if len(arguments) <= 80 else arguments[:80] + "…"
        return f"tool call arguments must be a JSON object, got the text {preview!r}"
    if not isinstance(arguments, Mapping):
        return f"tool call arguments must be a JSON object, got {type(arguments).__name__}"
    try:
        problem = _json_problem(arguments, 0)
    except Exception as error:  # a hostile mapping: iteration or lookup raised
        problem = f"reading them raised {type(error).__name__}"
    return None if problem is None else f"tool call arguments must be JSON-serialisable: {problem}"


_SCALARS: Final = frozenset({str, bool, type(None)})


def _json_problem(value: object, depth: int) -> str | None:
    kind = type(value)
    if kind in _SCALARS:
        return None
    if isinstance(value, int):  # bool, IntEnum and other int subclasses too
        if value.bit_length() > _MAX_INT_BITS:
            return "an integer too large for JSON"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} is not a JSON number"
    if isinstance(value, str):  # StrEnum and other str subclasses
        return None
    if depth > _MAX_ARGUMENT_DEPTH:
        return f"nested deeper than {_MAX_ARGUMENT_DEPTH} levels (or circular)"
    items: Iterable[object]
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                return f"key {short_repr(key)} is not a string"
        items = value.values()
    elif isinstance(value, list | tuple):
        items = value
    else:
        return f"a {kind.__name__} value is not JSON"
    for item in items:
        if type(item) in _SCALARS:
            continue
        problem = _json_problem(item, depth + 1)
        if problem is not None:
            return problem
    return None


def short_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"
    return text if len(text) <= 80 else text[:80] + "…"
