"""The model seam: what a model is given, and what it answers.

A model is any object with ``async complete(messages, tools) -> ModelReply``:
``messages`` in OpenAI chat format (rebuilt from the session log for every
request) and ``tools`` as OpenAI function schemas. Real providers implement it in a
few lines. ``ScriptedModel``, the test double, is in ``pipeline.testing``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

__all__ = ["Model", "ModelReply", "ToolCallRequest", "arguments_text"]


def _parse_arguments(arguments: Mapping[str, Any] | str) -> Mapping[str, Any] | str:
    """A model's argument text as a mapping: ``""`` is ``{}``; non-objects stay raw text."""
    if not isinstance(arguments, str):
        return arguments
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def arguments_text(arguments: Mapping[str, Any] | str) -> str:
    """The JSON text of a call's arguments as it goes on the wire and into the log.

    Raw text is kept verbatim; a mapping JSON cannot hold is written with its
    unserialisable parts replaced by a ``"<unserialisable T>"`` marker, so the log
    stays valid JSON (the registry answers such a call with ``INVALID_ARGUMENTS``).
    """
    if isinstance(arguments, str):
        return arguments
    try:
        return json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return json.dumps(_json_safe(arguments, 0), ensure_ascii=False)


def _json_safe(value: object, depth: int) -> object:
    if isinstance(value, int) and value.bit_length() > 14_000:
        return f"<integer with {value.bit_length()} bits>"  # beyond what JSON text can hold
    if isinstance(value, str | bool | int | type(None)):
        return value
    if isinstance(value, float) and value == value and value not in (float("inf"), float("-inf")):
        return value
    if depth < 32 and isinstance(value, Mapping):
        return {str(key): _json_safe(item, depth + 1) for key, item in value.items()}
    if depth < 32 and isinstance(value, list | tuple):
        return [_json_safe(item, depth + 1) for item in value]
    return f"<unserialisable {type(value).__name__}>"


@attrs.frozen
class ToolCallRequest:
    """One tool call a model asked for.

    ``arguments`` may be a mapping or the raw JSON text the model produced: ``""``
    becomes ``{}``, a JSON object becomes a dict, anything else stays the raw text
    and is answered with ``INVALID_ARGUMENTS``. Raw text is also kept verbatim in
    ``arguments_json``, so the log replays exactly what the model said.
    """

    name: str
    arguments: Mapping[str, Any] | str = attrs.field(factory=dict)
    call_id: str = ""
    raw_arguments: str | None = attrs.field(init=False, repr=False)
    _json: str = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        parsed = _parse_arguments(self.arguments)
        raw = self.arguments if isinstance(self.arguments, str) else None
        text = arguments_text(parsed)  # once: every later request reuses it
        if raw is not None and not isinstance(parsed, str) and raw == text:
            raw = None  # the text says nothing the mapping does not: equal either way
        object.__setattr__(self, "raw_arguments", raw)
        object.__setattr__(self, "arguments", parsed)
        object.__setattr__(self, "_json", raw if raw is not None else text)

    def with_call_id(self, call_id: str) -> ToolCallRequest:
        """The same request under another id, raw text kept."""
        given = self.raw_arguments if self.raw_arguments is not None else self.arguments
        return ToolCallRequest(self.name, given, call_id)

    @property
    def arguments_json(self) -> str:
        """The arguments as the model wrote them (or as JSON, if given as a mapping)."""
        return self._json


def _requests(requests: Iterable[ToolCallRequest]) -> tuple[ToolCallRequest, ...]:
    return tuple(requests)


@attrs.frozen
class ModelReply:
    """A model's answer: text, and the tool calls it wants run (in its order)."""

    text: str = ""
    tool_calls: tuple[ToolCallRequest, ...] = attrs.field(default=(), converter=_requests)


@runtime_checkable
class Model(Protocol):
    """Anything that answers a chat request."""

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> ModelReply: ...
