"""A ``Model`` over Anthropic's Messages API, through the official ``anthropic`` client.

Claude speaks its own wire protocol: a top-level system prompt, content blocks
(``text``, ``tool_use``, ``tool_result``, signed ``thinking``), prompt-cache usage.
``AnthropicModel`` turns it into guardstack's model seam::

    from anthropic import AsyncAnthropic
    from guardstack.integrations.anthropic import AnthropicModel

    client = AsyncAnthropic(api_key=key, max_retries=0)
    model = AnthropicModel(client, "claude-sonnet-4-5", max_tokens=4096)

Build the client with ``max_retries=0`` when a model-stage ``Retry`` owns retries:
otherwise the client retries inside one guardstack attempt, out of sight of your
stack's timeouts, metrics and budgets.

What it does:

* maps ``session.messages()`` to the Messages API: system messages go to the
  top-level ``system`` (after any ``system=`` you pass); an assistant message becomes
  its thinking blocks (sent back exactly as they came, signatures and all), its text
  and one ``tool_use`` block per call; tool results become ``tool_result`` blocks
  (``is_error`` on error results) at the head of the next user message, followed by
  any reminders the guards added, so every ``tool_use`` is answered where Anthropic
  requires it;
* the tool schemas become ``{"name", "description", "input_schema"}``;
* returns the text, the tool calls (ids kept), the thinking blocks
  (``ModelReply.thinking_blocks``; their text also as ``reasoning``), the model that
  answered, the stop reason, and usage: ``input_tokens`` counts all input (plain,
  read from the cache and written to it), ``cached_input_tokens`` the cache reads,
  ``cache_write_tokens`` the cache writes, ``reasoning_tokens`` the thinking tokens
  when the API reports them;
* maps failures to ``ModelError`` codes: 429 → ``MODEL_RATE_LIMITED`` with
  ``retry_after_s`` from ``retry-after``; 529 (and an ``overloaded_error`` event in a
  stream) → ``MODEL_OVERLOADED``; other 5xx and connection errors →
  ``MODEL_UNAVAILABLE``; the client's timeout and 408 → ``MODEL_TIMEOUT``; other 4xx
  → ``MODEL_REJECTED``; a reply it cannot read → ``MODEL_FAILED``;
* with ``stream=True`` reads the event stream, reports text to ``on_delta(text)`` as
  it arrives and reassembles tool input from its ``input_json_delta`` pieces (input
  that does not parse stays the raw text, answered ``INVALID_ARGUMENTS``); a stream
  that ends before ``message_stop`` is ``MODEL_UNAVAILABLE``.

Prompt caching is Anthropic's own request parameter: pass ``cache_control={"type":
"ephemeral"}`` (or blocks with ``cache_control`` in ``system=``) as a request
parameter. With interleaved thinking the blocks go back thinking first, then text,
then tool calls: the order Anthropic requires of a reply that was not interleaved.
Server-side tool blocks (web search and friends) are not kept.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from guardstack.integrations._extras import require
from guardstack.integrations._provider import (
    OnDelta,
    ProviderModel,
    answer,
    check_on_delta,
    error_message,
    report_delta,
    retry_after_s,
    status_error,
    usage_reported,
)
from guardstack.pipeline import (
    MODEL_FAILED,
    MODEL_OVERLOADED,
    MODEL_RATE_LIMITED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    ChunkListener,
    ModelError,
    ModelReply,
    ToolCallRequest,
    Usage,
)
from guardstack.pipeline.validate import cut, did_you_mean

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic

__all__ = ["AnthropicModel", "anthropic_request", "model_error"]

EXTRA = "anthropic"
THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})

#: An error event's ``type`` inside a stream (its HTTP status is the stream's 200).
_STREAM_ERRORS = {
    "overloaded_error": MODEL_OVERLOADED,
    "rate_limit_error": MODEL_RATE_LIMITED,
    "api_error": MODEL_UNAVAILABLE,
    "timeout_error": MODEL_TIMEOUT,
}


class AnthropicModel(ProviderModel):
    """A guardstack ``Model`` over ``client.messages.create``."""

    #: ``gen_ai.provider.name`` for telemetry.
    provider = "anthropic"

    def __init__(
        self,
        client: AsyncAnthropic,
        model: str,
        *,
        max_tokens: int,
        stream: bool = False,
        on_delta: OnDelta | None = None,
        **request_params: Any,
    ) -> None:
        self._anthropic = require("anthropic", EXTRA)
        if not callable(getattr(getattr(client, "messages", None), "create", None)):
            raise TypeError(
                f"client must be an anthropic.AsyncAnthropic (or compatible), got {cut(client)}"
            )
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a model name, got {cut(model)}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a whole number >= 1, got {cut(max_tokens)}")
        check_on_delta(on_delta)
        _check_params(client.messages.create, request_params)
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.stream = bool(stream)
        self.on_delta = on_delta
        self.request_params = request_params

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model!r}, max_tokens={self.max_tokens}, stream={self.stream})"

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_chunk: ChunkListener | None = None,
    ) -> ModelReply:
        params = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            **anthropic_request(messages, tools, self.request_params.get("system")),
        }
        params |= {key: value for key, value in self.request_params.items() if key != "system"}
        if self.stream:
            return await answer(
                lambda: self._streamed(params, on_chunk),
                self._anthropic.AnthropicError,
                model_error,
            )
        return await answer(lambda: self._once(params), self._anthropic.AnthropicError, model_error)

    async def _once(self, params: dict[str, Any]) -> ModelReply:
        return _reply_from_message(await self.client.messages.create(**params))

    async def _streamed(
        self, params: dict[str, Any], on_chunk: ChunkListener | None = None
    ) -> ModelReply:
        stream = await self.client.messages.create(**params, stream=True)
        parts = _StreamedMessage()
        try:
            async for event in stream:
                text = parts.add(event)
                if on_chunk is not None:
                    on_chunk(text or "")
                await report_delta(self.on_delta, text)
        finally:
            await stream.close()
        return parts.reply()


#: What the adapter itself sets on every request.
_OWN_PARAMS = frozenset({"model", "max_tokens", "messages", "tools", "stream"})


def _check_params(create: Any, params: Mapping[str, Any]) -> None:
    """Refuse a request parameter this client's ``messages.create`` does not take, now
    rather than on every call (``temperature=`` is gone from newer clients, for one)."""
    own = sorted(_OWN_PARAMS.intersection(params))
    if own:
        raise TypeError(f"AnthropicModel sets {', '.join(own)} itself; do not pass them")
    try:
        accepted = inspect.signature(create).parameters
    except (TypeError, ValueError):  # a compatible client without a signature: trust it
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return
    for name in params:
        if name not in accepted:
            known = [n for n in accepted if n not in _OWN_PARAMS]
            raise TypeError(
                f"this anthropic client's messages.create takes no {name!r}"
                f"{did_you_mean(name, known)} (pass what it does not know in extra_body=)"
            )


def anthropic_request(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], system: Any = None
) -> dict[str, Any]:
    """The ``system``, ``messages`` and ``tools`` parameters for ``session.messages()``
    (chat format, as guardstack rebuilds it) and the OpenAI-form tool schemas."""
    system_texts: list[str] = []
    turns: list[dict[str, Any]] = []
    user_blocks: list[dict[str, Any]] = []

    def end_user_turn() -> None:
        if user_blocks:
            only_text = len(user_blocks) == 1 and user_blocks[0]["type"] == "text"
            content = user_blocks[0]["text"] if only_text else list(user_blocks)
            turns.append({"role": "user", "content": content})
            user_blocks.clear()

    for message in messages:
        role = message.get("role")
        if role == "system":
            system_texts.append(_text_of(message.get("content")))
        elif role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id", ""),
                "content": _text_of(message.get("content")),
            }
            if message.get("is_error"):
                block["is_error"] = True
            user_blocks.append(block)
        elif role == "assistant":
            end_user_turn()
            turns.append({"role": "assistant", "content": _assistant_content(message)})
        else:
            text = _text_of(message.get("content"))
            if text or not user_blocks:
                user_blocks.append({"type": "text", "text": text})
    end_user_turn()
    request: dict[str, Any] = {"messages": turns}
    system_param = _system(system, system_texts)
    if system_param is not None:
        request["system"] = system_param
    if tools:
        request["tools"] = [_tool(schema) for schema in tools]
    return request


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # chat-format content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def _assistant_content(message: Mapping[str, Any]) -> str | list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [dict(block) for block in message.get("thinking_blocks") or ()]
    text = _text_of(message.get("content"))
    calls = message.get("tool_calls") or ()
    if not blocks and not calls:
        return text
    if text:
        blocks.append({"type": "text", "text": text})
    for call in calls:
        function = call.get("function", {})
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "input": _tool_input(function.get("arguments", "")),
            }
        )
    return blocks


def _tool_input(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except (ValueError, RecursionError):
        return {}  # the model's malformed input was answered INVALID_ARGUMENTS; send no input
    return parsed if isinstance(parsed, dict) else {}


def _system(given: Any, texts: list[str]) -> Any:
    if given is None:
        if not texts:
            return None
        return texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
    if not texts:
        return given
    blocks = [{"type": "text", "text": given}] if isinstance(given, str) else list(given)
    return blocks + [{"type": "text", "text": text} for text in texts]


def _tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    function = schema.get("function")
    if schema.get("type") != "function" or not isinstance(function, Mapping):
        return dict(schema)  # already an Anthropic tool (or a server tool): as given
    tool: dict[str, Any] = {"name": function.get("name", "")}
    if function.get("description"):
        tool["description"] = function["description"]
    tool["input_schema"] = function.get("parameters") or {"type": "object", "properties": {}}
    return tool


def model_error(error: BaseException) -> ModelError:
    """The ``ModelError`` an ``anthropic`` exception means (see the module docstring)."""
    anthropic = require("anthropic", EXTRA)
    message = error_message(error)
    if isinstance(error, anthropic.APITimeoutError):
        return ModelError(f"the provider did not answer in time: {message}", MODEL_TIMEOUT)
    if isinstance(error, anthropic.APIConnectionError):
        return ModelError(f"cannot reach the provider: {message}", MODEL_UNAVAILABLE)
    if isinstance(error, anthropic.APIStatusError):
        status = error.status_code
        headers = error.response.headers
        kind = getattr(error, "type", None) or _error_type(getattr(error, "body", None))
        if status < 400:  # an error event inside a stream the server had started
            code = _STREAM_ERRORS.get(str(kind), MODEL_UNAVAILABLE)
            described = f"the stream failed ({kind}): {message}"
            return ModelError(described, code, retry_after_s(headers))
        if kind == "overloaded_error" and status not in (429, 529):
            status = 529  # overloaded, whatever status a proxy put on it
        return status_error(status, f"{kind}: {message}" if kind else message, headers)
    return ModelError(f"{type(error).__name__}: {message}", MODEL_FAILED)


def _error_type(body: object) -> str | None:
    inner = body.get("error") if isinstance(body, Mapping) else None
    kind = inner.get("type") if isinstance(inner, Mapping) else None
    return kind if isinstance(kind, str) else None


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    details = getattr(usage, "output_tokens_details", None)
    counted = usage_reported(
        getattr(usage, "input_tokens", None),
        getattr(usage, "output_tokens", None),
        cached_input_tokens=getattr(usage, "cache_read_input_tokens", None),
        reasoning_tokens=getattr(details, "thinking_tokens", None),
        cache_write_tokens=getattr(usage, "cache_creation_input_tokens", None),
        source="Anthropic",
    )
    if counted is None:
        return None
    # Anthropic's input_tokens leaves out what was read from or written to the cache
    read, written = counted.cached_input_tokens, counted.cache_write_tokens
    return attrs.evolve(counted, input_tokens=counted.input_tokens + read + written)


def _block_dict(block: Any) -> dict[str, Any]:
    """A content block exactly as the server sent it (only the keys it set)."""
    if isinstance(block, Mapping):
        return dict(block)
    dumped: dict[str, Any] = block.to_dict(mode="json", exclude_unset=True)
    return dumped


def _reply(
    blocks: list[dict[str, Any]], usage: Usage | None, model: Any, stop_reason: Any
) -> ModelReply:
    texts, thinking, calls = [], [], []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(_checked_text(block.get("text")))
        elif kind in THINKING_TYPES:
            thinking.append(block)
        elif kind == "tool_use":
            given = block.get("input", {})
            arguments = given if isinstance(given, Mapping | str) else cut(given)
            calls.append(ToolCallRequest(block.get("name", ""), arguments, block.get("id", "")))
    thoughts = [b["thinking"] for b in thinking if isinstance(b.get("thinking"), str)]
    return ModelReply(
        text="".join(texts),
        tool_calls=tuple(calls),
        usage=usage,
        reasoning="".join(thoughts) if thoughts else None,
        model=model if isinstance(model, str) else None,
        finish_reason=stop_reason if isinstance(stop_reason, str) else None,
        thinking_blocks=tuple(thinking),
    )


def _checked_text(text: object) -> str:
    if not isinstance(text, str):
        raise ModelError(
            f"the provider's text block holds {type(text).__name__}, not text", MODEL_FAILED
        )
    return text


def _reply_from_message(message: Any) -> ModelReply:
    if getattr(message, "type", None) != "message" or not isinstance(
        getattr(message, "content", None), list
    ):
        raise ModelError(f"the provider's reply is not a message: {cut(message)}", MODEL_FAILED)
    return _reply(
        [_block_dict(block) for block in message.content],
        _usage(message.usage),
        message.model,
        message.stop_reason,
    )


@attrs.define
class _StreamedMessage:
    """A message put back together from its stream of events."""

    blocks: dict[int, dict[str, Any]] = attrs.Factory(dict)
    pieces: dict[int, list[str]] = attrs.Factory(dict)
    usage: Any = None
    delta_usage: Any = None
    model: Any = None
    stop_reason: Any = None
    started: bool = False
    stopped: bool = False

    def add(self, event: Any) -> str | None:
        """Take one event in; the text it adds, if any."""
        kind = getattr(event, "type", None)
        if kind == "message_start":
            self.started = True
            self.model = getattr(event.message, "model", None)
            self.usage = event.message.usage
        elif kind == "content_block_start":
            block = _block_dict(event.content_block)
            if block.get("type") == "tool_use":
                block["input"] = {}  # the input arrives as input_json_delta pieces
            self.blocks[event.index] = block
            self.pieces[event.index] = []
        elif kind == "content_block_delta":
            return self._delta(event.index, event.delta)
        elif kind == "message_delta":
            self.stop_reason = getattr(event.delta, "stop_reason", None) or self.stop_reason
            self.delta_usage = getattr(event, "usage", None)
        elif kind == "message_stop":
            self.stopped = True
        return None

    def _delta(self, index: int, delta: Any) -> str | None:
        block = self.blocks[index]
        kind = getattr(delta, "type", None)
        if kind == "text_delta":
            block["text"] = block.get("text", "") + _checked_text(delta.text)
            return str(delta.text)
        if kind == "input_json_delta":
            self.pieces[index].append(delta.partial_json)
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.thinking
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta.signature
        return None

    def reply(self) -> ModelReply:
        if not self.started:
            raise ModelError("the provider's stream carried no message", MODEL_FAILED)
        if not self.stopped:
            # Cut off: the connection dropped (or a proxy gave up) mid-reply. Worth retrying.
            raise ModelError(
                "the provider's stream ended before the reply was complete (no message_stop)",
                MODEL_UNAVAILABLE,
            )
        for index, block in self.blocks.items():
            if block.get("type") == "tool_use" and self.pieces[index]:
                block["input"] = "".join(self.pieces[index])  # parsed by ToolCallRequest
        return _reply(
            [self.blocks[index] for index in sorted(self.blocks)],
            _stream_usage(self.usage, self.delta_usage),
            self.model,
            self.stop_reason,
        )


def _stream_usage(start: Any, delta: Any) -> Usage | None:
    """``message_start``'s usage with ``message_delta``'s cumulative counts over it (the
    delta's counts are totals so far; a count it leaves out keeps the start's)."""
    if start is None and delta is None:
        return None
    merged: dict[str, Any] = {}
    for usage in (start, delta):
        for name in _USAGE_COUNTS:
            value = getattr(usage, name, None)
            if value is not None:
                merged[name] = value
    merged["output_tokens_details"] = getattr(delta, "output_tokens_details", None) or getattr(
        start, "output_tokens_details", None
    )
    return _usage(_Counts(merged))


_USAGE_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


class _Counts:
    """Merged usage counts read like the SDK's usage object."""

    def __init__(self, counts: dict[str, Any]) -> None:
        self.__dict__.update(counts)
