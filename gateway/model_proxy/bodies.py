"""A request body as the proxy reads it: parsed as a JSON object within a depth, checked
against its API's shapes (``Malformed`` naming where it is wrong), and the small readers
every wire shares (a positive count, a content's text)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from guardstack.gateway.model_proxy import shapes

__all__ = ["MAX_DEPTH", "Malformed", "conformed", "need", "parse", "positive_int", "text_of"]

#: The deepest a request body may nest (a real one is a handful of levels).
MAX_DEPTH: Final = 64


class Malformed(ValueError):
    """A request body that is not what its API accepts (``message`` says where)."""


def text_of(content: Any) -> str:
    """A tool result's text: a string, or the text of a list's blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) if isinstance(part, Mapping) else "" for part in content
        )
    return "" if content is None else str(content)


def _depth_ok(value: Any) -> None:
    """Refuse a body nested past ``MAX_DEPTH`` (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Malformed(f"the body nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


def parse(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or ``Malformed`` (not UTF-8, not JSON, too deep,
    not an object)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise Malformed("the body is not UTF-8") from None
    except RecursionError:
        raise Malformed(f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:
        raise Malformed(
            f"the body is not JSON ({error.args[0] if error.args else error})"
        ) from None
    if not isinstance(data, dict):
        raise Malformed("the body must be a JSON object")
    _depth_ok(data)
    return data


def need(condition: bool, where: str, what: str) -> None:
    if not condition:
        raise Malformed(f"{where} must be {what}")


def conformed(data: dict[str, Any], shape: shapes.Shape) -> None:
    """Raise ``Malformed`` where ``data`` is not what the provider's schema types."""
    wrong = shapes.conform(data, shape)
    if wrong is not None:
        raise Malformed(wrong)


def positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None
