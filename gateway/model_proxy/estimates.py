"""What a request carries, counted before the provider counts it: each wire's estimate
of its input reads every field it names (``Wire.input_fields``) through
``input_chars``, at a token per four characters — structure and tool schemas
included, so an estimate is at least its cost and requests at once never pass a
budget by more than their estimates' error."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["MEDIA_CHARS", "input_chars"]

#: What an image, a file or audio sent inline (base64, a ``data:`` URL) is counted as:
#: characters for about 1,600 tokens, whatever its size — a provider counts media by
#: what it shows, never by its encoding's length.
MEDIA_CHARS: Final = 6_400


def input_chars(value: Any) -> int:
    """The characters of the input a request carries in ``value``: every text, key and
    number as its JSON would write it (tool schemas and structure too — an estimate is
    at least its cost), inline media at ``MEDIA_CHARS`` each. Walked without recursion."""
    total = 0
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, key = stack.pop()
        if isinstance(item, str):
            media = key in ("data", "bytes") or item.startswith("data:")
            total += MEDIA_CHARS if media and len(item) > MEDIA_CHARS else len(item) + 2
        elif isinstance(item, dict):
            total += 2
            for name, child in item.items():
                total += len(str(name)) + 3
                stack.append((child, str(name)))
        elif isinstance(item, list):
            total += 2 + len(item)
            stack.extend((child, key) for child in item)
        elif item is not None:
            total += len(str(item))
    return total
