"""What the loop asks of a model's reply before it logs it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from guardstack.pipeline.model import (
    ModelReply,
    ToolCallRequest,
    Usage,
)
from guardstack.pipeline.session import AssistantMessage

if TYPE_CHECKING:
    from collections.abc import Sequence


def checked_reply(reply: object) -> ModelReply:
    """The reply, if the loop can log it; a ``TypeError`` naming what is wrong if not.

    Each check asks the exact type first: the usual reply passes without an
    ``isinstance`` call or a generator."""
    if type(reply) is not ModelReply and not isinstance(reply, ModelReply):
        raise TypeError(f"the model returned {reply!r}, not a ModelReply")
    text = reply.text
    if type(text) is not str and not isinstance(text, str):
        raise TypeError(f"the model's reply text is {type(text).__name__}, not str")
    usage = reply.usage
    if usage is not None and type(usage) is not Usage and not isinstance(usage, Usage):
        raise TypeError(f"the model's reply usage is {usage!r}, not a Usage")
    for name, value in (("reasoning", reply.reasoning), ("model", reply.model)):
        if value is not None and type(value) is not str and not isinstance(value, str):
            raise TypeError(f"the model's reply {name} is {type(value).__name__}, not str")
    if reply.thinking_blocks:
        if not all(isinstance(block, Mapping) for block in reply.thinking_blocks):
            raise TypeError("the model's reply thinking_blocks are not all mappings")
        try:
            json.dumps([dict(block) for block in reply.thinking_blocks], allow_nan=False)
        except (TypeError, ValueError, RecursionError) as error:
            raise TypeError(f"the model's reply thinking_blocks are not JSON: {error}") from None
    for request in reply.tool_calls:
        if type(request) is not ToolCallRequest and not isinstance(request, ToolCallRequest):
            raise TypeError("the model's reply tool_calls are not all ToolCallRequest")
    return reply


def with_unique_ids(
    requests: tuple[ToolCallRequest, ...], turn: int, step: int
) -> tuple[ToolCallRequest, ...]:
    """The reply's calls, each with an id of its own: a missing or repeated id (two calls
    a provider sent under one id would get two results for it, and the next request
    would be refused) is replaced by ``call_<turn>_<step>_<index>``."""
    if not requests or (len(requests) == 1 and requests[0].call_id):
        return requests  # none, or one with an id: nothing can repeat it
    seen: set[str] = set()
    unique = []
    for index, request in enumerate(requests):
        if not request.call_id or request.call_id in seen:
            request = request.with_call_id(f"call_{turn}_{step}_{index}")
        seen.add(request.call_id)
        unique.append(request)
    return tuple(unique)


def reply_message(
    turn: int, step: int, reply: ModelReply, requests: Sequence[ToolCallRequest]
) -> AssistantMessage:
    """The log's record of a reply, with the calls it asked for (given unique ids)."""
    return AssistantMessage(
        turn,
        step,
        reply.text,
        tuple(requests),
        reply.usage,
        reply.reasoning,
        reply.model,
        reply.thinking_blocks,
    )
